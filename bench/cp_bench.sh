#!/usr/bin/env bash
# cp_bench.sh [STEPS]: context parallelism on one machine with a long sequence: cp = 2 ranks × 1
# thread (zigzag; ring transfers overlapped, and not) against cp = 1 × 2 threads, T = 8192, one
# sequence per step, dim 256, 4 layers, 4 heads, vocab 8192. Prints tokens/s (median after one
# warm-up step), the ratio to cp = 1, the peak resident memory per rank, and the share of the ring
# transfers hidden: 1 − wait(overlap) / wait(no overlap), wait being the time blocked on the cp
# group in a step (the gradient reduction over dp × cp not counted).
set -euo pipefail
steps="${1:-4}"
source "$(dirname "${BASH_SOURCE[0]}")/parallel_common.sh" cp
T=8192
shard="$(synthetic_shard 8192 $((steps * T + 1)))"
cfg=(--model.vocab_size=8192 --model.dim=256 --model.n_layers=4 --model.n_heads=4 --model.n_kv_heads=4
     --model.ffn_dim=688 --model.max_seq_len=$T --training.seq_len=$T --training.global_batch=1
     --training.micro_batch=1 --data.train="$shard" --training.steps="$steps" --logging.every=1000
     --logging.progress=false)
rm -f "$out"/*.jsonl
"$bin" train "${cfg[@]}" --training.threads=2 --logging.metrics="$out/cp1.jsonl" >/dev/null
for ov in true false; do
  mpirun -np 2 --bind-to none "$bin" train "${cfg[@]}" --training.threads=1 --parallel.cp=2 \
    --parallel.overlap=$ov --logging.metrics="$out/cp2_$ov.jsonl" >/dev/null
done
"$PY" - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def load(n):
    m = [json.loads(l) for l in open("%s/%s.jsonl" % (out, n))][1:]
    return (statistics.median(x["tokens_per_s"] for x in m), statistics.median(x.get("comm_wait_groups", {}).get("cp", 0) for x in m),
            max(x["peak_rss_bytes"] for x in m), m[0].get("mem", {}).get("activations", 0))
base, _, rss1, act1 = load("cp1")
print("cp1 x 2 threads: %.0f tok/s, peak RSS %.0f MiB, activations %.0f MiB" % (base, rss1 / 2**20, act1 / 2**20))
a, wa, rss, act = load("cp2_true")
b, wb, _, _ = load("cp2_false")
print("cp2 x 1 thread: %.0f tok/s (%.2fx cp1), peak RSS %.0f MiB per rank, activations %.0f MiB; "
      "no overlap %.0f tok/s; ring wait %.3f s vs %.3f s: hidden %.0f%%" % (
      a, a / base, rss / 2**20, act / 2**20, b, wa, wb, 100 * (1 - wa / wb) if wb > 0 else 0))
PY
