#!/bin/bash
# test_flight_asan.sh: tests/test_flight.c (the flight recorder, the hang verdict, `trace why` and
# its fuzzing of flight files) built with AddressSanitizer and UndefinedBehaviorSanitizer
# (tests/asan_common.sh; any report is fatal, leaks included). (The MPI layer is linked for the
# diagnosis channel, never initialised.)
# CTest passes the pentatron binary as $1 (unused).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/asan_common.sh"
pt_asan_run test_flight_asan "jansson cmocka ompi-c" \
    tests/test_flight.c tests/testutil.c src/comm/flight.c src/comm/comm.c src/comm/comm_names.c src/comm/comm_mpi.c \
    src/comm/comm_hier.c src/core/core.c src/core/trace.c
