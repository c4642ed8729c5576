#!/usr/bin/env bash
# test_5d.sh PENTATRON: the five parallelisms composed, on 8 and 16 ranks, against one process:
#   - a matrix of layouts (dense, tied and mixture-of-experts; every schedule; ZeRO-0/1/2 with a
#     pipeline (ZeRO-2 with tp, cp, tied embeddings and experts), 0–3 without, with or without
#     experts; sp on and off; degrees of 3 and 6 on 6 and 12 ranks), each reproducing the single-process run: step-1 gradients per tensor
#     ‖Δ‖/‖g‖ ≤ 1e-5, 10 losses ≤ 1e-4 relative; among them dp2·pp2·cp2·tp2 with ep 2, zero
#     bubble and ZeRO-1 on 16 ranks; a model with head_dim ≠ dim / heads and Llama 3 rope
#     scaling under dp·cp·tp and pp·cp·tp; HSDP (parallel.zero_scope: ZeRO within shard groups,
#     replicated across) in four of them: dp4·tp2 ZeRO-2 over groups of 2, dp2·cp2·tp2 ZeRO-3
#     over each dp rank's cp pair (zero_scope 1), MoE dp4·ep2·pp2 ZeRO-2, dp4·pp2·tp2 ZeRO-1;
#   - the same layout run twice: bitwise the same losses and checkpoint (weights and moments);
#   - resharding: that layout's checkpoint at step 5 continued on 1 rank, and a 1-rank checkpoint
#     continued on 16, both giving the uninterrupted run's losses; its Hugging Face export equals
#     the single-process one's;
#   - the run report: every rank's memory row equals what that rank's metrics say (rank 0), the
#     dimensions listed are the ones that communicate;
#   - no allocation inside a step after the first, on any rank of the 16-rank runs;
#   - a rank killed mid-step (SIGKILL) ends the job non-zero within seconds, naming the rank;
#   - `pentatron plan`'s memory for every layout above (its own formulas) against the run's
#     accounting: rank 0 within 2% of its exact bytes, every rank's report row to 2% or rounding.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
# every layout checked is also planned: `pentatron plan --json`'s memory per rank, from its own
# formulas, against the run's accounting (rank 0's exact bytes, every rank's report row)
hw="$tmp/hw.ini"
printf '[hardware]\nname = "test"\ndevices_per_node = 16\nnodes = 1\npeak_flops = 1e11\nmemory_bytes = 1e10\nmemory_bw = 1e10\nintra_bw = 1e9\nintra_latency = 1e-6\ninter_bw = 1e8\ninter_latency = 1e-5\n' > "$hw"
eval "$(declare -f check | sed '1s/^check/run_check/')"
check() { # as parallel_common's (HSDP layouts: and the gradient norms), then the plan's memory
  local name="$2"
  run_check "$@"
  if [[ "$name" == *hsdp* ]]; then
    "$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" "$tmp" "$3" "$name" --norms > /dev/null && ok ||
      bad "$name: gradient norms differ: $("$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" "$tmp" "$3" "$name" --norms | tail -1)"
  fi
  shift 3
  if "$bin" plan "${tiny[@]}" "$@" --hardware "$hw" --json > "$tmp/$name.plan" 2> "$tmp/$name.plan.err" &&
     "$PY" "$PT_SOURCE_DIR/tests/ref/check_plan_memory.py" "$tmp/$name.log" "$tmp/$name.jsonl" "$tmp/$name.plan" "$name"; then ok
  else bad "$name: the plan's memory differs from the run's: $(cat "$tmp/$name.plan.err")"; fi
}
P=--parallel
L4=(--model.n_layers=4)
moe=(--model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.n_shared_experts=1 --model.aux_loss_coef=0.05
     --model.z_loss_coef=0.01)
run 1 ref "${L4[@]}" --training.micro_batch=8 || bad "dense reference failed: $(tail -3 "$tmp/ref.log")"
run 1 mref "${moe[@]}" --training.micro_batch=8 || bad "MoE reference failed: $(tail -3 "$tmp/mref.log")"
dense() { local np="$1" name="$2"; shift 2; check "$np" "$name" ref "${L4[@]}" "$@"; }
mixed() { local np="$1" name="$2"; shift 2; check "$np" "$name" mref "${moe[@]}" "$@"; }

# 8 ranks, dense
dense 8 dp2_tp2_pp2_1f1b_z1 $P.dp=2 $P.tp=2 $P.pp=2 $P.pp_schedule=1f1b $P.zero=1 --training.micro_batch=2
dense 8 dp2_cp2_tp2_sp_z1 $P.dp=2 $P.cp=2 $P.tp=2 $P.sp=true $P.zero=1 --training.micro_batch=2
dense 8 pp2_cp2_tp2_interleaved $P.pp=2 $P.cp=2 $P.tp=2 $P.pp_schedule=interleaved $P.pp_virtual=2 --training.micro_batch=2
dense 8 dp2_pp2_cp2_zb_z1 $P.dp=2 $P.pp=2 $P.cp=2 $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1
dense 8 dp2_pp2_cp2_afab $P.dp=2 $P.pp=2 $P.cp=2 $P.pp_schedule=afab --training.micro_batch=2
dense 8 dp4_tp2_z2_hsdp2 $P.dp=4 $P.tp=2 $P.zero=2 $P.zero_scope=2 --training.micro_batch=1
dense 8 dp2_cp2_tp2_z3_hsdp1 $P.dp=2 $P.cp=2 $P.tp=2 $P.zero=3 $P.zero_scope=1 --training.micro_batch=2
dense 8 cp4_tp2_sp $P.cp=4 $P.tp=2 $P.sp=true --training.micro_batch=8
dense 8 tp4_pp2_1f1b $P.tp=4 $P.pp=2 $P.pp_schedule=1f1b --training.micro_batch=2
dense 8 cp2_pp4_zb $P.cp=2 $P.pp=4 $P.pp_schedule=zb --training.micro_batch=2
# ZeRO-2 under a pipeline (each micro-batch's gradients reduce-scattered as its backward ends)
dense 8 dp2_tp2_pp2_zb_sp_z2 $P.dp=2 $P.tp=2 $P.pp=2 $P.sp=true $P.pp_schedule=zb $P.zero=2 --training.micro_batch=1
dense 8 dp2_pp2_cp2_interleaved_z2 $P.dp=2 $P.pp=2 $P.cp=2 $P.pp_schedule=interleaved $P.pp_virtual=2 $P.zero=2 --training.micro_batch=1
# tied embeddings across the pipeline (the last stage's copy), with everything else
# a Hugging Face shape of today: heads of 12 over a width of 32 (head_dim ≠ dim / heads) and
# Llama 3.1's rope scaling (factor 8, original context 16: every kind of frequency pair)
hf=("${L4[@]}" --model.head_dim=12 --model.rope_factor=8 --model.rope_original_max_seq_len=16)
run 1 href "${hf[@]}" --training.micro_batch=8 || bad "head_dim reference failed: $(tail -3 "$tmp/href.log")"
check 8 hd12_dp2_cp2_tp2_sp_z1 href "${hf[@]}" $P.dp=2 $P.cp=2 $P.tp=2 $P.sp=true $P.zero=1 --training.micro_batch=2
check 8 hd12_pp2_cp2_tp2_zb href "${hf[@]}" $P.pp=2 $P.cp=2 $P.tp=2 $P.pp_schedule=zb --training.micro_batch=2
run 1 tref "${L4[@]}" --model.tied_embeddings=true --training.micro_batch=8 || bad "tied reference failed"
check 8 tied_dp2_pp2_tp2_sp_zb_z1 tref "${L4[@]}" --model.tied_embeddings=true $P.dp=2 $P.pp=2 $P.tp=2 $P.sp=true $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1
run 1 tmref "${moe[@]}" --model.tied_embeddings=true --training.micro_batch=8 || bad "tied MoE reference failed"
check 8 tied_dp2_pp2_tp2_1f1b_z2 tref "${L4[@]}" --model.tied_embeddings=true $P.dp=2 $P.pp=2 $P.tp=2 $P.pp_schedule=1f1b $P.zero=2 --training.micro_batch=1
check 8 tied_moe_dp2_cp2_pp2_ep4_z1 tmref "${moe[@]}" --model.tied_embeddings=true $P.dp=2 $P.cp=2 $P.pp=2 $P.ep=4 $P.zero=1 --training.micro_batch=1
# 8 ranks, mixture of experts: ep over dp, spanning dp × cp, with tp (and sp)
mixed 8 moe_dp4_ep2_pp2_zb_z1 $P.dp=4 $P.ep=2 $P.pp=2 $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1
mixed 8 moe_dp4_ep2_pp2_afab_z2_hsdp2 $P.dp=4 $P.ep=2 $P.pp=2 $P.pp_schedule=afab $P.zero=2 $P.zero_scope=2 --training.micro_batch=1
mixed 8 moe_dp2_cp2_pp2_ep4 $P.dp=2 $P.cp=2 $P.pp=2 $P.ep=4 --training.micro_batch=1
mixed 8 moe_dp2_tp2_pp2_ep2_sp $P.dp=2 $P.tp=2 $P.pp=2 $P.ep=2 $P.sp=true --training.micro_batch=2
mixed 8 moe_dp4_tp2_ep4_z1 $P.dp=4 $P.tp=2 $P.ep=4 $P.zero=1 --training.micro_batch=1
mixed 8 moe_dp2_cp2_tp2_ep2_sp_z3 $P.dp=2 $P.cp=2 $P.tp=2 $P.ep=2 $P.sp=true $P.zero=3 --training.micro_batch=2
mixed 8 moe_cp2_tp2_pp2_ep2_interleaved $P.cp=2 $P.tp=2 $P.pp=2 $P.ep=2 $P.pp_schedule=interleaved $P.pp_virtual=2 --training.micro_batch=2
# 16 ranks: all five
full=($P.dp=2 $P.pp=2 $P.cp=2 $P.tp=2 $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1)
mixed 16 moe_5d_ep2_zb_z1_sp "${full[@]}" $P.ep=2 $P.sp=true
mixed 16 moe_5d_ep2_zb_z1 "${full[@]}" $P.ep=2
dense 16 5d_zb_z1_sp "${full[@]}" $P.sp=true
mixed 16 moe_5d_ep4_interleaved $P.dp=2 $P.pp=2 $P.cp=2 $P.tp=2 $P.ep=4 $P.pp_schedule=interleaved $P.pp_virtual=2 --training.micro_batch=2
mixed 16 moe_dp4_cp2_pp2_ep2_afab $P.dp=4 $P.cp=2 $P.pp=2 $P.ep=2 $P.pp_schedule=afab --training.micro_batch=1
dense 16 dp4_pp2_tp2_1f1b_z1_hsdp2 $P.dp=4 $P.pp=2 $P.tp=2 $P.zero=1 $P.zero_scope=2 $P.pp_schedule=1f1b --training.micro_batch=1
dense 16 dp2_cp4_tp2_z2 $P.dp=2 $P.cp=4 $P.tp=2 $P.zero=2 --training.micro_batch=2
dense 16 dp8_tp2_z3_sp $P.dp=8 $P.tp=2 $P.zero=3 $P.sp=true --training.micro_batch=1
mixed 16 moe_dp4_cp2_tp2_ep4_z2 $P.dp=4 $P.cp=2 $P.tp=2 $P.ep=4 $P.zero=2 --training.micro_batch=1

# no allocation inside a step (set-up allocates, steps do not): in the 16-rank runs of all five,
# every step after the first made none on rank 0 (metrics) and no rank warned of any (logs)
for name in moe_5d_ep2_zb_z1_sp 5d_zb_z1_sp; do
  "$PY" - "$tmp/$name.jsonl" "$tmp/$name.log" "$name" <<'PY' && ok || bad "$name allocated during a step"
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
late = {s["step"]: s["allocs"] for s in steps if s["step"] > 1 and s["allocs"] != 0}
warned = [l for l in open(sys.argv[2]) if "allocations during the step" in l]
print(f"{sys.argv[3]}: allocations per step {[s['allocs'] for s in steps]} (rank 0); "
      f"{len(warned)} warnings from any rank")
sys.exit(0 if len(steps) >= 5 and not late and not warned else 1)
PY
done

# degrees other than powers of two (12 ranks; 3 layers, 24-token sequences, 12 rows, 6 experts)
O=(--model.n_layers=3 --training.seq_len=24 --training.global_batch=12)
omoe=("${O[@]}" --model.n_experts=6 --model.top_k=2 --model.moe_ffn_dim=24 --model.moe_first_dense=1 --model.aux_loss_coef=0.05)
run 1 oref "${O[@]}" --training.micro_batch=12 && run 1 omref "${omoe[@]}" --training.micro_batch=12 || bad "odd references failed"
check 12 odd_dp3_pp2_tp2_z1 oref "${O[@]}" $P.dp=3 $P.pp=2 $P.tp=2 $P.zero=1 --training.micro_batch=2
check 6 odd_cp3_tp2_sp oref "${O[@]}" $P.cp=3 $P.tp=2 $P.sp=true --training.micro_batch=4
check 12 odd_moe_dp3_pp2_cp2_ep3 omref "${omoe[@]}" $P.dp=3 $P.pp=2 $P.cp=2 $P.ep=3 --training.micro_batch=2
check 6 odd_moe_dp3_cp2_ep6_z3 omref "${omoe[@]}" $P.dp=3 $P.cp=2 $P.ep=6 $P.zero=3 --training.micro_batch=4

# the same layout twice: bitwise the same losses (printed to 17 digits) and checkpoint files
losses() { "$PY" -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1])])' "$1"; }
repeat() { # NP NAME ARGS...: two runs, each saving its step-10 checkpoint
  local np="$1" name="$2"; shift 2
  run "$np" "${name}1" "$@" --checkpoint.dir="$tmp/${name}1" &&
  run "$np" "${name}2" "$@" --checkpoint.dir="$tmp/${name}2" || { bad "$name runs failed"; return; }
  local a="$tmp/${name}1/step_00000010" b="$tmp/${name}2/step_00000010" n=0 f
  for f in "$a"/*.safetensors; do cmp -s "$f" "$b/${f##*/}" || { bad "$name: ${f##*/} differs"; return; }; n=$((n + 1)); done
  if [ "$(losses "$tmp/${name}1.jsonl")" = "$(losses "$tmp/${name}2.jsonl")" ] && [ $n -ge 1 ]; then
    ok; echo "$name twice: losses and $n shard(s) bitwise equal"
  else bad "$name: the losses of two runs differ"; fi
}
mfull=("${moe[@]}" "${full[@]}" $P.ep=2 $P.sp=true)
repeat 16 rep "${mfull[@]}"
repeat 8 rep_z3 "${moe[@]}" $P.dp=2 $P.cp=2 $P.tp=2 $P.ep=2 $P.zero=3 --training.micro_batch=2

# resharding: 16 ranks (5D, MoE) for 5 steps, then 1 rank; 1 rank for 5, then 16 ranks
ck="$tmp/ck16"
run 16 r16a "${mfull[@]}" --checkpoint.dir="$ck" --training.steps=5 &&
run 1 r16b "${moe[@]}" --training.micro_batch=8 --checkpoint.dir="$ck" --checkpoint.resume=latest ||
  bad "16 -> 1 runs failed: $(tail -2 "$tmp"/r16*.log)"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --resume "$tmp" mref "16 ranks -> 1" r16a r16b && ok ||
  bad "16 -> 1 does not continue the uninterrupted run"
ck1="$tmp/ck1"
run 1 r1a "${moe[@]}" --training.micro_batch=8 --checkpoint.dir="$ck1" --training.steps=5 &&
run 16 r1b "${mfull[@]}" --checkpoint.dir="$ck1" --checkpoint.resume=latest ||
  bad "1 -> 16 runs failed: $(tail -2 "$tmp"/r1*.log)"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --resume "$tmp" mref "1 rank -> 16" r1a r1b && ok ||
  bad "1 -> 16 does not continue the uninterrupted run"
# the 16-rank checkpoint's Hugging Face export equals the 1-rank one's (same step, same weights)
"$bin" export --checkpoint "$ck/step_00000005" --out "$tmp/ex16" > /dev/null 2>&1 &&
"$bin" export --checkpoint "$ck1/step_00000005" --out "$tmp/ex1" > /dev/null 2>&1 || bad "export failed"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --exports "$tmp/ex16/model.safetensors" \
  "$tmp/ex1/model.safetensors" "export 16 ranks vs 1" && ok || bad "the 16-rank export differs"

# the run report of the 16-rank run: rank 0's memory row = its metrics; one row per rank; every
# dimension of degree 2 listed, and every group rank 0's metrics saw traffic on
"$PY" - "$tmp/rep1.log" "$tmp/rep1.jsonl" <<'PY' && ok || bad "the run report does not match the metrics"
import json, re, sys
log = open(sys.argv[1]).read().splitlines()
m = [json.loads(l) for l in open(sys.argv[2])][-1]
start = max(i for i, l in enumerate(log) if "run report" in l)
rows = [l for l in log[start:] if re.search(r"\] +rank \d+ \(", l)]
groups = [l.split()[2] for l in log[start:] if re.match(r"\[rank 0\]   \w+ ", l) and "memory" not in l
          and not re.search(r"\] +rank ", l) and "group" not in l]
print("report groups:", groups, "rows:", len(rows))
r0 = [float(x) for x in rows[0].split(")")[1].split()]
mem = m["mem"]
want = [mem["params"], mem["grads"], mem["optim"], mem["activations"]]
ok = len(rows) == 16 and all(abs(r0[i] - want[i] / 1048576) <= 0.006 for i in range(4))
ok = ok and set(groups) >= {"tp", "pp", "cp", "ep", "dpcp", "edp"}  # (dp: its gradients go by dpcp)
for g, b in m["comm_groups"].items():
    ok = ok and (g in groups or b == 0)
print("rank 0 memory row", r0[:4], "metrics", [w / 1048576 for w in want])
sys.exit(0 if ok else 1)
PY

# a rank killed mid-step: the job ends, non-zero, naming the rank
killed_rank 8 3 "${L4[@]}" $P.dp=2 $P.tp=2 $P.pp=2 --training.micro_batch=2

echo "test_5d: $pass passed, $fail failed"
[ $fail -eq 0 ]
