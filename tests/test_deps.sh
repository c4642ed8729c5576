#!/usr/bin/env bash
# test_deps.sh PENTATRON: the architecture rules of the code base, checked two ways:
#   A. the #include graph of src/**/*.{c,cu,h} and include/pt/*.h ("pt/x.h" is include/pt/x.h,
#      "dir/x.h" is src/dir/x.h), followed transitively through project headers;
#   B. the symbol graph of the object files of the build (nm: file A -> file B when A uses a
#      global symbol that B defines), the objects being CMakeFiles/pentatron{_core,}.dir/src/**.{c,cu}.o
#      in the directory of PENTATRON.
# Prints one line per violation ("FAIL [RULE] ..." naming the files, lines and symbols), then
# "N passed, M failed" (one check per rule, plus the sanity checks S1-S3 that make sure no rule
# passes vacuously: sources parsed, every source has an up-to-date object, the graphs are not empty)
# and exits 1 if anything failed. The logic is tests/ref/deps_graph.py (needs /usr/bin/python3 and nm).
set -u

# Layers: NAME  GLOBS... (relative to the source dir; "*" also matches "/"). A layer's public
# headers belong to it. A file may be in several layers.
LAYERS='
model     src/model/*      include/pt/model.h include/pt/parallel_ops.h
comm      src/comm/*       include/pt/comm.h
parallel  src/parallel/*   include/pt/mesh.h include/pt/data_parallel.h include/pt/pipeline.h include/pt/schedule.h include/pt/layout.h include/pt/tensor_parallel.h include/pt/context_parallel.h include/pt/expert_parallel.h
pmods     src/parallel/tensor_parallel.c src/parallel/context_parallel.c src/parallel/expert_parallel.c
train     src/train/*      include/pt/trainer.h include/pt/optim.h include/pt/checkpoint.h include/pt/config.h include/pt/metrics.h
mpi       src/comm/comm_mpi.c
backend   src/backend/*
'
# Rules: ID  METHOD  FILES  MUST-NOT-REACH...  : WHY
#   METHOD includes        FILES (a layer, !layer = every project file outside it, * = all) must not
#                          #include, directly or through project headers, a file of a layer or a
#                          system header <x.h>
#   METHOD symbols         FILES' objects must not use a symbol defined by an object of a layer, nor
#                          any undefined symbol matching /regex/ (Python syntax, no spaces)
#   METHOD include-cycles  no cycle in the #include graph among FILES
#   METHOD symbol-cycles   no cycle in the object graph among FILES (a.c uses b.c which uses a.c)
# A rule whose FILES or MUST-NOT-REACH match nothing fails (vacuous) instead of passing.
RULES='
A1  includes        model     comm parallel train   : the model is plain math: no communication, parallelism or training
A2  includes        !mpi      <mpi.h>               : MPI stays behind pt/comm.h (comm_mpi.c alone)
A3  includes        parallel  train                 : parallelism does not know the trainer, optimizer, checkpoints, config
A4  include-cycles  *                               : the headers form a DAG
A5  includes        backend   model comm parallel train : a backend computes: it knows no model, communication, parallelism or training
B1  symbols         model     comm parallel train /^pt_(comm|allreduce|allgather|reduce_scatter|mesh)/ : the model calls no communication, parallelism or training code
B2  symbols         parallel  train                 : parallelism calls no trainer, optimizer, checkpoint or config code
B3  symbols         !mpi      /^(P?MPI_|ompi_|mpi_|pmpi_)/ : only comm_mpi.c calls MPI
B5  symbols         pmods     model                 : the tensor, context and expert modules never call the model (backend kernels only)
B6  symbols         backend   model comm parallel train : a backend (the CPU one, the CUDA one) calls only core and its own files
B4  symbol-cycles   *                               : no two files call each other, even through others
'

# Sources a build's configuration may leave out (PT_CUDA): the CUDA backend's .cu files without
# the toolkit, absent.c (the refusal that stands in for them) with it; likewise the NCCL comm
# backend (comm_nccl.c with NCCL's header, comm_nccl_absent.c without).
OPTIONAL='src/backend/cuda/*.cu src/backend/cuda/absent.c src/comm/comm_nccl.c src/comm/comm_nccl_absent.c'

bin="${1:-}"
if [ -z "$bin" ]; then
  echo "usage: bash tests/test_deps.sh PATH/TO/pentatron" >&2; exit 2
fi
build="$(cd "$(dirname "$bin")" 2>/dev/null && pwd)" || { echo "FAIL: no build directory for '$bin'" >&2; exit 1; }
src="${PT_SOURCE_DIR:-$(dirname "$0")/..}"
src="$(cd "$src" && pwd)" || { echo "FAIL: source dir '$src' not found" >&2; exit 1; }
exec /usr/bin/python3 "$(dirname "$0")/ref/deps_graph.py" --src "$src" --build "$build" \
  --layers "$LAYERS" --rules "$RULES" --optional "$OPTIONAL"
