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
#   - ZeRO-2 under the pipeline (dp 2): every schedule (afab, 1f1b, zb, dualpipev, interleaved)
#     and tied embeddings (zb, 1f1b) against one process, zb in bf16 against the bf16 run; the
#     first stage's reduce-scatter bytes m times ZeRO-1's (each micro-batch's gradients), at most
#     that under zb;
#   - dualpipev (DualPipeV: 2 chunks per rank in a V, the loss on rank 0, the bottom rank's two
#     chunks handing off locally): pp 2 and pp 4 at m = 2pp and more, with recomputation
#     (selective, full), with dp 2 (ZeRO-1), with tp 2 + sp (the local hand-off of a tp rank's
#     rows), with tied embeddings (both ends on rank 0), and in bf16 (compare_runs.py --bf16:
#     within 0.1x / 0.5x of bf16's own distance from fp32); its validation losses (data.val)
#     within 1e-5 of the single process's;
#   - the head split over the stages: tests/test_pp_head.sh; uneven and interleaved stages over any
#     layer count and micro-batch count: tests/test_pp_flex.sh;
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

# dualpipev: 2·pp stages (rank r holds stages r and 2pp - 1 - r), m >= 2pp micro-batches
DPV=(--parallel.pp_schedule=dualpipev)
check 2 pp2_dualpipev_m4 ref4 "${L4[@]}" --parallel.pp=2 "${DPV[@]}" --training.micro_batch=2
check 2 pp2_dualpipev_m8_sel ref4 "${L4[@]}" --parallel.pp=2 "${DPV[@]}" --training.micro_batch=1 --training.recompute=selective
check 4 pp4_dualpipev_m8 ref8 "${L8[@]}" --parallel.pp=4 "${DPV[@]}" --training.micro_batch=1
check 4 pp4_dualpipev_m8_full ref8 "${L8[@]}" --parallel.pp=4 "${DPV[@]}" --training.micro_batch=1 --training.recompute=full
check 4 pp2_dp2_z1_dualpipev ref4 "${L4[@]}" --parallel.pp=2 --parallel.dp=2 --parallel.zero=1 "${DPV[@]}" --training.micro_batch=1
check 4 pp2_tp2_sp_dualpipev ref4 "${L4[@]}" --parallel.pp=2 --parallel.tp=2 --parallel.sp=true "${DPV[@]}" --training.micro_batch=2
# bf16: against the single-process bf16 run, within bf16's own distance from fp32
B16=(--training.precision=bf16)
for L in 4 8; do
  run 1 "bref$L" --model.n_layers=$L "${B16[@]}" --training.micro_batch=8 || bad "bf16 $L-layer reference failed"
done
bf16_check 2 bf_pp2_dualpipev 4 --parallel.pp=2 "${DPV[@]}" --training.micro_batch=2
bf16_check 4 bf_pp4_dualpipev_sel 8 --parallel.pp=4 "${DPV[@]}" --training.micro_batch=1 --training.recompute=selective
# and ZeRO-2 under the pipeline in bf16 (the fp32 masters sharded, bf16 gathered)
bf16_check 4 bf_pp2_dp2_z2_zb 4 --parallel.pp=2 --parallel.dp=2 --parallel.zero=2 --parallel.pp_schedule=zb --training.micro_batch=1
# evaluation (data.val): the forward-only pass down the V and back up gives the single process's
# validation losses (each within 1e-5 relative)
shard "$tmp/val_000000.bin" 4000 7 0.2
ev=(--data.val="$tmp/val_*.bin" --eval.every=5 --eval.tokens=256)
run 1 ev_ref "${L4[@]}" "${ev[@]}" --training.micro_batch=8 &&
run 2 ev_pp2_dualpipev "${L4[@]}" "${ev[@]}" --parallel.pp=2 "${DPV[@]}" --training.micro_batch=2 &&
val_same ev_pp2_dualpipev "dualpipev pp 2" && ok || bad "dualpipev's validation losses differ from the single process's"

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
# the backward's scratch, once per rank outside the sets (docs/memory.md; the first stage holds no
# head): dxn, dqkv, datt, dgu, dh, the norms' and a kv head's weight gradients, fp32, each array
# padded to 64 bytes (16 floats)
H, KV, hd, F = 4, 2, 8, 48
q, qkv = H * hd, (H + 2 * KV) * hd
r16 = lambda n: (n + 15) // 16 * 16
scratch = 4 * (r16(N * C) + r16(N * qkv) + r16(N * q) + r16(N * 2 * F) + r16(N * F) + r16(2 * C)
               + r16(2 * KV * hd * C))
for p in (2, 4):
    afab = step2("pp%d_afab_m8" % p)["mem"]["activations"] - scratch
    f1b = step2("pp%d_1f1b_m8" % p)["mem"]["activations"] - scratch
    print("pp %d, m 8: first stage holds %d bytes of sets under afab, %d under 1f1b (and %d of "
          "scratch): ratio %.2f, in-flight 8 / %d" % (p, afab, f1b, scratch, afab / f1b, p))
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
check 2 tied_pp2_dualpipev tref "${T4[@]}" --parallel.pp=2 --parallel.pp_schedule=dualpipev --training.micro_batch=2
check 4 tied_pp2_dp2_z1 tref "${T4[@]}" --parallel.pp=2 --parallel.dp=2 --parallel.zero=1 --training.micro_batch=1
check 4 tied_pp2_tp2_sp tref "${T4[@]}" --parallel.pp=2 --parallel.tp=2 --parallel.sp=true --training.micro_batch=2

# ZeRO-2 under the pipeline: each micro-batch's gradients reduce-scattered as its backward ends on
# the stage (zb: once its weight pass has released them), every schedule, and the tied embedding's
# two copies summed over their reduced slices
Z2=(--parallel.pp=2 --parallel.dp=2 --parallel.zero=2 --training.micro_batch=1)
for s in afab 1f1b zb dualpipev; do check 4 "pp2_dp2_z2_$s" ref4 "${L4[@]}" "${Z2[@]}" --parallel.pp_schedule=$s; done
check 4 pp2_dp2_z2_interleaved ref4 "${L4[@]}" "${Z2[@]}" --parallel.pp_schedule=interleaved --parallel.pp_virtual=2
check 4 tied_pp2_dp2_z2_zb tref "${T4[@]}" "${Z2[@]}" --parallel.pp_schedule=zb
check 4 tied_pp2_dp2_z2_1f1b tref "${T4[@]}" "${Z2[@]}" --parallel.pp_schedule=1f1b
# its traffic (rank 0, the first stage, every step): the reduce-scatter's bytes are m = 4 times
# ZeRO-1's (one stage's gradients, 4·Ψ_stage·(N − 1)/N bytes, each micro-batch instead of once), at
# most that under zb (a weight pass deferred past the next input pass reduces two together); the
# all-gather's are ZeRO-1's
"$PY" - "$tmp" <<'PY' && ok || bad "ZeRO-2 under the pipeline: reduce-scatter bytes not m times ZeRO-1's"
import json, sys
def b(name, op):
    return sum(json.loads(l)["comm"].get(op, [0, 0])[1] for l in open("%s/%s.jsonl" % (sys.argv[1], name)))
ok = True
for s in ("afab", "1f1b", "zb"):
    z1, z2 = b("pp2_dp2_z1_" + s, "reduce-scatter"), b("pp2_dp2_z2_" + s, "reduce-scatter")
    g1, g2 = b("pp2_dp2_z1_" + s, "all-gather"), b("pp2_dp2_z2_" + s, "all-gather")
    print("%s: reduce-scatter ZeRO-1 %d bytes a step, ZeRO-2 %d a micro-batch (%.2fx ZeRO-1's "
          "over 10 steps); all-gather %d, %d" % (s, z1 // 10, z2 // 40, z2 / z1, g1, g2))
    ok &= z1 > 0 and (z2 == 4 * z1 if s != "zb" else z1 <= z2 <= 4 * z1) and g1 == g2
sys.exit(0 if ok else 1)
PY
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
expect_fail 2 "6 stages exceed model.n_layers = 4" "${L4[@]}" --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=3 --training.micro_batch=1
expect_fail 2 "parallel.pp_layers" "${L4[@]}" --parallel.pp=2 --parallel.pp_layers=3,2 --training.micro_batch=1
expect_fail 4 "ZeRO-3 gathers" "${L4[@]}" --parallel.pp=2 --parallel.dp=2 --parallel.zero=3 --training.micro_batch=1
expect_fail 2 "at least 2·pp = 4" "${L4[@]}" --parallel.pp=2 "${DPV[@]}" --training.micro_batch=4
expect_fail 2 "leave it at 1" "${L4[@]}" --parallel.pp=2 "${DPV[@]}" --parallel.pp_virtual=3 --training.micro_batch=1
expect_fail 4 "exceed model.n_layers" "${L4[@]}" --parallel.pp=4 "${DPV[@]}" --training.micro_batch=1

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
