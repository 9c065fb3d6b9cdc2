#!/usr/bin/env bash
# Where the leader's CPU goes with real agents (issue 25): `perf record` attached to `htc run`
# (the leader process and its threads only; agents and tasks are other processes) on TASKS
# `true` tasks, then the inclusive shares of the functions that matter. Needs perf (Debian's
# linux-perf) and root or perf_event_paranoid <= 1.
#
#   bench/leader-profile.sh                                  # default layout, 50,000 tasks
#   ARGS="--agents 16 --cores-per-agent 1" bench/leader-profile.sh
#
# Env: TASKS (50000), ARGS (extra `htc run` options), HTC (target/dist/htc), OUT
#      (bench/results/leader-profile-<date>.txt); the perf data stays in WORK (printed).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
TASKS=${TASKS:-50000}
ARGS=${ARGS:-}
HTC=${HTC:-$ROOT/target/dist/htc}
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/leader-profile-$(date +%Y%m%d-%H%M%S).txt}
WORK=$(mktemp -d /tmp/htc-leader-profile.XXXXXX)
exec > >(tee "$OUT") 2>&1
command -v perf >/dev/null || { echo "perf is needed (apt-get install linux-perf)" >&2; exit 1; }
[[ -x $HTC ]] || (cd "$ROOT" && cargo build --profile dist -p node-agent)

cd "$WORK"
echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "workload: $TASKS x true; htc run $ARGS; perf data in $WORK/perf.data"
for ((i = 0; i < TASKS; i++)); do echo true; done >t.txt
# shellcheck disable=SC2086
"$HTC" run t.txt $ARGS >run.txt 2>&1 &
pid=$!
sleep 0.5
perf record -F 1999 --call-graph dwarf,16384 -p "$pid" -o perf.data >perf.txt 2>&1 &
wait "$pid"
sleep 1
tail -n 2 run.txt
"$HTC" status "$(ls .htc)" --json | grep -o '"leader_cpu_us_per_task":[0-9.]*'
echo "-- inclusive shares of the leader's samples"
perf report -i perf.data --children --sort sym --stdio -g none 2>/dev/null | grep '%' |
    grep -E 'driver::run$|Core::handle$|Core::dispatch$|WriteTxn::commit$|WriteTxn::put$|frame::decode$|recv_timeout$|Sender<T>::send$|spawn_writer_with_keepalive|read_frame::\{|epoll_wait$|live::write$' || true
echo "-- self time, top 12"
perf report -i perf.data --no-children --sort dso,sym --stdio -g none 2>/dev/null | grep '%' | head -n 12
