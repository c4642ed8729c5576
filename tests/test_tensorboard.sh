#!/usr/bin/env bash
# test_tensorboard.sh PENTATRON: logging.tensorboard's event files, read by reference readers
# (tests/ref/check_tfevents.js: @roboflow/tfrecords' CRC-32C and framing, protobufjs over
# TensorBoard's own event.proto and summary.proto in tests/ref/tensorboard_proto).
#   - dp 2 with held-out evaluation and the communication every 3 steps, pp 2 (its stages' idle
#     and busy times), the mixture of experts under dp 2 × ep 2 (balancing losses, expert loads,
#     rows dispatched) and cp 2 (attention pairs): one file, from rank 0 alone; both CRCs of every record verify; the
#     first record is file_version "brain.Event:2"; one Event per step, steps 1-10, wall times
#     within the run and not decreasing; every scalar of each metrics line (loss, validation
#     loss, lr, gradient norm, tokens/s, MFU, memory, each group's and each operation's bytes and
#     blocked seconds, ...) equals its tag's value as float32, and no tag is outside the line's
#     scalars but the documented extras;
#   - a run resumed at step 5 adds a second file to the same directory, steps 6-10, the first
#     left as it was;
#   - a run killed with SIGKILL mid-run leaves a file readable up to its last complete step (at
#     most the step whose metrics line was the last written);
#   - a regular file as the directory, or a directory under one: one message naming
#     logging.tensorboard, a non-zero exit, on 2 ranks.
# Needs $PT_DEPS_DIR/node_modules/@roboflow/tfrecords and protobufjs (scripts/setup.sh).
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
deps="${PT_DEPS_DIR:-$PT_SOURCE_DIR/.deps}"
for p in @roboflow/tfrecords protobufjs; do
  [ -f "$deps/node_modules/$p/package.json" ] ||
    { echo "FAIL: no $p in $deps/node_modules (scripts/setup.sh installs it)"; exit 1; }
done
shard "$tmp/val_000000.bin" 4000 7 0.2
ev=(--data.val="$tmp/val_*.bin" --eval.every=5 --eval.tokens=256)

# events NAME FIRST T0 [partial]: the one event file of $tmp/tb_NAME against $tmp/NAME.jsonl
events() {
  local name="$1" first="$2" t0="$3" files out
  files=("$tmp/tb_$name"/events.out.tfevents.*)
  if [ "${#files[@]}" -ne 1 ] || [ ! -f "${files[0]}" ]; then
    bad "$name: ${#files[@]} event files in tb_$name (one expected, rank 0's): ${files[*]}"; return
  fi
  if out="$(PT_DEPS_DIR="$deps" node "$PT_SOURCE_DIR/tests/ref/check_tfevents.js" "${files[0]}" \
              "$tmp/$name.jsonl" "$first" "$t0" "$(($(date +%s) + 1))" ${4:-} 2>&1)"; then
    ok; echo "$name: $out"
  else bad "$name: $out"; fi
}

t0=$(date +%s)
run 2 dp2 "${ev[@]}" --parallel.dp=2 --training.micro_batch=4 --logging.comm_every=3 \
    --checkpoint.dir="$tmp/ck" --checkpoint.every=5 --logging.tensorboard="$tmp/tb_dp2" ||
  bad "dp2 failed: $(tail -3 "$tmp/dp2.log")"
events dp2 1 "$t0"
grep -q '"val_loss"' "$tmp/dp2.jsonl" && grep -q '"comm_groups": {[^}]*"dp"' "$tmp/dp2.jsonl" && ok ||
  bad "dp2: the metrics hold no val_loss or no dp group's bytes: nothing to compare"

t0=$(date +%s)
run 2 pp2 --parallel.pp=2 --training.micro_batch=2 --logging.tensorboard="$tmp/tb_pp2" ||
  bad "pp2 failed: $(tail -3 "$tmp/pp2.log")"
events pp2 1 "$t0"

# the mixture of experts under dp 2 × ep 2 (its losses, loads and rows), and cp 2 (its pairs)
t0=$(date +%s)
run 2 moe_ep2 --model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24 \
    --model.moe_first_dense=1 --model.aux_loss_coef=0.05 --model.z_loss_coef=0.01 \
    --parallel.dp=2 --parallel.ep=2 --training.micro_batch=4 --logging.tensorboard="$tmp/tb_moe_ep2" ||
  bad "moe_ep2 failed: $(tail -3 "$tmp/moe_ep2.log")"
events moe_ep2 1 "$t0"
t0=$(date +%s)
run 2 cp2 --parallel.cp=2 --training.micro_batch=8 --logging.tensorboard="$tmp/tb_cp2" ||
  bad "cp2 failed: $(tail -3 "$tmp/cp2.log")"
events cp2 1 "$t0"

# resumed at step 5: a second file beside the first, steps 6-10
first_file=("$tmp/tb_dp2"/events.out.tfevents.*)
sum=$(md5sum < "${first_file[0]}")
mkdir -p "$tmp/tb_resumed"
t0=$(date +%s)
run 2 resumed "${ev[@]}" --parallel.dp=2 --training.micro_batch=4 --logging.comm_every=3 \
    --checkpoint.resume="$tmp/ck/step_00000005" --logging.tensorboard="$tmp/tb_dp2" ||
  bad "resumed failed: $(tail -3 "$tmp/resumed.log")"
for f in "$tmp/tb_dp2"/events.out.tfevents.*; do [ "$f" = "${first_file[0]}" ] || mv "$f" "$tmp/tb_resumed/"; done
[ "$(md5sum < "${first_file[0]}")" = "$sum" ] && ok || bad "resumed: the first run's event file changed"
events resumed 6 "$t0"

# killed with SIGKILL mid-run: every complete record readable
t0=$(date +%s)
"$bin" train "${tiny[@]}" --training.steps=100000 --logging.metrics="$tmp/killed.jsonl" \
    --logging.tensorboard="$tmp/tb_killed" > "$tmp/killed.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  [ "$(cat "$tmp/killed.jsonl" 2>/dev/null | wc -l)" -ge 30 ] && break
  sleep 0.1
done
kill -KILL "$pid"; wait "$pid" 2>/dev/null
[ -n "$(tail -c 1 "$tmp/killed.jsonl")" ] && sed -i '$d' "$tmp/killed.jsonl" # a torn last line dropped
n=$(wc -l < "$tmp/killed.jsonl")
[ "$n" -ge 30 ] && [ "$n" -lt 100000 ] && ok || bad "killed: $n metrics lines before the kill (30 expected)"
events killed 1 "$t0" partial

# a directory that cannot be one: one message, every rank out
: > "$tmp/a_file"
expect_fail 2 'logging.tensorboard' --parallel.dp=2 --training.micro_batch=4 --logging.tensorboard="$tmp/a_file"
expect_fail 2 'logging.tensorboard' --parallel.dp=2 --training.micro_batch=4 --logging.tensorboard="$tmp/a_file/sub"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
