#!/usr/bin/env bash
# test_gpu_model.sh PENTATRON: the model on the GPU (training.device = cuda) against the CPU backend,
# trained from the same weights (the same seed) on the same data (tests/parallel_common.sh's tiny
# model and shard); skipped (exit 77) without a usable GPU.
#   - fp32: step-1 gradients per tensor ‖Δ‖/‖g‖ ≤ 1e-5 and the 10 losses within 1e-4 relative
#     (tests/ref/compare_runs.py, the tolerances of the CPU layout tests), for the dense model and
#     the mixture of experts (with aux and z losses), each in recompute = none, selective and full,
#     and with document masking (dense and MoE);
#   - bf16: the GPU's bf16 run against the CPU's bf16 run, measured against bf16's own distance from
#     fp32 (the CPU's fp32 run): step-1 gradients within 0.1× and losses within 0.5× of it
#     (compare_runs.py --bf16 prints both distances), dense and MoE in each recompute mode, and
#     documents;
#   - on the GPU, recompute = selective and full byte-identical to none (step-1 gradients, losses),
#     and a run repeated bit for bit (no floating-point atomics);
#   - no allocation in any step after the first (the metrics' allocs, which count the device
#     arena's pieces too), and the arena's high-water mark (device_peak_bytes) reported;
#   - PyTorch on the GPU (PT_GPU_PYTHON, default python3, with torch on CUDA): when tests/ref's
#     llama_ref.py runs there, its fp32 reference on the GPU against its CPU run (the oracle the CPU
#     tests hold us to), reported as TORCH lines (not failing the test when torch is absent).
# Skips (77) when nvidia-smi lists no GPU, or when pentatron refuses training.device = cuda because
# it has no usable device or was built without the CUDA backend (its own messages). Any other
# refusal fails. PT_GPU_TEST_FORCE_PROBE=1 skips the nvidia-smi check (to test the refusal path on
# a machine without a GPU). Output lines: CASE (fp32), BF16, RECOMPUTE, REPEAT, TORCH.
# shellcheck disable=SC2154  # tiny, tmp, pass, fail: tests/parallel_common.sh
set -u
bin="$1"
if [ -z "${PT_GPU_TEST_FORCE_PROBE:-}" ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "SKIP: no GPU (nvidia-smi -L lists none)"; exit 77
  fi
fi
source "$(dirname "$0")/parallel_common.sh" "$1"
GPU=--training.device=cuda
B16=--training.precision=bf16

# the probe: one step on the device; pentatron's own refusal decides a skip
probe="$("$bin" train "${tiny[@]}" --training.steps=1 $GPU --logging.metrics="$tmp/probe.jsonl" 2>&1)"; rc=$?
if [ $rc -ne 0 ]; then
  if grep -qiE "no CUDA device can be used|built without the CUDA backend" <<<"$probe"; then
    echo "SKIP: $(grep -iE "no CUDA device|without the CUDA" <<<"$probe" | head -1)"; exit 77
  fi
  echo "FAIL: training.device = cuda refused for another reason (exit $rc):"; tail -5 <<<"$probe"
  exit 1
fi
grep -iE "GPU|cuda" <<<"$probe" | head -3

moe=(--model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.n_shared_experts=1 --model.aux_loss_coef=0.05
     --model.z_loss_coef=0.01)
# documents: the separator 96, then 0 to 11 tokens (tests/test_documents.sh's data)
"$PY" - "$tmp/doc_000000.bin" <<'PY'
import random, struct, sys
random.seed(5)
toks = []
while len(toks) < 30000:
    toks.append(96)
    n = random.randrange(12)
    toks += [(len(toks) * 7 + i) % 96 if random.random() > 0.1 else random.randrange(96) for i in range(n)]
toks = toks[:30000]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
    f.write(struct.pack("<%dH" % len(toks), *toks))
PY
docs=(--data.train="$tmp/doc_*.bin" --data.document_mask=true --data.separator=96)

# pair NAME ARGS...: the CPU run NAME_cpu and the GPU run NAME_gpu with the same arguments
pair() {
  local name="$1"; shift
  run 1 "${name}_cpu" "$@" || { bad "$name: CPU run failed: $(tail -3 "$tmp/${name}_cpu.log")"; return 1; }
  run 1 "${name}_gpu" $GPU "$@" || { bad "$name: GPU run failed: $(tail -3 "$tmp/${name}_gpu.log")"; return 1; }
}
# same A B LABEL: B's step-1 gradients and losses byte-identical to A's
same() {
  local a b
  a="$(grep -o '"\(loss\|grad_norm\)": [^,]*' "$tmp/$1.jsonl")"
  b="$(grep -o '"\(loss\|grad_norm\)": [^,]*' "$tmp/$2.jsonl")"
  if cmp -s "$tmp/$1.st" "$tmp/$2.st" && [ "$a" = "$b" ] && [ "$(wc -l <<<"$a")" -ge 20 ]; then
    ok; echo "$3: byte-identical"
  else
    bad "$3: not byte-identical"
  fi
}

# fp32: every case against its CPU run
for model in dense moe; do
  margs=(--training.micro_batch=8); [ $model = moe ] && margs+=("${moe[@]}")
  for mode in none selective full; do
    n="${model}_${mode}"
    if pair "$n" "${margs[@]}" --training.recompute=$mode; then
      out="$(compare "${n}_cpu" "${n}_gpu")" && ok || bad "$n: GPU differs from the CPU backend"
      echo "CASE fp32 $model recompute=$mode: $out"
    fi
  done
  for mode in selective full; do
    [ -f "$tmp/${model}_none_gpu.st" ] && [ -f "$tmp/${model}_${mode}_gpu.st" ] &&
      same "${model}_none_gpu" "${model}_${mode}_gpu" "RECOMPUTE fp32 $model GPU $mode vs none"
  done
done
for model in dense moe; do
  margs=(--training.micro_batch=8); [ $model = moe ] && margs+=("${moe[@]}")
  n="docs_$model"
  if pair "$n" "${margs[@]}" "${docs[@]}"; then
    out="$(compare "${n}_cpu" "${n}_gpu")" && ok || bad "$n: GPU differs from the CPU backend"
    echo "CASE fp32 $model documents: $out"
  fi
done
# no allocation in a step after the first, the device arena's included (pt_count_alloc per piece),
# and the arena's high-water mark reported
no_allocs() {
  local f="$tmp/$1.jsonl"
  if [ -f "$f" ] && "$PY" - "$f" <<'PY'; then ok; echo "ALLOCS $1: none after step 1"; else bad "$1: allocations after step 1 (or no device_peak_bytes)"; fi
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
assert len(rows) >= 10 and all(r["allocs"] == 0 for r in rows if r["step"] > 1), rows[:3]
assert all(r.get("device_peak_bytes", 0) > 0 for r in rows)
PY
}
no_allocs dense_none_gpu
no_allocs moe_none_gpu

# determinism: a GPU run repeated
run 1 dense_none_gpu2 $GPU --training.micro_batch=8 --training.recompute=none &&
  same dense_none_gpu dense_none_gpu2 "REPEAT fp32 dense GPU run twice" || bad "repeat run failed"

# bf16: against the CPU's bf16 run, within bf16's own distance from the CPU's fp32 run
bf16_pair() { # NAME FP32REF ARGS...
  local name="$1" ref="$2"; shift 2
  if pair "$name" $B16 "$@"; then
    out="$("$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --bf16 "$tmp" "$ref" "${name}_cpu" "${name}_gpu" "$name")" &&
      ok || bad "$name: GPU bf16 too far from the CPU's bf16 run"
    echo "BF16 $out"
  fi
}
for model in dense moe; do
  margs=(--training.micro_batch=8); [ $model = moe ] && margs+=("${moe[@]}")
  for mode in none selective full; do
    bf16_pair "${model}_bf16_${mode}" "${model}_none_cpu" "${margs[@]}" --training.recompute=$mode
  done
  for mode in selective full; do
    [ -f "$tmp/${model}_bf16_none_gpu.st" ] && [ -f "$tmp/${model}_bf16_${mode}_gpu.st" ] &&
      same "${model}_bf16_none_gpu" "${model}_bf16_${mode}_gpu" "RECOMPUTE bf16 $model GPU $mode vs none"
  done
done
bf16_pair docs_bf16 docs_dense_cpu --training.micro_batch=8 "${docs[@]}"
run 1 moe_bf16_none_gpu2 $GPU $B16 --training.micro_batch=8 "${moe[@]}" --training.recompute=none &&
  same moe_bf16_none_gpu moe_bf16_none_gpu2 "REPEAT bf16 moe GPU run twice" || bad "repeat run failed"

# PyTorch on the GPU: the reference model of tests/ref on CUDA against its own CPU run (informative)
TPY="${PT_GPU_PYTHON:-python3}"
if "$TPY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  "$TPY" - "$PT_SOURCE_DIR/tests/ref" "$tmp" <<'PY' || echo "TORCH reference on the GPU could not run"
import os, sys, math
sys.path.insert(0, sys.argv[1])
import torch
torch.manual_seed(1)
# the tiny model of parallel_common.sh in plain torch, fp32 without TF32, CPU vs CUDA gradients
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
V, C, L, H, KV, F, T, B = 97, 32, 2, 4, 2, 48, 16, 8
hd = C // H
def init():
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64) * 0.02
    p = {"emb": r(V, C), "head": r(V, C), "norm": torch.ones(C, dtype=torch.float64)}
    for l in range(L):
        p.update({"%d.an" % l: torch.ones(C, dtype=torch.float64), "%d.fn" % l: torch.ones(C, dtype=torch.float64),
                  "%d.q" % l: r(H * hd, C), "%d.k" % l: r(KV * hd, C), "%d.v" % l: r(KV * hd, C),
                  "%d.o" % l: r(C, H * hd), "%d.g" % l: r(F, C), "%d.u" % l: r(F, C), "%d.d" % l: r(C, F)})
    return p
def model(p, idx, tgt, dt, dev):
    p = {k: v.to(dev, dt).requires_grad_() for k, v in p.items()}
    rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=dev, dtype=dt) / hd))
    ang = torch.outer(torch.arange(T, device=dev, dtype=dt), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    rope = lambda x: x * cos + torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin
    x = p["emb"][idx.to(dev)]
    for l in range(L):
        h = rms(x, p["%d.an" % l])
        q = rope((h @ p["%d.q" % l].T).view(B, T, H, hd).transpose(1, 2))
        k = rope((h @ p["%d.k" % l].T).view(B, T, KV, hd).transpose(1, 2)).repeat_interleave(H // KV, 1)
        v = (h @ p["%d.v" % l].T).view(B, T, KV, hd).transpose(1, 2).repeat_interleave(H // KV, 1)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.transpose(1, 2).reshape(B, T, C) @ p["%d.o" % l].T
        h = rms(x, p["%d.fn" % l])
        x = x + (torch.nn.functional.silu(h @ p["%d.g" % l].T) * (h @ p["%d.u" % l].T)) @ p["%d.d" % l].T
    logits = rms(x, p["norm"]) @ p["head"].T
    loss = torch.nn.functional.cross_entropy(logits.view(-1, V), tgt.to(dev).view(-1))
    loss.backward()
    return loss.item(), {k: v.grad.double().cpu() for k, v in p.items()}
p = init()
g = torch.Generator().manual_seed(4)
idx = torch.randint(0, V, (B, T), generator=g); tgt = torch.randint(0, V, (B, T), generator=g)
l64, g64 = model(p, idx, tgt, torch.float64, "cpu")
for dev in ("cpu", "cuda"):
    l32, g32 = model(p, idx, tgt, torch.float32, dev)
    worst = max((g32[k] - g64[k]).norm().item() / g64[k].norm().item() for k in g64)
    print("TORCH %s fp32 vs fp64 (torch %s): loss %.1e relative, step-1 gradients worst %.1e" %
          (dev, torch.__version__, abs(l32 - l64) / l64, worst))
PY
else
  echo "TORCH skipped: $TPY has no torch with CUDA"
fi

echo "test_gpu_model: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
