#!/usr/bin/env bash
# hier_bench.sh: one all-reduce (fp32 sum, in place) over 2 hosts × 2 ranks (scripts/cluster.sh:
# network namespaces, shared memory within a host, TCP between, links shaped with tc tbf) at two
# link speeds, four ways:
#   pt flat   pentatron's all-reduce, PT_COMM_HIER = off: MPI's nonblocking all-reduce (libnbc)
#   pt hier   pentatron's hierarchical all-reduce (include/pt/comm.h, src/comm/comm_hier.c)
#   mpi tuned MPI's blocking MPI_Allreduce, Open MPI's default component (tuned)
#   mpi han   the same with Open MPI's hierarchical component forced (coll_han_priority 100)
# Per rate and size: the median (and least) over REPS calls of the slowest rank's time, and the
# bytes a call put on the links (less 66 bytes of headers a packet). 4 ranks on a 2-core machine
# are more ranks than cores: tolerated here because the shaped links dominate the time (at
# 100 Mbit/s a 16 MiB all-reduce spends > 1 s on the wire against ~10 ms of summing); at 1 Gbit/s
# the cores' share grows, which the 1 MiB rows show.
#
#   bench/hier_bench.sh [--reps N] [--plan "RATE:SIZES RATE:SIZES"] [--out FILE]
#   default plan: "100mbit:64k,1m,16m 1gbit:64k,1m,16m,64m", 5 reps (about 2-3 minutes)
#   env: PT_BENCH_HIER (the bench_hier binary; default build/bench_hier)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
C="$here/../scripts/cluster.sh"
bin="${PT_BENCH_HIER:-$here/../build/bench_hier}"
reps=5 plan="100mbit:64k,1m,16m 1gbit:64k,1m,16m,64m" out=/tmp/hier_bench.txt
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps="$2"; shift 2;;
    --plan) plan="$2"; shift 2;;
    --out) out="$2"; shift 2;;
    *) echo "hier_bench.sh: unknown option '$1' (--reps N, --plan \"RATE:SIZES ...\", --out FILE)" >&2; exit 2;;
  esac
done
[ -x "$bin" ] || { echo "hier_bench.sh: no $bin (build the target bench_hier; PT_BENCH_HIER)" >&2; exit 2; }
"$C" check > /dev/null || { echo "hier_bench.sh: this machine cannot make a cluster" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
export PT_CLUSTER=hierb PT_CLUSTER_SLOTS=2
trap '"$C" down' EXIT
echo "# $(date -u '+%F %T') UTC, $(nproc --all) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$out" >&2
for step in $plan; do
  rate="${step%%:*}" sizes="${step#*:}"
  "$C" up 2 --rate "$rate" > /dev/null || { echo "hier_bench.sh: cluster.sh up 2 --rate $rate" >&2; exit 1; }
  for way in "pt flat" "pt hier" "mpi tuned" "mpi han"; do
    set -- $way
    env=(PT_COMM_HIER=auto OMPI_MCA_coll_han_priority=0)
    [ "$way" = "pt flat" ] && env[0]=PT_COMM_HIER=off
    [ "$way" = "mpi han" ] && env[1]=OMPI_MCA_coll_han_priority=100
    env "${env[@]}" timeout 600 "$C" run -np 4 -x PT_COMM_HIER -x OMPI_MCA_coll_han_priority \
      "$bin" "$1" "$reps" ${sizes//,/ } 2>&1 | sed "s/^size/rate $rate way $1-$2 size/" |
      tee -a "$out" | grep -v "^rate" >&2
  done
done
echo "# done $(date -u '+%T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out" >&2
"$C" down > /dev/null
# the table: per rate and size, each way's median ms (least) and MB crossing per call
/usr/bin/python3 - "$out" <<'PY'
import sys
rows = [dict(zip(*[iter(l.split())] * 2)) for l in open(sys.argv[1]) if l.startswith("rate")]
ways = ["pt-flat", "pt-hier", "mpi-tuned", "mpi-han"]
print("| link | size | " + " | ".join(f"{w} ms (min) / MB crossed" for w in ways) + " | hier/flat |")
print("|---|---|" + "---|" * (len(ways) + 1))
keys = []
for r in rows:
    k = (r["rate"], int(r["size"]))
    if k not in keys: keys.append(k)
for rate, size in keys:
    got = {r["way"]: r for r in rows if (r["rate"], int(r["size"])) == (rate, size)}
    cell = lambda w: (f"{float(got[w]['median_s']) * 1e3:.1f} ({float(got[w]['min_s']) * 1e3:.1f}) / "
                      f"{float(got[w]['link_payload']) / 1e6:.2f}"
                      + ("" if got[w]["ok"] == "1" else " WRONG")) if w in got else "-"
    ratio = (float(got["pt-hier"]["median_s"]) / float(got["pt-flat"]["median_s"])
             if "pt-hier" in got and "pt-flat" in got else float("nan"))
    print(f"| {rate} | {size / 1048576:g} MiB | " + " | ".join(cell(w) for w in ways) + f" | {ratio:.2f} |")
PY
