#!/usr/bin/env bash
# test_documents.sh PENTATRON: document masking (data.document_mask) in every parallelism.
#   Data: documents of 1 to 12 tokens, each starting with the separator (token 96), so that every
#   16-token sequence holds several, some cut by the sequence's start, by context parallelism's
#   chunks (zigzag and contiguous), by micro-batches and by pipeline stages.
#   - the mask changes the model: the single-process losses with and without it differ;
#   - the single-process run with the mask is the PyTorch-checked model (test_model_torch's
#     test_documents): here every layout must reproduce it (step-1 gradients per tensor
#     ‖Δ‖/‖g‖ ≤ 1e-5, 10 losses ≤ 1e-4): dp with ZeRO, tp with sp, every pipeline schedule, cp
#     zigzag and contiguous over 2 and 4 ranks, ep with a mixture of experts, and compositions
#     on 8 and 16 ranks; the same with rope positions restarting per document;
#   - restarting positions changes only rounding (rope is relative: within a document every
#     query and key move by the same amount): losses within 1e-5 of not restarting;
#   - bf16: a cp·tp layout against the single-process bf16 run: step-1 gradients within 0.1× of
#     bf16's own distance from fp32, the 10 losses within 0.5× (the drift of test_bf16.sh);
#   - bad settings: document_mask without a separator, a separator outside the vocabulary.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
P=--parallel

# documents: the separator, then 0 to 11 tokens of the 7i mod 97 pattern (10% noise below 96)
"$PY" - "$tmp/doc_000000.bin" <<'PY'
import random, struct, sys
random.seed(5)
toks = []
while len(toks) < 30000:
    toks.append(96)
    n = random.randrange(12)
    toks += [(len(toks) * 7 + i) % 96 if random.random() > 0.1 else random.randrange(96)
             for i in range(n)]
toks = toks[:30000]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
    f.write(struct.pack("<%dH" % len(toks), *toks))
PY
tiny+=(--data.train="$tmp/doc_*.bin")
docs=(--data.document_mask=true --data.separator=96)
L4=(--model.n_layers=4)
moe=(--model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.n_shared_experts=1 --model.aux_loss_coef=0.05)

run 1 plain "${L4[@]}" --training.micro_batch=8 || bad "unmasked reference failed: $(tail -3 "$tmp/plain.log")"
run 1 ref "${L4[@]}" "${docs[@]}" --training.micro_batch=8 || bad "reference failed: $(tail -3 "$tmp/ref.log")"
run 1 rref "${L4[@]}" "${docs[@]}" --data.position_restart=true --training.micro_batch=8 ||
  bad "restart reference failed: $(tail -3 "$tmp/rref.log")"
run 1 mref "${moe[@]}" "${docs[@]}" --training.micro_batch=8 || bad "MoE reference failed: $(tail -3 "$tmp/mref.log")"

# the mask matters; restarting positions does not, beyond rounding
"$PY" - "$tmp" <<'PY' && ok || bad "masked/unmasked/restarted losses not as expected"
import json, sys
L = {n: [json.loads(l)["loss"] for l in open("%s/%s.jsonl" % (sys.argv[1], n))] for n in ("plain", "ref", "rref")}
mask = max(abs(a - b) / abs(b) for a, b in zip(L["ref"], L["plain"]))
restart = max(abs(a - b) / abs(b) for a, b in zip(L["rref"], L["ref"]))
print("documents: losses masked vs unmasked differ by up to %.2e; restarted positions vs not %.2e"
      % (mask, restart))
sys.exit(0 if len(L["ref"]) == 10 and mask > 1e-3 and restart < 1e-5 else 1)
PY

dense() { local np="$1" name="$2"; shift 2; check "$np" "$name" ref "${L4[@]}" "${docs[@]}" "$@"; }
restarted() { local np="$1" name="$2"; shift 2; check "$np" "$name" rref "${L4[@]}" "${docs[@]}" --data.position_restart=true "$@"; }
mixed() { local np="$1" name="$2"; shift 2; check "$np" "$name" mref "${moe[@]}" "${docs[@]}" "$@"; }

dense 1 micro2 --training.micro_batch=2
dense 2 dp2_z1 $P.dp=2 $P.zero=1 --training.micro_batch=2
dense 2 tp2_sp $P.tp=2 $P.sp=true --training.micro_batch=4
dense 2 pp2_1f1b $P.pp=2 $P.pp_schedule=1f1b --training.micro_batch=2
dense 2 pp2_zb $P.pp=2 $P.pp_schedule=zb --training.micro_batch=1
dense 2 pp2_interleaved $P.pp=2 $P.pp_schedule=interleaved $P.pp_virtual=2 --training.micro_batch=2
dense 2 cp2_zigzag $P.cp=2 --training.micro_batch=4
dense 2 cp2_contiguous $P.cp=2 $P.cp_layout=contiguous --training.micro_batch=8
dense 4 cp4_zigzag $P.cp=4 --training.micro_batch=8
dense 2 cp2_full_recompute $P.cp=2 --training.recompute=full --training.micro_batch=4
dense 8 dp2_cp2_tp2_sp_z3 $P.dp=2 $P.cp=2 $P.tp=2 $P.sp=true $P.zero=3 --training.micro_batch=2
dense 8 pp2_cp2_tp2_afab $P.pp=2 $P.cp=2 $P.tp=2 $P.pp_schedule=afab --training.micro_batch=2
restarted 2 restart_cp2 $P.cp=2 --training.micro_batch=4
restarted 8 restart_pp2_cp2_tp2_zb $P.pp=2 $P.cp=2 $P.tp=2 $P.pp_schedule=zb --training.micro_batch=1
mixed 2 moe_dp2_ep2 $P.dp=2 $P.ep=2 --training.micro_batch=4
mixed 16 moe_5d_ep2_zb_z1_sp $P.dp=2 $P.pp=2 $P.cp=2 $P.tp=2 $P.ep=2 $P.sp=true $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1

# bf16: a cp·tp layout against the single-process bf16 run (and bf16's own distance from fp32)
bf=(--training.precision=bf16)
run 1 bref "${L4[@]}" "${docs[@]}" "${bf[@]}" --training.micro_batch=8 || bad "bf16 reference failed"
if run 4 bf_cp2_tp2_sp "${L4[@]}" "${docs[@]}" "${bf[@]}" $P.cp=2 $P.tp=2 $P.sp=true --training.micro_batch=4; then
  "$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --bf16 "$tmp" ref bref bf_cp2_tp2_sp "documents, bf16: cp2·tp2" && ok ||
    bad "bf16 cp2·tp2 with documents too far from the single-process bf16 run"
else
  bad "bf16 cp2·tp2 failed: $(tail -3 "$tmp/bf_cp2_tp2_sp.log")"
fi

# bad settings: one message, non-zero exit on every rank
expect_fail 2 "data.document_mask needs data.separator" --data.document_mask=true $P.dp=2 --training.micro_batch=4
expect_fail 2 "data.separator = 97 is not a token" --data.document_mask=true --data.separator=97 $P.dp=2 --training.micro_batch=4
expect_fail 2 "data.separator and data.position_restart need data.document_mask" --data.separator=5 $P.dp=2 --training.micro_batch=4

echo "test_documents: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
