#!/usr/bin/env bash
# Nodes given back at an uneven run's tail (issue 53): idle node-seconds held during the tail,
# and the wait of a plain job queued behind the run, with the nodes given back (the default) and
# kept to the end (--htc-keep-nodes), alternating, ROUNDS times each, on one 4-node cluster.
#
# The run: 4 nodes x 2 CPUs, 56 x `sleep 1` and two `sleep 40` (the file's first lines: the
# leader's node, n1, runs both). The short ones are done after ~10 s (the tail is longer than the
# backfill interval, 30 s, at whose pass Slurm starts the plain job on nodes given back); the tail is the rest of
# the long ones, on one node. A plain 2-node job (`sleep 5`) is submitted 2 s after the run
# starts and queues behind it.
#
# Measured per run: the tail (from the last short task's end to the last task's end, from the
# tasks' own timestamps), and for each node but the tail's, how long the job held it idle in the
# tail (until Slurm shows it no longer in the job's node list, looked at every 0.2 s, or the
# job's end); the plain job's wait is its StartTime - SubmitTime (`scontrol show job`).
#
#   bench/give-back.sh [ROUNDS]      (as root, after cargo build --release --workspace)
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
rounds=${1:-3}
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-bench}
export HTC_CLUSTER_CTLD_PORT=${HTC_CLUSTER_CTLD_PORT:-6827}
export HTC_CLUSTER_SLURMD_PORT=${HTC_CLUSTER_SLURMD_PORT:-17301}
# shellcheck source=/dev/null
. "$root/tests/cluster/lib.sh"

out=$root/bench/results/give-back-$(date -u +%Y%m%d-%H%M%S).txt
mkdir -p "$root/bench/results"
exec > >(tee "$out") 2>&1

"$root/tests/cluster/start-cluster.sh" -n 4 -m netns -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
install_htc >/dev/null
echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "cluster: 4 nodes x 2 CPUs (network namespaces), Slurm $HTC_CLUSTER_RELEASE"

field() { # JOB KEY -> value from scontrol show job
    _htc_field "$(_htc_job_record "$1")" "$2"
}
secs() { date -d "$1" +%s; }

one() { # LABEL [SBATCH OPTIONS...] -> "tail_s idle_node_s wait_s"
    local label=$1 w j p t0 t1 end tail idle wait node held last
    shift
    w=$(cluster_workdir "giveback-$label")
    {
        for _ in 1 2; do echo 'sleep 40; echo "L $SLURMD_NODENAME $(date +%s.%N)" >> ends.txt'; done
        for _ in $(seq 56); do echo 'sleep 1; echo "S $SLURMD_NODENAME $(date +%s.%N)" >> ends.txt'; done
    } >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(as_user -C "$w" sbatch --parsable -N 4 --exclusive --htc=tasks.txt "$@" --wrap=: | cut -d';' -f1)
    wait_leader "$w" "$j" || { echo "$label: no leader" >&2; return 1; }
    sleep 2
    p=$(as_user -C "$w" sbatch --parsable -N 2 --wrap='sleep 5' | cut -d';' -f1)
    # When each node left the job's node list (seconds since the epoch, to 0.2 s).
    : >"$w/left.txt"
    local prev="n1 n2 n3 n4" now_nodes n
    while [[ $(job_state "$j") == RUNNING || $(job_state "$j") == RESIZING ]]; do
        now_nodes=$(cluster_cmd scontrol show hostnames "$(field "$j" NodeList)" 2>/dev/null | xargs)
        for n in $prev; do
            [[ " $now_nodes " == *" $n "* ]] || echo "$n $(date +%s.%N)" >>"$w/left.txt"
        done
        [[ -n $now_nodes ]] && prev=$now_nodes
        sleep 0.2
    done
    wait_job "$j" 120 >/dev/null
    wait_job "$p" 120 >/dev/null
    end=$(secs "$(field "$j" EndTime)")
    t0=$(awk '$1 == "S" { if ($3 > m) m = $3 } END { print m }' "$w/ends.txt")
    t1=$(awk '{ if ($3 > m) m = $3 } END { print m }' "$w/ends.txt")
    tail=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    idle=0
    for node in n1 n2 n3 n4; do
        grep -q "^L $node " "$w/ends.txt" && continue # the tail's node
        last=$(awk -v n="$node" '$2 == n { if ($3 > m) m = $3 } END { print m + 0 }' "$w/ends.txt")
        held=$(awk -v n="$node" '$1 == n { print $2; exit }' "$w/left.txt")
        held=${held:-$end}
        idle=$(awk -v i="$idle" -v h="$held" -v l="$last" -v a="$t0" 'BEGIN { s = (l > a ? l : a); d = h - s; printf "%.1f", i + (d > 0 ? d : 0) }')
    done
    wait=$(($(secs "$(field "$p" StartTime)") - $(secs "$(field "$p" SubmitTime)")))
    echo "$tail $idle $wait"
}

printf '%-10s %6s %14s %18s %12s\n' mode "tail s" "idle node-s" "idle per tail s" "plain wait s"
declare -A all
for ((r = 1; r <= rounds; r++)); do
    for mode in given kept; do
        opts=()
        [[ $mode == kept ]] && opts=(--htc-keep-nodes)
        read -r tail idle wait < <(one "$mode-$r" "${opts[@]}") || continue
        ratio=$(awk -v i="$idle" -v t="$tail" 'BEGIN { printf "%.2f", (t > 0 ? i / t : 0) }')
        printf '%-10s %6s %14s %18s %12s\n' "$mode" "$tail" "$idle" "$ratio" "$wait"
        all[$mode]+="$ratio $wait;"
    done
done
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
for mode in given kept; do
    echo "$mode: median idle node-s per tail s $(tr ';' '\n' <<<"${all[$mode]}" | awk 'NF { print $1 }' | median)," \
        "median plain wait $(tr ';' '\n' <<<"${all[$mode]}" | awk 'NF { print $2 }' | median) s"
done
"$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
echo "report: $out"
