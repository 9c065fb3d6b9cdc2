#!/usr/bin/env bash
# What the ledger's replica costs (the snapshot and journal a Slurm job keeps in the submit
# directory while its ledger is on the leader's node), side by side in one run: the same task
# file with the ledger in the run directory (`plain`) and with `--ledger-dir` (`replica`),
# alternating, REPEAT times each. Per run: wall time, the leader's CPU per task, the replica's
# bytes per task, and how long `htc status` takes afterwards (for `replica`: rebuilding the
# ledger from the replica, as on a login node).
#
#   bench/replica.sh                       # 1,000,000 tasks, --exec none, 3 repeats
#   TASKS=200000 REPEAT=5 bench/replica.sh
#
# Env: TASKS (1000000), REPEAT (3), EXEC (none: the scheduling path alone, so the ledger's
#      share shows; `real` runs `true`), AGENTS (4), HTC (target/dist/htc), WORK (scratch,
#      deleted at the end unless KEEP=1), OUT (bench/results/replica-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
TASKS=${TASKS:-1000000}
REPEAT=${REPEAT:-3}
EXEC=${EXEC:-none}
AGENTS=${AGENTS:-4}
HTC=${HTC:-$ROOT/target/dist/htc}
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/replica-$STAMP.txt}
WORK=${WORK:-$(mktemp -d /tmp/htc-replica.XXXXXX)}
mkdir -p "$WORK"
trap '[[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"' EXIT
exec > >(tee "$OUT") 2>&1

[[ -x $HTC ]] || (cd "$ROOT" && cargo build --profile dist -p node-agent)
now() { date +%s.%N; }
calc() { awk "BEGIN { printf \"%.3f\", $1 }"; }
field() { grep -o "\"$1\":[0-9.e+-]*" | head -n 1 | cut -d: -f2; }

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "tasks: $TASKS x true, --exec $EXEC, --agents $AGENTS; load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
seq 1 "$TASKS" | sed 's/.*/true/' >"$WORK/tasks.txt"
printf '%-8s %3s %9s %16s %12s %20s %10s\n' mode rep "wall s" "leader us/task" "replica MB" "snapshot bytes/task" "status s"
for rep in $(seq 1 "$REPEAT"); do
    for mode in plain replica; do
        d=$WORK/$mode-$rep
        mkdir -p "$d/node"
        extra=()
        [[ $mode == replica ]] && extra=(--ledger-dir "$d/node")
        t0=$(now)
        (cd "$d" && "$HTC" run "$WORK/tasks.txt" --exec "$EXEC" --agents "$AGENTS" -q "${extra[@]}")
        t1=$(now)
        run=$(ls -d "$d"/.htc/*)
        json=$(cd "$d" && "$HTC" status --json)
        s0=$(now)
        (cd "$d" && "$HTC" status >/dev/null)
        s1=$(now)
        if [[ $mode == replica ]]; then
            [[ -z $(ls -A "$d/node") ]] || { echo "the node-local ledger was not removed"; exit 1; }
            bytes=$(du -sb "$run/ledger" | cut -f1)
            snap=$(stat -c %s "$(ls -v "$run"/ledger/snapshot.* | tail -n 1)")
        else
            bytes=0 snap=0
        fi
        [[ $(field done <<<"$json") == "$TASKS" ]] || { echo "not every task done: $json"; exit 1; }
        printf '%-8s %3s %9s %16s %12s %20s %10s\n' "$mode" "$rep" "$(calc "$t1 - $t0")" \
            "$(field leader_cpu_us_per_task <<<"$json")" "$(calc "$bytes / 1048576")" \
            "$(calc "$snap / $TASKS")" "$(calc "$s1 - $s0")"
        rm -rf "$d"
    done
done
echo "results: $OUT"
