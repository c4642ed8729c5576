#!/usr/bin/env bash
# bitcheck.sh [REF]: is the working tree bitwise the same trainer as REF?
#
# Builds REF (default: the tag pre-redesign, or commit baa7fd8 where the tag did not travel with
# the clone) in a git worktree under $BITCHECK_DIR (default /tmp/pt-bitcheck; reused, rebuilt only
# when REF moves) and the working tree into build/, both with scripts/build.sh (see
# scripts/ref_build.sh). Then runs a fixed list of layouts with both binaries, same arguments,
# same machine: the tiny model of tests/parallel_common.sh (10 steps on its synthetic shard),
#   - one process: dense (2 and 4 layers, tied or not), mixture of experts (test_5d.sh's), the
#     references of test_5d.sh;
#   - each parallelism alone at degree 2: dp 2 with ZeRO-0/1/2/3, tp 2 with and without sp, pp 2
#     with each schedule (afab, 1f1b, interleaved with pp_virtual 2, zb), cp 2 contiguous and
#     zigzag, ep 2 over dp 2 (MoE); a few MoE ones (tp 2 + sp, pp 2 zb); tp 4 with 2 kv heads
#     (each kv head replicated on 2 ranks);
#   - every layout of tests/test_5d.sh's matrix (6 to 16 ranks, copied below as it was at
#     pre-redesign).
# and compares, per layout, with cmp: the step-1 gradients (logging.dump_grads, a safetensors
# file) byte for byte, and every step's loss, grad_norm, aux_loss and z_loss exactly as the
# metrics JSON lines print them. Prints one line per layout (same / DIFFERS: what / FAILED: why),
# then "N passed, M failed"; exits 1 if any layout differs or failed.
#
#   BITCHECK_ONLY=REGEX   only the layouts whose name matches (bash =~), e.g. 'cp|zb'
#   BITCHECK_DIR=DIR      where the worktree, its build, the data and the runs go (runs/old,
#                         runs/new: NAME.{jsonl,st,log,txt} of the last check, for a closer look)
#   BITCHECK_LIST=1       print the layouts (name, ranks, arguments) and exit
#   BITCHECK_NEW_BIN=BIN  compare BIN (e.g. a build of the staged tree) instead of building build/
#
# 83 layouts (58 fp32, 25 bf16; up to 16 oversubscribed ranks), each run twice: ~13 min of CPU, about 7 min on a
# quiet 2-core machine (13 min when it was shared at a load of ~20), plus the builds (~35 s each
# when they are not up to date). The per-side totals printed at the end hint at speed, no more.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/ref_build.sh"
PY=/usr/bin/python3
only="${BITCHECK_ONLY:-}"
t_start=$SECONDS

# ---- the layouts ---------------------------------------------------------------------------------
# the tiny model and its run arguments, as tests/parallel_common.sh has them (the data path aside)
data="$BITCHECK_DIR/data"
tiny=(--model.vocab_size=97 --model.dim=32 --model.n_layers=2 --model.n_heads=4 --model.n_kv_heads=2
      --model.ffn_dim=48 --model.max_seq_len=32 --training.seq_len=16 --training.global_batch=8
      --training.steps=10 --training.threads=1 --optimizer.lr=3e-3 --data.shuffle=true
      --optimizer.schedule=constant --optimizer.warmup_steps=2
      --data.train="$data/train_*.bin" --parallel.bucket_mb=0.02 --logging.progress=false)
P=--parallel
L4=(--model.n_layers=4)
moe=(--model.n_layers=4 --model.n_experts=4 --model.top_k=2 --model.moe_ffn_dim=24
     --model.moe_first_dense=1 --model.n_shared_experts=1 --model.aux_loss_coef=0.05
     --model.z_loss_coef=0.01)
T4=("${L4[@]}" --model.tied_embeddings=true)
TM=("${moe[@]}" --model.tied_embeddings=true)
full=($P.dp=2 $P.pp=2 $P.cp=2 $P.tp=2 $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1)
O=(--model.n_layers=3 --training.seq_len=24 --training.global_batch=12)
omoe=("${O[@]}" --model.n_experts=6 --model.top_k=2 --model.moe_ffn_dim=24 --model.moe_first_dense=1 --model.aux_loss_coef=0.05)

names=(); nps=(); argv=()
L() { # NAME NP ARGS...: one layout (the arguments after the tiny ones)
  local name="$1" np="$2"; shift 2
  [[ -z $only || $name =~ $only ]] || return 0
  names+=("$name"); nps+=("$np"); argv+=("$(printf '%q ' "$@")")
}
dense() { local np="$1" name="$2"; shift 2; L "$name" "$np" "${L4[@]}" "$@"; }
mixed() { local np="$1" name="$2"; shift 2; L "$name" "$np" "${moe[@]}" "$@"; }

# one process
L dense 1 --training.micro_batch=8
L dense_mb2 1 --training.micro_batch=2
L ref4 1 "${L4[@]}" --training.micro_batch=8
L mref 1 "${moe[@]}" --training.micro_batch=8
L tref 1 "${T4[@]}" --training.micro_batch=8
L tmref 1 "${TM[@]}" --training.micro_batch=8
L oref 1 "${O[@]}" --training.micro_batch=12
L omref 1 "${omoe[@]}" --training.micro_batch=12
# each parallelism alone at degree 2 (4 layers; MoE for ep)
for z in 0 1 2 3; do dense 2 dp2_z$z $P.dp=2 $P.zero=$z --training.micro_batch=2; done
dense 2 tp2 $P.tp=2 --training.micro_batch=8
dense 2 tp2_sp $P.tp=2 $P.sp=true --training.micro_batch=4
for s in afab 1f1b zb; do dense 2 pp2_$s $P.pp=2 $P.pp_schedule=$s --training.micro_batch=2; done
dense 2 pp2_interleaved $P.pp=2 $P.pp_schedule=interleaved $P.pp_virtual=2 --training.micro_batch=2
dense 2 cp2_contiguous $P.cp=2 $P.cp_layout=contiguous --training.micro_batch=8
dense 2 cp2_zigzag $P.cp=2 $P.cp_layout=zigzag --training.micro_batch=8
mixed 2 moe_dp2_ep2 $P.dp=2 $P.ep=2 --training.micro_batch=2
mixed 2 moe_dp2_ep2_z1 $P.dp=2 $P.ep=2 $P.zero=1 --training.micro_batch=2
mixed 2 moe_tp2_sp $P.tp=2 $P.sp=true --training.micro_batch=4
mixed 2 moe_pp2_zb $P.pp=2 $P.pp_schedule=zb --training.micro_batch=2
L tied_pp2_1f1b 2 "${T4[@]}" $P.pp=2 $P.pp_schedule=1f1b --training.micro_batch=2
# the kv group: 4 query heads, 2 kv heads over tp 4 (each kv head on 2 ranks)
dense 4 tp4_kv2 $P.tp=4 --training.micro_batch=8
dense 4 tp4_kv2_sp $P.tp=4 $P.sp=true --training.micro_batch=8
# tests/test_5d.sh's matrix (at pre-redesign): 8 ranks, dense
dense 8 dp2_tp2_pp2_1f1b_z1 $P.dp=2 $P.tp=2 $P.pp=2 $P.pp_schedule=1f1b $P.zero=1 --training.micro_batch=2
dense 8 dp2_cp2_tp2_sp_z1 $P.dp=2 $P.cp=2 $P.tp=2 $P.sp=true $P.zero=1 --training.micro_batch=2
dense 8 pp2_cp2_tp2_interleaved $P.pp=2 $P.cp=2 $P.tp=2 $P.pp_schedule=interleaved $P.pp_virtual=2 --training.micro_batch=2
dense 8 dp2_pp2_cp2_zb_z1 $P.dp=2 $P.pp=2 $P.cp=2 $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1
dense 8 dp2_pp2_cp2_afab $P.dp=2 $P.pp=2 $P.cp=2 $P.pp_schedule=afab --training.micro_batch=2
dense 8 dp4_tp2_z2 $P.dp=4 $P.tp=2 $P.zero=2 --training.micro_batch=1
dense 8 dp2_cp2_tp2_z3 $P.dp=2 $P.cp=2 $P.tp=2 $P.zero=3 --training.micro_batch=2
dense 8 cp4_tp2_sp $P.cp=4 $P.tp=2 $P.sp=true --training.micro_batch=8
dense 8 tp4_pp2_1f1b $P.tp=4 $P.pp=2 $P.pp_schedule=1f1b --training.micro_batch=2
dense 8 cp2_pp4_zb $P.cp=2 $P.pp=4 $P.pp_schedule=zb --training.micro_batch=2
#   tied embeddings across the pipeline
L tied_dp2_pp2_tp2_sp_zb_z1 8 "${T4[@]}" $P.dp=2 $P.pp=2 $P.tp=2 $P.sp=true $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1
L tied_moe_dp2_cp2_pp2_ep4_z1 8 "${TM[@]}" $P.dp=2 $P.cp=2 $P.pp=2 $P.ep=4 $P.zero=1 --training.micro_batch=1
#   8 ranks, mixture of experts
mixed 8 moe_dp4_ep2_pp2_zb_z1 $P.dp=4 $P.ep=2 $P.pp=2 $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1
mixed 8 moe_dp2_cp2_pp2_ep4 $P.dp=2 $P.cp=2 $P.pp=2 $P.ep=4 --training.micro_batch=1
mixed 8 moe_dp2_tp2_pp2_ep2_sp $P.dp=2 $P.tp=2 $P.pp=2 $P.ep=2 $P.sp=true --training.micro_batch=2
mixed 8 moe_dp4_tp2_ep4_z1 $P.dp=4 $P.tp=2 $P.ep=4 $P.zero=1 --training.micro_batch=1
mixed 8 moe_dp2_cp2_tp2_ep2_sp_z3 $P.dp=2 $P.cp=2 $P.tp=2 $P.ep=2 $P.sp=true $P.zero=3 --training.micro_batch=2
mixed 8 moe_cp2_tp2_pp2_ep2_interleaved $P.cp=2 $P.tp=2 $P.pp=2 $P.ep=2 $P.pp_schedule=interleaved $P.pp_virtual=2 --training.micro_batch=2
#   16 ranks: all five
mixed 16 moe_5d_ep2_zb_z1_sp "${full[@]}" $P.ep=2 $P.sp=true
mixed 16 moe_5d_ep2_zb_z1 "${full[@]}" $P.ep=2
dense 16 5d_zb_z1_sp "${full[@]}" $P.sp=true
mixed 16 moe_5d_ep4_interleaved $P.dp=2 $P.pp=2 $P.cp=2 $P.tp=2 $P.ep=4 $P.pp_schedule=interleaved $P.pp_virtual=2 --training.micro_batch=2
mixed 16 moe_dp4_cp2_pp2_ep2_afab $P.dp=4 $P.cp=2 $P.pp=2 $P.ep=2 $P.pp_schedule=afab --training.micro_batch=1
dense 16 dp4_pp2_tp2_1f1b_z1 $P.dp=4 $P.pp=2 $P.tp=2 $P.zero=1 $P.pp_schedule=1f1b --training.micro_batch=1
dense 16 dp2_cp4_tp2_z2 $P.dp=2 $P.cp=4 $P.tp=2 $P.zero=2 --training.micro_batch=2
dense 16 dp8_tp2_z3_sp $P.dp=8 $P.tp=2 $P.zero=3 $P.sp=true --training.micro_batch=1
mixed 16 moe_dp4_cp2_tp2_ep4_z2 $P.dp=4 $P.cp=2 $P.tp=2 $P.ep=4 $P.zero=2 --training.micro_batch=1
#   degrees other than powers of two (3 layers, 24-token sequences, 12 rows, 6 experts)
L odd_dp3_pp2_tp2_z1 12 "${O[@]}" $P.dp=3 $P.pp=2 $P.tp=2 $P.zero=1 --training.micro_batch=2
L odd_cp3_tp2_sp 6 "${O[@]}" $P.cp=3 $P.tp=2 $P.sp=true --training.micro_batch=4
L odd_moe_dp3_pp2_cp2_ep3 12 "${omoe[@]}" $P.dp=3 $P.pp=2 $P.cp=2 $P.ep=3 --training.micro_batch=2
L odd_moe_dp3_cp2_ep6_z3 6 "${omoe[@]}" $P.dp=3 $P.cp=2 $P.ep=6 $P.zero=3 --training.micro_batch=4

# bf16 (training.precision = bf16): one process, each parallelism alone, the ZeRO levels, sequence
# parallelism, each schedule, recomputation, and layouts of the matrix
B=(--training.precision=bf16)
L bf16_dense 1 "${B[@]}" --training.micro_batch=8
L bf16_ref4 1 "${B[@]}" "${L4[@]}" --training.micro_batch=8
L bf16_mref 1 "${B[@]}" "${moe[@]}" --training.micro_batch=8
L bf16_tref_sel 1 "${B[@]}" "${T4[@]}" --training.recompute=selective --training.micro_batch=4
L bf16_ref4_full 1 "${B[@]}" "${L4[@]}" --training.recompute=full --training.micro_batch=4
for z in 0 1 2 3; do dense 2 bf16_dp2_z$z "${B[@]}" $P.dp=2 $P.zero=$z --training.micro_batch=2; done
dense 2 bf16_tp2_sp "${B[@]}" $P.tp=2 $P.sp=true --training.micro_batch=4
dense 2 bf16_tp2 "${B[@]}" $P.tp=2 --training.micro_batch=8
for s in afab 1f1b zb; do dense 2 bf16_pp2_$s "${B[@]}" $P.pp=2 $P.pp_schedule=$s --training.micro_batch=2; done
dense 2 bf16_pp2_interleaved "${B[@]}" $P.pp=2 $P.pp_schedule=interleaved $P.pp_virtual=2 --training.micro_batch=2
dense 2 bf16_cp2_zigzag "${B[@]}" $P.cp=2 $P.cp_layout=zigzag --training.micro_batch=8
mixed 2 bf16_moe_dp2_ep2_z1 "${B[@]}" $P.dp=2 $P.ep=2 $P.zero=1 --training.micro_batch=2
mixed 2 bf16_moe_tp2_sp "${B[@]}" $P.tp=2 $P.sp=true --training.micro_batch=4
dense 2 bf16_tp2_sp_sel "${B[@]}" $P.tp=2 $P.sp=true --training.recompute=selective --training.micro_batch=8
dense 8 bf16_dp2_tp2_pp2_1f1b_z1 "${B[@]}" $P.dp=2 $P.tp=2 $P.pp=2 $P.pp_schedule=1f1b $P.zero=1 --training.micro_batch=2
dense 8 bf16_dp2_cp2_tp2_sp_z1 "${B[@]}" $P.dp=2 $P.cp=2 $P.tp=2 $P.sp=true $P.zero=1 --training.micro_batch=2
dense 8 bf16_dp4_tp2_sp_z2 "${B[@]}" $P.dp=4 $P.tp=2 $P.sp=true $P.zero=2 --training.micro_batch=1
dense 8 bf16_dp2_cp2_tp2_z3 "${B[@]}" $P.dp=2 $P.cp=2 $P.tp=2 $P.zero=3 --training.micro_batch=2
mixed 8 bf16_moe_dp2_tp2_pp2_ep2_sp "${B[@]}" $P.dp=2 $P.tp=2 $P.pp=2 $P.ep=2 $P.sp=true --training.micro_batch=2
mixed 16 bf16_moe_5d_ep2_zb_z1_sp "${B[@]}" "${full[@]}" $P.ep=2 $P.sp=true

if [[ ${BITCHECK_LIST:-0} == 1 ]]; then
  for i in "${!names[@]}"; do printf '%-32s %2s  %s\n' "${names[$i]}" "${nps[$i]}" "${argv[$i]}"; done
  exit 0
fi
if (( ${#names[@]} == 0 )); then echo "bitcheck: no layout matches BITCHECK_ONLY='$only'" >&2; exit 2; fi

# ---- the two binaries, the data ------------------------------------------------------------------
ref_build "${1:-}"
if [[ -n ${BITCHECK_NEW_BIN:-} ]]; then NEW_BIN="$BITCHECK_NEW_BIN"; else new_build; fi
t_built=$SECONDS
# the synthetic shard of tests/parallel_common.sh: 30000 tokens, vocab 97, (7i mod 97) with 10% noise
if [[ ! -f $data/train_000000.bin ]]; then
  mkdir -p "$data"
  "$PY" - "$data/train_000000.bin" <<'PY'
import random, struct, sys
n = 30000
random.seed(1)
toks = [(i * 7) % 97 if random.random() > 0.1 else random.randrange(97) for i in range(n)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *toks))
PY
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
runs="$BITCHECK_DIR/runs"
rm -rf "$runs/old" "$runs/new"; mkdir -p "$runs/old" "$runs/new"

# run BIN DIR NAME NP ARGS...: DIR/NAME.{jsonl,st,log}, then DIR/NAME.txt: per step the text of
# loss, grad_norm, aux_loss, z_loss as the metrics line has it (not re-read as numbers)
run() {
  local bin="$1" dir="$2" name="$3" np="$4"; shift 4
  local launcher=()
  (( np > 1 )) && launcher=(timeout 120 mpiexec -np "$np")
  "${launcher[@]}" "$bin" train "${tiny[@]}" --logging.metrics="$dir/$name.jsonl" \
    --logging.dump_grads="$dir/$name.st" "$@" > "$dir/$name.log" 2>&1 || return $?
  "$PY" - "$dir/$name.jsonl" > "$dir/$name.txt" <<'PY'
import re, sys
n = 0
for line in open(sys.argv[1]):
    if not re.search(r'"step": ', line):
        continue
    n += 1
    vals = []
    for k in ("step", "loss", "grad_norm", "aux_loss", "z_loss"):
        m = re.search(r'"%s": ([^,}\s]+)' % k, line)
        if m:
            vals.append("%s %s" % (k, m.group(1)))
    print(" ".join(vals))
sys.exit(0 if n else 1)
PY
}

# what differs between two gradient dumps: tensors, their count, the largest ||d||/||g||
explain_grads() {
  "$PY" - "$1" "$2" <<'PY' 2>&1 || echo "grads (unreadable)"
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
if list(a) != list(b) or any(a[k][:2] != b[k][:2] for k in a):
    print("grads (tensor names or shapes: %s)" % sorted(set(a) ^ set(b))[:4]); sys.exit()
diff = [k for k in a if a[k][2] != b[k][2]]
if not diff:
    print("grads (the file's header)"); sys.exit()
def rel(k):
    x, y = (np.frombuffer(a[k][2], np.float32).astype(np.float64), np.frombuffer(b[k][2], np.float32).astype(np.float64))
    return np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-300)
worst = max(diff, key=rel)
print("grads (%d of %d tensors, first %s, largest |d|/|g| %.1e in %s)" % (len(diff), len(a), diff[0], rel(worst), worst))
PY
}

# the first step whose values differ, both lines
explain_losses() {
  "$PY" - "$1" "$2" <<'PY'
import sys
a, b = [open(p).read().splitlines() for p in sys.argv[1:3]]
for x, y in zip(a, b):
    if x != y:
        xs, ys = x.split(), y.split()
        dx, dy = dict(zip(xs[::2], xs[1::2])), dict(zip(ys[::2], ys[1::2]))
        d = ["%s %s vs %s" % (k, dx.get(k), dy.get(k)) for k in dict.fromkeys(xs[::2] + ys[::2]) if dx.get(k) != dy.get(k)]
        print("losses (step %s: %s)" % (dx.get("step", "?"), ", ".join(d)))
        break
else:
    print("losses (%d steps vs %d)" % (len(a), len(b)))
PY
}

why_failed() { # RC LOG
  local msg; msg="$(grep -m1 -iE 'error|fatal|abort' "$2" 2>/dev/null || tail -1 "$2" 2>/dev/null || true)"
  [[ $1 == 124 ]] && msg="timed out after 120 s"
  echo "exit $1: ${msg:0:100}"
}

# ---- the check ----------------------------------------------------------------------------------
echo "bitcheck: ${#names[@]} layouts, ref ${REF_SHA:0:10} ($REF_BIN) vs the working tree ($NEW_BIN)"
pass=0; fail=0; failed=(); us_old=0; us_new=0
for i in "${!names[@]}"; do
  name="${names[$i]}" np="${nps[$i]}"
  eval "args=(${argv[$i]})"
  rc_old=0; rc_new=0
  t0=${EPOCHREALTIME/./}
  run "$REF_BIN" "$runs/old" "$name" "$np" "${args[@]}" || rc_old=$?
  t1=${EPOCHREALTIME/./}
  run "$NEW_BIN" "$runs/new" "$name" "$np" "${args[@]}" || rc_new=$?
  us_old=$((us_old + t1 - t0)) us_new=$((us_new + ${EPOCHREALTIME/./} - t1))
  what=()
  if (( rc_old || rc_new )); then
    (( rc_old )) && what+=("old $(why_failed $rc_old "$runs/old/$name.log")")
    (( rc_new )) && what+=("new $(why_failed $rc_new "$runs/new/$name.log")")
    line="FAILED: $(printf '%s; ' "${what[@]}")"; line="${line%; }"
  else
    cmp -s "$runs/old/$name.st" "$runs/new/$name.st" ||
      what+=("$(explain_grads "$runs/old/$name.st" "$runs/new/$name.st")")
    cmp -s "$runs/old/$name.txt" "$runs/new/$name.txt" ||
      what+=("$(explain_losses "$runs/old/$name.txt" "$runs/new/$name.txt")")
    if (( ${#what[@]} )); then line="DIFFERS: $(printf '%s; ' "${what[@]}")"; line="${line%; }"; else line=same; fi
  fi
  if [[ $line == same ]]; then pass=$((pass + 1)); else fail=$((fail + 1)); failed+=("$name"); fi
  printf '%-32s %2d  %s\n' "$name" "$np" "$line"
done
echo "bitcheck: $pass passed, $fail failed (builds $((t_built - t_start)) s; runs $((SECONDS - t_built)) s:" \
     "old $((us_old / 1000000)) s, new $((us_new / 1000000)) s; kept in $runs)"
(( fail )) && echo "bitcheck: not the same: ${failed[*]}"
(( fail == 0 ))
