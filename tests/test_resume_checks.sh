#!/usr/bin/env bash
# test_resume_checks.sh PENTATRON: runs that survive their own restarts (issue 16):
#   - one run per checkpoint.dir: a second run (1 process, 2 ranks) refuses, naming the holder's
#     pid and host; the holder's heartbeat is fresh; a stale lock (a killed holder, a file naming
#     a dead pid, another host's old heartbeat) is taken over with a warning; another host's
#     fresh heartbeat is refused;
#   - checkpoint.resume = latest skips the newest checkpoint when a byte of a shard is flipped
#     (1 process; dp 2, where rank 1 checks the bad shard), says so once, and the losses continue
#     the uninterrupted run's bit for bit; when none verifies it says so;
#   - resuming with changed data (another shard's content), seed, shuffle, global batch, sequence
#     length or model is refused naming old → new (once, also on 2 ranks); with
#     checkpoint.allow_change listing it, a warning; moved shards, another layout and a checkpoint
#     that records none of it (an earlier one's) resume.
source "$(dirname "$0")/parallel_common.sh" "$1"
host="$(hostname)"
dp2=(--parallel.dp=2 --training.micro_batch=4)

# exact REF RUN...: the runs' losses, one after another, equal REF's bit for bit
exact() {
  "$PY" - "$tmp" "$@" <<'PY'
import json, sys
tmp, ref, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
want = [json.loads(l)["loss"] for l in open("%s/%s.jsonl" % (tmp, ref))]
got = [json.loads(l)["loss"] for r in runs for l in open("%s/%s.jsonl" % (tmp, r))]
if got != want:
    print("losses differ from %s's: %s vs %s" % (ref, got, want))
    sys.exit(1)
PY
}

# once OUT RC WANT_RC NEEDLE LABEL: exit status as wanted (0, or not 0) and NEEDLE printed once
once() {
  local out="$1" rc="$2" want="$3" needle="$4" label="$5" n
  n=$(grep -cF -- "$needle" <<<"$out")
  if { [ "$want" = 0 ] && [ "$rc" = 0 ]; } || { [ "$want" != 0 ] && [ "$rc" != 0 ]; }; then
    [ "$n" -eq 1 ] && { ok; return; }
  fi
  bad "$label: exit $rc, '$needle' printed $n times: $(grep -E 'error|warning' <<<"$out" | head -3)"
}

# flip FILE: one byte in the middle of FILE changed (plus 1: twice is still a change)
flip() {
  "$PY" - "$1" <<'PY'
import os, sys
with open(sys.argv[1], "r+b") as f:
    n = os.path.getsize(sys.argv[1]); f.seek(n // 2); b = f.read(1); f.seek(n // 2)
    f.write(bytes([(b[0] + 1) % 256]))
PY
}

# --- the run lock ------------------------------------------------------------------------------
ck="$tmp/locked"
"$bin" train "${tiny[@]}" --training.steps=100000000 --checkpoint.dir="$ck" \
    --checkpoint.lock_timeout_s=2 > "$tmp/holder.log" 2>&1 &
holder=$!
for _ in $(seq 1 100); do grep -q "pid = $holder" "$ck/pentatron.lock" 2>/dev/null && break; sleep 0.1; done
needle="is in use by another run: pid $holder on host $host"
out="$("$bin" train "${tiny[@]}" --checkpoint.dir="$ck" 2>&1)"
once "$out" $? 1 "$needle" "a second run on a locked checkpoint.dir"
expect_fail 2 "$needle" "${dp2[@]}" --checkpoint.dir="$ck"
sleep 1.2 # timeout 2 s: a heartbeat every 0.2 s
age=$(( $(date +%s) - $(stat -c %Y "$ck/pentatron.lock") ))
[ "$age" -le 1 ] && ok || bad "the holder's heartbeat is ${age} s old (refreshed every 0.2 s)"
kill -9 $holder; wait $holder 2>/dev/null
out="$("$bin" train "${tiny[@]}" --training.steps=1 --checkpoint.dir="$ck" 2>&1)"
once "$out" $? 0 "taking over the stale lock of pid $holder on host $host" "a killed holder's lock"
[ -s "$ck/pentatron.lock" ] && bad "the lock file is not emptied at the end of a run" || ok

mkdir -p "$tmp/dead"
sleep 0 & dead=$!; wait $dead
printf 'pentatron run lock\nhost = %s\npid = %d\nstarted = 2026-01-01T00:00:00Z\n' "$host" "$dead" \
    > "$tmp/dead/pentatron.lock"
out="$("$bin" train "${tiny[@]}" --training.steps=1 --checkpoint.dir="$tmp/dead" 2>&1)"
once "$out" $? 0 "stale lock of pid $dead on host $host, started 2026-01-01T00:00:00Z: that process no longer exists" "a lock naming a dead pid"

mkdir -p "$tmp/far"
printf 'pentatron run lock\nhost = node-elsewhere\npid = 4242\nstarted = 2026-01-01T00:00:00Z\n' \
    > "$tmp/far/pentatron.lock"
out="$("$bin" train "${tiny[@]}" --training.steps=1 --checkpoint.dir="$tmp/far" 2>&1)"
once "$out" $? 1 "in use by another run: pid 4242 on host node-elsewhere" "another host's fresh heartbeat"
printf 'pentatron run lock\nhost = node-elsewhere\npid = 4242\nstarted = 2026-01-01T00:00:00Z\n' \
    > "$tmp/far/pentatron.lock"
touch -d '2 hours ago' "$tmp/far/pentatron.lock"
out="$("$bin" train "${tiny[@]}" --training.steps=1 --checkpoint.dir="$tmp/far" 2>&1)"
once "$out" $? 0 "stale lock of pid 4242 on host node-elsewhere, started 2026-01-01T00:00:00Z: its heartbeat is 72" "another host's old heartbeat"

# --- resume = latest past a corrupt checkpoint -------------------------------------------------
run 1 ref || bad "ref failed: $(tail -3 "$tmp/ref.log")"
run 1 a --training.steps=6 --checkpoint.dir="$tmp/fb" --checkpoint.every=3 || bad "a failed"
head -3 "$tmp/a.jsonl" > "$tmp/a3.jsonl"
flip "$tmp/fb/step_00000006/shard-00000-of-00001.safetensors"
run 1 b --checkpoint.dir="$tmp/fb" --checkpoint.resume=latest; rc=$?
once "$(cat "$tmp/b.log")" $rc 0 "skipping $tmp/fb/step_00000006: $tmp/fb/step_00000006/shard-00000-of-00001.safetensors: checksum" "resume=latest past a flipped byte"
once "$(cat "$tmp/b.log")" $rc 0 "resumed from $tmp/fb/step_00000003 at step 3" "resume=latest: the previous checkpoint"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --resume "$tmp" ref fallback a3 b && ok || bad "fallback: losses"
exact ref a3 b && ok || bad "fallback: losses not bit for bit"

run 2 ref2 "${dp2[@]}" --parallel.zero=1 || bad "ref2 failed"
run 2 a2 "${dp2[@]}" --parallel.zero=1 --training.steps=6 --checkpoint.dir="$tmp/fb2" --checkpoint.every=3
head -3 "$tmp/a2.jsonl" > "$tmp/a23.jsonl"
flip "$tmp/fb2/step_00000006/shard-00001-of-00002.safetensors"
run 2 b2 "${dp2[@]}" --parallel.zero=1 --checkpoint.dir="$tmp/fb2" --checkpoint.resume=latest; rc=$?
once "$(cat "$tmp/b2.log")" $rc 0 "skipping $tmp/fb2/step_00000006: $tmp/fb2/step_00000006/shard-00001-of-00002.safetensors: checksum" "dp 2: a bad shard rank 1 checks"
exact ref2 a23 b2 && ok || bad "dp 2 fallback: losses not bit for bit"

cp -r "$tmp/fb" "$tmp/none"
for s in "$tmp"/none/step_*/shard-*; do flip "$s"; done
out="$("$bin" train "${tiny[@]}" --checkpoint.dir="$tmp/none" --checkpoint.resume=latest 2>&1)"
once "$out" $? 1 "checkpoint.resume = latest: none of the 2 checkpoints in $tmp/none verifies" "no checkpoint verifies"

# --- what a resumed run is checked against -----------------------------------------------------
run 1 base --training.steps=2 --checkpoint.dir="$tmp/base" || bad "base failed"
from="$tmp/base/step_00000002"
mkdir -p "$tmp/other" "$tmp/moved"
shard "$tmp/other/train_000000.bin" 30000 2 0.1 # the same size, other tokens
cp "$tmp/train_000000.bin" "$tmp/moved/"

# resumed NAME NEEDLE ARGS...: refused naming NEEDLE; allowed (NAME listed) with it in a warning
resumed() {
  local name="$1" needle="$2" out rc; shift 2
  out="$("$bin" train "${tiny[@]}" --training.steps=3 --checkpoint.resume="$from" "$@" 2>&1)"; rc=$?
  once "$out" $rc 1 "$needle" "$name changed"
  grep -q "set checkpoint.allow_change = $name\$" <<<"$out" || bad "$name: no allow_change hint: $out"
  out="$("$bin" train "${tiny[@]}" --training.steps=3 --checkpoint.resume="$from" "$@" \
      --checkpoint.allow_change="shuffle, $name" 2>&1)"; rc=$?
  once "$out" $rc 0 "$needle" "$name changed, allowed"
  grep -q "warning: resuming from $from with changes that checkpoint.allow_change allows" <<<"$out" \
      && ok || bad "$name allowed: no warning"
}
resumed data "data (source train): $tmp/other/train_000000.bin (was $tmp/train_000000.bin): content fingerprint" \
    --data.train="$tmp/other/train_*.bin"
resumed seed "training.seed 1234 → 7" --training.seed=7
resumed global_batch "training.global_batch 8 → 16" --training.global_batch=16
resumed seq_len "training.seq_len 16 → 8" --training.seq_len=8
resumed model "model.rope_theta 10000 → 20000" --model.rope_theta=20000
out="$("$bin" train "${tiny[@]}" --training.steps=3 --checkpoint.resume="$from" --model.dim=48 2>&1)"
once "$out" $? 1 "model.dim 32 → 48" "model.dim changed"
out="$("$bin" train "${tiny[@]}" --training.steps=3 --checkpoint.resume="$from" --data.shuffle=false 2>&1)"
once "$out" $? 1 "data.shuffle true → false" "data.shuffle changed"
expect_fail 2 "training.seed 1234 → 7" "${dp2[@]}" --training.steps=3 --checkpoint.resume="$from" --training.seed=7
out="$("$bin" train "${tiny[@]}" --checkpoint.allow_change=lr 2>&1)"
once "$out" $? 1 "checkpoint.allow_change: \"lr\": the learning rate and the optimizer may change" "allow_change = lr"
out="$("$bin" train "${tiny[@]}" --training.steps=3 --checkpoint.resume="$from" --data.train="$tmp/moved/train_*.bin" \
    --optimizer.lr=1e-3 2>&1)"
once "$out" $? 0 "the shards are at other paths than when saved" "moved shards, another lr"
run 2 layout "${dp2[@]}" --parallel.zero=1 --training.steps=3 --checkpoint.resume="$from" && ok \
    || bad "a 1-process checkpoint resumed under dp 2: $(grep error "$tmp/layout.log")"
cp -r "$from" "$tmp/old"
"$PY" - "$tmp/old/index.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("data", "model", "seed"):
    del d[k]
json.dump(d, open(sys.argv[1], "w"))
PY
out="$("$bin" train "${tiny[@]}" --training.steps=3 --checkpoint.resume="$tmp/old" 2>&1)"
once "$out" $? 0 "records no training.seed, data fingerprints, model config (saved by an earlier pentatron): not checked" "an earlier checkpoint"

echo "resume checks: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
