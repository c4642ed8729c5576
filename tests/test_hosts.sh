#!/usr/bin/env bash
# test_hosts.sh PENTATRON: a 5D layout across two hosts (scripts/cluster.sh: network namespaces on
# a private bridge, shared memory within a host, TCP between), 2 hosts × 8 ranks:
#   - dp 2 × pp 2 × cp 2 × tp 2 (zero bubble, ZeRO-1) reproduces the single-process run (step-1
#     gradients ‖Δ‖/‖g‖ ≤ 1e-5, 10 losses ≤ 1e-4 relative), placed in rank order (host 0 = pp
#     stage 0); placed round-robin (tp across hosts), 4 steps with the reference's losses;
#   - the mesh orders the ranks by host (include/pt/mesh.h): launched round-robin, tp, cp and dp
#     still stay within a host and only pp crosses (its log line and the crossing bytes say so);
#     PT_MESH_ORDER = rank keeps the launcher's order, the bad placement of the negative control;
#   - the bytes that cross between the hosts, by the links' own counters (veth), equal the bytes
#     the run report gives for the groups that span hosts (derived from the placement and the
#     mesh's rank order): in rank order pp and world, round-robin tp and world. The counters'
#     difference between a longer run (10, 4 steps) and a 1-step one against the report's, so
#     start-up, wire-up, the report and shut-down cancel; TCP/IP/Ethernet headers (66 bytes a
#     packet) are taken off by the packet counters; what remains (Open MPI's own headers) is
#     held within 10%;
#   - the negative control: the round-robin run's crossing bytes checked against the groups that
#     rank order would have spanning (pp, world) must fail the same check (they are ~9x larger);
#   - links shaped with tc tbf (--rate 100mbit, both directions), 2 hosts × 1 rank: dp 2
#     reproduces the single-process run; bad requests to the script get one message each;
#   - nothing is left behind: no namespace, no /etc/netns entry, no process of the cluster.
# Skipped (exit 0, "skipped: ...") where network namespaces cannot be made (not root, no ip).
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
C="$PT_SOURCE_DIR/scripts/cluster.sh"
# a cluster of an earlier run of this test that was killed outright (SIGKILL) is removed here
for stale in $(ip netns list 2> /dev/null | sed -nE 's/^pth([0-9]+)-.*/\1/p' | sort -u); do
  [ -d "/proc/$stale" ] || PT_CLUSTER="pth$stale" "$PT_SOURCE_DIR/scripts/cluster.sh" down
done
export PT_CLUSTER="pth$$"
why="$("$C" check 2>&1)"; rc=$?
if [ $rc -eq 2 ]; then echo "test_hosts: skipped: $why"; exit 0; fi
[ $rc -eq 0 ] || { echo "FAIL: cluster.sh check: $why"; exit 1; }
trap '[ "$BASHPID" = "$pt_main_shell" ] && { "$C" down; rm -rf "$tmp"; }' EXIT
trap 'exit 143' TERM INT HUP
"$C" up 2 || { echo "FAIL: cluster.sh up 2"; exit 1; }

P=--parallel
L4=(--model.n_layers=4)
five=("${L4[@]}" $P.dp=2 $P.pp=2 $P.cp=2 $P.tp=2 $P.pp_schedule=zb $P.zero=1 --training.micro_batch=1)
run 1 ref "${L4[@]}" --training.micro_batch=8 || bad "reference failed: $(tail -3 "$tmp/ref.log")"

# hrun NAME MAP STEPS: the 5D layout on the cluster, ranks mapped by MAP (slot: in order, node:
# round-robin); the links' counters before and after in $tmp/NAME.bytes
hrun() {
  local name="$1" map="$2" steps="$3"
  "$C" bytes > "$tmp/$name.bytes"
  # in the background: a signal to the test interrupts `wait` (not a foreground job), so the
  # EXIT trap takes the cluster down at once. PT_MESH_ORDER (rank: the launcher's order, else
  # the mesh orders the ranks by host) reaches every rank
  PT_MESH_ORDER="${ORDER:-host}" timeout 150 "$C" run -np 16 --map-by "$map" -x PT_MESH_ORDER "$bin" train "${tiny[@]}" "${five[@]}" \
    --training.steps="$steps" --logging.metrics="$tmp/$name.jsonl" \
    --logging.dump_grads="$tmp/$name.st" > "$tmp/$name.log" 2>&1 &
  wait $! || { bad "$name ($map, $steps steps) failed: $(tail -3 "$tmp/$name.log")"; return 1; }
  "$C" bytes >> "$tmp/$name.bytes"
}

t0=$SECONDS
if hrun slot1 slot 1 && hrun slot slot 10; then
  if compare ref slot; then ok; else bad "2 hosts in rank order: differs from the single-process run"; fi
fi
# round-robin, the mesh ordering the ranks by host (the default): tp, cp, dp within a host
# again, pp across, as the log says
if hrun nodeh1 node 1 && hrun nodeh node 4; then
  grep -q "mesh: 2 hosts; within a host: tp, cp, dp; across hosts: pp" "$tmp/nodeh.log" && ok ||
    bad "round-robin, ordered by host: the mesh's placement line: $(grep 'mesh:' "$tmp/nodeh.log")"
fi
# round-robin in the launcher's order (PT_MESH_ORDER = rank; the negative control's placement):
# 4 steps, the same losses as the reference's
if ORDER=rank hrun node1 node 1 && ORDER=rank hrun node node 4; then
  grep -q "mesh: 2 hosts; within a host: cp, dp, pp; across hosts: tp" "$tmp/node.log" && ok ||
    bad "round-robin, the launcher's order: the mesh's placement line: $(grep 'mesh:' "$tmp/node.log")"
  "$PY" - "$tmp/ref.jsonl" "$tmp/node.jsonl" <<'PY' && ok || bad "2 hosts round-robin: losses differ"
import json, sys
ref, got = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
worst = max(abs(b - a) / abs(a) for a, b in zip(ref, got))
print(f"node: {len(got)} losses, worst relative difference {worst:.1e}")
sys.exit(0 if len(got) == 4 and worst <= 1e-4 else 1)
PY
fi
echo "runs on the cluster: $((SECONDS - t0)) s"

# crossing NAME MAP: the longer run less the 1-step run, counters against the report's bytes of
# the groups that span the hosts under placement MAP
crossing() {
  "$PY" - "$tmp" "$@" <<'PY'
import re, sys
tmp, run, place = sys.argv[1], sys.argv[2], sys.argv[3]  # the run, the placement assumed
R, per_host, deg = 16, 8, dict(tp=2, cp=2, dp=2, pp=2)
host = {"slot": lambda r: r // per_host, "node": lambda r: r % 2}[place]

def coords(r):  # the mesh's rank order: tp fastest, then cp, dp, pp
    return dict(tp=r % 2, cp=r // 2 % 2, dp=r // 4 % 2, pp=r // 8)

def members(r, dims):  # the ranks sharing every coordinate of r but those of dims
    c = coords(r)
    return [q for q in range(R) if all(coords(q)[k] == c[k] for k in deg if k not in dims)]

groups = dict(world=list(deg), tp=["tp"], cp=["cp"], dp=["dp"], pp=["pp"], dpcp=["dp", "cp"])
span = sorted(g for g, dims in groups.items()
              if any(len({host(q) for q in members(r, dims)}) > 1 for r in range(R)))

def report(name):  # total bytes per group over the run (mean per rank and step × ranks × steps)
    log = open(f"{tmp}/{name}.log").read().splitlines()
    start = max(i for i, l in enumerate(log) if "run report" in l)
    a, b = map(int, re.search(r"steps (\d+)-(\d+)", log[start]).groups())
    out = {}
    for l in log[start + 2:]:
        f = l.split()
        if "memory" in f or not f[-1].endswith("%"): break
        out[f[2]] = float(f[-5]) * R * (b - a + 1)  # the row: group, role, bytes/step, max, ...
    return out

def link(name):  # bytes the hosts sent over their links, less 66 bytes of headers a packet
    rows = [l.split() for l in open(f"{tmp}/{name}.bytes")]
    before, after = rows[:2], rows[2:]
    raw = sum(int(x[1]) for x in after) - sum(int(x[1]) for x in before)
    pk = sum(int(x[2]) for x in after) - sum(int(x[2]) for x in before)
    return raw, raw - 66 * pk

long, short = report(run), report(run + "1")
want = sum(long.get(g, 0) - short.get(g, 0) for g in span)
(r_long, p_long), (r_short, p_short) = link(run), link(run + "1")
raw, payload = r_long - r_short, p_long - p_short
print(f"{run} (placed by {place}): groups spanning hosts {span}: {want:.0f} bytes; the links "
      f"carried {raw} ({raw / want:.3f}x), {payload} without TCP/IP headers ({payload / want:.3f}x)")
print("  per group, the longer run less the 1-step run: "
      + ", ".join(f"{g} {long[g] - short.get(g, 0):.0f}" for g in long))
sys.exit(0 if abs(payload / want - 1) <= 0.10 else 1)
PY
}
if [ -f "$tmp/slot.bytes" ] && [ -f "$tmp/node.bytes" ]; then
  crossing slot slot && ok || bad "rank order: the bytes crossing hosts are not the pp group's"
  crossing nodeh slot && ok || bad "round-robin ordered by host: the bytes crossing hosts are not the pp group's"
  crossing node node && ok || bad "round-robin: the bytes crossing hosts are not the tp group's"
  # the negative control: a bad placement (tp across hosts) against the groups of the good one
  if crossing node slot; then bad "the check passes a bad placement (tp across the hosts)"
  else ok; echo "(the negative control: round-robin's crossing bytes fail for rank order's groups)"; fi
fi

# links shaped with tc tbf both ways (--rate), 2 hosts × 1 rank (the timing setting): dp 2 reproduces
# the single-process run over them
"$C" up 2 --rate 100mbit > /dev/null || bad "cluster.sh up 2 --rate 100mbit"
shaped=$(for h in 0 1; do tc -n "$PT_CLUSTER-h$h" qdisc show dev eth0; tc -n "$PT_CLUSTER-sw" qdisc show dev "h$h"; done)
[ "$(grep -c 'tbf .* rate 100Mbit' <<<"$shaped")" = 4 ] && ok || bad "links not shaped: $shaped"
PT_CLUSTER_SLOTS=1 timeout 120 "$C" run -np 2 "$bin" train "${tiny[@]}" "${L4[@]}" $P.dp=2 \
  --training.micro_batch=4 --logging.metrics="$tmp/dp2.jsonl" --logging.dump_grads="$tmp/dp2.st" \
  > "$tmp/dp2.log" 2>&1 & wait $!
[ $? -eq 0 ] && compare ref dp2 && ok || bad "2 hosts x 1 rank over shaped links: $(tail -2 "$tmp/dp2.log")"
# bad requests: one clear message each, nothing made
for args in "up 0" "up 2 --rate fast" "up 2 --frob"; do
  out="$("$C" $args 2>&1)" && bad "cluster.sh $args succeeded" ||
    { [ "$(wc -l <<<"$out")" = 1 ] && ok || bad "cluster.sh $args: $out"; }
done
out="$(PT_CLUSTER=Bad "$C" down 2>&1)" && bad "PT_CLUSTER=Bad accepted" || { grep -q "PT_CLUSTER='Bad'" <<<"$out" && ok || bad "PT_CLUSTER=Bad: $out"; }

"$C" down
left="$(ip netns list | grep -c "^$PT_CLUSTER-"; ls -d /etc/netns/"$PT_CLUSTER"-* 2> /dev/null | wc -l)"
[ "$left" = "$(printf '0\n0')" ] && ok || bad "the cluster left namespaces or /etc/netns entries: $left"
pgrep -f "$tmp/train_" > /dev/null && bad "processes of the runs are left" || ok

echo "test_hosts: $pass passed, $fail failed"
[ $fail -eq 0 ]
