#!/usr/bin/env bash
# test_report_html.sh PENTATRON: the run report and `pentatron report`'s HTML page.
#   - the run report of a 2-rank pp 2 run (the tiny model, held-out evaluation) lists exactly the
#     groups rank 0's metrics saw traffic on (world, pp), none of the dimensions of one rank (dp,
#     tp, cp, ...), a memory row per rank equal to the metrics' `mem` (rank 0), the legend of its
#     columns, and each table's rows as wide as its header (long group roles, "×" in a role);
#   - `pentatron report` on the metrics' directory and on the metrics file writes a page that
#     headless Chromium renders: in its DOM each chart's line has a point per step of the metrics
#     (the validation line one per evaluation), the memory table a row per rank with the metrics'
#     figures (rank 0), the communication table a row per group of the run report, and the
#     pipeline drawing is `pentatron schedule --svg`'s for the run's schedule, byte for byte; its
#     screenshot is not blank and shows the loss curves' colours;
#   - missing pieces are said, not errors: a single-process run (no validation, pp = 1, no group
#     of more than one rank) and a run still going (metrics only, no report.json yet);
#   - a RUN that is not a run (missing, a directory without metrics.jsonl, a file that is not
#     metrics lines), or metrics the page would replace: one message, exit 2, nothing written.
# Without chromium (Debian's `chromium`) or PIL (`python3-pil`) the rendering is skipped: exit 77,
# reported as skipped by CTest, once the checks without a browser have passed.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"

shard "$tmp/val_000000.bin" 4000 7 0.2
mkdir -p "$tmp/run"
run 2 pp --parallel.pp=2 --training.micro_batch=2 --data.val="$tmp/val_*.bin" --eval.every=5 \
  --eval.tokens=256 --logging.metrics="$tmp/run/metrics.jsonl" || bad "the pp 2 run failed: $(tail -3 "$tmp/pp.log")"

# the text run report against rank 0's metrics and the layout
"$PY" - "$tmp/pp.log" "$tmp/run/metrics.jsonl" <<'PY' && ok || bad "the text run report"
import json, re, sys
log = [re.sub(r"^\[rank 0\] ", "", l.rstrip("\n")) for l in open(sys.argv[1])]
lines = [json.loads(l) for l in open(sys.argv[2])]
start = max(i for i, l in enumerate(log) if l.startswith("run report"))
rep = log[start + 1:]
gh = next(i for i, l in enumerate(rep) if l.split()[:2] == ["group", "carries"])
mh = next(i for i, l in enumerate(rep) if l.strip().startswith("memory per rank (MiB)"))
groups = rep[gh:mh]
mem = rep[mh:mh + 3]
names = [l.split()[0] for l in groups[1:]]
seen = {g for m in lines for g, b in m.get("comm_groups", {}).items() if b > 0}
errs = []
if sorted(names) != sorted(seen):
    errs.append(f"groups {names}, rank 0's metrics saw traffic on {sorted(seen)}")
if set(names) & {"dp", "tp", "cp", "dpcp", "ep", "edp"}:
    errs.append(f"groups of one rank listed: {names}")
for table, what in ((groups, "group"), (mem, "memory")):
    widths = {len(l) for l in table}
    if len(widths) != 1:
        errs.append(f"the {what} table's rows are not aligned: widths {sorted(widths)}:\n" + "\n".join(table))
m0 = lines[-1]["mem"]
row0 = [float(x) for x in mem[1].split(")")[1].split()]
want = [m0[k] / 1048576 for k in ("params", "grads", "optim", "activations")]
if len(mem) != 3 or not mem[2].strip().startswith("rank 1 (") or \
        any(abs(a - b) > 0.006 for a, b in zip(row0, want)):
    errs.append(f"memory rows {mem[1:]}, rank 0's metrics {want}")
legend = " ".join(rep[mh + 3:mh + 8])
for word in ("bytes/step:", "blocked s:", "% step:", "memory:", "left out:"):
    if word not in legend:
        errs.append(f"the legend does not explain {word!r}: {legend!r}")
print("run report groups", names, "(metrics:", sorted(seen), "); memory rows", len(mem) - 1)
for e in errs:
    print("  " + e)
sys.exit(1 if errs else 0)
PY

# pentatron report: the directory and the metrics file as RUN
"$bin" report "$tmp/run" > "$tmp/rep.out" 2>&1 && [ -s "$tmp/run/report.html" ] && ok ||
  bad "pentatron report DIR: $(cat "$tmp/rep.out")"
# (the same page but for the RUN it names)
"$bin" report "$tmp/run/metrics.jsonl" --out "$tmp/file.html" > "$tmp/rep2.out" 2>&1 &&
  sed "s|$tmp/run/metrics.jsonl|$tmp/run|g" "$tmp/file.html" | cmp -s "$tmp/run/report.html" - && ok ||
  bad "pentatron report FILE --out differs from pentatron report DIR: $(cat "$tmp/rep2.out")"
# the schedule the run ran (global batch 8 / micro-batch 2 = 4 micro-batches), drawn by `schedule`
"$bin" schedule --pp 2 --microbatches 4 --schedule 1f1b --svg "$tmp/sched.svg" > /dev/null ||
  bad "pentatron schedule --svg failed"

# a single process without validation, and a run still going (its metrics so far, no report.json)
mkdir -p "$tmp/one" "$tmp/going"
run 1 one --training.steps=3 --logging.metrics="$tmp/one/metrics.jsonl" || bad "the one-process run failed"
head -4 "$tmp/run/metrics.jsonl" > "$tmp/going/metrics.jsonl"
printf '{"step": 5, "lo' >> "$tmp/going/metrics.jsonl" # a line being written
for r in one going; do
  "$bin" report "$tmp/$r" > "$tmp/$r.out" 2>&1 && ok || bad "pentatron report on the $r run: $(cat "$tmp/$r.out")"
done

# not a run: one message, exit 2, nothing written
notrun() { # WHAT RUN NEEDLE
  local out rc
  out="$("$bin" report "$2" 2>&1)"; rc=$?
  if [ $rc -eq 2 ] && [ "$(grep -c . <<<"$out")" -eq 1 ] && grep -qF -- "$3" <<<"$out"; then ok
  else bad "$1: exit $rc: $out"; fi
}
mkdir -p "$tmp/empty"
notrun "a missing RUN" "$tmp/nothing" "No such file or directory"
notrun "a directory without metrics" "$tmp/empty" "is not a run: it holds no metrics.jsonl"
notrun "a file that is not metrics" "$PT_SOURCE_DIR/configs/small.ini" "is not a run's metrics: line 1"
mkdir -p "$tmp/odd" && cp "$tmp/run/metrics.jsonl" "$tmp/odd/report.html"
notrun "metrics named report.html" "$tmp/odd/report.html" "the page would replace the metrics"
cmp -s "$tmp/run/metrics.jsonl" "$tmp/odd/report.html" && ok || bad "the metrics named report.html were replaced"
[ -z "$(ls "$tmp/empty")" ] && [ ! -e "$PT_SOURCE_DIR/configs/report.html" ] && ok ||
  bad "a refused RUN left a page behind"

if ! command -v chromium > /dev/null || ! "$PY" -c "import PIL" 2> /dev/null; then
  echo "test_report_html: $pass passed, $fail failed; rendering skipped: needs chromium and python3-pil (scripts/setup.sh)"
  [ $fail -eq 0 ] && exit 77
  exit 1
fi
chrome() { # PAGE ARGS...: headless Chromium on the page
  local page="$1"; shift
  timeout 90 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$tmp/chrome" \
    --window-size=1100,2400 "$@" "file://$page" 2> "$tmp/chrome.err"
}
chrome "$tmp/run/report.html" --dump-dom > "$tmp/run.dom" || bad "chromium --dump-dom: $(tail -2 "$tmp/chrome.err")"
# (the pages hold no script: the others' DOM is their HTML as written)
cp "$tmp/one/report.html" "$tmp/one.dom"; cp "$tmp/going/report.html" "$tmp/going.dom"
chrome "$tmp/run/report.html" --screenshot="$tmp/shot.png" > /dev/null ||
  bad "chromium --screenshot: $(tail -2 "$tmp/chrome.err")"

"$PY" - "$tmp" <<'PY' && ok || bad "the page's elements"
import json, re, sys
from html.parser import HTMLParser
tmp = sys.argv[1]

class Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.stack, self.text = [], [], []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        a["_tag"], a["_in"] = tag, [(t, dict(x).get("id"), dict(x).get("class")) for t, x in self.stack]
        self.tags.append(a)
        if tag not in ("br", "meta", "rect", "line", "circle", "polyline", "path"):
            self.stack.append((tag, attrs))
    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass
    def handle_data(self, d):
        self.text.append(d)

def dom(name):
    d = Dom()
    d.feed(open(f"{tmp}/{name}.dom").read())
    return d

errs = []
d = dom("run")
lines = [json.loads(l) for l in open(f"{tmp}/run/metrics.jsonl")]
steps, evals = len(lines), sum("val_loss" in m for m in lines)
want = {"training loss": steps, "validation loss": evals, "tokens/s": steps, "MFU (measured peak)": steps}
got = {}
for t in d.tags:
    if t["_tag"] == "polyline" and t.get("class") == "series":
        pts = t["points"].split()
        got[t["data-series"]] = len(pts)
        if len(pts) != int(t["data-points"]):
            errs.append(f"{t['data-series']}: {len(pts)} points, data-points {t['data-points']}")
if got != want:
    errs.append(f"chart points {got}, the metrics' steps and evaluations {want}")
for cid in ("loss", "throughput", "mfu", "memory-chart"):
    if not any(t["_tag"] == "svg" and t.get("id") == cid for t in d.tags):
        errs.append(f"no chart #{cid}")
rows = lambda cls: [t for t in d.tags if t["_tag"] == "tr" and t.get("class") == cls]
if len(rows("rank")) != 2:
    errs.append(f"memory table: {len(rows('rank'))} rows for 2 ranks")
# the cells of the tables, in order: memory rows then group rows
page = open(f"{tmp}/run.dom").read()
cells = lambda cls: [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in
                     re.findall(r'<tr class="%s">(.*?)</tr>' % cls, page, re.S)]
m0 = lines[-1]["mem"]
r0 = [float(x) for x in cells("rank")[0][2:6]]
w0 = [m0[k] / 1048576 for k in ("params", "grads", "optim", "activations")]
if any(abs(a - b) > 0.006 for a, b in zip(r0, w0)):
    errs.append(f"rank 0's memory row {r0}, its metrics {w0}")
log = [re.sub(r"^\[rank 0\] ", "", l) for l in open(f"{tmp}/pp.log")]
start = max(i for i, l in enumerate(log) if l.startswith("run report"))
text_groups = []
for l in log[start + 2:]:
    if l.strip().startswith("memory per rank"):
        break
    text_groups.append(l.split()[0])
html_groups = [c[0] for c in cells("group")]
if html_groups != text_groups:
    errs.append(f"page's groups {html_groups}, the run report's {text_groups}")
svg = open(f"{tmp}/sched.svg").read()
m = re.search(r'<div id="schedule">\s*(<svg.*?</svg>)', open(f"{tmp}/run/report.html").read(), re.S)
if not m or m.group(1).strip() != svg.strip():
    errs.append("the page's schedule is not `pentatron schedule --svg`'s drawing")
drawn = re.search(r'<div id="schedule">(.*?)</div>', page, re.S)
fwd = len(re.findall(r"<rect[^>]*><title>FWD micro", drawn.group(1))) if drawn else 0
if fwd != 2 * 4:
    errs.append(f"the rendered schedule holds {fwd} forwards, want 2 ranks × 4 micro-batches")
print(f"run: chart points {got}; memory rows {len(rows('rank'))}; groups {html_groups}; schedule forwards {fwd}")

one, going = dom("one"), dom("going")
ids = lambda d: {t.get("id") for t in d.tags}
for name, dd, need in (("one", one, {"val-none", "schedule-none", "groups-none"}),
                       ("going", going, {"report-none", "val-none"})):
    if not need <= ids(dd):
        errs.append(f"{name}: the page does not say what is missing: {sorted(need - ids(dd))}")
one_lines = sum(1 for _ in open(f"{tmp}/one/metrics.jsonl"))
pts = {t["data-series"]: int(t["data-points"]) for t in one.tags if t.get("class") == "series"}
if pts.get("training loss") != one_lines or "validation loss" in pts:
    errs.append(f"one: series {pts}, {one_lines} steps without validation")
if len([t for t in one.tags if t["_tag"] == "tr" and t.get("class") == "rank"]) != 1:
    errs.append("one: not one memory row")
status = " ".join(going.text)
if "Still going" not in status or "step 4" not in status:
    errs.append("going: the page does not say the run is still going at step 4")
print("one process: series", pts, "; still going:", "Still going" in status)

from PIL import Image
img = Image.open(f"{tmp}/shot.png").convert("RGB")
px = list(img.getdata())
top = list(img.crop((0, 0, img.size[0], 480)).getdata())  # the title and the loss chart
ink = sum(1 for p in px if p != (255, 255, 255)) / len(px)
near = lambda c: sum(1 for p in top if all(abs(p[i] - c[i]) < 40 for i in range(3)))
blue, orange = near((0x4c, 0x72, 0xb0)), near((0xdd, 0x84, 0x52))
print(f"screenshot {img.size}: {ink:.1%} not white, above y = 480 {blue} pixels of the training loss's "
      f"colour, {orange} of the validation's")
if ink < 0.03 or blue < 500 or orange < 100:
    errs.append("the screenshot is blank or lacks the loss curves")
for e in errs:
    print("  " + e)
sys.exit(1 if errs else 0)
PY

echo "test_report_html: $pass passed, $fail failed"
[ $fail -eq 0 ]
