#!/usr/bin/env bash
# The leader's CPU per task with real agents and real `true` tasks (issue 25), layout by layout,
# side by side with an older build, and beside it what the cost depends on: results per report
# (mean, p99) and how long a result takes from its end to the leader (p50, p99).
#
#   bench/leader-cost.sh
#   HTC_BASE=/tmp/base/htc ROUNDS=5 bench/leader-cost.sh
#   LAYOUTS="|--agents 16 --cores-per-agent 1" EXEC_NONE=1 bench/leader-cost.sh
#
# Env: TASKS (50000), ROUNDS (3), LAYOUTS ('|'-separated `htc run` option sets; default: the
#      default layout, 16 one-slot agents, 8 one-slot agents in instances of 4), HTC
#      (target/dist/htc), HTC_BASE (an older htc, its htc-agent beside it; side by side),
#      EXEC_NONE (1: each layout also with --exec none, the synthetic path), LOW_TASKS (30:
#      the low-rate run, `sleep 0.3` one after another on one slot; 0: none), OUT
#      (bench/results/leader-cost-<date>.txt).
# Builds run in turn within each round, so background noise hits them alike; medians reported.
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
TASKS=${TASKS:-50000}
ROUNDS=${ROUNDS:-3}
LAYOUTS=${LAYOUTS:-"|--agents 16 --cores-per-agent 1|--agents 8 --cores-per-agent 1 --instance-agents 4"}
HTC=${HTC:-$ROOT/target/dist/htc}
HTC_BASE=${HTC_BASE:-}
EXEC_NONE=${EXEC_NONE:-0}
LOW_TASKS=${LOW_TASKS:-30}
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
bench_setup leader-cost

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "workload: $TASKS x true, $ROUNDS rounds; htc: $HTC${HTC_BASE:+; base: $HTC_BASE}"
awk -v n="$TASKS" 'BEGIN { for (i = 0; i < n; i++) print "true" }' >"$WORK/t.txt"
for ((i = 0; i < LOW_TASKS; i++)); do echo "sleep 0.3"; done >"$WORK/low.txt"

# One run: prints "us_per_task rate reports_mean reports_p99 delay_p50_ms delay_p99_ms" (the
# last four "-" where the build does not keep them).
run() {
    local htc=$1 file=$2 dir
    shift 2
    dir=$(mktemp -d "$WORK/run.XXXXXX")
    cp "$WORK/$file" "$dir/"
    # shellcheck disable=SC2068
    (cd "$dir" && HTC_SITE_CONFIG=/dev/null "$htc" run "$file" $@ >/dev/null 2>&1)
    (cd "$dir" && "$htc" status --json) | python3 -c '
import json, sys
j = json.load(sys.stdin)
g = lambda k: "-" if j.get(k) is None else "%.2f" % j[k]
print("%.2f %.0f %s %s %s %s" % (j["leader_cpu_us_per_task"], j["rate"], g("results_per_report"),
      g("results_per_report_p99"), g("result_delay_ms_p50"), g("result_delay_ms_p99")))'
    rm -rf "$dir"
}

median_cols() {
    python3 -c '
import sys, statistics
rows = [l.split() for l in sys.stdin if l.strip()]
out = []
for c in range(len(rows[0])):
    v = [r[c] for r in rows]
    out.append("-" if "-" in v else "%.2f" % statistics.median(map(float, v)))
# The us/task of every round too: this machine swings by more than most changes gain.
print("  ".join(out) + "  [" + " ".join(r[0] for r in rows) + "]")'
}

builds=("$HTC")
[[ -n $HTC_BASE ]] && builds+=("$HTC_BASE")
IFS='|' read -r -a layouts <<<"$LAYOUTS"
sets=()
for l in "${layouts[@]}"; do
    sets+=("$l")
    [[ $EXEC_NONE == 1 ]] && sets+=("$l --exec none")
done

echo
printf '%-62s %-8s %s\n' "layout (htc run ...)" "build" "us/task  tasks/s  results/report (mean p99)  result delay ms (p50 p99)  [us/task by round]"
for s in "${sets[@]}"; do
    for i in "${!builds[@]}"; do : >"$WORK/rows.$i"; done
    for ((r = 1; r <= ROUNDS; r++)); do
        for i in "${!builds[@]}"; do
            # shellcheck disable=SC2086
            run "${builds[$i]}" t.txt $s >>"$WORK/rows.$i"
        done
    done
    for i in "${!builds[@]}"; do
        name=$( ((i == 0)) && echo new || echo base)
        printf '%-62s %-8s %s\n' "${s:-(default)}" "$name" "$(median_cols <"$WORK/rows.$i")"
    done
done

((LOW_TASKS > 0)) || exit 0
echo
echo "low rate: $LOW_TASKS x sleep 0.3 on one slot (--agents 1 --cores-per-agent 1), one round"
for i in "${!builds[@]}"; do
    name=$( ((i == 0)) && echo new || echo base)
    printf '%-62s %-8s %s\n' "(low rate)" "$name" "$(run "${builds[$i]}" low.txt --agents 1 --cores-per-agent 1)"
done
