#!/bin/bash
# test_tokenizer_json_asan.sh: builds tests/test_tokenizer_json.c standalone with AddressSanitizer
# and UndefinedBehaviorSanitizer (tests/asan_common.sh) and runs its test_file_* tests: bad
# tokenizer.json and tiktoken files, truncated files, invalid UTF-8, the hostile text, prepare's
# uint32 shards and bad shards, its JSON Lines, gzip and zstd inputs whole, cut and corrupt; so the
# parsers, the decompression and the encoder prove that no read goes out of
# bounds and nothing leaks. (The reference comparisons need node and run in test_tokenizer_json.)
# CTest passes the pentatron binary as $1 (unused).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/asan_common.sh"
export PT_TEST_FILTER='test_file_*'
pt_asan_run test_tokenizer_json_asan "jansson cmocka libpcre2-8 libutf8proc zlib libzstd" \
    tests/test_tokenizer_json.c tests/testutil.c src/data/bpe.c src/data/tokenizer_json.c \
    src/data/unicode_tables.c src/data/shards.c src/cli/prepare.c src/cli/prepare_input.c src/core/core.c
