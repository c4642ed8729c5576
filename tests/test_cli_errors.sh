#!/usr/bin/env bash
# test_cli_errors.sh PENTATRON: bad input on the command line gets one clear message naming the
# problem and a non-zero exit, quickly, and leaves existing files untouched.
set -u
bin="$1"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0

# expect_fail NEEDLE CMD...: CMD must exit non-zero within 20 s and print NEEDLE on stderr/stdout.
expect_fail() {
  local needle="$1"; shift
  local out rc
  out="$(timeout 20 "$@" 2>&1)"; rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "$needle" <<<"$out"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: [$*] exit $rc, expected a message containing '$needle'; got:"; echo "$out" | head -5
  fi
}

# a valid shard to get past the data checks
python_shard() {
  /usr/bin/python3 - "$1" <<'PY'
import struct, sys
n = 5000
hdr = [20240520, 1, n] + [0] * 253
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack("<%dH" % n, *[(i * 7) % 97 for i in range(n)]))
PY
}
python_shard "$tmp/train_000000.bin"
tiny=(--model.vocab_size=97 --model.dim=16 --model.n_layers=1 --model.n_heads=2 --model.n_kv_heads=2
      --model.ffn_dim=16 --model.max_seq_len=16 --training.seq_len=8 --training.global_batch=2
      --training.micro_batch=2 --training.steps=1 --training.threads=1)

expect_fail 'unknown command "trian"' "$bin" trian
expect_fail 'model.dimm' "$bin" train --model.dimm=3
expect_fail 'training.steps' "$bin" train --training.steps=abc
expect_fail 'divisible' "$bin" train --training.global_batch=5 --training.micro_batch=2
expect_fail 'no file matches' "$bin" train "${tiny[@]}" --data.train="$tmp/nothing_*.bin"
expect_fail 'data.train is not set' "$bin" train "${tiny[@]}"
expect_fail 'model.n_heads' "$bin" train "${tiny[@]}" --data.train="$tmp/train_*.bin" --model.n_heads=3
expect_fail 'model.n_kv_heads' "$bin" train "${tiny[@]}" --data.train="$tmp/train_*.bin" --model.n_kv_heads=3 --model.n_heads=2
expect_fail 'exceeds model.max_seq_len' "$bin" train "${tiny[@]}" --data.train="$tmp/train_*.bin" --training.seq_len=64
expect_fail '>= vocab_size' "$bin" train "${tiny[@]}" --data.train="$tmp/train_*.bin" --model.vocab_size=50
expect_fail "$tmp/nope/config.json" "$bin" train "${tiny[@]}" --data.train="$tmp/train_*.bin" --model.init_from="$tmp/nope"
expect_fail "$tmp/nockpt" "$bin" train "${tiny[@]}" --data.train="$tmp/train_*.bin" --checkpoint.resume="$tmp/nockpt"
expect_fail '--config needs a file' "$bin" train --config
expect_fail 'cannot open config file' "$bin" train --config "$tmp/missing.ini"
printf '[training]\nsteps = 1\n[bogus]\nkey = 2\n' > "$tmp/bad.ini"
expect_fail 'bad.ini:4' "$bin" train --config "$tmp/bad.ini"
# (a missing directory is made; one under a regular file cannot be)
expect_fail 'logging.metrics' "$bin" train "${tiny[@]}" --data.train="$tmp/train_*.bin" --logging.metrics="$tmp/train_000000.bin/dir/m.jsonl"
expect_fail '--checkpoint and --prompt are required' "$bin" generate --prompt hi
expect_fail 'unknown option' "$bin" generate --checkpoint "$tmp" --prompt hi --bogus 1
expect_fail "$tmp/config.json" "$bin" generate --checkpoint "$tmp" --prompt hi --vocab "$tmp"
expect_fail '--checkpoint and --out are required' "$bin" export --out "$tmp/x"
expect_fail "$tmp/nope/config.json" "$bin" export --checkpoint "$tmp/nope" --out "$tmp/x"
expect_fail 'encoder.json' "$bin" prepare --vocab "$tmp" --out "$tmp/out" "$tmp/train_000000.bin"
# bad tokenizer files for prepare --tokenizer (tests/test_tokenizer_json.c has the full list)
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merg' > "$tmp/truncated.json"
printf '{"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "WordPiece", "vocab": {}}}' > "$tmp/wordpiece.json"
printf '{"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(?<"}, "behavior": "Isolated"}, {"type": "ByteLevel"}]}, "model": {"type": "BPE", "vocab": {}}}' > "$tmp/badregex.json"
expect_fail 'truncated.json:1: not valid JSON' "$bin" prepare --tokenizer "$tmp/truncated.json" --out "$tmp/out" "$tmp/train_000000.bin"
expect_fail 'model type "WordPiece" is not supported' "$bin" prepare --tokenizer "$tmp/wordpiece.json" --out "$tmp/out" "$tmp/train_000000.bin"
expect_fail 'bad regex "(?<"' "$bin" prepare --tokenizer "$tmp/badregex.json" --out "$tmp/out" "$tmp/train_000000.bin"
expect_fail "$tmp/none.json: cannot open" "$bin" prepare --tokenizer "$tmp/none.json" --out "$tmp/out" "$tmp/train_000000.bin"
# SentencePiece-style (byte_fallback) with a normalizer it does not read: the message names it
printf '{"normalizer": {"type": "Precompiled", "precompiled_charsmap": ""}, "pre_tokenizer": null, "model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0}, "merges": []}}' > "$tmp/precompiled.json"
expect_fail 'normalizer "Precompiled" is not supported' "$bin" prepare --tokenizer "$tmp/precompiled.json" --out "$tmp/out" "$tmp/train_000000.bin"
expect_fail 'give one of --vocab DIR' "$bin" prepare --out "$tmp/out" "$tmp/train_000000.bin"
# a uint32 shard (magic 20240801) with a token past the vocabulary: shard, position, byte offset
/usr/bin/python3 - "$tmp/u32/train_000000.bin" <<'PY'
import os, struct, sys
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
toks = [i % 97 for i in range(5000)]
toks[4321] = 70000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240801, 7, len(toks)] + [0] * 253)))
    f.write(struct.pack("<%dI" % len(toks), *toks))
PY
expect_fail "train_000000.bin: token 70000 at position 4321 (byte offset 18308) is >= vocab_size 97" "$bin" train "${tiny[@]}" --data.train="$tmp/u32/train_*.bin"

# a checkpoint that fails to load is not overwritten by the failed run
"$bin" train "${tiny[@]}" --data.train="$tmp/train_*.bin" --checkpoint.dir="$tmp/ck" >/dev/null 2>&1 || { echo "FAIL: tiny training run"; fail=$((fail+1)); }
printf 'garbage' > "$tmp/ck/step_00000001/shard-00000-of-00001.safetensors"
sum_before="$(cat "$tmp"/ck/step_00000001/* | md5sum)"
expect_fail 'shard-00000-of-00001.safetensors' "$bin" train "${tiny[@]}" --data.train="$tmp/train_*.bin" --checkpoint.dir="$tmp/ck" --checkpoint.resume=latest --training.steps=2
sum_after="$(cat "$tmp"/ck/step_00000001/* | md5sum)"
if [ "$sum_before" = "$sum_after" ] && [ ! -e "$tmp/ck/step_00000002" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: failed resume changed the checkpoint directory"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
