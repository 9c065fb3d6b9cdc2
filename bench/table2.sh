#!/usr/bin/env bash
# HFlow's Table 2 (papers/000 §4.3) on the 4-node test cluster: the same job of short tasks four
# times — no fault; the leader killed mid-run and its node-local ledger removed, then `htc
# resume`; 10% of the agents killed mid-run, one of them a relay of a deeper tree; 10% of the
# running tasks killed. Per run:
# submitted, re-submitted (starts beyond one per task), successful, lost (must be 0), the tasks
# running at the fault, and re-runs of tasks that had ended before it.
#
#   bench/table2.sh [TASKS] [TASK_SECONDS]   (as root, after cargo build --profile dist --workspace;
#                                             default 50000 tasks of sleep 0.05)
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
N=${1:-50000}
TASK_S=${2:-0.05}
# 4 nodes x 8 agents of one core: an instance per node, headed by agents 0, 8, 16, 24 (the
# others its members). Fan-out 2 puts heads 0 and 8 below the leader and 16 and 24 below head
# 0: killing agent 0 kills a relay (and an instance head) whose children must rejoin.
NODES=4
PER_NODE=8
FANOUT=2
RELAY=0
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-bench}
export HTC_CLUSTER_CTLD_PORT=${HTC_CLUSTER_CTLD_PORT:-6827}
export HTC_CLUSTER_SLURMD_PORT=${HTC_CLUSTER_SLURMD_PORT:-17301}
# shellcheck source=/dev/null
. "$root/tests/cluster/lib.sh"

out=$root/bench/results/table2-$(date -u +%Y%m%d-%H%M%S).txt
mkdir -p "$root/bench/results"
exec > >(tee "$out") 2>&1

"$root/tests/cluster/start-cluster.sh" -n "$NODES" -m netns -c "$PER_NODE" >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
HTC_PROFILE=dist install_htc
bin=$HTC_CLUSTER_DIR/htc-bin

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "cluster: $NODES nodes (network namespaces) x $PER_NODE agents of 1 core, fan-out $FANOUT; $N tasks of sleep $TASK_S"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"

submit() { # DIR ARGS... -> job id
    local dir=$1 o
    shift
    o=$(as_user -C "$dir" sbatch --parsable "$@" 2>&1) || { echo "$o" >&2; return 1; }
    echo "$o" | tail -n 1 | cut -d';' -f1
}

# Processes of job J whose command line matches PATTERN (the leader, agents), found through
# their environment: every node's processes are visible from here.
of_job() { # JOB PATTERN
    local p
    for p in $(pgrep -f "$2"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_JOB_ID=$1" && echo "$p"
    done
}

# The agent proper (the child of its guard) with id A of job J: under Slurm, its step task rank.
agent_pid() { # JOB A
    local p pp
    for p in $(of_job "$1" 'htc-agent work'); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_PROCID=$2" || continue
        pp=$(awk '/^PPid:/ { print $2 }' "/proc/$p/status" 2>/dev/null)
        tr '\0' ' ' <"/proc/$pp/cmdline" 2>/dev/null | grep -q 'htc-agent work' && echo "$p"
    done
}

running_tasks() { pgrep -u "$HTC_CLUSTER_USER" -fx "sleep $TASK_S" | wc -l; }

# Every task writes "id attempt start" when it starts and "id attempt end" when it ends.
start_job() { # NAME -> "workdir job"
    local w j
    w=$(cluster_workdir "$1")
    seq 1 "$N" | sed "s|.*|echo \"\$HTC_TASK_ID \$HTC_ATTEMPT start\" >> log.txt; sleep $TASK_S; echo \"\$HTC_TASK_ID \$HTC_ATTEMPT end\" >> log.txt|" >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" -N "$NODES" --exclusive --htc=tasks.txt --htc-agents-per-node="$PER_NODE" --htc-fanout="$FANOUT" \
        --htc-retries=2 --wrap=:) || return 1
    echo "$w $j"
}

wait_for_share() { # WORKDIR FRACTION_PERCENT
    local i
    for ((i = 0; i < 6000; i++)); do
        local n
        n=$(grep -c ' end$' "$1/log.txt" 2>/dev/null) || n=0
        ((n >= N * $2 / 100)) && return 0
        sleep 0.1
    done
    return 1
}

printf '%-22s %9s %13s %10s %5s %12s %18s %8s\n' run submitted re-submitted successful lost "running@fault" "re-runs of ended" "wall s"

row() { # LABEL WORKDIR JOB RUNNING_AT_FAULT ENDED_BEFORE_FILE T0
    local label=$1 w=$2 j=$3 running=$4 ended=$5 t0=$6 starts done rerun_ended
    starts=$(grep -c ' start$' "$w/log.txt")
    done=$(as_user -C "$w" "$bin/htc" status "$j" --json | grep -o '"done":[0-9]*' | cut -d: -f2)
    rerun_ended=0
    if [[ -s $ended ]]; then
        # A task that had ended before the fault and started again after it.
        rerun_ended=$(awk 'NR == FNR { e[$1] = 1; next } $3 == "start" && ($1 in e) { s[$1]++ } END { n = 0; for (i in s) if (s[i] > 1) n++; print n }' \
            "$ended" "$w/log.txt")
    fi
    printf '%-22s %9d %13d %10d %5d %12s %18s %8.1f\n' "$label" "$N" $((starts - N)) "$done" $((N - done)) "$running" "$rerun_ended" \
        "$(_htc_elapsed "$t0")"
}

snapshot_ended() { # WORKDIR FILE: tasks whose end was written (not necessarily recorded yet)
    grep ' end$' "$1/log.txt" | cut -d' ' -f1 | sort -u >"$2"
}

# 1. No fault.
t0=$(_htc_usec)
read -r w j < <(start_job nofault) || exit 1
state=$(wait_job "$j" 3600)
row "no fault ($state)" "$w" "$j" - "" "$t0"

# 2. The leader's node lost: the leader killed mid-run (kill -9) and its node-local ledger
# removed, then `htc resume JOBID`, which rebuilds the ledger from the run directory's replica.
t0=$(_htc_usec)
read -r w j < <(start_job leader) || exit 1
wait_for_share "$w" 30
running=$(running_tasks)
snapshot_ended "$w" "$w/ended.txt"
local_ledger=$(sed -n 2p "$w/.htc/$j/ledger/where")
kill -KILL $(of_job "$j" 'htc-agent lead') 2>/dev/null
rm -rf "$(dirname "$local_ledger")"
echo "leader killed; its node-local ledger $local_ledger removed"
state=$(wait_job "$j" 300)
o=$(as_user -C "$w" "$bin/htc" resume "$j" 2>&1)
j2=$(grep -o 'Submitted batch job [0-9]*' <<<"$o" | awk '{ print $4 }')
[[ -n $j2 ]] || { echo "resume failed: $o"; exit 1; }
state2=$(wait_job "$j2" 3600)
row "leader killed ($state/$state2)" "$w" "$j2" "$running" "$w/ended.txt" "$t0"

# 3. 10% of the agents killed mid-run, relay $RELAY among them.
t0=$(_htc_usec)
read -r w j < <(start_job agents) || exit 1
wait_for_share "$w" 30
running=$(running_tasks)
snapshot_ended "$w" "$w/ended.txt"
victims=$RELAY
for a in $(seq $((NODES * PER_NODE - 1)) -1 0); do
    (($(wc -w <<<"$victims") >= (NODES * PER_NODE + 9) / 10)) && break
    [[ $a == "$RELAY" ]] || victims="$victims $a"
done
pids=$(for a in $victims; do agent_pid "$j" "$a"; done)
echo "killing agents $victims: pids" $pids
kill -KILL $pids 2>/dev/null
state=$(wait_job "$j" 3600)
row "agents $victims killed ($state)" "$w" "$j" "$running" "$w/ended.txt" "$t0"
grep -hE "rejoin|relay" "$w/slurm-$j.out" | cut -c1-160 | head -4

# 4. 10% of the running tasks killed.
t0=$(_htc_usec)
read -r w j < <(start_job tasks) || exit 1
wait_for_share "$w" 30
# A task is its shell's process group: killing only `sleep` would let the shell go on and exit 0.
groups_now() { ps -u "$HTC_CLUSTER_USER" -o pgid=,args= | awk -v a="sleep $TASK_S" '{ g = $1; $1 = ""; sub(/^ /, "") } $0 == a { print g }'; }
mapfile -t groups < <(groups_now)
running=${#groups[@]}
# A task lives $TASK_S s, about as long as a look at the process table takes here: look again
# until a tenth of the running tasks were hit.
killed=0
for ((try = 0; try < 500 && killed < (running + 9) / 10; try++)); do
    g=$(groups_now | shuf -n 1)
    [[ -n $g ]] && kill -KILL -- -"$g" 2>/dev/null && killed=$((killed + 1))
done
snapshot_ended "$w" "$w/ended.txt"
echo "killed $killed of $running running tasks"
state=$(wait_job "$j" 3600)
row "10% of tasks killed ($state)" "$w" "$j" "$running" "$w/ended.txt" "$t0"

"$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
echo "results: $out"
