#!/usr/bin/env bash
# gpu_layouts.sh PENTATRON [DEVICE] [MAX]: layouts of the 5D matrix (tests/test_5d.sh) with
# training.device = DEVICE (cuda, the default) against the one-process run on that device, to the
# CPU matrix's tolerances (step-1 gradients per tensor ‖Δ‖/‖g‖ ≤ 1e-5, 10 losses ≤ 1e-4 relative,
# tests/ref/compare_runs.py). Run by scripts/gpu_check.sh on a machine with one GPU: 4 and 8 ranks
# share it, their device memory over MPI through host copies (comm.backend = mpi); where the
# machine has as many GPUs as ranks, the same layouts over NCCL (comm.backend = nccl) follow.
# DEVICE = cpu runs the same list on CPUs (the check's dry run: the script's own logic); MAX: at
# most that many layouts per part (default all). Prints one line per layout ("LAYOUT name ranks
# backend: ok|FAIL ..."), then "gpu_layouts: P passed, F failed"; exit 0 when none failed, 77 when
# DEVICE = cuda and no GPU can be used.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
dev="${2:-cuda}" max="${3:-99}"
if [ "$dev" = cuda ] && ! nvidia-smi -L 2> /dev/null | grep -q '^GPU '; then
  echo "skipped: no GPU"; exit 77
fi
gpus=0; [ "$dev" = cuda ] && gpus="$(nvidia-smi -L | grep -c '^GPU ')"
export PT_CUDA_ARENA_MB="${PT_CUDA_ARENA_MB:-3072}" # each rank's share: the tiny model needs little
P=--parallel
L4=(--model.n_layers=4 --training.device="$dev")
moe=(--model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.n_shared_experts=1 --model.aux_loss_coef=0.05
     --model.z_loss_coef=0.01 --training.device="$dev")
run 1 ref "${L4[@]}" --training.micro_batch=8 || { echo "FAIL: dense reference: $(tail -3 "$tmp/ref.log")"; exit 1; }
run 1 mref "${moe[@]}" --training.micro_batch=8 || { echo "FAIL: MoE reference: $(tail -3 "$tmp/mref.log")"; exit 1; }
echo "references: $(grep -m1 -o 'backend: [^;]*' "$tmp/ref.log")"
# layout NP NAME REF BACKEND ARGS...
layout() {
  local np="$1" name="$2" ref="$3" be="$4"; shift 4
  local t0=$SECONDS
  if run "$np" "$name" --comm.backend="$be" "$@"; then
    if msg="$(compare "$ref" "$name" 2>&1)"; then ok; echo "LAYOUT $name $np $be: ok ($msg, $((SECONDS - t0)) s)"
    else bad "$name"; echo "LAYOUT $name $np $be: FAIL ($msg)"; fi
  else
    bad "$name"; echo "LAYOUT $name $np $be: FAIL (exit: $(grep -m3 -iE 'error|fatal' "$tmp/$name.log" | tr '\n' ' '))"
  fi
}
# the list: 4 ranks, then 8 (each a row of test_5d's matrix or its 4-rank cut)
list=(
  "4 dp2_tp2_sp_z1 ref $P.dp=2 $P.tp=2 $P.sp=true $P.zero=1 --training.micro_batch=4"
  "4 pp2_cp2_1f1b ref $P.pp=2 $P.cp=2 $P.pp_schedule=1f1b --training.micro_batch=2"
  "4 dp4_z3 ref $P.dp=4 $P.zero=3 --training.micro_batch=2"
  "4 moe_dp2_ep2_tp2 mref $P.dp=2 $P.ep=2 $P.tp=2 --training.micro_batch=4"
  "8 dp2_tp2_pp2_1f1b_z1 ref $P.dp=2 $P.tp=2 $P.pp=2 $P.pp_schedule=1f1b $P.zero=1 --training.micro_batch=2"
  "8 dp2_cp2_tp2_sp_z1 ref $P.dp=2 $P.cp=2 $P.tp=2 $P.sp=true $P.zero=1 --training.micro_batch=2"
  "8 pp2_cp2_tp2_interleaved ref $P.pp=2 $P.cp=2 $P.tp=2 $P.pp_schedule=interleaved $P.pp_virtual=2 --training.micro_batch=2"
  "8 dp4_tp2_z2 ref $P.dp=4 $P.tp=2 $P.zero=2 --training.micro_batch=1"
  "8 dp2_pp2_cp2_zb_z1 ref $P.dp=2 $P.pp=2 $P.cp=2 $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1"
  "8 moe_dp2_pp2_tp2_ep2_zb_z1 mref $P.dp=2 $P.pp=2 $P.tp=2 $P.ep=2 $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1"
)
part() { # part BACKEND MOST_RANKS
  local n=0 row
  for row in "${list[@]}"; do
    read -r np name ref rest <<< "$row"
    [ "$np" -le "$2" ] && [ "$n" -lt "$max" ] || continue
    n=$((n + 1))
    # shellcheck disable=SC2086  # the row's keys
    if [ "$ref" = mref ]; then layout "$np" "$name" mref "$1" "${moe[@]}" $rest
    else layout "$np" "$name" ref "$1" "${L4[@]}" $rest; fi
  done
}
part mpi 8
if [ "$gpus" -ge 4 ]; then part nccl "$gpus"; else echo "NCCL layouts: skipped (${gpus} GPU: NCCL needs one a rank)"; fi
echo "gpu_layouts: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
