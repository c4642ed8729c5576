"""gpt2_tokenizer_json.py VOCAB_DIR OUT: GPT-2's tokenizer.json, written from its encoder.json and
vocab.bpe as Hugging Face has it (byte-level BPE, <|endoftext|> as id 50256), for the tests that
need a tokenizer.json of the vocabulary their shards use."""
import json
import sys

enc = json.load(open(sys.argv[1] + "/encoder.json"))
merges = [l for l in open(sys.argv[1] + "/vocab.bpe", encoding="utf-8").read().split("\n")[1:] if l]
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
tok = {"version": "1.0", "normalizer": None, "pre_tokenizer": bl, "decoder": bl,
       "added_tokens": [{"id": 50256, "content": "<|endoftext|>", "special": True, "normalized": True,
                         "single_word": False, "lstrip": False, "rstrip": False}],
       "model": {"type": "BPE", "vocab": enc, "merges": merges}}
json.dump(tok, open(sys.argv[2], "w"))
