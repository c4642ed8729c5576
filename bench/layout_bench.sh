#!/usr/bin/env bash
# layout_bench.sh [STEPS]: what each parallel dimension costs at degree 2 on one machine, all on
# the same mixture-of-experts model in one run so that the ratios compare: dim 256, 4 layers (the
# first dense, ffn 688; then 4 experts top-2, expert ffn 344), 8 heads / 2 kv heads, vocab 8192
# untied, 8 × 256 tokens per step in micro-batches of 2 (pp gets m = 4). The baseline is 1 rank ×
# 2 threads; against it, 2 ranks × 1 thread for dp 2 (ZeRO-1), tp 2 (sp), pp 2 (zb), cp 2
# (zigzag), pp 2 (zb) with the head split over the stages (parallel.pp_head = split) and ep 2
# (over dp 2, ZeRO-1: it differs from the dp row by ep alone). The layouts run
# in BENCH_ROUNDS rounds (default 2), each round all of them in turn, then the baseline once more,
# so that a burst of other work spoils a part of each layout's steps, not one layout. Prints a
# markdown table: tokens/s (median of all rounds' steps after 2 warm-up steps per run), the ratio
# to the baseline, rank 0's share of the step blocked on communication, in all and per group
# (median over the same steps of comm_wait_groups / seconds, logging.comm_every = 1), rank 0's
# model state and activations (MiB), and the other load on the machine: before each run it waits
# up to BENCH_WAIT s (default 15) for the cores busy outside the bench to drop under BENCH_BUSY
# (default 0.15); during each run it counts the CPU time not spent by the bench (from /proc/stat
# and the bench's children), and runs it again (up to BENCH_RETRY times, default 1) when that was
# over BENCH_BUSY. The column shows the worst kept run's: a row above ~0.1 core is noisy. About 1.5
# min on a quiet 2-core machine (15 runs); on a busy one the waits and retries can stretch it to
# ~10 min (BENCH_WAIT=0 BENCH_RETRY=0: none).
# BENCH_PAIR="ARGS": only the baseline and the layout of these options (2 ranks), alternating,
# BENCH_ROUNDS rounds; prints the ratio of each round's medians and of all rounds' (the repeat of
# one row's ratio, which moves between runs of the whole table by a few hundredths).
# BENCH_OLD_BIN=PATH: another build (the "before" of a change) measured in the same run, each
# layout (the baseline included) run with it right before the same layout with $bin; the table
# then has both, each layout's ratio against its own build's baseline, and the blocked shares
# before -> after (the head split's row: the old build's pp row before, which an old build without
# parallel.pp_head can run). Twice the time.
set -euo pipefail
steps="${1:-12}"
source "$(dirname "${BASH_SOURCE[0]}")/parallel_common.sh" layout
shard="$(synthetic_shard 8192 $((steps * 8 * 256 + 1)))"
source "$(dirname "${BASH_SOURCE[0]}")/layout_model.sh"
cfg=("${layout_model[@]}" --training.steps="$steps" --logging.every=1000 --logging.progress=false --logging.comm_every=1)
# cores busy outside this bench over 1 s, from /proc/stat (all processes; the bench runs none then)
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
  while b=$(busy_cores); do
    "$PY" -c "import sys; sys.exit(0 if $b < ${BENCH_BUSY:-0.15} else 1)" && break
    (( waited >= ${BENCH_WAIT:-15} )) && break
    waited=$(( waited + 1 ))
  done
  echo "$b"
}
ticks() {  # CPU ticks: all busy on the machine, then this shell's reaped children (the bench's runs)
  local a c
  a=($(head -1 /proc/stat)); c=($(sed 's/.*) //' /proc/$$/stat))
  echo $(( a[1] + a[2] + a[3] + a[6] + a[7] + a[8] )) $(( c[13] + c[14] ))
}
rm -f "$out"/*.jsonl "$out"/*.load
old="${BENCH_OLD_BIN:-}"
run() {  # NAME RANKS [options]: one layout, with the old build first when there is one
  [[ -n $old ]] && run_bin "$old" "old-$@"
  run_bin "$bin" "$@"
}
run_bin() {  # BIN NAME RANKS [options]: one layout; rank 0's metrics in $out/NAME.jsonl, the other
  local exe=$1 name=$2 np=$3 before t0 t1 s0 s1 try; shift 3  # load (before, during) in $out/NAME.load
  for ((try = 0; try <= ${BENCH_RETRY:-1}; try++)); do  # again when others ran during it
    rm -f "$out/$name.jsonl"
    before=$(wait_quiet)
    read -r t0 s0 < <(ticks); s0=$(date +%s.%N)" $s0"
    if (( np == 1 )); then
      "$exe" train "${cfg[@]}" --training.threads=2 "$@" --logging.metrics="$out/$name.jsonl" >/dev/null
    else
      mpirun -np "$np" --bind-to none "$exe" train "${cfg[@]}" --training.threads=1 "$@" \
        --logging.metrics="$out/$name.jsonl" >/dev/null
    fi
    read -r t1 s1 < <(ticks); s1=$(date +%s.%N)" $s1"
    "$PY" -c "import os, sys
w0, c0, w1, c1 = map(float, sys.argv[1:5]); t0, t1 = map(int, sys.argv[5:7])
print(sys.argv[7], '%.2f' % max(0, (t1 - t0 - (c1 - c0)) / os.sysconf('SC_CLK_TCK') / (w1 - w0)))" \
      $s0 $s1 "$t0" "$t1" "$before" > "$out/$name.load"
    echo "== $name: other load $(sed 's/ / before, /' "$out/$name.load") during (cores)" >&2
    "$PY" -c "import sys; sys.exit(0 if float(sys.argv[1]) < ${BENCH_BUSY:-0.15} else 1)" \
      "$(cut -d' ' -f2 "$out/$name.load")" && break
  done
  return 0  # (a run kept after its retries despite other load: the column says so)
}
if [[ -n ${BENCH_PAIR:-} ]]; then  # the baseline and one layout, alternating, a ratio per round
  read -r -a pair <<< "$BENCH_PAIR"
  for ((r = 1; r <= ${BENCH_ROUNDS:-2}; r++)); do
    run_bin "$bin" base.r$r 1
    run_bin "$bin" pair.r$r 2 "${pair[@]}"
  done
  "$PY" - "$out" "$BENCH_PAIR" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
def steps(f): return [json.loads(l)["tokens_per_s"] for l in open(f)][2:]
rounds = sorted(int(f.rsplit(".r", 1)[1].split(".")[0]) for f in glob.glob(out + "/pair.r*.jsonl"))
ratios = [statistics.median(steps("%s/pair.r%d.jsonl" % (out, r))) / statistics.median(steps("%s/base.r%d.jsonl" % (out, r))) for r in rounds]
base = statistics.median(x for r in rounds for x in steps("%s/base.r%d.jsonl" % (out, r)))
lay = statistics.median(x for r in rounds for x in steps("%s/pair.r%d.jsonl" % (out, r)))
print("%s against 1 rank x 2 threads: per round %s; all rounds %.0f against %.0f tok/s = %.3fx" % (
    sys.argv[2], ", ".join("%.3f" % x for x in ratios), lay, base, lay / base))
PY
  exit 0
fi
for ((r = 1; r <= ${BENCH_ROUNDS:-2}; r++)); do
  run base.r$r 1
  run dp.r$r 2 --parallel.dp=2 --parallel.zero=1
  run tp.r$r 2 --parallel.tp=2 --parallel.sp=true
  run pp.r$r 2 --parallel.pp=2 --parallel.pp_schedule=zb
  # the head split over the stages: the new build alone (its "before" is the old build's pp row)
  run_bin "$bin" pph.r$r 2 --parallel.pp=2 --parallel.pp_schedule=zb --parallel.pp_head=split
  run cp.r$r 2 --parallel.cp=2
  run ep.r$r 2 --parallel.dp=2 --parallel.ep=2 --parallel.zero=1
done
run base.r$r 1  # r = rounds + 1: the baseline once more, last
"$PY" - "$out" "$old" <<'PY'
import glob, json, statistics, sys
out, two = sys.argv[1], bool(sys.argv[2])
med = statistics.median
def runs(n):  # rank 0's steps after the 2 warm-up steps, per run of layout n (all rounds)
    return [[json.loads(l) for l in open(f)][2:] for f in sorted(glob.glob("%s/%s.r*.jsonl" % (out, n)))]
def load(n):
    m = [x for r in runs(n) for x in r]
    groups = sorted({g for x in m for g in x.get("comm_wait_groups", {})})
    share = {g: med(x.get("comm_wait_groups", {}).get(g, 0) / x["seconds"] for x in m) for g in groups}
    mem = m[-1].get("mem", {})
    other = [l.split() for f in glob.glob("%s/%s.r*.load" % (out, n)) for l in open(f)]
    return dict(tok=med(x["tokens_per_s"] for x in m), wait=med(x.get("comm_wait_s", 0) / x["seconds"] for x in m),
                share=share, mem=[mem.get(k, 0) / 2**20 for k in ("params", "grads", "optim", "activations")],
                idle=[med(x["pp_idle"][i] for x in m) for i in range(len(m[0].get("pp_idle", [])))],
                other="%s / %s" % tuple(max(o[i] for o in other) for i in (0, 1)))
names = [("base", "1 rank × 2 threads (baseline)"), ("dp", "dp 2, ZeRO-1"), ("tp", "tp 2, sp"),
         ("pp", "pp 2, zb (m = 4)"), ("pph", "pp 2, zb, head split over the stages"), ("cp", "cp 2, zigzag"),
         ("ep", "ep 2 over dp 2, ZeRO-1")]
def groups(r):
    return ", ".join("%s %.1f%%" % (g, 100 * s) for g, s in sorted(r["share"].items(), key=lambda kv: -kv[1])
                     if s >= 0.0005) or "–"
if two:  # before (old build) and after, each against its own baseline
    ob, nb = load("old-base"), load("base")
    print("| layout | tokens/s before | vs baseline before | tokens/s after | vs baseline after | step blocked "
          "on comm before -> after (rank 0) | by group before | by group after |")
    print("|---|---|---|---|---|---|---|---|")
    for n, title in names:
        o, r = load("old-" + n if glob.glob("%s/old-%s.r*.jsonl" % (out, n)) else "old-pp"), load(n)
        print("| %s | %.0f | %.2f× | %.0f | %.2f× | %.1f%% -> %.1f%% | %s | %s |" % (
            title, o["tok"], o["tok"] / ob["tok"], r["tok"], r["tok"] / nb["tok"], 100 * o["wait"],
            100 * r["wait"], groups(o), groups(r)))
    print("\nbaseline per run (drift): before %s, after %s tok/s" % tuple(", ".join(
        "%.0f" % med(x["tokens_per_s"] for x in r) for r in runs(n)) for n in ("old-base", "base")))
    sys.exit(0)
base = load("base")
rows = [(title, load(n)) for n, title in names]
print("| layout | tokens/s | vs baseline | step blocked on comm (rank 0) | by group | rank 0 params / grads / "
      "optim / activations (MiB) | other load, before / during (cores) |")
print("|---|---|---|---|---|---|---|")
for name, r in rows:
    by = groups(r)
    if r["idle"]:
        by += " (pp idle per stage %s)" % " / ".join("%.0f%%" % (100 * i) for i in r["idle"])
    print("| %s | %.0f | %.2f× | %s | %s | %s | %s |" % (
        name, r["tok"], r["tok"] / base["tok"], "%.1f%%" % (100 * r["wait"]) if by != "–" else "–", by,
        " / ".join("%.1f" % v for v in r["mem"]), r["other"]))
print("\nbaseline per run (drift): %s tok/s" % ", ".join(
    "%.0f" % med(x["tokens_per_s"] for x in r) for r in runs("base")))
PY
