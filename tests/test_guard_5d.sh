#!/usr/bin/env bash
# test_guard_5d.sh PENTATRON: the five parallelisms composed on 16 ranks under the backend guard
# (PT_BACKEND_GUARD=1, src/backend/cpu/guard.c): backend memory is inaccessible outside backend
# calls and communication, so any code that reads or writes it directly dies of SIGSEGV.
#   - the guarded single-process reference, and dp2·pp2·cp2·tp2 with ep 2, zero bubble and ZeRO-1
#     (test_5d's moe_5d_ep2_zb_z1), guarded, reproducing it;
#   - two 8-rank layouts for the other data-parallel paths (ZeRO-3 with tp, sp, ep and cp; ZeRO-0
#     over dp × cp with a pipeline), each reproducing the reference, guarded and staged: with
#     PT_BACKEND_GUARD_LINK=1 the guarded backend offers a device link, its memory is then device
#     memory to the comm layer, which moves it over MPI through host copies (comm.backend = mpi
#     over device memory, src/comm/comm_stage.c: how ranks share a GPU). A staged group takes no
#     guard hold for MPI, so a path that hands device memory to MPI unstaged dies too, and a
#     result not copied back shows in the numbers;
#   - bf16 with bf16 gradient sums (MPI's bf16 reduction on the staged copies), dp2·pp2·tp2
#     interleaved, ZeRO-2, staged: its losses and step-1 gradients bitwise those of the same layout
#     guarded unstaged (staging changes no arithmetic); the log says which path device memory
#     takes;
#   - the same 16-rank layout without the guard reproduces it too, with bitwise the losses of the guarded
#     run (the guard changes no arithmetic), and only the guarded runs say the guard is on.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
P=--parallel
moe=(--model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.n_shared_experts=1 --model.aux_loss_coef=0.05
     --model.z_loss_coef=0.01)
full=($P.dp=2 $P.pp=2 $P.cp=2 $P.tp=2 $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1)
banner="PT_BACKEND_GUARD=1: backend memory is inaccessible"

# explain NAME: the first rank's fault in a guarded run's log, its frames in pentatron named
# (lines with a -g build; PT_BACKEND_GUARD=report lists every offending access instead of dying)
explain() {
  local log="$tmp/$1.log" who
  who="$(grep -m1 -F "*** Process received signal ***" "$log" 2>/dev/null | sed 's/\].*/]/')"
  [ -n "$who" ] || return 0
  grep -F "$who" "$log" | grep -E "Failing at|Signal code"
  command -v addr2line >/dev/null || return 0
  grep -F "$who" "$log" | grep -o "pentatron(+0x[0-9a-f]*)" | grep -o "0x[0-9a-f]*" |
    xargs -r addr2line -f -i -C -e "$bin" | paste - - | sed 's/^/  at /'
}

t0=$SECONDS
PT_BACKEND_GUARD=1 run 1 mref "${moe[@]}" --training.micro_batch=8 ||
  { bad "guarded MoE reference failed: $(tail -3 "$tmp/mref.log")"; explain mref; }
echo "guarded reference: $((SECONDS - t0)) s"
t0=$SECONDS
PT_BACKEND_GUARD=1 check 16 guarded_moe_5d_ep2_zb_z1 mref "${moe[@]}" "${full[@]}" $P.ep=2
explain guarded_moe_5d_ep2_zb_z1
echo "guarded 16 ranks: $((SECONDS - t0)) s"
# and the data-parallel paths the layout above does not take: ZeRO-0 (its all-gather half) over
# dp × cp with a pipeline, ZeRO-3 with experts, tp and sp; staged (device memory over MPI)
t0=$SECONDS
staged="comm: device memory over MPI through page-locked host copies"
PT_BACKEND_GUARD=1 PT_BACKEND_GUARD_LINK=1 check 8 guarded_moe_dp2_cp2_tp2_ep2_sp_z3 mref "${moe[@]}" \
  $P.dp=2 $P.cp=2 $P.tp=2 $P.ep=2 $P.sp=true $P.zero=3 --training.micro_batch=2
explain guarded_moe_dp2_cp2_tp2_ep2_sp_z3
PT_BACKEND_GUARD=1 PT_BACKEND_GUARD_LINK=1 check 8 guarded_moe_dp2_pp2_cp2_afab_z0 mref "${moe[@]}" \
  $P.dp=2 $P.pp=2 $P.cp=2 $P.pp_schedule=afab $P.zero=0 --training.micro_batch=2
explain guarded_moe_dp2_pp2_cp2_afab_z0
echo "guarded staged 8 ranks (ZeRO-3, ZeRO-0): $((SECONDS - t0)) s"
t0=$SECONDS
b16=(--model.n_layers=4 --training.precision=bf16 $P.grad_reduce=bf16 $P.dp=2 $P.pp=2 $P.tp=2
     $P.pp_schedule=interleaved $P.pp_virtual=2 $P.zero=2 --training.micro_batch=1)
PT_BACKEND_GUARD=1 PT_BACKEND_GUARD_LINK=1 run 8 staged_bf16 "${b16[@]}" ||
  { bad "staged bf16 run failed: $(tail -3 "$tmp/staged_bf16.log")"; explain staged_bf16; }
PT_BACKEND_GUARD=1 run 8 guarded_bf16 "${b16[@]}" || bad "guarded bf16 run failed: $(tail -3 "$tmp/guarded_bf16.log")"
echo "bf16 staged and unstaged, 8 ranks: $((SECONDS - t0)) s"
for name in guarded_moe_dp2_cp2_tp2_ep2_sp_z3 guarded_moe_dp2_pp2_cp2_afab_z0 staged_bf16; do
  grep -qF "$staged" "$tmp/$name.log" && ok || bad "$name: the log does not say device memory is staged"
done
grep -qF "$staged" "$tmp/guarded_bf16.log" && bad "the unstaged run says it stages" || ok
t0=$SECONDS
PT_BACKEND_GUARD= check 16 plain_moe_5d_ep2_zb_z1 mref "${moe[@]}" "${full[@]}" $P.ep=2
echo "plain 16 ranks: $((SECONDS - t0)) s"

for name in mref guarded_moe_5d_ep2_zb_z1 guarded_moe_dp2_cp2_tp2_ep2_sp_z3 guarded_moe_dp2_pp2_cp2_afab_z0 staged_bf16 guarded_bf16; do
  grep -qF "$banner" "$tmp/$name.log" 2>/dev/null && ok || bad "$name: the guard was not on"
done
grep -qF "$banner" "$tmp/plain_moe_5d_ep2_zb_z1.log" 2>/dev/null &&
  bad "the plain run says the guard is on" || ok
losses() { "$PY" -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1])])' "$1"; }
if [ -s "$tmp/guarded_moe_5d_ep2_zb_z1.jsonl" ] && [ -s "$tmp/plain_moe_5d_ep2_zb_z1.jsonl" ] &&
   [ "$(losses "$tmp/guarded_moe_5d_ep2_zb_z1.jsonl")" = "$(losses "$tmp/plain_moe_5d_ep2_zb_z1.jsonl")" ]; then
  ok
else
  bad "the guarded and plain runs' losses differ (or a run is missing)"
fi
if [ -s "$tmp/staged_bf16.jsonl" ] && [ "$(losses "$tmp/staged_bf16.jsonl")" = "$(losses "$tmp/guarded_bf16.jsonl")" ] &&
   cmp -s "$tmp/staged_bf16.st" "$tmp/guarded_bf16.st"; then ok
else bad "bf16: the staged run's losses or step-1 gradients are not bitwise the unstaged run's"; fi

echo "test_guard_5d: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
