#!/usr/bin/env bash
# tp_bench.sh [STEPS]: tensor parallelism on one machine: tp = 2 ranks × 1 thread (sequence
# parallelism off and on) against tp = 1 × 2 threads, GPT-2-small size (dim 768, 12 layers, 12
# heads, ffn 2048, vocab 50257, untied), 4 sequences of 256 tokens per step. Prints tokens/s
# (median after 2 warm-up steps), the ratio to tp = 1, and the share of the step spent in tensor-
# parallel communication (every tp collective is blocking: the time in pt_comm_wait is all of it).
set -euo pipefail
steps="${1:-8}"
source "$(dirname "${BASH_SOURCE[0]}")/parallel_common.sh" tp
shard="$(synthetic_shard 50257 $((steps * 4 * 256 + 1)))"
cfg=(--model.vocab_size=50257 --model.dim=768 --model.n_layers=12 --model.n_heads=12 --model.n_kv_heads=12
     --model.ffn_dim=2048 --model.max_seq_len=256 --training.seq_len=256 --training.global_batch=4
     --training.micro_batch=4 --data.train="$shard" --training.steps="$steps" --logging.every=1000
     --logging.progress=false)
rm -f "$out"/*.jsonl
"$bin" train "${cfg[@]}" --training.threads=2 --logging.metrics="$out/tp1.jsonl" >/dev/null
for sp in false true; do
  mpirun -np 2 --bind-to none "$bin" train "${cfg[@]}" --training.threads=1 --parallel.tp=2 \
    --parallel.sp=$sp --logging.metrics="$out/tp2_sp_$sp.jsonl" >/dev/null
done
"$PY" - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def load(n):
    m = [json.loads(l) for l in open("%s/%s.jsonl" % (out, n))][2:]
    tok = statistics.median(x["tokens_per_s"] for x in m)
    share = statistics.median(x.get("comm_wait_s", 0) / x["seconds"] for x in m)
    tp = statistics.median(x.get("comm_groups", {}).get("tp", 0) for x in m)
    act = m[0].get("mem", {}).get("activations", 0)
    return tok, share, tp, act
base, _, _, act1 = load("tp1")
print("tp1 x 2 threads: %.0f tok/s, activations %.1f MiB per rank" % (base, act1 / 2**20))
for sp in ("false", "true"):
    t, share, b, act = load("tp2_sp_" + sp)
    print("tp2 x 1 thread, sp %s: %.0f tok/s (%.2fx tp1), %.0f%% of the step in tp communication, "
          "%.1f MB per step per rank, activations %.1f MiB per rank" % (sp, t, t / base, 100 * share, b / 1e6, act / 2**20))
PY
