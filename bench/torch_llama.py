#!/usr/bin/python3
"""torch_llama.py: the PyTorch peer of pentatron's speed benchmark.

Trains the same Llama model as pentatron (RMSNorm, rotary "rotate half", GQA, SwiGLU,
untied head unless --tied) with AdamW (decay on matrices only, global-norm clipping,
cosine schedule) on the same batches of the same llm.c shard in the same order
(step s uses rows s*G .. s*G+G-1, row i = tokens[i*T : i*T+T+1], no shuffle).
Writes one JSON object per step (step, loss, seconds, tokens_per_s) like pentatron's
logging.metrics, plus a header line with the torch build and BLAS in use.

--autocast-bf16: PyTorch's standard CPU mixed precision. The forward and the loss run under
torch.autocast("cpu", dtype=torch.bfloat16) (autocast casts the inputs of its lower-precision
ops, among them linear, matmul, bmm and baddbmm, to bf16; PyTorch runs those bf16 GEMMs through
oneDNN/mkldnn where the CPU has AVX-512, and keeps its fp32-list ops in fp32); backward runs
outside the autocast region as usual; the parameters (fp32 masters), their gradients, clipping
and AdamW stay fp32. No loss scaling (bf16 has fp32's exponent range).

Run with /usr/bin/python3 (Debian torch 1.13); bench/run_bench.sh sets the BLAS
variant, OPENBLAS_CORETYPE, thread counts and jemalloc for it.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def load_shard(path):
    hdr = np.fromfile(path, dtype="<i4", count=256)
    if hdr[0] != 20240520 or hdr[1] != 1:
        raise SystemExit("%s: not an llm.c token shard" % path)
    toks = np.memmap(path, dtype="<u2", mode="r", offset=256 * 4, shape=(int(hdr[2]),))
    return toks


class Llama(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        C, V, Fd = a.dim, a.vocab_size, a.ffn_dim
        self.H, self.KV, self.hd = a.n_heads, a.n_kv_heads, a.dim // a.n_heads
        self.eps, self.tied = a.norm_eps, a.tied
        P = torch.nn.Parameter
        std = a.init_std

        def mat(o, i):
            return P(torch.randn(o, i) * std)

        self.embed = P(torch.randn(V, C) * std)
        self.layers = torch.nn.ModuleList()
        for _ in range(a.n_layers):
            L = torch.nn.Module()
            L.attn_norm = P(torch.ones(C))
            L.wqkv = mat((self.H + 2 * self.KV) * self.hd, C)  # q, k, v stacked: one GEMM
            L.wo = mat(C, self.H * self.hd)
            L.ffn_norm = P(torch.ones(C))
            L.w13 = mat(2 * Fd, C)  # gate and up stacked: one GEMM
            L.w2 = mat(C, Fd)
            self.layers.append(L)
        self.norm = P(torch.ones(C))
        self.head = None if a.tied else mat(V, C)
        # rope tables (HF rotate_half convention)
        inv = 1.0 / (a.rope_theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        ang = torch.outer(torch.arange(a.seq_len, dtype=torch.float32), inv)
        emb = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", emb.cos()[None, None], persistent=False)
        self.register_buffer("sin", emb.sin()[None, None], persistent=False)
        self.register_buffer("mask", torch.full((a.seq_len, a.seq_len), float("-inf")).triu(1),
                             persistent=False)

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x):
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * self.cos + rot * self.sin

    def forward(self, idx, tgt):
        B, T = idx.shape
        H, KV, hd = self.H, self.KV, self.hd
        x = F.embedding(idx, self.embed)
        for L in self.layers:
            h = self.rms(x, L.attn_norm)
            qkv = F.linear(h, L.wqkv)
            q, k, v = qkv.split([H * hd, KV * hd, KV * hd], dim=-1)
            q = self.rope(q.view(B, T, H, hd).transpose(1, 2))
            k = self.rope(k.view(B, T, KV, hd).transpose(1, 2))
            v = v.view(B, T, KV, hd).transpose(1, 2)
            if KV != H:
                k = k.repeat_interleave(H // KV, dim=1)
                v = v.repeat_interleave(H // KV, dim=1)
            s = torch.baddbmm(self.mask[:T, :T], q.reshape(B * H, T, hd),
                              k.reshape(B * H, T, hd).transpose(1, 2), alpha=1.0 / math.sqrt(hd))
            o = torch.bmm(s.softmax(-1), v.reshape(B * H, T, hd))
            o = o.view(B, H, T, hd).transpose(1, 2).reshape(B, T, H * hd)
            x = x + F.linear(o, L.wo)
            h = self.rms(x, L.ffn_norm)
            g, u = F.linear(h, L.w13).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, L.w2)
        x = self.rms(x, self.norm)
        logits = F.linear(x, self.embed if self.head is None else self.head)
        return F.cross_entropy(logits.view(B * T, -1), tgt.view(B * T))


def blas_in_use():
    """The BLAS library actually mapped into this process (from /proc/self/maps)."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                if "blas" in p or "dnnl" in p or "jemalloc" in p:
                    libs.add(os.path.realpath(p))
    except OSError:
        pass
    return sorted(libs)


def cpu_capability():
    """ATen's vector ISA for its own kernels (AVX2 unless ATEN_CPU_CAPABILITY asks for more)."""
    try:
        return torch.backends.cpu.get_cpu_capability()  # torch >= 2.0
    except AttributeError:
        m = [l for l in torch.__config__.show().splitlines() if "CPU capability usage" in l]
        return m[0].split(":")[-1].strip() if m else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--metrics", required=True, help="JSON lines output")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--vocab-size", type=int, default=50257)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--n-kv-heads", type=int, default=4)
    ap.add_argument("--ffn-dim", type=int, default=688)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--norm-eps", type=float, default=1e-6)
    ap.add_argument("--init-std", type=float, default=0.02)
    ap.add_argument("--tied", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--min-lr", type=float, default=0.1, help="fraction of lr at the end of the cosine")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--autocast-bf16", action="store_true",
                    help='forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)')
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(a.seed)
    G, mb, T = a.global_batch, a.micro_batch, a.seq_len
    toks = load_shard(a.data)
    n_rows = (len(toks) - 1) // T

    model = Llama(a)
    matrices = [p for p in model.parameters() if p.dim() == 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": a.weight_decay},
                             {"params": vectors, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, foreach=True)

    def lr_at(step):  # cosine from lr to min_lr*lr over the run, no warmup (pentatron's default)
        frac = step / max(1, a.steps)
        return a.lr * (a.min_lr + (1 - a.min_lr) * 0.5 * (1 + math.cos(math.pi * frac)))

    out = open(a.metrics, "w")
    out.write(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                          "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
                          "libs": blas_in_use(),
                          "precision": "autocast-bf16" if a.autocast_bf16 else "fp32",
                          "mkldnn": torch.backends.mkldnn.is_available(),
                          "cpu_capability": cpu_capability(),
                          "params": sum(p.numel() for p in model.parameters())}) + "\n")
    out.flush()
    for step in range(a.steps):
        t0 = time.perf_counter()
        rows = [(step * G + j) % n_rows for j in range(G)]
        batch = np.stack([np.asarray(toks[r * T:r * T + T + 1], dtype=np.int64) for r in rows])
        batch = torch.from_numpy(batch)
        inputs, targets = batch[:, :T], batch[:, 1:].contiguous()
        for p in model.parameters():
            p.grad = None
        loss_sum = 0.0
        for k in range(G // mb):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast_bf16):
                loss = model(inputs[k * mb:(k + 1) * mb], targets[k * mb:(k + 1) * mb])
            (loss * (mb / G)).backward()
            loss_sum += loss.item() * (mb / G)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                              a.grad_clip if a.grad_clip > 0 else float("inf"))
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        dt = time.perf_counter() - t0
        rec = {"step": step + 1, "loss": loss_sum, "grad_norm": float(norm), "lr": lr_at(step),
               "tokens": G * T, "seconds": dt, "tokens_per_s": G * T / dt}
        out.write(json.dumps(rec) + "\n")
        out.flush()
        print("torch step %d/%d | loss %.4f | %.0f tok/s" % (step + 1, a.steps, loss_sum, G * T / dt),
              file=sys.stderr)
    out.close()


if __name__ == "__main__":
    main()
