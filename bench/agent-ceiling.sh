#!/usr/bin/env bash
# The agent's ceiling: per task, the CPU of each leader and agent thread, their context
# switches and system calls, the cross-CPU interrupts (TLB shootdowns, function-call IPIs) over
# the run, and the cost of anything serialized; from these, the node's ceiling = 1 / the largest
# cost all cores share. Measured beside one `rawloop -P 1` per CPU on the same tasks.
#
#   bench/agent-ceiling.sh                       # 20,000 `true` tasks, 3 rounds, with and without mem=
#   TASKS=50000 ROUNDS=5 bench/agent-ceiling.sh
#   HTC_BASE=/tmp/base/htc bench/agent-ceiling.sh   # an older build side by side
#
# Env: TASKS (20000), ROUNDS (3), STRACE_TASKS (3000: the one run under strace -f that counts
#      system calls; 0 skips it), MEM (64M), MEM_LIMIT (auto: how `mem=` is enforced, see
#      `htc run --help`), LAYOUTS ("true mem"; add "loops16", "loops64", …: `true` tasks on
#      that many spawn loops, `--cores-per-agent N`, on this machine's CPUs, for what the
#      agent's main thread pays per task with a many-core node's loops), HTC (default
#      target/dist/htc), HTC_BASE (an older htc, its htc-agent beside it, run in turn with
#      the new one), OUT (report file; default bench/results/agent-ceiling-<date>.txt).
# Keep the machine otherwise idle: the interrupt counts are the whole machine's (the idle rate,
# measured first, is taken off).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
HTC=${HTC:-$ROOT/target/dist/htc}
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/agent-ceiling-$STAMP.txt}

command -v strace >/dev/null || { apt-get update -qq && apt-get install -y -qq strace >/dev/null; }
if [[ ! -x $HTC || ! -x $(dirname "$HTC")/htc-agent ]]; then
    (cd "$ROOT" && cargo build --profile dist -p node-agent)
fi
RAW=$(mktemp -d /tmp/htc-ceiling-raw.XXXXXX)
trap 'rm -rf "$RAW"' EXIT
gcc -O2 -o "$RAW/rawloop" "$BENCH/rawloop.c"

{
    echo "# bench/agent-ceiling.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
    python3 "$BENCH/agent_ceiling.py" --htc "$HTC" --rawloop "$RAW/rawloop" --tasks "${TASKS:-20000}" \
        --rounds "${ROUNDS:-3}" --strace-tasks "${STRACE_TASKS:-3000}" --mem "${MEM:-64M}" \
        --mem-limit "${MEM_LIMIT:-auto}" --layouts "${LAYOUTS:-true mem}" --base "${HTC_BASE:-}"
} 2>&1 | tee "$OUT"
