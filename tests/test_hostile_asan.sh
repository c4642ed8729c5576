#!/bin/bash
# test_hostile_asan.sh: builds tests/test_hostile.c standalone with AddressSanitizer and
# UndefinedBehaviorSanitizer (tests/asan_common.sh; any report is fatal) and runs it, so that the
# hostile sizes and inputs (long values, non-regular files, hostile checkpoint indexes whose block
# bounds overflow, truncated shards) are refused without an out-of-bounds read or an overflow.
# (A checkpoint opened here has no group: the MPI layer is linked, never initialised.)
# CTest passes the pentatron binary as $1 (unused).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/asan_common.sh"
pt_asan_run test_hostile_asan "jansson cmocka inih zlib ompi-c" \
    tests/test_hostile.c tests/testutil.c src/train/config.c src/train/checkpoint.c \
    src/train/metrics.c src/train/resume.c src/train/optim.c src/data/shards.c src/data/mix.c src/io/safetensors.c \
    src/io/hf_config.c src/comm/comm.c src/comm/comm_names.c src/comm/comm_mpi.c src/comm/comm_hier.c src/comm/comm_device.c src/comm/comm_stage.c src/comm/comm_nccl_absent.c src/comm/flight.c src/parallel/mesh.c src/core/core.c src/core/trace.c
