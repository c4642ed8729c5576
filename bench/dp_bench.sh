#!/usr/bin/env bash
# dp_bench.sh [STEPS]: data parallelism on one machine: dp = 2 ranks × 1 thread against dp = 1 ×
# 2 threads, same global batch (8 × 256 tokens), small config (dim 256, 4 layers, vocab 50257).
# Prints tokens/s (median after 2 steps), the ratio to dp = 1, and the time ranks wait on
# communication after backward with the reduction overlapped (parallel.overlap = true) and not;
# hidden = 1 − wait(overlap) / wait(no overlap).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
steps="${1:-12}"
out="${BENCH_OUT:-/tmp/pentatron_dp_bench}"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
PY=/usr/bin/python3
bin="$root/build/pentatron"
[[ -x $bin ]] || "$root/scripts/build.sh" >/dev/null
shard="$out/synthetic_000.bin"
[[ -f $shard ]] || "$PY" "$root/bench/make_data.py" --out "$shard" --tokens $((steps * 8 * 256 + 1)) --vocab 50257 --seed 0
cfg=(--model.vocab_size=50257 --model.dim=256 --model.n_layers=4 --model.n_heads=4 --model.n_kv_heads=4
     --model.ffn_dim=688 --model.max_seq_len=256 --training.seq_len=256 --training.global_batch=8
     --data.train="$shard" --training.steps="$steps" --logging.every=1000 --logging.progress=false)
"$bin" train "${cfg[@]}" --training.threads=2 --training.micro_batch=8 --logging.metrics="$out/dp1.jsonl" >/dev/null
for z in 0 1; do
  for ov in true false; do
    mpirun -np 2 --bind-to none "$bin" train "${cfg[@]}" --training.threads=1 --training.micro_batch=4 \
      --parallel.dp=2 --parallel.zero=$z --parallel.overlap=$ov --logging.metrics="$out/dp2_z${z}_$ov.jsonl" >/dev/null
  done
done
"$PY" - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def load(n):
    m = [json.loads(l) for l in open("%s/%s.jsonl" % (out, n))][2:]
    return statistics.median(x["tokens_per_s"] for x in m), statistics.median(x.get("comm_wait_s", 0) for x in m)
base, _ = load("dp1")
print("dp1 x 2 threads: %.0f tok/s" % base)
for z in (0, 1):
    a, wa = load("dp2_z%d_true" % z)
    b, wb = load("dp2_z%d_false" % z)
    print("dp2 x 1 thread, ZeRO-%d: overlap %.0f tok/s (%.2fx dp1, wait %.3f s) | no overlap %.0f tok/s "
          "(%.2fx, wait %.3f s) | hidden %.0f%%" % (z, a, a / base, wa, b, b / base, wb, 100 * (1 - wa / wb)))
PY
