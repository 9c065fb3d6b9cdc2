#!/usr/bin/env bash
# The leader stopped (SIGSTOP) for STOP seconds mid-run, then continued (issue 24, finding 3):
# counts the tasks that completed twice. With the default 10 s bound the agents fence at 5 s and
# try for 60 s to come back; a longer stop ends the session ("all agents are gone … continue with
# htc run --resume"), and the script resumes it.
#
#   bench/leader-stop.sh              # 30 s stop
#   STOP=120 bench/leader-stop.sh
#
# Env: STOP (30), TASKS (2400 x `sleep 0.05`), HTC (target/dist/htc), OUT
#      (bench/results/leader-stop-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
STOP=${STOP:-30}
TASKS=${TASKS:-2400}
HTC=${HTC:-$ROOT/target/dist/htc}
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
bench_setup leader-stop

cd "$WORK"
echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "workload: $TASKS x sleep 0.05 on --agents 2 --cores-per-agent 1; leader stopped $STOP s after 200 tasks"
for ((i = 0; i < TASKS; i++)); do echo "sleep 0.05; echo \$HTC_TASK_ID >> $WORK/ids.txt"; done >t.txt
"$HTC" run t.txt --agents 2 --cores-per-agent 1 >first.txt 2>&1 &
pid=$!
until [[ -f ids.txt && $(wc -l <ids.txt) -ge 200 ]]; do sleep 0.1; done
kill -STOP "$pid"
echo "stopped with $(wc -l <ids.txt) tasks done"
sleep "$STOP"
kill -CONT "$pid"
rc=0
wait "$pid" || rc=$?
echo "first session: exit $rc; $(grep -E 'agents are gone|tasks:' first.txt | tail -1)"
if [[ $rc != 0 ]]; then
    "$HTC" run --resume -q >second.txt 2>&1 && echo "resumed: exit 0" || echo "resumed: exit $?"
fi
echo "lines $(wc -l <ids.txt), tasks $(sort -u ids.txt | wc -l), completed twice $(sort ids.txt | uniq -d | wc -l)"
