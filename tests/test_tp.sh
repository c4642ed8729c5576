#!/usr/bin/env bash
# test_tp.sh PENTATRON: tensor (and sequence) parallelism through mpiexec against one process.
#   - tp ∈ {2, 4} × sp off/on, a vocabulary (97) neither divides, n_kv_heads = 2 < tp = 4 (each
#     key/value head replicated on 2 ranks), tied embeddings, and tp 2 × dp 2 with every ZeRO
#     stage and accumulation: step-1 gradients per tensor ‖Δ‖/‖g‖ ≤ 1e-5, 10 losses ≤ 1e-4;
#   - tp bytes per layer per micro-batch (a 3-layer run minus a 2-layer one) = docs/formulas.md's
#     4 all-reduces of N·C, 2(t−1)/t each, without sp; 4 all-gathers + 4 reduce-scatters of N·C,
#     (t−1)/t each, with sp, plus the all-reduce of the layer's two norm-weight gradients (2C);
#     with sp 6 of those 8 as the overlapped point-to-point blocks (docs/parallelism.md);
#   - activation bytes per rank = the accounting in docs/parallelism.md, smaller with sp;
#   - checkpoints across tp degrees (tp 4 sp -> tp 2 × dp 2 ZeRO-1 -> tp 1) continue the same
#     losses, and the export of a tp 4 checkpoint equals the single-process one's;
#   - heads, key/value heads, ffn or rows that tp cannot split fail fast with one message.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"

run 1 ref --training.micro_batch=8 --checkpoint.dir="$tmp/ckref" --checkpoint.every=1 --checkpoint.keep=20 ||
  bad "reference run failed: $(tail -3 "$tmp/ref.log")"
run 1 ref_tied --training.micro_batch=8 --model.tied_embeddings=true ||
  bad "tied reference run failed: $(tail -3 "$tmp/ref_tied.log")"

for tp in 2 4; do
  for sp in false true; do
    check $tp "tp${tp}_sp_$sp" ref --parallel.tp=$tp --parallel.sp=$sp --training.micro_batch=8
  done
done
check 2 tp2_tied_sp ref_tied --model.tied_embeddings=true --parallel.tp=2 --parallel.sp=true --training.micro_batch=4
check 4 tp4_tied ref_tied --model.tied_embeddings=true --parallel.tp=4 --training.micro_batch=8
# tp 2 × dp 2, each ZeRO stage; accumulation 2 where micro_batch = 2
check 4 tp2_dp2_z0 ref --parallel.tp=2 --parallel.dp=2 --parallel.zero=0 --training.micro_batch=4
check 4 tp2_dp2_z1_sp_a2 ref --parallel.tp=2 --parallel.dp=2 --parallel.zero=1 --parallel.sp=true --training.micro_batch=2
check 4 tp2_dp2_z2_a2 ref --parallel.tp=2 --parallel.dp=2 --parallel.zero=2 --training.micro_batch=2
check 4 tp2_dp2_z3_sp ref --parallel.tp=2 --parallel.dp=2 --parallel.zero=3 --parallel.sp=true --training.micro_batch=4
# tp 4 (replicated kv heads) × dp 2 on 8 ranks
check 8 tp4_dp2_z1_sp ref --parallel.tp=4 --parallel.dp=2 --parallel.zero=1 --parallel.sp=true --training.micro_batch=4
check 8 tp4_dp2_z3_a2 ref --parallel.tp=4 --parallel.dp=2 --parallel.zero=3 --training.micro_batch=2

# bytes per layer: 3 layers minus 2, one micro-batch of N = 8 × 16 rows, C = 32 (step 2's; the
# 2-layer run is the layout's check above, tp${tp}_sp_$sp)
for tp in 2 4; do
  for sp in false true; do
    run $tp "bytes_tp${tp}_${sp}_L3" --parallel.tp=$tp --parallel.sp=$sp --training.micro_batch=8 \
      --model.n_layers=3 --training.steps=2 || bad "bytes run tp $tp sp $sp L 3 failed"
    "$PY" - "$tmp" $tp $sp <<'PY' && ok || bad "tp $tp sp $sp: bytes per layer differ from the formula"
import json, sys
tmp, t, sp = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "true"
N, C = 8 * 16, 32
def run_name(L): return "bytes_tp%d_%s_L3" % (t, sys.argv[3]) if L == 3 else "tp%d_sp_%s" % (t, sys.argv[3])
def tp_bytes(L):
    m = [json.loads(l) for l in open("%s/%s.jsonl" % (tmp, run_name(L)))]
    return m[1]["comm_groups"]["tp"]
got = tp_bytes(3) - tp_bytes(2)
# with sp the overlapped forms (docs/parallelism.md): per layer, the forward's 2 gathers and 2
# reduce-scatters and the backward's 2 gathers go point to point (6 blocks' worth of sends,
# (t−1)/t · N·C each), the backward's 2 input-gradient reductions stay reduce-scatters, and the
# two norms' outputs, kept sharded, are all-gathered again for the weight gradients (2 more)
def op_bytes(L, op):
    m = [json.loads(l) for l in open("%s/%s.jsonl" % (tmp, run_name(L)))]
    return m[1]["comm"].get(op, [0, 0])[1]
if sp:
    unit = (t - 1) / t * N * C * 4
    sends, rs, ag = (op_bytes(3, o) - op_bytes(2, o) for o in ("send", "reduce-scatter", "all-gather"))
    print("tp %d sp: per layer %d bytes sent point to point (want 6 × %.0f), %d reduce-scattered "
          "(want 2 × %.0f), %d all-gathered again (want 2 × %.0f)" % (t, sends, unit, rs, unit, ag, unit))
    if sends != 6 * unit or rs != 2 * unit or ag != 2 * unit:
        sys.exit(1)
# docs/formulas.md: without sp, forward 2 all-reduces of N·C and backward 2 more, 2(t−1)/t each;
# with sp the same volume as 4 all-gathers + 4 reduce-scatters, (t−1)/t each, plus (Megatron's
# sequence parallelism, Korthikanti et al. 2022 §4.2.2) the backward's 2 re-gathers of the kept
# shards
formulas = 4 * 2 * (t - 1) / t * N * C * 4
want = formulas + (2 * (t - 1) / t * N * C * 4 + 2 * (t - 1) / t * 2 * C * 4 if sp else 0)
print("tp %d sp %s: %d bytes per layer per micro-batch; docs/formulas.md %.0f (%.2f%%)%s" % (
    t, sp, got, formulas, 100 * (got - formulas) / formulas,
    ", + re-gathers and norm-weight gradients = %.0f" % want if sp else ""))
sys.exit(0 if abs(got - want) <= 0.01 * want else 1)
PY
  done
done

# activation bytes per rank: the accounting of docs/parallelism.md, and smaller with sp
"$PY" - "$tmp" <<'PY' && ok || bad "activation bytes differ from the accounting"
import json, sys
tmp = sys.argv[1]
B, T, C, L, V, F, H, KV, hd = 8, 16, 32, 2, 97, 48, 4, 2, 8
def predicted(t, sp):
    N = B * T; R = N // t if sp else N
    q, kv = H // t * hd, max(KV // t, 1) * hd
    qkv, f, v = q + 2 * kv, F // t, -(-V // t)
    r16 = lambda n: (n + 15) // 16 * 16  # every array is rounded up to 64 bytes
    # a layer keeps x, xmid, xn1, xn2 (R rows each: sp keeps the norms' outputs sharded), rstd1,
    # rstd2, qkv, att, lse, gu, h
    layer = (r16(R * C) * 4 + r16(R) * 2 + r16(N * qkv) + r16(N * q)
             + r16(B * (H // t) * T) + r16(N * 2 * f) + r16(N * f))
    # the set's own: the output and its gradient, the final norm's rstd, its rows of xf's gradient
    own = r16(R * C) * 3 + r16(R)
    # the backward's scratch, once per rank: the head's chunk of logits, dxn, dqkv, datt, dgu,
    # dh, the gathered gradient and input (sp), the norms' and a kv head's weight gradients, xf
    # and its whole gradient (the head's)
    hr = min(512, N)
    scratch = (r16(hr * v) + r16(hr) + r16(N * C) + r16(N * qkv) + r16(N * q) + r16(N * 2 * f)
               + r16(N * f) + (2 * r16(N * C) if sp and t > 1 else 0) + r16(2 * C) + r16(2 * kv * C)
               + 2 * r16(N * C))
    return 4 * (L * layer + own + scratch)
rows = []
for name, t, sp in (("ref", 1, False), ("tp2_sp_false", 2, False), ("tp2_sp_true", 2, True),
                    ("tp4_sp_false", 4, False), ("tp4_sp_true", 4, True)):
    got = [json.loads(l) for l in open("%s/%s.jsonl" % (tmp, name))][1]["mem"]["activations"]
    rows.append((name, got, predicted(t, sp)))
ok = all(g == p for _, g, p in rows) and rows[2][1] < rows[1][1] and rows[4][1] < rows[3][1]
for name, g, p in rows: print("activations %s: %d bytes per rank, accounting %d" % (name, g, p))
sys.exit(0 if ok else 1)
PY

# checkpoints across tp degrees: tp 4 sp (3 steps) -> tp 2 × dp 2 ZeRO-1 (4) -> one process (3)
ck="$tmp/ck"
run 4 c1 --parallel.tp=4 --parallel.sp=true --training.micro_batch=8 --checkpoint.dir="$ck" --training.steps=3 --checkpoint.keep=5 &&
run 4 c2 --parallel.tp=2 --parallel.dp=2 --parallel.zero=1 --training.micro_batch=4 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=7 --checkpoint.keep=5 &&
run 1 c3 --training.micro_batch=8 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=10 --checkpoint.keep=5 ||
  bad "resume runs failed: $(tail -2 "$tmp"/c*.log)"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --resume "$tmp" ref "tp4/sp -> tp2·dp2/ZeRO-1 -> tp1" c1 c2 c3 && ok ||
  bad "losses after resuming across tp degrees differ"
"$bin" export --checkpoint "$ck/step_00000003" --out "$tmp/ex4" > /dev/null 2>&1 &&
"$bin" export --checkpoint "$tmp/ckref/step_00000003" --out "$tmp/ex1" > /dev/null 2>&1 || bad "export failed"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --exports "$tmp/ex1/model.safetensors" \
  "$tmp/ex4/model.safetensors" "export of tp4/sp step 3 vs single process" && ok || bad "exports differ"

# what tp cannot split
expect_fail 3 "must divide model.n_heads" --parallel.tp=3 --training.micro_batch=8
expect_fail 2 "must divide model.ffn_dim" --parallel.tp=2 --model.ffn_dim=49 --training.micro_batch=8
expect_fail 2 "one must divide the other" --parallel.tp=2 --model.dim=48 --model.n_heads=6 --model.n_kv_heads=3 --training.micro_batch=8
expect_fail 2 "must be divisible by tp" --parallel.tp=2 --parallel.sp=true --training.seq_len=15 --training.micro_batch=1

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
