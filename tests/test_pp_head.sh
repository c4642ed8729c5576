#!/usr/bin/env bash
# test_pp_head.sh PENTATRON: the head and loss split over the pipeline ranks (parallel.pp_head =
# split: every stage a share of the head's vocabulary rows, the loss's statistics combined over
# the stages, xf's gradient summed onto the last stage) against one process:
#   - 1f1b, afab and zb at pp 2 and 4, with tp 2 (+ sp), pp 4 × tp 2, dp 2 (ZeRO-1), full and
#     selective recomputation and given vocabulary rows: step-1 gradients per tensor ≤ 1e-5, 10
#     losses ≤ 1e-4; in bf16 within a share of bf16's own distance from fp32; evaluation within 1e-5;
#   - the first stage's pp bytes (its activation, xf in and its part of xf's gradient out, N·C
#     floats each per micro-batch) and the head group's (3 statistics per row to the pp·tp − 1
#     others) against their formulas;
#   - checkpoints: split pp 2 -> one process -> split pp 4 zb continue the same losses;
#   - what cannot work (interleaved, dualpipev, tied embeddings, pp 1, bad rows) fails fast with
#     one message.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
L4=(--model.n_layers=4)
run 1 ref4 "${L4[@]}" --training.micro_batch=8 || bad "reference failed: $(tail -3 "$tmp/ref4.log")"
run 1 bref4 "${L4[@]}" --training.precision=bf16 --training.micro_batch=8 || bad "bf16 reference failed"
shard "$tmp/val_000000.bin" 4000 7 0.2
ev=(--data.val="$tmp/val_*.bin" --eval.every=5 --eval.tokens=256)
run 1 ev_ref "${L4[@]}" "${ev[@]}" --training.micro_batch=8 || bad "evaluation reference failed"

# the head split over the pipeline ranks (parallel.pp_head = split): every stage a share of the
# head's vocabulary rows, the loss's statistics combined over the stages, xf's gradient summed
# onto the last stage: each schedule that supports it, with tp (+ sp), dp (ZeRO-1), full
# recomputation, given rows, bf16, evaluation, and checkpoints across pp degrees
HS=(--parallel.pp_head=split)
check 2 head_pp2_1f1b ref4 "${L4[@]}" --parallel.pp=2 "${HS[@]}" --training.micro_batch=1
check 2 head_pp2_afab ref4 "${L4[@]}" --parallel.pp=2 "${HS[@]}" --parallel.pp_schedule=afab --training.micro_batch=2
check 4 head_pp4_zb ref4 "${L4[@]}" --parallel.pp=4 "${HS[@]}" --parallel.pp_schedule=zb --training.micro_batch=1
check 4 head_pp2_tp2_sp_zb ref4 "${L4[@]}" --parallel.pp=2 --parallel.tp=2 --parallel.sp=true "${HS[@]}" --parallel.pp_schedule=zb --training.micro_batch=2
check 8 head_pp4_tp2 ref4 "${L4[@]}" --parallel.pp=4 --parallel.tp=2 "${HS[@]}" --training.micro_batch=2
check 4 head_pp2_dp2_z1 ref4 "${L4[@]}" --parallel.pp=2 --parallel.dp=2 --parallel.zero=1 "${HS[@]}" --training.micro_batch=1
check 2 head_pp2_zb_full ref4 "${L4[@]}" --parallel.pp=2 "${HS[@]}" --parallel.pp_schedule=zb --training.recompute=full --training.micro_batch=2
check 2 head_pp2_1f1b_sel ref4 "${L4[@]}" --parallel.pp=2 "${HS[@]}" --training.recompute=selective --training.micro_batch=2
check 2 head_pp2_rows ref4 "${L4[@]}" --parallel.pp=2 "${HS[@]}" --parallel.pp_head_rows=90,7 --training.micro_batch=2
grep -q "vocabulary rows 90,7" "$tmp/head_pp2_rows.log" && ok || bad "the given head rows were not used"
bf16_check 2 bf_head_pp2_zb 4 --parallel.pp=2 "${HS[@]}" --parallel.pp_schedule=zb --training.micro_batch=2
run 2 ev_head_pp2 "${L4[@]}" "${ev[@]}" --parallel.pp=2 "${HS[@]}" --training.micro_batch=2 &&
val_same ev_head_pp2 "head split pp 2" && ok || bad "the split head's validation losses differ from the single process's"
# bytes: besides its activation, the first stage receives xf and sends its part of xf's
# gradient (N·C floats each) per micro-batch; the head group carries each rank's 3 statistics
# per row to the pp·tp − 1 others (ring all-gather) per micro-batch
"$PY" - "$tmp" <<'PY' && ok || bad "the split head's bytes differ from the formula"
import json, sys
N, C, V = 1 * 16, 32, 97
def step2(name): return [json.loads(l) for l in open("%s/%s.jsonl" % (sys.argv[1], name))][1]
errs = []
for name, m, ranks in (("head_pp2_1f1b", 8, 2), ("head_pp4_zb", 8, 4)):
    g = step2(name)["comm_groups"]
    for group, want in (("pp", 2 * m * N * C * 4), ("head", m * N * 3 * 4 * (ranks - 1))):
        got = g[group]
        print("%s: first-stage %s bytes per step %d, formula %d (%.2f%%)" % (name, group, got, want, 100.0 * (got - want) / want))
        if abs(got - want) > 0.01 * want: errs.append(name + " " + group)
if errs: print(errs); sys.exit(1)
PY
hk="$tmp/hk"
run 2 h1 "${L4[@]}" --parallel.pp=2 "${HS[@]}" --training.micro_batch=2 --checkpoint.dir="$hk" --training.steps=3 --checkpoint.keep=5 &&
run 1 h2 "${L4[@]}" --training.micro_batch=8 --checkpoint.dir="$hk" --checkpoint.resume=latest --training.steps=6 --checkpoint.keep=5 &&
run 4 h3 "${L4[@]}" --parallel.pp=4 "${HS[@]}" --parallel.pp_schedule=zb --training.micro_batch=2 --checkpoint.dir="$hk" --checkpoint.resume=latest --training.steps=10 --checkpoint.keep=5 ||
  bad "head split resume runs failed: $(tail -2 "$tmp"/h[123].log)"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --resume "$tmp" ref4 "split pp2 -> 1 -> split pp4/zb" h1 h2 h3 && ok ||
  bad "losses after resuming a split head differ"

# what cannot work
expect_fail 2 "needs the afab, 1f1b or zb" "${L4[@]}" --parallel.pp=2 "${HS[@]}" --parallel.pp_schedule=interleaved --parallel.pp_virtual=2 --training.micro_batch=2
expect_fail 2 "needs the afab, 1f1b or zb" "${L4[@]}" --parallel.pp=2 "${HS[@]}" --parallel.pp_schedule=dualpipev --training.micro_batch=2
expect_fail 2 "needs untied embeddings" "${L4[@]}" --model.tied_embeddings=true --parallel.pp=2 "${HS[@]}" --training.micro_batch=2
expect_fail 2 "needs parallel.pp > 1" "${L4[@]}" --parallel.dp=2 "${HS[@]}" --training.micro_batch=2
expect_fail 2 "parallel.pp_head_rows" "${L4[@]}" --parallel.pp=2 "${HS[@]}" --parallel.pp_head_rows=90,8 --training.micro_batch=2
expect_fail 2 "parallel.pp_head_rows" "${L4[@]}" --parallel.pp=2 "${HS[@]}" --parallel.pp_head_rows=97,0 --training.micro_batch=2
expect_fail 4 "fewer than parallel.tp" "${L4[@]}" --parallel.pp=2 --parallel.tp=2 "${HS[@]}" --parallel.pp_head_rows=96,1 --training.micro_batch=2
expect_fail 2 "parallel.pp_head" "${L4[@]}" --parallel.pp=2 --parallel.pp_head=middle --training.micro_batch=2

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
