#!/bin/bash
# test_safetensors_asan.sh: builds tests/test_safetensors.c standalone with AddressSanitizer and
# UndefinedBehaviorSanitizer (tests/asan_common.sh; any report is fatal) and runs it, so that the
# hostile-file and fuzzing tests also prove that no read goes out of bounds.
# CTest passes the pentatron binary as $1 (unused).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/asan_common.sh"
pt_asan_run test_safetensors_asan "jansson cmocka" \
    tests/test_safetensors.c tests/testutil.c src/io/safetensors.c src/io/hf_config.c src/core/core.c
