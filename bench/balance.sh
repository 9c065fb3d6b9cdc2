#!/usr/bin/env bash
# Queues under load (the backfill patent's S2, papers/001): one instance is loaded (its node runs
# every task 3x slower) while the others would idle. With the partition's stealing, an idle
# instance takes from the largest remaining share (only what it can start, after its own); with
# `--no-steal` every instance runs its own share and no more. Side by side in each round: the
# makespan, how many tasks the slow agent ran, and the bound (all agents busy to the end).
#
#   bench/balance.sh                  # 400 tasks, 4 agents, 3 rounds
#   TASKS=800 REPEAT=5 bench/balance.sh
#
# Env: TASKS (400), AGENTS (4), REPEAT (3), HTC (target/dist/htc), OUT
#      (bench/results/balance-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
TASKS=${TASKS:-400}
AGENTS=${AGENTS:-4}
REPEAT=${REPEAT:-3}
HTC=${HTC:-$ROOT/target/dist/htc}
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/balance-$STAMP.txt}
WORK=$(mktemp -d /tmp/htc-balance.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
exec > >(tee "$OUT") 2>&1

[[ -x $HTC ]] || (cd "$ROOT" && cargo build --profile dist -p node-agent)
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "workload: $TASKS tasks hinted 100 ms; on agent 0 each sleeps 0.3 s, elsewhere 0.1 s; --agents $AGENTS --cores-per-agent 1"
for ((i = 0; i < TASKS; i++)); do
    echo '[runtime=100ms] if [ "$HTC_AGENT" = 0 ]; then sleep 0.3; else sleep 0.1; fi'
done >"$WORK/tasks.txt"
bound=$(awk -v n="$TASKS" -v a="$AGENTS" 'BEGIN { printf "%.2f", n / (1 / 0.3 + (a - 1) / 0.1) }')
echo "bound (every agent busy to the end): $bound s; agent 0 alone with an even share: $(awk -v n="$TASKS" -v a="$AGENTS" 'BEGIN { printf "%.2f", n / a * 0.3 }') s"

printf '%-10s %3s %11s %16s\n' mode rep "makespan s" "tasks on agent 0"
for ((r = 1; r <= REPEAT; r++)); do
    for mode in steal no-steal; do
        d=$WORK/$mode-$r
        mkdir -p "$d"
        flag=()
        [[ $mode == no-steal ]] && flag=(--no-steal)
        t0=$(date +%s.%N)
        (cd "$d" && "$HTC" run "$WORK/tasks.txt" -q --agents "$AGENTS" --cores-per-agent 1 "${flag[@]}")
        t1=$(date +%s.%N)
        on0=$(cd "$d" && "$HTC" log --format json | grep -c '"Agent":0}' || true)
        printf '%-10s %3s %11.2f %16s\n' "$mode" "$r" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$on0"
    done
done | tee "$WORK/table.txt"
for mode in steal no-steal; do
    m=$(awk -v p=$mode '$1 == p { print $3 }' "$WORK/table.txt" | median)
    z=$(awk -v p=$mode '$1 == p { print $4 }' "$WORK/table.txt" | median)
    echo "median $mode: makespan $m s, $z tasks on the slow agent"
done
