#!/usr/bin/env bash
# Citizenship of a run that grows itself (issue 27): how long plain HPC jobs wait for a node when
# an HTC run beside them does not grow, and when it does (--htc-grow=3:1:2), in one run on one
# cluster. Each scenario: an HTC run on 1 node whose work (800 x 0.5 s on 2 CPUs) outgrows its
# 3-minute job, and 6 plain 1-node jobs of 20 s submitted 2 s apart from 5 s after it started.
# The waits (StartTime - SubmitTime) come from `scontrol show job`.
#
#   bench/citizen.sh      (as root, after cargo build --profile dist --workspace)
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-bench}
export HTC_CLUSTER_CTLD_PORT=${HTC_CLUSTER_CTLD_PORT:-6827}
export HTC_CLUSTER_SLURMD_PORT=${HTC_CLUSTER_SLURMD_PORT:-17301}
# shellcheck source=/dev/null
. "$root/tests/cluster/lib.sh"

out=$root/bench/results/citizen-$(date -u +%Y%m%d-%H%M%S).txt
mkdir -p "$root/bench/results"
exec > >(tee "$out") 2>&1

"$root/tests/cluster/start-cluster.sh" -n 4 -m netns -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
bin=$HTC_CLUSTER_DIR/htc-bin
make -s -C "$root" install BINDIR="$bin" PLUGINDIR="$bin" PLUGSTACKDIR="$HTC_CLUSTER_DIR/plugstack.conf.d" >/dev/null
echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)"
echo "cluster: 4 nodes x 2 CPUs (network namespaces), Slurm $(sinfo -V 2>/dev/null | cut -d' ' -f2)"

field() { # JOB KEY -> value from scontrol show job
    cluster_cmd scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"
}
secs() { date -d "$1" +%s; }

scenario() { # LABEL [HTC OPTIONS...]
    local label=$1 w a i j hpc=() waits=() s t grown
    shift
    w=$(cluster_workdir "citizen-$label")
    seq 1 800 | sed 's|.*|sleep 0.5|' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    a=$(as_user -C "$w" sbatch --parsable -N 1 --exclusive -t 3 --htc=tasks.txt "$@" --wrap=: | cut -d';' -f1)
    for ((i = 0; i < 200; i++)); do
        [[ $(field "$a" JobState) == RUNNING ]] && break
        sleep 0.1
    done
    sleep 5
    for i in 1 2 3 4 5 6; do
        hpc+=("$(as_user -C "$w" sbatch --parsable -N 1 --exclusive --wrap='sleep 20' | cut -d';' -f1)")
        sleep 2
    done
    for j in "${hpc[@]}" "$a"; do wait_job "$j" 600 >/dev/null; done
    grown=$(grep -o 'grow: submitted job [0-9]*' "$w/slurm-$a.out" | awk '{print $NF}')
    for j in $grown; do wait_job "$j" 300 >/dev/null; done
    for j in "${hpc[@]}"; do
        s=$(secs "$(field "$j" SubmitTime)")
        t=$(secs "$(field "$j" StartTime)")
        waits+=($((t - s)))
    done
    printf '%-10s HPC waits (s): %s  mean %s  max %s   run: %s   grown jobs: %s\n' "$label" "${waits[*]}" \
        "$(printf '%s\n' "${waits[@]}" | awk '{s += $1} END {printf "%.1f", s / NR}')" \
        "$(printf '%s\n' "${waits[@]}" | sort -n | tail -1)" \
        "$(grep -o 'in [0-9.ms]* (' "$w/slurm-$a.out" | tail -1 | tr -d '(')" "$(echo $grown)"
}

scenario fixed
scenario grow --htc-grow=3:1:2
"$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
