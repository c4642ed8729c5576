#!/usr/bin/env bash
# test.sh: installs what is missing, builds with warnings as errors, runs every test through CTest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build" -DPT_WERROR=ON
cd "$root/build"
# -j2: the tests that take both cores (PROCESSORS 2, tests/CMakeLists.txt) still run alone; the
# single-core reference tests run two at a time
ctest --output-on-failure --timeout 600 -j2 "$@"
