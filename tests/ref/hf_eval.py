#!/usr/bin/env python3
"""hf_eval.py MODEL_DIR TOKENS_JSON OUT: reads a Hugging Face Llama directory the way transformers
would (config.json keys, safetensors tensors by Hugging Face names, tie_word_embeddings), runs the
reference model of llama_ref.py on the tokens (a JSON list of lists), writes logits (B, T, V) F32
to OUT (safetensors). Used by tests/test_train.c to check pentatron's export end to end."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402


def main(argv):
    model_dir, tokens_path, out = argv
    conf = json.load(open(os.path.join(model_dir, "config.json")))
    assert conf.get("model_type") == "llama" and "LlamaForCausalLM" in conf.get("architectures", [])
    assert conf.get("hidden_act", "silu") == "silu" and conf.get("rope_scaling") is None
    cfg = llama_ref.Cfg(conf["vocab_size"], conf["hidden_size"], conf["num_hidden_layers"],
                        conf["num_attention_heads"], conf.get("num_key_value_heads", conf["num_attention_heads"]),
                        conf["intermediate_size"], conf.get("rope_theta", 10000.0), conf.get("rms_norm_eps", 1e-6),
                        conf.get("tie_word_embeddings", False))
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
