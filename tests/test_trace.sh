#!/usr/bin/env bash
# test_trace.sh PENTATRON: logging.trace, each rank's Chrome trace of a range of steps, and
# `pentatron trace merge` (tests/ref/check_trace.py checks them):
#   - pp 2 × tp 2 (sp, zb, the head split over the stages) and dp 2 (ZeRO-1): every rank's events
#     well formed, the computation spans nested (step > pipeline action or micro-batch > layer),
#     every communication's post and completion paired, the spans of each kind present, the
#     traced steps exactly logging.trace_steps;
#   - rank 0's blocked time per group in its trace equals the metrics' comm_wait_groups over the
#     same steps (the counters the run report prints);
#   - the merged file holds every rank's events, one process per rank;
#   - bad input: a trace_steps range that is not one, a directory that cannot be written, a merge
#     of a directory without traces or with a damaged one: one message, non-zero exit, no output.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
check() { # NAME NP "NEEDED SPANS (+ for a space)" ARGS...
  local name="$1" np="$2" needed="$3"; shift 3
  rm -rf "$tmp/$name"
  if run "$np" "$name" --training.steps=4 --logging.trace="$tmp/$name" --logging.trace_steps=2-3 "$@" &&
     "$bin" trace merge "$tmp/$name" > /dev/null; then
    read -r -a spans <<< "$needed"
    spans=("${spans[@]//+/ }")
    if "$PY" "$PT_SOURCE_DIR/tests/ref/check_trace.py" "$tmp/$name" "$tmp/$name.jsonl" 2 3 "${spans[@]}"; then ok
    else bad "$name: the trace is not what the run did"; fi
  else
    bad "$name failed: $(tail -3 "$tmp/$name.log")"
  fi
}
check pp2_tp2 4 "FWD BWD_INPUT BWD_WEIGHT HEAD forward+layer input+gradients+layer weight+gradients+layer head+and+loss optimizer wait+pp wait+tp wait+head" \
  --model.n_layers=4 --parallel.pp=2 --parallel.tp=2 --parallel.sp=true --parallel.pp_schedule=zb \
  --parallel.pp_head=split --training.micro_batch=2
check dp2 2 "micro-batch forward+layer backward+layer head+and+loss gradient+reduction optimizer wait+dp" \
  --parallel.dp=2 --parallel.zero=1 --training.micro_batch=2

# bad input
expect_fail 2 "logging.trace_steps" --parallel.dp=2 --training.micro_batch=4 --logging.trace="$tmp/t" --logging.trace_steps=3-2
touch "$tmp/not_a_dir"
expect_fail 2 "logging.trace" --parallel.dp=2 --training.micro_batch=4 --logging.trace="$tmp/not_a_dir/t"
mkdir -p "$tmp/empty"
out="$("$bin" trace merge "$tmp/empty" 2>&1)"; rc=$?
[ $rc -ne 0 ] && grep -q "no trace-rank" <<<"$out" && [ ! -e "$tmp/empty/trace.json" ] && ok ||
  bad "merge of an empty directory: exit $rc, $out"
cp -r "$tmp/dp2" "$tmp/damaged" && rm -f "$tmp/damaged/trace.json" && head -c 300 "$tmp/dp2/trace-rank1.json" > "$tmp/damaged/trace-rank1.json"
out="$("$bin" trace merge "$tmp/damaged" 2>&1)"; rc=$?
[ $rc -ne 0 ] && grep -q "trace-rank1.json" <<<"$out" && [ ! -e "$tmp/damaged/trace.json" ] && ok ||
  bad "merge of a damaged trace: exit $rc, $out"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
