#!/usr/bin/env bash
# ep_bench.sh [STEPS]: expert parallelism on one machine: a small MoE (8 experts, top-2, dim 256,
# 4 layers, expert ffn 688, vocab 8192), 8 × 256 tokens per step; ep = 2 ranks × 1 thread (the
# two data ranks) against ep = 1 × 2 threads. Prints tokens/s (median after 2 warm-up steps), the
# ratio, and the share of the step in the dispatch/combine all-to-alls (blocking: the time waiting
# on the ep group is all of it).
set -euo pipefail
steps="${1:-8}"
source "$(dirname "${BASH_SOURCE[0]}")/parallel_common.sh" ep
shard="$(synthetic_shard 8192 $((steps * 8 * 256 + 1)))"
cfg=(--model.vocab_size=8192 --model.dim=256 --model.n_layers=4 --model.n_heads=4 --model.n_kv_heads=4
     --model.ffn_dim=688 --model.n_experts=8 --model.top_k=2 --model.moe_ffn_dim=688
     --model.max_seq_len=256 --training.seq_len=256 --training.global_batch=8 --data.train="$shard"
     --training.steps="$steps" --logging.every=1000 --logging.progress=false)
rm -f "$out"/*.jsonl
"$bin" train "${cfg[@]}" --training.threads=2 --training.micro_batch=8 --logging.metrics="$out/ep1.jsonl" >/dev/null
mpirun -np 2 --bind-to none "$bin" train "${cfg[@]}" --training.threads=1 --training.micro_batch=4 \
  --parallel.dp=2 --parallel.ep=2 --logging.metrics="$out/ep2.jsonl" >/dev/null
"$PY" - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def load(n):
    m = [json.loads(l) for l in open("%s/%s.jsonl" % (out, n))][2:]
    return (statistics.median(x["tokens_per_s"] for x in m),
            statistics.median(x.get("comm_wait_groups", {}).get("ep", 0) / x["seconds"] for x in m),
            statistics.median(x.get("comm_groups", {}).get("ep", 0) for x in m))
base, _, _ = load("ep1")
t, share, b = load("ep2")
print("ep1 x 2 threads: %.0f tok/s; ep2 x 1 thread: %.0f tok/s (%.2fx), %.0f%% of the step in "
      "dispatch/combine, %.1f MB all-to-all per step per rank" % (base, t, t / base, 100 * share, b / 1e6))
PY
