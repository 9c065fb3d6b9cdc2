#!/usr/bin/env bash
# Long tasks without hints at the front of a file (issue 24, finding 7): LONGN tasks of LONG s
# ahead of SHORTN of SHORT s, on AGENTS local agents of CORES cores. Every agent queues the front
# of its even share, so the first holds every long task; what it has not started moves to agents
# that run out of work (a Recall). Side by side in each round: htc, htc --no-steal (no stealing,
# no recall), an older build (HTC_BASE, e.g. one before the recall), GNU parallel with one queue
# for all cores (a list schedule: what a single shared queue gets), against the bound
# max(core-seconds / cores, LONG).
#
#   bench/tail.sh                                  # 16 x 2 s + 200 x 0.04 s, 4 x 2 cores, 3 rounds
#   LONG=5 SHORT=0.1 bench/tail.sh                 # the issue's own file (bound 12.5 s)
#   HTC_BASE=/tmp/base/htc bench/tail.sh           # and an older build
#
# Env: LONG (2), LONGN (16), SHORT (0.04), SHORTN (200), AGENTS (4), CORES (2), ROUNDS (3),
#      HTC (target/dist/htc), HTC_BASE, OUT (bench/results/tail-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
LONG=${LONG:-2} LONGN=${LONGN:-16} SHORT=${SHORT:-0.04} SHORTN=${SHORTN:-200}
AGENTS=${AGENTS:-4} CORES=${CORES:-2} ROUNDS=${ROUNDS:-3}
HTC=${HTC:-$ROOT/target/dist/htc}
HTC_BASE=${HTC_BASE:-}
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/tail-$STAMP.txt}
WORK=$(mktemp -d /tmp/htc-tail.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
exec > >(tee "$OUT") 2>&1

[[ -x $HTC ]] || (cd "$ROOT" && cargo build --profile dist -p node-agent)
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

slots=$((AGENTS * CORES))
{
    for ((i = 0; i < LONGN; i++)); do echo "sleep $LONG"; done
    for ((i = 0; i < SHORTN; i++)); do echo "sleep $SHORT"; done
} >"$WORK/tasks.txt"
bound=$(awk -v l="$LONG" -v ln="$LONGN" -v s="$SHORT" -v sn="$SHORTN" -v c="$slots" \
    'BEGIN { b = (l * ln + s * sn) / c; if (l > b) b = l; printf "%.2f", b }')
echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "workload: $LONGN x sleep $LONG, then $SHORTN x sleep $SHORT, no hints; --agents $AGENTS --cores-per-agent $CORES"
echo "bound: $bound s"

contenders=(htc htc-no-steal)
[[ -n $HTC_BASE ]] && contenders+=(htc-base)
command -v parallel >/dev/null && contenders+=(parallel)
run() { # CONTENDER DIR
    local layout=(--agents "$AGENTS" --cores-per-agent "$CORES")
    case $1 in
    htc) (cd "$2" && "$HTC" run "$WORK/tasks.txt" -q "${layout[@]}") ;;
    htc-no-steal) (cd "$2" && "$HTC" run "$WORK/tasks.txt" -q "${layout[@]}" --no-steal) ;;
    htc-base) (cd "$2" && "$HTC_BASE" run "$WORK/tasks.txt" -q "${layout[@]}") ;;
    parallel) parallel -j "$slots" <"$WORK/tasks.txt" ;;
    esac
}

printf '%-14s %5s %11s %12s\n' contender round "makespan s" "x bound"
for ((r = 1; r <= ROUNDS; r++)); do
    for c in "${contenders[@]}"; do
        d=$WORK/$c-$r
        mkdir -p "$d"
        t0=$(date +%s.%N)
        run "$c" "$d" >/dev/null 2>&1 || echo "($c failed)"
        t1=$(date +%s.%N)
        awk -v c="$c" -v r="$r" -v a="$t0" -v b="$t1" -v bd="$bound" \
            'BEGIN { printf "%-14s %5s %11.2f %12.3f\n", c, r, b - a, (b - a) / bd }'
    done
done | tee "$WORK/table.txt"
for c in "${contenders[@]}"; do
    m=$(awk -v p="$c" '$1 == p { print $3 }' "$WORK/table.txt" | median)
    echo "median $c: $m s = $(awk -v m="$m" -v b="$bound" 'BEGIN { printf "%.3f", m / b }') x the bound"
done
