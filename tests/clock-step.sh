#!/usr/bin/env bash
# A run whose machine's wall clock is stepped (NTP, a virtual machine paused and resumed): the
# leader and the executors decide by the monotonic clock (`htc_host::steady_us`), so a step
# neither fences the executors nor fires or holds back a task's timeout.
#
#   A: 60 s forward mid-run: every task runs, and a task with timeout=20s that spans the step
#      ends done (a wall-clock lease then expired for good: the run stood still with tasks
#      dispatched and none running; the timeout fired at the step).
#   B: 60 s back mid-run (the clock where it began): a task with timeout=2s is killed within
#      seconds, not a minute late, and the run ends.
#
# Steps the clock of the whole machine, so it runs alone (tests/run-all.sh runs it between
# tiers), as root; whatever happens, the clock is stepped back by what was stepped.
#
#   sudo tests/clock-step.sh        # HTC: the htc binary (default target/release/htc)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
HTC=${HTC:-$root/target/release/htc}
[[ $(id -u) == 0 ]] || { echo "clock-step.sh steps the machine's clock: it needs root" >&2; exit 1; }
[[ -x $HTC ]] || { echo "no $HTC: build it first (cargo build --release)" >&2; exit 1; }
export HTC_SITE_CONFIG=/dev/null

stepped=0 work=$(mktemp -d /tmp/htc-clock-step.XXXXXX)
step_clock() { date -s "$1 seconds" >/dev/null; stepped=$((stepped + $1)); }
on_exit() {
    local rc=$?
    ((stepped == 0)) || date -s "$((-stepped)) seconds" >/dev/null
    pkill -f "$work" 2>/dev/null || true
    rm -rf "$work"
    exit "$rc"
}
trap on_exit EXIT
mono() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(mono)" 'BEGIN { printf "%.1f", b - a }'; }
fail() { echo "FAIL: $*" >&2; for f in "$work"/*/err; do echo "-- $f" >&2; tail -5 "$f" >&2; done; exit 1; }

# run NAME STEP AT LIMIT TASKS...: the tasks run in WORK/NAME, the clock stepped STEP seconds
# AT seconds in; fails past LIMIT seconds (monotonic). Leaves the run's counts line in
# WORK/NAME/counts (not printed for a $(...): the step must be counted in this shell).
run() {
    local name=$1 step=$2 at=$3 limit=$4
    shift 4
    mkdir "$work/$name"
    printf '%s\n' "$@" >"$work/$name/tasks.txt"
    (cd "$work/$name" && exec timeout "$limit" "$HTC" run tasks.txt -q >out 2>err) &
    local pid=$! t0
    t0=$(mono)
    sleep "$at"
    step_clock "$step"
    local rc=0
    wait "$pid" || rc=$?
    echo "$name: stepped ${step} s at ${at} s; ended (rc $rc) after $(since "$t0") s"
    ((rc != 124)) || fail "$name: the run did not end within ${limit} s"
    (cd "$work/$name" && "$HTC" status | grep '^counts:') >"$work/$name/counts"
    cat "$work/$name/counts"
}

short=()
for _ in $(seq 1500); do short+=("sleep 0.01"); done

run forward 60 2 60 "[timeout=20s] sleep 6" "${short[@]}"
counts=$(cat "$work/forward/counts")
[[ $counts == *"done=1501 failed=0"* ]] || fail "forward: not every task done: $counts"

t0=$(mono)
run back -60 2 60 "[timeout=2s retries=0] sleep 40" "${short[@]:0:300}"
counts=$(cat "$work/back/counts")
[[ $counts == *"done=300 failed=1"* ]] || fail "back: expected 300 done and the timed-out task failed: $counts"
took=$(since "$t0")
awk -v t="$took" 'BEGIN { exit !(t < 20) }' || fail "back: the timeout=2s task held the run for ${took} s"
echo "clock steps: both runs as if the clock had not moved"
