#!/usr/bin/env bash
# test_dp.sh PENTATRON: data parallelism through mpiexec against the single-process run.
#   - dp ∈ {2, 4} × ZeRO ∈ {0, 1} × accumulation ∈ {1, 2}: step-1 gradients per tensor
#     ‖Δ‖/‖g‖ ≤ 1e-5 and the losses of 10 steps within 1e-4 relative;
#   - bytes sent per rank per step = 2Ψ(N−1)/N (DP and ZeRO-1, bus-bandwidth convention) ± 1%;
#   - optimizer state per rank = Ψ/N with ZeRO-1 (within padding);
#   - checkpoints resume across layouts (dp 4 ZeRO-1 -> dp 2 ZeRO-0 -> dp 1) with the same losses;
#   - impossible layouts fail fast with one message; a killed rank ends the job non-zero.
set -u
bin="$1"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
PY=/usr/bin/python3
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

"$PY" - "$tmp/train_000000.bin" <<'PY'
import random, struct, sys
n = 30000
random.seed(1)
toks = [(i * 7) % 97 if random.random() > 0.1 else random.randrange(97) for i in range(n)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *toks))
PY
tiny=(--model.vocab_size=97 --model.dim=32 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2
      --model.ffn_dim=48 --model.max_seq_len=32 --training.seq_len=16 --training.global_batch=8
      --training.steps=10 --training.threads=1 --optimizer.lr=3e-3 --data.shuffle=true
      --optimizer.schedule=constant --optimizer.warmup_steps=2
      --data.train="$tmp/train_*.bin" --parallel.bucket_mb=0.02 --logging.progress=false)

run() { # run NP NAME ARGS...: metrics in $tmp/NAME.jsonl, step-1 gradients in $tmp/NAME.st
  local np="$1" name="$2"; shift 2
  local launcher=()
  [ "$np" -gt 1 ] && launcher=(timeout 120 mpiexec -np "$np")
  "${launcher[@]}" "$bin" train "${tiny[@]}" --logging.metrics="$tmp/$name.jsonl" \
      --logging.dump_grads="$tmp/$name.st" "$@" > "$tmp/$name.log" 2>&1
}

# compare REF NAME [BYTES_FACTOR N]: gradients, losses and (optionally) bytes per step
compare() {
  "$PY" - "$tmp" "$1" "$2" "${3:-0}" "${4:-1}" <<'PY'
import json, math, struct, sys
tmp, ref, name, factor, N = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
def st(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; raw = b[8 + n + s:8 + n + e]
        out[k] = struct.unpack("<%df" % (len(raw) // 4), raw)
    return out
g0, g1 = st("%s/%s.st" % (tmp, ref)), st("%s/%s.st" % (tmp, name))
worst = 0.0
for k, a in g0.items():
    b = g1[k]
    num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b))); den = math.sqrt(sum(x * x for x in a))
    worst = max(worst, num / den)
m0 = [json.loads(l) for l in open("%s/%s.jsonl" % (tmp, ref))]
m1 = [json.loads(l) for l in open("%s/%s.jsonl" % (tmp, name))]
lw = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(m0, m1))
errs = []
if len(m0) != 10 or len(m1) != 10: errs.append("expected 10 steps, got %d and %d" % (len(m0), len(m1)))
if worst > 1e-5: errs.append("step-1 gradient relative error %.2e > 1e-5" % worst)
if lw > 1e-4: errs.append("loss relative error %.2e > 1e-4" % lw)
msg = "%s: gradients %.1e, losses %.1e" % (name, worst, lw)
if factor > 0:
    psi = sum(len(a) for a in g0.values())
    want = factor * psi * (N - 1) / N * 4
    got = m1[1]["comm_bytes"]
    rel = abs(got - want) / want
    msg += ", bytes/step %d vs formula %.0f (%.2f%%)" % (got, want, 100 * rel)
    if rel > 0.01: errs.append("bytes per step %d vs %.0f" % (got, want))
print(msg)
if errs: print("; ".join(errs)); sys.exit(1)
PY
}

run 1 ref --training.micro_batch=8 || bad "single-process reference run failed: $(tail -3 "$tmp/ref.log")"
for dp in 2 4; do
  for zero in 0 1; do
    for acc in 1 2; do
      mb=$(( 8 / dp / acc )); name="dp${dp}_z${zero}_a${acc}"
      if run "$dp" "$name" --parallel.dp=$dp --parallel.zero=$zero --training.micro_batch=$mb; then
        if compare ref "$name" 2 "$dp"; then ok; else bad "$name differs from the single-process run"; fi
      else
        bad "$name failed: $(tail -3 "$tmp/$name.log")"
      fi
    done
  done
done

# optimizer state per rank: Ψ/N with ZeRO-1 (the log line reports it)
"$PY" - "$tmp/ref.log" "$tmp/dp4_z1_a1.log" <<'PY' && ok || bad "ZeRO-1 optimizer state is not 1/4 of the single-process one"
import re, sys
f = lambda p: float(re.search(r"optimizer ([\d.]+) MiB", open(p).read()).group(1))
a, b = f(sys.argv[1]), f(sys.argv[2])
print("optimizer MiB per rank: dp1 %.3f, dp4 ZeRO-1 %.3f" % (a, b))
sys.exit(0 if abs(b * 4 - a) <= 0.02 * a + 0.002 else 1)
PY

# resume across layouts: 4 steps at dp 4 ZeRO-1, 3 at dp 2 ZeRO-0, 3 at dp 1 == 10 uninterrupted
ck="$tmp/ck"
run 4 r1 --parallel.dp=4 --parallel.zero=1 --training.micro_batch=1 --checkpoint.dir="$ck" --training.steps=4 --checkpoint.keep=5 &&
run 2 r2 --parallel.dp=2 --parallel.zero=0 --training.micro_batch=2 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=7 --checkpoint.keep=5 &&
run 1 r3 --training.micro_batch=8 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=10 --checkpoint.keep=5 ||
  bad "resume runs failed: $(tail -2 "$tmp"/r*.log)"
"$PY" - "$tmp" <<'PY' && ok || bad "losses after resuming across layouts differ"
import json, sys
t = sys.argv[1]
ref = [json.loads(l)["loss"] for l in open(t + "/ref.jsonl")]
got = []
for n in ("r1", "r2", "r3"):
    got += [json.loads(l)["loss"] for l in open("%s/%s.jsonl" % (t, n))]
worst = max(abs(a - b) / a for a, b in zip(ref, got))
print("resume dp4/ZeRO-1 -> dp2 -> dp1: %d steps, worst loss difference %.1e" % (len(got), worst))
sys.exit(0 if len(got) == 10 and worst <= 1e-4 else 1)
PY

# impossible layouts: one message from rank 0, every rank non-zero, fast
expect_fail() { # NP NEEDLE ARGS...
  local np="$1" needle="$2"; shift 2
  local t0=$SECONDS out rc
  out="$(timeout 60 mpiexec -np "$np" "$bin" train "${tiny[@]}" "$@" 2>&1)"; rc=$?
  local n; n=$(grep -cF -- "$needle" <<<"$out")
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq 1 ] && [ $((SECONDS - t0)) -lt 30 ]; then ok
  else bad "np $np $*: exit $rc, '$needle' printed $n times: $(head -3 <<<"$out")"; fi
}
expect_fail 3 "does not match the world size 3" --parallel.dp=2 --training.micro_batch=1
expect_fail 2 "divisible by dp × micro_batch" --parallel.dp=2 --training.micro_batch=8
expect_fail 2 "parallel.zero = 3" --parallel.dp=2 --parallel.zero=3 --training.micro_batch=1
expect_fail 2 "only data parallelism is available" --parallel.dp=-1 --parallel.tp=2 --training.micro_batch=1

# a rank killed mid-run: the job ends non-zero, no hang
( timeout 60 mpiexec -np 2 "$bin" train "${tiny[@]}" --parallel.dp=2 --training.micro_batch=1 \
    --training.steps=1000000 --parallel.timeout_s=20 > "$tmp/kill.log" 2>&1; echo $? > "$tmp/kill.rc" ) &
for i in $(seq 1 50); do grep -q "step" "$tmp/kill.log" 2>/dev/null && break; sleep 0.2; done
victim=$(pgrep -f "pentatron train.*steps=1000000" | tail -1)
[ -n "$victim" ] && kill -9 "$victim"
wait
rc=$(cat "$tmp/kill.rc" 2>/dev/null || echo missing)
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$rc" != missing ]; then ok; else bad "killed rank: job exit $rc"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
