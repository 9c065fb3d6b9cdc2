#!/usr/bin/env bash
# Slurm controller cost and wall time of the same work three ways, in one run on one cluster:
# an HTC job of 1,000 tasks, an HTC job of 10,000 tasks, and a 1,000-element job array; then
# runs over several allocations (joined, grown).
# Inbound RPCs come from `sdiag` (reset before each job); waiting reads slurmctld's log, because
# polling with squeue would add RPCs of its own. Epilog=/bin/true is set (see slurm-findings §4).
#
#   bench/slurm-rpc.sh [-n NODES]      (as root, after cargo build --profile dist --workspace)
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
nodes=4
[[ ${1-} == -n ]] && nodes=$2
# A cluster of its own, so it never collides with a test cluster on the default ports.
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-bench}
export HTC_CLUSTER_CTLD_PORT=${HTC_CLUSTER_CTLD_PORT:-6827}
export HTC_CLUSTER_SLURMD_PORT=${HTC_CLUSTER_SLURMD_PORT:-17301}
# shellcheck source=/dev/null
. "$root/tests/cluster/lib.sh"

out=$root/bench/results/slurm-rpc-$(date -u +%Y%m%d-%H%M%S).txt
mkdir -p "$root/bench/results"
exec > >(tee "$out") 2>&1

"$root/tests/cluster/start-cluster.sh" -n "$nodes" -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
bin=$HTC_CLUSTER_DIR/htc-bin
make -s -C "$root" install BINDIR="$bin" PLUGINDIR="$bin" PLUGSTACKDIR="$HTC_CLUSTER_DIR/plugstack.conf.d" >/dev/null

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "cluster: $nodes nodes x 2 CPUs, loopback multi-slurmd, Slurm $(sinfo -V 2>/dev/null | cut -d' ' -f2), Epilog=/bin/true, SchedulerParameters=batch_sched_delay=0"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"

usec() { printf '%s\n' "${EPOCHREALTIME//[!0-9]/}"; }

wait_in_log() { # JOBID [ARRAY_SIZE]: until the job (or every array element) is done
    local j=$1 want=${2:-1} i
    for ((i = 0; i < 6000; i++)); do
        if (($(grep -cE "_job_complete: JobId=${j}(_[0-9]+\(?[0-9]*\)?)? done" "$HTC_CLUSTER_DIR/log/slurmctld.log") >= want)); then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

inbound_rpcs() { # the controller's inbound RPCs since `sdiag -r`: total, then by type
    cluster_cmd sdiag | awk '/by message type/ {on=1; next} /by user/ {on=0}
        on && /count:/ && !/REQUEST_STATS_INFO/ { c = $0; sub(/.*count:/, "", c); sub(/ .*/, "", c); d = d sprintf(" %s=%s", $1, c); s += c }
        END { print s + 0 "   " d }'
}

measure() { # LABEL ARRAY_SIZE SBATCH_ARGS...
    local label=$1 size=$2 w j t0 t1 rpcs
    shift 2
    w=$(cluster_workdir "$label")
    seq 1 10000 | sed 's/.*/true/' | head -n "${label##*-}" >"$w/tasks.txt" 2>/dev/null
    chown -R "$HTC_CLUSTER_USER" "$w"
    cluster_cmd sdiag -r >/dev/null
    t0=$(usec)
    j=$(as_user -C "$w" sbatch --parsable "$@" | cut -d';' -f1)
    wait_in_log "$j" "$size" || { echo "$label: job $j did not finish"; return 1; }
    t1=$(usec)
    sleep 2 # epilog-complete messages arrive just after the job ends
    rpcs=$(inbound_rpcs)
    printf '%-14s wall %7.2f s   inbound RPCs %s\n' "$label" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print (b - a) / 1e6 }')" "$rpcs"
}

measure htc-1000 1 -N "$nodes" --exclusive --htc=tasks.txt --wrap=:
measure htc-10000 1 -N "$nodes" --exclusive --htc=tasks.txt --wrap=:
measure array-1000 1000 --array=1-1000 --wrap=true

# One run over two allocations (issue 27): a 1-node HTC job joined by a 2-node one (--htc-join)
# as soon as its leader is up; tasks of 0.05 s. Its cost grows with allocations, not tasks.
measure_joined() { # TASKS
    local n=$1 w a b t0 t1
    w=$(cluster_workdir "joined-$n")
    seq 1 "$n" | sed 's/.*/sleep 0.05/' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    cluster_cmd sdiag -r >/dev/null
    t0=$(usec)
    a=$(as_user -C "$w" sbatch --parsable -N 1 --exclusive --htc=tasks.txt --wrap=: | cut -d';' -f1)
    wait_leader "$w" "$a"
    b=$(as_user -C "$w" sbatch --parsable -N 2 --exclusive --htc-join="$a" --wrap=: | cut -d';' -f1)
    { wait_in_log "$a" && wait_in_log "$b"; } || { echo "joined-$n: jobs $a and $b did not finish"; return 1; }
    t1=$(usec)
    sleep 2
    printf '%-14s wall %7.2f s   inbound RPCs %s\n' "joined-$n" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print (b - a) / 1e6 }')" "$(inbound_rpcs)"
}
measure_joined 2000
measure_joined 6000
# A run that grows itself (--htc-grow=2:1:3): a 1-node job of 3 minutes whose work (600
# core-seconds on 2 CPUs) outgrows it, as 1,200 tasks of 0.5 s and as 6,000 of 0.1 s. Its grown
# jobs' sbatch (and `sbatch --test-only` to size each) and its one squeue per 10 s are counted
# with the rest: the same work in 5 times the tasks should cost about the same.
measure_grown() { # TASKS SECONDS
    local n=$1 secs=$2 w a g t0 t1 grown
    w=$(cluster_workdir "grown-$n")
    seq 1 "$n" | sed "s/.*/sleep $secs/" >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    cluster_cmd sdiag -r >/dev/null
    t0=$(usec)
    a=$(as_user -C "$w" sbatch --parsable -N 1 --exclusive -t 3 --htc=tasks.txt --htc-grow=2:1:3 --wrap=: | cut -d';' -f1)
    wait_in_log "$a" || { echo "grown-$n: job $a did not finish"; return 1; }
    grown=$(grep -o 'grow: submitted job [0-9]*' "$w/slurm-$a.out" | awk '{print $NF}')
    for g in $grown; do
        wait_in_log "$g" || { echo "grown-$n: grown job $g did not finish"; return 1; }
    done
    t1=$(usec)
    sleep 2
    printf '%-14s wall %7.2f s   %s grown job(s)   inbound RPCs %s\n' "grown-$n" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print (b - a) / 1e6 }')" "$(wc -w <<<"$grown")" "$(inbound_rpcs)"
}
measure_grown 1200 0.5
measure_grown 6000 0.1
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
"$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
echo "results: $out"
