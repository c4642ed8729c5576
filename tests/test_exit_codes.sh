#!/usr/bin/env bash
# test_exit_codes.sh PENTATRON: one classification of exit statuses for every command
# (docs/guide.md, "Running unattended"): 2 = refused before the work started (arguments,
# configuration, layout, input files, output paths), 1 = failed while working, 75 = preempted
# after a save (tests/test_signals.sh). Also under mpiexec (every rank agrees, or one rank's own
# refusal ends the job with MPI_Abort(2): mpiexec exits 2 either way), and `pentatron launch`
# never restarts a 2 and caps --restarts at 1000. (A failure while running, exit 1: the truncated
# shard of tests/test_hostile_cli.sh.)
set -u
source "$(dirname "$0")/parallel_common.sh" # MPI environment, shard, tiny, ok, bad

# code WANT NEEDLE CMD...: CMD exits WANT within 60 s, printing NEEDLE
code() {
  local want="$1" needle="$2"; shift 2
  local out rc
  out="$(timeout -k 5 60 "$@" 2>&1)"; rc=$?
  if [ $rc -eq "$want" ] && grep -qF -- "$needle" <<<"$out"; then ok
  else bad "[${*:1:6}...] exit $rc, want $want and '$needle': $(grep -v '^\[rank 0\] *step' <<<"$out" | tail -3 | cut -c1-300)"; fi
}
np2=(timeout -k 5 60 mpiexec -np 2)
dp2=(--parallel.dp=2 --training.micro_batch=4)

# train, 1 and 2 ranks: a bad value, a layout that cannot work, a missing data file, a model
# directory that is not there (every rank's own error: MPI_Abort with 2 under mpiexec)
for np in 1 2; do
  l=(); extra=(); [ $np -gt 1 ] && l=("${np2[@]}") && extra=("${dp2[@]}")
  code 2 "training.steps" "${l[@]}" "$bin" train "${tiny[@]}" "${extra[@]}" --training.steps=abc
  code 2 "model.n_heads" "${l[@]}" "$bin" train "${tiny[@]}" "${extra[@]}" --model.n_heads=3
  code 2 "does not match the world size" "${l[@]}" "$bin" train "${tiny[@]}" "${extra[@]}" --parallel.tp=4
  code 2 "no file matches" "${l[@]}" "$bin" train "${tiny[@]}" "${extra[@]}" --data.train="$tmp/none_*.bin"
  code 2 "$tmp/nope/config.json" "${l[@]}" "$bin" train "${tiny[@]}" "${extra[@]}" --model.init_from="$tmp/nope"
done

# training.device = cuda without a usable GPU: refused on one rank and on every rank of two (any
# number of ranks is a layout on GPUs now); comm.backend = nccl on CPUs, and an unknown backend
if ! nvidia-smi -L >/dev/null 2>&1; then
  code 2 "training.device = cuda" "$bin" train "${tiny[@]}" --training.device=cuda
  code 2 "training.device = cuda: no CUDA device" "${np2[@]}" "$bin" train "${tiny[@]}" "${dp2[@]}" --training.device=cuda
fi
code 2 "comm.backend = nccl needs training.device = cuda" "${np2[@]}" "$bin" train "${tiny[@]}" "${dp2[@]}" --comm.backend=nccl
code 2 "comm.backend" "$bin" train "${tiny[@]}" --comm.backend=gloo
code 2 "training.device" "$bin" train "${tiny[@]}" --training.device=tpu

# the other commands: bad arguments or input
code 2 "unknown command" "$bin" trian
code 2 "$tmp/nope" "$bin" generate --checkpoint "$tmp/nope" --prompt hi
code 2 "$tmp/nope/config.json" "$bin" export --checkpoint "$tmp/nope" --out "$tmp/x"
code 2 "$tmp/none.json" "$bin" prepare --tokenizer "$tmp/none.json" --out "$tmp/p" "$tmp/train_000000.bin"
code 2 "$tmp/missing.txt" "$bin" prepare --tokenizer "$tmp/none.json" --out "$tmp/p" "$tmp/missing.txt"
code 2 "pp = 0" "$bin" schedule --pp 0
code 2 "no trace-rank" "$bin" trace merge "$tmp"
code 2 "$tmp/none" "$bin" trace merge "$tmp/none"
code 2 "no flight record" "$bin" trace why "$tmp"
code 2 "$tmp/none: cannot open" "$bin" trace why "$tmp/none"
code 2 "--hardware FILE is required" "$bin" plan "${tiny[@]}"
code 2 "$tmp/none.ini" "$bin" plan "${tiny[@]}" --hardware "$tmp/none.ini"

# launch: a refused job (2) runs once, not restarted; a failure while running (1) is restarted;
# --restarts past 1000 is refused
ck=(--checkpoint.dir="$tmp/ck" --checkpoint.resume=latest)
out="$(timeout -k 5 120 "$bin" launch --restarts 5 --backoff 0 -- mpiexec -np 2 "$bin" train "${tiny[@]}" \
       "${dp2[@]}" "${ck[@]}" --model.n_heads=3 2>&1)"; rc=$?
if [ $rc -eq 2 ] && ! grep -q "restart 1 of" <<<"$out" && grep -q "not restarted" <<<"$out" &&
   [ "$(grep -c "model.n_heads" <<<"$out")" -eq 1 ]; then ok
else bad "launch of a refused job: exit $rc: $(tail -4 <<<"$out")"; fi
out="$(timeout -k 5 60 "$bin" launch --restarts 2 --backoff 0 -- sh -c 'exit 1' 2>&1)"; rc=$?
[ $rc -eq 1 ] && grep -q "restart 2 of 2" <<<"$out" && ok || bad "launch of a failing job: exit $rc: $out"
code 2 "--restarts needs a number in [0, 1000]" "$bin" launch --restarts 1000000 -- true
code 2 "--restarts needs a number in [0, 1000]" "$bin" launch --restarts 1e6 -- true

echo "test_exit_codes: $pass passed, $fail failed"
[ $fail -eq 0 ]
