#!/usr/bin/env bash
# How long `htc report` takes on a big run, side by side with a plain read of the same ledger
# (`htc verify` reads every record once) and `htc log` (a row per attempt): the report should cost
# little more than reading the ledger. The run is made with `--exec none` (the scheduling path
# alone: every task succeeds at once), so 10 M tasks take minutes, not hours; its records are as a
# real run's, with the classes of the task file.
#
#   bench/report.sh                        # 10,000,000 tasks, 3 repeats
#   TASKS=1000000 REPEAT=5 bench/report.sh
#
# Env: TASKS (10000000), REPEAT (3), AGENTS (4), HTC (target/dist/htc), WORK (scratch, deleted
#      at the end unless KEEP=1), OUT (bench/results/report-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
TASKS=${TASKS:-10000000}
REPEAT=${REPEAT:-3}
AGENTS=${AGENTS:-4}
HTC=${HTC:-$ROOT/target/dist/htc}
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/report-$STAMP.txt}
WORK=${WORK:-$(mktemp -d /tmp/htc-report.XXXXXX)}
mkdir -p "$WORK"
trap '[[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"' EXIT
exec > >(tee "$OUT") 2>&1

[[ -x $HTC ]] || (cd "$ROOT" && cargo build --profile dist -p node-agent)
now() { date +%s.%N; }
calc() { awk "BEGIN { printf \"%.2f\", $1 }"; }
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "tasks: $TASKS in 4 classes (runtime hints 1s, 10s, 1m, 10m), --exec none, --agents $AGENTS"
awk -v n="$TASKS" 'BEGIN { split("1s 10s 1m 10m", r, " "); split("a b c d", c, " ");
    for (i = 1; i <= n; i++) { k = 1 + i % 4; printf "[class=%s runtime=%s] true\n", c[k], r[k] } }' >"$WORK/tasks.txt"
cd "$WORK"
t0=$(now)
"$HTC" run tasks.txt --exec none --agents "$AGENTS" -q
echo "made the run in $(calc "$(now) - $t0") s; ledger $(du -m .htc/*/ledger.mdb | cut -f1) MB"
run=$(ls .htc)
printf '%-8s %3s %10s %14s\n' what rep "wall s" "max RSS MB"
measure() { # NAME REP CMD...
    local name=$1 rep=$2
    shift 2
    /usr/bin/time -o "$WORK/time" -f '%e %M' "$@" >/dev/null 2>&1
    read -r secs rss <"$WORK/time"
    printf '%-8s %3s %10s %14s\n' "$name" "$rep" "$secs" "$(calc "$rss / 1024")"
}
for ((r = 1; r <= REPEAT; r++)); do
    measure verify "$r" "$HTC" verify "$run"
    measure report "$r" "$HTC" report "$run" -o rep
    measure log "$r" "$HTC" log "$run"
done | tee "$WORK/table.txt"
for w in verify report log; do
    echo "median $w: $(awk -v w=$w '$1 == w { print $3 }' "$WORK/table.txt" | median) s"
done
ls -la rep
