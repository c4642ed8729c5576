#!/usr/bin/env bash
# test_pp_flex.sh PENTATRON: pipelines as flexible as Llama 3's, each against one process (step-1
# gradients per tensor ‖Δ‖/‖g‖ ≤ 1e-5, 10 losses ≤ 1e-4 relative):
#   - the interleaved schedule over a layer count that pp × v does not divide (the default split:
#     as even as possible, the layers left over on the middle stages: 5 layers over pp 2 × v 2 is
#     1,2,1,1; 7 is 2,2,2,1; 9 over pp 4 × v 2 is 1,2,1,1,1,1,1,1);
#   - uneven interleaved stages given by parallel.pp_layers (one count per stage, stage order);
#   - micro-batch counts that are not multiples of pp (pp 2 with 3 and 5, pp 4 with 6; with dp 2
#     and ZeRO-1; with tp 2 + sp over 5 layers), and fewer than pp (pp 4 with 3);
#   - uneven stages under dualpipev (stage order down the V and back up) and zb, and dualpipev at
#     an m ≥ 2pp that pp does not divide;
#   - `pentatron plan` takes these layouts, and its memory per rank is the run's (rank 0's exact
#     bytes within 2%, every rank's report row: tests/ref/check_plan_memory.py, as test_5d.sh);
#   - what cannot work fails fast with one message.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
IL=(--parallel.pp_schedule=interleaved --parallel.pp_virtual=2)
DPV=(--parallel.pp_schedule=dualpipev)
G6=(--training.global_batch=6)
G5=(--training.global_batch=5)

# the single-process references: layers × global batch
run 1 ref5 --model.n_layers=5 --training.micro_batch=8 || bad "5-layer reference failed: $(tail -3 "$tmp/ref5.log")"
run 1 ref7 --model.n_layers=7 --training.micro_batch=8 || bad "7-layer reference failed"
run 1 ref4g6 --model.n_layers=4 "${G6[@]}" --training.micro_batch=6 || bad "4-layer gb 6 reference failed"
run 1 ref4g5 --model.n_layers=4 "${G5[@]}" --training.micro_batch=5 || bad "4-layer gb 5 reference failed"
run 1 ref9g6 --model.n_layers=9 "${G6[@]}" --training.micro_batch=6 || bad "9-layer gb 6 reference failed"
run 1 ref5g6 --model.n_layers=5 "${G6[@]}" --training.micro_batch=6 || bad "5-layer gb 6 reference failed"

# layer counts that pp × v does not divide: the default split
check 2 il_pp2_L5_m4 ref5 --model.n_layers=5 --parallel.pp=2 "${IL[@]}" --training.micro_batch=2
check 2 il_pp2_L7_m8 ref7 --model.n_layers=7 --parallel.pp=2 "${IL[@]}" --training.micro_batch=1
grep -q "stage layers 1,2,1,1" "$tmp/il_pp2_L5_m4.log" && ok || bad "il_pp2_L5_m4: the split is not 1,2,1,1: $(grep -m1 'stage layers' "$tmp/il_pp2_L5_m4.log")"
# uneven interleaved stages, explicit
check 2 il_pp2_L7_1321 ref7 --model.n_layers=7 --parallel.pp=2 "${IL[@]}" --parallel.pp_layers=1,3,2,1 --training.micro_batch=2
check 2 il_pp2_v3_L7 ref7 --model.n_layers=7 --parallel.pp=2 --parallel.pp_schedule=interleaved --parallel.pp_virtual=3 --parallel.pp_layers=2,1,1,1,1,1 --training.micro_batch=1
# micro-batch counts that pp does not divide, and fewer than pp
check 2 il_pp2_m3 ref4g6 --model.n_layers=4 "${G6[@]}" --parallel.pp=2 "${IL[@]}" --training.micro_batch=2
check 2 il_pp2_m5 ref4g5 --model.n_layers=4 "${G5[@]}" --parallel.pp=2 "${IL[@]}" --training.micro_batch=1
check 4 il_pp4_L9_m6 ref9g6 --model.n_layers=9 "${G6[@]}" --parallel.pp=4 "${IL[@]}" --training.micro_batch=1
check 4 il_pp4_L9_m3 ref9g6 --model.n_layers=9 "${G6[@]}" --parallel.pp=4 "${IL[@]}" --training.micro_batch=2
check 4 il_pp2_tp2_sp_L5_m3 ref5g6 --model.n_layers=5 "${G6[@]}" --parallel.pp=2 --parallel.tp=2 --parallel.sp=true "${IL[@]}" --training.micro_batch=2
check 4 il_pp2_dp2_z1_m3 ref4g6 --model.n_layers=4 "${G6[@]}" --parallel.pp=2 --parallel.dp=2 --parallel.zero=1 "${IL[@]}" --training.micro_batch=1
# uneven dualpipev (rank 0: stages 0 and 3, rank 1: stages 1 and 2) and zb; dualpipev at m = 5
check 2 dpv_pp2_L5_2111 ref5 --model.n_layers=5 --parallel.pp=2 "${DPV[@]}" --parallel.pp_layers=2,1,1,1 --training.micro_batch=2
check 2 dpv_pp2_L7_1231 ref7 --model.n_layers=7 --parallel.pp=2 "${DPV[@]}" --parallel.pp_layers=1,2,3,1 --training.micro_batch=1
check 2 dpv_pp2_m5 ref4g5 --model.n_layers=4 "${G5[@]}" --parallel.pp=2 "${DPV[@]}" --training.micro_batch=1
check 2 zb_pp2_L5_14 ref5 --model.n_layers=5 --parallel.pp=2 --parallel.pp_schedule=zb --parallel.pp_layers=1,4 --training.micro_batch=2

# the planner's memory for these layouts against the runs' accounting
hw="$tmp/hw.ini"
printf '[hardware]\nname = "test"\ndevices_per_node = 16\nnodes = 1\npeak_flops = 1e11\nmemory_bytes = 1e10\nmemory_bw = 1e10\nintra_bw = 1e9\nintra_latency = 1e-6\ninter_bw = 1e8\ninter_latency = 1e-5\n' > "$hw"
planned() { # NAME ARGS...: the layout NAME ran with
  local name="$1"; shift
  if "$bin" plan "${tiny[@]}" "$@" --hardware "$hw" --json > "$tmp/$name.plan" 2> "$tmp/$name.plan.err" &&
     "$PY" "$PT_SOURCE_DIR/tests/ref/check_plan_memory.py" "$tmp/$name.log" "$tmp/$name.jsonl" "$tmp/$name.plan" "$name"; then ok
  else bad "$name: the plan's memory differs from the run's: $(cat "$tmp/$name.plan.err")"; fi
}
planned il_pp2_L5_m4 --model.n_layers=5 --parallel.pp=2 "${IL[@]}" --training.micro_batch=2
planned il_pp2_L7_1321 --model.n_layers=7 --parallel.pp=2 "${IL[@]}" --parallel.pp_layers=1,3,2,1 --training.micro_batch=2
planned il_pp4_L9_m6 --model.n_layers=9 "${G6[@]}" --parallel.pp=4 "${IL[@]}" --training.micro_batch=1
planned il_pp2_dp2_z1_m3 --model.n_layers=4 "${G6[@]}" --parallel.pp=2 --parallel.dp=2 --parallel.zero=1 "${IL[@]}" --training.micro_batch=1
planned dpv_pp2_L7_1231 --model.n_layers=7 --parallel.pp=2 "${DPV[@]}" --parallel.pp_layers=1,2,3,1 --training.micro_batch=1

# Llama 3 405B's pipeline planned (126 layers, pp 16 × 2 chunks, the default split: 3 layers on the
# first and the last stage, 4 on the others): the first and the last rank hold one layer's
# parameters fewer than with 128 layers (4 on every stage), the others the same; m = 32 and m = 24
# (not a multiple of 16) both plan, and the split written out plans the same
l3=(--config "$PT_SOURCE_DIR/configs/plan/llama405b_8192h100.ini" --hardware "$PT_SOURCE_DIR/hardware/h100_sxm.ini" --hardware.nodes=1024 --json --anyway)
lay="3$(printf ',4%.0s' $(seq 30)),3"
if "$bin" plan "${l3[@]}" > "$tmp/l3.json" && "$bin" plan "${l3[@]}" --training.global_batch=1536 > "$tmp/l3m24.json" &&
   "$bin" plan "${l3[@]}" --parallel.pp_layers="$lay" > "$tmp/l3lay.json" &&
   "$bin" plan "${l3[@]}" --model.n_layers=128 > "$tmp/l3even.json"; then
  "$PY" - "$tmp" <<'PY' && ok || bad "Llama 3 405B's pipeline: the plan's stages"
import json, sys
d = sys.argv[1]
a, b, c, e = (json.loads(open("%s/%s.json" % (d, n)).read()) for n in ("l3", "l3m24", "l3lay", "l3even"))
st, ev = a["memory_per_stage"], e["memory_per_stage"]
# rank r holds stages r and r + 16: layers 3 + 4 on ranks 0 and 15, 4 + 4 on the others (+ the
# embedding on rank 0, the norm and head on rank 15)
mid = st[1]["params"]
print("llama3 405B: params per rank 0 / 1 / 15: %.3g / %.3g / %.3g GB; m %d and %d; step %.3g s and %.3g s"
      % (st[0]["params"] / 1e9, mid / 1e9, st[15]["params"] / 1e9, a["micro_batches"], b["micro_batches"],
         a["step_seconds"], b["step_seconds"]))
ok = len(st) == 16 and all(s["params"] == mid for s in st[1:15]) and a["micro_batches"] == 32 and \
     b["micro_batches"] == 24 and a["schedule"] == "interleaved" and a["chunks"] == 2 and \
     c["memory_per_stage"] == st and c["step_seconds"] == a["step_seconds"]
layer = mid / 8
ok = ok and all(abs(ev[r]["params"] - st[r]["params"] - (layer if r in (0, 15) else 0)) < 1e-3 * layer for r in range(16))
sys.exit(0 if ok else 1)
PY
else bad "Llama 3 405B's pipeline does not plan: $(tail -2 "$tmp/l3.json")"; fi

# what cannot work
expect_fail 2 "parallel.pp_layers = \"3,2\"" --model.n_layers=5 --parallel.pp=2 "${IL[@]}" --parallel.pp_layers=3,2 --training.micro_batch=1
expect_fail 2 "exceed model.n_layers = 3" --model.n_layers=3 --parallel.pp=2 "${IL[@]}" --training.micro_batch=1
expect_fail 2 "at least 2·pp = 4" --model.n_layers=5 --parallel.pp=2 "${DPV[@]}" --parallel.pp_layers=2,1,1,1 --training.micro_batch=4

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
