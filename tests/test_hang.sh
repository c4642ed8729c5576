#!/usr/bin/env bash
# test_hang.sh PENTATRON: every hang explained (include/pt/flight.h). A rank stopped (SIGSTOP) or
# killed (SIGKILL, under `mpirun --enable-recovery`, so that the others are left waiting as on a
# cluster whose launcher does not notice) once training runs: the ranks still alive time out
# (parallel.timeout_s = 6) and one of them names the rank, its mesh coordinates and host, the
# collectives it holds up and its last one, within the timeout + 8 s, every time:
#   - stopped rank 3 of 4 (dp 2 x tp 2: dp1 pp0 cp0 tp1), stopped rank 5 of 8 (dp 2 x pp 2 x tp 2:
#     dp0 pp1 cp0 tp1), killed rank 2 of 4, killed rank 6 of 8;
#   - `pentatron trace why DIR` names the same rank from the flight records the run kept beside
#     its trace (logging.trace), also after mpirun ended the job itself (a plain kill: the rank
#     that stopped first);
#   - across two network-namespace hosts (scripts/cluster.sh; skipped where they cannot be made):
#     stopped rank 3 and killed rank 2 of 2 hosts x 2 ranks, named on their host pth*-h1.
# (tests/test_flight.c checks the verdict itself on states made by hand.)
set -u
source "$(dirname "$0")/parallel_common.sh"
T=6       # parallel.timeout_s
SLACK=8   # seconds past the timeout within which the cause must be named
host="$(hostname)"

# hang NAME NP VICTIM SIGNAL NEEDLE LAUNCHER... -- ARGS...: the job in the background; after step
# 2 the victim (its world rank) gets SIGNAL; the log must print NEEDLE within T + SLACK seconds
# of the signal. The victim, if stopped, is killed afterwards.
hang() {
  local name="$1" np="$2" victim="$3" sig="$4" needle="$5"; shift 5
  local launcher=() log="$tmp/$name.log" pid="" job t0 took=""
  while [ "$1" != "--" ]; do launcher+=("$1"); shift; done; shift
  rm -rf "$tmp/$name.tr"
  "${launcher[@]}" -np "$np" "$bin" train "${tiny[@]}" --training.steps=1000000 \
      --parallel.timeout_s=$T --logging.trace="$tmp/$name.tr" "$@" > "$log" 2>&1 &
  job=$!
  pid=$(rank_pid "$log" "$victim" 300)
  [ -n "$pid" ] && kill -"$sig" "$pid"
  t0=$(date +%s.%N)
  for _ in $(seq 1 $(((T + SLACK + 20) * 10))); do
    grep -qF -- "$needle" "$log" && { took=$(echo "$(date +%s.%N) - $t0" | bc); break; }
    kill -0 $job 2>/dev/null || { grep -qF -- "$needle" "$log" && took=$(echo "$(date +%s.%N) - $t0" | bc); break; }
    sleep 0.1
  done
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  ( sleep 30; kill -9 $job ) 2>/dev/null & local dog=$!
  wait $job; local rc=$?
  kill $dog 2>/dev/null
  pkill -9 -f "$tmp/train_" 2>/dev/null
  if [ -n "$pid" ] && [ -n "$took" ] && [ "$(echo "$took <= $T + $SLACK" | bc)" = 1 ]; then
    ok; echo "$name: named after ${took%???????} s: $(grep -F -- "$needle" "$log" | head -1 | cut -c1-400)"
  else
    bad "$name: victim '$pid', exit $rc, named after '${took}' s (limit $((T + SLACK))): $(grep -v " step " "$log" | tail -8)"
  fi
}

# why NAME NEEDLE: `pentatron trace why` on NAME's trace directory prints NEEDLE
why() {
  local out; out="$("$bin" trace why "$tmp/$1.tr" 2>&1)"
  if grep -qF -- "$2" <<<"$out"; then ok; else bad "trace why $1: expected '$2', got: $out"; fi
}

P=--parallel
mr=(timeout 120 mpiexec)
rec=(timeout 120 mpiexec --enable-recovery)
l4=($P.dp=2 $P.tp=2 --training.micro_batch=2)
l8=($P.dp=2 $P.tp=2 $P.pp=2 --training.micro_batch=2)

hang stop4 4 3 STOP "hang: rank 3 (dp1 pp0 cp0 tp1) on host $host does not answer" "${mr[@]}" -- "${l4[@]}"
# rank 1, rank 3's dp peer, waits in what rank 3 holds up: their dp collective, or the step's
# world all-reduce when rank 3 stopped between the two; either way the verdict names rank 1's wait
grep -qE "holds up .* of group \"(dp|world)\" \((rank 1|ranks ([0-9]+, )*1(, [0-9]+)*) waits? in it\)" "$tmp/stop4.log" && ok ||
  bad "stop4: the collective rank 1 waits in is not named: $(grep 'hang:' "$tmp/stop4.log")"
hang stop8 8 5 STOP "hang: rank 5 (dp0 pp1 cp0 tp1) on host $host does not answer" "${mr[@]}" -- "${l8[@]}"
hang kill4 4 2 KILL "hang: rank 2 (dp1 pp0 cp0 tp0) on host $host does not answer" "${rec[@]}" -- "${l4[@]}"
why kill4 "rank 2 (dp1 pp0 cp0 tp0) on host $host does not answer"
hang kill8 8 6 KILL "hang: rank 6 (dp1 pp1 cp0 tp0) on host $host does not answer" "${rec[@]}" -- "${l8[@]}"
why kill8 "rank 6 (dp1 pp1 cp0 tp0) on host $host does not answer"
# a plain kill: mpirun ends the job itself at once (naming the rank), nobody times out; the flight
# records still say who stopped first
hang plain4 4 2 KILL "noticed that process rank 2" "${mr[@]}" -- "${l4[@]}"
why plain4 "the rank that stopped first: rank 2 (dp1 pp0 cp0 tp0) on host $host"

# across two hosts
C="$PT_SOURCE_DIR/scripts/cluster.sh"
export PT_CLUSTER="pthg$$" PT_CLUSTER_NET=10.78.0
if "$C" check > /dev/null 2>&1 && [ -z "${PT_HANG_NO_HOSTS:-}" ]; then
  trap '[ "$BASHPID" = "$pt_main_shell" ] && { "$C" down; rm -rf "$tmp"; }' EXIT
  if "$C" up 2 > "$tmp/up.log" 2>&1; then
    # the cluster's processes see the shard through the shared file system (one machine)
    PT_CLUSTER_SLOTS=2 hang hosts 4 3 STOP "hang: rank 3 (dp1 pp0 cp0 tp1) on host $PT_CLUSTER-h1 does not answer" \
        timeout 120 "$C" run -- "${l4[@]}"
    PT_CLUSTER_SLOTS=2 hang hostskill 4 2 KILL "hang: rank 2 (dp1 pp0 cp0 tp0) on host $PT_CLUSTER-h1 does not answer" \
        timeout 120 "$C" run --enable-recovery -- "${l4[@]}"
  else
    bad "cluster.sh up 2: $(tail -3 "$tmp/up.log")"
  fi
else
  echo "note: network namespaces cannot be made here: the two-host case is not run"
fi

echo "test_hang: $pass passed, $fail failed"
[ $fail -eq 0 ]
