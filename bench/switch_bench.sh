#!/usr/bin/env bash
# switch_bench.sh [STEPS]: what each of the switches behind the hidden communication is worth, on
# layout_bench.sh's model (its cfg, read from that script), 2 ranks × 1 thread, STEPS steps per
# run (default 10; the first 2 are not counted). Each switch is an environment variable, so one
# build runs both sides, in pairs (off then on, the order swapped every other round) over
# BENCH_ROUNDS rounds (default 2), so that other load spoils a part of each side:
#   heap  the MPI runtime's heap policy (src/comm/comm_mpi.c) against glibc's defaults restored
#         (MALLOC_MMAP_MAX_=65536 MALLOC_TRIM_THRESHOLD_=131072): dp, cp, ep;
#   wait  a wait that polls without napping (PT_COMM_WAIT=spin, the default when the ranks fit
#         the cores) against napping 20 µs between polls (nap): tp, pp, cp, dp, ep;
#   ep    expert parallelism's exchange overlapped with the experts' GEMMs against one
#         all-to-all each way (PT_EP_OVERLAP=0): ep.
# Prints a markdown table of rank 0's medians: step time and time blocked on communication, off
# and on, and on/off. About 4 min on 2 idle cores.
set -euo pipefail
steps="${1:-10}"
source "$(dirname "${BASH_SOURCE[0]}")/parallel_common.sh" switch
shard="$(synthetic_shard 8192 $((steps * 8 * 256 + 1)))"
eval "$(sed -n '/^cfg=(/,/comm_every=1)$/p' "$root/bench/layout_bench.sh")" # its model, $shard, $steps
declare -A lay=([tp]="--parallel.tp=2 --parallel.sp=true" [pp]="--parallel.pp=2 --parallel.pp_schedule=zb"
                [cp]="--parallel.cp=2" [dp]="--parallel.dp=2 --parallel.zero=1"
                [ep]="--parallel.dp=2 --parallel.ep=2 --parallel.zero=1")
# switch | layouts | environment off | environment on
switches=("heap|dp cp ep|MALLOC_MMAP_MAX_=65536 MALLOC_TRIM_THRESHOLD_=131072|"
          "wait|tp pp cp dp ep|PT_COMM_WAIT=nap|PT_COMM_WAIT=spin"
          "ep|ep|PT_EP_OVERLAP=0|PT_EP_OVERLAP=1")
run() {  # NAME LAYOUT ENV...: one run, rank 0's metrics in $out/NAME.jsonl
  local name=$1 l=$2 xs=() e; shift 2
  for e in "$@"; do xs+=(-x "$e"); done
  echo "== $name $*" >&2
  mpirun "${xs[@]}" -np 2 --bind-to none "$bin" train "${cfg[@]}" --training.threads=1 ${lay[$l]} \
    --logging.metrics="$out/$name.jsonl" >/dev/null
}
rm -f "$out"/*.jsonl
for ((r = 1; r <= ${BENCH_ROUNDS:-2}; r++)); do
  for s in "${switches[@]}"; do
    IFS='|' read -r name layouts off on <<< "$s"
    for l in $layouts; do
      sides=(off on); (( r % 2 == 0 )) && sides=(on off)
      for side in "${sides[@]}"; do
        [[ $side == off ]] && env=($off) || env=($on)
        run "$name.$l.$side.r$r" "$l" "${env[@]}"
      done
    done
  done
done
"$PY" - "$out" "$root/bench" "${switches[@]}" <<'PY'
import statistics, sys
out, switches = sys.argv[1], sys.argv[3:]
sys.path.insert(0, sys.argv[2])
from bench_metrics import steps  # rank 0's steps after the 2 warm-up steps, over every round
med = statistics.median
print("| switch | layout | step off (s) | step on (s) | on / off | blocked off (s) | blocked on (s) |")
print("|---|---|---|---|---|---|---|")
for s in switches:
    name, layouts, off, on = s.split("|")
    for l in layouts.split():
        a, b = steps(out, "%s.%s.off" % (name, l)), steps(out, "%s.%s.on" % (name, l))
        sa, sb = med(x["seconds"] for x in a), med(x["seconds"] for x in b)
        wa, wb = (med(x.get("comm_wait_s", 0) for x in m) for m in (a, b))
        print("| %s (off: %s) | %s 2 | %.3f | %.3f | %.2f× | %.3f | %.3f |" % (
            name, off, l, sa, sb, sb / sa, wa, wb))
PY
