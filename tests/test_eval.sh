#!/usr/bin/env bash
# test_eval.sh PENTATRON: held-out evaluation (data.val, eval.every, eval.tokens) and the
# learning rates a run logs.
#   - the validation loss is in the log and in the metrics on the steps it runs (every 5 steps
#     and the last), and equals an independent computation: a PyTorch forward in float64
#     (tests/ref/llama_ref.py) of the exported final model on the same validation rows, within
#     1e-5 relative (measured 2e-9), and for training.precision = bf16 llama_ref's bf16 forward
#     (which rounds where the C model rounds) within 1e-5 (measured 1e-9);
#   - evaluating does not change training: losses (all 10 steps, as printed to 17 digits), step-1
#     gradients and the final checkpoint are byte-identical with and without data.val and
#     eval.every, in one process, dp 2 with ZeRO-3, pp 2 (1F1B), the MoE model under dp 2 × ep 2,
#     and in bf16; no allocation during an evaluation; a run resumed at step 5 evaluates and
#     trains as the uninterrupted one (the validation reader holds no state); with
#     training.recompute = full the validation losses are the same bit for bit;
#   - the validation loss is a forward pass of the same model whatever the layout: dp 2 (ZeRO-0
#     and 3), tp 2 (with and without sp), pp 2 (1F1B, zero bubble, its forward-only pass per
#     micro-batch; interleaved for the MoE model; a tied head), cp 2, dp 2 × ep 2 (the MoE model
#     of test_moe.sh), dp 2 × pp 2 × tp 2 with sp and ZeRO-1, and dp 2 and pp 2 in bf16: each
#     within 1e-5 relative of the single-process run (measured ≤ 9e-9; bf16 1e-4, its training
#     drifting between layouts: measured up to 8.9e-6);
#   - optimizer.schedule = wsd logs at each step the learning rate of its formula;
#   - a data.val that matches nothing or is not a shard (one process), holds too few rows for
#     eval.tokens, or eval keys without data.val (2 ranks): one message, a non-zero exit.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"

# the held-out shard: another stream of the same kind (4,000 tokens: 249 rows of 16 + 1)
shard "$tmp/val_000000.bin" 4000 7 0.2
# two global batches of 8 × 16 per evaluation, after steps 5 and 10
ev=(--data.val="$tmp/val_*.bin" --eval.every=5 --eval.tokens=256)

# val_losses NAME: "step val_loss" per evaluated step of its metrics
val_losses() {
  "$PY" -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "val_loss" in r: print(r["step"], repr(r["val_loss"]))' "$tmp/$1.jsonl"
}

# same_val REF NAME TOL: NAME evaluated at the same steps as REF, each loss within TOL relative
same_val() {
  local out
  if out="$("$PY" - "$(val_losses "$1")" "$(val_losses "$2")" "$3" <<'PY'
import sys
a = [l.split() for l in sys.argv[1].splitlines()]
b = [l.split() for l in sys.argv[2].splitlines()]
tol = float(sys.argv[3])
if not a or [s for s, _ in a] != [s for s, _ in b]:
    sys.exit("evaluated at steps %s, the reference at %s" % ([s for s, _ in b], [s for s, _ in a]))
worst = max(abs(float(y) - float(x)) / abs(float(x)) for (_, x), (_, y) in zip(a, b))
print("%.2e" % worst)
sys.exit(0 if worst <= tol else "relative difference %.2e > %g" % (worst, tol))
PY
)"; then ok; echo "$2: val loss at steps $(val_losses "$2" | cut -d' ' -f1 | tr '\n' ' ')within $out of $1"
  else bad "$2 against $1: $out"; fi
}

# same_training A B: the runs' losses (as written), step-1 gradients and last checkpoints are
# byte-identical (their eval keys aside)
same_training() {
  local n=0
  if [ "$(cut -d, -f1,2 "$tmp/$1.jsonl")" != "$(cut -d, -f1,2 "$tmp/$2.jsonl")" ] ||
     [ "$(wc -l < "$tmp/$1.jsonl")" -ne 10 ]; then
    bad "$2: losses differ from $1's"; return
  fi
  if ! cmp -s "$tmp/$1.st" "$tmp/$2.st"; then bad "$2: step-1 gradients differ from $1's"; return; fi
  for f in "$tmp/ck_$1"/step_00000010/*.safetensors; do
    if ! cmp -s "$f" "$tmp/ck_$2/step_00000010/${f##*/}"; then bad "$2: ${f##*/} differs"; return; fi
    n=$((n + 1))
  done
  if [ "$n" -eq 0 ]; then bad "$1: no checkpoint"; return; fi
  ok; echo "$2: 10 losses, step-1 gradients and $n checkpoint file(s) byte-identical to $1"
}

# pair NP NAME ARGS...: NAME with evaluation, NAME_noeval without, both checkpointed; the same
# training
pair() {
  local np="$1" name="$2"; shift 2
  run "$np" "$name" "${ev[@]}" --checkpoint.dir="$tmp/ck_$name" "$@" ||
    bad "$name failed: $(tail -3 "$tmp/$name.log")"
  run "$np" "${name}_noeval" --checkpoint.dir="$tmp/ck_${name}_noeval" "$@" ||
    bad "${name}_noeval failed: $(tail -3 "$tmp/${name}_noeval.log")"
  same_training "$name" "${name}_noeval"
  if grep -q "evaluation after step" "$tmp/$name.log"; then
    bad "$name: $(grep "evaluation after step" "$tmp/$name.log" | head -1)"
  fi
}

# torch_ref NAME PRECISION TOL: NAME's last val loss against llama_ref.py's forward of its exported
# step-10 model on the first 16 rows of the validation shard
torch_ref() {
  local name="$1" prec="$2" tol="$3" out
  "$bin" export --checkpoint "$tmp/ck_$name/step_00000010" --out "$tmp/hf_$name" > /dev/null 2>&1 ||
    { bad "$name: export failed"; return; }
  if out="$("$PY" - "$PT_SOURCE_DIR/tests/ref" "$tmp/hf_$name" "$tmp/val_000000.bin" \
      "$(val_losses "$name" | tail -1 | cut -d' ' -f2)" "$prec" "$tol" <<'PY'
import json, os, struct, sys
sys.path.insert(0, sys.argv[1])
import torch, llama_ref
hf, shard, got, prec = sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
tol = float(sys.argv[6])
c = json.load(open(os.path.join(hf, "config.json")))
cfg = llama_ref.Cfg(c["vocab_size"], c["hidden_size"], c["num_hidden_layers"],
                    c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"],
                    c["rope_theta"], c["rms_norm_eps"], c.get("tie_word_embeddings", False))
w, _ = llama_ref.load_safetensors(os.path.join(hf, "model.safetensors"))
raw = open(shard, "rb").read()
n = struct.unpack("<3i", raw[:12])[2]
toks = torch.tensor(struct.unpack("<%dH" % n, raw[1024:1024 + 2 * n]), dtype=torch.int64)
T, rows = 16, 16  # eval.tokens = 256: two global batches of 8 rows
x = torch.stack([toks[i * T:i * T + T] for i in range(rows)])
y = torch.stack([toks[i * T + 1:i * T + T + 1] for i in range(rows)])
with torch.no_grad():
    if prec == "bf16":
        p = {k: v.float() for k, v in w.items()}
        logits = llama_ref.forward_bf16(p, x, cfg).double()
    else:
        p = {k: v.double() for k, v in w.items()}
        logits = llama_ref.forward(p, x, cfg)
want = llama_ref.loss_sum(logits, y).item() / y.numel()
rel = abs(got - want) / want
print("val loss %.9f, PyTorch %s %.9f: %.2e relative" % (got, prec, want, rel))
sys.exit(0 if rel <= tol else 1)
PY
)"; then ok; echo "$name: $out"; else bad "$name against PyTorch: $out"; fi
}

# --- one process: the log, the metrics, the reference, the same training ---------------------
pair 1 ref --checkpoint.every=5
if [ "$(val_losses ref | cut -d' ' -f1 | tr '\n' ' ')" = "5 10 " ] &&
   [ "$(grep -c "eval at step .*: val loss" "$tmp/ref.log")" -eq 2 ]; then ok
else bad "ref: evaluations at steps '$(val_losses ref | cut -d' ' -f1 | tr '\n' ' ')', log: \
$(grep -c "eval at" "$tmp/ref.log")"; fi
torch_ref ref fp32 1e-5
# resumed at step 5 (its checkpoint), the run evaluates and trains as the uninterrupted one did
run 1 ref_resumed "${ev[@]}" --checkpoint.resume="$tmp/ck_ref/step_00000005" ||
  bad "ref_resumed failed: $(tail -3 "$tmp/ref_resumed.log")"
if [ "$(tail -5 "$tmp/ref.jsonl" | cut -d, -f1,2)" = "$(cut -d, -f1,2 "$tmp/ref_resumed.jsonl")" ] &&
   [ "$(val_losses ref | tail -1)" = "$(val_losses ref_resumed)" ]; then
  ok; echo "ref_resumed: steps 6-10 and the val loss at 10 byte-identical to the uninterrupted run"
else bad "ref_resumed: $(val_losses ref_resumed) against $(val_losses ref | tail -1)"; fi

# recomputation is exact: the same validation losses, bit for bit
run 1 ref_full "${ev[@]}" --training.recompute=full || bad "ref_full failed: $(tail -3 "$tmp/ref_full.log")"
same_val ref ref_full 0

# --- layouts against the single process --------------------------------------------------------
pair 2 dp2z3 --parallel.dp=2 --parallel.zero=3 --training.micro_batch=4
same_val ref dp2z3 1e-5
pair 2 pp2 --parallel.pp=2 --training.micro_batch=2
same_val ref pp2 1e-5
for lay in "2 dp2 --parallel.dp=2 --training.micro_batch=4" "2 tp2 --parallel.tp=2" \
           "2 tp2sp --parallel.tp=2 --parallel.sp=true" "2 cp2 --parallel.cp=2" \
           "2 pp2zb --parallel.pp=2 --parallel.pp_schedule=zb --training.micro_batch=2" \
           "8 dp2pp2tp2 --parallel.dp=2 --parallel.pp=2 --parallel.tp=2 --parallel.sp=true
              --training.micro_batch=2 --parallel.zero=1"; do
  set -- $lay
  np="$1" name="$2"; shift 2
  if run "$np" "$name" "${ev[@]}" "$@"; then same_val ref "$name" 1e-5
  else bad "$name failed: $(tail -3 "$tmp/$name.log")"; fi
done

# --- the MoE model of test_moe.sh: expert parallelism ------------------------------------------
moe=(--model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.n_shared_experts=1 --model.aux_loss_coef=0.05
     --model.z_loss_coef=0.01)
run 1 moe "${ev[@]}" "${moe[@]}" || bad "moe failed: $(tail -3 "$tmp/moe.log")"
pair 2 moe_ep2 "${moe[@]}" --parallel.dp=2 --parallel.ep=2 --training.micro_batch=4
same_val moe moe_ep2 1e-5
run 2 moe_pp2i "${ev[@]}" "${moe[@]}" --parallel.pp=2 --parallel.pp_schedule=interleaved \
    --parallel.pp_virtual=2 --training.micro_batch=2 ||
  bad "moe_pp2i failed: $(tail -3 "$tmp/moe_pp2i.log")"
same_val moe moe_pp2i 1e-5

# --- a tied head: the pipeline's last stage evaluates with its copy of the embedding ------------
run 1 tied "${ev[@]}" --model.tied_embeddings=true || bad "tied failed: $(tail -3 "$tmp/tied.log")"
run 2 tied_pp2 "${ev[@]}" --model.tied_embeddings=true --parallel.pp=2 --training.micro_batch=2 ||
  bad "tied_pp2 failed: $(tail -3 "$tmp/tied_pp2.log")"
same_val tied tied_pp2 1e-5

# --- bf16 ---------------------------------------------------------------------------------------
pair 1 bf16 --training.precision=bf16
torch_ref bf16 bf16 1e-5
run 2 bf16_dp2 "${ev[@]}" --training.precision=bf16 --parallel.dp=2 --training.micro_batch=4 ||
  bad "bf16_dp2 failed: $(tail -3 "$tmp/bf16_dp2.log")"
same_val bf16 bf16_dp2 1e-4
run 2 bf16_pp2 "${ev[@]}" --training.precision=bf16 --parallel.pp=2 --training.micro_batch=2 ||
  bad "bf16_pp2 failed: $(tail -3 "$tmp/bf16_pp2.log")"
same_val bf16 bf16_pp2 1e-4

# --- the learning rates of a wsd run ------------------------------------------------------------
run 1 wsd --optimizer.schedule=wsd --optimizer.cooldown=sqrt --optimizer.decay_fraction=0.4 \
    --optimizer.min_lr=0.05 || bad "wsd failed: $(tail -3 "$tmp/wsd.log")"
if out="$("$PY" - "$tmp/wsd.jsonl" <<'PY'
import json, math, sys
lr, W, N, D, f = 3e-3, 2, 10, 4, 0.05 * 3e-3  # tiny's lr and warmup; decay_fraction 0.4 of 10
for l in open(sys.argv[1]):
    r = json.loads(l)
    s = r["step"] - 1
    q = max(0, s - (N - D)) / D
    want = lr * (s + 1) / W if s < W else f + (lr - f) * (1 - math.sqrt(q))
    if abs(r["lr"] - want) > 1e-6 * want:
        sys.exit("step %d: lr %.9g, formula %.9g" % (r["step"], r["lr"], want))
print("10 steps")
PY
)"; then ok; echo "wsd: the logged learning rates of $out equal the formula"; else bad "wsd: $out"; fi

# --- bad input ----------------------------------------------------------------------------------
head -c 2048 /dev/zero > "$tmp/badval_000000.bin"
expect_fail 1 'data.val: no file matches' --data.val="$tmp/nothing_*.bin"
expect_fail 1 "$tmp/badval_000000.bin: bad magic" --data.val="$tmp/badval_*.bin"
expect_fail 2 'eval.tokens = 4096 needs 256 sequences' --parallel.dp=2 --training.micro_batch=4 \
    --data.val="$tmp/val_*.bin" --eval.tokens=4096
expect_fail 2 'eval.every and eval.tokens need data.val' --parallel.dp=2 --training.micro_batch=4 \
    --eval.every=5

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
