#!/usr/bin/env bash
# pp_bench.sh [STEPS]: pipeline parallelism on one machine: pp = 2 ranks × 1 thread against pp = 1
# × 2 threads, 1F1B and the zero-bubble schedule (ZB-H1), m = 8 micro-batches of 1 × 256 tokens,
# dim 512, 8 layers, vocab 8192, untied. Prints tokens/s (median after 2 warm-up steps), the ratio
# to pp = 1, each stage's measured idle fraction (time blocked on pipeline transfers / step time)
# and the schedule's predicted bubble (pentatron schedule, unit costs).
set -euo pipefail
steps="${1:-8}"
source "$(dirname "${BASH_SOURCE[0]}")/parallel_common.sh" pp
shard="$(synthetic_shard 8192 $((steps * 8 * 256 + 1)))"
cfg=(--model.vocab_size=8192 --model.dim=512 --model.n_layers=8 --model.n_heads=8 --model.n_kv_heads=8
     --model.ffn_dim=1376 --model.max_seq_len=256 --training.seq_len=256 --training.global_batch=8
     --training.micro_batch=1 --data.train="$shard" --training.steps="$steps" --logging.every=1000
     --logging.progress=false)
rm -f "$out"/*.jsonl
"$bin" train "${cfg[@]}" --training.threads=2 --logging.metrics="$out/pp1.jsonl" >/dev/null
for s in 1f1b zb; do
  mpirun -np 2 --bind-to none "$bin" train "${cfg[@]}" --training.threads=1 --parallel.pp=2 \
    --parallel.pp_schedule=$s --logging.metrics="$out/pp2_$s.jsonl" >/dev/null
  "$bin" schedule --pp 2 --microbatches 8 --schedule $s | grep '^bubble' > "$out/pp2_$s.bubble"
done
"$PY" - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def load(n):
    m = [json.loads(l) for l in open("%s/%s.jsonl" % (out, n))][2:]
    tok = statistics.median(x["tokens_per_s"] for x in m)
    idle = [statistics.median(x["pp_idle"][i] for x in m) for i in range(len(m[0].get("pp_idle", [])))]
    return tok, idle
base, _ = load("pp1")
print("pp1 x 2 threads: %.0f tok/s" % base)
for s in ("1f1b", "zb"):
    t, idle = load("pp2_" + s)
    pred = open("%s/pp2_%s.bubble" % (out, s)).read().strip()
    print("pp2 x 1 thread, %s: %.0f tok/s (%.2fx pp1); idle per stage %s; schedule %s" % (
        s, t, t / base, ", ".join("%.0f%%" % (100 * x) for x in idle), pred))
PY
