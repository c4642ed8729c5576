#!/usr/bin/env bash
# test_chaos.sh PENTATRON: `pentatron launch` under fire. Over seeded trials, a dp 2 job saving
# every step runs under `launch --restarts`, while ranks are SIGKILLed at random moments (during
# start-up, mid-step, mid-save) or, the first fault of every even trial, stopped (SIGSTOP: a hung
# rank; the other times out after parallel.timeout_s = 5, names the stopped rank and ends the job,
# which launch restarts): every trial must complete (launch exits 0) and the loss of each step,
# as last written in the appended metrics, must equal an uninterrupted run's bit for bit.
# Size: PT_CHAOS_SEED (1), PT_CHAOS_TRIALS (4), PT_CHAOS_KILLS (kills per trial at most, 3),
# PT_CHAOS_STEPS (150; a run of them takes ~5 s here, 1 of which is start-up). Also: launch refuses a job that would not resume, and a signal to the
# launcher is forwarded to the job and ends the supervision.
set -u
source "$(dirname "$0")/parallel_common.sh"
CMP="$PT_SOURCE_DIR/tests/ref/compare_runs.py"
seed="${PT_CHAOS_SEED:-1}" trials="${PT_CHAOS_TRIALS:-4}" max_kills="${PT_CHAOS_KILLS:-3}"
steps="${PT_CHAOS_STEPS:-150}"
RANDOM=$seed
job=(--parallel.dp=2 --training.micro_batch=2 --training.steps="$steps")
# a stopped rank is found by the others' timeouts: short ones (a rank stopped in MPI_Init by the
# start-up watchdog's)
hang=(--parallel.timeout_s=5)
export PT_STARTUP_TIMEOUT=15
t_start=$SECONDS

timeout 120 mpiexec -np 2 "$bin" train "${tiny[@]}" "${job[@]}" --logging.metrics="$tmp/ref.jsonl" \
    > "$tmp/ref.log" 2>&1 || bad "reference run failed: $(tail -3 "$tmp/ref.log")"

# ranks MARK: the pids of the job's rank processes (their command line holds MARK; mpiexec's and
# the launcher's do too, but only a rank has OMPI_COMM_WORLD_RANK)
ranks() {
  for p in $(pgrep -f "$1"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK=" && echo "$p"
  done
}

total_kills=0 total_restarts=0 total_stops=0 total_named=0 all_redone=()
for trial in $(seq 1 "$trials"); do
  ck="$tmp/ck_chaos$trial" m="$tmp/chaos$trial.jsonl" log="$tmp/chaos$trial.log"
  "$bin" launch --restarts 20 --backoff 0 -- mpiexec -np 2 "$bin" train "${tiny[@]}" "${job[@]}" \
      --checkpoint.dir="$ck" --checkpoint.every=1 --checkpoint.resume=latest "${hang[@]}" \
      --logging.metrics="$m" > "$log" 2>&1 &
  launcher=$!
  kills=$((1 + RANDOM % max_kills)) done_kills=0 done_stops=0
  for k in $(seq 1 $kills); do
    # each kill aimed at a run of the job: wait for its ranks (its start or a restart), then
    # 0 to 2.9 s into it (start-up, steps, saves; a run is ~1 s of start-up and ~2 s of steps
    # here), so that kills land whatever the machine's speed
    victims=()
    for _ in $(seq 1 400); do
      kill -0 $launcher 2>/dev/null || break
      victims=($(ranks "$ck")); [ ${#victims[@]} -gt 0 ] && break
      sleep 0.05
    done
    [ ${#victims[@]} -eq 0 ] && break                    # the job is over
    sleep "$((RANDOM % 3)).$((RANDOM % 10))"
    victims=($(ranks "$ck"))
    [ ${#victims[@]} -eq 0 ] && continue                 # between two runs
    v=${victims[$((RANDOM % ${#victims[@]}))]}
    if [ $k -eq 1 ] && [ $((trial % 2)) -eq 0 ]; then
      kill -STOP "$v" 2>/dev/null && done_stops=$((done_stops + 1))
      # the next fault for the next run: this one ends when the other rank times out
      for _ in $(seq 1 300); do [ -d "/proc/$v" ] || break; sleep 0.1; done
    else
      kill -9 "$v" 2>/dev/null && done_kills=$((done_kills + 1))
    fi
  done
  bash -c "sleep 120; kill -9 $launcher" > /dev/null 2>&1 & watchdog=$!   # (a subshell would share the EXIT trap)
  wait $launcher; rc=$?
  kill $watchdog 2>/dev/null
  for p in $(ranks "$ck"); do kill -9 "$p" 2>/dev/null; done    # (a stopped rank of a job given up)
  restarts=$(grep -c "restart [0-9]* of" "$log")
  named=$(grep -c "hang: rank [01] (dp[01] pp0 cp0 tp0) on host .* does not answer" "$log")
  out="$("$PY" "$CMP" --exact "$tmp/ref.jsonl" "$m" "trial $trial")"; cmp=$?
  echo "$out ($done_kills kills, $done_stops stops ($named named), launch: $restarts restarts, exit $rc)"
  total_stops=$((total_stops + done_stops)) total_named=$((total_named + named))
  if [ $rc -eq 0 ] && [ $cmp -eq 0 ]; then ok
  else bad "trial $trial: launch exit $rc: $(grep -v "^\[rank 0\] *step\|^\[rank 0\] checkpoint" "$log" | tail -25)"; fi
  total_kills=$((total_kills + done_kills)) total_restarts=$((total_restarts + restarts))
  all_redone+=($(sed -n 's/.*steps redone \[\(.*\)\]$/\1/p' <<<"$out" | tr -d ','))
done
redone_sum=0; for r in "${all_redone[@]}"; do redone_sum=$((redone_sum + r)); done
# a chaos test that killed nothing tested nothing: at least a fault a trial (kills and stops: how
# many kills land depends on when the job's runs start and end, the even trials' first fault is a
# stop), at least one kill, and restarts
[ $((total_kills + total_stops)) -ge "$trials" ] && [ "$total_kills" -ge 1 ] && [ "$total_restarts" -ge 1 ] && ok ||
  bad "only $total_kills kills, $total_stops stops and $total_restarts restarts in $trials trials"
# and a stopped rank is named, by whoever timed out waiting for it
[ $trials -lt 2 ] || { [ "$total_stops" -ge 1 ] && [ "$total_named" -ge 1 ] && ok ||
  bad "$total_stops stops landed, $total_named named (\"hang: rank N ... does not answer\")"; }

echo "chaos: seed $seed, $trials trials of $steps steps, $total_kills kills, $total_restarts restarts," \
     "steps redone per restart seen in the metrics: ${all_redone[*]:-none} (sum $redone_sum), $((SECONDS - t_start)) s"

# a job that would restart from step 0: refused before it runs
out="$("$bin" launch --restarts 1 -- mpiexec -np 2 "$bin" train "${tiny[@]}" "${job[@]}" \
       --checkpoint.dir="$tmp/ck_no" 2>&1)"; rc=$?
if [ $rc -eq 2 ] && grep -q "checkpoint.resume = latest" <<<"$out" && [ ! -d "$tmp/ck_no" ]; then ok
else bad "launch without checkpoint.resume=latest: exit $rc: $out"; fi

# SIGUSR1 to the launcher: forwarded (mpirun passes it to the ranks, which save and exit 75),
# supervision ends with the job's status, no restart
"$bin" launch --restarts 5 --backoff 0 -- mpiexec -np 2 "$bin" train "${tiny[@]}" "${job[@]}" \
    --training.steps=100000 --checkpoint.dir="$tmp/ck_fwd" --checkpoint.every=1000 \
    --checkpoint.resume=latest --logging.metrics="$tmp/fwd.jsonl" > "$tmp/fwd.log" 2>&1 &
launcher=$!
for _ in $(seq 1 500); do [ "$(cat "$tmp/fwd.jsonl" 2>/dev/null | wc -l)" -ge 5 ] && break; sleep 0.02; done
kill -USR1 $launcher
bash -c "sleep 60; kill -9 $launcher" > /dev/null 2>&1 & watchdog=$!
wait $launcher; rc=$?
kill $watchdog 2>/dev/null
last=$(tail -1 "$tmp/fwd.jsonl" | sed -n 's/^{"step": \([0-9]*\),.*/\1/p')
if [ $rc -eq 75 ] && grep -q "supervision ends" "$tmp/fwd.log" && ! grep -q "restart 1 of" "$tmp/fwd.log" &&
   [ -d "$tmp/ck_fwd/$(printf 'step_%08d' "$last")" ]; then ok
else bad "SIGUSR1 to launch: exit $rc, last step $last: $(grep "launch" "$tmp/fwd.log" | tail -3)"; fi

echo "test_chaos: $pass passed, $fail failed"
[ $fail -eq 0 ]
