#!/bin/bash
# test_safetensors_asan.sh: builds tests/test_safetensors.c standalone with AddressSanitizer and
# UndefinedBehaviorSanitizer (any report is fatal) and runs it, so that the hostile-file and
# fuzzing tests also prove that no read goes out of bounds.
#
# CTest passes the pentatron binary as $1 (unused). PT_SOURCE_DIR is the source tree (default: the
# parent of this script's folder); CC overrides the compiler (default gcc).
set -euo pipefail

src=${PT_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cc=${CC:-gcc}
work=$(mktemp -d "${TMPDIR:-/tmp}/pt_st_asan_XXXXXX")
trap 'rm -rf "$work"' EXIT

san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# shellcheck disable=SC2046,SC2086
"$cc" -std=gnu17 -g -O1 -Wall -Wextra -fopenmp $san \
    -I"$src/include" -I"$src/src" -I"$src/tests" $(pkg-config --cflags jansson cmocka) \
    "$src/tests/test_safetensors.c" "$src/tests/testutil.c" "$src/src/io/safetensors.c" \
    "$src/src/io/hf_config.c" "$src/src/core/core.c" \
    -o "$work/test_safetensors_asan" $(pkg-config --libs jansson cmocka) -lm

export ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:exitcode=86:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=87
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# cmocka exits with the number of failed tests; the sanitizers exit 86 (ASan) or 87 (UBSan).
"$work/test_safetensors_asan"
