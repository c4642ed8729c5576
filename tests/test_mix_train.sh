#!/usr/bin/env bash
# test_mix_train.sh PENTATRON: training from several sources mixed by weight (data.sources,
# data.weights; docs/guide.md "Data mixing").
#   - the shares of each step in the metrics (data_share) are the schedule's, computed here
#     independently (largest remainder of 4096·w, smooth weighted round robin), to 1e-9, and the
#     step line shows them;
#   - the small source's second epoch starts at the step the schedule says, logged once, also
#     under 2 ranks;
#   - a 10-step run equals a 5-step run resumed for 5 more, losses and shares bit for bit, in one
#     process and under dp 2 (ZeRO-1); the checkpoint records the sources (index.json, train.ini);
#   - bad sources or weights (2 ranks): one message naming the problem, a non-zero exit.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"

# a second source of another kind (the pattern 3i + 1 mod 97): 241 tokens, 15 rows of 16 + 1
"$PY" - "$tmp/code_000000.bin" <<'PY'
import struct, sys
n = 241
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[(3 * i + 1) % 97 for i in range(n)]))
PY
mix=(--data.train= --data.sources="web=$tmp/train_*.bin, code = $tmp/code_*.bin"
     --data.weights="0.7, 0.3")

# schedule_check NAME ROWS...: NAME's metrics carry each step's shares as the schedule gives them
# (ROWS: each source's rows), and its log the step each source's second epoch starts at
schedule_check() {
  local name="$1" out; shift
  if out="$("$PY" - "$tmp/$name.jsonl" "$tmp/$name.log" "$@" 2>&1 <<'PY'
import json, re, sys
B, w, names, G = 4096, [0.7, 0.3], ["web", "code"], 8
rows = [int(r) for r in sys.argv[3:]]
exact = [B * x / sum(w) for x in w]
n = [int(e) for e in exact]
for i in sorted(range(len(w)), key=lambda i: -(exact[i] - n[i]))[:B - sum(n)]:
    n[i] += 1
credit, slot = [0] * len(w), []
for _ in range(B):
    credit = [c + k for c, k in zip(credit, n)]
    best = max(range(len(w)), key=lambda i: (credit[i], -i))
    credit[best] -= B
    slot.append(best)
count, first_epoch2 = [0] * len(w), {}
steps = [json.loads(l) for l in open(sys.argv[1])]
for r in steps:
    for j in range(G):
        i = slot[((r["step"] - 1) * G + j) % B]
        if count[i] == rows[i] and names[i] not in first_epoch2: first_epoch2[names[i]] = r["step"]
        count[i] += 1
    K = r["step"] * G
    for i, nm in enumerate(names):
        got = r["data_share"][nm]
        if abs(got - count[i] / K) > 1e-9:
            sys.exit("step %d: %s's share %r, the schedule's %r" % (r["step"], nm, got, count[i] / K))
log = open(sys.argv[2]).read()
for nm, s in first_epoch2.items():
    want = "data: source %s starts epoch 2 at step %d" % (nm, s)
    if log.count(want) != 1: sys.exit("the log has %d times '%s'" % (log.count(want), want))
if not first_epoch2: sys.exit("no source started a second epoch")
if not re.search(r"\| data web 7\d\.\d% code 2\d\.\d% \|", log):
    sys.exit("no step line with the shares")
print("%d steps, shares %s, epoch 2 of %s" % (len(steps), steps[-1]["data_share"], first_epoch2))
PY
)"; then ok; echo "$name: $out"; else bad "$name: $out"; fi
}

# losses_shares NAME...: step, loss and shares of the runs' metrics, concatenated
losses_shares() {
  for n in "$@"; do "$PY" -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r["step"], repr(r["loss"]), r["data_share"])' "$tmp/$n.jsonl"; done
}

# resumed NP NAME ARGS...: NAME (10 steps) against NAME_a (5 steps, checkpointed) + NAME_b (resumed)
resumed() {
  local np="$1" name="$2"; shift 2
  run "$np" "$name" "${mix[@]}" "$@" || bad "$name failed: $(tail -3 "$tmp/$name.log")"
  run "$np" "${name}_a" "${mix[@]}" "$@" --training.steps=5 --checkpoint.dir="$tmp/ck_$name" ||
    bad "${name}_a failed: $(tail -3 "$tmp/${name}_a.log")"
  run "$np" "${name}_b" "${mix[@]}" "$@" --checkpoint.dir="$tmp/ck_$name" \
      --checkpoint.resume=latest || bad "${name}_b failed: $(tail -3 "$tmp/${name}_b.log")"
  local whole parts
  whole="$(losses_shares "$name")" parts="$(losses_shares "${name}_a" "${name}_b")"
  if [ "$whole" = "$parts" ] && [ "$(wc -l <<<"$whole")" -eq 10 ] &&
     grep -q "resumed from .*step_00000005" "$tmp/${name}_b.log"; then
    ok; echo "$name: 5 steps + 5 resumed = 10 steps, losses and shares bit for bit"
  else bad "$name: resumed run differs: $(diff <(echo "$whole") <(echo "$parts") | head -4)"; fi
}

resumed 1 mix
schedule_check mix 1874 15
resumed 2 mixdp --parallel.dp=2 --training.micro_batch=4 --parallel.zero=1
schedule_check mixdp 1874 15
# the data is the same whatever the layout: so are the shares, and the losses agree to rounding
if [ "$(losses_shares mix | cut -d' ' -f1,3-)" = "$(losses_shares mixdp | cut -d' ' -f1,3-)" ]; then
  ok; else bad "mixdp: shares differ from the single process's"; fi
if compare mix mixdp > /dev/null; then ok; else bad "mixdp: losses differ from mix's: $(compare mix mixdp | tail -2)"; fi

# the checkpoint records the sources
ck="$tmp/ck_mix/step_00000005"
if "$PY" - "$ck/index.json" "$tmp" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["data_sources"]
want = [("web", sys.argv[2] + "/train_*.bin", 0.7), ("code", sys.argv[2] + "/code_*.bin", 0.3)]
got = [(s["name"], s["glob"], round(s["weight"], 12)) for s in d]
sys.exit(0 if got == want else "index.json data_sources %s" % got)
PY
then if grep -q '^sources = "web=' "$ck/train.ini" && grep -q '^weights = "0.7, 0.3"' "$ck/train.ini"
  then ok; else bad "train.ini: $(grep -E '^(sources|weights)' "$ck/train.ini")"; fi
else bad "index.json does not record the sources"; fi

# --- bad input: one message, every rank non-zero -------------------------------------------------
two="web=$tmp/train_*.bin, code=$tmp/code_*.bin"
expect_fail 2 'data.train and data.sources are mutually exclusive' --data.sources="$two" \
    --data.weights=1,1
expect_fail 2 'data.weights has 1 value for the 2 sources' --data.train= --data.sources="$two" \
    --data.weights=1
expect_fail 2 '"0" (weight 2) is not a positive number' --data.train= --data.sources="$two" \
    --data.weights="1, 0"
expect_fail 2 '"-1" (weight 1) is not a positive number' --data.train= --data.sources="$two" \
    --data.weights="-1, 2"
expect_fail 2 "data.sources: source code: no file matches \"$tmp/none_*.bin\"" --data.train= \
    --data.sources="web=$tmp/train_*.bin, code=$tmp/none_*.bin" --data.weights=1,1 \
    --parallel.dp=2 --training.micro_batch=4
expect_fail 2 'data.sources: source name web appears twice' --data.train= \
    --data.sources="web=$tmp/train_*.bin, web=$tmp/code_*.bin" --data.weights=1,1
expect_fail 2 "data.sources: \"$tmp/code_*.bin\" is not NAME=GLOB" --data.train= \
    --data.sources="web=$tmp/train_*.bin, $tmp/code_*.bin" --data.weights=1,1
expect_fail 2 'data.sources: source name "w b"' --data.train= \
    --data.sources="w b=$tmp/train_*.bin" --data.weights=1
expect_fail 2 'data.weights needs data.sources' --data.weights=1

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
