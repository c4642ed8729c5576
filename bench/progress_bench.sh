#!/usr/bin/env bash
# progress_bench.sh [STEPS]: who moves MPI's nonblocking collectives while the ranks compute, our
# polls (PT_MPI_PROGRESS=poll, the default: pt_comm_wait and the model's polls between its big
# operations) or a progress thread per rank (PT_MPI_PROGRESS=thread, MPI_THREAD_MULTIPLE, an
# MPI_Iprobe every PT_MPI_PROGRESS_US µs while a request is pending; src/comm/comm_mpi.c). On
# layout_bench.sh's model (its cfg, read from that script), 2 ranks × 1 thread: dp 2 (ZeRO-1),
# cp 2 (zigzag; its data group dpcp reduces the gradients) and ep 2 over dp 2 (ZeRO-1), STEPS
# steps each (default 8; the first 2 are not counted). Short runs, interleaved: BENCH_ROUNDS
# rounds (default 3), each running every layout with both modes, the order of the modes swapped
# from one round to the next, so that other load on a shared machine spoils a part of each
# mode's steps rather than one mode. BENCH_US (default "100") lists the thread's intervals to
# try (one row each). Prints a markdown table of rank 0's medians over all rounds' counted
# steps: the step time, the time blocked on communication (comm_wait_s), and the data group's
# share of it; the thread's rows also relative to the polls'. About 1.5 min per round on 2 idle
# cores.
set -euo pipefail
steps="${1:-8}"
source "$(dirname "${BASH_SOURCE[0]}")/parallel_common.sh" progress
shard="$(synthetic_shard 8192 $((steps * 8 * 256 + 1)))"
eval "$(sed -n '/^cfg=(/,/comm_every=1)$/p' "$root/bench/layout_bench.sh")" # its model, $shard, $steps
layouts=("dp:--parallel.dp=2 --parallel.zero=1" "cp:--parallel.cp=2"
         "ep:--parallel.dp=2 --parallel.ep=2 --parallel.zero=1")
modes=(poll); for us in ${BENCH_US:-100}; do modes+=("thread:$us"); done
rm -f "$out"/*.jsonl
for ((r = 1; r <= ${BENCH_ROUNDS:-3}; r++)); do
  order=("${modes[@]}"); (( r % 2 == 0 )) && order=($(printf '%s\n' "${modes[@]}" | tac))
  for lay in "${layouts[@]}"; do
    for mode in "${order[@]}"; do
      name="${lay%%:*}.${mode/:/_}.r$r"
      echo "== $name" >&2
      us=100; [[ $mode == *:* ]] && us="${mode#*:}"
      PT_MPI_PROGRESS="${mode%%:*}" PT_MPI_PROGRESS_US="$us" \
        mpirun -x PT_MPI_PROGRESS -x PT_MPI_PROGRESS_US -np 2 --bind-to none "$bin" train "${cfg[@]}" \
        --training.threads=1 ${lay#*:} --logging.metrics="$out/$name.jsonl" >/dev/null
    done
  done
done
"$PY" - "$out" "$root/bench" "${modes[@]}" <<'PY'
import glob, statistics, sys
out, modes = sys.argv[1], sys.argv[3:]
sys.path.insert(0, sys.argv[2])
import bench_metrics
med = statistics.median
def steps(lay, mode):  # rank 0's steps after the 2 warm-up steps, over every round
    return bench_metrics.steps(out, "%s.%s" % (lay, mode.replace(":", "_")))
print("| layout | progress | step (s) | blocked on comm (s) | of it, the data group (s) | vs polls: step / blocked |")
print("|---|---|---|---|---|---|")
for lay, group in (("dp", "dp"), ("cp", "dpcp"), ("ep", "dp")):
    base = None
    for mode in modes:
        m = steps(lay, mode)
        if not m:
            continue
        sec = med(x["seconds"] for x in m)
        wait = med(x.get("comm_wait_s", 0) for x in m)
        data = med(x.get("comm_wait_groups", {}).get(group, 0) for x in m)
        label = "polls" if mode == "poll" else "thread, %s µs" % mode.split(":")[1]
        rel = "–" if base is None else "%.2f× / %.2f×" % (sec / base[0], wait / max(base[1], 1e-9))
        base = base or (sec, wait)
        print("| %s 2 | %s | %.3f | %.3f | %.3f | %s |" % (lay, label, sec, wait, data, rel))
print("\n%d counted steps per row (%s rounds)" % (len(steps("dp", "poll")),
      len(glob.glob("%s/dp.poll.r*.jsonl" % out))))
PY
