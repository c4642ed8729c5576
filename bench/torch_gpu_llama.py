#!/usr/bin/env python3
"""torch_gpu_llama.py: the PyTorch peer of pentatron's GPU benchmark (bench/gpu_bench.sh).

    torch_gpu_llama.py data  --out FILE --tokens N [--max-token V] [--seed S]
        a uint32 token shard (pentatron's 256-int32 header: magic 20240801, version 7, count)
    torch_gpu_llama.py train --data FILE --metrics FILE [--mode eager|compile] [model options]
        the Llama of pentatron (RMSNorm, rotate-half rope, GQA, SwiGLU, tied or untied head; MoE
        layers with --experts E --top-k K --moe-ffn F: softmax router, top-k, experts looped as in
        Hugging Face's Mixtral), bf16 autocast on CUDA (fp32 master weights, gradients and fused
        AdamW), attention through F.scaled_dot_product_attention (causal: PyTorch picks its flash
        kernel for bf16 on sm80/sm90), global-norm clipping at 1.0; step s reads rows
        s*B .. s*B+B-1 of the shard (row i = tokens[i*T : i*T+T+1]), as pentatron with
        data.shuffle = false. --mode compile: each transformer block and the head + loss through
        torch.compile (one compiled function shared by the layers). One JSON line per step (step,
        loss, seconds, tokens_per_s) after a header line (torch, device, parameters,
        max_memory_reserved at the end in a last line).
    torch_gpu_llama.py kernels --json FILE [--seq T --heads H --kv-heads KV --head-dim D --batch B]
        [--gemm M,N,K ...]: SDPA causal fwd+bwd TFLOP/s (bf16; FLOPs as pentatron counts them:
        causal half of 4·T²·hd per head forward, 2× that backward), torch.matmul bf16 TFLOP/s at
        each GEMM shape (forward X·Wᵀ, dX = dY·W, dW = dYᵀ·X) and the measured peak (8192³ bf16).
Needs torch with CUDA (2.x); no numpy.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

MAGIC32, VERSION32 = 20240801, 7


def write_shard(path, n, max_token, seed):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, max_token, (n,), generator=g, dtype=torch.int32)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<256i", MAGIC32, VERSION32, n, *([0] * 253)))
        f.write(struct.pack("<%di" % n, *toks.tolist()))
    os.replace(path + ".tmp", path)


def read_shard(path):
    with open(path, "rb") as f:
        hdr = struct.unpack("<256i", f.read(1024))
        raw = f.read()
    width = 4 if hdr[0] == MAGIC32 else 2
    dt = torch.int32 if width == 4 else torch.int16
    t = torch.frombuffer(bytearray(raw), dtype=dt)[:hdr[2]].to(torch.int64)
    return t if width == 4 else t & 0xFFFF


def rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


def attention(q, k, v, H, KV):
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=(KV != H))
    except TypeError:  # torch < 2.5: no enable_gqa
        if KV != H:
            k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def dense_block(x, cos, sin, an, wqkv, wo, fn, w13, w2, H: int, KV: int, eps: float):
    B, T, C = x.shape
    hd = wo.shape[1] // H
    h = rms(x, an, eps)
    q, k, v = F.linear(h, wqkv).split([H * hd, KV * hd, KV * hd], dim=-1)
    q = rope(q.view(B, T, H, hd).transpose(1, 2), cos, sin)
    k = rope(k.view(B, T, KV, hd).transpose(1, 2), cos, sin)
    v = v.view(B, T, KV, hd).transpose(1, 2)
    o = attention(q, k, v, H, KV).transpose(1, 2).reshape(B, T, H * hd)
    x = x + F.linear(o, wo)
    h = rms(x, fn, eps)
    g, u = F.linear(h, w13).chunk(2, dim=-1)
    return x + F.linear(F.silu(g) * u, w2)


class Model(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        C, V = a.dim, a.vocab
        self.a, self.H, self.KV, self.hd = a, a.heads, a.kv_heads, a.dim // a.heads
        P = torch.nn.Parameter
        dev = "cuda"
        mat = lambda o, i: P(torch.randn(o, i, device=dev) * 0.02)
        self.embed = mat(V, C)
        self.head = None if a.tied else mat(V, C)
        self.norm = P(torch.ones(C, device=dev))
        self.layers = torch.nn.ModuleList()
        for l in range(a.layers):
            L = torch.nn.Module()
            L.an, L.fn = P(torch.ones(C, device=dev)), P(torch.ones(C, device=dev))
            L.wqkv = mat((self.H + 2 * self.KV) * self.hd, C)
            L.wo = mat(C, self.H * self.hd)
            L.moe = a.experts > 0
            if L.moe:
                L.router = mat(a.experts, C)
                L.w13 = P(torch.randn(a.experts, 2 * a.moe_ffn, C, device=dev) * 0.02)
                L.w2 = P(torch.randn(a.experts, C, a.moe_ffn, device=dev) * 0.02)
            else:
                L.w13, L.w2 = mat(2 * a.ffn, C), mat(C, a.ffn)
            self.layers.append(L)
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, self.hd, 2, device=dev).float() / self.hd))
        ang = torch.outer(torch.arange(a.seq, device=dev).float(), inv)
        emb = torch.cat([ang, ang], -1)
        self.register_buffer("cos", emb.cos()[None, None], persistent=False)
        self.register_buffer("sin", emb.sin()[None, None], persistent=False)
        self.block = dense_block
        self.head_loss = self._head_loss
        if a.mode == "compile":
            self.block = torch.compile(dense_block, dynamic=False)
            self.head_loss = torch.compile(self._head_loss, dynamic=False)

    def _head_loss(self, x, w, nw, tgt):
        x = rms(x, nw, self.a.eps)
        logits = F.linear(x, w)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), tgt.view(-1))

    def moe_block(self, x, L):
        a = self.a
        B, T, C = x.shape
        hd = self.hd
        h = rms(x, L.an, a.eps)
        q, k, v = F.linear(h, L.wqkv).split([self.H * hd, self.KV * hd, self.KV * hd], dim=-1)
        q = rope(q.view(B, T, self.H, hd).transpose(1, 2), self.cos, self.sin)
        k = rope(k.view(B, T, self.KV, hd).transpose(1, 2), self.cos, self.sin)
        v = v.view(B, T, self.KV, hd).transpose(1, 2)
        o = attention(q, k, v, self.H, self.KV).transpose(1, 2).reshape(B, T, self.H * hd)
        x = x + F.linear(o, L.wo)
        h = rms(x, L.fn, a.eps).view(-1, C)
        probs = F.linear(h.float(), L.router.float()).softmax(-1)
        w, e = probs.topk(a.top_k, dim=-1)
        out = torch.zeros_like(h, dtype=torch.float32)
        for j in range(a.experts):  # Mixtral's loop: the rows routed to expert j
            rows, slot = torch.where(e == j)
            if rows.numel() == 0:
                continue
            g, u = F.linear(h[rows], L.w13[j]).chunk(2, dim=-1)
            y = F.linear(F.silu(g) * u, L.w2[j])
            out.index_add_(0, rows, y.float() * w[rows, slot, None])
        return x + out.view(B, T, C).to(x.dtype)

    def forward(self, idx, tgt):
        T = idx.shape[1]
        x = F.embedding(idx, self.embed)
        cos, sin = self.cos[:, :, :T], self.sin[:, :, :T]
        for L in self.layers:
            if L.moe:
                x = self.moe_block(x, L)
            else:
                x = self.block(x, cos, sin, L.an, L.wqkv, L.wo, L.fn, L.w13, L.w2, self.H, self.KV,
                               self.a.eps)
        return self.head_loss(x, self.embed if self.head is None else self.head, self.norm, tgt)


def train(a):
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    toks = read_shard(a.data)
    B, T = a.batch, a.seq
    n_rows = (len(toks) - 1) // T
    m = Model(a)
    mats = [p for p in m.parameters() if p.dim() >= 2]
    vecs = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": mats, "weight_decay": 0.1}, {"params": vecs, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    out = open(a.metrics, "w")
    out.write(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                          "mode": a.mode, "params": sum(p.numel() for p in m.parameters())}) + "\n")
    out.flush()
    for step in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        rows = [(step * B + j) % n_rows for j in range(B)]
        batch = torch.stack([toks[r * T:r * T + T + 1] for r in rows]).cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = m(batch[:, :T], batch[:, 1:].contiguous())
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = loss.item()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        out.write(json.dumps({"step": step + 1, "loss": lv, "grad_norm": float(norm), "seconds": dt,
                              "tokens": B * T, "tokens_per_s": B * T / dt}) + "\n")
        out.flush()
        print("torch %s step %d/%d | loss %.4f | %.0f tok/s" % (a.mode, step + 1, a.steps, lv, B * T / dt),
              file=sys.stderr)
    out.write(json.dumps({"max_memory_allocated": torch.cuda.max_memory_allocated(),
                          "max_memory_reserved": torch.cuda.max_memory_reserved()}) + "\n")
    out.close()


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    best = 1e30
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) / 1e3)
    return best


def kernels(a):
    torch.backends.cuda.matmul.allow_tf32 = False
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    res["peak_bf16_tflops"] = 2 * n ** 3 / timed(lambda: x @ y, 10) / 1e12
    x32, y32 = x.float(), y.float()
    res["peak_fp32_tflops"] = 2 * n ** 3 / timed(lambda: x32 @ y32, 3) / 1e12
    del x, y, x32, y32
    B, H, KV, T, D = a.batch, a.heads, a.kv_heads, a.seq, a.head_dim
    q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, KV, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, KV, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    fwd_flops = B * H * 2.0 * 2.0 * D * T * T / 2  # causal: half of QKᵀ and PV
    tf = timed(lambda: attention(q, k, v, H, KV), 10)
    o = attention(q, k, v, H, KV)
    tb = timed(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), 10)
    res["sdpa"] = {"shape": [B, H, KV, T, D], "fwd_tflops": fwd_flops / tf / 1e12,
                   "bwd_tflops": 2 * fwd_flops / tb / 1e12,
                   "fwd_bwd_tflops": 3 * fwd_flops / (tf + tb) / 1e12, "fwd_ms": tf * 1e3, "bwd_ms": tb * 1e3}
    del q, k, v, do, o
    res["gemm"] = []
    for s in a.gemm:
        M, N, K = map(int, s.split(","))
        X = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        W = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        dY = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        f = 2.0 * M * N * K
        r = {"M": M, "N": N, "K": K,
             "fwd": f / timed(lambda: X @ W.t(), 10) / 1e12,
             "dX": f / timed(lambda: dY @ W, 10) / 1e12,
             "dW": f / timed(lambda: dY.t() @ X, 10) / 1e12}
        res["gemm"].append(r)
        del X, W, dY
    json.dump(res, open(a.json, "w"), indent=1)
    print(json.dumps(res, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data")
    d.add_argument("--out", required=True)
    d.add_argument("--tokens", type=int, required=True)
    d.add_argument("--max-token", type=int, default=32000)
    d.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("--data", required=True)
    t.add_argument("--metrics", required=True)
    t.add_argument("--mode", choices=("eager", "compile"), default="eager")
    t.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--batch", type=int, default=4)
    t.add_argument("--seq", type=int, default=2048)
    t.add_argument("--vocab", type=int, default=128256)
    t.add_argument("--dim", type=int, default=2048)
    t.add_argument("--layers", type=int, default=16)
    t.add_argument("--heads", type=int, default=32)
    t.add_argument("--kv-heads", type=int, default=8)
    t.add_argument("--ffn", type=int, default=8192)
    t.add_argument("--experts", type=int, default=0)
    t.add_argument("--top-k", type=int, default=2)
    t.add_argument("--moe-ffn", type=int, default=0)
    t.add_argument("--tied", type=int, default=1)
    t.add_argument("--rope-theta", type=float, default=500000.0)
    t.add_argument("--eps", type=float, default=1e-5)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--seed", type=int, default=1234)
    k = sub.add_parser("kernels")
    k.add_argument("--json", required=True)
    k.add_argument("--batch", type=int, default=4)
    k.add_argument("--seq", type=int, default=2048)
    k.add_argument("--heads", type=int, default=32)
    k.add_argument("--kv-heads", type=int, default=8)
    k.add_argument("--head-dim", type=int, default=64)
    k.add_argument("--gemm", nargs="*", default=[])
    a = ap.parse_args()
    if a.cmd == "data":
        write_shard(a.out, a.tokens, a.max_token, a.seed)
        return
    if not torch.cuda.is_available():
        sys.exit("torch_gpu_llama: no CUDA device for torch %s" % torch.__version__)
    train(a) if a.cmd == "train" else kernels(a)


if __name__ == "__main__":
    main()
