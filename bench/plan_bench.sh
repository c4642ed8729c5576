#!/usr/bin/env bash
# plan_bench.sh [STEPS]: `pentatron plan`'s step time against pentatron's measured one, with a
# hardware file measured on this machine in the same run (`pentatron plan --measure`: 1 rank × 2
# threads for the baseline, 2 ranks × 1 thread for the layouts). The layouts and the model of
# bench/layout_bench.sh (bench/layout_model.sh): 1 rank × 2 threads, then dp 2 (ZeRO-1), tp 2 (sp),
# pp 2 (zb), pp 2 (zb, head split), cp 2 and ep 2 over dp 2 on 2 ranks × 1 thread. Each layout
# runs STEPS steps (default 8); measured = the median of rank 0's step seconds after 2 warm-up
# steps; planned = the mean of plan's step_seconds with the hardware measured before the runs and
# with it measured after them (a shared machine's speed drifts by several percent over a
# minute). Prints a markdown table with the error of each.
# PLAN_BENCH_RATES="1gbit 100mbit" (needs root and scripts/cluster.sh check): the same again on
# 2 hosts × 1 rank (network namespaces, links shaped to each rate), the hardware file measured
# across the hosts at that rate: dp, tp, pp, cp and ep across the hosts. About 3 min on one host,
# 2-6 min more per rate (9-10 min with both); run it on a quiet machine.
set -euo pipefail
steps="${1:-8}"
source "$(dirname "${BASH_SOURCE[0]}")/parallel_common.sh" plan
shard="$(synthetic_shard 8192 $((steps * 8 * 256 + 1)))"
source "$(dirname "${BASH_SOURCE[0]}")/layout_model.sh"
cfg=("${layout_model[@]}" --training.steps="$steps" --logging.every=1000 --logging.progress=false)
rm -f "$out"/*.jsonl "$out"/*.plan.?
layouts=("base 1"
         "dp 2 --parallel.dp=2 --parallel.zero=1"
         "tp 2 --parallel.tp=2 --parallel.sp=true"
         "pp 2 --parallel.pp=2 --parallel.pp_schedule=zb"
         "pph 2 --parallel.pp=2 --parallel.pp_schedule=zb --parallel.pp_head=split"
         "cp 2 --parallel.cp=2"
         "ep 2 --parallel.dp=2 --parallel.ep=2 --parallel.zero=1")

# LABEL LAUNCH...: each layout run (LAUNCH prefixes the 2-rank runs)
run_layouts() {
  local label=$1; shift
  local launch=("$@") name np args
  for l in "${layouts[@]}"; do
    read -r name np args <<< "$l"
    [[ $label != host && $name == base ]] && continue  # across hosts: the 2-rank layouts only
    read -r -a args <<< "${args:-}"
    if (( np == 1 )); then
      "$bin" train "${cfg[@]}" --training.threads=2 --logging.metrics="$out/$label-$name.jsonl" > /dev/null
    else
      "${launch[@]}" "$bin" train "${cfg[@]}" --training.threads=1 "${args[@]}" \
        --logging.metrics="$out/$label-$name.jsonl" > /dev/null
    fi
    echo "== $label $name" >&2
  done
}

# LABEL HW1 HW2 SUFFIX: each layout planned (1 rank on HW1, 2 ranks on HW2) into .plan.SUFFIX
plan_layouts() {
  local label=$1 hw1=$2 hw2=$3 sfx=$4 name np args
  for l in "${layouts[@]}"; do
    read -r name np args <<< "$l"
    [[ $label != host && $name == base ]] && continue
    read -r -a args <<< "${args:-}"
    if (( np == 1 )); then
      "$bin" plan "${cfg[@]}" --training.threads=2 --hardware "$hw1" --json > "$out/$label-$name.plan.$sfx"
    else
      "$bin" plan "${cfg[@]}" "${args[@]}" --hardware "$hw2" --json > "$out/$label-$name.plan.$sfx"
    fi
  done
}

# the hardware measured before and after the runs (a shared machine's speed drifts): the plans
# with each, their mean the prediction
measure_host() { # SUFFIX
  "$bin" plan --measure --out "$out/hw1$1.ini" --threads 2 > /dev/null
  mpirun -np 2 --bind-to none "$bin" plan --measure --out "$out/hw2$1.ini" --threads 1 > /dev/null
}
measure_host a
run_layouts host mpirun -np 2 --bind-to none
measure_host b
for x in a b; do plan_layouts host "$out/hw1$x.ini" "$out/hw2$x.ini" $x; done

C="$root/scripts/cluster.sh"
for rate in ${PLAN_BENCH_RATES:-}; do
  "$C" up 2 --rate "$rate" > /dev/null
  trap '"$C" down > /dev/null' EXIT
  export PT_CLUSTER_SLOTS=1
  "$C" run -np 2 "$bin" plan --measure --out "$out/hw-$rate-a.ini" --threads 1 > /dev/null
  run_layouts "$rate" "$C" run -np 2
  "$C" run -np 2 "$bin" plan --measure --out "$out/hw-$rate-b.ini" --threads 1 > /dev/null
  unset PT_CLUSTER_SLOTS
  for x in a b; do plan_layouts "$rate" "$out/hw1$x.ini" "$out/hw-$rate-$x.ini" $x; done
  "$C" down > /dev/null
  trap - EXIT
done

"$PY" - "$out" ${PLAN_BENCH_RATES:-} <<'PY'
import glob, json, os, statistics, sys
out, rates = sys.argv[1], sys.argv[2:]
names = {"base": "1 rank × 2 threads", "dp": "dp 2, ZeRO-1", "tp": "tp 2, sp", "pp": "pp 2, zb",
         "pph": "pp 2, zb, head split", "cp": "cp 2, zigzag", "ep": "ep 2 over dp 2, ZeRO-1"}
print("| where | layout | measured s/step | planned s/step (before / after) | error | planned: compute / exposed comm / bubble / skew |")
print("|---|---|---:|---:|---:|---|")
errs = []
for label in ["host"] + rates:
    for n, title in names.items():
        f = "%s/%s-%s.jsonl" % (out, label, n)
        if not os.path.exists(f):
            continue
        meas = statistics.median(json.loads(l)["seconds"] for l in list(open(f))[2:])
        ps = [json.loads(open("%s/%s-%s.plan.%s" % (out, label, n, x)).read()) for x in "ab"]
        mean = lambda get: sum(map(get, ps)) / 2
        step = mean(lambda p: p["step_seconds"])
        err = step / meas - 1
        errs.append(abs(err))
        where = "one host" if label == "host" else "2 hosts, %s" % label
        print("| %s | %s | %.3f | %.3f (%.3f / %.3f) | %+.1f%% | %.3f / %.3f / %.3f / %.3f |" % (
            where, title, meas, step, ps[0]["step_seconds"], ps[1]["step_seconds"], 100 * err,
            mean(lambda p: p["compute_seconds"]), mean(lambda p: sum(p["exposed_seconds"].values())),
            mean(lambda p: p["bubble_seconds"]), mean(lambda p: p["skew_seconds"])))
print("\nwithin 15%%: %d of %d; median |error| %.1f%%" % (sum(e <= 0.15 for e in errs), len(errs),
                                                         100 * statistics.median(errs)))
PY
