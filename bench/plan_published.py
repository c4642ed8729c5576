#!/usr/bin/env python3
"""plan_published.py PENTATRON [OLD_PENTATRON]: `pentatron plan` against the published runs of
configs/plan/ (docs/plan.md, "Validation against published runs"), each mechanism added in turn.

For every published case it plans the step with the model's parts switched on one after another
(hardware keys taken out of a copy of the case's hardware file, plan.* keys set back to
pentatron's) and prints a markdown table: published, each stage's error, the final plan and its
memory against the published memory where the source gives one. With OLD_PENTATRON (a build
of an earlier planner) a first column plans the case as that build does (the case's plan.* keys
it does not know, and the hardware keys it does not know, taken out).
"""
import json, os, re, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name, config, hardware, nodes, published step s, published memory bytes (or None), source
CASES = [
    ("Korthikanti 22B", "korthikanti_22b.ini", "selene.ini", 1, 1.10, None),
    ("Korthikanti 175B", "korthikanti_175b.ini", "selene.ini", 8, 13.75, None),
    ("Korthikanti 530B", "korthikanti_530b.ini", "selene.ini", 35, 37.83, None),
    ("Korthikanti 1T", "korthikanti_1t.ini", "selene.ini", 64, 71.49, None),
    ("Narayanan 1.7B", "narayanan_1_7b_32.ini", "selene.ini", 4, 3.528, None),
    ("Narayanan 18.4B", "narayanan_18b_256.ini", "selene.ini", 32, 9.40, None),
    ("Narayanan 175B", "narayanan_175b_384.ini", "selene.ini", 48, 76.78, None),
    ("Narayanan 530B", "narayanan_530b_560.ini", "selene.ini", 70, 206.2, None),
    ("MPT-7B", "mpt7b_8h100.ini", "h100_sxm.ini", 1, 1.155, None),
    ("torchtitan 8B, 8 GPUs", "torchtitan_llama31_8b_8h100.ini", "h100_torchtitan.ini", 1, 2.843, 82.4 * 2**30),
    ("torchtitan 8B, 128 GPUs", "torchtitan_llama31_8b_128h100.ini", "h100_torchtitan.ini", 16, 2.923, 67.0 * 2**30),
]
DATASHEET_BW = {"selene.ini": 2.039e12, "a100_80gb.ini": 2.039e12, "h100_sxm.ini": 3.35e12,
                "h200.ini": 4.8e12, "h100_torchtitan.ini": 2.4e12}
# hardware keys each stage adds, in order (the stages before it take them out)
STAGES = [
    ("linears", "tp per linear, optimizer passes", [], []),
    ("bw", "measured memory bandwidth", ["memory_bw"], []),
    ("nccl_bw", "NCCL's bus bandwidth", ["collectives"], []),
    ("slow", "overlap slowdown", ["overlap_slowdown"], []),
    ("attn", "FlashAttention-2's rate, 500 W", ["attention_flops", "gemm_efficiency@500"], []),
    ("rings", "NCCL's flat rings", ["comm"], []),
    ("framework", "the framework's own choices", [], ["kernels", "selective", "pp_overlap", "pp_scatter_gather"]),
]
PLAN_KEYS = {"kernels": "fused", "selective": "attention", "pp_overlap": "true", "pp_scatter_gather": "false"}


def strip_keys(text, keys):
    """The INI text without the lines of `keys` (and their continuation lines)."""
    out, skip = [], False
    for line in text.splitlines():
        if skip and line.startswith((" ", "\t")) and not line.lstrip().startswith(";"):
            continue
        skip = False
        m = re.match(r"\s*([a-z_]+)\s*=", line)
        if m and m.group(1) in keys:
            skip = True
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def hardware(hw, drop, tmp):
    text = open(os.path.join(ROOT, "hardware", hw)).read()
    keys = {k for k in drop if "@" not in k}
    if "memory_bw" in keys:  # back to the datasheet's
        keys.discard("memory_bw")
        text = re.sub(r"(?m)^memory_bw = .*$", "memory_bw = %g" % DATASHEET_BW[hw], text)
    if "gemm_efficiency@500" in drop and hw == "h100_torchtitan.ini":
        text = re.sub(r"(?m)^gemm_efficiency = .*$", "gemm_efficiency = 0.80", text)
        if "attention_flops" not in keys:
            text = re.sub(r"(?m)^attention_flops = .*$", "attention_flops = 335e12", text)
    path = os.path.join(tmp, "%s-%d.ini" % (hw, len(os.listdir(tmp))))
    open(path, "w").write(strip_keys(text, keys))
    return path


def plan(binary, cfg, hw, nodes, extra=()):
    r = subprocess.run([binary, "plan", "--config", cfg, "--hardware", hw, "--hardware.nodes=%d" % nodes,
                        "--json", *extra], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit("%s: %s" % (cfg, r.stderr.strip()))
    return json.loads(r.stdout)


def main():
    binary = sys.argv[1]
    old = sys.argv[2] if len(sys.argv) > 2 else None
    tmp = tempfile.mkdtemp()
    head = ["case", "published"] + (["before"] if old else []) + [s[1] for s in STAGES] + ["memory: planned / published"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    errs = []
    for name, cfg, hw, nodes, pub, mem in CASES:
        cfgp = os.path.join(ROOT, "configs", "plan", cfg)
        row = [name, "%.4g s" % pub]
        if old:
            oc = os.path.join(tmp, "old-" + cfg)
            open(oc, "w").write(strip_keys(open(cfgp).read(), set(PLAN_KEYS)))
            allkeys = [k for s in STAGES for k in s[2]]
            p = plan(old, oc, hardware(hw, allkeys, tmp), nodes)
            row.append("%+.1f%%" % (100 * (p["step_seconds"] / pub - 1)))
        for i, (_, _, _, _) in enumerate(STAGES):
            later = STAGES[i + 1:]
            drop = [k for s in later for k in s[2]]
            keys = [k for s in later for k in s[3]]
            extra = ["--plan.%s=%s" % (k, PLAN_KEYS[k]) for k in keys]
            p = plan(binary, cfgp, hardware(hw, drop, tmp), nodes, extra)
            row.append("%+.1f%%" % (100 * (p["step_seconds"] / pub - 1)))
        errs.append(p["step_seconds"] / pub - 1)
        row[-1] = "**%s** (%.4g s)" % (row[-1], p["step_seconds"])
        row.append("%.1f / %.1f GiB (%+.1f%%)" % (p["memory_bytes_max"] / 2**30, mem / 2**30,
                                                   100 * (p["memory_bytes_max"] / mem - 1)) if mem else "")
        print("| " + " | ".join(row) + " |")
    a = [abs(e) for e in errs]
    print("\nwithin 15%%: %d of %d; mean |error| %.1f%%; median |error| %.1f%%" % (
        sum(e <= 0.15 for e in a), len(a), 100 * sum(a) / len(a), 100 * sorted(a)[len(a) // 2]))


if __name__ == "__main__":
    main()
