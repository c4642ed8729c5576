#!/usr/bin/env bash
# test_signals.sh PENTATRON: preemption signals (include/pt/preempt.h). SIGUSR1 and SIGTERM sent
# to mpirun (SIGTERM with odls_base_sigkill_timeout raised) reach every rank, which saves a
# checkpoint of its last step and exits with 75; the run resumed from it gives the losses of an
# uninterrupted run bit for bit. Without checkpoint.dir the run still exits with 75 and says that
# nothing was saved; a second SIGINT ends a process at once (130).
set -u
source "$(dirname "$0")/parallel_common.sh"
CMP="$PT_SOURCE_DIR/tests/ref/compare_runs.py"
dp2=(--parallel.dp=2 --training.micro_batch=2 --training.steps=400)

# the rank's own exit status in $tmp/rc.RANK (mpirun reports only one); the shell ignores the
# signals, which reach the rank as a member of its process group
cat > "$tmp/rank.sh" <<EOF
#!/usr/bin/env bash
trap '' TERM INT USR1
"\$@"
rc=\$?; echo \$rc > "$tmp/rc.\$OMPI_COMM_WORLD_RANK"; exit \$rc
EOF
chmod +x "$tmp/rank.sh"

# wait_step FILE N: until the metrics FILE (of a run from step 0) has N lines (20 s at most)
wait_step() {
  for _ in $(seq 1 1000); do
    [ "$(cat "$1" 2>/dev/null | wc -l)" -ge "$2" ] && return 0
    sleep 0.02
  done
  return 1
}

timeout 120 mpiexec -np 2 "$bin" train "${tiny[@]}" "${dp2[@]}" --logging.metrics="$tmp/ref.jsonl" \
    > "$tmp/ref.log" 2>&1 || bad "reference run failed: $(tail -3 "$tmp/ref.log")"

# preempted NAME SIGNAL [ENV...]: mpirun sent SIGNAL at step >= 5; then resumed to the end
preempted() {
  local name="$1" sig="$2"; shift 2
  local ck="$tmp/ck_$name" job rc last newest
  rm -f "$tmp"/rc.*
  # (not under timeout(1), which would pass the signal on to the ranks' process group too)
  env "$@" mpiexec -np 2 "$tmp/rank.sh" "$bin" train "${tiny[@]}" "${dp2[@]}" \
      --checkpoint.dir="$ck" --checkpoint.every=50 --logging.metrics="$tmp/$name.jsonl" \
      > "$tmp/$name.log" 2>&1 &
  job=$!
  bash -c "sleep 100; kill -9 $job" > /dev/null 2>&1 & local watchdog=$!   # (not a subshell: it would share the EXIT trap)
  wait_step "$tmp/$name.jsonl" 5 || bad "$name: the run never reached step 5"
  kill -"$sig" $job
  wait $job; rc=$?
  kill $watchdog 2>/dev/null
  last=$(tail -1 "$tmp/$name.jsonl" | sed -n 's/^{"step": \([0-9]*\),.*/\1/p')
  newest=$(ls "$ck" | grep -x "step_[0-9]*" | tail -1)
  local rcs; rcs="$(cat "$tmp"/rc.* 2>/dev/null | tr '\n' ' ')"
  echo "$name: mpirun exit $rc, ranks exit $rcs, last step $last, newest checkpoint $newest"
  if [ "$rcs" = "75 75 " ] && [ "$newest" = "$(printf 'step_%08d' "$last")" ] && [ "$last" -lt 400 ]; then ok
  else bad "$name: ranks exited '$rcs' (want 75 75), last step $last, newest $newest: $(tail -5 "$tmp/$name.log")"; fi
  [ "$sig" = USR1 ] && { [ $rc -eq 75 ] && ok || bad "$name: mpirun exit $rc, want 75"; }
  timeout 120 mpiexec -np 2 "$bin" train "${tiny[@]}" "${dp2[@]}" --checkpoint.dir="$ck" \
      --checkpoint.every=50 --checkpoint.resume=latest --logging.metrics="$tmp/$name.jsonl" \
      > "$tmp/$name.resumed.log" 2>&1 || bad "$name: resumed run failed: $(tail -3 "$tmp/$name.resumed.log")"
  if "$PY" "$CMP" --exact "$tmp/ref.jsonl" "$tmp/$name.jsonl" "$name"; then ok; else bad "$name: resumed run differs"; fi
}

preempted usr1 USR1
preempted term TERM OMPI_MCA_odls_base_sigkill_timeout=3

# no checkpoint.dir: exit 75 all the same, saying that nothing was saved (one process)
"$bin" train "${tiny[@]}" --training.steps=1000000 --logging.metrics="$tmp/nodir.jsonl" \
    > "$tmp/nodir.log" 2>&1 &
job=$!
wait_step "$tmp/nodir.jsonl" 3
kill -TERM $job; wait $job; rc=$?
if [ $rc -eq 75 ] && grep -q "no checkpoint saved (checkpoint.dir is not set)" "$tmp/nodir.log"; then ok
else bad "no checkpoint.dir: exit $rc: $(tail -3 "$tmp/nodir.log")"; fi

# a second SIGINT: exit 130 at once, no checkpoint saved. Steps of ~0.1 s, so that the second
# arrives before the step the first one ends; a try where the run got there first is repeated.
big=(--model.dim=192 --model.n_layers=4 --model.ffn_dim=512 --training.global_batch=64
     --model.max_seq_len=64 --training.seq_len=64)
second=""
for try in 1 2 3; do
  ck="$tmp/ck_int$try"
  "$bin" train "${tiny[@]}" "${big[@]}" --training.steps=1000000 --checkpoint.dir="$ck" \
      --logging.metrics="$tmp/int$try.jsonl" > "$tmp/int$try.log" 2>&1 &
  job=$!
  wait_step "$tmp/int$try.jsonl" 1
  kill -INT $job
  for _ in $(seq 1 500); do grep -q "SIGINT received" "$tmp/int$try.log" && break; sleep 0.002; done
  grep -q "preempted after" "$tmp/int$try.log" || kill -INT $job
  wait $job; rc=$?
  if grep -q "preempted after" "$tmp/int$try.log"; then echo "second SIGINT, try $try: the step ended first"; continue; fi
  echo "second SIGINT: exit $rc [${SECONDS}s]"
  second=$rc
  break
done
if [ "$second" = 130 ] && [ -z "$(ls "$ck" 2>/dev/null | grep step_)" ]; then ok
else bad "second SIGINT: exit '$second' (want 130), checkpoints: $(ls "$ck" 2>/dev/null)"; fi

echo "test_signals: $pass passed, $fail failed"
[ $fail -eq 0 ]
