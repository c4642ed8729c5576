# asan_common.sh: sourced by tests/test_*_asan.sh. pt_asan_run NAME "PKG..." SOURCE... compiles
# the sources (paths relative to the source tree) into one program with AddressSanitizer and
# UndefinedBehaviorSanitizer (any report is fatal, leaks included) and runs it; cmocka exits with
# the number of failed tests, the sanitizers with 86 (ASan) or 87 (UBSan).
#
# PT_SOURCE_DIR is the source tree (default: the parent of this file's folder); CC overrides the
# compiler (default gcc).
pt_asan_run() {
    local name=$1 pkgs=$2
    shift 2
    local src=${PT_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
    local work
    work=$(mktemp -d "${TMPDIR:-/tmp}/pt_asan_XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" EXIT
    local san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
    local files=()
    for f in "$@"; do files+=("$src/$f"); done
    # shellcheck disable=SC2046,SC2086
    "${CC:-gcc}" -std=gnu17 -g -O1 -Wall -Wextra -fopenmp $san \
        -I"$src/include" -I"$src/src" -I"$src/tests" $(pkg-config --cflags $pkgs) \
        "${files[@]}" -o "$work/$name" $(pkg-config --libs $pkgs) -lm
    export ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:exitcode=86:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=87
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    "$work/$name"
}
