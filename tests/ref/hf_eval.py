#!/usr/bin/env python3
"""hf_eval.py MODEL_DIR TOKENS_JSON OUT: reads a Hugging Face Llama, Qwen 2 or Mixtral directory the way
transformers would (config.json keys, safetensors tensors by Hugging Face names,
tie_word_embeddings), runs it on the tokens (a JSON list of lists), writes logits (B, T, V) F32 to
OUT (safetensors). Llama (attention_bias: q, k, v and o biases) and Qwen 2 (q, k and v biases): the
reference model of llama_ref.py. Mixtral: mixtral_forward below,
written from transformers' MixtralForCausalLM (Llama's attention; MixtralSparseMoeBlock: router
softmax in float, top-k, the chosen weights renormalised, each expert's SwiGLU on its tokens added
with index_add_), not from llama_ref's MoE. Any other architecture (PentatronMoeForCausalLM: what
transformers does not implement) exits 2 naming it. Used by tests/test_train.c to check
pentatron's export end to end."""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402


def mixtral_moe(x, p, prefix, conf):
    """MixtralSparseMoeBlock on hidden states x (B, T, C)."""
    B, T, C = x.shape
    h = x.reshape(-1, C)
    router_logits = F.linear(h, p[prefix + "gate.weight"])
    routing_weights = torch.softmax(router_logits, dim=1, dtype=torch.float)
    routing_weights, selected = torch.topk(routing_weights, conf["num_experts_per_tok"], dim=-1)
    routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
    routing_weights = routing_weights.to(h.dtype)
    final = torch.zeros_like(h)
    for e in range(conf["num_local_experts"]):
        idx, top_x = torch.where(selected == e)
        if idx.numel() == 0:
            continue
        w1, w2, w3 = (p[prefix + "experts.%d.%s.weight" % (e, n)] for n in ("w1", "w2", "w3"))
        cur = h[idx]
        y = F.linear(F.silu(F.linear(cur, w1)) * F.linear(cur, w3), w2)
        final.index_add_(0, idx, y * routing_weights[idx, top_x, None])
    return final.reshape(B, T, C)


def mixtral_forward(p, tokens, conf):
    """MixtralForCausalLM: embedding, per layer RMSNorm, Llama attention (rotary, GQA, causal),
    residual, RMSNorm, the sparse MoE block, residual; final RMSNorm and the head."""
    B, T = tokens.shape
    C, H = conf["hidden_size"], conf["num_attention_heads"]
    KV = conf.get("num_key_value_heads", H)
    hd = conf.get("head_dim") or C // H
    eps = conf.get("rms_norm_eps", 1e-6)
    x = F.embedding(tokens, p["model.embed_tokens.weight"])
    cos, sin = llama_ref.rope_cos_sin(T, hd, conf.get("rope_theta", 1e6), x.dtype)
    cos, sin = cos[None, None], sin[None, None]
    mask = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
    for i in range(conf["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        h = llama_ref.rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = F.linear(h, p[pre + "self_attn.q_proj.weight"]).view(B, T, H, hd).transpose(1, 2)
        k = F.linear(h, p[pre + "self_attn.k_proj.weight"]).view(B, T, KV, hd).transpose(1, 2)
        v = F.linear(h, p[pre + "self_attn.v_proj.weight"]).view(B, T, KV, hd).transpose(1, 2)
        q = q * cos + llama_ref.rotate_half(q) * sin
        k = k * cos + llama_ref.rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        att = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(hd) + mask, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + F.linear(y, p[pre + "self_attn.o_proj.weight"])
        h = llama_ref.rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        x = x + mixtral_moe(h, p, pre + "block_sparse_moe.", conf)
    x = llama_ref.rms_norm(x, p["model.norm.weight"], eps)
    head = "model.embed_tokens.weight" if conf.get("tie_word_embeddings") else "lm_head.weight"
    return F.linear(x, p[head])


def main(argv):
    model_dir, tokens_path, out = argv
    conf = json.load(open(os.path.join(model_dir, "config.json")))
    archs = conf.get("architectures", [])
    if conf.get("model_type") == "mixtral" and "MixtralForCausalLM" in archs:
        tensors, _ = llama_ref.load_safetensors(os.path.join(model_dir, "model.safetensors"))
        p = {n: t.float() for n, t in tensors.items()}
        tokens = torch.tensor(json.load(open(tokens_path)), dtype=torch.int64)
        with torch.no_grad():
            logits = mixtral_forward(p, tokens, conf)
        llama_ref.save_safetensors(out, {"logits": logits.float().contiguous()})
        return 0
    qwen2 = conf.get("model_type") == "qwen2" and "Qwen2ForCausalLM" in archs
    if not qwen2 and (conf.get("model_type") != "llama" or "LlamaForCausalLM" not in archs):
        print("hf_eval: %s (model_type %s) is not an architecture transformers implements here" %
              (archs, conf.get("model_type")), file=sys.stderr)
        return 2
    assert conf.get("hidden_act", "silu") == "silu" and conf.get("rope_scaling") is None
    cfg = llama_ref.Cfg(conf["vocab_size"], conf["hidden_size"], conf["num_hidden_layers"],
                        conf["num_attention_heads"], conf.get("num_key_value_heads", conf["num_attention_heads"]),
                        conf["intermediate_size"], conf.get("rope_theta", 10000.0), conf.get("rms_norm_eps", 1e-6),
                        conf.get("tie_word_embeddings", False), head_dim=conf.get("head_dim") or 0)
    # Qwen2Attention: q_proj, k_proj, v_proj with bias=True, o_proj without; LlamaAttention:
    # all four with bias=config.attention_bias
    assert not conf.get("use_sliding_window", False) and not conf.get("mlp_bias", False)
    cfg.qkv_bias = qwen2 or bool(conf.get("attention_bias", False))
    cfg.o_bias = not qwen2 and bool(conf.get("attention_bias", False))
    tensors, _ = llama_ref.load_safetensors(os.path.join(model_dir, "model.safetensors"))
    names = llama_ref.param_names(cfg)
    missing = [n for n in names if n not in tensors]
    extra = [n for n in tensors if n not in names]
    if missing or extra:
        print("missing %s, unexpected %s" % (missing, extra), file=sys.stderr)
        return 1
    params = {n: tensors[n].float() for n in names}
    tokens = torch.tensor(json.load(open(tokens_path)), dtype=torch.int64)
    with torch.no_grad():
        logits = llama_ref.forward(params, tokens, cfg)
    llama_ref.save_safetensors(out, {"logits": logits.float().contiguous()})
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main(sys.argv[1:]))
