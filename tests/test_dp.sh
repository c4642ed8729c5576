#!/usr/bin/env bash
# test_dp.sh PENTATRON: data parallelism through mpiexec against the single-process run.
#   - dp ∈ {1, 2, 4} × ZeRO ∈ {0, 1, 2, 3} × accumulation ∈ {1, 2}: step-1 gradients per tensor
#     ‖Δ‖/‖g‖ ≤ 1e-5 and the losses of 10 steps within 1e-4 relative;
#   - bytes sent per rank per step (bus-bandwidth convention) ± 1%: 2Ψ(N−1)/N for DP and ZeRO-1;
#     ZeRO-2 reduce-scatters every micro-batch: (a+1)Ψ(N−1)/N with a accumulation steps;
#     ZeRO-3 gathers every unit for forward and the layers again for backward (the embedding's
#     backward does not read it, the tail is kept from the loss to its backward) and
#     reduce-scatters: a(2Ψ + Ψ_layers)(N−1)/N;
#   - per-rank parameter, gradient and optimizer bytes as ZeRO's formulas give them (± padding);
#   - the end of backward overlapped (the norm summed per bucket, each bucket's update gathered
#     while the next is updated, ZeRO-1's gathers completed by the next forward): many buckets,
#     clipping at every step and evaluations, ZeRO 0-3 at dp 2 and 4 (and MPI progressed by a
#     thread), losses and val losses against the single-process run;
#   - HSDP's bytes (parallel.zero_scope = 2): the shard group's ZeRO-1 traffic over S ranks, the
#     replicate group's all-reduce of a shard, 2(R−1)/R·Ψ/S;
#   - checkpoints resume across layouts (dp 4 ZeRO-3 -> dp 2 ZeRO-1 -> dp 4 ZeRO-3 HSDP -> dp 1) with
#     the same losses, and `pentatron export` of a dp 4 ZeRO-3 checkpoint equals the single-process
#     one's;
#   - impossible layouts fail fast with one message; a killed rank ends the job non-zero.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"

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

# HSDP (parallel.zero_scope = 2 over dp 4: S = 2 ranks per shard group, R = 2 replicas), ZeRO-1:
# per step the shard group (dps) carries the reduce-scatter and the parameters' gather, (S−1)/S·Ψ
# each (A = 2, N = S; the optimizer state 1/S per rank); the replicate group (dpr) the all-reduce
# of each rank's reduced shard, 2(R−1)/R·Ψ/S (A = 2/S = 1, N = R)
if run 4 hsdp_z1 --parallel.dp=4 --parallel.zero=1 --parallel.zero_scope=2 --training.micro_batch=2; then
  "$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" "$tmp" ref hsdp_z1 --bytes 2 0 2 --group dps --zero 1 --norms &&
  "$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" "$tmp" ref hsdp_z1 --bytes 1 0 2 --group dpr && ok ||
    bad "hsdp_z1: its bytes or state differ from HSDP's formulas"
else
  bad "hsdp_z1 failed: $(tail -3 "$tmp/hsdp_z1.log")"
fi

# the end of backward overlapped (trainer.c, pt_trainer_reduce and pt_trainer_update): the norm
# summed bucket by bucket as the reductions complete, each bucket's slice updated and its
# parameters gathered while the next is updated, ZeRO-1's gathers completed as the next forward
# acquires each unit (and before every evaluation). Many buckets (bucket_mb 0.004: ZeRO-0/1 cut
# the 87 KB buffer into 21, ZeRO-2/3 take a unit each), clipping active at every step (grad_clip
# 0.05, under every step's norm: a norm summed before its gradients were final, or an update
# gathered before it was made, changes the losses) and an evaluation every 3 steps, whose losses
# must match too.
shard "$tmp/val_000000.bin" 3000 2 0.1
clip=(--optimizer.grad_clip=0.05 --data.val="$tmp/val_*.bin" --eval.every=3 --eval.tokens=256)
run 1 ref_clip "${clip[@]}" --training.micro_batch=8 ||
  bad "clipped reference run failed: $(tail -3 "$tmp/ref_clip.log")"
"$PY" - "$tmp/ref_clip.jsonl" <<'PY' && ok || bad "the clipped reference does not clip at every step"
import json, sys
sys.exit(0 if all(json.loads(l)["grad_norm"] > 0.05 for l in open(sys.argv[1])) else 1)
PY
same_val() { # REF NAME: the 4 evaluations' losses within 1e-4
  "$PY" - "$tmp/$1.jsonl" "$tmp/$2.jsonl" <<'PY'
import json, sys
val = [[json.loads(l).get("val_loss") for l in open(f)] for f in sys.argv[1:]]
ok = [a is not None and b is not None and abs(a - b) <= 1e-4 * abs(a) for a, b in zip(*val) if a or b]
print("  val losses: %d, within 1e-4: %s" % (len(ok), all(ok)))
sys.exit(0 if len(ok) == 4 and all(ok) else 1)
PY
}
# dp zero micro_batch [progress]: the last, MPI progressed by a thread per rank (comm_mpi.c)
for lay in "2 0 4" "2 1 4" "4 1 2" "2 2 2" "4 2 1" "2 3 2" "2 1 2 thread"; do
  read -r dp zero mb progress <<< "$lay"; name="clip_dp${dp}_z${zero}${progress:+_$progress}"
  if PT_MPI_PROGRESS=${progress:-poll} run "$dp" "$name" "${clip[@]}" --parallel.dp=$dp \
      --parallel.zero=$zero --training.micro_batch=$mb --parallel.bucket_mb=0.004; then
    if compare ref_clip "$name" && same_val ref_clip "$name"; then ok; else bad "$name differs from the single-process run"; fi
  else
    bad "$name failed: $(tail -3 "$tmp/$name.log")"
  fi
done

# the automatic bucket size (parallel.bucket_mb = 0, the default): an eighth of the gradients
# between 1 and 25 MiB, so a 4.5 M-parameter model (18 MB of gradients, 2.2 MiB buckets) gets 8
# flat buckets (ZeRO-1: each a multiple of dp elements) where 25 MiB made one, and the tiny model
# one of its 1 MiB floor
bigger=(--model.vocab_size=8192 --model.dim=256 --model.n_heads=4 --model.n_kv_heads=2 --model.ffn_dim=512
        --training.steps=1 --training.micro_batch=4 --data.train="$tmp/big_*.bin")
"$PY" - "$tmp/big_000000.bin" <<'PY'
import struct, sys
n = 20000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[(i * 7919) % 8192 for i in range(n)]))
PY
buckets() { sed -n 's/.* ZeRO-[0-9], \([0-9]*\) gradient buckets.*/\1/p' "$tmp/$1.log" | head -1; }
run 2 auto_big "${bigger[@]}" --parallel.dp=2 --parallel.zero=1 --parallel.bucket_mb=0 &&
run 2 fixed_big "${bigger[@]}" --parallel.dp=2 --parallel.zero=1 --parallel.bucket_mb=25 &&
run 2 auto_tiny --parallel.dp=2 --parallel.zero=1 --parallel.bucket_mb=0 --training.steps=1 --training.micro_batch=4 ||
  bad "bucket runs failed: $(tail -2 "$tmp"/auto_big.log "$tmp"/fixed_big.log "$tmp"/auto_tiny.log)"
echo "  buckets: auto $(buckets auto_big), 25 MiB $(buckets fixed_big), tiny auto $(buckets auto_tiny)"
[ "$(buckets auto_big)" = 8 ] && [ "$(buckets fixed_big)" = 1 ] && [ "$(buckets auto_tiny)" = 1 ] && ok ||
  bad "automatic buckets: $(buckets auto_big) (want 8), 25 MiB $(buckets fixed_big) (1), tiny $(buckets auto_tiny) (1)"

# resume across layouts: dp 4 ZeRO-3 (3 steps) -> dp 2 ZeRO-1 (3) -> dp 4 ZeRO-3 as HSDP (2 shard
# groups of 2: plain ZeRO resharded into HSDP) -> dp 1 (2: HSDP into one rank) == 10 uninterrupted
# steps
ck="$tmp/ck"
run 4 r1 --parallel.dp=4 --parallel.zero=3 --training.micro_batch=1 --checkpoint.dir="$ck" --training.steps=3 --checkpoint.keep=5 &&
run 2 r2 --parallel.dp=2 --parallel.zero=1 --training.micro_batch=2 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=6 --checkpoint.keep=5 &&
run 4 r3 --parallel.dp=4 --parallel.zero=3 --parallel.zero_scope=2 --training.micro_batch=2 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=8 --checkpoint.keep=5 &&
run 1 r4 --training.micro_batch=8 --checkpoint.dir="$ck" --checkpoint.resume=latest --training.steps=10 --checkpoint.keep=5 ||
  bad "resume runs failed: $(tail -2 "$tmp"/r*.log)"
[ "$(ls "$ck/step_00000008" | grep -c '^shard-.*-of-00004.safetensors$')" = 2 ] && ok ||
  bad "a dp 4 ZeRO-3 HSDP checkpoint should hold one shard file per rank of the first replica (2): $(ls "$ck/step_00000008")"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --resume "$tmp" ref "dp4/ZeRO-3 -> dp2/ZeRO-1 -> dp4/ZeRO-3 HSDP (2 x 2) -> dp1" r1 r2 r3 r4 && ok ||
  bad "losses after resuming across layouts differ"

# the Hugging Face export of a sharded checkpoint equals the single-process one's
"$bin" export --checkpoint "$ck/step_00000008" --out "$tmp/ex4" > /dev/null 2>&1 &&
"$bin" export --checkpoint "$tmp/ckref/step_00000008" --out "$tmp/ex1" > /dev/null 2>&1 ||
  bad "export failed"
"$PY" "$PT_SOURCE_DIR/tests/ref/compare_runs.py" --exports "$tmp/ex1/model.safetensors" \
  "$tmp/ex4/model.safetensors" "export of dp4/ZeRO-3 (HSDP) step 8 vs single process" && ok || bad "exports differ"

# impossible layouts: one message from rank 0, every rank non-zero, fast
expect_fail 3 "does not match the world size 3" --parallel.dp=2 --training.micro_batch=1
expect_fail 2 "divisible by dp × micro_batch" --parallel.dp=2 --training.micro_batch=8
expect_fail 2 "parallel.zero = 4" --parallel.dp=2 --parallel.zero=4 --training.micro_batch=1
PT_COMM_WAIT=bogus expect_fail 2 'PT_COMM_WAIT = "bogus": expected spin or nap' --parallel.dp=2 --training.micro_batch=1
expect_fail 2 "must divide model.n_experts" --parallel.dp=-1 --parallel.ep=2 --training.micro_batch=1
expect_fail 4 "parallel.zero_scope = 3 must divide parallel.dp = 4" --parallel.dp=4 --parallel.zero=1 --parallel.zero_scope=3 --training.micro_batch=1
expect_fail 2 'parallel.zero_scope = "banana": expected all, node or' --parallel.dp=2 --parallel.zero=1 --parallel.zero_scope=banana --training.micro_batch=1

# a rank killed mid-run, once training has started: the job ends non-zero within seconds, naming it
killed_rank 2 1 --parallel.dp=2 --training.micro_batch=1 --parallel.timeout_s=20

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
