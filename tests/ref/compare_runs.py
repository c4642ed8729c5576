#!/usr/bin/python3
"""compare_runs.py: a distributed run against the single-process reference (the parallel tests).

    compare_runs.py DIR REF NAME [--bytes A B N [--group G]] [--zero Z] [--norms]
    compare_runs.py --exports A/model.safetensors B/model.safetensors LABEL
    compare_runs.py --resume DIR REF LABEL RUN...   (the runs' losses, one after another, = REF's)
    compare_runs.py --bf16 DIR FP32 BF16 NAME LABEL  (a bf16 layout against bf16's own distance)
    compare_runs.py --exact REF.jsonl RUN.jsonl LABEL  (RUN restarted into one appended file)

DIR/REF.{st,jsonl} and DIR/NAME.{st,jsonl} are the step-1 gradients (logging.dump_grads) and the
metrics of each run. Checks every gradient tensor ‖Δ‖/‖g‖ ≤ 1e-5 and the 10 losses within 1e-4
relative. With --bytes, the group's bytes per step (metrics comm_groups, step 2) against
(A·Ψ + B·Ψ_layers)(N−1)/N·4 within 1%; with --zero also the model-state bytes per rank of that
ZeRO stage over N ranks (docs/formulas.md) within 1%; with --norms the 10 gradient norms within
1e-5 relative (HSDP: a norm that counted a replica's shards twice). Exit 1 with the reasons on
failure.
"""
import argparse
import json
import math
import struct
import sys


def safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        raw = b[8 + n + s:8 + n + e]
        out[k] = struct.unpack("<%df" % (len(raw) // 4), raw)
    return out


def compare_exports(a_path, b_path, label):
    """Two Hugging Face exports: the same tensors, each within 1e-5 relative."""
    a, b = safetensors(a_path), safetensors(b_path)
    if a.keys() != b.keys():
        print("%s: tensor names differ" % label)
        sys.exit(1)
    worst = max(math.sqrt(sum((x - y) ** 2 for x, y in zip(a[k], b[k]))) /
                math.sqrt(sum(x * x for x in a[k])) for k in a)
    print("%s: %d tensors, worst relative difference %.1e" % (label, len(a), worst))
    sys.exit(0 if worst <= 1e-5 else 1)


def compare_resumed(tmp, ref, label, *runs):
    """Runs resumed one from another's checkpoint: their losses in sequence equal REF's 10."""
    want = [json.loads(l)["loss"] for l in open("%s/%s.jsonl" % (tmp, ref))]
    got = []
    for n in runs:
        got += [json.loads(l)["loss"] for l in open("%s/%s.jsonl" % (tmp, n))]
    worst = max(abs(a - b) / a for a, b in zip(want, got))
    print("resume %s: %d steps, worst loss difference %.1e" % (label, len(got), worst))
    sys.exit(0 if len(got) == 10 and worst <= 1e-4 else 1)


def compare_exact(ref_path, run_path, label):
    """A run restarted any number of times, each restart appending to one metrics file from the
    step after its checkpoint: the loss of each step as last written equals REF's bit for bit.
    Prints the restarts seen (a step not after the previous line's) and the steps each redid."""
    want = [json.loads(l)["loss"] for l in open(ref_path)]
    got, redone, prev = {}, [], 0
    for line in open(run_path):
        m = json.loads(line)
        if m["step"] <= prev:
            redone.append(prev - m["step"] + 1)
        prev = m["step"]
        got[m["step"]] = m["loss"]
    bad = [s for s in range(1, len(want) + 1) if got.get(s) != want[s - 1]]
    print("%s: %d of %d steps' losses equal bit for bit; %d restarts seen in the metrics, steps "
          "redone %s" % (label, len(want) - len(bad), len(want), len(redone), redone))
    if bad or len(got) != len(want):
        print("%s: steps differing or missing: %s (%d written)" % (label, bad[:10], len(got)))
        sys.exit(1)
    sys.exit(0)


def compare_bf16(d, fp32, bf16, name, label):
    """A bf16 layout NAME against the single-process bf16 run BF16, measured against bf16's own
    distance from the fp32 run FP32 (same weights and data): step-1 gradients ‖Δ‖/‖g‖ over all
    tensors within 0.1× that distance, the losses within 0.5× (bf16's own drift over the steps),
    and bf16 really apart from fp32 (> 1e-4), or the check could not fail."""
    def grads(n): return safetensors("%s/%s.st" % (d, n))
    def losses(n): return [json.loads(l)["loss"] for l in open("%s/%s.jsonl" % (d, n))]
    def dist(a, b):
        num = sum((x - y) ** 2 for k in b for x, y in zip(a[k], b[k]))
        return math.sqrt(num / sum(y * y for k in b for y in b[k]))
    def ldist(a, b): return max(abs(x - y) / abs(y) for x, y in zip(a, b))
    own = dist(grads(bf16), grads(fp32)), ldist(losses(bf16), losses(fp32))
    lay = dist(grads(name), grads(bf16)), ldist(losses(name), losses(bf16))
    print("%s: from the single-process bf16 run: step-1 gradients %.2e, losses %.2e; bf16's own "
          "distance from fp32: %.2e, %.2e (%.3fx, %.3fx)"
          % (label, lay[0], lay[1], own[0], own[1], lay[0] / own[0], lay[1] / own[1]))
    sys.exit(0 if own[0] > 1e-4 and lay[0] <= 0.1 * own[0] and lay[1] <= 0.5 * own[1] else 1)


def main():
    if len(sys.argv) == 7 and sys.argv[1] == "--bf16":
        compare_bf16(*sys.argv[2:])
    if len(sys.argv) == 5 and sys.argv[1] == "--exact":
        compare_exact(*sys.argv[2:])
    if len(sys.argv) == 5 and sys.argv[1] == "--exports":
        compare_exports(*sys.argv[2:])
    if len(sys.argv) >= 6 and sys.argv[1] == "--resume":
        compare_resumed(*sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("ref")
    ap.add_argument("name")
    ap.add_argument("--bytes", nargs=3, type=float, metavar=("A", "B", "N"))
    ap.add_argument("--group", default="dp")
    ap.add_argument("--zero", type=int)
    ap.add_argument("--norms", action="store_true")
    a = ap.parse_args()
    g0 = safetensors("%s/%s.st" % (a.dir, a.ref))
    g1 = safetensors("%s/%s.st" % (a.dir, a.name))
    errs = []
    worst = 0.0
    for k, x in g0.items():
        y = g1.get(k)
        if y is None or len(y) != len(x):
            errs.append("tensor %s missing or of another size" % k)
            continue
        num = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)))
        den = math.sqrt(sum(p * p for p in x))
        # a tensor without gradient (the router's selection bias) must stay exactly zero
        worst = max(worst, num / den if den > 0 else (0.0 if num == 0 else math.inf))
    m0 = [json.loads(l) for l in open("%s/%s.jsonl" % (a.dir, a.ref))]
    m1 = [json.loads(l) for l in open("%s/%s.jsonl" % (a.dir, a.name))]
    lw = max(abs(p["loss"] - q["loss"]) / abs(p["loss"]) for p, q in zip(m0, m1))
    if len(m0) != 10 or len(m1) != 10:
        errs.append("expected 10 steps, got %d and %d" % (len(m0), len(m1)))
    if worst > 1e-5:
        errs.append("step-1 gradient relative error %.2e > 1e-5" % worst)
    if lw > 1e-4:
        errs.append("loss relative error %.2e > 1e-4" % lw)
    msg = "%s: gradients %.1e, losses %.1e" % (a.name, worst, lw)
    if a.norms:  # the gradient norms (clipping's): every shard counted once, replicas or not
        nw = max(abs(p["grad_norm"] - q["grad_norm"]) / p["grad_norm"] for p, q in zip(m0, m1))
        msg += ", gradient norms %.1e" % nw
        if nw > 1e-5:
            errs.append("gradient norm relative error %.2e > 1e-5" % nw)
    if a.bytes:
        A, B, N = a.bytes
        psi = sum(len(x) for x in g0.values())
        layers = sum(len(x) for k, x in g0.items() if k.startswith("model.layers."))
        want = (A * psi + B * layers) * (N - 1) / N * 4
        got = m1[1]["comm_groups"].get(a.group, 0)
        rel = abs(got - want) / want
        msg += ", %s bytes/step %d vs formula %.0f (%.2f%%)" % (a.group, got, want, 100 * rel)
        if rel > 0.01:
            errs.append("bytes per step %d vs %.0f" % (got, want))
        if a.zero is not None:
            # params / grads / optimizer: full, full, full (DP); full, full, 1/N (ZeRO-1);
            # full, 1/N, 1/N (ZeRO-2); 1/N each (ZeRO-3); 4, 4, 8 bytes per element
            mem = m1[1]["mem"]
            for key, per, sharded in (("params", 4, a.zero >= 3), ("grads", 4, a.zero >= 2),
                                      ("optim", 8, a.zero >= 1)):
                w = per * psi / (N if sharded else 1)
                if abs(mem[key] - w) > 0.01 * w:
                    errs.append("%s bytes per rank %d vs formula %.0f" % (key, mem[key], w))
            msg += ", state bytes %d/%d/%d (transient %d/%d)" % (
                mem["params"], mem["grads"], mem["optim"], mem["params_transient"],
                mem["grads_transient"])
    print(msg)
    if errs:
        print("; ".join(errs))
        sys.exit(1)


if __name__ == "__main__":
    main()
