#!/usr/bin/env bash
# bf16_matrix.sh [PENTATRON]: the full bf16 × recompute × layout matrix (tests/test_bf16.sh with
# PT_BF16_FULL=1): every bf16 layout of the CI subset plus 13 more (ZeRO-2 and 3 over 4 ranks, an
# AFAB pipeline, dp × pp zero bubble,
# dp × tp ZeRO-2 with sp, dp·tp·pp on 16 ranks, cp 4 contiguous, cp × tp with sp, dp·pp·cp·tp on
# 16 ranks; MoE: tp 2, ep 4 over dp 2 × cp 2, ep 2 × pp 2 with ZeRO-1, dp·pp·cp·tp·ep on 16
# ranks), each against the single-process bf16 run (gradients ≤ 0.1× bf16's distance from fp32)
# and each in the three recompute modes (byte-identical). About 20 minutes on 2 cores. CI runs the
# subset (docs/precision.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/build/pentatron}"
[ -x "$bin" ] || "$root/scripts/build.sh" "$root/build" >/dev/null
PT_BF16_FULL=1 PT_SOURCE_DIR="$root" bash "$root/tests/test_bf16.sh" "$bin"
