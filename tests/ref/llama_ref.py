#!/usr/bin/python3
"""PyTorch reference for pentatron's Llama model (end-to-end check).

Plain-torch re-implementation of Hugging Face transformers' LlamaForCausalLM
(v4.4x, eager attention, default rope) plus an AdamW training run.  It writes
a tiny random HF checkpoint (config.json + model.safetensors) and an
expected.safetensors with logits, loss, gradients (fp32 and fp64), per-step
losses / pre-clip grad norms, and final weights, for the C tests to compare.

Run with /usr/bin/python3 (Debian torch).  No transformers/safetensors needed:
safetensors files are written and read by hand.

    llama_ref.py --out DIR [options]      # generate reference data
    llama_ref.py --selfcheck [--out DIR]  # run internal consistency checks

--precision bf16 (default fp32, whose outputs are unchanged byte for byte) computes with the
mixed-precision model of docs/precision.md: fp32 master weights, gradients and AdamW; W16 = R(W)
for every tensor; bf16-valued activations rounded (R = round to nearest even) exactly where the
C model stores bf16; GEMMs on bf16 values summed in fp32 whose backward rounds the output's
gradient; attention with R(P) and R(out); mixture of experts with the router (logits, scores,
top-k, gates, capacity, balancing losses) in fp32 from the bf16 input and R(W_gate), its
gradient not rounded, each expert's gate/up outputs and SwiGLU product stored in bf16, its down
GEMM's output kept in fp32 and combined with the gates in fp32, the residual sum rounded once.
Its expected.safetensors has the same names as fp32 mode, now holding the bf16 model's results:
`logits`, `loss`, `grad.<name>` (step 1, of the fp32 masters), `losses`, `grad_norms`,
`final.<name>` (10 AdamW steps on the masters); no `logits64`/`loss64`/`grad64.*`.  Added, from
the same weights and data: the fp32 model's `fp32.logits`, `fp32.loss`, `fp32.grad.<name>` and
`fp32.losses` (so a test can state bf16's own distance from fp32), and metadata
precision=bf16.  The bf16-vs-fp32 distances per tensor are printed on stderr.
"""

import argparse
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------
# safetensors (by hand)
# --------------------------------------------------------------------------

_ST_DTYPES = {
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
}
_ST_DTYPES_INV = {v: k for k, v in _ST_DTYPES.items()}


def _tensor_bytes(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    arr = t.numpy()
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def save_safetensors(path, tensors, metadata=None):
    """tensors: ordered dict name -> torch.Tensor.  Writes F32/F64/I32/... ."""
    header = {}
    blobs = []
    off = 0
    for name, t in tensors.items():
        if t.dtype not in _ST_DTYPES:
            raise ValueError("unsupported dtype %s for %s" % (t.dtype, name))
        b = _tensor_bytes(t)
        header[name] = {
            "dtype": _ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [off, off + len(b)],
        }
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path):
    """Returns (dict name -> tensor, metadata dict)."""
    import numpy as np

    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    np_dt = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8", "F16": "<f2"}
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = info["dtype"]
        if dt == "BF16":
            a = np.frombuffer(data[b:e], dtype="<i2").copy()
            t = torch.from_numpy(a).view(torch.bfloat16)
        else:
            a = np.frombuffer(data[b:e], dtype=np_dt[dt]).copy()
            t = torch.from_numpy(a)
        out[name] = t.reshape(info["shape"])
    return out, meta


# --------------------------------------------------------------------------
# model (functional, parameters in a dict keyed by HF names)
# --------------------------------------------------------------------------


class Cfg:
    def __init__(self, vocab, dim, layers, heads, kv_heads, ffn, theta, eps, tied, head_dim=0,
                 rope=None):
        self.vocab, self.dim, self.layers = vocab, dim, layers
        self.heads, self.kv_heads, self.ffn = heads, kv_heads, ffn
        self.theta, self.eps, self.tied = float(theta), float(eps), bool(tied)
        if not head_dim and dim % heads:
            raise ValueError("dim must be divisible by heads (or give a head dim)")
        if heads % kv_heads:
            raise ValueError("heads must be divisible by kv-heads")
        self.hd = head_dim or dim // heads  # HF's head_dim: may differ from dim / heads
        # HF rope_scaling of rope_type "llama3" (a dict with factor, low_freq_factor,
        # high_freq_factor, original_max_position_embeddings) or None
        self.rope = rope
        if self.hd % 2:
            raise ValueError("head dim must be even")
        # mixture of experts (Mixtral layout, every layer; 0 experts = dense)
        self.experts, self.topk, self.moe_ffn, self.shared = 0, 2, ffn, 0
        self.aux, self.zloss, self.capacity, self.sigmoid = 0.0, 0.0, 0.0, False
        self.aux_sum = 0.0  # the last forward's balancing losses, summed over its sequences
        # the balancing loss's scope (--aux-scope): sequence, micro_batch or global; global's f
        # per MoE layer (prefix -> (E,) float64: the previous step's shares, uniform when absent)
        # and this step's token-slot counts
        self.aux_scope, self.aux_f, self.aux_count = "sequence", {}, {}
        self.moe_trace = None  # a list: every MoE layer appends its (sel, keep) (self-checks)
        # documents (data.document_mask): the token id that starts each document (None: plain
        # causal attention), and whether rope positions restart at each document's start
        self.doc_sep, self.pos_restart = None, False
        # attention biases: on q, k, v (Qwen 2, and Llama's attention_bias) and on o (Llama's)
        self.qkv_bias, self.o_bias = False, False


def param_names(cfg):
    names = ["model.embed_tokens.weight"]
    for i in range(cfg.layers):
        p = "model.layers.%d." % i
        names += [
            p + "input_layernorm.weight",
            p + "self_attn.q_proj.weight",
            p + "self_attn.k_proj.weight",
            p + "self_attn.v_proj.weight",
        ]
        if cfg.qkv_bias:
            names += [p + "self_attn.%s_proj.bias" % w for w in ("q", "k", "v")]
        names.append(p + "self_attn.o_proj.weight")
        if cfg.o_bias:
            names.append(p + "self_attn.o_proj.bias")
        names += [
            p + "post_attention_layernorm.weight",
        ]
        if not cfg.experts:
            names += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
            continue
        m = p + "block_sparse_moe."
        names.append(m + "gate.weight")
        if cfg.sigmoid:
            names.append(m + "gate.e_score_correction_bias")
        if cfg.shared:
            names += [m + "shared_experts.%s_proj.weight" % w for w in ("gate", "up", "down")]
        for e in range(cfg.experts):
            names += [m + "experts.%d.%s.weight" % (e, w) for w in ("w1", "w3", "w2")]
    names.append("model.norm.weight")
    if not cfg.tied:
        names.append("lm_head.weight")
    return names


def param_shape(cfg, name):
    C, V, F_, hd = cfg.dim, cfg.vocab, cfg.ffn, cfg.hd
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (V, C)
    if name.endswith("layernorm.weight") or name == "model.norm.weight":
        return (C,)
    if name.endswith("q_proj.weight"):
        return (cfg.heads * hd, C)
    if name.endswith("k_proj.weight") or name.endswith("v_proj.weight"):
        return (cfg.kv_heads * hd, C)
    if name.endswith("o_proj.weight"):
        return (C, cfg.heads * hd)
    if name.endswith("q_proj.bias"):
        return (cfg.heads * hd,)
    if name.endswith("k_proj.bias") or name.endswith("v_proj.bias"):
        return (cfg.kv_heads * hd,)
    if name.endswith("o_proj.bias"):
        return (C,)
    if name.endswith("block_sparse_moe.gate.weight"):
        return (cfg.experts, C)
    if name.endswith("e_score_correction_bias"):
        return (cfg.experts,)
    if "shared_experts" in name:
        Fs = cfg.shared * cfg.moe_ffn
        return (C, Fs) if name.endswith("down_proj.weight") else (Fs, C)
    if ".experts." in name:
        return (C, cfg.moe_ffn) if name.endswith("w2.weight") else (cfg.moe_ffn, C)
    if name.endswith("gate_proj.weight") or name.endswith("up_proj.weight"):
        return (F_, C)
    if name.endswith("down_proj.weight"):
        return (C, F_)
    raise KeyError(name)


def init_params(cfg, seed):
    """Deterministic fp32 init: matrices ~ N(0, 0.05), norm weights 1 + 0.1 N(0,1), attention
    biases 0.1 N(0,1)."""
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name in param_names(cfg):
        shape = param_shape(cfg, name)
        r = torch.randn(shape, generator=g, dtype=torch.float32)
        if name.endswith("e_score_correction_bias"):
            params[name] = 0.05 * r  # a selection bias that changes some choices
        elif name.endswith("_proj.bias"):
            params[name] = 0.1 * r  # attention biases: nonzero, so that they count
        elif len(shape) == 1:
            params[name] = 1.0 + 0.1 * r
        else:
            params[name] = 0.05 * r
    return params


def rms_norm(x, w, eps):
    # HF LlamaRMSNorm: computes in fp32 (here: in x's dtype, fp32 or fp64)
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rope_scaling_arg(a):
    """The HF rope_scaling dict of --rope-factor and its companions (None: no scaling)."""
    if not a.rope_factor:
        return None
    return {"rope_type": "llama3", "factor": a.rope_factor, "low_freq_factor": a.rope_low,
            "high_freq_factor": a.rope_high, "original_max_position_embeddings": a.rope_orig}


def rope_cos_sin(T, hd, theta, dtype, rope=None):
    # HF LlamaRotaryEmbedding (rope_type "default", or "llama3" when rope is its rope_scaling)
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).to(dtype) / hd))
    if rope is not None:
        # Llama 3.1's frequencies (transformers' _compute_llama3_parameters): wavelengths beyond
        # orig / low_freq_factor divided by factor, below orig / high_freq_factor kept, between
        # them a blend by s = (orig / wavelength - low) / (high - low)
        factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        orig = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > orig / lo, inv_freq / factor, inv_freq)
        s = (orig / wavelen - lo) / (hi - lo)
        smoothed = (1 - s) * scaled / factor + s * scaled
        medium = ~(wavelen < orig / hi) & ~(wavelen > orig / lo)
        inv_freq = torch.where(medium, smoothed, scaled)
    pos = torch.arange(T, dtype=dtype)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd)
    return emb.cos(), emb.sin()


def doc_starts(tokens, cfg):
    """(B, T) int64: for every token, the position where its document starts (the last
    separator at or before it, else 0); None without documents."""
    if cfg.doc_sep is None:
        return None
    B, T = tokens.shape
    idx = torch.arange(T).expand(B, T)
    at_sep = torch.where(tokens == cfg.doc_sep, idx, torch.zeros_like(idx))
    return torch.cummax(at_sep, dim=1).values


def attn_mask(tokens, cfg, dtype):
    """Additive attention mask: causal (T, T), or with documents (B, 1, T, T), where key j is
    visible to query i iff start[i] <= j <= i."""
    B, T = tokens.shape
    causal = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)
    st = doc_starts(tokens, cfg)
    if st is None:
        return causal
    j = torch.arange(T)
    before = j[None, None, :] < st[:, :, None]  # (B, Tq, Tk)
    return (causal[None] + torch.zeros(B, T, T, dtype=dtype).masked_fill(before, float("-inf")))[:, None]


def rope_tables(tokens, cfg, dtype):
    """cos, sin broadcastable to (B, H, T, hd): the positions 0..T-1, or with restarting
    documents each token's distance from its document's start."""
    B, T = tokens.shape
    cos, sin = rope_cos_sin(T, cfg.hd, cfg.theta, dtype, cfg.rope)
    st = doc_starts(tokens, cfg)
    if st is None or not cfg.pos_restart:
        return cos[None, None], sin[None, None]
    pos = torch.arange(T)[None, :] - st  # (B, T)
    return cos[pos][:, None], sin[pos][:, None]


def rotate_half(x):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((-x2, x1), dim=-1)


def swiglu32(h, w1, w3, w2):
    """An expert's (or the dense MLP's) SwiGLU, w2 · (silu(w1 · h) ∘ (w3 · h)), as a plain linear
    layer in h's dtype: moe_block's default expert."""
    return F.linear(F.silu(F.linear(h, w1)) * F.linear(h, w3), w2)


def moe_block(params, m, h, cfg, swiglu=swiglu32):
    """Mixtral's sparse MoE block (softmax router, top-k renormalised), shared experts, and the
    balancing losses per sequence (added to cfg.aux_sum): aux = coef·E·Σ_e f_e·P_e, f_e the
    sequence's share of token-slots routed to e, P_e its mean probability of e; z = coef·mean
    logsumexp(logits)².  swiglu(h, w1, w3, w2): every expert's and the shared experts' MLP (the
    bf16 model passes its rounded one; the router, its scores, the gates, the combine and the
    balancing losses are the same plain computation in both models).  If cfg.moe_trace is a list,
    (sel, keep) is appended to it (the self-checks compare two models' routing)."""
    B, T, C = h.shape
    E, k = cfg.experts, cfg.topk
    logits = F.linear(h, params[m + "gate.weight"])  # (B, T, E)
    if cfg.sigmoid:  # DeepSeek-V3: chosen by score + bias (no gradient), weights the scores
        scores = torch.sigmoid(logits)
        _, sel = torch.topk(scores + params[m + "gate.e_score_correction_bias"].detach(), k, dim=-1)
        wsel = torch.gather(scores, -1, sel)
        probs = scores / scores.sum(-1, keepdim=True)
    else:
        probs = torch.softmax(logits, dim=-1)
        wsel, sel = torch.topk(probs, k, dim=-1)  # (B, T, k); the test data has no ties
    wsel = wsel / wsel.sum(-1, keepdim=True)
    keep = torch.ones_like(wsel)
    if cfg.capacity > 0:
        # each expert keeps its first ⌈factor·N·k/E⌉ token-slots of the micro-batch, in token order
        cap = math.ceil(cfg.capacity * B * T * k / E)
        oh = F.one_hot(sel.reshape(-1), E)  # (N·k, E), slots in (token, j) order
        pos = ((oh.cumsum(0) - 1) * oh).sum(-1)
        keep = (pos < cap).to(h.dtype).reshape(sel.shape)
    if getattr(cfg, "moe_trace", None) is not None:
        cfg.moe_trace.append((sel.detach().clone(), keep.detach().clone()))
    out = torch.zeros_like(h)
    for e in range(E):
        w1 = params[m + "experts.%d.w1.weight" % e]
        w3 = params[m + "experts.%d.w3.weight" % e]
        w2 = params[m + "experts.%d.w2.weight" % e]
        y = swiglu(h, w1, w3, w2)  # every token (dense, exact)
        gate = (wsel * keep * (sel == e).to(h.dtype)).sum(-1, keepdim=True)  # 0: not chosen/dropped
        out = out + gate * y
    if cfg.shared:
        out = out + swiglu(h, params[m + "shared_experts.gate_proj.weight"],
                           params[m + "shared_experts.up_proj.weight"],
                           params[m + "shared_experts.down_proj.weight"])
    scope = getattr(cfg, "aux_scope", "sequence")
    if scope == "micro_batch":
        # Switch: f and P over the micro-batch's tokens, the micro-batch B of the batch's sequences
        f = F.one_hot(sel, E).to(h.dtype).sum(2).mean((0, 1)) / k  # (E)
        P = probs.mean((0, 1))
        cfg.aux_sum = cfg.aux_sum + cfg.aux * E * (f * P).sum() * B
    elif scope == "global":
        # f: the previous step's shares of token-slots over the global batch (uniform at the
        # first step); P over the step's tokens (the caller divides by the batch's sequences)
        f = cfg.aux_f.get(m, torch.full((E,), 1.0 / E, dtype=torch.float64)).to(h.dtype)
        cfg.aux_sum = cfg.aux_sum + cfg.aux * E * (f * probs.sum((0, 1)) / T).sum()
        cnt = F.one_hot(sel, E).sum((0, 1, 2)).double()  # this step's slots, before any drop
        cfg.aux_count[m] = cfg.aux_count.get(m, 0) + cnt
    else:
        f = F.one_hot(sel, E).to(h.dtype).sum(2).mean(1) / k  # (B, E): detached by construction
        P = probs.mean(1)  # (B, E)
        cfg.aux_sum = cfg.aux_sum + cfg.aux * E * (f * P).sum()
    cfg.aux_sum = cfg.aux_sum + cfg.zloss * (torch.logsumexp(logits, -1) ** 2).mean(1).sum()
    return out


def forward(params, tokens, cfg):
    """tokens (B, T) int64 -> logits (B, T, V) in the parameters' dtype. A MoE model's balancing
    losses, summed over the sequences, are left in cfg.aux_sum."""
    B, T = tokens.shape
    cfg.aux_sum = 0.0
    H, KV, hd = cfg.heads, cfg.kv_heads, cfg.hd
    dtype = params["model.embed_tokens.weight"].dtype
    x = F.embedding(tokens, params["model.embed_tokens.weight"])
    cos, sin = rope_tables(tokens, cfg, dtype)  # (1 or B, 1, T, hd)
    mask = attn_mask(tokens, cfg, dtype)
    rep = H // KV
    for i in range(cfg.layers):
        p = "model.layers.%d." % i
        h = rms_norm(x, params[p + "input_layernorm.weight"], cfg.eps)
        bq, bk, bv = (params.get(p + "self_attn.%s_proj.bias" % w) for w in ("q", "k", "v"))
        q = F.linear(h, params[p + "self_attn.q_proj.weight"], bq).view(B, T, H, hd).transpose(1, 2)
        k = F.linear(h, params[p + "self_attn.k_proj.weight"], bk).view(B, T, KV, hd).transpose(1, 2)
        v = F.linear(h, params[p + "self_attn.v_proj.weight"], bv).view(B, T, KV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # repeat_kv: query head h uses kv head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd) + mask
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + F.linear(y, params[p + "self_attn.o_proj.weight"], params.get(p + "self_attn.o_proj.bias"))
        h = rms_norm(x, params[p + "post_attention_layernorm.weight"], cfg.eps)
        if cfg.experts:
            x = x + moe_block(params, p + "block_sparse_moe.", h, cfg)
            continue
        m = F.silu(F.linear(h, params[p + "mlp.gate_proj.weight"])) * F.linear(
            h, params[p + "mlp.up_proj.weight"])
        x = x + F.linear(m, params[p + "mlp.down_proj.weight"])
    x = rms_norm(x, params["model.norm.weight"], cfg.eps)
    head = params["model.embed_tokens.weight" if cfg.tied else "lm_head.weight"]
    return F.linear(x, head)


def loss_sum(logits, targets):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                           ignore_index=-1, reduction="sum")


def make_leaf(params, dtype):
    return {k: v.detach().to(dtype).clone().requires_grad_(True) for k, v in params.items()}


def loss_and_grads(params0, tokens, targets, cfg, dtype, micro=None, fwd=forward):
    """Returns (logits or None, loss tensor, grads dict).  micro: micro-batch size; fwd: the
    model (forward, or forward_bf16 for the mixed-precision model)."""
    P = make_leaf(params0, dtype)
    B = tokens.shape[0]
    nvalid = int((targets != -1).sum())
    micro = micro or B
    cfg.aux_f, cfg.aux_count = {}, {}  # a first step: the global scope's f uniform
    logits_all = []
    total = 0.0
    for b0 in range(0, B, micro):
        lg = fwd(P, tokens[b0:b0 + micro], cfg)
        l = loss_sum(lg, targets[b0:b0 + micro]) / nvalid
        (l + cfg.aux_sum / B).backward()  # the balancing losses: a mean over the sequences
        total += l.detach()
        logits_all.append(lg.detach())
    # a parameter no gradient reaches (a router's selection bias) has a zero gradient
    return torch.cat(logits_all, 0), total, {
        k: v.grad.detach().clone() if v.grad is not None else torch.zeros_like(v.detach())
        for k, v in P.items()}


# --------------------------------------------------------------------------
# bf16 mixed precision (docs/precision.md: the specification of every rounding)
# --------------------------------------------------------------------------
#
# The masters stay fp32 leaves; the model computes with W16 = R(W) of each, every activation the
# C model stores in bf16 is rounded where the C model rounds it, and every GEMM takes the bf16
# values and accumulates in fp32 (a product of two bf16 numbers is exact in fp32, so an fp32 GEMM
# of bf16-valued fp32 tensors is what gemm_bf16 computes, up to the order of summation).  Every
# value is held as an fp32 tensor whose value happens to be a bf16 number; gradients are fp32.
#
# A mixture-of-experts layer (moe_block with swiglu16 as its experts) rounds at these points, xn the
# layer's input R(rmsnorm(x)) and W the W16 of every tensor:
#   router    logits = xn · W16(gate)ᵀ, a plain fp32 linear layer whose backward is fp32 too (no
#             R of dlogits); softmax / sigmoid scores, top-k, renormalised gates, capacity drops
#             and the balancing losses (aux, z) in fp32 exactly as the fp32 model; the sigmoid
#             router selects with the rounded bias R(e_score_correction_bias) (no gradient)
#   expert e  g = R(xn · W1ᵀ), u = R(xn · W3ᵀ), h = R(silu(g) ∘ u), y = h · W2ᵀ in fp32 (not
#             rounded); out += gate · y in fp32, so W2's GEMM backward rounds R(gate · dout)
#   shared    the same as an expert, gate 1: out += R(silu(R(xn·Wgᵀ)) ∘ R(xn·Wuᵀ)) · Wdᵀ (fp32)
#   residual  x = R(x + out), the fp32 sum rounded once, as after the dense MLP


def R(x):
    """Round to the nearest bf16 (ties to even: torch's float -> bfloat16 conversion), returned in
    x's dtype (fp32 values past bf16's range become inf)."""
    return x.bfloat16().to(x.dtype)


class RoundST(torch.autograd.Function):
    """R with a straight-through gradient: the forward rounds, the backward is the identity (the
    C model's backward reads the stored bf16 value but passes the gradient on unchanged)."""

    @staticmethod
    def forward(ctx, x):
        return R(x)

    @staticmethod
    def backward(ctx, g):
        return g


class Linear16(torch.autograd.Function):
    """y = a · W16ᵀ as gemm_bf16 computes it: a and W16 hold bf16 values, products are exact and
    the sum is fp32 (y is not rounded here; the caller rounds what the C model stores).  Backward
    rounds the output's gradient once, g16 = R(dy), as the C model does before its two GEMMs:
    da = g16 · W16, dW = g16ᵀ · a (fp32 accumulation).  rounding=False drops R(dy) (a plain
    linear layer, for the self-checks)."""

    @staticmethod
    def forward(ctx, a, w16, rounding=True):
        ctx.save_for_backward(a, w16)
        ctx.rounding = rounding
        return F.linear(a, w16)

    @staticmethod
    def backward(ctx, dy):
        a, w16 = ctx.saved_tensors
        g16 = R(dy) if ctx.rounding else dy
        da = g16 @ w16
        dw = g16.reshape(-1, g16.shape[-1]).t() @ a.reshape(-1, a.shape[-1])
        return da, dw, None


def _attention_probs(q, k, mask=None):
    """Causal scores s = q·kᵀ·scale, lse over the visible keys, P = exp(s − lse), all in q's dtype
    (masked entries: P = 0).  Shared by Attention16's forward and its backward's recomputation,
    so both see the same P bit for bit (as the C kernel's backward recomputes it from lse).
    mask: an additive mask (attn_mask: documents), else plain causal."""
    T, hd = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(hd)
    if mask is None:
        mask = torch.full((T, T), float("-inf"), dtype=q.dtype).triu(1)
    s = torch.matmul(q, k.transpose(-2, -1)) * scale + mask
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    return torch.exp(s - lse), scale


class Attention16(torch.autograd.Function):
    """Causal attention of the bf16 model.  q, k, v: (B, H, T, hd) bf16 values (k, v already
    repeated to the H query heads: GQA as in the fp32 path, the repeat's backward summing dk, dv
    over a group).  Forward: P = exp(s − lse) in fp32, P16 = R(P), out = P16 · v (fp32 sums),
    att = R(out), the bf16 value the C model stores.  Backward, from dout (the gradient of att,
    which is also that of the unrounded out: the final R is straight through):
    dv = P16ᵀ · dout, dP = dout · vᵀ, D = rowsum(dout ∘ att) with the *stored, rounded* att,
    dS = P ∘ (dP − D) with the *unrounded* P, dq = dS · k · scale, dk = dSᵀ · q · scale.
    rounding=False: P16 = P and att = out, i.e. exact softmax attention (for the self-checks)."""

    @staticmethod
    def forward(ctx, q, k, v, rounding=True, mask=None):
        P, _ = _attention_probs(q, k, mask)
        P16 = R(P) if rounding else P
        out = torch.matmul(P16, v)
        att = R(out) if rounding else out
        ctx.save_for_backward(q, k, v, att)
        ctx.rounding, ctx.mask = rounding, mask
        return att

    @staticmethod
    def backward(ctx, dout):
        q, k, v, att = ctx.saved_tensors
        P, scale = _attention_probs(q, k, ctx.mask)
        P16 = R(P) if ctx.rounding else P
        dv = torch.matmul(P16.transpose(-2, -1), dout)
        dP = torch.matmul(dout, v.transpose(-2, -1))
        D = (dout * att).sum(-1, keepdim=True)
        dS = P * (dP - D)
        dq = torch.matmul(dS, k) * scale
        dk = torch.matmul(dS.transpose(-2, -1), q) * scale
        return dq, dk, dv, None, None


def swiglu16(a, w1, w3, w2, rounding=True):
    """A MoE expert (or the shared experts) of the bf16 model: a and w1, w3, w2 hold bf16 values;
    g = R(a·w1ᵀ), u = R(a·w3ᵀ), h = R(silu(g) ∘ u) are what the C model stores, y = h·w2ᵀ is left
    in fp32 for the gated combine.  rounding=False: swiglu32's math (for the self-checks)."""
    rs = RoundST.apply if rounding else (lambda t: t)
    g = rs(Linear16.apply(a, w1, rounding))
    u = rs(Linear16.apply(a, w3, rounding))
    return Linear16.apply(rs(F.silu(g) * u), w2, rounding)


def forward_bf16(params, tokens, cfg, rounding=True):
    """The mixed-precision model of docs/precision.md.  params: the fp32 master leaves (their
    .grad is what is reported); tokens (B, T) -> logits (B, T, V) fp32, not rounded (the C model
    feeds its fp32 GEMM output straight to the cross-entropy).  rounding=False replaces every R by
    the identity: the same graph then computes the exact model (a self-check compares it with
    forward() in fp64).  A MoE layer is moe_block on W16 and xn with swiglu16 as every expert's
    MLP (the rounding points in the comment above); its balancing losses go to cfg.aux_sum."""
    cfg.aux_sum = 0.0
    rs = RoundST.apply if rounding else (lambda t: t)

    def lin(a, w16):
        return Linear16.apply(a, w16, rounding)

    def expert(a, w1, w3, w2):
        return swiglu16(a, w1, w3, w2, rounding)

    B, T = tokens.shape
    H, KV, hd = cfg.heads, cfg.kv_heads, cfg.hd
    # W16 = R(W) for every tensor, norm weights included; the gradient of W16 is the master's.
    # Tied: the head is the embedding's W16, so both uses' gradients add (fp32) into one master.
    W = {n: rs(w) for n, w in params.items()}
    emb = W["model.embed_tokens.weight"]
    x = F.embedding(tokens, emb)  # rows of E16: exact; the gradient scatters into E's rows (fp32)
    cos, sin = rope_tables(tokens, cfg, emb.dtype)
    mask = attn_mask(tokens, cfg, emb.dtype)
    rep = H // KV
    for i in range(cfg.layers):
        p = "model.layers.%d." % i
        # rmsnorm in fp32 from the bf16 x (statistics included), the result stored in bf16
        xn = rs(rms_norm(x, W[p + "input_layernorm.weight"], cfg.eps))
        # biases (their W16) added in fp32 to the GEMM's fp32 output, before rope and rounding
        q, k, v = (lin(xn, W[p + "self_attn.%s_proj.weight" % w]) for w in ("q", "k", "v"))
        if cfg.qkv_bias:
            q, k, v = (t + W[p + "self_attn.%s_proj.bias" % w] for t, w in ((q, "q"), (k, "k"), (v, "v")))
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, KV, hd).transpose(1, 2)
        v = v.view(B, T, KV, hd).transpose(1, 2)
        # rope in fp32 on the GEMM's output, then q, k, v are stored in bf16 (v unrotated)
        q = rs(q * cos + rotate_half(q) * sin)
        k = rs(k * cos + rotate_half(k) * sin)
        v = rs(v)
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = Attention16.apply(q, k, v, rounding, mask).transpose(1, 2).reshape(B, T, H * hd)
        # residual add in fp32 on the GEMM's fp32 output, the sum stored in bf16
        o = lin(y, W[p + "self_attn.o_proj.weight"])
        if cfg.o_bias:  # after the (tp-summed) product, in fp32
            o = o + W[p + "self_attn.o_proj.bias"]
        x = rs(x + o)
        xn = rs(rms_norm(x, W[p + "post_attention_layernorm.weight"], cfg.eps))
        if cfg.experts:
            # router in fp32 on the bf16 xn and W16(gate); experts rounded; combine in fp32
            x = rs(x + moe_block(W, p + "block_sparse_moe.", xn, cfg, swiglu=expert))
            continue
        g = rs(lin(xn, W[p + "mlp.gate_proj.weight"]))
        u = rs(lin(xn, W[p + "mlp.up_proj.weight"]))
        h = rs(F.silu(g) * u)  # SwiGLU in fp32 from the bf16 g, u
        x = rs(x + lin(h, W[p + "mlp.down_proj.weight"]))
    xf = rs(rms_norm(x, W["model.norm.weight"], cfg.eps))
    head = emb if cfg.tied else W["lm_head.weight"]
    return lin(xf, head)  # the head's backward rounds dlogits: R(dlogits), as every GEMM's


def rel_distance_report(tag, lg, g, lg_ref, g_ref, names, out=sys.stderr):
    """Prints ‖a − b‖/‖b‖ of the logits, of every gradient, and of all gradients together (b the
    fp32 run); returns (logits distance, overall gradient distance)."""
    lrel = rel(lg, lg_ref)
    print("%s logits  ‖Δ‖/‖fp32‖ = %.3e" % (tag, lrel), file=out)
    for n in names:
        print("%s grad    %-44s %.3e" % (tag, n, rel(g[n], g_ref[n])), file=out)
    d = torch.cat([(g[n].double() - g_ref[n].double()).reshape(-1) for n in names])
    r = torch.cat([g_ref[n].double().reshape(-1) for n in names])
    grel = float(torch.norm(d) / torch.norm(r))
    print("%s grad    %-44s %.3e" % (tag, "(all parameters together)", grel), file=out)
    return lrel, grel


# --------------------------------------------------------------------------
# data and training
# --------------------------------------------------------------------------


def make_data(cfg, steps, B, T, seed, ignore_frac):
    g = torch.Generator().manual_seed(seed + 1000003)
    tokens = torch.randint(0, cfg.vocab, (steps, B, T), generator=g, dtype=torch.int64)
    targets = torch.randint(0, cfg.vocab, (steps, B, T), generator=g, dtype=torch.int64)
    drop = torch.rand((steps, B, T), generator=g) < ignore_frac
    targets[drop] = -1
    if cfg.doc_sep is not None:
        # documents of a few tokens each: separators at about one position in five, and every
        # sequence's first one at position 0 or later (a first document without a separator)
        sep = torch.rand((steps, B, T), generator=g) < 0.2
        tokens[sep] = cfg.doc_sep
    for s in range(steps):
        if int((targets[s] != -1).sum()) == 0:
            targets[s, 0, 0] = int(torch.randint(0, cfg.vocab, (1,), generator=g))
    return tokens, targets


def train(params0, tokens, targets, cfg, a, fwd=forward):
    """AdamW on fp32 leaves.  With fwd=forward_bf16 these are the masters: every step's forward
    rounds them afresh (W16 = R(W)), so step s+1 computes with R of step s's update."""
    P = make_leaf(params0, torch.float32)
    names = list(P.keys())
    decay = [P[n] for n in names if P[n].dim() == 2]
    no_decay = [P[n] for n in names if P[n].dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(a.beta1, a.beta2), eps=a.adam_eps, weight_decay=a.wd)
    plist = [P[n] for n in names]
    B = tokens.shape[1]
    micro = a.micro_batch or B
    losses, gnorms = [], []
    cfg.aux_f = {}  # the global scope: uniform f at the first step
    for s in range(a.steps):
        opt.zero_grad(set_to_none=True)
        cfg.aux_count = {}
        tk, tg = tokens[s], targets[s]
        nvalid = int((tg != -1).sum())
        tot = 0.0
        for b0 in range(0, B, micro):
            lg = fwd(P, tk[b0:b0 + micro], cfg)
            l = loss_sum(lg, tg[b0:b0 + micro]) / nvalid
            (l + cfg.aux_sum / B).backward()
            tot += float(l.detach())
        if a.clip > 0:
            gn = torch.nn.utils.clip_grad_norm_(plist, a.clip)
        else:
            gn = torch.norm(torch.stack([torch.norm(p.grad.detach(), 2) for p in plist]), 2)
        losses.append(tot)
        gnorms.append(float(gn))
        opt.step()
        # the global scope: this step's token-slot shares are the next step's f
        cfg.aux_f = {m: c / c.sum() for m, c in cfg.aux_count.items()}
    return losses, gnorms, {k: v.detach().clone() for k, v in P.items()}


# --------------------------------------------------------------------------
# self-checks
# --------------------------------------------------------------------------


def naive_forward(params, tokens, cfg):
    """Independent per-token float64 loop implementation (python scalars for
    the norm / rope / softmax).  tokens: (T,) list.  Returns (T, V) tensor."""
    P = {k: v.detach().double() for k, v in params.items()}
    T = len(tokens)
    C, H, KV, hd = cfg.dim, cfg.heads, cfg.kv_heads, cfg.hd
    half = hd // 2

    def norm(vec, w):
        ms = sum(float(e) ** 2 for e in vec) / C
        r = 1.0 / math.sqrt(ms + cfg.eps)
        return torch.tensor([float(w[j]) * float(vec[j]) * r for j in range(C)], dtype=torch.float64)

    def rope(vec, t):
        # pairs (j, j+half) rotated by angle t * theta^(-2j/hd)
        out = [0.0] * hd
        for j in range(half):
            ang = t * cfg.theta ** (-2.0 * j / hd)
            c, s = math.cos(ang), math.sin(ang)
            a, b = float(vec[j]), float(vec[j + half])
            out[j] = a * c - b * s
            out[j + half] = b * c + a * s
        return out

    def mv(W, vec):
        return [sum(float(W[r, c]) * float(vec[c]) for c in range(W.shape[1])) for r in range(W.shape[0])]

    xs = [P["model.embed_tokens.weight"][tok].clone() for tok in tokens]
    # documents: token t sees keys start[t]..t and is rotated by t − start[t] when restarting
    start, s0 = [], 0
    for t in range(T):
        if cfg.doc_sep is not None and tokens[t] == cfg.doc_sep:
            s0 = t
        start.append(s0 if cfg.doc_sep is not None else 0)
    rpos = [t - start[t] if cfg.pos_restart else t for t in range(T)]
    for i in range(cfg.layers):
        p = "model.layers.%d." % i
        qs, ks, vs = [], [], []
        for t in range(T):
            h = norm(xs[t], P[p + "input_layernorm.weight"])
            q = mv(P[p + "self_attn.q_proj.weight"], h)
            k = mv(P[p + "self_attn.k_proj.weight"], h)
            v = mv(P[p + "self_attn.v_proj.weight"], h)
            qs.append([rope(q[hh * hd:(hh + 1) * hd], rpos[t]) for hh in range(H)])
            ks.append([rope(k[g * hd:(g + 1) * hd], rpos[t]) for g in range(KV)])
            vs.append([v[g * hd:(g + 1) * hd] for g in range(KV)])
        new = []
        for t in range(T):
            y = []
            for hh in range(H):
                g = hh // (H // KV)
                keys = range(start[t], t + 1)
                sc = [sum(qs[t][hh][d] * ks[s][g][d] for d in range(hd)) / math.sqrt(hd)
                      for s in keys]
                mx = max(sc)
                ex = [math.exp(e - mx) for e in sc]
                z = sum(ex)
                y += [sum(ex[n] / z * vs[s][g][d] for n, s in enumerate(keys)) for d in range(hd)]
            x = xs[t] + torch.tensor(mv(P[p + "self_attn.o_proj.weight"], y), dtype=torch.float64)
            h = norm(x, P[p + "post_attention_layernorm.weight"])
            gt = mv(P[p + "mlp.gate_proj.weight"], h)
            up = mv(P[p + "mlp.up_proj.weight"], h)
            m = [gv / (1.0 + math.exp(-gv)) * uv for gv, uv in zip(gt, up)]
            x = x + torch.tensor(mv(P[p + "mlp.down_proj.weight"], m), dtype=torch.float64)
            new.append(x)
        xs = new
    head = P["model.embed_tokens.weight" if cfg.tied else "lm_head.weight"]
    out = []
    for t in range(T):
        h = norm(xs[t], P["model.norm.weight"])
        out.append(torch.tensor(mv(head, h), dtype=torch.float64))
    return torch.stack(out)


def rel(a, b):
    a, b = a.double(), b.double()
    return float(torch.norm(a - b) / max(float(torch.norm(b)), 1e-300))


def selfcheck_bf16(a, rec, cfg, params, tk, tg, lg32, l32, g32, lg64, g64):
    """The bf16 reference's checks: its pieces against independent computations, its graph
    (roundings off) against the exact model, and its distance from fp32 (printed), for the dense
    model and (k) for mixture of experts."""
    gen = torch.Generator().manual_seed(a.seed + 101)

    # (e) R rounds to nearest, ties to even (bit arithmetic on the fp32 pattern); R_st's
    # gradient is the identity
    x = torch.cat([torch.randn(3000, generator=gen) * 10.0 ** e for e in (-30, -3, 0, 3, 30)])
    hi = torch.randint(0x0080, 0x7F00, (3000,), generator=gen, dtype=torch.int64)
    sign = torch.randint(0, 2, (3000,), generator=gen, dtype=torch.int64) << 31
    tie_bits = sign | (hi << 16) | 0x8000  # exactly halfway between two bf16 numbers
    tie_bits = torch.where(tie_bits >= 2 ** 31, tie_bits - 2 ** 32, tie_bits)
    x = torch.cat([x, tie_bits.to(torch.int32).view(torch.float32)])
    u = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    r = torch.where(r >= 2 ** 31, r - 2 ** 32, r).to(torch.int32)
    bad = int((R(x).view(torch.int32) != r).sum())
    xl = x.clone().requires_grad_(True)
    gx = torch.randn(x.shape, generator=gen)
    RoundST.apply(xl).backward(gx)
    bad += int((xl.grad != gx).sum())
    rec("(e) R = round to nearest even, R_st grad = identity (#bad)", float(bad), 0.5)

    # (f) linear16 against a manual fp64 computation: forward a·W16ᵀ, backward from R(dy)
    A = R(torch.randn(2, 5, 24, generator=gen))
    Wt = R(0.3 * torch.randn(16, 24, generator=gen))
    dy = torch.randn(2, 5, 16, generator=gen)  # not bf16 values: R(dy) matters
    Al, Wl = A.clone().requires_grad_(True), Wt.clone().requires_grad_(True)
    y = Linear16.apply(Al, Wl)
    y.backward(dy)
    g16 = R(dy).double()
    da = g16 @ Wt.double()
    dw = g16.reshape(-1, 16).t() @ A.double().reshape(-1, 24)
    rec("(f) linear16 forward vs fp64 a·W16ᵀ", rel(y, A.double() @ Wt.double().t()), 1e-6)
    rec("(f) linear16 da vs R(dy)·W16 (fp64)", rel(Al.grad, da), 1e-6)
    rec("(f) linear16 dW vs R(dy)ᵀ·a (fp64)", rel(Wl.grad, dw), 1e-6)
    rec("(f) the data exercises R(dy): da vs dy·W16", rel(Al.grad, dy.double() @ Wt.double()),
        1.0, lo=1e-4)

    # (g) Attention16 against autograd on the same math (roundings off), and its rounded
    # backward against the formulas computed independently in fp64
    def plain_attention(q, k, v):  # the fp32 path's attention, autograd's backward
        T, hd = q.shape[-2], q.shape[-1]
        mask = torch.full((T, T), float("-inf"), dtype=q.dtype).triu(1)
        s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd) + mask
        return torch.matmul(torch.softmax(s, dim=-1), v)

    Bq, Hq, Tq, hd = 2, 3, 7, 8
    qkv = [R(torch.randn(Bq, Hq, Tq, hd, generator=gen)) for _ in range(3)]
    dout = torch.randn(Bq, Hq, Tq, hd, generator=gen)
    for dt, tol in ((torch.float32, 2e-6), (torch.float64, 1e-12)):
        L1 = [t.to(dt).clone().requires_grad_(True) for t in qkv]
        L2 = [t.to(dt).clone().requires_grad_(True) for t in qkv]
        o1 = Attention16.apply(L1[0], L1[1], L1[2], False)
        o1.backward(dout.to(dt))
        o2 = plain_attention(*L2)
        o2.backward(dout.to(dt))
        worst = max([rel(o1, o2)] + [rel(t1.grad, t2.grad) for t1, t2 in zip(L1, L2)])
        rec("(g) attention, no rounding, vs autograd %s (out,dq,dk,dv)" % str(dt)[6:], worst, tol)
    L = [t.clone().requires_grad_(True) for t in qkv]
    att = Attention16.apply(L[0], L[1], L[2], True)
    att.backward(dout)
    q, k, v = (t.double() for t in qkv)
    scale = 1.0 / math.sqrt(hd)
    mask = torch.full((Tq, Tq), float("-inf"), dtype=torch.float64).triu(1)
    P = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * scale + mask, dim=-1)
    P16 = R(P.float()).double()
    out16 = R(torch.matmul(P16, v).float())
    rec("(g) attention forward vs R(R(P)·v) (fp64 P)", rel(att, out16), 1e-5)
    rec("(g) attention dv vs P16ᵀ·dout (fp64)",
        rel(L[2].grad, torch.matmul(P16.transpose(-2, -1), dout.double())), 1e-5)
    dP = torch.matmul(dout.double(), v.transpose(-2, -1))
    D = (dout.double() * att.double()).sum(-1, keepdim=True)  # the stored, rounded att
    dS = P * (dP - D)
    rec("(g) attention dq vs P∘(dP − rowsum(dout∘att))·k·scale (fp64)",
        rel(L[0].grad, torch.matmul(dS, k) * scale), 1e-5)
    rec("(g) attention dk vs (P∘(dP − D))ᵀ·q·scale (fp64)",
        rel(L[1].grad, torch.matmul(dS.transpose(-2, -1), q) * scale), 1e-5)
    Dx = (dout.double() * torch.matmul(P, v)).sum(-1, keepdim=True)  # exact softmax backward
    rec("(g) the data exercises D's rounded att: dq vs exact-D dq",
        rel(L[0].grad, torch.matmul(P * (dP - Dx), k) * scale), 1.0, lo=1e-4)

    # (h) the bf16 graph with every rounding off is the exact model (fp64): the same layers,
    # GQA mapping, rope, norms and tied head as forward()
    exact = lambda P_, t_, c_: forward_bf16(P_, t_, c_, rounding=False)  # noqa: E731
    lgx, lx, gx = loss_and_grads(params, tk, tg, cfg, torch.float64, fwd=exact)
    rec("(h) bf16 graph, rounding off, vs forward() fp64: logits", rel(lgx, lg64), 1e-12)
    rec("(h) bf16 graph, rounding off, vs forward() fp64: grads (max)",
        max(rel(gx[n], g64[n]) for n in g64), 1e-12)
    for bias in ("qkv", "qkvo"):  # attention biases: the same function in both graphs
        tcfg = Cfg(vocab=11, dim=12, layers=2, heads=3, kv_heads=1, ffn=10,
                   theta=a.theta, eps=a.eps, tied=0)
        tcfg.qkv_bias, tcfg.o_bias = True, bias == "qkvo"
        tp = init_params(tcfg, a.seed + 7)
        ttok = torch.randint(0, tcfg.vocab, (2, 5), generator=gen)
        ttg = torch.randint(0, tcfg.vocab, (2, 5), generator=gen)
        _, _, ga = loss_and_grads(tp, ttok, ttg, tcfg, torch.float64, fwd=exact)
        _, _, gb = loss_and_grads(tp, ttok, ttg, tcfg, torch.float64)
        rec("(h) bf16 graph, rounding off, vs forward() fp64 (%s biases)" % bias,
            max(rel(ga[n], gb[n]) for n in gb), 1e-12)
        rec("(h) the %s biases have gradients" % bias,
            1.0 / max(min(float(gb[n].norm()) for n in gb if n.endswith("bias")), 1e-300), 1e6)
    for tied in (0, 1):
        tcfg = Cfg(vocab=11, dim=12, layers=2, heads=3, kv_heads=1, ffn=10,
                   theta=a.theta, eps=a.eps, tied=tied)
        tp = init_params(tcfg, a.seed + 7)
        ttok = torch.randint(0, tcfg.vocab, (2, 5), generator=gen)
        ttg = torch.randint(0, tcfg.vocab, (2, 5), generator=gen)
        _, _, ga = loss_and_grads(tp, ttok, ttg, tcfg, torch.float64, fwd=exact)
        _, _, gb = loss_and_grads(tp, ttok, ttg, tcfg, torch.float64)
        rec("(h) bf16 graph, rounding off, vs forward() fp64 (tied=%d)" % tied,
            max(rel(ga[n], gb[n]) for n in gb), 1e-12)

    # (i) the bf16 model: its distance from fp32 on this config (printed per tensor), which
    # must be that of bf16 roundings: well above fp32's ~1e-7, well below O(1)
    lg16, l16, g16s = loss_and_grads(params, tk, tg, cfg, torch.float32, fwd=forward_bf16)
    lrel, grel = rel_distance_report("bf16-vs-fp32", lg16, g16s, lg32, g32, param_names(cfg))
    rec("(i) bf16 vs fp32: logits ‖Δ‖/‖fp32‖", lrel, 1e-1, lo=1e-3)
    rec("(i) bf16 vs fp32: all gradients ‖Δ‖/‖fp32‖", grel, 1e-1, lo=1e-3)
    rec("(i) bf16 vs fp32: loss (relative)", abs(float(l16) - float(l32)) / abs(float(l32)), 1e-2)

    # (j) gradient accumulation in bf16.  The math per sequence does not depend on the batch,
    # but the GEMMs' fp32 summation order does (another M), and a backward R(dy) that lands on
    # the other side of a bf16 rounding boundary moves a gradient by ~1e-4 of its norm: this is
    # the bf16 reference's own sensitivity to summation order (the C model's GEMMs sum in yet
    # another order), printed here; it must stay well below the bf16-vs-fp32 distance of (i).
    if a.batch > 1:
        _, lm, gm = loss_and_grads(params, tk, tg, cfg, torch.float32, micro=1, fwd=forward_bf16)
        d = torch.cat([(gm[n].double() - g16s[n].double()).reshape(-1) for n in g16s])
        r = torch.cat([g16s[n].double().reshape(-1) for n in g16s])
        rec("(j) bf16 micro-batch 1 vs full batch: grads (max)",
            max(rel(gm[n], g16s[n]) for n in g16s), 5e-3)
        rec("(j) bf16 micro-batch 1 vs full batch: grads (together)",
            float(torch.norm(d) / torch.norm(r)), 1e-3)
        rec("(j) bf16 micro-batch 1 vs full batch: loss",
            abs(float(lm) - float(l16)) / abs(float(l16)), 1e-6)

    # (k) mixture of experts in bf16 (moe_block with swiglu16 on W16; the routing code is the
    # fp32 model's).  Two set-ups: a softmax router with the aux and z losses, and a sigmoid
    # router (its selection bias) with a shared expert, capacity drops and the same losses.
    def moe_cfg(variant, **dims):
        c = Cfg(theta=a.theta, eps=a.eps, **dims)
        c.experts, c.topk, c.aux, c.zloss = 4, 2, 0.05, 0.01
        if variant:
            c.shared, c.sigmoid, c.capacity = 1, True, 0.5
        return c

    def routed(c, P_, tk_, tg_, dtype, fwd):
        # loss_and_grads, and every MoE layer's (sel, keep) and the balancing losses it computed
        c.moe_trace = []
        lg_, l_, g_ = loss_and_grads(P_, tk_, tg_, c, dtype, fwd=fwd)
        trace, c.moe_trace = c.moe_trace, None
        return lg_, l_, g_, trace, float(c.aux_sum)

    def routing_diff(t1, t2):
        # tokens routed differently: another set of experts, or other slots dropped (the order
        # of a token's k choices does not matter: its gates are summed per expert)
        def canon(sel, keep):
            s_, i_ = torch.sort(sel, -1)
            return s_, torch.gather(keep, -1, i_)
        n = 0
        for u1, u2 in zip(t1, t2):
            (s1, k1), (s2, k2) = canon(*u1), canon(*u2)
            n += int(((s1 != s2) | (k1 != k2)).any(-1).sum())
        return n

    variants = ((0, "softmax"), (1, "sigmoid+shared+capacity"))

    # (k1) the bf16 MoE graph with every rounding off is the exact MoE model (fp64), router
    # variants, shared expert, capacity drops, balancing losses and the tied head included
    small = dict(vocab=11, dim=12, layers=2, heads=3, kv_heads=1, ffn=10)
    ndiff, ndrop = 0, 0
    for variant, label in variants:
        c = moe_cfg(variant, tied=variant, **small)
        c.moe_ffn = 8
        tp = init_params(c, a.seed + 17 + variant)
        ttok = torch.randint(0, c.vocab, (2, 5), generator=gen)
        ttg = torch.randint(0, c.vocab, (2, 5), generator=gen)
        lga, _, ga, ta, auxa = routed(c, tp, ttok, ttg, torch.float64, exact)
        lgb, _, gb, tb, auxb = routed(c, tp, ttok, ttg, torch.float64, forward)
        ndiff += routing_diff(ta, tb)
        ndrop += sum(int((kp == 0).sum()) for _, kp in tb)
        rec("(k1) bf16 MoE graph, no rounding, vs forward() fp64 (%s): logits, aux" % label,
            max(rel(lga, lgb), abs(auxa - auxb) / abs(auxb)), 1e-12)
        rec("(k1) bf16 MoE graph, no rounding, vs forward() fp64 (%s): grads (max)" % label,
            max(rel(ga[n], gb[n]) for n in gb), 1e-12)
    rec("(k1) the two graphs route every token alike (#differing)", float(ndiff), 0.5)
    rec("(k1) the data exercises capacity drops (#dropped token-slots)", float(ndrop), 1e9, lo=1)

    # (k2) the bf16 MoE model's distance from fp32: that of bf16 roundings, on data both models
    # route alike.  Routing is discrete: bf16's ~2⁻⁹ relative perturbation of the router's input
    # changes the experts of a token whose k-th and (k+1)-th scores are that close (measured at
    # this size: ~1 token-layer in 140 with the softmax router, fewer with the sigmoid one, where
    # with capacity a change also shifts the later drops), and a token routed elsewhere moves its
    # experts' gradients by O(1), which is no measure of the roundings.  So seeds are tried until
    # fp32 and bf16 route every token alike (2 sequences of 16: most seeds do).  The bounds are
    # (i)'s; measured (--seed 1..7, 1 or 2 tries): logits 5.0e-3..7.7e-3, all gradients together
    # 5.7e-3..8.0e-3, per tensor at most 1.2e-2..2.0e-2 (as in the dense model: bf16's 2⁻⁹ grown
    # through two layers), loss and balancing losses 7e-5..5e-4 relative.
    mid = dict(vocab=97, dim=48, layers=2, heads=6, kv_heads=2, ffn=80)
    for variant, label in variants:
        c = moe_cfg(variant, tied=0, **mid)
        c.moe_ffn = 24
        for tries in range(1, 17):
            mp = init_params(c, a.seed + 300 + 10 * tries + variant)
            mtok, mtg = make_data(c, 1, 2, 16, a.seed + 300 + tries, a.ignore_frac)
            lgm32, lm32, gm32, t32, aux32 = routed(c, mp, mtok[0], mtg[0], torch.float32, forward)
            lgm16, lm16, gm16, t16, aux16 = routed(c, mp, mtok[0], mtg[0], torch.float32,
                                                   forward_bf16)
            if routing_diff(t32, t16) == 0:
                break
        names = param_names(c)
        rec("(k2) %s: seeds tried until fp32, bf16 route alike" % label, float(tries), 16.5)
        d = torch.cat([(gm16[n].double() - gm32[n].double()).reshape(-1) for n in names])
        r = torch.cat([gm32[n].double().reshape(-1) for n in names])
        rec("(k2) %s bf16 vs fp32: logits ‖Δ‖/‖fp32‖" % label, rel(lgm16, lgm32), 1e-1, lo=1e-3)
        rec("(k2) %s bf16 vs fp32: all gradients ‖Δ‖/‖fp32‖" % label,
            float(torch.norm(d) / torch.norm(r)), 1e-1, lo=1e-3)
        rec("(k2) %s bf16 vs fp32: gradients (max per tensor)" % label,
            max(rel(gm16[n], gm32[n]) for n in names), 1e-1)
        rec("(k2) %s bf16 vs fp32: loss, aux (relative)" % label,
            max(abs(float(lm16) - float(lm32)) / abs(float(lm32)), abs(aux16 - aux32) / abs(aux32)),
            1e-2)

    # (k3) moe_block with swiglu16 against a per-token computation in fp64 with R at the stated
    # points: the router in full precision, g, u, h rounded, y and the combine not
    def expert_ref(x, w1, w3, w2):
        g = R((w1 @ x).float()).double()
        u = R((w3 @ x).float()).double()
        h = R((g / (1.0 + torch.exp(-g)) * u).float()).double()
        return w2 @ h

    for variant, label in variants:
        c = moe_cfg(variant, tied=0, **small)
        c.moe_ffn, c.capacity = 8, 0.0
        mb = "model.layers.0.block_sparse_moe."
        W16 = {n: R(w) for n, w in init_params(c, a.seed + 23 + variant).items()}
        Wd = {n: w.double() for n, w in W16.items()}
        xn = R(torch.randn(2, 5, c.dim, generator=gen))
        out16 = moe_block(W16, mb, xn, c, swiglu=swiglu16)
        out32 = moe_block(W16, mb, xn, c)
        ref = torch.zeros(2, 5, c.dim, dtype=torch.float64)
        for b in range(2):
            for t in range(5):
                x = xn[b, t].double()
                lgt = Wd[mb + "gate.weight"] @ x
                if c.sigmoid:
                    sc = torch.sigmoid(lgt)
                    key = sc + Wd[mb + "gate.e_score_correction_bias"]
                else:
                    sc = key = torch.softmax(lgt, -1)
                sel = sorted(range(c.experts), key=lambda e: -float(key[e]))[:c.topk]
                tot = sum(float(sc[e]) for e in sel)
                for e in sel:
                    ref[b, t] += float(sc[e]) / tot * expert_ref(
                        x, *(Wd[mb + "experts.%d.%s.weight" % (e, w)] for w in ("w1", "w3", "w2")))
                if c.shared:
                    ref[b, t] += expert_ref(x, *(Wd[mb + "shared_experts.%s_proj.weight" % w]
                                                 for w in ("gate", "up", "down")))
        label = label.replace("+capacity", "")
        rec("(k3) MoE block, swiglu16, vs per-token R(g,u,h) fp64 (%s)" % label,
            rel(out16, ref), 1e-5)
        rec("(k3) the data exercises its roundings: vs the fp32 block (%s)" % label,
            rel(out16, out32), 1.0, lo=1e-4)


def selfcheck(a):
    results = []

    def rec(name, val, tol, lo=None):
        # lo: the value must also be at least lo (a distance that has to be there)
        ok = val < tol and (lo is None or val >= lo)
        results.append(ok)
        lim = "tol %.0e" % tol if lo is None else "in %.0e..%.0e" % (lo, tol)
        print("selfcheck %-52s %.3e  (%s)  %s" % (name, val, lim, "ok" if ok else "FAIL"),
              file=sys.stderr)

    cfg = Cfg(a.vocab, a.dim, a.layers, a.heads, a.kv_heads, a.ffn, a.theta, a.eps, a.tied,
              head_dim=a.head_dim, rope=rope_scaling_arg(a))
    params = init_params(cfg, a.seed)
    tokens, targets = make_data(cfg, 1, a.batch, a.seq, a.seed, a.ignore_frac)
    tk, tg = tokens[0], targets[0]

    # (a) fp32 vs fp64
    lg32, l32, g32 = loss_and_grads(params, tk, tg, cfg, torch.float32)
    lg64, l64, g64 = loss_and_grads(params, tk, tg, cfg, torch.float64)
    rec("(a) logits fp32 vs fp64", rel(lg32, lg64), 1e-5)
    rec("(a) loss fp32 vs fp64", abs(float(l32) - float(l64)) / abs(float(l64)), 1e-5)
    rec("(a) grads fp32 vs fp64 (max over params)", max(rel(g32[k], g64[k]) for k in g32), 1e-4)

    # (b) naive per-token loop, tiny GQA configs (tied and untied), odd T
    for tied in (0, 1):
        tcfg = Cfg(vocab=11, dim=12, layers=2, heads=3, kv_heads=1, ffn=10,
                   theta=a.theta, eps=a.eps, tied=tied)
        tp = init_params(tcfg, a.seed + 7)
        gtk = torch.Generator().manual_seed(a.seed + 11)
        ttok = torch.randint(0, tcfg.vocab, (2, 5), generator=gtk)
        P64 = {k: v.double() for k, v in tp.items()}
        vec = forward(P64, ttok, tcfg)
        nv = torch.stack([naive_forward(tp, ttok[b].tolist(), tcfg) for b in range(2)])
        rec("(b) vectorised vs naive loop fp64 (tied=%d)" % tied, rel(vec, nv), 1e-12)
    # (b') MHA (kv == heads) and a second GQA ratio
    for H, KV in ((4, 4), (4, 2)):
        tcfg = Cfg(vocab=9, dim=16, layers=1, heads=H, kv_heads=KV, ffn=6,
                   theta=500.0, eps=a.eps, tied=0)
        tp = init_params(tcfg, a.seed + 13)
        ttok = torch.randint(0, tcfg.vocab, (1, 7), generator=torch.Generator().manual_seed(3))
        vec = forward({k: v.double() for k, v in tp.items()}, ttok, tcfg)
        nv = naive_forward(tp, ttok[0].tolist(), tcfg)[None]
        rec("(b) vectorised vs naive loop fp64 (H=%d KV=%d)" % (H, KV), rel(vec, nv), 1e-12)
    # (b''') documents: block-causal attention, positions per sequence and restarting
    for restart in (False, True):
        tcfg = Cfg(vocab=9, dim=16, layers=2, heads=4, kv_heads=2, ffn=6,
                   theta=500.0, eps=a.eps, tied=0)
        tcfg.doc_sep, tcfg.pos_restart = 3, restart
        tp = init_params(tcfg, a.seed + 17)
        ttok = torch.tensor([[5, 1, 3, 2, 3, 7, 8, 0, 3], [3, 4, 4, 6, 1, 2, 3, 5, 5]])
        vec = forward({k: v.double() for k, v in tp.items()}, ttok, tcfg)
        nv = torch.stack([naive_forward(tp, ttok[b].tolist(), tcfg) for b in range(2)])
        rec("(b) documents vs naive loop fp64 (restart=%d)" % restart, rel(vec, nv), 1e-12)
        if restart:  # rope is relative: within a document, restarting changes nothing exactly
            rec("(b) documents: restart vs not, fp64 (rope is relative)", rel(vec, vec0), 1e-12)
        vec0 = vec
        plain = Cfg(vocab=9, dim=16, layers=2, heads=4, kv_heads=2, ffn=6, theta=500.0,
                    eps=a.eps, tied=0)
        rec("(b) documents change the logits (restart=%d)" % restart,
            1.0 / max(rel(vec, forward({k: v.double() for k, v in tp.items()}, ttok, plain)), 1e-300),
            1e3)
    # (b'') loss convention: mean CE over valid targets, computed by hand
    lsm = torch.log_softmax(lg64, -1)
    terms = [-float(lsm[b, t, int(tg[b, t])]) for b in range(tg.shape[0])
             for t in range(tg.shape[1]) if int(tg[b, t]) != -1]
    rec("(b) loss vs hand-computed masked mean CE", abs(sum(terms) / len(terms) - float(l64)), 1e-12)

    # (c) gradient accumulation == full batch
    for m in sorted({1, max(1, a.batch // 2)} if a.batch > 1 else {1}):
        if a.batch % m:
            continue
        _, lm, gm = loss_and_grads(params, tk, tg, cfg, torch.float32, micro=m)
        rec("(c) micro-batch %d vs full batch: grads fp32 (max)" % m,
            max(rel(gm[k], g32[k]) for k in g32), 1e-6)
        rec("(c) micro-batch %d vs full batch: loss fp32" % m,
            abs(float(lm) - float(l32)) / abs(float(l32)), 1e-6)
        _, _, gm64 = loss_and_grads(params, tk, tg, cfg, torch.float64, micro=m)
        rec("(c) micro-batch %d vs full batch: grads fp64 (max)" % m,
            max(rel(gm64[k], g64[k]) for k in g64), 1e-12)

    # (d) safetensors round trip
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        fn = os.path.join(d, "x.safetensors")
        src = {"a": lg32, "b": lg64, "c": tk.to(torch.int32), "d": torch.zeros(0)}
        save_safetensors(fn, src, {"k": 1})
        back, meta = load_safetensors(fn)
        with open(fn, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
        ok = all(torch.equal(src[k], back[k]) and src[k].dtype == back[k].dtype for k in src)
        ok = ok and meta == {"k": "1"} and n % 8 == 0
        rec("(d) safetensors round trip (0 = exact)", 0.0 if ok else 1.0, 0.5)

    # (e)..(k) the bf16 reference (--precision bf16), (k) its mixture of experts
    selfcheck_bf16(a, rec, cfg, params, tk, tg, lg32, l32, g32, lg64, g64)
    return all(results)


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--vocab", type=int, default=97)
    ap.add_argument("--dim", type=int, default=48)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=80)
    ap.add_argument("--seq", type=int, default=19)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--tied", type=int, default=0, choices=(0, 1))
    ap.add_argument("--theta", type=float, default=10000.0)
    ap.add_argument("--head-dim", type=int, default=0, help="head width (0 = dim / heads)")
    ap.add_argument("--rope-factor", type=float, default=0.0,
                    help="Llama 3 rope scaling factor (0 = none)")
    ap.add_argument("--rope-low", type=float, default=1.0, help="its low_freq_factor")
    ap.add_argument("--rope-high", type=float, default=4.0, help="its high_freq_factor")
    ap.add_argument("--rope-orig", type=int, default=8192,
                    help="its original_max_position_embeddings")
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--adam-eps", type=float, default=1e-8)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--ignore-frac", type=float, default=0.1)
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="micro-batch size (0 or >= batch: no accumulation)")
    ap.add_argument("--experts", type=int, default=0, help="MoE: experts per layer (0 = dense)")
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--moe-ffn", type=int, default=0)
    ap.add_argument("--shared", type=int, default=0, help="MoE: shared experts")
    ap.add_argument("--aux", type=float, default=0.0, help="MoE: aux loss coefficient")
    ap.add_argument("--zloss", type=float, default=0.0, help="MoE: z-loss coefficient")
    ap.add_argument("--capacity", type=float, default=0.0, help="MoE: capacity factor (0 = dropless)")
    ap.add_argument("--sigmoid", type=int, default=0, choices=(0, 1), help="MoE: sigmoid router")
    ap.add_argument("--aux-scope", default="sequence", choices=("sequence", "micro_batch", "global"),
                    help="MoE: the balancing loss's scope (model.aux_loss_scope)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                    help="bf16: the mixed-precision model of docs/precision.md (fp32 masters, "
                    "bf16 weights and activations); the fp32 run's results go in as fp32.*")
    ap.add_argument("--attn-bias", default="none", choices=("none", "qkv", "qkvo"),
                    help="attention biases: qkv (Qwen 2) or qkvo (Llama's attention_bias)")
    ap.add_argument("--doc-sep", type=int, default=-1,
                    help="documents: the token id that starts each document (data.separator; "
                    "-1 = none); make_data puts it at about one position in five")
    ap.add_argument("--pos-restart", type=int, default=0, choices=(0, 1),
                    help="with --doc-sep: rope positions restart per document")
    ap.add_argument("--selfcheck", action="store_true")
    a = ap.parse_args(argv)
    if not a.out and not a.selfcheck:
        ap.error("--out is required (unless --selfcheck)")
    if a.micro_batch <= 0 or a.micro_batch >= a.batch:
        a.micro_batch = 0
    elif a.batch % a.micro_batch:
        ap.error("--batch must be a multiple of --micro-batch")
    if a.steps < 1 or a.batch < 1 or a.seq < 1:
        ap.error("--steps, --batch and --seq must be >= 1")
    return a


def generate(a):
    cfg = Cfg(a.vocab, a.dim, a.layers, a.heads, a.kv_heads, a.ffn, a.theta, a.eps, a.tied,
              head_dim=a.head_dim, rope=rope_scaling_arg(a))
    cfg.experts, cfg.topk, cfg.moe_ffn, cfg.shared = a.experts, a.topk, a.moe_ffn or a.ffn, a.shared
    cfg.aux, cfg.zloss, cfg.capacity, cfg.sigmoid = a.aux, a.zloss, a.capacity, bool(a.sigmoid)
    cfg.aux_scope = a.aux_scope
    cfg.doc_sep = a.doc_sep if a.doc_sep >= 0 else None
    cfg.qkv_bias, cfg.o_bias = a.attn_bias != "none", a.attn_bias == "qkvo"
    cfg.pos_restart = bool(a.pos_restart)
    params = init_params(cfg, a.seed)
    tokens, targets = make_data(cfg, a.steps, a.batch, a.seq, a.seed, a.ignore_frac)

    mdir = os.path.join(a.out, "model")
    os.makedirs(mdir, exist_ok=True)
    config = {
        "architectures": ["Qwen2ForCausalLM" if a.attn_bias == "qkv" else "LlamaForCausalLM"],
        "model_type": "qwen2" if a.attn_bias == "qkv" else "llama",
        "vocab_size": cfg.vocab,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.hd,
        "max_position_embeddings": max(a.seq, 64),
        "rope_theta": cfg.theta,
        "rope_scaling": cfg.rope,
        "rms_norm_eps": cfg.eps,
        "tie_word_embeddings": cfg.tied,
        "hidden_act": "silu",
        "attention_bias": a.attn_bias == "qkvo",
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "torch_dtype": "float32",
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if cfg.experts:
        config.update({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                       "num_local_experts": cfg.experts, "num_experts_per_tok": cfg.topk,
                       "moe_intermediate_size": cfg.moe_ffn, "n_shared_experts": cfg.shared,
                       "router_aux_loss_coef": cfg.aux, "router_z_loss_coef": cfg.zloss,
                       "capacity_factor": cfg.capacity,
                       "scoring_func": "sigmoid" if cfg.sigmoid else "softmax"})
    cfg_path = os.path.join(mdir, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    model_path = os.path.join(mdir, "model.safetensors")
    save_safetensors(model_path, params, {"format": "pt"})

    tk, tg = tokens[0], targets[0]
    names = param_names(cfg)
    exp = {}
    exp["tokens"] = tokens.to(torch.int32)
    exp["targets"] = targets.to(torch.int32)
    lg32, l32, g32 = loss_and_grads(params, tk, tg, cfg, torch.float32)
    if a.precision == "bf16":
        # the bf16 model's results under the fp32 names (what the C bf16 model must match),
        # then the fp32 model's from the same weights and data as fp32.* (bf16's own distance)
        lg16, l16, g16 = loss_and_grads(params, tk, tg, cfg, torch.float32, fwd=forward_bf16)
        losses, gnorms, final = train(params, tokens, targets, cfg, a, fwd=forward_bf16)
        losses32, _, _ = train(params, tokens, targets, cfg, a)
        exp["logits"] = lg16.float()
        exp["loss"] = l16.reshape(1).float()
        for n in names:
            exp["grad." + n] = g16[n].float()
    else:
        lg64, l64, g64 = loss_and_grads(params, tk, tg, cfg, torch.float64)
        losses, gnorms, final = train(params, tokens, targets, cfg, a)
        exp["logits"] = lg32.float()
        exp["logits64"] = lg64.double()
        exp["loss"] = l32.reshape(1).float()
        exp["loss64"] = l64.reshape(1).double()
        for n in names:
            exp["grad." + n] = g32[n].float()
        for n in names:
            exp["grad64." + n] = g64[n].double()
    exp["losses"] = torch.tensor(losses, dtype=torch.float64)
    exp["grad_norms"] = torch.tensor(gnorms, dtype=torch.float64)
    for n in names:
        exp["final." + n] = final[n].float()
    if a.precision == "bf16":
        exp["fp32.logits"] = lg32.float()
        exp["fp32.loss"] = l32.reshape(1).float()
        for n in names:
            exp["fp32.grad." + n] = g32[n].float()
        exp["fp32.losses"] = torch.tensor(losses32, dtype=torch.float64)
    meta = {k: getattr(a, k) for k in (
        "vocab", "dim", "layers", "heads", "kv_heads", "ffn", "seq", "batch", "tied", "theta",
        "eps", "seed", "steps", "lr", "beta1", "beta2", "adam_eps", "wd", "clip",
        "ignore_frac")}
    meta["micro_batch"] = a.micro_batch or a.batch
    meta["head_dim"] = cfg.hd
    meta["torch_version"] = torch.__version__
    if a.precision == "bf16":  # (fp32 files keep their metadata exactly as before)
        meta["precision"] = "bf16"
    meta = {k: repr(v) if isinstance(v, float) else str(v) for k, v in meta.items()}
    exp_path = os.path.join(a.out, "expected.safetensors")
    save_safetensors(exp_path, exp, meta)

    if a.precision == "bf16":
        lrel, grel = rel_distance_report("bf16-vs-fp32", lg16, g16, lg32, g32, names)
        summary = {
            "precision": "bf16", "loss": float(l16), "fp32_loss": float(l32),
            "final_loss": losses[-1], "fp32_final_loss": losses32[-1],
            "logits_rel_fp32": lrel, "grads_rel_fp32": grel,
        }
    else:
        summary = {"loss": float(l32), "loss64": float(l64), "final_loss": losses[-1]}
    summary.update({
        "n_valid": int((tg != -1).sum()),
        "config": os.path.abspath(cfg_path), "model": os.path.abspath(model_path),
        "expected": os.path.abspath(exp_path),
    })
    print(json.dumps(summary))


def main(argv):
    torch.set_num_threads(1)
    try:
        torch.use_deterministic_algorithms(True)
    except Exception:
        pass
    a = parse_args(argv)
    ok = True
    if a.selfcheck:
        ok = selfcheck(a)
        print("selfcheck %s" % ("PASSED" if ok else "FAILED"), file=sys.stderr)
    if a.out:
        generate(a)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
