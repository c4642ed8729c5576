#!/usr/bin/env bash
# test_mfu_peak.sh PENTATRON: the README's 8-rank demo (configs/demo.ini: dp 2 × pp 2 × tp 2, ep 2,
# one thread a rank), shortened to 2 steps on a synthetic shard of GPT-2 tokens, with the GEMM
# peak measured (PT_GEMM_PEAK unset) as a user's run measures it: the log names the peak MFU is
# against (the host's, measured with as many of its ranks at once as its cores hold) and no
# step's MFU passes 100%, however many ranks share the cores.
#
# Why 100% holds by construction rather than by timing luck: the peak is the host's, not a
# rank's. After a barrier, min(ranks, cores ÷ threads) of the host's ranks run 1024³ GEMMs at
# once, each thread with a core of its own while every core is busy, timed in the processor time
# they got (so other processes taking turns on the cores, on a shared machine, do not lower it);
# their rates summed are the host's peak, and MFU divides the model's FLOPs (6 per active
# parameter per token, plus attention: no more than the ranks execute) by that sum. The ranks
# cannot run more threads at once than the host has cores, nor a thread do more in a second than
# one with a core of its own running the library's best-shaped product (training's products are
# smaller and share the step with everything else), so no step reaches it. Before, each rank
# measured alone at start, in wall-clock time: 8 ranks on 2 cores each measured a time-sliced
# share of a core, and the sum fell below what the cores do (MFU 108.5% in the demo; 146% on a
# 2-core AMD EPYC VM shared with other work, measured by all 8 at once in wall-clock time).
set -u
bin="$1"
src="${PT_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader
export OMP_NUM_THREADS=1
unset PT_GEMM_PEAK # measured, as outside the tests
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

/usr/bin/python3 -c 'import array, sys
toks = array.array("H", [(i * 7919) % 50257 for i in range(40000)])
head = array.array("i", [20240520, 1, len(toks)] + [0] * 253)  # llm.c shard header (little-endian)
with open(sys.argv[1], "wb") as f: head.tofile(f); toks.tofile(f)' "$tmp/train_000000.bin"
timeout 240 mpiexec -np 8 "$bin" train --config "$src/configs/demo.ini" --training.steps=2 \
  --data.train="$tmp/train_*.bin" --checkpoint.dir= --logging.metrics="$tmp/m.jsonl" \
  --logging.every=1 --logging.report_every=0 --sample.max_new_tokens=0 > "$tmp/log" 2>&1 ||
  { bad "the demo run failed:"; tail -20 "$tmp/log"; }
grep -E "MFU against|step [0-9]+/2" "$tmp/log"
grep -Eq "MFU against the host's fp32 GEMM peak measured with (its 8 ranks at once|[0-9]+ of its 8 ranks at once, as many as its [0-9]+ cores hold with 1 thread each): [0-9.]+ GFLOP/s per rank \([0-9.]+ GFLOP/s the host, in the processor time the products got\)" "$tmp/log" &&
  ok || bad "no log line naming the peak MFU is against"
# every step's MFU (the JSON lines' fraction), each at most 1
n="$(/usr/bin/python3 -c 'import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if "\"mfu\"" in l]
over = [(s["step"], s["mfu"]) for s in steps if not s["mfu"] <= 1.0]
print(len(steps) if steps and not over else "over: %s" % over)' "$tmp/m.jsonl" 2>&1)"
[ "$n" = 2 ] && ok || bad "MFU of the 2 steps: $n"

echo "test_mfu_peak: $pass passed, $fail failed"
[ $fail -eq 0 ]
