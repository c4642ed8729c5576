#!/usr/bin/env bash
# dp_bench.sh [STEPS]: data parallelism on one machine: dp = 2 ranks × 1 thread against dp = 1 ×
# 2 threads, same global batch (8 × 256 tokens), for every ZeRO stage, on two models:
#   wide  dim 256, 4 layers, vocab 50257 untied: 86% of the parameters are embedding and head
#   deep  dim 512, 8 layers, vocab 8192 untied: the embedding is 12% (like a 1–7B Llama's 2–20%)
# Prints tokens/s (median after 2 warm-up steps), the ratio to dp = 1, and the time the ranks
# wait on communication in a step with the reduction overlapped (parallel.overlap = true) and not;
# hidden = 1 − wait(overlap) / wait(no overlap). The embedding's gradient is final only when
# backward ends, so its share of the bytes can never hide behind backward.
# DP_BENCH_MODELS ("wide deep") and DP_BENCH_ZERO ("0 1 2 3") narrow the runs.
set -euo pipefail
steps="${1:-10}"
models="${DP_BENCH_MODELS:-wide deep}" stages="${DP_BENCH_ZERO:-0 1 2 3}"
source "$(dirname "${BASH_SOURCE[0]}")/parallel_common.sh" dp
common=(--model.n_kv_heads=4 --model.max_seq_len=256 --training.seq_len=256 --training.global_batch=8
        --training.steps="$steps" --logging.every=1000 --logging.progress=false)
for model in $models; do
  case $model in
    wide) vocab=50257; arch=(--model.dim=256 --model.n_layers=4 --model.n_heads=4 --model.ffn_dim=688);;
    deep) vocab=8192; arch=(--model.dim=512 --model.n_layers=8 --model.n_heads=8 --model.n_kv_heads=8 --model.ffn_dim=1376);;
  esac
  shard="$(synthetic_shard $vocab $((steps * 8 * 256 + 1)))"
  cfg=("${common[@]}" --model.vocab_size=$vocab "${arch[@]}" --data.train="$shard")
  "$bin" train "${cfg[@]}" --training.threads=2 --training.micro_batch=8 --logging.metrics="$out/${model}_dp1.jsonl" >/dev/null
  for z in $stages; do
    for ov in true false; do
      rm -f "$out/${model}_dp2_z${z}_$ov.jsonl"
      mpirun -np 2 --bind-to none "$bin" train "${cfg[@]}" --training.threads=1 --training.micro_batch=4 \
        --parallel.dp=2 --parallel.zero=$z --parallel.overlap=$ov --logging.metrics="$out/${model}_dp2_z${z}_$ov.jsonl" >/dev/null
    done
  done
done
"$PY" - "$out" "$models" "$stages" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def load(n):
    m = [json.loads(l) for l in open("%s/%s.jsonl" % (out, n))][2:]
    return statistics.median(x["tokens_per_s"] for x in m), statistics.median(x.get("comm_wait_s", 0) for x in m)
for model in sys.argv[2].split():
    base, _ = load(model + "_dp1")
    print("%s: dp1 x 2 threads: %.0f tok/s" % (model, base))
    for z in map(int, sys.argv[3].split()):
        a, wa = load("%s_dp2_z%d_true" % (model, z))
        b, wb = load("%s_dp2_z%d_false" % (model, z))
        print("  dp2 x 1 thread, ZeRO-%d: overlap %.0f tok/s (%.2fx dp1, wait %.3f s) | no overlap %.0f tok/s "
              "(%.2fx, wait %.3f s) | hidden %.0f%%" % (z, a, a / base, wa, b, b / base, wb, 100 * (1 - wa / wb)))
PY
