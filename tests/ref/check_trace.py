#!/usr/bin/env python3
"""check_trace.py DIR METRICS STEP_A STEP_B NEEDED...: the traces logging.trace wrote in DIR.

Each rank's file must parse as JSON; its complete ("X") events must nest on their thread (sorted by
start, each inside the one open before it, to the nanosecond the file is written in); every async
begin ("b") must have its end ("e", same id, not earlier); the spans named in NEEDED must occur;
"step" spans must be exactly steps A..B. Rank 0's blocked time per group (its "wait" spans) must
equal the sum of comm_wait_groups over steps A..B in its metrics (METRICS, the JSON lines of
logging.metrics; the run report prints the same counters), within 2 us per step and group.
DIR/trace.json (pentatron trace merge) must hold every rank's events, one process per rank."""
import glob, json, os, sys

d, metrics, a, b = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
needed = sys.argv[5:]
errs = []
files = sorted(glob.glob(os.path.join(d, "trace-rank*.json")))
total = 0
for f in files:
    ev = json.load(open(f))["traceEvents"]
    total += len(ev)
    xs = sorted((e for e in ev if e["ph"] == "X"), key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    for e in xs:
        end = e["ts"] + e["dur"]
        while stack and stack[-1] <= e["ts"] + 0.002:
            stack.pop()
        if stack and end > stack[-1] + 0.002:
            errs.append("%s: %s at %.3f us ends at %.3f, after the span it starts in (%.3f)" % (
                os.path.basename(f), e["name"], e["ts"], end, stack[-1]))
            break
        stack.append(end)
    begins = {e["id"]: e["ts"] for e in ev if e["ph"] == "b"}
    ends = {e["id"]: e["ts"] for e in ev if e["ph"] == "e"}
    if set(begins) != set(ends) or any(ends[i] < begins[i] for i in begins):
        errs.append("%s: unmatched or reversed async events" % os.path.basename(f))
    names = " | ".join(sorted({e["name"] for e in xs}))
    for n in needed:
        if n not in names:
            errs.append("%s: no span named %r" % (os.path.basename(f), n))
    steps = sorted(e["args"]["step"] for e in xs if e["name"].startswith("step "))
    if steps != list(range(a, b + 1)):
        errs.append("%s: step spans %s, expected %d..%d" % (os.path.basename(f), steps, a, b))
    if f.endswith("trace-rank0.json"):
        waits = {}
        for e in xs:
            if e["cat"] == "wait":
                waits[e["args"]["group"]] = waits.get(e["args"]["group"], 0) + e["dur"] * 1e-6
        lines = [json.loads(l) for l in open(metrics)]
        want = {}
        for r in lines:
            if a <= r["step"] <= b:
                for g, s in r.get("comm_wait_groups", {}).items():
                    want[g] = want.get(g, 0) + s
        for g in sorted(set(waits) | set(want)):
            got, exp = waits.get(g, 0.0), want.get(g, 0.0)
            ok = abs(got - exp) <= 2e-6 * (b - a + 1) + 1e-9
            print("  rank 0 blocked on %-5s: trace %.6f s, metrics %.6f s%s" % (g, got, exp, "" if ok else "  <- differs"))
            if not ok:
                errs.append("rank 0's %s waits: %.6f s in the trace, %.6f s in the metrics" % (g, got, exp))
    print("  %s: %d events, %d spans nest, %d communications" % (os.path.basename(f), len(ev), len(xs), len(begins)))
if not files:
    errs.append("no trace-rank*.json in " + d)
merged = json.load(open(os.path.join(d, "trace.json")))["traceEvents"]
pids = sorted({e["pid"] for e in merged})
if len(merged) != total or pids != list(range(len(files))):
    errs.append("the merged trace has %d events of processes %s; the ranks' files %d of %d" % (
        len(merged), pids, total, len(files)))
for e in errs:
    print("  " + e)
sys.exit(1 if errs else 0)
