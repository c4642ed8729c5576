#!/usr/bin/env bash
# test_startup.sh PENTATRON: a rank that never arrives during start-up ends the job with a message,
# never a hang (tests-only hooks: PT_INJECT_STARTUP_HANG=init:R or mesh:R makes world rank R sleep
# before MPI_Init or before the world's first exchange):
#   - before the mesh (4 ranks, rank 2 missing, parallel.timeout_s = 3): rank 0 names rank 2, once,
#     and the job exits non-zero within 30 s;
#   - in MPI_Init (2 ranks, rank 1 missing, PT_STARTUP_TIMEOUT = 3): the waiting rank's watchdog
#     says the runtime did not start, and the job exits non-zero within 30 s;
#   - both exit 1, a failure of the runtime, which `pentatron launch` restarts (not 2: refused);
#   - without a missing rank the same job trains (the handshake costs nothing visible).
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
P=--parallel
hang() { # NAME NP INJECT ENV... -- ARGS...: runs the job, prints its exit code and seconds
  local name="$1" np="$2" inject="$3"; shift 3
  local t0=$SECONDS
  PT_INJECT_STARTUP_HANG="$inject" PT_STARTUP_TIMEOUT="${STARTUP_TIMEOUT:-300}" timeout 60 \
    mpiexec -np "$np" -x PT_INJECT_STARTUP_HANG -x PT_STARTUP_TIMEOUT "$bin" train "${tiny[@]}" "$@" \
    > "$tmp/$name.log" 2>&1
  echo "$? $((SECONDS - t0))"
}
read -r rc secs <<<"$(hang mesh 4 mesh:2 $P.dp=4 --training.micro_batch=2 $P.timeout_s=3)"
n=$(grep -c "error: group world, start-up: waited 3 s for rank 2 (1 of 4 ranks never arrived" "$tmp/mesh.log")
others=$(grep -c "no answer from rank 0" "$tmp/mesh.log")
if [ "$rc" -eq 1 ] && [ "$secs" -lt 30 ] && [ "$n" -eq 1 ] && [ "$others" -eq 0 ]; then
  ok; echo "mesh: rank 2 missing: exit $rc after $secs s, named once"
else bad "mesh: exit $rc after $secs s, named $n times, $others other messages: $(grep error "$tmp/mesh.log" | head -3)"; fi
read -r rc secs <<<"$(STARTUP_TIMEOUT=3 hang init 2 init:1 $P.dp=2 --training.micro_batch=4)"
n=$(grep -c "error: the distributed runtime did not start within 3 s" "$tmp/init.log")
if [ "$rc" -eq 1 ] && [ "$secs" -lt 30 ] && [ "$n" -ge 1 ]; then
  ok; echo "init: rank 1 missing: exit $rc after $secs s"
else bad "init: exit $rc after $secs s: $(head -3 "$tmp/init.log")"; fi
read -r rc secs <<<"$(hang none 4 none:0 $P.dp=4 --training.micro_batch=2 $P.timeout_s=3)"
[ "$rc" -eq 0 ] && ok || bad "no missing rank: exit $rc: $(grep error "$tmp/none.log" | head -2)"
echo "test_startup: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
