#!/usr/bin/env bash
# Memory-aware scheduling side by side: the same mixed workload of tasks that really hold memory
# (perl touching every page it asks for) under `--mem-policy backfill` (reservations, small tasks
# around them), `fcfs` (strict order) and `ignore` (memory not looked at: tasks start as cores
# allow). Reports the makespan, the peak resident memory of the tasks (sampled every 50 ms), when
# the big tasks ended, and the most memory committed at once by the runs' records, median over
# the repeats.
#
# The workload is the patent's case (papers/001, S1): a long task holds half the budget, big
# tasks that need more than the other half wait for it, and a stream of small short tasks could
# use the idle cores meanwhile.
#
#   bench/memory.sh                       # 3 repeats
#   REPEAT=5 bench/memory.sh
#
# Env: REPEAT (3), SMALL (150), BIG (3), SMALL_HOLD (150: MiB each small task touches; touching
#      costs CPU, which 8 slots on a 2-CPU machine share), HTC (target/dist/htc), OUT
#      (bench/results/memory-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
REPEAT=${REPEAT:-3}
BUDGET=4G
CORES=8
SMALL=${SMALL:-150}
BIG=${BIG:-3}
SMALL_HOLD=${SMALL_HOLD:-150}
HTC=${HTC:-$ROOT/target/dist/htc}
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/memory-$STAMP.txt}
WORK=$(mktemp -d /tmp/htc-memory.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
exec > >(tee "$OUT") 2>&1

[[ -x $HTC ]] || (cd "$ROOT" && cargo build --profile dist -p node-agent)
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "workload: 1 long task (mem=2G, holds 1000 MiB for 10 s), $BIG big ones (mem=3G, hold 1500 MiB for"
echo "3 s), $SMALL small ones (mem=256M, hold $SMALL_HOLD MiB for 0.5 s), in that order, with those runtime hints;"
echo "one agent, --cores-per-agent $CORES (the tasks mostly sleep), --mem-per-agent $BUDGET"
hold() { echo "perl -e 'my \$x; vec(\$x, ($1 << 20) - 1, 8) = 1; select(undef, undef, undef, $2)' htc-membench"; }
{
    echo "[mem=2G runtime=10s] $(hold 1000 10)"
    for ((i = 0; i < BIG; i++)); do echo "[mem=3G runtime=3s] $(hold 1500 3)"; done
    for ((i = 0; i < SMALL; i++)); do echo "[mem=256M runtime=500ms] $(hold "$SMALL_HOLD" 0.5)"; done
} >"$WORK/tasks.txt"

# Sums the resident memory of the workload's processes every 50 ms; prints the peak in MiB.
sample() {
    local peak=0 kb
    while [[ ! -e $WORK/stop ]]; do
        kb=$({ ps -C perl -o rss=,args= || true; } | awk '/htc-membench/ { s += $1 } END { print s + 0 }')
        ((kb > peak)) && peak=$kb
        sleep 0.05
    done
    echo $((peak / 1024))
}

printf '%-9s %3s %11s %10s %16s %15s\n' policy rep "makespan s" "peak MiB" "big tasks end s" "committed MiB"
for ((r = 1; r <= REPEAT; r++)); do
    for policy in backfill fcfs ignore; do
        d=$WORK/$policy-$r
        mkdir -p "$d"
        rm -f "$WORK/stop"
        sample >"$WORK/peak" &
        sampler=$!
        t0=$(date +%s.%N)
        (cd "$d" && "$HTC" run "$WORK/tasks.txt" -q --cores-per-agent "$CORES" --mem-per-agent "$BUDGET" \
            --mem-policy "$policy") || echo "($policy: htc run exited $?)"
        t1=$(date +%s.%N)
        touch "$WORK/stop"
        wait "$sampler"
        # When the last big task (ids 2..BIG+1) ended, from the run's first start.
        big_end=$(cd "$d" && "$HTC" log --format tsv | awk -F'\t' -v big="$BIG" '
            NR > 1 { s = $3 + 0; e = s + $4; if (first == "" || s < first) first = s
                     if ($1 >= 2 && $1 <= big + 1 && e > last) last = e }
            END { printf "%.2f", last - first }')
        # The most memory the running tasks' mem= added up to at once. The log has millisecond
        # times, each rounded: an end within 2 ms of a start is taken as before it (the leader
        # commits a task's memory only after the result of the one before arrived).
        committed=$(cd "$d" && "$HTC" log --format tsv | awk -F'\t' -v big="$BIG" '
            NR > 1 { m = ($1 == 1) ? 2048 : ($1 <= big + 1) ? 3072 : 256
                     printf "%.6f 1 %d\n%.6f 0 %d\n", $3, m, $3 + $4 - 0.002, -m }' |
            sort -n -k1,1 -k2,2 | awk '{ c += $3; if (c > max) max = c } END { print max }')
        printf '%-9s %3s %11.2f %10s %16s %15s\n' "$policy" "$r" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
            "$(cat "$WORK/peak")" "$big_end" "$committed"
    done
done | tee "$WORK/table.txt"
for policy in backfill fcfs ignore; do
    m=$(awk -v p=$policy '$1 == p { print $3 }' "$WORK/table.txt" | median)
    pk=$(awk -v p=$policy '$1 == p { print $4 }' "$WORK/table.txt" | median)
    be=$(awk -v p=$policy '$1 == p { print $5 }' "$WORK/table.txt" | median)
    cm=$(awk -v p=$policy '$1 == p { print $6 }' "$WORK/table.txt" | median)
    echo "median $policy: makespan $m s, peak $pk MiB resident, last big task ends at $be s, at most $cm MiB committed"
done
