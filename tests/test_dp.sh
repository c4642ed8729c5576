#!/usr/bin/env bash
# test_dp.sh PENTATRON: data parallelism through mpiexec against the single-process run.
#   - dp ∈ {1, 2, 4} × ZeRO ∈ {0, 1, 2, 3} × accumulation ∈ {1, 2}: step-1 gradients per tensor
#     ‖Δ‖/‖g‖ ≤ 1e-5 and the losses of 10 steps within 1e-4 relative;
#   - bytes sent per rank per step (bus-bandwidth convention) ± 1%: 2Ψ(N−1)/N for DP and ZeRO-1;
#     ZeRO-2 reduce-scatters every micro-batch: (a+1)Ψ(N−1)/N with a accumulation steps;
#     ZeRO-3 gathers every unit for forward and the layers again for backward (the embedding's
#     backward does not read it, the tail is kept from the loss to its backward) and
#     reduce-scatters: a(2Ψ + Ψ_layers)(N−1)/N;
#   - per-rank parameter, gradient and optimizer bytes as ../shared/FORMULAS.md's table (± padding);
#   - checkpoints resume across layouts (dp 4 ZeRO-3 -> dp 2 ZeRO-1 -> dp 4 ZeRO-3 -> dp 1) with
#     the same losses, and `pentatron export` of a dp 4 ZeRO-3 checkpoint equals the single-process
#     one's;
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

# compare REF NAME [A B N ZERO]: gradients, losses, bytes per step = (A·Ψ + B·Ψ_layers)(N−1)/N and
# the model-state bytes per rank of ZeRO stage ZERO
compare() {
  "$PY" - "$tmp" "$1" "$2" "${3:-0}" "${4:-0}" "${5:-1}" "${6:-0}" <<'PY'
import json, math, struct, sys
tmp, ref, name = sys.argv[1], sys.argv[2], sys.argv[3]
A, B, N, zero = float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
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
if A > 0:
    psi = sum(len(a) for a in g0.values())
    layers = sum(len(a) for k, a in g0.items() if k.startswith("model.layers."))
    want = (A * psi + B * layers) * (N - 1) / N * 4
    got = m1[1]["comm_bytes"]
    rel = abs(got - want) / want
    msg += ", bytes/step %d vs formula %.0f (%.2f%%)" % (got, want, 100 * rel)
    if rel > 0.01: errs.append("bytes per step %d vs %.0f" % (got, want))
    # FORMULAS.md: params / grads / optimizer per rank: full, full, full (DP); full, full, 1/N
    # (ZeRO-1); full, 1/N, 1/N (ZeRO-2); 1/N each (ZeRO-3). Bytes: 4, 4, 8 per element.
    mem = m1[1]["mem"]
    frac = lambda sharded: 1.0 / N if sharded else 1.0
    for key, per, sharded in (("params", 4, zero >= 3), ("grads", 4, zero >= 2), ("optim", 8, zero >= 1)):
        w = per * psi * frac(sharded)
        # padding: up to N−1 elements per bucket (ZeRO-1 pads the buffer once)
        if abs(mem[key] - w) > 0.01 * w:
            errs.append("%s bytes per rank %d vs formula %.0f" % (key, mem[key], w))
    msg += ", state bytes %d/%d/%d (transient %d/%d)" % (mem["params"], mem["grads"], mem["optim"],
                                                        mem["params_transient"], mem["grads_transient"])
print(msg)
if errs: print("; ".join(errs)); sys.exit(1)
PY
}

run 1 ref --training.micro_batch=8 --checkpoint.dir="$tmp/ckref" --checkpoint.every=1 --checkpoint.keep=20 ||
  bad "single-process reference run failed: $(tail -3 "$tmp/ref.log")"
for dp in 1 2 4; do
  for zero in 0 1 2 3; do
    for acc in 1 2; do
      mb=$(( 8 / dp / acc )); name="dp${dp}_z${zero}_a${acc}"
      case $zero in 0|1) A=2; B=0;; 2) A=$((acc + 1)); B=0;; 3) A=$((2 * acc)); B=$acc;; esac
      [ $dp = 1 ] && A=0 # one rank: nothing to send, nothing to shard
      if run "$dp" "$name" --parallel.dp=$dp --parallel.zero=$zero --training.micro_batch=$mb; then
        if compare ref "$name" $A $B "$dp" $zero; then ok; else bad "$name differs from the single-process run"; fi
      else
        bad "$name failed: $(tail -3 "$tmp/$name.log")"
      fi
    done
  done
done

# tied embeddings: the embedding's gradient gathers the head's (forward) and the lookup's (end of
# backward) contributions in one sharded buffer
run 1 ref_tied --model.tied_embeddings=true --training.micro_batch=8 ||
  bad "tied reference run failed: $(tail -3 "$tmp/ref_tied.log")"
for zero in 1 2 3; do
  name="dp4_z${zero}_tied"
  if run 4 "$name" --model.tied_embeddings=true --parallel.dp=4 --parallel.zero=$zero --training.micro_batch=1; then
    if compare ref_tied "$name"; then ok; else bad "$name differs from the single-process run"; fi
  else
    bad "$name failed: $(tail -3 "$tmp/$name.log")"
  fi
done

# resume across layouts: dp 4 ZeRO-3 (3 steps) -> dp 2 ZeRO-1 (3) -> dp 4 ZeRO-3 (2) -> dp 1 (2)
# == 10 uninterrupted steps
ck="$tmp/ck"
run 4 r1 --parallel.dp=4 --parallel.zero=3 --training.micro_batch=1 --checkpoint.dir="$ck" --training.steps=3 --checkpoint.keep=5 &&
run 2 r2 --parallel.dp=2 --parallel.zero=1 --training.micro_batch=2 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=6 --checkpoint.keep=5 &&
run 4 r3 --parallel.dp=4 --parallel.zero=3 --training.micro_batch=2 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=8 --checkpoint.keep=5 &&
run 1 r4 --training.micro_batch=8 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=10 --checkpoint.keep=5 ||
  bad "resume runs failed: $(tail -2 "$tmp"/r*.log)"
[ "$(ls "$ck/step_00000008" | grep -c '^shard-.*-of-00004.safetensors$')" = 4 ] && ok ||
  bad "a dp 4 ZeRO-3 checkpoint should hold one shard file per rank: $(ls "$ck/step_00000008")"
"$PY" - "$tmp" <<'PY' && ok || bad "losses after resuming across layouts differ"
import json, sys
t = sys.argv[1]
ref = [json.loads(l)["loss"] for l in open(t + "/ref.jsonl")]
got = []
for n in ("r1", "r2", "r3", "r4"):
    got += [json.loads(l)["loss"] for l in open("%s/%s.jsonl" % (t, n))]
worst = max(abs(a - b) / a for a, b in zip(ref, got))
print("resume dp4/ZeRO-3 -> dp2/ZeRO-1 -> dp4/ZeRO-3 -> dp1: %d steps, worst loss difference %.1e" % (len(got), worst))
sys.exit(0 if len(got) == 10 and worst <= 1e-4 else 1)
PY

# the Hugging Face export of a sharded checkpoint equals the single-process one's
"$bin" export --checkpoint "$ck/step_00000008" --out "$tmp/ex4" > /dev/null 2>&1 &&
"$bin" export --checkpoint "$tmp/ckref/step_00000008" --out "$tmp/ex1" > /dev/null 2>&1 ||
  bad "export failed"
"$PY" - "$tmp/ex1/model.safetensors" "$tmp/ex4/model.safetensors" <<'PY' && ok || bad "exports differ"
import json, math, struct, sys
def st(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}
a, b = st(sys.argv[1]), st(sys.argv[2])
assert a.keys() == b.keys(), "tensor names differ"
worst = max(math.sqrt(sum((x - y) ** 2 for x, y in zip(a[k], b[k]))) / math.sqrt(sum(x * x for x in a[k])) for k in a)
print("export of dp4/ZeRO-3 step 8 vs single process: %d tensors, worst relative difference %.1e" % (len(a), worst))
sys.exit(0 if worst <= 1e-5 else 1)
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
expect_fail 2 "parallel.zero = 4" --parallel.dp=2 --parallel.zero=4 --training.micro_batch=1
expect_fail 2 "only data and tensor parallelism are available" --parallel.dp=-1 --parallel.pp=2 --training.micro_batch=1

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
