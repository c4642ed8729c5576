"""check_plan_memory.py LOG METRICS PLAN_JSON NAME: `pentatron plan --json`'s memory against the
run's own accounting.
  - rank 0, exactly (its metrics line, bytes): parameters + gradients + optimizer + activations +
    transient within 2% of the plan's total for its stage;
  - every rank (the run report's rows, MiB to 2 decimals): each kind within 2% or the rounding
    (0.006 MiB) of the plan's figure for that rank's pipeline stage.
ZeRO-2/3's bucket pool is a peak that depends on timing (docs/plan.md): its transient is printed,
not compared, and left out of the totals; the plan's is the pool's design cap."""
import json
import re
import sys

log, metrics, plan, name = sys.argv[1:5]
p = json.loads(open(plan).read().strip().splitlines()[-1])
pool = p["zero"] >= 2
stages = p["memory_per_stage"]
bad = []
# rank 0, exact
mem = [json.loads(l) for l in open(metrics)][-1]["mem"]
tr = mem["params_transient"] + mem["grads_transient"]
got = mem["params"] + mem["grads"] + mem["optim"] + mem["activations"] + (0 if pool else tr)
want = stages[0]["total"] - (stages[0]["transient"] if pool else 0)
err0 = abs(want - got) / got
if err0 > 0.02:
    bad.append(f"rank 0: {got} bytes by the run's accounting, {want:.0f} planned ({err0:.2%}): "
               + ", ".join(f"{k} {mem[k]}/{stages[0][k]:.0f}" for k in ("params", "grads", "optim", "activations")))
# every rank, the report's rows
lines = open(log).read().splitlines()
start = max(i for i, l in enumerate(lines) if "run report" in l)
rows = []
for l in lines[start:]:
    m = re.search(r"\brank (\d+) \(dp\d+ pp(\d+) cp\d+ tp\d+\)\s+(.*)$", l)
    if m:
        rows.append((int(m.group(1)), int(m.group(2)), [float(x) for x in m.group(3).split()]))
    elif re.search(r"^\s*rank 0\s+[\d.]+\s", l):
        rows.append((0, 0, [float(x) for x in l.split()[2:]]))
kinds = ["params", "grads", "optim", "activations", "transient"]
worst = 0.0
for rank, pp, v in rows:
    st = stages[pp]
    for i, k in enumerate(kinds):
        if k == "transient" and pool:
            continue
        w = st[k] / 1048576
        e = abs(w - v[i])
        worst = max(worst, e / max(v[i], 1e-9) if e > 0.006 else 0)
        if e > max(0.02 * v[i], 0.006):
            bad.append(f"rank {rank} (stage {pp}) {k}: report {v[i]:.2f} MiB, plan {w:.4f} MiB")
note = ""
if pool:
    note = f"; ZeRO-{p['zero']} bucket pool: rank 0 peaked at {tr} bytes, the plan's cap {stages[0]['transient']:.0f}"
print(f"{name}: rank 0 within {err0:.2%} of its exact accounting, {len(rows)} report rows "
      f"(worst kind beyond rounding {worst:.2%}){note}")
for b in bad[:5]:
    print("  FAIL " + b)
sys.exit(1 if bad or not rows else 0)
