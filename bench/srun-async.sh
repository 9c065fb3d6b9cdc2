#!/usr/bin/env bash
# slurm-htc beside Slurm 26.05's `srun --async` (steps queued by the job's step manager inside one
# allocation), in one run on one 4-node cluster of Slurm 26.05 built from source
# (bench/async-root.sh): N short tasks each way, each appending one line to a file. Measured:
# wall time from submission to the last task's line, slurmctld's inbound RPCs (`sdiag`, reset
# before each job), and what each gives back afterwards: per-task exit codes (htc status / sacct's
# step records), a ledger to resume from.
#
# The async job's batch script submits the N steps with `srun --async` from 8 submitters at once
# (xargs -P 8), then waits for the N lines; a step manager queues what does not fit.
#
#   bench/srun-async.sh ROOT [N]      (as root; ROOT from bench/async-root.sh; N default 10000;
#                                      after cargo build --release --workspace)
set -uo pipefail

repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
export HTC_CLUSTER_ROOT=${1:?usage: bench/srun-async.sh ROOT [N]}
n=${2:-10000}
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-bench}
export HTC_CLUSTER_CTLD_PORT=${HTC_CLUSTER_CTLD_PORT:-6827}
export HTC_CLUSTER_SLURMD_PORT=${HTC_CLUSTER_SLURMD_PORT:-17301}
# shellcheck source=/dev/null
. "$repo/tests/cluster/lib.sh"

"$repo/tests/cluster/release-plugin.sh" "$HTC_CLUSTER_ROOT" >/dev/null || { echo "the plugin did not build for $HTC_CLUSTER_ROOT"; exit 1; }
out=$repo/bench/results/srun-async-$(date -u +%Y%m%d-%H%M%S).txt
mkdir -p "$repo/bench/results"
exec > >(tee "$out") 2>&1

# A step manager needs its job contained (PrologFlags=contain: slurmctld drops --stepmgr without).
HTC_CLUSTER_CONF_EXTRA=PrologFlags=contain "$repo/tests/cluster/start-cluster.sh" -n 4 -m netns -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
install_htc >/dev/null
bin=$HTC_CLUSTER_DIR/htc-bin
echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "cluster: 4 nodes x 2 CPUs (network namespaces), Slurm $HTC_CLUSTER_RELEASE; $n tasks each way"

usec() { printf '%s\n' "${EPOCHREALTIME//[!0-9]/}"; }
inbound_rpcs() { # the controller's inbound RPCs since `sdiag -r`: total, then the largest by type
    cluster_cmd sdiag | awk '/by message type/ {on=1; next} /by user/ {on=0}
        on && /count:/ && !/REQUEST_STATS_INFO/ { c = $0; sub(/.*count:/, "", c); sub(/ .*/, "", c); if (c >= 20) d = d sprintf(" %s=%s", $1, c); s += c }
        END { print s + 0 "  (" substr(d, 2) ")" }'
}
lines_reach() { # FILE N TIMEOUT_S
    local i
    for ((i = 0; i < $3 * 10; i++)); do
        (($(wc -l <"$1" 2>/dev/null || echo 0) >= $2)) && return 0
        sleep 0.1
    done
    return 1
}
# shellcheck disable=SC2016 # expanded by the task
task='echo "$SLURM_JOB_ID" >> lines.txt'

one() { # LABEL SBATCH ARGS... -> prints wall, RPCs
    local label=$1 w j t0 t1 rpcs
    shift
    w=$(cluster_workdir "async-$label")
    seq "$n" | sed "s|.*|$task|" >"$w/tasks.txt"
    : >"$w/lines.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    cluster_cmd sdiag -r >/dev/null
    t0=$(usec)
    j=$(as_user -C "$w" sbatch --parsable -N 4 --exclusive "$@" | cut -d';' -f1)
    lines_reach "$w/lines.txt" "$n" 1800 || echo "$label: only $(wc -l <"$w/lines.txt") of $n lines"
    t1=$(usec)
    wait_job "$j" 300 >/dev/null
    sleep 2
    rpcs=$(inbound_rpcs)
    printf '%-12s wall %8.2f s  %8.0f tasks/s  controller RPCs %s\n' "$label" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print (b - a) / 1e6 }')" \
        "$(awk -v a="$t0" -v b="$t1" -v n="$n" 'BEGIN { print n / ((b - a) / 1e6) }')" "$rpcs"
    echo "$j $w" >"$HTC_CLUSTER_DIR/last-$label"
}

one slurm-htc --htc=tasks.txt --wrap=:
read -r j w <"$HTC_CLUSTER_DIR/last-slurm-htc"
echo "  gives back: $(as_user -C "$w" "$bin/htc" status "$j" 2>&1 | grep -m1 -o '[0-9]* done[^;]*'), each task's exit code and attempts in its ledger (htc log $j), htc resume $j after a stop"

# The async job: N steps submitted by 8 srun --async at a time; it ends once every line is there.
# shellcheck disable=SC2016 # expanded in the job
async_script='seq '"$n"' | xargs -P 8 -I{} srun --async -N1 -n1 --exact -o /dev/null -e /dev/null sh -c '"'$task'"' >/dev/null
while [ "$(wc -l < lines.txt)" -lt '"$n"' ]; do sleep 0.2; done'
one srun-async --stepmgr --wrap="$async_script"
read -r j w <"$HTC_CLUSTER_DIR/last-srun-async"
steps=$(cluster_cmd sacct -n -P -j "$j" -o JobID,ExitCode 2>/dev/null | grep -cE "^$j\.[0-9]+\|")
failed=$(cluster_cmd sacct -n -P -j "$j" -o JobID,ExitCode 2>/dev/null | grep -E "^$j\.[0-9]+\|" | grep -vc '|0:0$')
echo "  gives back: $steps step records in sacct ($failed not 0:0), output to the files named per step; no ledger, nothing to resume (a stopped job's queued steps are gone)"
"$repo/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
echo "results: $out"
