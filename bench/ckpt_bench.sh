#!/usr/bin/env bash
# ckpt_bench.sh [STEPS] [EVERY]: what saving a checkpoint costs the run, written at once
# (checkpoint.async = false) and in the background (true), on one process × 2 threads.
# Model: dim 512, 8 layers, vocab 8192 (about 29M parameters: a checkpoint of weights and AdamW's
# two moments is about 350 MB), 8 × 256 tokens per step. Three runs of STEPS steps (default 24):
# no checkpoint, a checkpoint every EVERY steps (default 4) written at once, the same in the
# background. The cost of one save is (the run's wall time − the run without checkpoints) / the
# saves, so it includes what the training steps lose to the writer thread on the same cores;
# also the median step time of the steps just after a save started (async: the steps that run
# while it is written). Checkpoints go to BENCH_CKPT_DIR (default $out/ckpt, on the disk of /tmp).
set -euo pipefail
steps="${1:-24}" every="${2:-4}"
source "$(dirname "${BASH_SOURCE[0]}")/parallel_common.sh" ckpt
ck="${BENCH_CKPT_DIR:-$out/ckpt}"
shard="$(synthetic_shard 8192 $((steps * 8 * 256 + 1)))"
cfg=(--model.vocab_size=8192 --model.dim=512 --model.n_layers=8 --model.n_heads=8 --model.n_kv_heads=8
     --model.ffn_dim=1376 --model.max_seq_len=256 --training.seq_len=256 --training.global_batch=8
     --training.micro_batch=8 --training.threads=2 --training.steps="$steps" --data.train="$shard"
     --logging.every=1000 --logging.progress=false --logging.report_every=0)
run() { # NAME ARGS...: wall seconds of the whole run on stdout, metrics in $out/NAME.jsonl
  local name="$1"; shift
  rm -rf "$ck" "$out/$name.jsonl"
  local t0 t1
  t0=$(date +%s.%N)
  "$bin" train "${cfg[@]}" --logging.metrics="$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}
none=$(run none)
sync=$(run sync --checkpoint.dir="$ck" --checkpoint.every="$every" --checkpoint.keep=2)
async=$(run async --checkpoint.dir="$ck" --checkpoint.every="$every" --checkpoint.keep=2 --checkpoint.async=true)
"$PY" - "$out" "$steps" "$every" "$none" "$sync" "$async" <<'PY'
import json, statistics, sys
out, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
wall = dict(zip(("none", "sync", "async"), map(float, sys.argv[4:7])))
saves = steps // every  # the last step's save is written at once in both modes
def step_s(name, after_save):
    m = [json.loads(l) for l in open("%s/%s.jsonl" % (out, name))]
    sel = [x["seconds"] for x in m[2:] if ((x["step"] - 1) % every == 0) == after_save]
    return statistics.median(sel) if sel else float("nan")
base = step_s("none", False)
print("ckpt_bench: %d steps, a checkpoint every %d (%d saves), model dim 512 x 8 layers (29M parameters)" % (steps, every, saves))
print("%-8s %9s %14s %22s %20s" % ("mode", "wall s", "s per save", "step after a save, s", "other steps, s"))
for n in ("none", "sync", "async"):
    per = (wall[n] - wall["none"]) / saves if n != "none" else 0.0
    print("%-8s %9.2f %14.3f %22.4f %20.4f" % (n, wall[n], per, step_s(n, True), step_s(n, False)))
print("async / sync cost per save: %.2f" % ((wall["async"] - wall["none"]) / max(wall["sync"] - wall["none"], 1e-9)))
PY
