#!/usr/bin/env bash
# test_recompute.sh PENTATRON: activation recomputation (training.recompute).
#   - exact: selective, full and full on the first layer only give byte-identical step-1
#     gradients (the safetensors dump, cmp) and the same 10 losses and gradient norms (as printed,
#     17 digits) as recompute = none: one process dense and mixture-of-experts, then tp 2 + sp,
#     cp 2 (zigzag), ep 2 over dp 2, pp 2 zero bubble (split backward), interleaved pp 2 × dp 2,
#     ZeRO-3 over dp 2 × cp 2, and dp·pp·cp·tp·ep = 2·2·2·2·2 with zero bubble and sp on 16 ranks;
#   - accounted: the activation bytes the run reports equal the formula of docs/memory.md for
#     each mode (tiny dense model, every array a multiple of 64 bytes so no padding enters);
#   - measured: between recompute = none and full (and none and selective) on a model whose
#     activations dominate, the difference in peak resident memory (VmHWM) equals the formula's
#     difference within 5%;
#   - training.memory_limit: a set-up that needs more than the limit is refused on every rank,
#     naming the need by kind; with full recomputation the same run fits and trains.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
P=--parallel
moe=(--model.n_layers=3 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.n_shared_experts=1 --model.z_loss_coef=0.01)

# same NONE NAME: NAME's gradients and metrics equal NONE's bit for bit
same() {
  if ! cmp -s "$tmp/$1.st" "$tmp/$2.st"; then bad "$2: step-1 gradients differ from $1"; return; fi
  local a b
  a="$(grep -o '"\(loss\|grad_norm\|aux_loss\|z_loss\)": [^,]*' "$tmp/$1.jsonl")"
  b="$(grep -o '"\(loss\|grad_norm\|aux_loss\|z_loss\)": [^,]*' "$tmp/$2.jsonl")"
  if [ "$a" = "$b" ] && [ "$(wc -l <<<"$a")" -ge 20 ]; then ok; else bad "$2: losses differ from $1"; fi
}

# modes NP NAME ARGS...: the layout in each mode, compared with its recompute = none run
modes() {
  local np="$1" name="$2"; shift 2
  run "$np" "${name}_none" "$@" || { bad "$name: run failed: $(tail -3 "$tmp/${name}_none.log")"; return; }
  for mode in selective full; do
    run "$np" "${name}_$mode" "$@" --training.recompute=$mode &&
      same "${name}_none" "${name}_$mode" || bad "$name $mode: $(tail -3 "$tmp/${name}_$mode.log")"
  done
  run "$np" "${name}_full1" "$@" --training.recompute=full --training.recompute_layers=1 &&
    same "${name}_none" "${name}_full1" || bad "$name full1: $(tail -3 "$tmp/${name}_full1.log")"
}

modes 1 dense --training.micro_batch=8
modes 1 moe "${moe[@]}" --training.micro_batch=8
modes 2 tp2_sp $P.tp=2 $P.sp=true --training.micro_batch=8
modes 2 cp2 $P.cp=2 --training.micro_batch=8
modes 2 moe_ep2 "${moe[@]}" $P.dp=2 $P.ep=2 --training.micro_batch=4
modes 2 pp2_zb $P.pp=2 $P.pp_schedule=zb --training.micro_batch=2
modes 4 pp2_interleaved_dp2 --model.n_layers=4 $P.pp=2 $P.pp_virtual=2 $P.pp_schedule=interleaved $P.dp=2 --training.micro_batch=2
modes 4 dp2_cp2_z3 $P.dp=2 $P.cp=2 $P.zero=3 --training.micro_batch=4
full5d=("${moe[@]}" --model.n_layers=4 $P.dp=2 $P.pp=2 $P.cp=2 $P.tp=2 $P.ep=2 $P.sp=true
        $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1)
run 16 moe5d_none "${full5d[@]}" || bad "5d: run failed: $(tail -3 "$tmp/moe5d_none.log")"
for mode in selective full; do
  run 16 "moe5d_$mode" "${full5d[@]}" --training.recompute=$mode &&
    same moe5d_none "moe5d_$mode" || bad "5d $mode: $(tail -3 "$tmp/moe5d_$mode.log")"
done

# the accounting against the formula (docs/memory.md), tiny dense model of parallel_common.sh:
# B = 8, T = 16, C = 32, 4 heads of 8, 2 kv heads, F = 48, V = 97, 2 layers
"$PY" - "$tmp" <<'PY' && ok || bad "activation bytes differ from the formula"
import json, sys
tmp = sys.argv[1]
B, T, C, H, KV, hd, F, V, L = 8, 16, 32, 4, 2, 8, 48, 97, 2
N = R = B * T
q, qkv = H * hd, (H + 2 * KV) * hd
arrays = dict(x=R*C, rstd1=R, xn1=N*C, qkv=N*qkv, att=N*q, lse=B*H*T, xmid=R*C, rstd2=R, xn2=N*C,
              gu=2*N*F, h=N*F)
keep = dict(none=set(arrays), selective=set(arrays) - {"att", "lse", "h"}, full={"x"})
HR = min(512, N)  # rows of the fused head + loss
# the set's own (output, its gradient, the final norm's rstd, its rows of xf's gradient) and the
# backward's scratch (xf and its whole gradient, the head's chunk of logits, the input gradients)
rest = (R*C + R*C + R + R*C) + (N*C + N*C + HR*V + HR + N*C + N*qkv + N*q + 2*N*F + N*F + 2*C + 2*KV*hd*C)
ok = True
for mode in keep:
    layers = L * sum(arrays[a] for a in keep[mode])
    ws = sum(arrays[a] for a in arrays if a not in keep[mode]) + (R * C if mode == "full" else 0)
    want = 4 * (layers + ws + rest)
    got = [json.loads(l) for l in open("%s/dense_%s.jsonl" % (tmp, mode))][-1]["mem"]["activations"]
    print("%-9s activations %8d bytes, formula %8d" % (mode, got, want))
    ok &= got == want
sys.exit(0 if ok else 1)
PY

# peak resident memory: one step of a model whose activations dominate (8 layers, N = 2048 rows)
big=(--model.vocab_size=97 --model.dim=256 --model.n_layers=8 --model.n_heads=8 --model.n_kv_heads=8
     --model.ffn_dim=688 --model.max_seq_len=256 --training.seq_len=256 --training.global_batch=8
     --training.micro_batch=8 --training.steps=1 --training.threads=2 --logging.progress=false
     --data.train="$tmp/train_*.bin")
for mode in none selective; do
  "$bin" train "${big[@]}" --training.recompute=$mode --logging.metrics="$tmp/big_$mode.jsonl" \
    > "$tmp/big_$mode.log" 2>&1 || bad "big $mode failed: $(tail -3 "$tmp/big_$mode.log")"
done
# training.memory_limit between the needs of none and selective (full needs less than both): the
# full run below trains under it, and recompute = none is refused by it (further down)
lim="$("$PY" -c "
import json
a = [json.loads(l) for l in open('$tmp/big_none.jsonl')][-1]['mem']
b = [json.loads(l) for l in open('$tmp/big_selective.jsonl')][-1]['mem']
need = lambda m: sum(m[k] for k in ('params', 'grads', 'optim', 'activations'))
print((need(a) + need(b)) // 2)")"
"$bin" train "${big[@]}" --training.recompute=full --training.memory_limit="$lim" \
  --logging.metrics="$tmp/big_full.jsonl" > "$tmp/big_full.log" 2>&1 && ok ||
  bad "memory_limit $lim refused recompute = full: $(tail -3 "$tmp/big_full.log")"
"$PY" - "$tmp" <<'PY' && ok || bad "peak resident memory does not follow the formula"
import json, sys
tmp = sys.argv[1]
B, T, C, H, F, L = 8, 256, 256, 8, 688, 8
N = R = B * T
per = dict(att=N*C, lse=B*H*T, h=N*F)
full_kept = R * C
none_layer = R*C + R + N*C + N*3*C + N*C + B*H*T + R*C + R + N*C + 2*N*F + N*F
want = {"selective": 4 * (L - 1) * sum(per.values()),
        "full": 4 * ((L - 1) * (none_layer - full_kept) - R * C)}
m = {k: [json.loads(l) for l in open("%s/big_%s.jsonl" % (tmp, k))][-1] for k in ("none", "selective", "full")}
ok = True
for k in want:
    acc = m["none"]["mem"]["activations"] - m[k]["mem"]["activations"]
    hwm = m["none"]["peak_rss_bytes"] - m[k]["peak_rss_bytes"]
    print("none - %-9s formula %6.1f MiB, accounting %6.1f MiB, VmHWM %6.1f MiB (%+.1f%%)" % (
        k, want[k] / 2**20, acc / 2**20, hwm / 2**20, 100.0 * (hwm - want[k]) / want[k]))
    ok &= acc == want[k] and abs(hwm - want[k]) <= 0.05 * want[k]
sys.exit(0 if ok else 1)
PY

# peak resident memory of the sets a pipeline holds (pp 2 × tp 2 with sp, AFAB: a rank holds all m
# sets at once): between m = 6 and m = 2 the process grows by 4 sets' accounted bytes, each set
# its layers' arrays (the norms' outputs sharded over tp) and its boundary, the backward's scratch
# once per rank outside them (docs/memory.md)
for m in 2 6; do
  timeout 120 mpiexec -np 4 "$bin" train "${big[@]}" --training.global_batch=$((8 * m)) --training.threads=1 \
    --parallel.pp=2 --parallel.tp=2 --parallel.sp=true --parallel.pp_schedule=afab \
    --logging.metrics="$tmp/sets_$m.jsonl" > "$tmp/sets_$m.log" 2>&1 || bad "sets $m failed: $(tail -3 "$tmp/sets_$m.log")"
done
"$PY" - "$tmp" <<'PY' && ok || bad "the pipeline's sets: peak resident memory does not follow the accounting"
import json, sys
tmp = sys.argv[1]
m = {k: [json.loads(l) for l in open("%s/sets_%d.jsonl" % (tmp, k))][-1] for k in (2, 6)}
acc = m[6]["mem"]["activations"] - m[2]["mem"]["activations"]
hwm = m[6]["peak_rss_bytes"] - m[2]["peak_rss_bytes"]
print("pp 2 × tp 2 sp, AFAB, 6 - 2 sets: accounting %.1f MiB, VmHWM %.1f MiB (%+.1f%%)" % (
    acc / 2**20, hwm / 2**20, 100.0 * (hwm - acc) / acc))
sys.exit(0 if acc > 0 and abs(hwm - acc) <= 0.05 * acc else 1)
PY

# memory_limit (set above, between the needs of none and selective; big_full trained under it):
# refused without recomputation
out="$("$bin" train "${big[@]}" --training.memory_limit="$lim" 2>&1)"; rc=$?
if [ $rc -ne 0 ] && grep -q "needs .* but training.memory_limit is .*activations" <<<"$out"; then ok
else bad "memory_limit $lim did not refuse recompute = none: $(tail -2 <<<"$out")"; fi
expect_fail 2 "training.memory_limit" --training.memory_limit=100000 $P.dp=2 --training.micro_batch=4

echo "test_recompute: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
