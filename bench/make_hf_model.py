#!/usr/bin/env python3
"""make_hf_model.py OUT_DIR [--dim 768 --layers 12 --heads 12 --kv-heads 12 --ffn 2048
                             --vocab 50257 --ctx 1024 --std 0.02 --seed 1 --tied]

Writes a Llama model with random weights (normal, std; norm weights 1) as a Hugging Face
directory: config.json and model.safetensors (F32), for benchmarks that need a model of a given
size but not a trained one (bench/generate_bench.sh). Needs numpy.
"""
import argparse
import json
import os
import struct

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    for name, default in [("dim", 768), ("layers", 12), ("heads", 12), ("kv-heads", 12),
                          ("ffn", 2048), ("vocab", 50257), ("ctx", 1024), ("seed", 1)]:
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--tied", action="store_true")
    a = ap.parse_args()
    hd = a.dim // a.heads
    shapes = [("model.embed_tokens.weight", (a.vocab, a.dim))]
    for l in range(a.layers):
        p = "model.layers.%d." % l
        shapes += [(p + "input_layernorm.weight", (a.dim,)),
                   (p + "self_attn.q_proj.weight", (a.heads * hd, a.dim)),
                   (p + "self_attn.k_proj.weight", (a.kv_heads * hd, a.dim)),
                   (p + "self_attn.v_proj.weight", (a.kv_heads * hd, a.dim)),
                   (p + "self_attn.o_proj.weight", (a.dim, a.heads * hd)),
                   (p + "post_attention_layernorm.weight", (a.dim,)),
                   (p + "mlp.gate_proj.weight", (a.ffn, a.dim)),
                   (p + "mlp.up_proj.weight", (a.ffn, a.dim)),
                   (p + "mlp.down_proj.weight", (a.dim, a.ffn))]
    shapes.append(("model.norm.weight", (a.dim,)))
    if not a.tied:
        shapes.append(("lm_head.weight", (a.vocab, a.dim)))
    header, at = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape in shapes:
            if len(shape) == 1:
                w = np.ones(shape, dtype="<f4")
            else:
                w = (rng.standard_normal(shape, dtype=np.float32) * a.std).astype("<f4")
            w.tofile(f)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "vocab_size": a.vocab, "hidden_size": a.dim, "num_hidden_layers": a.layers,
              "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
              "intermediate_size": a.ffn, "max_position_embeddings": a.ctx,
              "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": a.tied,
              "hidden_act": "silu", "torch_dtype": "float32"}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


if __name__ == "__main__":
    main()
