#!/usr/bin/env bash
# Narrow tasks beside a wide one, and an open run (issue 42): the default layout keeps a spawn
# loop per CPU whatever the tasks' widths, where it used to fall back to one loop for all cores.
# Three workloads of TASKS `true` tasks, each build in turn within a round, medians printed:
#   file  — the tasks alone;
#   wide  — the same, then one `[cores=2] true`;
#   open  — `htc run --open`, the tasks added with `htc task add --file`, then `htc close`.
# The rate is over the span of the tasks' starts and ends (`htc log`), so an open run's wait for
# its first task is not counted.
#
#   bench/wide-tasks.sh
#   HTC_BASE=/tmp/base/htc ROUNDS=5 bench/wide-tasks.sh
#
# Env: TASKS (20000), ROUNDS (3), HTC (target/dist/htc), HTC_BASE (an older htc, its htc-agent
#      beside it), OUT (bench/results/wide-tasks-<date>.txt).
set -euo pipefail
BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
TASKS=${TASKS:-20000}
ROUNDS=${ROUNDS:-3}
HTC=${HTC:-$ROOT/target/dist/htc}
HTC_BASE=${HTC_BASE:-}
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
bench_setup wide-tasks
echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "workload: $TASKS x true, $ROUNDS rounds; htc: $HTC${HTC_BASE:+; base: $HTC_BASE}"
awk -v n="$TASKS" 'BEGIN { for (i = 0; i < n; i++) print "true" }' >"$WORK/file.txt"
{ cat "$WORK/file.txt"; echo "[cores=2] true"; } >"$WORK/wide.txt"

# Tasks per second over the span of the run's task starts and ends.
span_rate() {
    "$1" log "$2" | awk 'NR > 1 { s = $3; e = $3 + $4; if (n == 0 || s < lo) lo = s; if (e > hi) hi = e; n++ }
        END { if (hi > lo) printf "%d", n / (hi - lo); else print 0 }'
}

# One run of workload $2 with build $1, in a fresh directory; prints its rate.
one() {
    local htc=$1 what=$2 dir
    dir=$(mktemp -d "$WORK/run.XXXXXX")
    cd "$dir"
    if [[ $what == open ]]; then
        "$htc" run --open -q >/dev/null 2>&1 &
        local leader=$!
        until compgen -G ".htc/*/" >/dev/null; do sleep 0.1; done
        local run
        run=$(compgen -G ".htc/*/")
        # The run takes tasks once its leader answers: `task add` waits for it.
        "$htc" task add "$run" --file "$WORK/file.txt" >/dev/null
        "$htc" close "$run" >/dev/null 2>&1
        wait "$leader"
    else
        "$htc" run -q "$WORK/$what.txt" >/dev/null
    fi
    span_rate "$htc" "$(compgen -G ".htc/*/")"
    cd "$WORK"
}

builds=(new)
[[ -n $HTC_BASE ]] && builds+=(base)
declare -A rates
for ((r = 1; r <= ROUNDS; r++)); do
    line="round $r:"
    for what in file wide open; do
        for b in "${builds[@]}"; do
            htc=$HTC
            [[ $b == base ]] && htc=$HTC_BASE
            rate=$(one "$htc" "$what")
            rates[$what.$b]+="$rate "
            line+=" $what/$b $rate"
        done
    done
    echo "$line"
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo
printf '%-6s %10s %10s\n' workload new "${HTC_BASE:+base}"
for what in file wide open; do
    printf '%-6s %10s %10s\n' "$what" "$(echo "${rates[$what.new]}" | median)" \
        "$([[ -n $HTC_BASE ]] && echo "${rates[$what.base]}" | median)"
done
