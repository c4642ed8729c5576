#!/usr/bin/env bash
# cluster.sh: several "hosts" on this one machine, for running pentatron across hosts without a
# cluster. Each host is a Linux network namespace with its own address on a private bridge
# (10.77.0.0/24 by default); the bridge lives in a namespace of its own (the "switch"), has no
# uplink and no address in the machine's own namespace, so nothing leaves the machine and the
# machine's network is not touched. Every process of a host runs under `unshare --uts` with the
# host's name as hostname (Open MPI names its shared-memory segments and session directories by
# hostname; hosts that share one would collide). `mpirun` runs on host 0 and starts the other
# hosts' daemons through this script as its rsh agent: shared memory (vader) within a host, TCP
# between hosts, restricted to the bridge's subnet.
#
#   cluster.sh check                    exit 0 if this machine can make a cluster, else say why
#                                       (exit 2: not root, no namespaces, a tool missing)
#   cluster.sh up N [--rate R]          N hosts NAME-h0 .. NAME-h(N-1); --rate shapes every link
#                                       in both directions with tc tbf (e.g. 1gbit, 200mbit)
#   cluster.sh run [MPIRUN ARGS...]     mpirun on host 0 with the hostfile (SLOTS slots a host,
#                                       filled in order: ranks 0..SLOTS-1 on host 0, ...)
#   cluster.sh bytes                    per host, a line: the host, bytes and packets it sent,
#                                       bytes and packets it received (its veth's own counters,
#                                       read at the switch's end)
#   cluster.sh down                     remove everything: processes, namespaces, links,
#                                       /etc/netns entries; safe to repeat, safe after failures
#   cluster.sh hostfile                 print the hostfile's path
#   cluster.sh agent HOST CMD...        (Open MPI's rsh agent) run CMD on HOST
#
# Environment: PT_CLUSTER names the cluster (default pt; several clusters may coexist under
# different names), PT_CLUSTER_NET the first three octets of its /24 (default 10.77.0),
# PT_CLUSTER_SLOTS the slots per host (default 8). `up` first removes a cluster of the same name.
# Example (2 hosts x 1 rank, links shaped to 1 Gbit/s):
#   scripts/cluster.sh up 2 --rate 1gbit
#   PT_CLUSTER_SLOTS=1 scripts/cluster.sh run -np 2 build/pentatron train --config ...
#   scripts/cluster.sh bytes; scripts/cluster.sh down
set -uo pipefail
self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
name="${PT_CLUSTER:-pt}"
net="${PT_CLUSTER_NET:-10.77.0}"
slots="${PT_CLUSTER_SLOTS:-8}"
state="/run/pt-cluster/$name"   # the hostfile, the host count
sw="$name-sw"                    # the switch's namespace: the bridge and the hosts' link ends

die() { echo "cluster.sh: $*" >&2; exit 1; }
unsupported() { echo "cluster.sh: cannot make a cluster here: $*" >&2; exit 2; }

check() {
  [ "$(id -u)" = 0 ] || unsupported "network namespaces need root (running as uid $(id -u))"
  local t
  for t in ip unshare tc mpirun hostname; do
    command -v "$t" > /dev/null || unsupported "'$t' is not installed"
  done
  # a throwaway namespace with a veth pair and a bridge: what `up` needs, nothing more
  local probe="$name-probe" err
  ip netns del "$probe" 2> /dev/null
  if ! err=$( { ip netns add "$probe" && ip -n "$probe" link add b0 type bridge &&
                ip -n "$probe" link add v0 type veth peer name v1 && unshare --uts true; } 2>&1); then
    ip netns del "$probe" 2> /dev/null
    unsupported "network namespaces, veth pairs or bridges do not work: $err"
  fi
  ip netns del "$probe"
}

hosts() { # the namespaces of this cluster's hosts, in order
  ip netns list 2> /dev/null | awk '{print $1}' | grep -E "^$name-h[0-9]+$" | sort -V
}

down() {
  local ns pids p
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep -E "^$name-(h[0-9]+|sw|probe)$"); do
    # processes left in the namespace (daemons, ranks of a failed run) would keep it alive
    for _ in 1 2 3 4 5; do
      pids=$(ip netns pids "$ns" 2> /dev/null)
      [ -z "$pids" ] && break
      for p in $pids; do kill -9 "$p" 2> /dev/null; done
      sleep 0.2
    done
    ip netns del "$ns" 2> /dev/null || echo "cluster.sh: could not remove namespace $ns" >&2
  done
  rm -rf /etc/netns/"$name"-h* "$state"
  rmdir /etc/netns /run/pt-cluster 2> /dev/null
  return 0
}

up() {
  local n="${1:-}" rate=""
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] ||
    die "up N: N is the number of hosts, 1 to 200 (got '${1:-}')"
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) rate="${2:-}"; shift 2 || die "--rate needs a value, e.g. 1gbit";;
      --rate=*) rate="${1#--rate=}"; shift;;
      *) die "up: unknown option '$1' (want --rate R)";;
    esac
  done
  if [ -n "$rate" ]; then
    [[ "$rate" =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit)$ ]] ||
      die "--rate '$rate': want a number and a unit: kbit, mbit, gbit or bit (e.g. 1gbit)"
  fi
  check
  down
  trap 'down; exit 1' ERR
  set -e
  mkdir -p "$state" /etc/netns
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  local i ns hostsfile="$state/hosts"
  printf '127.0.0.1 localhost\n' > "$hostsfile"
  for ((i = 0; i < n; i++)); do
    printf '%s.%d %s-h%d\n' "$net" $((i + 1)) "$name" "$i" >> "$hostsfile"
  done
  for ((i = 0; i < n; i++)); do
    ns="$name-h$i"
    ip netns add "$ns"
    # ip netns exec binds /etc/netns/NS/hosts over /etc/hosts: the names resolve inside the
    # cluster only, the machine's /etc/hosts stays as it is
    mkdir -p "/etc/netns/$ns"
    cp "$hostsfile" "/etc/netns/$ns/hosts"
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip -n "$ns" link set lo up
    # the link: eth0 in the host, hI on the switch's bridge
    ip -n "$sw" link add "h$i" type veth peer name eth0 netns "$ns"
    ip netns exec "$sw" sysctl -qw "net.ipv6.conf.h$i.disable_ipv6=1"
    ip -n "$sw" link set "h$i" master br0
    ip -n "$sw" link set "h$i" up
    ip -n "$ns" addr add "$net.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    if [ -n "$rate" ]; then # both directions: out of the host (eth0), into it (the switch's end)
      local burst
      burst=$(rate_burst "$rate")
      tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
      tc -n "$sw" qdisc add dev "h$i" root tbf rate "$rate" burst "$burst" latency 50ms
    fi
  done
  echo "$n" > "$state/n"
  set +e
  trap - ERR
  echo "cluster $name: $n hosts ($(hosts | paste -sd ' ')) on $net.0/24${rate:+, links at $rate}"
}

rate_burst() { # tbf's bucket: 10 ms of the rate, at least 64 KiB (a GSO segment)
  local bits
  bits=$(awk -v r="$1" 'BEGIN { m = 1; if (r ~ /kbit$/) m = 1e3; else if (r ~ /mbit$/) m = 1e6;
                                else if (r ~ /gbit$/) m = 1e9; sub(/[kmg]?bit$/, "", r); print r * m }')
  awk -v b="$bits" 'BEGIN { x = b / 8 / 100; if (x < 65536) x = 65536; printf "%d\n", x }'
}

need_up() { [ -f "$state/n" ] || die "no cluster '$name' is up (run: cluster.sh up N)"; }

hostfile() { # the hostfile, PT_CLUSTER_SLOTS slots a host (as they are when `run` is called)
  local i n
  n=$(cat "$state/n")
  for ((i = 0; i < n; i++)); do printf '%s-h%d slots=%d\n' "$name" "$i" "$slots"; done \
    > "$state/hostfile"
}

in_host() { # in_host I CMD...: CMD in host I's namespace, under its own hostname
  local ns="$name-h$1"; shift
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}

agent() { # Open MPI calls the agent like ssh: options, the host, the command as words to join
  while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
  local host="${1:-}"; shift || true
  [[ "$host" =~ ^$name-h([0-9]+)$ ]] || die "agent: '$host' is not a host of cluster '$name'"
  [ -n "$(ip netns list | awk -v h="$host" '$1 == h')" ] || die "agent: host $host is not up"
  in_host "${BASH_REMATCH[1]}" sh -c "$*"
}

run() {
  need_up
  # the environment reaches the other hosts' daemons as it is: the agent runs them with it
  export OMPI_MCA_plm_rsh_agent="$self agent" OMPI_MCA_plm_rsh_no_tree_spawn=1
  export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include="$net.0/24"
  export OMPI_MCA_oob_tcp_if_include="$net.0/24" OMPI_MCA_orte_keep_fqdn_hostnames=1
  export PT_CLUSTER="$name" PT_CLUSTER_NET="$net"
  # the hosts share this machine's cores: more slots than cores and Open MPI, seeing no host
  # oversubscribed, would let waiting ranks spin (a 16-rank run took twice as long)
  if [ -z "${OMPI_MCA_mpi_yield_when_idle:-}" ] && [ $(($(cat "$state/n") * slots)) -gt "$(nproc)" ]; then
    export OMPI_MCA_mpi_yield_when_idle=1
  fi
  # every host's daemon sees all of this machine's cores and binds its first rank to core 0:
  # the hosts' ranks would share one core (a 2-host x 1-rank run computed at half speed), so
  # nothing is bound unless the caller asks (OMPI_MCA_hwloc_base_binding_policy or --bind-to)
  export OMPI_MCA_hwloc_base_binding_policy="${OMPI_MCA_hwloc_base_binding_policy:-none}"
  hostfile
  in_host 0 mpirun --hostfile "$state/hostfile" "$@"
}

bytes() { # per host, its link's counters as the switch sees them, from the host's side:
  need_up  # HOST SENT_BYTES SENT_PACKETS RECEIVED_BYTES RECEIVED_PACKETS
  local i n
  n=$(cat "$state/n")
  for ((i = 0; i < n; i++)); do
    ip netns exec "$sw" sh -c "cd /sys/class/net/h$i/statistics && echo $name-h$i \$(cat rx_bytes) \
      \$(cat rx_packets) \$(cat tx_bytes) \$(cat tx_packets)"
  done
}

cmd="${1:-}"
shift || true
# the name goes into namespace names and paths removed by `down`: letters and digits only
[[ "$name" =~ ^[a-z][a-z0-9]{0,15}$ ]] ||
  die "PT_CLUSTER='$name': want 1-16 lower-case letters and digits, starting with a letter"
[[ "$net" =~ ^(10|192\.168|172\.(1[6-9]|2[0-9]|3[01]))(\.[0-9]{1,3}){1,2}$ ]] &&
  [ "$(tr -cd . <<<"$net" | wc -c)" = 2 ] ||
  die "PT_CLUSTER_NET='$net': want the first three octets of a private /24, e.g. 10.77.0"
[[ "$slots" =~ ^[1-9][0-9]{0,3}$ ]] || die "PT_CLUSTER_SLOTS='$slots': want a count of slots, 1 or more"
case "$cmd" in
  check) check; echo "cluster.sh: this machine can make a cluster";;
  up) up "$@";;
  down) down;;
  run) run "$@";;
  bytes) bytes;;
  hostfile) need_up; hostfile; echo "$state/hostfile";;
  agent) agent "$@";;
  *) die "usage: cluster.sh check | up N [--rate R] | run [MPIRUN ARGS] | bytes | down";;
esac
