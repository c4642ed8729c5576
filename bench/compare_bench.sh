#!/usr/bin/env bash
# compare_bench.sh [REF]: is the working tree as fast as REF? (REF: default the tag pre-redesign,
# or commit baa7fd8 where tags did not travel with the clone.)
#
# Builds REF in its worktree under $BITCHECK_DIR and the working tree into build/, as
# scripts/bitcheck.sh does (scripts/ref_build.sh, shared with it), then times both binaries on the
# configurations of the speed benches, interleaved: in each of COMPARE_ROUNDS rounds every
# configuration runs with the old and the new binary back to back (old first in odd rounds, new
# first in even ones, so that a drift of the machine's speed does not favour either), so that a
# burst of other work spoils both sides of a few pairs rather than one side. Configurations
# (never more than ranks × threads = 2, the machine's cores):
#   - bench/run_bench.sh's "small" model (dim 256, 4 layers, vocab 50257, 4 × 256 tokens per
#     step, oneDNN GEMM) on 1 rank × 1 thread and 1 rank × 2 threads (COMPARE_GPT2=1 adds its
#     GPT-2-small model at 2 threads: ~8 s a step, so raise nothing else with it);
#   - bench/layout_bench.sh's MoE model (dim 256, 4 layers, 4 experts top-2, vocab 8192, 8 × 256
#     tokens per step in micro-batches of 2): 1 rank × 2 threads, and 2 ranks × 1 thread with
#     each of dp 2 (ZeRO-1), tp 2 (sp), pp 2 (zb), cp 2 (zigzag), ep 2 over dp 2 (ZeRO-1).
# Each run's figure is the median tokens/s of its steps after COMPARE_WARMUP (2) warm-up steps
# (rank 0's metrics); each side's, the median over the rounds. Prints a markdown table to paste
# into docs/benchmarks.md: per configuration old and new tokens/s, new/old, the range of the
# per-round ratios, and the other load on the machine during the runs (CPU time not spent by
# the bench, in cores, worst run: a row above ~0.1 is noisy).
#
#   COMPARE_ROUNDS=5     rounds            COMPARE_STEPS=8   steps per run (warm-up included)
#   COMPARE_ONLY=REGEX   only the configurations whose name matches (bash =~), e.g. 'moe'
#   COMPARE_WAIT=0       before each pair, wait up to this many s for the other load to drop
#                        under 0.15 cores (layout_bench.sh's BENCH_WAIT; 0: never wait)
#   BENCH_OUT=DIR        metrics and logs (default /tmp/pentatron_compare_bench)
#
# About 1 min per round on a quiet 2-core machine at the defaults (8 configurations × 2 binaries).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/ref_build.sh"
PY=/usr/bin/python3
rounds="${COMPARE_ROUNDS:-5}" steps="${COMPARE_STEPS:-8}" warmup="${COMPARE_WARMUP:-2}"
only="${COMPARE_ONLY:-}"
out="${BENCH_OUT:-/tmp/pentatron_compare_bench}"
(( steps > warmup )) || { echo "compare_bench: COMPARE_STEPS must exceed COMPARE_WARMUP ($warmup)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

ref_build "${1:-}"
new_build
mkdir -p "$out"
rm -f "$out"/*.jsonl "$out"/*.log "$out"/*.load

# ---- data and configurations --------------------------------------------------------------------
shard() { # VOCAB TOKENS: a uniform-random shard (bench/make_data.py, seed 0), made once
  local f="$out/synthetic_${1}_${2}.bin"
  [[ -f $f ]] || "$PY" "$root/bench/make_data.py" --out "$f" --tokens "$2" --vocab "$1" --seed 0 >&2
  echo "$f"
}
# run_bench.sh's models: 4 sequences × 256 tokens per step, untied head, rows in order
rb() { # NAME dim layers heads kv_heads ffn: its arguments into the array named NAME
  local -n a="$1"
  a=(--model.vocab_size=50257 --model.dim=$2 --model.n_layers=$3 --model.n_heads=$4 --model.n_kv_heads=$5
     --model.ffn_dim=$6 --model.max_seq_len=256 --model.tied_embeddings=false
     --data.train="$(shard 50257 $((steps * 4 * 256 + 1)))" --training.steps=$steps
     --training.global_batch=4 --training.micro_batch=4 --training.seq_len=256 --training.gemm=onednn
     --logging.every=1 --logging.progress=false)
}
rb small 256 4 4 4 688
rb gpt2 768 12 12 12 2048
# layout_bench.sh's MoE model
moe=(--model.vocab_size=8192 --model.dim=256 --model.n_layers=4 --model.n_heads=8 --model.n_kv_heads=2
     --model.ffn_dim=688 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=344
     --model.moe_first_dense=1 --model.tied_embeddings=false --model.max_seq_len=256
     --training.seq_len=256 --training.global_batch=8 --training.micro_batch=2
     --data.train="$(shard 8192 $((steps * 8 * 256 + 1)))" --training.steps=$steps
     --logging.every=1000 --logging.progress=false)

names=(); descs=(); nps=(); argv=()
C() { # NAME "DESCRIPTION" RANKS ARGS...: one configuration (threads among ARGS)
  local name="$1" desc="$2" np="$3"; shift 3
  [[ -z $only || $name =~ $only ]] || return 0
  names+=("$name"); descs+=("$desc"); nps+=("$np"); argv+=("$(printf '%q ' "$@")")
}
C small_t1 "small (run_bench), 1 rank × 1 thread" 1 "${small[@]}" --training.threads=1
C small_t2 "small (run_bench), 1 rank × 2 threads" 1 "${small[@]}" --training.threads=2
[[ ${COMPARE_GPT2:-0} == 1 ]] && C gpt2_t2 "GPT-2-small (run_bench), 1 rank × 2 threads" 1 "${gpt2[@]}" --training.threads=2
C moe_base "MoE (layout_bench), 1 rank × 2 threads" 1 "${moe[@]}" --training.threads=2
C moe_dp2 "MoE, dp 2 ZeRO-1, 2 ranks × 1 thread" 2 "${moe[@]}" --training.threads=1 --parallel.dp=2 --parallel.zero=1
C moe_tp2 "MoE, tp 2 sp, 2 ranks × 1 thread" 2 "${moe[@]}" --training.threads=1 --parallel.tp=2 --parallel.sp=true
C moe_pp2 "MoE, pp 2 zb (m = 4), 2 ranks × 1 thread" 2 "${moe[@]}" --training.threads=1 --parallel.pp=2 --parallel.pp_schedule=zb
C moe_cp2 "MoE, cp 2 zigzag, 2 ranks × 1 thread" 2 "${moe[@]}" --training.threads=1 --parallel.cp=2 --parallel.cp_layout=zigzag
C moe_ep2 "MoE, ep 2 over dp 2 ZeRO-1, 2 ranks × 1 thread" 2 "${moe[@]}" --training.threads=1 --parallel.dp=2 --parallel.ep=2 --parallel.zero=1
(( ${#names[@]} )) || { echo "compare_bench: no configuration matches COMPARE_ONLY='$only'" >&2; exit 2; }

# ---- timing --------------------------------------------------------------------------------------
# cores busy outside this bench over 1 s (/proc/stat), and a wait for them to drop (layout_bench's)
busy_cores() {
  local a b
  a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
  "$PY" -c "import sys
a, b = [list(map(int, s.split())) for s in sys.argv[1:3]]
d = [y - x for x, y in zip(a, b)]
print('%.2f' % ((sum(d) - d[3] - d[4]) / max(sum(d), 1) * $(nproc)))" "${a[*]:1}" "${b[*]:1}"
}
wait_quiet() {
  local waited=0 b
  (( ${COMPARE_WAIT:-0} > 0 )) || return 0
  while b=$(busy_cores); do
    "$PY" -c "import sys; sys.exit(0 if $b < 0.15 else 1)" && break
    (( waited >= COMPARE_WAIT )) && break
    waited=$(( waited + 1 ))
  done
}
ticks() {  # CPU ticks: all busy on the machine, then this shell's reaped children (the runs)
  local a c
  a=($(head -1 /proc/stat)); c=($(sed 's/.*) //' /proc/$$/stat))
  echo $(( a[1] + a[2] + a[3] + a[6] + a[7] + a[8] )) $(( c[13] + c[14] ))
}
# timed BIN NAME NP ARGS...: rank 0's metrics in $out/NAME.jsonl, the other load in $out/NAME.load
timed() {
  local bin="$1" name="$2" np="$3" t0 t1 c0 c1 w0 w1; shift 3
  read -r t0 c0 < <(ticks); w0=$(date +%s.%N)
  if (( np == 1 )); then
    "$bin" train "$@" --logging.metrics="$out/$name.jsonl" > "$out/$name.log" 2>&1
  else
    timeout 300 mpirun -np "$np" --bind-to none "$bin" train "$@" --logging.metrics="$out/$name.jsonl" \
      > "$out/$name.log" 2>&1
  fi || { echo "compare_bench: $name failed: $(tail -2 "$out/$name.log")" >&2; return 1; }
  read -r t1 c1 < <(ticks); w1=$(date +%s.%N)
  "$PY" -c "import os, sys
t0, t1, c0, c1 = map(int, sys.argv[1:5]); w0, w1 = map(float, sys.argv[5:7])
print('%.2f' % max(0, (t1 - t0 - (c1 - c0)) / os.sysconf('SC_CLK_TCK') / (w1 - w0)))" \
    "$t0" "$t1" "$c0" "$c1" "$w0" "$w1" > "$out/$name.load"
}

t0=$SECONDS
echo "compare_bench: ${#names[@]} configurations × $rounds rounds × 2 binaries, $steps steps each;" \
     "old = ${REF_SHA:0:10}, new = the working tree" >&2
for ((r = 1; r <= rounds; r++)); do
  for i in "${!names[@]}"; do
    eval "args=(${argv[$i]})"
    wait_quiet
    if (( r % 2 )); then order=(old new); else order=(new old); fi
    for side in "${order[@]}"; do
      if [[ $side == old ]]; then bin="$REF_BIN"; else bin="$NEW_BIN"; fi
      timed "$bin" "${names[$i]}.$side.r$r" "${nps[$i]}" "${args[@]}"
    done
  done
  echo "compare_bench: round $r of $rounds done ($((SECONDS - t0)) s)" >&2
done

# ---- report --------------------------------------------------------------------------------------
"$PY" - "$out" "$warmup" "$rounds" "$REF_SHA" "$(git -C "$root" rev-parse --short HEAD)$(
  [[ -n "$(git -C "$root" status --porcelain -- src include CMakeLists.txt)" ]] && echo '+modified')" \
  "$steps" "$((SECONDS - t0))" "${names[@]}" "${descs[@]}" <<'PY'
import json, os, statistics, sys, time
out, warmup, rounds, ref, new, steps, took = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
rest = sys.argv[8:]
names = rest[:len(rest) // 2]
descs = rest[len(rest) // 2:]
med = statistics.median
def tps(name, side, r):
    rows = [json.loads(l) for l in open("%s/%s.%s.r%d.jsonl" % (out, name, side, r)) if '"step"' in l]
    return med(x["tokens_per_s"] for x in rows[warmup:])
def load(name, side, r):
    return float(open("%s/%s.%s.r%d.load" % (out, name, side, r)).read())
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print("compare_bench %s: old = %s, new = %s; %s rounds × %s steps (median tokens/s of the steps after %d, "
      "then of the rounds); %d cores (%s); %s s" % (time.strftime("%Y-%m-%d"), ref[:10], new, rounds, steps,
      warmup, os.cpu_count(), cpu, took))
print()
print("| configuration | old tokens/s | new tokens/s | new / old | per-round new / old | other load (cores, worst run) |")
print("|---|---|---|---|---|---|")
for n, d in zip(names, descs):
    o = [tps(n, "old", r) for r in range(1, rounds + 1)]
    w = [tps(n, "new", r) for r in range(1, rounds + 1)]
    per = [b / a for a, b in zip(o, w)]
    other = max(load(n, s, r) for s in ("old", "new") for r in range(1, rounds + 1))
    print("| %s | %.0f | %.0f | %.3f | %.2f–%.2f | %.2f |" % (d, med(o), med(w), med(w) / med(o), min(per), max(per), other))
PY
