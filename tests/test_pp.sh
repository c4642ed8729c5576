#!/usr/bin/env bash
# test_pp.sh PENTATRON: pipeline parallelism through mpiexec against one process.
#   - every schedule (afab, 1f1b, zb; interleaved with 2 chunks per rank) at pp ∈ {2, 4} with
#     fewer and more micro-batches than stages, and with dp 2 (ZeRO-1) and tp 2: step-1 gradients
#     per tensor ‖Δ‖/‖g‖ ≤ 1e-5, 10 losses ≤ 1e-4;
#   - the first stage's bytes per step: one activation of N·C floats per micro-batch;
#   - peak activation sets held by the first stage: m under afab, min(pp, m) under 1f1b;
#   - checkpoints across pp degrees (pp 2 -> pp 1 × dp 2 -> pp 4) continue the same losses;
#   - tied embeddings (the last stage holds a copy of the embedding for its head; the two
#     gradients are summed): every schedule, with dp 2 (ZeRO-1) and tp 2 + sp, and resumed;
#   - stage splits and schedules that cannot work fail fast with one message.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
L4=(--model.n_layers=4)
L8=(--model.n_layers=8)

run 1 ref4 "${L4[@]}" --training.micro_batch=8 --checkpoint.dir="$tmp/ckref" || bad "reference failed: $(tail -3 "$tmp/ref4.log")"
run 1 ref8 "${L8[@]}" --training.micro_batch=8 || bad "8-layer reference failed: $(tail -3 "$tmp/ref8.log")"

# m = 8 / micro_batch micro-batches per step
for s in afab 1f1b zb; do
  check 2 "pp2_${s}_m1" ref4 "${L4[@]}" --parallel.pp=2 --parallel.pp_schedule=$s --training.micro_batch=8
  check 2 "pp2_${s}_m8" ref4 "${L4[@]}" --parallel.pp=2 --parallel.pp_schedule=$s --training.micro_batch=1
  check 4 "pp4_${s}_m2" ref4 "${L4[@]}" --parallel.pp=4 --parallel.pp_schedule=$s --training.micro_batch=4
  check 4 "pp4_${s}_m8" ref4 "${L4[@]}" --parallel.pp=4 --parallel.pp_schedule=$s --training.micro_batch=1
done
check 2 pp2_interleaved_m2 ref4 "${L4[@]}" --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2 --training.micro_batch=4
check 2 pp2_interleaved_m8 ref4 "${L4[@]}" --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2 --training.micro_batch=1
check 4 pp4_interleaved_m4 ref8 "${L8[@]}" --parallel.pp=4 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2 --training.micro_batch=2
check 4 pp4_interleaved_m8 ref8 "${L8[@]}" --parallel.pp=4 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2 --training.micro_batch=1
# with data and tensor parallelism, and an explicit split
for s in afab 1f1b zb; do
  check 4 "pp2_dp2_z1_$s" ref4 "${L4[@]}" --parallel.pp=2 --parallel.dp=2 --parallel.zero=1 --parallel.pp_schedule=$s --training.micro_batch=1
  check 4 "pp2_tp2_$s" ref4 "${L4[@]}" --parallel.pp=2 --parallel.tp=2 --parallel.sp=$([ $s = zb ] && echo true || echo false) --parallel.pp_schedule=$s --training.micro_batch=2
done
check 8 pp2_tp2_dp2_interleaved ref4 "${L4[@]}" --parallel.pp=2 --parallel.tp=2 --parallel.dp=2 --parallel.zero=1 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2 --training.micro_batch=2
check 2 pp2_split_3_1 ref4 "${L4[@]}" --parallel.pp=2 --parallel.pp_layers=3,1 --training.micro_batch=2

# bytes and peak activations seen by the first stage (rank 0, which writes the metrics)
"$PY" - "$tmp" <<'PY' && ok || bad "first-stage bytes or peak activations differ from the schedule"
import json, sys
tmp = sys.argv[1]
N, C = 1 * 16, 32  # micro_batch 1 × seq_len 16 rows, dim 32
def step2(name): return [json.loads(l) for l in open("%s/%s.jsonl" % (tmp, name))][1]
errs = []
for name, m in (("pp2_1f1b_m8", 8), ("pp4_afab_m8", 8)):
    got = step2(name)["comm_groups"]["pp"]
    want = m * N * C * 4  # one activation per micro-batch to stage 1 (plus the tiny loss/norm sums)
    print("%s: first-stage pp bytes per step %d, activations m·N·C·4 = %d (%.2f%%)" % (name, got, want, 100.0 * (got - want) / want))
    if abs(got - want) > 0.01 * want: errs.append(name + " bytes")
for p in (2, 4):
    afab = step2("pp%d_afab_m8" % p)["mem"]["activations"]
    f1b = step2("pp%d_1f1b_m8" % p)["mem"]["activations"]
    print("pp %d, m 8: first stage holds %d bytes under afab, %d under 1f1b: ratio %.2f, in-flight 8 / %d" % (p, afab, f1b, afab / f1b, p))
    if afab * p != f1b * 8: errs.append("pp %d peak activations" % p)
if errs: print(errs); sys.exit(1)
PY

# checkpoints across pp degrees: pp 2 1f1b (3 steps) -> pp 1 × dp 2 (3) -> pp 4 zb (4)
ck="$tmp/ck"
run 2 c1 "${L4[@]}" --parallel.pp=2 --training.micro_batch=2 --checkpoint.dir="$ck" --training.steps=3 --checkpoint.keep=5 &&
run 2 c2 "${L4[@]}" --parallel.dp=2 --training.micro_batch=2 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=6 --checkpoint.keep=5 &&
run 4 c3 "${L4[@]}" --parallel.pp=4 --parallel.pp_schedule=zb --training.micro_batch=2 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=10 --checkpoint.keep=5 ||
  bad "resume runs failed: $(tail -2 "$tmp"/c*.log)"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --resume "$tmp" ref4 "pp2 -> dp2 -> pp4/zb" c1 c2 c3 && ok ||
  bad "losses after resuming across pp degrees differ"

# tied embeddings: the last stage's copy of the embedding, its gradient summed with the first's
T4=("${L4[@]}" --model.tied_embeddings=true)
run 1 tref "${T4[@]}" --training.micro_batch=8 || bad "tied reference failed: $(tail -3 "$tmp/tref.log")"
check 2 tied_pp2 tref "${T4[@]}" --parallel.pp=2 --training.micro_batch=2
check 4 tied_pp4_zb tref "${T4[@]}" --parallel.pp=4 --parallel.pp_schedule=zb --training.micro_batch=2
check 2 tied_pp2_interleaved tref "${T4[@]}" --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2 --training.micro_batch=2
check 4 tied_pp2_dp2_z1 tref "${T4[@]}" --parallel.pp=2 --parallel.dp=2 --parallel.zero=1 --training.micro_batch=1
check 4 tied_pp2_tp2_sp tref "${T4[@]}" --parallel.pp=2 --parallel.tp=2 --parallel.sp=true --training.micro_batch=2
# and its checkpoint (the first stage's copy saved) resumed by one process, and back
tk="$tmp/tk"
run 4 t1 "${T4[@]}" --parallel.pp=2 --parallel.dp=2 --parallel.zero=1 --training.micro_batch=1 --checkpoint.dir="$tk" --training.steps=4 --checkpoint.keep=5 &&
run 1 t2 "${T4[@]}" --training.micro_batch=8 --checkpoint.dir="$tk" --checkpoint.resume=latest --training.steps=7 --checkpoint.keep=5 &&
run 4 t3 "${T4[@]}" --parallel.pp=4 --parallel.pp_schedule=zb --training.micro_batch=2 --checkpoint.dir="$tk" --checkpoint.resume=latest --checkpoint.keep=5 ||
  bad "tied resume runs failed: $(tail -2 "$tmp"/t[123].log)"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --resume "$tmp" tref "tied pp2·dp2 -> 1 -> pp4/zb" t1 t2 t3 && ok ||
  bad "losses after resuming a tied pipeline differ"

# what cannot work
expect_fail 4 "exceed model.n_layers" --parallel.pp=4 --training.micro_batch=1
expect_fail 2 "must divide model.n_layers" "${L4[@]}" --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=3 --training.micro_batch=1
expect_fail 2 "multiple of" "${L4[@]}" --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=2 --training.micro_batch=8
expect_fail 2 "parallel.pp_layers" "${L4[@]}" --parallel.pp=2 --parallel.pp_layers=3,2 --training.micro_batch=1
expect_fail 4 "ZeRO-2/3" "${L4[@]}" --parallel.pp=2 --parallel.dp=2 --parallel.zero=2 --training.micro_batch=1

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
