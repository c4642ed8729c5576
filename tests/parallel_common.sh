# parallel_common.sh PENTATRON: what the parallel tests share (sourced): the MPI environment, a
# synthetic shard of 97-token sequences (shard writes more), the tiny model, and
#   run NP NAME ARGS...        a training run (mpiexec when NP > 1): $tmp/NAME.{jsonl,st,log}
#   compare REF NAME [A B N Z] tests/ref/compare_runs.py against the reference run
#   check NP NAME REF ARGS...  a run that must reproduce REF (run, then compare)
#   expect_fail NP NEEDLE ARGS a layout that must fail fast with one message
#   bf16_check NP NAME LAYERS  a bf16 run against bref$LAYERS within bf16's own distance from fp32
#   val_same NAME LABEL        validation losses equal to the run ev_ref's
#   rank_pid LOG RANK          the pid of world rank RANK once the run's LOG shows step 2
#   killed_rank NP RANK ARGS   a rank SIGKILLed once training runs must end the job fast
#   ok / bad MESSAGE           count a pass / a failure
bin="$1"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
PY="${PT_PYTHON:-/usr/bin/python3}"
export PT_SOURCE_DIR="${PT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"
# the EXIT trap removes $tmp in this shell only: a forked child of it (a background job killed
# before it has exec'd its command, as a watchdog may be) inherits the trap and would run it
tmp="$(mktemp -d)"; pt_main_shell=$BASHPID
trap '[ "$BASHPID" = "$pt_main_shell" ] && rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# shard PATH N SEED NOISE: N tokens of the pattern 7i mod 97, a NOISE share of them random
shard() {
  "$PY" - "$@" <<'PY'
import random, struct, sys
path, n, seed, noise = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
random.seed(seed)
toks = [(i * 7) % 97 if random.random() > noise else random.randrange(97) for i in range(n)]
with open(path, "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *toks))
PY
}
shard "$tmp/train_000000.bin" 30000 1 0.1
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

# compare REF NAME [A B N ZERO]: tests/ref/compare_runs.py (gradients, losses, dp bytes per step
# = (A·Ψ + B·Ψ_layers)(N−1)/N, model-state bytes per rank of ZeRO stage ZERO)
compare() {
  local extra=()
  [ -n "${3:-}" ] && [ "${3:-0}" != 0 ] && extra=(--bytes "$3" "$4" "$5" --zero "$6")
  "$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" "$tmp" "$1" "$2" "${extra[@]}"
}

expect_fail() { # NP NEEDLE ARGS...
  local np="$1" needle="$2"; shift 2
  local t0=$SECONDS out rc
  out="$(timeout 60 mpiexec -np "$np" "$bin" train "${tiny[@]}" "$@" 2>&1)"; rc=$?
  local n; n=$(grep -cF -- "$needle" <<<"$out")
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq 1 ] && [ $((SECONDS - t0)) -lt 30 ]; then ok
  else bad "np $np $*: exit $rc, '$needle' printed $n times: $(head -3 <<<"$out")"; fi
}

check() { # NP NAME REF ARGS...: a run that must reproduce the run REF
  local np="$1" name="$2" ref="$3"; shift 3
  if run "$np" "$name" "$@"; then
    if compare "$ref" "$name"; then ok; else bad "$name differs from the single-process run"; fi
  else
    bad "$name failed: $(tail -3 "$tmp/$name.log")"
  fi
}

# bf16_check NP NAME LAYERS ARGS...: a bf16 run of the tiny model with LAYERS layers against the
# single-process bf16 run bref$LAYERS, within a share of bf16's own distance from fp32 (ref$LAYERS)
bf16_check() {
  local np="$1" name="$2" layers="$3"; shift 3
  if run "$np" "$name" --model.n_layers=$layers --training.precision=bf16 "$@"; then
    "$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --bf16 "$tmp" "ref$layers" "bref$layers" "$name" "bf16 $name" && ok ||
      bad "$name too far from the single-process bf16 run"
  else
    bad "$name failed: $(tail -3 "$tmp/$name.log")"
  fi
}

# val_same NAME LABEL: NAME's validation losses within 1e-5 of the single process's (the run ev_ref)
val_same() {
  "$PY" - "$tmp" "$1" "$2" <<'PY'
import json, sys
def val(n): return [(r["step"], r["val_loss"]) for r in map(json.loads, open("%s/%s.jsonl" % (sys.argv[1], n))) if "val_loss" in r]
a, b = val("ev_ref"), val(sys.argv[2])
worst = max(abs(x[1] - y[1]) / x[1] for x, y in zip(a, b)) if a else 1
print("%s validation losses at steps %s: worst relative difference %.1e" % (sys.argv[3], [s for s, _ in b], worst))
sys.exit(0 if len(a) == 2 and [s for s, _ in a] == [s for s, _ in b] and worst <= 1e-5 else 1)
PY
}

# rank_pid LOG RANK [TRIES]: once LOG shows step 2, the pid of the job's world rank RANK (a process
# naming $tmp/train_ whose environment has OMPI_COMM_WORLD_RANK=RANK); nothing if none appears
# within TRIES tenths of a second (default 100)
rank_pid() {
  local log="$1" rank="$2" tries="${3:-100}" p
  for _ in $(seq 1 "$tries"); do
    sleep 0.1
    grep -Eq "step +2/" "$log" 2>/dev/null || continue
    for p in $(pgrep -f "$tmp/train_"); do
      tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank" && { echo "$p"; return; }
    done
  done
}

# killed_rank NP RANK ARGS...: rank RANK killed (SIGKILL) once the run has reached step 2: the job
# must end non-zero within 30 s (not by the test's timeout, not as a failed start), naming the rank
killed_rank() {
  local np="$1" rank="$2"; shift 2
  local out="$tmp/kill.log" victim="" job rc t0 took
  timeout 60 mpiexec -np "$np" "$bin" train "${tiny[@]}" "$@" --training.steps=1000000 > "$out" 2>&1 &
  job=$!
  victim=$(rank_pid "$out" "$rank")
  t0=$SECONDS
  [ -n "$victim" ] && kill -9 "$victim"
  wait $job; rc=$?
  took=$((SECONDS - t0))
  if [ -n "$victim" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 30 ] && grep -q "rank $rank" "$out"; then
    ok; echo "killed rank $rank (pid $victim): exit $rc after ${took}s: $(grep "rank $rank" "$out" | head -1)"
  else
    bad "killed rank $rank: pid '$victim', exit $rc after ${took}s: $(tail -5 "$out")"
  fi
  pkill -9 -f "$tmp/train_" 2>/dev/null
}
