#!/usr/bin/env bash
# test_async_checkpoint.sh PENTATRON: checkpoint.async = true (the shard written by a thread of its
# own while training goes on, published once every rank has written):
#   - the same checkpoints as saving at once: every step's shards byte for byte, the same losses,
#     on one process and under dp 2 with ZeRO-1 (each rank its shard) and tp 2 × pp 2;
#   - each background save is published (the log says at which step), the last step's at once;
#   - resuming from a checkpoint written in the background continues the uninterrupted run bit
#     for bit;
#   - a background write that fails (a full disk: a small tmpfs, root only) stops the run at its
#     publication with the message naming the file, the previous checkpoint intact, no partial
#     checkpoint left.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
P=--parallel
ck=(--checkpoint.every=2 --checkpoint.keep=10)

both() { # NP NAME ARGS...: sync and async runs, then their checkpoints and losses compared
  local np="$1" name="$2"; shift 2
  run "$np" "${name}_sync" "$@" "${ck[@]}" --checkpoint.dir="$tmp/${name}_sync" &&
    run "$np" "${name}_async" "$@" "${ck[@]}" --checkpoint.dir="$tmp/${name}_async" --checkpoint.async=true ||
    { bad "$name failed: $(tail -2 "$tmp/${name}_async.log")"; return; }
  local n=0 diff=0
  for f in "$tmp/${name}_sync"/step_*/*.safetensors; do
    local g="$tmp/${name}_async/${f#"$tmp/${name}_sync/"}"
    n=$((n + 1)); cmp -s "$f" "$g" || { diff=$((diff + 1)); echo "differs: $g"; }
  done
  local published; published=$(grep -c "written in the background, published at step" "$tmp/${name}_async.log")
  if [ $n -ge 5 ] && [ $diff -eq 0 ] && [ "$published" -eq 4 ] &&
     [ "$(grep -o '"loss": [^,]*' "$tmp/${name}_sync.jsonl")" = "$(grep -o '"loss": [^,]*' "$tmp/${name}_async.jsonl")" ]; then
    ok; echo "$name: $n shard files byte for byte as saved at once, $published saves published in the background"
  else bad "$name: $diff of $n shards differ, $published published in the background"; fi
}
both 1 one --training.micro_batch=8
both 2 dp2_z1 $P.dp=2 $P.zero=1 --training.micro_batch=4
both 4 tp2_pp2 --model.n_layers=4 $P.tp=2 $P.pp=2 --training.micro_batch=2

# resume from a checkpoint written in the background (step 6) = the uninterrupted run
run 1 ref --training.micro_batch=8 || bad "reference failed"
c="$tmp/ra_ck"
run 1 ra --training.micro_batch=8 --training.steps=7 --checkpoint.dir="$c" --checkpoint.every=2 --checkpoint.keep=10 --checkpoint.async=true &&
  rm -rf "$c/step_00000007" &&
  run 1 rb --training.micro_batch=8 --checkpoint.dir="$c" --checkpoint.resume="$c/step_00000006" ||
  bad "resume runs failed: $(tail -2 "$tmp"/r[ab].log)"
grep -q "step_00000006 (written in the background" "$tmp/ra.log" || bad "step 6 was not saved in the background"
"$PY" - "$tmp" <<'PY' && ok || bad "the run resumed from a background checkpoint differs"
import json, sys
t = sys.argv[1]
ref = [json.loads(l)["loss"] for l in open(t + "/ref.jsonl")]
a = [json.loads(l)["loss"] for l in open(t + "/ra.jsonl")][:6]
b = [json.loads(l)["loss"] for l in open(t + "/rb.jsonl")]
print("resumed from the background checkpoint of step 6: steps 7-10 %s the uninterrupted run"
      % ("equal" if a + b == ref else "DIFFER from"))
sys.exit(0 if a + b == ref and len(b) == 4 else 1)
PY

# a background write that fails: the run stops at its publication, the previous one intact
mkdir -p "$tmp/disk"
if mount -t tmpfs -o size=1m tmpfs "$tmp/disk" 2>/dev/null; then
  full=(--training.micro_batch=8 --checkpoint.dir="$tmp/disk/ck" --checkpoint.every=1 --checkpoint.async=true)
  if "$bin" train "${tiny[@]}" "${full[@]}" --training.steps=1 > "$tmp/disk1.log" 2>&1; then
    sum="$(cat "$tmp"/disk/ck/step_00000001/* | md5sum)"
    avail=$(($(stat -f -c '%a*%S' "$tmp/disk")))
    head -c $((avail - 40000)) /dev/zero > "$tmp/disk/filler" # room for part of a shard
    out="$(timeout 60 "$bin" train "${tiny[@]}" "${full[@]}" --training.steps=4 --checkpoint.resume=latest 2>&1)"; rc=$?
    if [ $rc -ne 0 ] && grep -q "checkpoint not saved: .*$tmp/disk/ck/step_00000002.tmp.*No space left on device" <<<"$out" &&
       [ "$(cat "$tmp"/disk/ck/step_00000001/* | md5sum)" = "$sum" ] && [ ! -e "$tmp/disk/ck/step_00000002.tmp" ] &&
       [ ! -e "$tmp/disk/ck/step_00000002" ]; then ok; echo "full disk in the background: stopped, step 1 intact"
    else bad "full disk: exit $rc: $(grep -i error <<<"$out" | head -2); $(ls "$tmp/disk/ck")"; fi
  else bad "full disk: the first run failed: $(tail -2 "$tmp/disk1.log")"; fi
  umount "$tmp/disk"
else
  echo "note: cannot mount a tmpfs (not root?): the full-disk case not run"
fi

echo "test_async_checkpoint: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
