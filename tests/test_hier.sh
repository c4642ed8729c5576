#!/usr/bin/env bash
# test_hier.sh PENTATRON: hierarchical all-reduce over groups that span hosts (include/pt/comm.h,
# src/comm/comm_hier.c) on 2 hosts × 2 ranks (scripts/cluster.sh):
#   - dp 4 across the hosts, PT_COMM_HIER = on: ZeRO-0 (its gradients by hierarchical
#     all-reduces), ZeRO-1 (hierarchical reduce-scatters and all-gathers) and ZeRO-3 (the
#     all-gathers from a separate input) reproduce the single-process run (step-1 gradients
#     ‖Δ‖/‖g‖ ≤ 1e-5, 10 losses ≤ 1e-4 relative); rank 0 logs the groups;
#   - HSDP with parallel.zero_scope = node (ZeRO-3 sharded within each host, replicated across)
#     reproduces the single-process run, its shard group within a host (rank 0's placement line);
#   - training puts the hierarchical figure on the links (ZeRO-0 2(H-1)·S a step, ZeRO-1 2 S,
#     S the buckets' bytes; below), by the links' counters (a 10-step run less a 1-step one, less
#     66 bytes of headers a packet) within 10%; flat (PT_COMM_HIER = off) fails that;
#   - the bytes that cross between the hosts (the links' counters, less 66 bytes of headers a
#     packet, around the timed calls of bench_hier) for one all-reduce of S = 1 MiB + 4 bytes
#     (an odd count: the left-over element's path too), each element exact after every call:
#       hierarchical: each local rank's slice S/L crosses as MPI's in-place
#         all-reduce over H = 2 ranks (reduce to one, broadcast back: 2(H−1)·S/L), L of them:
#         2(H−1)·S = 2 S;
#       flat (PT_COMM_HIER = off): MPI's ring over N = 4 ranks ordered by host has H edges that
#         cross, each carrying 2(N−1)/N·S: 2H(N−1)/N·S = 3 S;
#     each within 3%; the negative control: the flat run's bytes against the hierarchical
#     figure must fail;
#   - PT_COMM_HIER = sideways: one clear message, the run fails fast.
# Skipped (exit 0, "skipped: ...") where network namespaces cannot be made (not root, no ip).
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
C="$PT_SOURCE_DIR/scripts/cluster.sh"
bench="${PT_BINARY_DIR:-$(dirname "$bin")}/bench_hier"
[ -x "$bench" ] || bench="$(dirname "$bin")/bench_hier"
for stale in $(ip netns list 2> /dev/null | sed -nE 's/^phi([0-9]+)-.*/\1/p' | sort -u); do
  [ -d "/proc/$stale" ] || PT_CLUSTER="phi$stale" "$C" down
done
export PT_CLUSTER="phi$$"
why="$("$C" check 2>&1)"; rc=$?
if [ $rc -eq 2 ]; then echo "test_hier: skipped: $why"; exit 0; fi
[ $rc -eq 0 ] || { echo "FAIL: cluster.sh check: $why"; exit 1; }
[ -x "$bench" ] || { echo "FAIL: no bench_hier next to $bin (build the target bench_hier)"; exit 1; }
trap '[ "$BASHPID" = "$pt_main_shell" ] && { "$C" down; rm -rf "$tmp"; }' EXIT
trap 'exit 143' TERM INT HUP
t0=$SECONDS
"$C" up 2 > /dev/null || { echo "FAIL: cluster.sh up 2"; exit 1; }
export PT_CLUSTER_SLOTS=2
run 1 ref --training.micro_batch=8 || bad "reference failed: $(tail -3 "$tmp/ref.log")"

# hrun NAME MODE ARGS...: dp 4 on the cluster, PT_COMM_HIER = MODE; the links' counters before
# and after in $tmp/NAME.bytes
hrun() {
  local name="$1" mode="$2"; shift 2
  "$C" bytes > "$tmp/$name.bytes"
  PT_COMM_HIER="$mode" timeout 120 "$C" run -np 4 -x PT_COMM_HIER "$bin" train "${tiny[@]}" \
    --parallel.dp=4 --training.micro_batch=2 --logging.metrics="$tmp/$name.jsonl" \
    --logging.dump_grads="$tmp/$name.st" "$@" > "$tmp/$name.log" 2>&1 &
  wait $! && "$C" bytes >> "$tmp/$name.bytes"
}
for z in 0 1 3; do
  if hrun z$z on --parallel.zero=$z; then
    compare ref z$z && ok || bad "dp 4 over 2 hosts, hierarchical, ZeRO-$z: differs from one process"
    grep -q "mesh: hierarchical collectives over dp, dpcp, edp, world" "$tmp/z$z.log" && ok ||
      bad "ZeRO-$z: no line naming the hierarchical groups: $(grep 'mesh:' "$tmp/z$z.log")"
  else
    bad "dp 4 over 2 hosts, ZeRO-$z, hierarchical: failed: $(tail -3 "$tmp/z$z.log")"
  fi
done

# HSDP over the hosts (parallel.zero_scope = node): ZeRO-3 sharded over each host's 2 dp ranks
# (dps) and replicated across the hosts (dpr), reproducing one process; rank 0's placement line
# puts the shard group within a host and the replicate group across
if hrun node on --parallel.zero=3 --parallel.zero_scope=node; then
  compare ref node && ok || bad "dp 4 over 2 hosts, HSDP (zero_scope = node), ZeRO-3: differs from one process"
  grep 'mesh: 2 hosts' "$tmp/node.log"
  grep -q "within a host: dps; across hosts: dp, dpr" "$tmp/node.log" && ok ||
    bad "HSDP: the shard group should stay within a host: $(grep 'mesh: 2 hosts' "$tmp/node.log")"
else
  bad "dp 4 over 2 hosts, HSDP (zero_scope = node): failed: $(tail -3 "$tmp/node.log")"
fi

# training's crossing bytes: the 10-step run less a 1-step one (start-up, the report and shut-down
# cancel), the links' payload (less 66 bytes a packet) against the hierarchical figure, within
# 10% (Open MPI's own headers). S: the bytes of the model's buckets, the report's dp bytes a step
# over 2(N-1)/N (ZeRO-0: an all-reduce of S; ZeRO-1: a reduce-scatter and an all-gather of S,
# (N-1)/N each); n = S/N a rank's block. What crosses, a step:
#   ZeRO-0: L slices of S/L all-reduced across H hosts (Open MPI's in-place all-reduce: reduce to
#     one, broadcast back): 2(H-1) S;
#   ZeRO-1: per local rank, the reduce-scatter of its H blocks across hosts (on 2 hosts an
#     exchange: each of the pair sends the other its block, H (H-1) n) and the all-gather of
#     them (each block to the H-1 others, H (H-1) n): 2 L H (H-1) n = 2 S on 2 x 2.
# The flat runs (PT_COMM_HIER = off) must fail the same checks (1.76x and 1.76x here).
tcross() {
  "$PY" - "$tmp" "$@" <<'PY'
import re, sys
tmp, run, zero = sys.argv[1], sys.argv[2], int(sys.argv[3])
N, H, L = 4, 2, 2

def dp_bytes(name):  # the dp group's bytes over the run, per rank
    log = open(f"{tmp}/{name}.log").read().splitlines()
    start = max(i for i, l in enumerate(log) if "run report" in l)
    a, b = map(int, re.search(r"steps (\d+)-(\d+)", log[start]).groups())
    row = next(l.split() for l in log[start + 2:] if l.split()[2] == "dp")
    return float(row[-5]) * (b - a + 1)

def link(name):  # payload the hosts sent: bytes less 66 a packet
    rows = [l.split() for l in open(f"{tmp}/{name}.bytes")]
    d = lambda k: sum(int(x[k]) for x in rows[2:]) - sum(int(x[k]) for x in rows[:2])
    return d(1) - 66 * d(2)

S = (dp_bytes(run) - dp_bytes(run + "s")) / (2 * (N - 1) / N)
n = S / N
want = 2 * (H - 1) * S if zero == 0 else 2 * L * H * (H - 1) * n
got = link(run) - link(run + "s")
print(f"{run}: ZeRO-{zero}, S = {S:.0f} bytes over 9 steps: {got} bytes crossed, the "
      f"hierarchical figure {want:.0f} ({got / want:.3f}x)")
sys.exit(0 if abs(got / want - 1) <= 0.10 else 1)
PY
}
for z in 0 1; do
  if hrun z${z}s on --parallel.zero=$z --training.steps=1 && hrun f$z off --parallel.zero=$z &&
     hrun f${z}s off --parallel.zero=$z --training.steps=1; then
    tcross z$z $z && ok || bad "ZeRO-$z hierarchical: the crossing bytes are not the hierarchical figure"
    if tcross f$z $z; then bad "the negative control: flat ZeRO-$z passes for the hierarchical figure"
    else ok; fi
  else
    bad "ZeRO-$z: the 1-step and flat runs failed: $(tail -n 2 "$tmp/z${z}s.log" "$tmp/f$z.log" "$tmp/f${z}s.log")"
  fi
done

# brun MODE: one all-reduce of 1 MiB + 4 bytes, 4 timed calls; its line in $tmp/b_MODE
brun() {
  PT_COMM_HIER="$1" timeout 60 "$C" run -np 4 -x PT_COMM_HIER "$bench" pt 4 1048580 \
    > "$tmp/b_$1" 2>&1 & wait $!
}
# held BYTES_FILE FIGURE: the measured payload per call within 3% of FIGURE (hier or flat)
held() {
  "$PY" - "$tmp/b_$1" "$2" <<'PY'
import sys
f = dict(zip(*[iter(open(sys.argv[1]).read().split())] * 2))
S, H, L = int(f["size"]), 2, 2
N = H * L
want = {"hier": 2 * (H - 1) * S, "flat": 2 * H * (N - 1) / N * S}[sys.argv[2]]
got = float(f["link_payload"])
print(f"{sys.argv[1].rsplit('_', 1)[1]}: all-reduce of {S} bytes: {got:.0f} bytes crossed a call "
      f"(raw {float(f['link_bytes']):.0f}), the {sys.argv[2]} figure {want:.0f} ({got / want:.3f}x); "
      f"hierarchical {f['hier']}, exact {f['ok']}, {float(f['median_s']) * 1e3:.1f} ms")
sys.exit(0 if f["ok"] == "1" and abs(got / want - 1) <= 0.03 else 1)
PY
}
if brun on && brun off; then
  held on hier && ok || bad "hierarchical: the crossing bytes are not 2(H-1)S"
  grep -q "hier 1" "$tmp/b_on" && ok || bad "PT_COMM_HIER=on: the all-reduce was not hierarchical"
  held off flat && ok || bad "flat: the crossing bytes are not the ring's 2H(N-1)/N S"
  if held off hier > /dev/null; then bad "the negative control: the flat run passes for the hierarchical figure"
  else ok; fi
else
  bad "bench_hier on the cluster failed: $(tail -n 3 "$tmp/b_on" "$tmp/b_off")"
fi
echo "runs on the cluster: $((SECONDS - t0)) s"

PT_COMM_HIER=sideways expect_fail 2 'PT_COMM_HIER = "sideways"' --parallel.dp=2

"$C" down
echo "test_hier: $pass passed, $fail failed"
[ $fail -eq 0 ]
