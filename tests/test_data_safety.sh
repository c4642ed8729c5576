#!/usr/bin/env bash
# test_data_safety.sh PENTATRON: what pentatron deletes and overwrites is only its own (issue 30):
#   - pruning and the removal of step_N.tmp / step_N.old never follow a symbolic link: a linked
#     checkpoint (another run's, linked in to resume from it) is never pruned, its target never
#     emptied; a subdirectory inside a pruned checkpoint goes with it;
#   - a new run in a checkpoint.dir holding another run's checkpoints is refused at set-up (once,
#     also on 2 ranks), naming the directory, the other run and the ways out; with
#     checkpoint.share_dir = true it runs beside them and prunes only its own; a resumed run
#     continues its run id and prunes its own lineage; checkpoints without a run id (saved before
#     one was recorded) count as another run's;
#   - no output is written through a symbolic link: a linked *.tmp (export's config.json and
#     model.safetensors), a linked final file, logging.trace's file and logging.metrics;
#   - the run lock is created 0600 (an older run's 0644 one is made 0600), and a hard-linked lock
#     file is refused, its other name untouched.
# (tests/test_hostile.c has the unit-level cases: pt_write_file_atomic, the safetensors writer,
# the trace, the writable-directory probe.)
set -u
source "$(dirname "$0")/parallel_common.sh" # MPI environment, shard, tiny, expect_fail NP, ok, bad
one=(--training.micro_batch=8)

# expect_out OUT RC NEEDLE LABEL: RC is not 0 and NEEDLE is printed exactly once
expect_out() {
  local n; n=$(grep -cF -- "$3" <<<"$1")
  if [ "$2" -ne 0 ] && [ "$n" -eq 1 ]; then ok
  else bad "$4: exit $2, '$3' printed $n times: $(grep -E 'error|warning' <<<"$1" | head -3 | cut -c1-400)"; fi
}
# same FILE TEXT LABEL: FILE is a regular file holding TEXT
same() {
  if [ -f "$1" ] && [ ! -L "$1" ] && [ "$(cat "$1")" = "$2" ]; then ok; else bad "$3: $1 is $(ls -l "$1" 2>&1; cat "$1" 2>&1 | head -c 80)"; fi
}
# run_id DIR: the run id in DIR/index.json ("" if none)
run_id() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1] + "/index.json")).get("run_id", ""))' "$1"; }
steps_in() { (cd "$1" && ls -d step_* 2>/dev/null | tr '\n' ' '); }

# the first run (also the other run of section 2): 20 steps, saving steps 10 and 20
run 1 first "${one[@]}" --training.steps=20 --checkpoint.every=10 --checkpoint.dir="$tmp/ck4" ||
  bad "the first run: $(tail -2 "$tmp/first.log")"

# --- 1. pruning never follows a link ---------------------------------------------------------
# the issue's case: a link among the checkpoints, a run saving every step with keep = 2
mkdir -p "$tmp/victim" "$tmp/ck1"; echo secret > "$tmp/victim/f"
ln -s "$tmp/victim" "$tmp/ck1/step_00000000"
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=3 --checkpoint.dir="$tmp/ck1" \
       --checkpoint.every=1 --checkpoint.keep=2 2>&1)"; rc=$?
expect_out "$out" $rc "checkpoint.dir = $tmp/ck1 holds checkpoints of another run" "a new run beside a linked directory"
same "$tmp/victim/f" secret "the linked directory after a refused run"
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=3 --checkpoint.dir="$tmp/ck1" \
       --checkpoint.every=1 --checkpoint.keep=2 --checkpoint.share_dir=true 2>&1)"; rc=$?
[ $rc -eq 0 ] && [ -L "$tmp/ck1/step_00000000" ] && [ "$(steps_in "$tmp/ck1")" = "step_00000000 step_00000002 step_00000003 " ] &&
  ok || bad "share_dir beside a link: exit $rc, $(steps_in "$tmp/ck1"): $(grep -E 'error|warning' <<<"$out" | head -2)"
same "$tmp/victim/f" secret "the linked directory after 3 saves with keep = 2"

# the realistic case: another run's checkpoint linked in to resume from it; two saves later it
# is still whole (it was emptied)
sum4="$(cat "$tmp"/ck4/step_*/* | md5sum)"
mkdir -p "$tmp/ck2"; ln -s "$tmp/ck4/step_00000020" "$tmp/ck2/step_00000020"
run 1 b "${one[@]}" --training.steps=23 --checkpoint.dir="$tmp/ck2" --checkpoint.every=1 \
    --checkpoint.keep=2 --checkpoint.resume=latest; rc=$?
[ $rc -eq 0 ] && grep -q "resumed from $tmp/ck2/step_00000020 at step 20" "$tmp/b.log" &&
  [ "$(steps_in "$tmp/ck2")" = "step_00000020 step_00000022 step_00000023 " ] && [ -L "$tmp/ck2/step_00000020" ] &&
  ok || bad "resumed from a link: exit $rc, $(steps_in "$tmp/ck2"): $(grep -E 'error|warning' "$tmp/b.log" | head -2)"
[ "$(cat "$tmp"/ck4/step_*/* 2>/dev/null | md5sum)" = "$sum4" ] && ok || bad "the linked checkpoint was changed: $(ls "$tmp/ck4/step_00000020")"

# step_N.tmp and step_N.old as links: the link goes, never what it points to (and an older
# run's 0644 lock file is made 0600)
mkdir -p "$tmp/victim3" "$tmp/ck3"; echo secret > "$tmp/victim3/f"
ln -s "$tmp/victim3" "$tmp/ck3/step_00000001.tmp"
: > "$tmp/ck3/pentatron.lock"; chmod 644 "$tmp/ck3/pentatron.lock"
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=2 --checkpoint.dir="$tmp/ck3" \
       --checkpoint.every=1 --checkpoint.keep=5 2>&1)"; rc=$?
[ $rc -eq 0 ] && [ "$(steps_in "$tmp/ck3")" = "step_00000001 step_00000002 " ] && ok ||
  bad "a linked step_N.tmp: exit $rc, $(steps_in "$tmp/ck3"): $(grep -E 'error|warning' <<<"$out" | head -2)"
same "$tmp/victim3/f" secret "a linked step_N.tmp's target"
[ "$(stat -c %a "$tmp/ck3/pentatron.lock")" = 600 ] && ok || bad "an old 0644 lock: $(stat -c %a "$tmp/ck3/pentatron.lock")"
ln -s "$tmp/victim3" "$tmp/ck3/step_00000002.old"
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=2 --checkpoint.dir="$tmp/ck3" \
       --checkpoint.every=1 --checkpoint.keep=5 --checkpoint.resume="$tmp/ck3/step_00000001" 2>&1)"; rc=$?
[ $rc -eq 0 ] && [ "$(steps_in "$tmp/ck3")" = "step_00000001 step_00000002 " ] && ok ||
  bad "a linked step_N.old: exit $rc, $(steps_in "$tmp/ck3"): $(grep -E 'error|warning' <<<"$out" | head -2)"
same "$tmp/victim3/f" secret "a linked step_N.old's target"

# a pruned checkpoint holding a subdirectory and a link: removed whole, the link's target kept
mkdir -p "$tmp/ck3/step_00000001/sub"; echo x > "$tmp/ck3/step_00000001/sub/x"
ln -s "$tmp/victim3" "$tmp/ck3/step_00000001/link"
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=3 --checkpoint.dir="$tmp/ck3" \
       --checkpoint.every=1 --checkpoint.keep=2 --checkpoint.resume=latest 2>&1)"; rc=$?
[ $rc -eq 0 ] && [ "$(steps_in "$tmp/ck3")" = "step_00000002 step_00000003 " ] && ok ||
  bad "pruning a checkpoint with a subdirectory: exit $rc, $(steps_in "$tmp/ck3"): $(grep -E 'error|warning' <<<"$out" | head -2)"
same "$tmp/victim3/f" secret "a link inside a pruned checkpoint"

# --- 2. a new run in a used checkpoint.dir -----------------------------------------------------
id="$(run_id "$tmp/ck4/step_00000020")"
[ ${#id} -eq 16 ] && [ "$(run_id "$tmp/ck4/step_00000010")" = "$id" ] && [ "$(run_id "$tmp/ck2/step_00000023")" = "$id" ] &&
  ok || bad "run id '$id' in index.json, continued from a link: '$(run_id "$tmp/ck2/step_00000023")'"
second=(--training.seed=7 --training.steps=3 --checkpoint.every=1 --checkpoint.dir="$tmp/ck4")
out="$("$bin" train "${tiny[@]}" "${one[@]}" "${second[@]}" 2>&1)"; rc=$?
expect_out "$out" $rc "checkpoint.dir = $tmp/ck4 holds checkpoints of another run (run $id: step_00000010, step_00000020): a new run would mix with them" "a fresh run in a used directory"
grep -q "checkpoint.resume = latest.*another checkpoint.dir.*checkpoint.share_dir = true" <<<"$out" && ok || bad "the ways out: $(grep error <<<"$out")"
grep -q "step  *1/" <<<"$out" && bad "the refused run trained" || ok
[ "$(steps_in "$tmp/ck4")" = "step_00000010 step_00000020 " ] && [ "$(cat "$tmp"/ck4/step_*/* | md5sum)" = "$sum4" ] && ok ||
  bad "the first run's checkpoints after the refusal: $(steps_in "$tmp/ck4")"
expect_fail 2 "checkpoint.dir = $tmp/ck4 holds checkpoints of another run" --parallel.dp=2 --training.micro_batch=4 "${second[@]}"
# beside them: its own pruned, theirs kept
out="$("$bin" train "${tiny[@]}" "${one[@]}" "${second[@]}" --checkpoint.share_dir=true 2>&1)"; rc=$?
[ $rc -eq 0 ] && [ "$(steps_in "$tmp/ck4")" = "step_00000002 step_00000003 step_00000010 step_00000020 " ] &&
  [ "$(cat "$tmp"/ck4/step_000000[12]0/* | md5sum)" = "$sum4" ] && ok ||
  bad "share_dir: exit $rc, $(steps_in "$tmp/ck4"): $(grep -E 'error|warning' <<<"$out" | head -2)"
id2="$(run_id "$tmp/ck4/step_00000003")"
[ ${#id2} -eq 16 ] && [ "$id2" != "$id" ] && ok || bad "the second run's id '$id2' (the first's $id)"
# the first run resumed (latest: its step 20, the newest) continues its run id, prunes its own
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=22 --checkpoint.every=1 \
       --checkpoint.dir="$tmp/ck4" --checkpoint.resume=latest 2>&1)"; rc=$?
[ $rc -eq 0 ] && [ "$(steps_in "$tmp/ck4")" = "step_00000002 step_00000003 step_00000021 step_00000022 " ] &&
  [ "$(run_id "$tmp/ck4/step_00000022")" = "$id" ] && ok ||
  bad "the first run resumed: exit $rc, $(steps_in "$tmp/ck4"): $(grep -E 'error|warning' <<<"$out" | head -2)"
grep -q "warning: checkpoint.dir = $tmp/ck4 also holds checkpoints of another run (run $id2: step_00000002, step_00000003)" <<<"$out" &&
  ok || bad "no warning naming the other run's checkpoints: $(grep warning <<<"$out")"
# share_dir never replaces another run's checkpoint: a run that would save one of its steps is
# refused at set-up; share_dir with resume = latest (whose run?) is refused
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=4 --checkpoint.every=2 \
       --checkpoint.dir="$tmp/ck4" --checkpoint.share_dir=true 2>&1)"; rc=$?
expect_out "$out" $rc "would save step 2, where checkpoint.dir = $tmp/ck4 holds another run's checkpoint step_00000002 (run $id2)" "share_dir over another run's step"
out="$("$bin" train "${tiny[@]}" "${one[@]}" --checkpoint.dir="$tmp/ck4" --checkpoint.share_dir=true --checkpoint.resume=latest 2>&1)"; rc=$?
expect_out "$out" $rc "checkpoint.share_dir = true and checkpoint.resume = latest" "share_dir with resume=latest"
# checkpoints saved before run ids: another run's (refused; resumed, never pruned)
mkdir -p "$tmp/ck5"; cp -r "$tmp/ck4/step_00000021" "$tmp/ck4/step_00000022" "$tmp/ck5/"
sed -i '/"run_id"/d' "$tmp"/ck5/step_*/index.json
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=3 --checkpoint.dir="$tmp/ck5" 2>&1)"; rc=$?
expect_out "$out" $rc "holds checkpoints of another run (no run id: step_00000021, step_00000022)" "checkpoints without a run id"
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=25 --checkpoint.every=1 --checkpoint.keep=1 \
       --checkpoint.dir="$tmp/ck5" --checkpoint.resume=latest 2>&1)"; rc=$?
[ $rc -eq 0 ] && [ "$(steps_in "$tmp/ck5")" = "step_00000021 step_00000022 step_00000025 " ] && ok ||
  bad "resumed from a checkpoint without a run id: exit $rc, $(steps_in "$tmp/ck5"): $(grep -E 'error|warning' <<<"$out" | head -2)"

# --- 3. no output written through a link -------------------------------------------------------
ckpt="$tmp/ck4/step_00000022"
echo precious > "$tmp/victim_file"
for f in model.safetensors.tmp config.json.tmp model.safetensors; do
  rm -rf "$tmp/out"; mkdir -p "$tmp/out"; ln -s "$tmp/victim_file" "$tmp/out/$f"
  out="$("$bin" export --checkpoint "$ckpt" --out "$tmp/out" 2>&1)"; rc=$?
  expect_out "$out" $rc "$tmp/out/$f: a symbolic link" "export with $f a link"
  same "$tmp/victim_file" precious "export with $f a link: its target"
done
rm -rf "$tmp/out"; mkdir -p "$tmp/out"; echo stale > "$tmp/out/model.safetensors.tmp" # a crash's
"$bin" export --checkpoint "$ckpt" --out "$tmp/out" > /dev/null 2>&1 && [ -f "$tmp/out/model.safetensors" ] &&
  [ ! -e "$tmp/out/model.safetensors.tmp" ] && ok || bad "export past a stale regular .tmp"
mkdir -p "$tmp/trace"; ln -s "$tmp/victim_file" "$tmp/trace/trace-rank0.json"
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=1 --logging.trace="$tmp/trace" 2>&1)"; rc=$?
expect_out "$out" $rc "$tmp/trace/trace-rank0.json: a symbolic link" "logging.trace with a linked file"
grep -q "step  *1/" <<<"$out" && bad "the run with a linked trace file trained" || ok
same "$tmp/victim_file" precious "logging.trace's link target"
ln -s "$tmp/victim_file" "$tmp/metrics.jsonl"
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=1 --logging.metrics="$tmp/metrics.jsonl" 2>&1)"; rc=$?
expect_out "$out" $rc "$tmp/metrics.jsonl: a symbolic link" "logging.metrics a link"
same "$tmp/victim_file" precious "logging.metrics's link target"

# --- 4. the run lock ---------------------------------------------------------------------------
[ "$(stat -c %a "$tmp/ck4/pentatron.lock")" = 600 ] && ok || bad "the lock file's mode is $(stat -c %a "$tmp/ck4/pentatron.lock")"
mkdir -p "$tmp/ck7"; echo precious > "$tmp/lock_victim"; ln "$tmp/lock_victim" "$tmp/ck7/pentatron.lock"
out="$("$bin" train "${tiny[@]}" "${one[@]}" --training.steps=1 --checkpoint.dir="$tmp/ck7" 2>&1)"; rc=$?
expect_out "$out" $rc "$tmp/ck7/pentatron.lock: the run lock has 2 links" "a hard-linked lock"
same "$tmp/lock_victim" precious "a hard-linked lock's other name"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
