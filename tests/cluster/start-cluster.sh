#!/usr/bin/env bash
# Bring up a throw-away Slurm cluster on this machine for tests: one slurmctld and
# N slurmd, either all on 127.0.0.1 (loopback, multiple-slurmd) or one network + UTS
# namespace per node (netns, distinct hostnames n1..nN). The host's Slurm (Debian 12:
# 22.05), or another release's from a root made by release-root.sh (HTC_CLUSTER_ROOT).
#
#   start-cluster.sh [-n NODES] [-m loopback|netns] [-c CPUS_PER_NODE]
#
# Environment (all optional):
#   HTC_CLUSTER_DIR          state dir, default /var/lib/slurm-htc-test
#   HTC_CLUSTER_USER         submitting user, default htcuser (created if missing)
#   HTC_CLUSTER_GROUP        a supplementary group of that user, default htcextra
#                            (created and added if missing)
#   HTC_CLUSTER_NETNS        netns name prefix, default htc-<basename of the state dir>
#   HTC_CLUSTER_CTLD_PORT    slurmctld port, default 6817
#   HTC_CLUSTER_SLURMD_PORT  first loopback slurmd port, default 17001
#   HTC_CLUSTER_DBD_PORT     slurmdbd port, default the slurmctld port + 2
#   HTC_CLUSTER_TIMEOUT      seconds to wait for all nodes idle, default 60
#   HTC_CLUSTER_DEBUG        SlurmctldDebug/SlurmdDebug, default info
#   HTC_CLUSTER_SCHED        SchedulerParameters, default batch_sched_delay=0; set it
#                            empty for Slurm's defaults (benchmarks that must look
#                            like a real site)
#   HTC_CLUSTER_CONF_EXTRA   lines added at the end of slurm.conf (a benchmark's own settings)
#   HTC_CLUSTER_ROOT         a release root (release-root.sh): daemons, jobs and the
#                            tests' clients then run chrooted in a view of it
#                            (root-view.sh); default: the host's Slurm
# The cluster is configured as sites run Slurm: cgroups (proctrack, task with cores and memory
# constrained, accounting gathered from them), task affinity, slurmdbd accounting over MariaDB
# enforcing associations, limits and QOS (accounting.sh: the accounts, users and QOS), and two
# partitions over all nodes: "scavenger", the default, whose jobs a job of "high" preempts
# (PreemptType=preempt/partition_prio, PreemptMode=REQUEUE).
# Afterwards tests source $HTC_CLUSTER_DIR/env (or lib.sh, then cluster_env).
# On failure the daemons are left running for inspection; stop-cluster.sh or the
# next start cleans up.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
# shellcheck source=root-view.sh
. "$here/root-view.sh"
# shellcheck source=accounting.sh
. "$here/accounting.sh"

usage() {
    sed -n '6p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2
    exit 2
}

nodes=1 mode=loopback cpus=2
while getopts 'n:m:c:h' opt; do
    case $opt in
        n) nodes=$OPTARG ;;
        m) mode=$OPTARG ;;
        c) cpus=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
(($# == 0)) || usage
[[ $nodes =~ ^[1-9][0-9]*$ ]] || _htc_die "-n wants a positive integer, got '$nodes'"
[[ $cpus =~ ^[1-9][0-9]*$ ]] || _htc_die "-c wants a positive integer, got '$cpus'"
[[ $mode == loopback || $mode == netns ]] || _htc_die "-m wants loopback or netns, got '$mode'"
# Node addresses are 10.199.0.(10+X) inside the namespaces.
[[ $mode == loopback ]] || ((nodes <= 200)) || _htc_die "netns mode supports at most 200 nodes"
[[ $EUID -eq 0 ]] || _htc_die "must run as root"
[[ $HTC_CLUSTER_DIR == /* && $HTC_CLUSTER_DIR != / ]] ||
    _htc_die "HTC_CLUSTER_DIR must be an absolute path other than /"
ctld_port=${HTC_CLUSTER_CTLD_PORT:-6817}
slurmd_port=${HTC_CLUSTER_SLURMD_PORT:-17001}
dbd_port=${HTC_CLUSTER_DBD_PORT:-$((ctld_port + 2))}
timeout=${HTC_CLUSTER_TIMEOUT:-60}
debug=${HTC_CLUSTER_DEBUG:-info}
sched_params=${HTC_CLUSTER_SCHED-batch_sched_delay=0}

t0=$EPOCHREALTIME
dir=$HTC_CLUSTER_DIR
conf=$dir/slurm.conf
short=$(hostname -s)

# --- packages ---------------------------------------------------------------
# munge and MariaDB are the host's in either case: one of each serves every release's daemons.
pkgs=(munge mariadb-server)
[[ -n $HTC_CLUSTER_ROOT ]] || pkgs+=(slurm-wlm slurmctld slurmd slurmdbd slurm-client)
missing=0
for p in "${pkgs[@]}"; do
    [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null) == installed ]] || missing=1
done
if ((missing)); then
    echo "start-cluster: installing ${pkgs[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null
fi
t_apt=$(_htc_elapsed "$t0")

# --- a clean slate ----------------------------------------------------------
HTC_CLUSTER_KEEP_DB=1 "$here/stop-cluster.sh"
# In a release root every Slurm program runs chrooted in its view; `in_root` prefixes them.
view='' in_root=()
if [[ -n $HTC_CLUSTER_ROOT ]]; then
    view=$(root_view_path)
    in_root=(chroot "$view")
fi

if ! id -u "$HTC_CLUSTER_USER" >/dev/null 2>&1; then
    useradd --create-home --user-group --shell /bin/bash "$HTC_CLUSTER_USER"
fi
# A supplementary group, so tests can check that jobs run with all of the user's groups.
getent group "$HTC_CLUSTER_GROUP" >/dev/null || groupadd "$HTC_CLUSTER_GROUP"
if ! id -nG "$HTC_CLUSTER_USER" | tr ' ' '\n' | grep -x -- "$HTC_CLUSTER_GROUP" >/dev/null; then
    usermod -a -G "$HTC_CLUSTER_GROUP" "$HTC_CLUSTER_USER"
fi

# Fresh state, so job ids restart at 1 and no node remembers being DOWN.
# plugstack.conf.d/ is kept: it is test configuration, not cluster state.
rm -rf -- "${dir:?}/state" "$dir/spool" "$dir/log" "$dir/run" "$dir/work" "${dir:?}/bin" \
    "$dir/env" "$dir/slurm.conf" "$dir/cgroup.conf" "$dir/slurmdbd.conf" "$dir/hosts"
install -d -m 0755 "$dir" "$dir/state" "$dir/spool" "$dir/log" "$dir/run" "$dir/bin" \
    "$dir/plugstack.conf.d"
# World-writable with sticky bit like /tmp: tests make their job dirs here.
install -d -m 1777 "$dir/work"
for i in $(seq "$nodes"); do install -d -m 0755 "$dir/spool/slurmd-n$i"; done

# In loopback mode every daemon listens in the root namespace: a second
# cluster (another HTC_CLUSTER_DIR) needs its own ports, so say so up front.
if [[ $mode == loopback ]] && command -v ss >/dev/null; then
    for port in "$ctld_port" "$dbd_port" $(seq "$slurmd_port" $((slurmd_port + nodes - 1))); do
        if [[ -n $(ss -Hltn "sport = :$port") ]]; then
            _htc_die "TCP port $port is in use (another cluster?); pick others with HTC_CLUSTER_CTLD_PORT / HTC_CLUSTER_DBD_PORT / HTC_CLUSTER_SLURMD_PORT"
        fi
    done
fi

# --- munge ------------------------------------------------------------------
if ! munge -n </dev/null >/dev/null 2>&1; then
    if [[ ! -s /etc/munge/munge.key ]]; then
        install -d -o munge -g munge -m 0700 /etc/munge
        runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    # --force: a munged killed earlier leaves its socket behind.
    _htc_detached runuser -u munge -- /usr/sbin/munged --force
    for _ in $(seq 50); do
        munge -n </dev/null >/dev/null 2>&1 && break
        sleep 0.1
    done
    munge -n </dev/null >/dev/null 2>&1 || _htc_die "munged did not come up"
    # Remember that munged is ours, so stop-cluster.sh stops it and no other.
    cp /run/munge/munged.pid "$dir/run/munged.pid"
fi

# --- MariaDB ----------------------------------------------------------------
acct_db_start

# --- the release ------------------------------------------------------------
# After munged and MariaDB: the view shares their sockets' directories.
if [[ -n $view ]]; then root_view_mount "$HTC_CLUSTER_ROOT" "$(cd -- "$here/../.." && pwd)"; fi
# The release the cluster runs, for the tests (e.g. 22.05.8).
release=$("${in_root[@]}" /usr/sbin/slurmctld -V | awk '{print $2}')
# The accounts made on an earlier start are kept (its records emptied); else made below.
accounts=1
acct_db_reset "$release" || accounts=0

# --- configuration ----------------------------------------------------------
if [[ $mode == loopback ]]; then
    ctld_host="$short(127.0.0.1)" dbd_addr=127.0.0.1
    if ((nodes == 1)); then ports=$slurmd_port; else ports="[$slurmd_port-$((slurmd_port + nodes - 1))]"; fi
    node_line="NodeName=n[1-$nodes] NodeHostname=$short NodeAddr=127.0.0.1 Port=$ports"
else
    ctld_host="$short(10.199.0.1)" dbd_addr=10.199.0.1
    if ((nodes == 1)); then addrs=10.199.0.11; else addrs="10.199.0.[11-$((10 + nodes))]"; fi
    node_line="NodeName=n[1-$nodes] NodeAddr=$addrs"
fi

# A node's memory, a core's share of it (more than the machine has, with SlurmdParameters below).
mem_per_cpu=1000
cat >"$conf" <<EOF
# Written by tests/cluster/start-cluster.sh ($mode, $nodes nodes, Slurm $release); rewritten on every start.
ClusterName=htctest
SlurmctldHost=$ctld_host
SlurmctldPort=$ctld_port
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# What sites run: every job and step in cgroups (cgroup.conf beside this file: cores and memory
# constrained), tasks bound to their cores, accounting gathered from the cgroups.
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
JobAcctGatherType=jobacct_gather/cgroup
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$dbd_addr
AccountingStoragePort=$dbd_port
AccountingStorageEnforce=associations,limits,qos
JobCompType=jobcomp/none
SelectType=select/cons_tres
# Cores and memory consumable, as at sites: a job without --mem gets DefMemPerCPU a core.
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$mem_per_cpu
# Nodes may claim more CPUs than the machine has.
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
# Without an epilog slurmd sends no EPILOG_COMPLETE, the scheduler is not woken
# when a job ends, and job arrays crawl (1000 tasks: 191 s instead of 13 s).
Epilog=/bin/true
# A finished job's record stays in slurmctld's memory this long: tests read it with scontrol.
MinJobAge=600
# Slurm's default batch_sched_delay=3 leaves every sbatch job pending for up
# to 3 s until a periodic scheduler pass; tests want it started at once.
${sched_params:+SchedulerParameters=$sched_params}
PlugStackConfig=$dir/plugstack.conf
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmctldDebug=$debug
SlurmdSpoolDir=$dir/spool/slurmd-%n
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmdDebug=$debug
$node_line CPUs=$cpus RealMemory=$((cpus * mem_per_cpu)) State=UNKNOWN
# Where HTC work lives at sites: a default low-priority partition whose jobs are requeued when a
# job of the high-priority one needs their nodes. Tests change a partition's PreemptMode and
# GraceTime with scontrol; GANG lets one be SUSPEND (the gang scheduler resumes what it suspends;
# with OverSubscribe=NO it time-slices nothing).
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE,GANG
PartitionName=scavenger Nodes=ALL Default=YES PriorityTier=1 PreemptMode=REQUEUE MaxTime=INFINITE State=UP
PartitionName=high Nodes=ALL PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
${HTC_CLUSTER_CONF_EXTRA:-}
EOF

# autodetect: cgroup/v1 on this project's machines (v1 controllers, no v2), cgroup/v2 on a kernel
# that mounts the unified hierarchy.
cat >"$dir/cgroup.conf" <<EOF
# Written by tests/cluster/start-cluster.sh; rewritten on every start.
CgroupPlugin=autodetect
ConstrainCores=yes
ConstrainRAMSpace=yes
EOF

acct_dbd_conf "$dbd_port" "$release"

# Tests enable a SPANK plugin by dropping a line into plugstack.conf.d/NAME.conf.
printf 'include %s/plugstack.conf.d/*.conf\n' "$dir" >"$dir/plugstack.conf"

# Clients as root go through this wrapper: in netns mode only the head
# namespace can reach slurmctld. nsenter (not `ip netns exec`) leaves /sys alone.
# In a release root they run chrooted in its view, in the caller's directory where the view has
# it (the checkout, /tmp, /home and the cluster's dir are there at the same paths).
client=$dir/bin/slurm-client
{
    echo '#!/bin/sh'
    if [[ $mode == netns ]]; then
        echo '# Run a command in the head namespace of the test cluster.'
        printf 'net="nsenter --net=/run/netns/%s-head --"\n' "$HTC_CLUSTER_NETNS"
    else
        echo '# Loopback cluster: clients reach slurmctld from anywhere.'
        echo 'net='
    fi
    if [[ -n $view ]]; then
        echo "# Slurm $release: chrooted in the view of $HTC_CLUSTER_ROOT."
        # shellcheck disable=SC2016 # written for the wrapper
        printf 'exec $net chroot %s /bin/sh -c '"'"'cd "$1" 2>/dev/null || cd /; shift; exec "$@"'"'"' sh "$PWD" "$@"\n' "$view"
    else
        echo 'exec $net "$@"'
    fi
} >"$client"
chmod 0755 "$client"

cat >"$dir/env" <<EOF
export HTC_CLUSTER_DIR=$dir
export SLURM_CONF=$conf
export HTC_CLUSTER_MODE=$mode
export HTC_CLUSTER_NODES=$nodes
export HTC_CLUSTER_CPUS=$cpus
export HTC_CLUSTER_USER=$HTC_CLUSTER_USER
export HTC_CLUSTER_GROUP=$HTC_CLUSTER_GROUP
export HTC_CLUSTER_NETNS=$HTC_CLUSTER_NETNS
export HTC_CLUSTER_CLIENT=$client
export HTC_CLUSTER_ROOT=$HTC_CLUSTER_ROOT
export HTC_CLUSTER_VIEW=$view
export HTC_CLUSTER_RELEASE=$release
EOF
chmod 0644 "$conf" "$dir/cgroup.conf" "$dir/plugstack.conf" "$dir/env"
# shellcheck source=/dev/null
. "$dir/env"

# --- network namespaces -----------------------------------------------------
# Every veth end is created inside a namespace, so the root namespace gets no
# interface, address or route, and no packet can leave for a real network.
if [[ $mode == netns ]]; then
    head_ns=$HTC_CLUSTER_NETNS-head
    ip netns add "$head_ns"
    ip -n "$head_ns" link set lo up
    ip -n "$head_ns" link add br0 type bridge
    ip -n "$head_ns" addr add 10.199.0.1/24 dev br0
    ip -n "$head_ns" link set br0 up
    {
        printf '127.0.0.1 localhost\n10.199.0.1 %s ctl\n' "$short"
        for i in $(seq "$nodes"); do printf '10.199.0.%d n%d\n' $((10 + i)) "$i"; done
    } >"$dir/hosts"
    chmod 0644 "$dir/hosts"
    for i in $(seq "$nodes"); do
        ns=$HTC_CLUSTER_NETNS-n$i
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip link add eth0 netns "$ns" type veth peer name "vn$i" netns "$head_ns"
        ip -n "$ns" addr add "10.199.0.$((10 + i))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$head_ns" link set "vn$i" master br0 up
    done
fi

# --- daemons ----------------------------------------------------------------
fail() {
    printf 'start-cluster: %s\n' "$*" >&2
    cluster_cmd sinfo -N -o '%N %T %E' >&2 || true
    cluster_logs 20 >&2
    printf 'start-cluster: %s\n' "$*" "daemons left running for inspection; stop-cluster.sh cleans up" >&2
    exit 1
}
# Past the deadline? (seconds since the daemons were started)
overdue() { (($(_htc_elapsed "$t_daemons" | cut -d. -f1) >= timeout)); }

# A clean environment, so nothing of the caller's leaks into prolog/epilog or
# job steps; the marker lets stop-cluster.sh find exactly these processes.
daemon_env=("${in_root[@]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$(_htc_marker)")
t_daemons=$EPOCHREALTIME
ctld_prefix=()
if [[ $mode == netns ]]; then ctld_prefix=(nsenter --net="/run/netns/$head_ns" --); fi
# slurmdbd first: slurmctld registers with it, and the associations must be there before any job.
"${ctld_prefix[@]}" "${daemon_env[@]}" SLURM_CONF="$conf" /usr/sbin/slurmdbd || fail "slurmdbd did not start"
until cluster_cmd sacctmgr -n list cluster >/dev/null 2>&1; do
    overdue && fail "slurmdbd not answering after $timeout s"
    sleep 0.05
done
((accounts)) || acct_populate htctest "$release" >/dev/null || fail "sacctmgr could not make the accounts"
"${ctld_prefix[@]}" "${daemon_env[@]}" /usr/sbin/slurmctld -f "$conf" || fail "slurmctld did not start"

# A slurmd that finds no controller retries its registration only after 1 s,
# so start the nodes once slurmctld answers.
until cluster_cmd scontrol ping 2>/dev/null | grep 'is UP' >/dev/null; do
    overdue && fail "slurmctld not answering after $timeout s"
    sleep 0.02
done

for i in $(seq "$nodes"); do
    if [[ $mode == loopback ]]; then
        "${daemon_env[@]}" /usr/sbin/slurmd -f "$conf" -N "n$i" || fail "slurmd n$i did not start"
    else
        # A private UTS + mount namespace gives each node its own hostname and /etc/hosts.
        _htc_node_slurmd "$i" || fail "slurmd n$i did not start"
    fi
done

# --- wait for all nodes idle ------------------------------------------------
while :; do
    idle=$(cluster_cmd sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | grep -c ' idle$' || true)
    ((idle == nodes)) && break
    # The pid file appears only once slurmctld has daemonized.
    pid=$(cat "$dir/run/slurmctld.pid" 2>/dev/null || true)
    [[ -z $pid || -d /proc/$pid ]] || fail "slurmctld exited"
    overdue && fail "only $idle of $nodes nodes idle after $timeout s"
    sleep 0.05
done

printf 'start-cluster: Slurm %s, %d node(s), %s mode, %s CPUs each: all idle %s s after starting the daemons (packages %s s, total %s s); env: %s\n' \
    "$release" "$nodes" "$mode" "$cpus" "$(_htc_elapsed "$t_daemons")" "$t_apt" "$(_htc_elapsed "$t0")" "$dir/env"
plugins=$(cat "$dir"/plugstack.conf.d/*.conf 2>/dev/null || true)
if [[ -n $plugins ]]; then printf 'start-cluster: plugstack lines:\n%s\n' "$plugins"; fi
