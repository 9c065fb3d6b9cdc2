#!/usr/bin/env bash
# What enforcing `mem=` costs and what it buys, the two ways side by side (`--mem-limit cgroup`:
# a memory cgroup per slot, the spawning thread stepping into it for each spawn; `--mem-limit
# watch`: the resident memory of every such task's process group every 100 ms):
#   1. throughput: N tasks `true`, with `[mem=64M]` under each way, and without `mem=` at all
#      (nothing to enforce), median tasks/s over the repeats;
#   2. overshoot: a task that allocates 2 GiB as fast as it can against `mem=100M`: the most it
#      held before it was stopped (the peak the cgroup saw, or the resident memory the watch saw),
#      median over the repeats.
# The cgroup way needs a memory cgroup hierarchy this user may write to (root on cgroup v1 here).
#
#   bench/memlimit.sh
#   N=50000 REPEAT=5 bench/memlimit.sh
#
# Env: N (20000), REPEAT (3), HTC (target/dist/htc), OUT (bench/results/memlimit-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
N=${N:-20000}
REPEAT=${REPEAT:-3}
HTC=${HTC:-$ROOT/target/dist/htc}
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/memlimit-$STAMP.txt}
WORK=$(mktemp -d /tmp/htc-memlimit.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
exec > >(tee "$OUT") 2>&1

[[ -x $HTC ]] || (cd "$ROOT" && cargo build --profile dist -p node-agent)
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "kernel: $(uname -r)  memory cgroup: $(grep -E '(^|[:,])memory[:,]|^0::' /proc/self/cgroup | head -1)"
seq 1 "$N" | sed 's/.*/true/' >"$WORK/plain.txt"
seq 1 "$N" | sed 's/.*/[mem=64M] true/' >"$WORK/mem.txt"
echo "[mem=100M retries=0] perl -e '\$x = \"a\" x (2048 << 20); sleep 5'" >"$WORK/hog.txt"

# Tasks per second of one run: FILE ARGS...
rate() {
    local file=$1 dir t0 t1
    shift
    dir=$(mktemp -d "$WORK/run.XXXXXX")
    cp "$WORK/$file" "$dir/tasks.txt"
    t0=$(date +%s.%N)
    (cd "$dir" && "$HTC" run tasks.txt -q "$@" >/dev/null)
    t1=$(date +%s.%N)
    rm -rf "$dir"
    awk -v n="$N" -v a="$t0" -v b="$t1" 'BEGIN { print n / (b - a) }' 
}

# MiB the hog held when stopped: ARGS...
overshoot() {
    local dir
    dir=$(mktemp -d "$WORK/hog.XXXXXX")
    cp "$WORK/hog.txt" "$dir/tasks.txt"
    (cd "$dir" && "$HTC" run tasks.txt -q "$@" >/dev/null) || true
    (cd "$dir" && "$HTC" status) | grep -o 'out of memory ([0-9]*' | grep -o '[0-9]*$'
    rm -rf "$dir"
}

declare -A r o
for ((i = 1; i <= REPEAT; i++)); do
    r[plain]+="$(rate plain.txt) "
    r[cgroup]+="$(rate mem.txt --mem-limit cgroup) "
    r[watch]+="$(rate mem.txt --mem-limit watch) "
    o[cgroup]+="$(overshoot --mem-limit cgroup) "
    o[watch]+="$(overshoot --mem-limit watch) "
done

echo
printf '%-34s %12s %10s   %s\n' "way" "tasks/s" "vs plain" "all runs"
base=$(tr ' ' '\n' <<<"${r[plain]}" | grep . | median)
for k in plain cgroup watch; do
    m=$(tr ' ' '\n' <<<"${r[$k]}" | grep . | median)
    label=$k
    [[ $k == plain ]] && label="no mem= (nothing to enforce)"
    [[ $k != plain ]] && label="[mem=64M], --mem-limit $k"
    printf '%-34s %12.0f %9.2fx   %s\n' "$label" "$m" "$(awk -v a="$m" -v b="$base" 'BEGIN { print a / b }')" "$(printf '%.0f ' ${r[$k]})"
done
echo
printf '%-34s %12s   %s\n' "a 2 GiB hog against mem=100M" "MiB held" "all runs"
for k in cgroup watch; do
    m=$(tr ' ' '\n' <<<"${o[$k]}" | grep . | median)
    printf '%-34s %12s   %s\n' "--mem-limit $k" "$m" "${o[$k]}"
done
echo "results: $OUT"
