#!/bin/bash
# test_fuzz_asan.sh: builds tests/test_fuzz.c standalone with AddressSanitizer and
# UndefinedBehaviorSanitizer (tests/asan_common.sh; any report is fatal, leaks included) and runs
# it: seeded mutations of every parser's input (config file and command line, config.json, a
# checkpoint's index.json, token shards, tokenizer.json and .tiktoken, safetensors headers) must
# give an error with a message or a usable result, never an out-of-bounds access, an overflow, a
# leak or a hang. PT_FUZZ_ITERS inputs per parser (default 600: about 30 s here, compiling
# included); docs/guide.md section 10 gives the longer run. (The MPI layer is linked for the
# checkpoint module, never initialised.)
# CTest passes the pentatron binary as $1 (unused).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/asan_common.sh"
pt_asan_run test_fuzz_asan "jansson cmocka inih zlib ompi-c libpcre2-8 libutf8proc" \
    tests/test_fuzz.c tests/testutil.c src/train/config.c src/train/checkpoint.c \
    src/train/metrics.c src/train/resume.c src/train/optim.c src/data/shards.c src/data/mix.c src/io/safetensors.c src/io/hf_config.c \
    src/data/bpe.c src/data/tokenizer_json.c src/data/unicode_tables.c \
    src/comm/comm.c src/comm/comm_names.c src/comm/comm_mpi.c src/comm/comm_hier.c src/comm/comm_device.c src/comm/comm_stage.c src/comm/comm_nccl_absent.c src/comm/flight.c src/parallel/mesh.c src/core/core.c src/core/trace.c
