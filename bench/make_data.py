#!/usr/bin/python3
"""make_data.py: write a synthetic llm.c-format token shard of uniform random tokens.

Header: 256 int32 (magic 20240520, version 1, token count, zeros), then uint16 tokens.
Rows of T+1 tokens overlap by one (row i = tokens[i*T : i*T+T+1]), so a shard of
steps*G*T + 1 tokens feeds `steps` steps of G sequences without wrapping.

    make_data.py --out FILE --tokens N [--vocab 50257] [--seed 0]
"""
import argparse
import os

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not 0 < a.vocab <= 65536:
        raise SystemExit("vocab must fit uint16")
    hdr = np.zeros(256, dtype="<i4")
    hdr[0], hdr[1], hdr[2] = 20240520, 1, a.tokens
    toks = np.random.default_rng(a.seed).integers(0, a.vocab, size=a.tokens, dtype=np.int64).astype("<u2")
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(hdr.tobytes())
        f.write(toks.tobytes())
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
