#!/usr/bin/env bash
# test_moe_scope.sh PENTATRON: the balancing loss's scope (model.aux_loss_scope) under the
# layouts, against one process (each scope's single-process model is held to PyTorch by
# test_model_torch's test_moe_scope_* cases):
#   - micro_batch: f and P over each micro-batch's tokens; a layout equals the single-process run
#     with the same micro_batch (the micro-batches hold the same sequences): dp 2 with
#     accumulation, pp 2 (zb), dp 2 × pp 2, ep 2, cp 2 (a micro-batch's statistics summed over
#     its context ranks), ep 4 over dp 2 × cp 2, tp 2 + sp with ep 2;
#   - global: f the previous step's token-slot shares over the whole global batch, P over the
#     step's tokens; every layout and every micro_batch equals one process with one micro-batch
#     (the counts summed over the data and context ranks and the pipeline stages), full
#     recomputation counts a layer's slots once, and a run resumed from a checkpoint (which
#     carries f) continues as if it had not stopped;
#   - step-1 gradients ‖Δ‖/‖g‖ ≤ 1e-5 and 10 losses ≤ 1e-4 (compare_runs.py), and every step's
#     aux_loss within 1e-6 relative of the reference's;
#   - the three scopes give three different aux losses (at step 1 the global one is
#     aux_loss_coef per MoE layer: uniform f); a bad scope fails with one message.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
moe=(--model.n_layers=3 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.aux_loss_coef=0.1 --model.z_loss_coef=0.01)

aux_same() { # REF NAME: every step's aux_loss within 1e-6 relative
  "$PY" - "$tmp/$1.jsonl" "$tmp/$2.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["aux_loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["aux_loss"] for l in open(sys.argv[2])]
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
sys.exit(0 if len(a) == len(b) == 10 and worst <= 1e-6 else 1)
PY
}
scheck() { # NP NAME REF ARGS...: check (gradients, losses), then the aux losses
  local np="$1" name="$2" ref="$3"; shift 3
  if run "$np" "$name" "$@"; then
    if compare "$ref" "$name" > "$tmp/$name.cmp" && aux_same "$ref" "$name"; then ok
    else bad "$name differs from $ref: $(tail -2 "$tmp/$name.cmp")"; fi
  else
    bad "$name failed: $(tail -3 "$tmp/$name.log")"
  fi
}

# micro_batch: one reference per micro-batch size; global: one for every layout and size
mb=(--model.aux_loss_scope=micro_batch "${moe[@]}")
gl=(--model.aux_loss_scope=global "${moe[@]}")
for m in 1 2 4 8; do
  run 1 mb_ref$m "${mb[@]}" --training.micro_batch=$m || bad "mb_ref$m failed: $(tail -3 "$tmp/mb_ref$m.log")"
done
run 1 gl_ref "${gl[@]}" --training.micro_batch=8 || bad "gl_ref failed: $(tail -3 "$tmp/gl_ref.log")"
scopes() { # NAME NP MICRO ARGS...: a layout under both scopes, against their references
  local name="$1" np="$2" m="$3"; shift 3
  scheck "$np" "mb_$name" "mb_ref$m" "${mb[@]}" --training.micro_batch="$m" "$@"
  scheck "$np" "gl_$name" gl_ref "${gl[@]}" --training.micro_batch="$m" "$@"
}
scopes dp2_z1 2 2 --parallel.dp=2 --parallel.zero=1
scopes pp2_zb 2 2 --parallel.pp=2 --parallel.pp_schedule=zb
scopes dp2_pp2 4 1 --parallel.dp=2 --parallel.pp=2
scopes ep2 2 4 --parallel.dp=2 --parallel.ep=2
scopes cp2 2 8 --parallel.cp=2
scopes ep4_dp2_cp2 4 2 --parallel.cp=2 --parallel.dp=2 --parallel.ep=4
scopes tp2_sp_ep2 4 4 --parallel.tp=2 --parallel.sp=true --parallel.dp=2 --parallel.ep=2
# global with accumulation on one process, and with full recomputation (slots counted once)
scheck 1 gl_acc4 gl_ref "${gl[@]}" --training.micro_batch=2
scheck 1 gl_recompute gl_ref "${gl[@]}" --training.micro_batch=2 --training.recompute=full
# resumed at step 5 (on another layout): f travels in the checkpoint
run 2 gl_first5 "${gl[@]}" --parallel.dp=2 --training.micro_batch=2 --training.steps=10 \
  --checkpoint.dir="$tmp/glck" --checkpoint.every=5 > /dev/null &&
  cp "$tmp/glck/step_00000005/index.json" "$tmp/index5.json" &&
  rm -rf "$tmp/glck/step_00000010" &&
  run 1 gl_resumed "${gl[@]}" --training.micro_batch=4 --checkpoint.dir="$tmp/glck" \
    --checkpoint.resume=latest || bad "global resume runs failed: $(tail -3 "$tmp/gl_resumed.log")"
"$PY" - "$tmp" <<'PY' && ok || bad "the resumed global run differs from the uninterrupted one"
import json, sys
t = sys.argv[1]
ref = [json.loads(l) for l in open(t + "/gl_ref.jsonl")]
res = [json.loads(l) for l in open(t + "/gl_resumed.jsonl")]
f = json.load(open(t + "/index5.json")).get("aux_f")
worst = max(max(abs(a["loss"] - b["loss"]) / a["loss"], abs(a["aux_loss"] - b["aux_loss"]) / a["aux_loss"])
            for a, b in zip(ref[5:], res))
print("global scope resumed at step 5: steps %s, worst difference %.1e; f in the checkpoint: %s"
      % ([m["step"] for m in res], worst, f and len(f)))
sys.exit(0 if [m["step"] for m in res] == list(range(6, 11)) and worst <= 1e-4 and f and len(f) == 12 else 1)
PY

# the scopes differ; global's first step has the uniform f: aux = coef per MoE layer (2 here)
run 1 seq_ref "${moe[@]}" --training.micro_batch=2 || bad "seq_ref failed"
"$PY" - "$tmp" <<'PY' && ok || bad "the scopes do not give distinct aux losses"
import json, sys
t = sys.argv[1]
aux = {n: [json.loads(l)["aux_loss"] for l in open("%s/%s.jsonl" % (t, n))]
       for n in ("seq_ref", "mb_ref2", "gl_ref")}
for n, a in aux.items():
    print("%-8s aux_loss steps 1-3: %s" % (n, a[:3]))
s, m, g = aux["seq_ref"], aux["mb_ref2"], aux["gl_ref"]
distinct = all(abs(x - y) > 1e-6 * abs(x) for x, y in ((s[0], m[0]), (s[1], g[1]), (m[1], g[1])))
sys.exit(0 if distinct and abs(g[0] - 0.1 * 2) <= 1e-6 else 1)
PY

# a bad scope: one message, non-zero exit on every rank
expect_fail 2 'model.aux_loss_scope: expected one of sequence|micro_batch|global, got "batch"' \
  "${moe[@]}" --parallel.dp=2 --training.micro_batch=4 --model.aux_loss_scope=batch

echo "test_moe_scope: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
