#!/usr/bin/env bash
# test_nccl_host.sh PENTATRON: the NCCL comm backend's host logic (src/comm/comm_nccl.c) on CPUs,
# NCCL and the GPU behind stand-ins over MPI (tests/nccl_host_ranks.c, whose header says what they
# model: in-order streams, events seen late, NCCL's in-place conventions, sends and receives
# matched in posting order between a pair):
#   - 4 ranks and 3 ranks: the world's communicator from rank 0's unique id (every rank checks it
#     was given the same one); every operation on device memory (all-reduce fp32 and bf16,
#     reduce-scatter and all-gather in place and not, broadcast, all-to-all-v with empty rows,
#     sends and receives posted in different orders on the two sides of a pair) against its
#     formula; host memory over MPI on the same group; calls and bytes counted as MPI's; a split
#     (ranks reversed by key) and a dup, each with its NCCL communicator split from its parent's;
#     streams and events all freed;
#   - a rank that skips an all-reduce: the others' wait times out (2 s), aborts the communicator
#     (ncclCommAbort) and ends the job naming the group and the operation;
#   - an asynchronous NCCL error: the job ends with one message naming the group;
#   - training over the backend and the stand-ins (nccl_host_ranks train: the guarded CPU
#     backend's memory as the device's), 8 ranks, each reproducing the single-process run
#     (step-1 gradients ‖Δ‖/‖g‖ ≤ 1e-5, 10 losses ≤ 1e-4 relative): MoE dp2·pp2·tp2·ep2 with 1F1B
#     and ZeRO-1 (pipeline sends and receives, the tensor-parallel ring, expert dispatch as
#     all-to-all, bucket reduce-scatters and all-gathers), and dense pp2·cp2·tp2 interleaved (ring
#     attention's transfers, the interleaved schedule's): the modules' own posting order of sends
#     and receives, matched in order between each pair as NCCL matches them, and their waits on
#     in-order streams, neither mismatched nor deadlocked.
# Skipped (exit 77) in a build without NCCL's header (the backend is then comm_nccl_absent.c).
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
ranks="${PT_BINARY_DIR:-$(dirname "$bin")}/tests/nccl_host_ranks"
[ -x "$ranks" ] || ranks="$(dirname "$bin")/tests/nccl_host_ranks"
if ! [ -x "$ranks" ]; then echo "test_nccl_host: skipped: built without NCCL (no nccl_host_ranks)"; exit 77; fi
for np in 4 3; do
  out="$(timeout 60 mpiexec -np $np "$ranks" ops 2>&1)"; rc=$?
  if [ $rc -eq 0 ] && grep -q "nccl_host: .* checks passed on each rank, 0 failed" <<<"$out"; then ok
  else bad "$np ranks: exit $rc: $(grep -m5 -E "FAIL|rror" <<<"$out")"; fi
done
t0=$SECONDS
out="$(timeout 60 mpiexec -np 4 "$ranks" hang 2>&1)"; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $((SECONDS - t0)) -lt 40 ] &&
   grep -q 'aborting its NCCL communicator (ncclCommAbort)' <<<"$out" &&
   grep -q 'fake NCCL: ncclCommAbort' <<<"$out" &&
   grep -q 'all-reduce over group "world"' <<<"$out"; then ok
else bad "hang: exit $rc after $((SECONDS - t0)) s: $(grep -m5 -iE "abort|group|error" <<<"$out")"; fi
out="$(timeout 60 mpiexec -np 2 "$ranks" async 2>&1)"; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
   grep -q 'NCCL: asynchronous error on group "world"' <<<"$out"; then ok
else bad "async error: exit $rc: $(grep -m5 -iE "nccl|error" <<<"$out")"; fi
P=--parallel
moe=(--model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.n_shared_experts=1 --model.aux_loss_coef=0.05
     --model.z_loss_coef=0.01)
run 1 mref "${moe[@]}" --training.micro_batch=8 || bad "MoE reference failed: $(tail -3 "$tmp/mref.log")"
run 1 ref --model.n_layers=4 --training.micro_batch=8 || bad "dense reference failed: $(tail -3 "$tmp/ref.log")"
pentatron="$bin"; bin="$ranks" # `run` starts "$bin" train ...: nccl_host_ranks train ...
export PT_BACKEND_GUARD=1
check 8 nccl_moe_dp2_pp2_tp2_ep2_1f1b_z1 mref "${moe[@]}" $P.dp=2 $P.pp=2 $P.tp=2 $P.ep=2 \
  $P.pp_schedule=1f1b $P.zero=1 --training.micro_batch=2
check 8 nccl_pp2_cp2_tp2_interleaved ref --model.n_layers=4 $P.pp=2 $P.cp=2 $P.tp=2 \
  $P.pp_schedule=interleaved $P.pp_virtual=2 --training.micro_batch=2
bin="$pentatron"
echo "test_nccl_host: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
