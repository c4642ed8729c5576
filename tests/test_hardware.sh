#!/usr/bin/env bash
# test_hardware.sh PENTATRON: `pentatron plan --measure` (src/plan/measure.c) writes a hardware
# file that reads back with plausible figures:
#   - 2 ranks on this host, 1 thread each: 1 node × 2 devices, the GEMM peak within a factor of 3
#     of the trainer's own measurement (its log line "GEMM peak N GFLOP/s", 1 thread), the shapes'
#     FLOP/s below 2× that peak, memory bandwidth > 1 GB/s, memory per rank > 0, a ping-pong
#     latency within a host < 1 ms, the inter-host figures said to be copied, and a message of
#     1 MiB waiting for its sender to call in (the tests run shared memory without its single
#     copy, btl_vader_single_copy_mechanism=none: the sender copies large messages in itself);
#   - 2 hosts × 1 rank (scripts/cluster.sh, links shaped to 1 Gbit/s = 125e6 B/s): nodes 2,
#     1 device a node, the ping-pong (one way at a time) bandwidth across hosts within ±30% of the
#     shaped rate, inter_bw (both ways at once) between 0.3 × the rate and the ping-pong's, the
#     intra-host figures said to be copied; the messages that wait for their sender to call in
#     (inter_rendezvous): not 4 KiB, every size from the first measured at or past Open MPI's
#     own TCP eager limit on (ompi_info's btl_tcp_eager_limit: past it a message is a
#     rendezvous); of the messages up to 1 MiB, one size at least half moving while the ranks
#     compute (the socket buffers hold them); one message of ≥ 4 MiB no faster than the link's
#     rate allows past its burst (skipped where no cluster can be made);
#   - bad arguments: one message each, exit 2, before anything is measured.
# The file's loading, keys and bad contents are tested by test_hardware_file.
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
LINK_RATE="${PT_TEST_LINK_RATE:-125e6}" # what --rate 1gbit gives, bytes/s
LINK_BURST=1.25e6 # its tbf bucket: 10 ms of the rate (scripts/cluster.sh), passed at once
# Open MPI's TCP eager limit, and the first of the sizes --measure tries (4 KiB × 4^k) at or past it
tcp_eager=$(ompi_info --param btl tcp --level 9 2>/dev/null |
  sed -nE 's/.*"btl_tcp_eager_limit" \(current value: "([0-9]+)".*/\1/p')
tcp_grid=4096
while [ "$tcp_grid" -lt "${tcp_eager:-65536}" ]; do tcp_grid=$((tcp_grid * 4)); done

# hwcheck FILE PYTHON-CONDITION...: the file's keys as numbers (name as text) in `h`
hwcheck() {
  local file="$1"; shift
  "$PY" - "$file" "$@" <<'PY'
import configparser, re, sys
cp = configparser.ConfigParser(inline_comment_prefixes=(";",))
cp.read(sys.argv[1])
s = cp["hardware"]
lists = ("name", "gemm_shapes", "collectives", "intra_overlap", "inter_overlap", "intra_rendezvous", "inter_rendezvous")
h = {k: (v if k in lists else float(v)) for k, v in s.items()}
def sizes(k):  # "bytes,value; ..." (or one value: at size 0) as {bytes: value}
    es = [e.strip().split(",") for e in h.get(k, "").strip('"').replace("\n", "").split(";") if e.strip()]
    return {float(e[0]) if len(e) == 2 else 0.0: float(e[-1]) for e in es}
ov = {w: sizes(w + "_overlap") for w in ("intra", "inter")}
rv = {w: sizes(w + "_rendezvous") for w in ("intra", "inter")}
shapes = [tuple(map(float, e.split(","))) for e in h.get("gemm_shapes", "").strip('"').replace("\n", "").split(";") if e.strip()]
colls = [e.strip().split(",") for e in h.get("collectives", "").strip('"').replace("\n", "").split(";") if e.strip()]
colls = [(k, w, int(n), float(b), float(t)) for k, w, n, b, t in colls]
text = open(sys.argv[1]).read()
bad = [c for c in sys.argv[2:] if not eval(c)]
for c in bad:
    print("  false:", c)
print({k: v for k, v in h.items() if k not in ("gemm_shapes", "collectives")}, len(shapes), "shapes")
print("overlap", ov, "rendezvous", rv)
sys.exit(1 if bad else 0)
PY
}

# the trainer's GEMM peak with 1 thread (pt_measure_gemm_rate in its own process: measured, not
# the PT_GEMM_PEAK that tests/CMakeLists.txt gives the other tests)
PT_GEMM_PEAK= run 1 peak --training.steps=1 || bad "the trainer's run failed: $(tail -3 "$tmp/peak.log")"
ref=$(sed -nE 's/.*GEMM peak ([0-9.]+) GFLOP\/s.*/\1/p' "$tmp/peak.log" | head -1)
[ -n "$ref" ] || { bad "no GEMM peak in the trainer's log"; ref=1; }

# 2 ranks on this host
if timeout 120 mpiexec -np 2 "$bin" plan --measure --out "$tmp/two.ini" --threads 1 \
    > "$tmp/two.log" 2>&1; then
  hwcheck "$tmp/two.ini" "h['nodes'] == 1" "h['devices_per_node'] == 2" \
    "$ref * 1e9 / 3 <= h['peak_flops'] <= 3 * $ref * 1e9" "h['gemm_efficiency'] == 1" \
    "len(shapes) >= 16 and all(0 < f <= 2 * h['peak_flops'] for m, n, k, f in shapes)" \
    "h['memory_bw'] > 1e9" "h['memory_bytes'] > 0" "0 < h['intra_latency'] < 1e-3" \
    "h['peak_flops'] / 100 < h['attention_flops'] < 2 * h['peak_flops']" "h['xent_rate'] > 1e7" \
    "h['intra_bw'] > 1e8" "h['inter_bw'] == h['intra_bw']" \
    "'not measured (one host): intra_bw copied' in text" "'1×2 ranks, 1 thread, fp32' in h['name']" \
    "sorted(set(k for k, w, n, b, t in colls)) == ['ag', 'ar', 'p2p', 'rs'] and all(w == 'intra' and n == 2 and t > 0 for k, w, n, b, t in colls)" \
    "0 <= h['skew'] < 0.5" \
    "sorted(ov['intra']) == [65536.0 * 4 ** i for i in range(5)] and all(0 <= v <= 1 for v in ov['intra'].values())" \
    "sorted(rv['intra']) == [4096.0 * 4 ** i for i in range(5)] and all(v in (0, 1) for v in rv['intra'].values())" \
    "rv['intra'][1048576] == 1" \
    && ok || bad "2 ranks on one host: $(cat "$tmp/two.log")"
  grep -q "^wrote $tmp/two.ini" "$tmp/two.log" && ok || bad "no summary: $(cat "$tmp/two.log")"
else
  bad "plan --measure, 2 ranks: $(tail -5 "$tmp/two.log")"
fi

# bad arguments: one message each, exit 2
expect_arg() { # NEEDLE ARGS...
  local needle="$1"; shift
  "$bin" plan --measure "$@" > "$tmp/arg.log" 2>&1; local rc=$?
  [ $rc -eq 2 ] && [ "$(grep -cF -- "$needle" "$tmp/arg.log")" = 1 ] && ok ||
    bad "plan --measure $*: exit $rc, expected 2 and one \"$needle\": $(cat "$tmp/arg.log")"
}
expect_arg "--out FILE is required"
expect_arg "--precision: expected fp32 or bf16, got \"fp16\"" --out "$tmp/x.ini" --precision fp16
expect_arg "--threads: expected a positive integer" --out "$tmp/x.ini" --threads 0
expect_arg "unknown option \"--bogus\"" --out "$tmp/x.ini" --bogus
expect_arg "--out needs a value" --out
expect_arg "--out's directory" --out /proc/nope/h.ini

# 2 hosts × 1 rank, links shaped to 1 Gbit/s
C="$PT_SOURCE_DIR/scripts/cluster.sh"
export PT_CLUSTER="pthw$$"
why="$("$C" check 2>&1)"; rc=$?
if [ $rc -eq 2 ]; then
  echo "test_hardware: 2 hosts skipped: $why"
elif [ $rc -ne 0 ]; then
  bad "cluster.sh check: $why"
else
  trap '[ "$BASHPID" = "$pt_main_shell" ] && { "$C" down > /dev/null; rm -rf "$tmp"; }' EXIT
  trap 'exit 143' TERM INT HUP
  if "$C" up 2 --rate 1gbit > "$tmp/up.log" 2>&1; then
    PT_CLUSTER_SLOTS=1 timeout 150 "$C" run -np 2 "$bin" plan --measure --out "$tmp/hosts.ini" \
      --threads 1 > "$tmp/hosts.log" 2>&1 &
    if wait $!; then
      hwcheck "$tmp/hosts.ini" "h['nodes'] == 2" "h['devices_per_node'] == 1" \
        "abs(float(re.search(r'ping-pong: ([0-9.e+]+) B/s', text).group(1)) / $LINK_RATE - 1) <= 0.3" \
        "0.3 * $LINK_RATE <= h['inter_bw'] <= 1.05 * float(re.search(r'ping-pong: ([0-9.e+]+) B/s', text).group(1))" \
        "0 < h['inter_latency'] < 1e-2" \
        "h['intra_bw'] == h['inter_bw']" "'not measured (one rank a host): inter_bw copied' in text" \
        "len(colls) >= 9 and all(w == 'inter' and n == 2 for k, w, n, b, t in colls)" \
        "all(t >= 0.9 * (b if k == 'ar' else b / 2) / $LINK_RATE for k, w, n, b, t in colls if b >= 4 << 20)" "0 <= h['skew'] < 0.5" \
        "rv['inter'][4096] == 0 and all(v == 1 for b, v in rv['inter'].items() if b >= $tcp_grid)" \
        "all(t >= (b - $LINK_BURST) / $LINK_RATE for k, w, n, b, t in colls if k == 'p2p' and b >= 4 << 20)" \
        "max(v for b, v in ov['inter'].items() if b <= 1 << 20) >= 0.5" \
        && ok || bad "2 hosts: the one-way bandwidth not within 30% of $LINK_RATE B/s, or both ways at once above it or under 0.3 x: $(cat "$tmp/hosts.log")"
    else
      bad "plan --measure on 2 hosts: $(tail -5 "$tmp/hosts.log")"
    fi
  else
    bad "cluster.sh up 2 --rate 1gbit: $(cat "$tmp/up.log")"
  fi
  "$C" down > /dev/null
  ip netns list 2> /dev/null | grep -q "^$PT_CLUSTER-" && bad "namespaces left: $(ip netns list)" || ok
fi

echo "test_hardware: $pass passed, $fail failed"
[ $fail -eq 0 ]
