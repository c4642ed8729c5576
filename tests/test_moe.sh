#!/usr/bin/env bash
# test_moe.sh PENTATRON: mixture-of-experts models under data and pipeline parallelism, against
# one process (the single-process MoE itself is held to PyTorch by test_model_torch):
#   - dp 2 (ZeRO-1 and ZeRO-3, with accumulation), pp 2 (zb) and dp 2 × pp 2: step-1 gradients
#     per tensor ‖Δ‖/‖g‖ ≤ 1e-5, 10 losses ≤ 1e-4, with the aux and z losses on (they are per
#     sequence, so every split of the batch gives the same step);
#   - the metrics' expert load sums to tokens × top_k per MoE layer;
#   - on a skewed toy task the auxiliary-loss-free bias update and the aux loss bring the busiest
#     expert below 1.2 × the mean load where no balancing stays above it;
#   - expert parallelism (ep 2 and 4, ep 2 inside dp 4, with pp 2, with tp 2 + sp, ep 4 over
#     dp 2 × cp 2) and MoE with tp 2 and cp 2 equal to one process, and the bytes sent equal to
#     what the routing implies;
#   - the overlapped exchange (every block point to point, computed as it lands, the shared
#     experts while the outputs travel back) bit for bit the plain all-to-all (PT_EP_OVERLAP=0),
#     with the same bytes: fp32 and bf16, full recomputation, tp 2 + sp, top-1 ep 4 without
#     shared experts, and a capacity; and progressed by a thread as by our polls;
#   - expert parallelism with ZeRO-1/2/3 (dense and expert regions sharded over their own groups),
#     and the bias update under ZeRO (each rank moves its slice);
#   - experts that ep does not divide fail fast with one message.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
moe=(--model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.n_shared_experts=1 --model.aux_loss_coef=0.05
     --model.z_loss_coef=0.01)
run 1 ref "${moe[@]}" --training.micro_batch=8 || bad "reference failed: $(tail -3 "$tmp/ref.log")"
moe_check() { # NP NAME ARGS...: the MoE model under a layout, against its reference
  local np="$1" name="$2"; shift 2
  check "$np" "$name" ref "${moe[@]}" "$@"
}
moe_check 2 moe_dp2_z1_a2 --parallel.dp=2 --parallel.zero=1 --training.micro_batch=2
moe_check 2 moe_dp2_z3 --parallel.dp=2 --parallel.zero=3 --training.micro_batch=4
moe_check 2 moe_pp2_zb --parallel.pp=2 --parallel.pp_schedule=zb --training.micro_batch=2
moe_check 4 moe_dp2_pp2 --parallel.dp=2 --parallel.pp=2 --training.micro_batch=1
# expert parallelism: each rank holds E/ep experts; tokens dispatched and combined by all-to-all
moe_check 2 moe_ep2 --parallel.dp=2 --parallel.ep=2 --training.micro_batch=4
moe_check 4 moe_ep4 --parallel.dp=4 --parallel.ep=4 --training.micro_batch=2
moe_check 4 moe_ep2_dp4 --parallel.dp=4 --parallel.ep=2 --training.micro_batch=1
moe_check 4 moe_ep2_pp2_zb --parallel.dp=2 --parallel.ep=2 --parallel.pp=2 --parallel.pp_schedule=zb --training.micro_batch=1
moe_check 8 moe_ep2_dp4_pp2 --parallel.dp=4 --parallel.ep=2 --parallel.pp=2 --training.micro_batch=1
# with tensor parallelism (each expert's width split over the tp ranks), sequence parallelism, and context
# parallelism (a sequence's balancing statistics summed over its context ranks); ep spanning dp × cp
moe_check 2 moe_tp2 --parallel.tp=2 --training.micro_batch=8
moe_check 4 moe_tp4 --parallel.tp=4 --training.micro_batch=8
moe_check 4 moe_tp2_sp_ep2 --parallel.tp=2 --parallel.sp=true --parallel.dp=2 --parallel.ep=2 --training.micro_batch=4
moe_check 2 moe_cp2 --parallel.cp=2 --training.micro_batch=8
moe_check 4 moe_ep4_dp2_cp2 --parallel.cp=2 --parallel.dp=2 --parallel.ep=4 --training.micro_batch=4
# with ZeRO-1: the dense region sharded over the data ranks, the experts' over the expert-data ranks
moe_check 4 moe_ep2_dp4_z1 --parallel.dp=4 --parallel.ep=2 --parallel.zero=1 --training.micro_batch=1
moe_check 4 moe_ep2_pp2_z1 --parallel.dp=2 --parallel.ep=2 --parallel.pp=2 --parallel.zero=1 --training.micro_batch=1
moe_check 4 moe_ep4_dp2_cp2_z1 --parallel.cp=2 --parallel.dp=2 --parallel.ep=4 --parallel.zero=1 --training.micro_batch=4
# ZeRO-2/3: each region's units in buckets of their own (ep 2 over dp 2: the experts' group is one rank)
moe_check 2 moe_ep2_z3 --parallel.dp=2 --parallel.ep=2 --parallel.zero=3 --training.micro_batch=2
moe_check 4 moe_ep2_dp4_z2 --parallel.dp=4 --parallel.ep=2 --parallel.zero=2 --training.micro_batch=1
moe_check 4 moe_ep2_dp4_z3 --parallel.dp=4 --parallel.ep=2 --parallel.zero=3 --training.micro_batch=1
moe_check 4 moe_ep2_tp2_sp_z3 --parallel.tp=2 --parallel.sp=true --parallel.dp=2 --parallel.ep=2 --parallel.zero=3 --training.micro_batch=4
# the auxiliary-loss-free bias update on owned slices (it moves the losses by ~7e-4 in 10 steps)
bias=(--model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
      --model.moe_first_dense=1 --model.router_sigmoid=true --model.bias_rate=0.01)
run 1 bref "${bias[@]}" --training.micro_batch=8 || bad "bias reference failed: $(tail -3 "$tmp/bref.log")"
check 2 bias_dp2_z3 bref "${bias[@]}" --parallel.dp=2 --parallel.zero=3 --training.micro_batch=2
check 4 bias_ep2_dp4_z2 bref "${bias[@]}" --parallel.dp=4 --parallel.ep=2 --parallel.zero=2 --training.micro_batch=1
check 4 bias_ep2_pp2_z1 bref "${bias[@]}" --parallel.dp=2 --parallel.ep=2 --parallel.pp=2 --parallel.zero=1 --training.micro_batch=1

# expert parallelism's bytes of rank 0 = what its routing implies: per MoE layer and micro-batch
# the counts (E/ep int64 to each peer, all-to-all), then rows of C floats, each block point to
# point (sends): dispatch (the rows it sends) and combine (the rows it received, returned),
# forward and backward again
"$PY" - "$tmp" <<'PY' && ok || bad "expert parallelism's bytes differ from the routing"
import json, sys
for name, ep, micro in (("moe_ep2", 2, 1), ("moe_ep4", 4, 1)):  # one micro-batch per rank
    m = [json.loads(l) for l in open("%s/%s.jsonl" % (sys.argv[1], name))][1]
    sent, recv = m["ep_rows"]
    C, E, moe_layers = 32, 4, 3
    want = 2 * (sent + recv) * C * 4 + moe_layers * micro * (E // ep) * (ep - 1) * 8
    got = m["comm"]["all-to-all"][1] + m["comm"]["send"][1]
    print("%s: all-to-all + send %d bytes; routing: %d rows out, %d in -> %d" % (name, got, sent, recv, want))
    if got != want: sys.exit(1)
PY

"$PY" - "$tmp" <<'PY' && ok || bad "expert load does not add up"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1] + "/moe_dp2_pp2.jsonl")]
load = m[0]["expert_load"]
want = 8 * 16 * 2 / 4  # tokens × top_k / experts: the mean
print("expert load per MoE layer (min, max, mean, max/mean):", load, "aux", m[0]["aux_loss"])
ok = sorted(load) == ["1", "2", "3"] and all(abs(v[2] - want) < 1e-9 for v in load.values())
sys.exit(0 if ok else 1)
PY

# balancing on a skewed toy task: 4 experts, top-1, a decisive router (init_std 0.3) that a small
# learning rate barely moves; 60 steps of 32 × 32 tokens. Without balancing the busiest expert
# stays above 1.2 × the mean every step; the bias update and the aux loss bring the median of
# the last 20 steps below 1.2, the first step below 1.2 is reported.
skew=(--model.n_experts=4 --model.top_k=1 --model.moe_ffn_dim=16 --model.router_sigmoid=true
      --model.init_std=0.3 --model.z_loss_coef=0 --training.steps=60 --training.global_batch=32
      --training.micro_batch=32 --training.seq_len=32 --optimizer.lr=1e-4)
run 1 skew_none "${skew[@]}" --model.aux_loss_coef=0 &&
run 1 skew_bias "${skew[@]}" --model.aux_loss_coef=0 --model.bias_rate=0.005 &&
run 1 skew_aux "${skew[@]}" --model.aux_loss_coef=1 --optimizer.lr=3e-3 || bad "skewed runs failed"
"$PY" - "$tmp" <<'PY' && ok || bad "balancing does not bring the expert load below 1.2 × mean"
import json, statistics, sys
def ratios(n):
    m = [json.loads(l) for l in open("%s/%s.jsonl" % (sys.argv[1], n))]
    return [max(v[3] for v in x["expert_load"].values()) for x in m]
none, bias, aux = ratios("skew_none"), ratios("skew_bias"), ratios("skew_aux")
first = lambda r: next((i + 1 for i, x in enumerate(r) if x < 1.2), None)
for n, r in (("none", none), ("bias update", bias), ("aux loss", aux)):
    print("%-11s max/mean: step 1 %.2f, min %.2f, median of steps 41-60 %.3f, first step < 1.2: %s" % (
        n, r[0], min(r), statistics.median(r[40:]), first(r)))
ok = min(none) > 1.2 and statistics.median(bias[40:]) < 1.2 and statistics.median(aux[40:]) < 1.2
sys.exit(0 if ok else 1)
PY

# the overlapped exchange against the plain one (PT_EP_OVERLAP=0: one all-to-all each way, the
# blocks in the same order), or polled against progressed by a thread (PT_MPI_PROGRESS=thread):
# step-1 gradients and metrics the same bits, the ep group's bytes equal. Runs NAME (overlapped,
# polled; unless it ran already) and NAME_var_value with VAR=VALUE
same_bits() { # NP NAME VAR=VALUE ARGS...
  local np="$1" name="$2" env="$3"; shift 3
  local alt; alt="${name}_$(tr 'A-Z=' 'a-z_' <<<"$env")"
  [ -f "$tmp/$name.st" ] || run "$np" "$name" "$@" || { bad "$name failed: $(tail -3 "$tmp/$name.log")"; return; }
  (export "$env"; run "$np" "$alt" "$@") || { bad "$alt failed: $(tail -3 "$tmp/$alt.log")"; return; }
  "$PY" - "$tmp" "$name" "$alt" <<'PY' && ok || bad "$name: the overlapped exchange differs with $env"
import json, sys
d, n, alt = sys.argv[1:4]
st = [open("%s/%s.st" % (d, x), "rb").read() for x in (n, alt)]
keys = ("loss", "grad_norm", "aux_loss", "z_loss")
m = [[json.loads(l) for l in open("%s/%s.jsonl" % (d, x))] for x in (n, alt)]
vals = [[[s.get(k) for k in keys] for s in x] for x in m]
ep = [x[1]["comm_groups"]["ep"] for x in m]
print("%s: gradients %s, %d steps' metrics %s, ep bytes per step %d / %d" % (
    alt, "equal" if st[0] == st[1] else "DIFFER", len(vals[0]),
    "equal" if vals[0] == vals[1] else "DIFFER", ep[0], ep[1]))
sys.exit(0 if st[0] == st[1] and vals[0] == vals[1] and len(vals[0]) == 10 and ep[0] == ep[1] else 1)
PY
}
same_bits 2 moe_ep2 PT_EP_OVERLAP=0 "${moe[@]}" --parallel.dp=2 --parallel.ep=2 --training.micro_batch=4
same_bits 4 moe_tp2_sp_ep2 PT_EP_OVERLAP=0 "${moe[@]}" --parallel.tp=2 --parallel.sp=true --parallel.dp=2 --parallel.ep=2 --training.micro_batch=4
# top-1 over ep 4 (one expert a rank), no shared experts: against one process too
top1=(--model.n_layers=3 --model.n_experts=4 --model.top_k=1 --model.moe_ffn_dim=24
      --model.moe_first_dense=1 --model.aux_loss_coef=0.05)
run 1 ref_top1 "${top1[@]}" --training.micro_batch=8 || bad "top-1 reference failed: $(tail -3 "$tmp/ref_top1.log")"
check 4 moe_top1_ep4 ref_top1 "${top1[@]}" --parallel.dp=4 --parallel.ep=4 --training.micro_batch=2
same_bits 4 moe_top1_ep4 PT_EP_OVERLAP=0 "${top1[@]}" --parallel.dp=4 --parallel.ep=4 --training.micro_batch=2
# progressed by a thread (src/comm/comm_mpi.c) instead of our polls
same_bits 4 moe_top1_ep4 PT_MPI_PROGRESS=thread "${top1[@]}" --parallel.dp=4 --parallel.ep=4 --training.micro_batch=2
# a capacity (each rank drops its slots beyond it: blocks of fewer rows, no reference)
same_bits 4 moe_cap_ep4 PT_EP_OVERLAP=0 "${top1[@]}" --model.capacity_factor=0.5 --parallel.dp=4 --parallel.ep=4 --training.micro_batch=2
# bf16 with full recomputation: against the single-process bf16 run (compare_runs.py --bf16)
bf=(--training.precision=bf16 --training.recompute=full)
run 1 ref_bf16 "${moe[@]}" "${bf[@]}" --training.micro_batch=8 || bad "bf16 reference failed: $(tail -3 "$tmp/ref_bf16.log")"
if run 2 moe_bf16_ep2 "${moe[@]}" "${bf[@]}" --parallel.dp=2 --parallel.ep=2 --training.micro_batch=4; then
  "$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --bf16 "$tmp" ref ref_bf16 moe_bf16_ep2 "MoE bf16, full recomputation: ep2" && ok ||
    bad "bf16 ep 2 with full recomputation too far from the single-process bf16 run"
else
  bad "bf16 ep 2 failed: $(tail -3 "$tmp/moe_bf16_ep2.log")"
fi
same_bits 2 moe_bf16_ep2 PT_EP_OVERLAP=0 "${moe[@]}" "${bf[@]}" --parallel.dp=2 --parallel.ep=2 --training.micro_batch=4

expect_fail 1 "model.top_k = 5" --model.n_experts=4 --model.top_k=5 --training.micro_batch=8
expect_fail 2 "must divide model.moe_ffn_dim" "${moe[@]}" --model.moe_ffn_dim=25 --parallel.tp=2 --training.micro_batch=8
expect_fail 2 "must divide model.n_experts" --model.n_experts=3 --parallel.dp=2 --parallel.ep=2 --training.micro_batch=4

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
