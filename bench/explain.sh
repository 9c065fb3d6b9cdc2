#!/usr/bin/env bash
# `htc task explain` on a big run (issue 56's goal: an answer within 10 ms for a run of
# 1,000,000 tasks). A run of N `sleep 1000` tasks on one agent of 2 slots (2 run, the rest wait)
# and one task after the next-to-last; once its leader answers, R calls of each, one at a time,
# the wall time of the whole command (process start, connect, the leader's answer), median:
#   explain   `htc task explain RUN 1 N/2 N+1`: a running task, a queued one, one that waits
#   json      `htc task explain RUN N/2 --format json`
#   status    `htc task status RUN N/2`, the nearest peer: the same connect, a state's lookup
#   version   `htc --version`: the process start alone
#
#   bench/explain.sh
#
# Env: N (1000000), R (21), HTC (target/release/htc), OUT (bench/results/).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
N=${N:-1000000}
R=${R:-21}
HTC=${HTC:-$ROOT/target/release/htc}
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
bench_setup explain

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
cd "$WORK"
seq 1 "$N" | sed 's/.*/sleep 1000/' >tasks.txt
echo "[after=$((N - 1))] true" >>tasks.txt
HTC_SITE_CONFIG=/dev/null "$HTC" run tasks.txt -q --agents 1 --cores-per-agent 2 >run.out 2>&1 &
leader=$!
trap 'kill -INT $leader 2>/dev/null; sleep 2; kill -INT $leader 2>/dev/null; wait $leader 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 600); do
    run=$(ls .htc 2>/dev/null | head -1)
    [[ -n $run ]] && "$HTC" task explain "$run" 1 2>/dev/null | grep -q running && break
    sleep 0.5
done
"$HTC" task explain "$run" 1 $((N / 2)) $((N + 1))
python3 - "$HTC" "$run" "$R" "$N" <<'PY'
import statistics, subprocess, sys, time
htc, run, rounds, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for name, args in [
    ("explain", ["task", "explain", run, "1", str(n // 2), str(n + 1)]),
    ("json", ["task", "explain", run, str(n // 2), "--format", "json"]),
    ("status", ["task", "status", run, str(n // 2)]),
    ("version", ["--version"]),
]:
    ms = []
    for _ in range(rounds):
        t = time.perf_counter()
        subprocess.run([htc, *args], capture_output=True, check=True)
        ms.append((time.perf_counter() - t) * 1000)
    print(f"{name:8} median {statistics.median(ms):6.2f} ms  min {min(ms):6.2f}  max {max(ms):6.2f}  ({rounds} calls)")
PY
