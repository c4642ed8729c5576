#!/usr/bin/env bash
# test_slurm.sh PENTATRON: a real Slurm (Debian 12's slurmctld, slurmd, munge) over two hosts made
# by scripts/cluster.sh (network namespaces on a private bridge), and pentatron's job script,
# scripts/slurm_job.sh, submitted to it unchanged with sbatch, 2 nodes × 2 tasks, dp 2 × tp 2:
#   - launched by srun through PMIx (the script's default) and by Open MPI's mpirun reading the
#     allocation (PT_LAUNCHER=mpirun): each job reproduces the single-process run (step-1
#     gradients ‖Δ‖/‖g‖ ≤ 1e-5, 10 losses ≤ 1e-4 relative);
#   - each rank ran where the allocation puts it: the hosts the ranks recorded themselves
#     (logging.trace's flight records, `pentatron trace why`) against the job's node list and
#     tasks per node in Slurm's block order (rank r on node r / tasks-per-node), and the mesh's
#     placement line says tp within a host, dp across; the negative control: the same records
#     checked against the cyclic order (rank r on node r mod nodes) must fail;
#   - docs/guide.md's job script (section 14) is scripts/slurm_job.sh;
#   - nothing is left behind: no namespace, no daemon, no process of the jobs.
# The cluster: munged and slurmctld on host 0, a slurmd on each host (its own NodeName, -N, spool
# and TmpFS), everything (key, configuration, state, logs) in the test's temporary directory; the
# daemons live in the hosts' namespaces, so taking the cluster down ends them, also after a kill.
# Skipped (exit 0, "skipped: ...") where network namespaces cannot be made (not root, no ip);
# Slurm missing is a failure (scripts/setup.sh installs it).
set -u
source "$(dirname "$0")/parallel_common.sh" "$1"
C="$PT_SOURCE_DIR/scripts/cluster.sh"
JOB="$PT_SOURCE_DIR/scripts/slurm_job.sh"
t_start=$SECONDS
# a cluster of an earlier run of this test that was killed outright (SIGKILL), daemons and all,
# and that run's directory: the one of the slurm.conf its daemons were started with
for stale in $(ip netns list 2> /dev/null | sed -nE 's/^psl([0-9]+)-.*/\1/p' | sort -u); do
  [ -d "/proc/$stale" ] && continue
  old=$(for p in $(ip netns pids "psl$stale-h0" 2> /dev/null); do tr '\0' '\n' < "/proc/$p/cmdline"; done 2> /dev/null |
        grep -m1 -E '^/.*/tmp\.[A-Za-z0-9]{10}/slurm\.conf$')
  PT_CLUSTER="psl$stale" "$C" down
  [ -n "$old" ] && rm -rf "${old%/slurm.conf}"
done
export PT_CLUSTER="psl$$"
net="${PT_CLUSTER_NET:-10.77.0}"
why="$("$C" check 2>&1)"; rc=$?
if [ $rc -eq 2 ]; then echo "test_slurm: skipped: $why"; exit 0; fi
[ $rc -eq 0 ] || { echo "FAIL: cluster.sh check: $why"; exit 1; }
for t in slurmctld slurmd sbatch srun scontrol munged mungekey; do
  command -v "$t" > /dev/null ||
    { echo "FAIL: '$t' is not installed (scripts/setup.sh installs slurmctld slurmd munge slurm-client)"; exit 1; }
done
trap '[ "$BASHPID" = "$pt_main_shell" ] && { "$C" down; rm -rf "$tmp"; }' EXIT
trap 'exit 143' TERM INT HUP

# the job script the guide shows (section 14) is the file submitted here
"$PY" - "$PT_SOURCE_DIR/docs/guide.md" "$JOB" << 'PY' && ok || bad "docs/guide.md's job script is not scripts/slurm_job.sh"
import re, sys
guide, script = (open(p).read() for p in sys.argv[1:])
shown = [b for b in re.findall(r"```sh\n(.*?)```", guide, re.S) if b.startswith("#!/bin/bash\n# slurm_job.sh")]
sys.exit(0 if shown == [script] else 1)
PY

# the reference meanwhile (one process, one core of two)
run 1 ref --training.micro_batch=8 & ref_job=$!

"$C" up 2 > /dev/null || { echo "FAIL: cluster.sh up 2"; exit 1; }
h0="$PT_CLUSTER-h0" h1="$PT_CLUSTER-h1"
on() { local host="$1"; shift; "$C" agent "$host" "$@"; } # a command on a host, as its hostname

mkdir -p "$tmp/munge" "$tmp/state" "$tmp/$h0/spool" "$tmp/$h0/tmp" "$tmp/$h1/spool" "$tmp/$h1/tmp"
cat > "$tmp/slurm.conf" << EOF
ClusterName=$PT_CLUSTER
SlurmctldHost=$h0($net.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdSpoolDir=$tmp/%n/spool
SlurmdPidFile=$tmp/%n/slurmd.pid
SlurmdLogFile=$tmp/%n/slurmd.log
TmpFS=$tmp/%n/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$h0 NodeAddr=$net.1 CPUs=2
NodeName=$h1 NodeAddr=$net.2 CPUs=2
PartitionName=test Nodes=ALL Default=YES State=UP
EOF
# Two things a real cluster's nodes do not share, these hosts do, found by running it:
#  - slurmd 22.05 starts a cgroup plugin whatever the proctrack and task plugins; "autodetect"
#    looks at /sys/fs/cgroup, where `ip netns exec` has mounted a sysfs of its own, and slurmd
#    stops ("error: No filesystem mounted on /sys/fs/cgroup", "error: Unable to initialize cgroup
#    plugin"). Named, cgroup/v1 loads and is never used (proctrack/linuxproc, task/none).
#  - srun --mpi=pmix makes each node's PMIx directory in TmpFS, /tmp by default, one path for
#    both hosts: "Cannot create directory "/tmp/spmix_appdir_0_2.0": File exists". TmpFS above
#    is a directory a node (%n).
printf 'CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n' > "$tmp/cgroup.conf"
export SLURM_CONF="$tmp/slurm.conf"

t0=$SECONDS
mungekey --create --keyfile="$tmp/munge/key" || bad "mungekey"
# one munged serves both hosts: its socket is a path, and paths are shared between network
# namespaces (the hosts share a file system); --force: root's, in a directory only root enters
on "$h0" munged --force --socket="$tmp/munge/socket" --key-file="$tmp/munge/key" \
  --log-file="$tmp/munge/log" --pid-file="$tmp/munge/pid" --seed-file="$tmp/munge/seed" ||
  bad "munged did not start: $(cat "$tmp/munge/log")"
on "$h0" slurmctld -f "$SLURM_CONF" || bad "slurmctld did not start: $(tail -3 "$tmp/slurmctld.log")"
for h in "$h0" "$h1"; do
  on "$h" slurmd -f "$SLURM_CONF" -N "$h" || bad "slurmd on $h did not start: $(grep error "$tmp/$h/slurmd.log")"
done
idle=""
for _ in $(seq 1 100); do
  idle=$(on "$h0" sinfo -h -N -o %T 2> /dev/null | sort | uniq -c | xargs)
  [ "$idle" = "2 idle" ] && break
  sleep 0.2
done
if [ "$idle" = "2 idle" ]; then ok; echo "slurm: 2 nodes idle after $((SECONDS - t0)) s"
else bad "the nodes are not idle: '$idle'; $(grep -h error "$tmp/slurmctld.log" "$tmp"/*/slurmd.log | tail -5)"; fi

# the job's configuration: the tiny model's flags as an INI file
for f in "${tiny[@]}"; do
  f="${f#--}"
  printf '[%s]\n%s = %s\n' "${f%%.*}" "$(cut -d= -f1 <<< "${f#*.}")" "${f#*=}"
done > "$tmp/tiny.ini"
# what the namespaces need of Open MPI (cluster.sh run sets the same): TCP between the hosts on
# the bridge's subnet; 4 ranks on 2 cores yield when they wait. sbatch passes the environment on
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include="$net.0/24"
export OMPI_MCA_oob_tcp_if_include="$net.0/24" OMPI_MCA_mpi_yield_when_idle=1
export PENTATRON="$bin" TMPDIR="$tmp"

# job NAME: scripts/slurm_job.sh submitted (PT_LAUNCHER from the caller), 2 nodes × 2 tasks,
# dp 2 × tp 2; waits for it to end; the job's record (scontrol) in $tmp/NAME.job
job() {
  local name="$1" id state="" t0=$SECONDS
  id=$(on "$h0" sbatch --parsable --chdir="$tmp" --nodes=2 --ntasks-per-node=2 --gpus-per-node=0 \
    --time=2 --output="$tmp/$name.log" "$JOB" "$tmp/tiny.ini" --parallel.dp=2 --parallel.tp=2 \
    --training.micro_batch=4 --logging.metrics="$tmp/$name.jsonl" --logging.dump_grads="$tmp/$name.st" \
    --logging.trace="$tmp/$name.trace" 2>&1) || { bad "$name: sbatch: $id"; return 1; }
  while [ $((SECONDS - t0)) -lt 60 ]; do
    on "$h0" scontrol -o show job "$id" > "$tmp/$name.job" 2>&1
    state=$(grep -o 'JobState=[A-Z_]*' "$tmp/$name.job")
    case "$state" in JobState=PENDING|JobState=RUNNING|JobState=CONFIGURING|JobState=COMPLETING|"") sleep 0.1;; *) break;; esac
  done
  echo "$name: job $id ${state#JobState=} after $((SECONDS - t0)) s"
  case "$state" in JobState=COMPLETED|JobState=FAILED|JobState=CANCELLED|JobState=TIMEOUT) ;;
    *) on "$h0" scancel "$id";; esac # still there after a minute: out of the next job's way
  [ "$state" = JobState=COMPLETED ] ||
    { bad "$name: job $id $state: $(tail -5 "$tmp/$name.log" 2> /dev/null)"; return 1; }
}

# placed NAME ORDER: the hosts the ranks recorded against the allocation in ORDER (block: Slurm's
# default distribution, and mpirun's by slot; cyclic: round-robin)
placed() {
  "$bin" trace why "$tmp/$1.trace" > "$tmp/$1.why" 2>&1
  # (scontrol expands a host list by itself, no daemon asked)
  local nodes
  nodes=$(scontrol show hostnames "$(grep -o ' NodeList=[^ ]*' "$tmp/$1.job" | cut -d= -f2)")
  "$PY" - "$tmp/$1.job" "$tmp/$1.why" "$2" "$nodes" << 'PY'
import re, sys
job, why, order, nodes = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3], sys.argv[4].split()
tasks = int(re.search(r"NumTasks=(\d+)", job).group(1))
per_node = int(re.search(r"NtasksPerN:B:S:C=(\d+)", job).group(1))
want = [nodes[r // per_node] if order == "block" else nodes[r % len(nodes)] for r in range(tasks)]
got = dict((int(r), h) for r, h in re.findall(r"rank (\d+) \(.*?\) on host (\S+):", why))
got = [got.get(r) for r in range(max(len(got), tasks))]
print(f"allocation {nodes}, {tasks} tasks, {per_node} a node; ranks' hosts {got}; {order} order {want}")
sys.exit(0 if got == want else 1)
PY
}

wait $ref_job || bad "reference failed: $(tail -3 "$tmp/ref.log")"
# no job where the nodes did not come up (it would wait for them until its time limit)
[ "$idle" = "2 idle" ] && launchers="srun mpirun" || launchers=""
for launcher in $launchers; do
  if PT_LAUNCHER=$launcher job "$launcher"; then
    compare ref "$launcher" && ok || bad "$launcher: differs from the single-process run"
    placed "$launcher" block && ok || bad "$launcher: the ranks did not run where the allocation puts them"
    grep -q "mesh: 2 hosts; within a host: tp; across hosts: dp" "$tmp/$launcher.log" && ok ||
      bad "$launcher: the mesh's placement line: $(grep 'mesh:' "$tmp/$launcher.log")"
  fi
done
# the negative control: the srun job's ranks against the round-robin order of the same allocation
if [ -f "$tmp/srun.why" ]; then
  if placed srun cyclic > /dev/null; then bad "the placement check passes the cyclic order"
  else ok; echo "(the negative control: the ranks' hosts fail against the cyclic order)"; fi
fi

"$C" down
left="$(ip netns list | grep -c "^$PT_CLUSTER-"; ls -d /etc/netns/"$PT_CLUSTER"-* 2> /dev/null | wc -l)"
[ "$left" = "$(printf '0\n0')" ] && ok || bad "the cluster left namespaces or /etc/netns entries: $left"
pgrep -f "$tmp/" > /dev/null && bad "processes are left: $(pgrep -af "$tmp/")" || ok

echo "test_slurm: $pass passed, $fail failed ($((SECONDS - t_start)) s)"
[ $fail -eq 0 ]
