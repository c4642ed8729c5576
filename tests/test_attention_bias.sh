#!/usr/bin/env bash
# test_attention_bias.sh PENTATRON: attention biases (model.attention_bias: q, k, v and o, Llama's;
# model.qkv_bias: q, k and v, Qwen 2's) in every parallelism, against one process (the model
# itself is checked against PyTorch by test_model_torch's test_attention_biases*):
#   - the biases matter: the single-process losses with and without them differ, and training
#     moves them (the step-1 gradients of every bias are nonzero);
#   - layouts reproduce the single-process run (step-1 gradients per tensor ‖Δ‖/‖g‖ ≤ 1e-5, 10
#     losses ≤ 1e-4): tp 2 (q, k, v biases split with their heads; o's replicated, added once after
#     the tp sum), tp 4 over 2 key/value heads (a head's bias held by two ranks, its gradient
#     summed), sp (o's bias gradient from the gathered rows), ZeRO-3 (the biases sharded with
#     everything), every pipeline schedule's placement, cp, ep with a mixture of experts, and
#     8-rank compositions; Qwen 2's q/k/v-only biases under tp·sp;
#   - a checkpoint of a tp 2 × pp 2 run continued on one process equals the uninterrupted run;
#   - bf16 under tp 2 + sp: step-1 gradients within 0.1× of bf16's own distance from fp32.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
P=--parallel
L4=(--model.n_layers=4)
ab=(--model.attention_bias=true)
moe=(--model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.aux_loss_coef=0.05)

run 1 plain "${L4[@]}" --training.micro_batch=8 || bad "bias-free reference failed"
run 1 ref "${L4[@]}" "${ab[@]}" --training.micro_batch=8 || bad "reference failed: $(tail -3 "$tmp/ref.log")"
run 1 qref "${L4[@]}" --model.qkv_bias=true --training.micro_batch=8 || bad "qkv reference failed"
run 1 mref "${moe[@]}" "${ab[@]}" --training.micro_batch=8 || bad "MoE reference failed: $(tail -3 "$tmp/mref.log")"

"$PY" - "$tmp" "$PT_SOURCE_DIR/tests/ref" <<'PY' && ok || bad "the biases do not take part in training"
import json, math, sys
sys.path.insert(0, sys.argv[2])
from compare_runs import safetensors
tmp = sys.argv[1]
L = {n: [json.loads(l)["loss"] for l in open("%s/%s.jsonl" % (tmp, n))] for n in ("plain", "ref", "qref")}
g, q = safetensors("%s/ref.st" % tmp), safetensors("%s/qref.st" % tmp)
biases = [k for k in g if k.endswith(".bias")]
qb = [k for k in q if k.endswith(".bias")]
norm = lambda v: math.sqrt(sum(x * x for x in v))
smallest = min(norm(g[k]) for k in biases)
diff = max(abs(a - b) / abs(b) for a, b in zip(L["ref"], L["plain"]))
print("attention biases: %d bias tensors (q, k, v, o x 4 layers), %d for q/k/v only; smallest step-1 "
      "gradient norm %.2e; losses with vs without biases differ by up to %.2e" % (len(biases), len(qb), smallest, diff))
ok = len(biases) == 16 and len(qb) == 12 and not any(k.endswith("o_proj.bias") for k in qb)
sys.exit(0 if ok and smallest > 0 and diff > 1e-3 else 1)
PY

dense() { local np="$1" name="$2"; shift 2; check "$np" "$name" ref "${L4[@]}" "${ab[@]}" "$@"; }
dense 2 tp2 $P.tp=2 --training.micro_batch=8
dense 4 tp4_sp_kv_shared $P.tp=4 $P.sp=true --training.micro_batch=8
dense 2 dp2_z3 $P.dp=2 $P.zero=3 --training.micro_batch=4
dense 2 pp2_1f1b $P.pp=2 $P.pp_schedule=1f1b --training.micro_batch=2
dense 2 pp2_zb $P.pp=2 $P.pp_schedule=zb --training.micro_batch=1
dense 2 cp2 $P.cp=2 --training.micro_batch=8
dense 8 dp2_cp2_tp2_sp_z1 $P.dp=2 $P.cp=2 $P.tp=2 $P.sp=true $P.zero=1 --training.micro_batch=2
dense 8 pp2_tp2_interleaved_z1 $P.dp=2 $P.pp=2 $P.tp=2 $P.pp_schedule=interleaved $P.pp_virtual=2 $P.zero=1 --training.micro_batch=1
dense 2 tp2_full_recompute $P.tp=2 --training.recompute=full --training.micro_batch=8
check 2 qkv_tp2_sp qref "${L4[@]}" --model.qkv_bias=true $P.tp=2 $P.sp=true --training.micro_batch=8
check 8 moe_dp2_tp2_ep2_sp mref "${moe[@]}" "${ab[@]}" $P.dp=4 $P.tp=2 $P.ep=2 $P.sp=true --training.micro_batch=2

# resharding: tp 2 × pp 2 for 5 steps, then one process
ck="$tmp/ck"
run 4 ra "${L4[@]}" "${ab[@]}" $P.tp=2 $P.pp=2 --training.micro_batch=2 --checkpoint.dir="$ck" --training.steps=5 &&
run 1 rb "${L4[@]}" "${ab[@]}" --training.micro_batch=8 --checkpoint.dir="$ck" --checkpoint.resume=latest ||
  bad "tp2·pp2 -> 1 runs failed: $(tail -2 "$tmp"/r[ab].log)"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --resume "$tmp" ref "tp2·pp2 -> 1" ra rb && ok ||
  bad "tp2·pp2 -> 1 does not continue the uninterrupted run"

# bf16 under tp 2 + sp against the single-process bf16 run
bf=(--training.precision=bf16)
run 1 bref "${L4[@]}" "${ab[@]}" "${bf[@]}" --training.micro_batch=8 || bad "bf16 reference failed"
if run 2 bf_tp2_sp "${L4[@]}" "${ab[@]}" "${bf[@]}" $P.tp=2 $P.sp=true --training.micro_batch=8; then
  "$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --bf16 "$tmp" ref bref bf_tp2_sp "attention biases, bf16: tp2·sp" && ok ||
    bad "bf16 tp2·sp with biases too far from the single-process bf16 run"
else
  bad "bf16 tp2·sp failed: $(tail -3 "$tmp/bf_tp2_sp.log")"
fi

echo "test_attention_bias: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
