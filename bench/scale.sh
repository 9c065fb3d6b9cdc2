#!/usr/bin/env bash
# The scheduling path at the scale of a large machine, on this one: `htc run --exec none|sleep`
# with many simulated agents (agents share a few processes; no task process is started), the
# way HyperQueue measures its overhead with `zero_worker`.
#
#   bench/scale.sh
#   ROUNDS=1 LAYOUTS="100x24" bench/scale.sh
#
# 1. Zero-length tasks (--exec none): TASKS tasks through each layout of LAYOUTS (AGENTSxCORES);
#    tasks/s (wall, leader and agents sharing this machine) and the leader's CPU per task
#    (`htc status --json`: leader_cpu_us_per_task), whose inverse is the leader's ceiling.
# 2. A mixed workload like HFlow's Fig. 4(b) (--exec sleep): MIX_PER_CLASS tasks of each of
#    0.01, 0.02, 0.04, 0.08, 0.16, 0.32 s, shuffled, on MIX_LAYOUT; makespan against the lower
#    bound max(sum t / C, max t).
#
# Env: TASKS (2000000), LAYOUTS ("1000x24 100x24 10x24"), ROUNDS (3), MIX_LAYOUT (100x24),
#      MIX_PER_CLASS (20000), HTC (target/release/htc), WORK (scratch dir, deleted unless
#      KEEP=1), OUT (report; default bench/results/scale-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
TASKS=${TASKS:-2000000}
LAYOUTS=${LAYOUTS:-"1000x24 100x24 10x24"}
ROUNDS=${ROUNDS:-3}
MIX_LAYOUT=${MIX_LAYOUT:-100x24}
MIX_PER_CLASS=${MIX_PER_CLASS:-20000}
HTC=${HTC:-$ROOT/target/release/htc}
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/scale-$STAMP.txt}
WORK=${WORK:-$(mktemp -d /tmp/htc-scale.XXXXXX)}
mkdir -p "$WORK"
trap '[[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"' EXIT

exec > >(tee "$OUT") 2>&1

if [[ ! -x $HTC || ! -x $(dirname "$HTC")/htc-agent ]]; then
    (cd "$ROOT" && cargo build --release -p node-agent)
fi

echo "== scale benchmark (simulated executors) =="
echo "date:        $(date -Is)"
echo "host:        $(uname -n)  kernel $(uname -r)"
echo "nproc:       $(nproc)"
echo "cpu:         $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "htc:         $("$HTC" --version)  ($(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "loadavg at start: $(cat /proc/loadavg)"
echo

# One field of `htc status --json` of the run in the current directory.
field() { "$HTC" status --json | python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

cd "$WORK"
seq 1 "$TASKS" | sed 's/^/true /' >zero.txt

echo "== 1. zero-length tasks: $TASKS per run, --exec none, median of $ROUNDS =="
printf '%-10s %8s %14s %16s %18s %14s\n' layout cores 'tasks/s' 'leader CPU s' 'leader us/task' 'ceiling/s'
for layout in $LAYOUTS; do
    agents=${layout%x*} cores=${layout#*x}
    : >"rate.$layout" >"cpu.$layout" >"per.$layout"
    for _ in $(seq "$ROUNDS"); do
        rm -rf .htc
        # Loading is measured by bench/ledger.sh; here only the leading.
        "$HTC" prepare zero.txt >/dev/null
        "$HTC" run --resume --exec none --agents "$agents" --cores-per-agent "$cores" -q
        [[ $(field "['counts']['done']") == "$TASKS" ]] || { echo "not every task done" >&2; exit 1; }
        field "['rate']" >>"rate.$layout"
        field "['leader_cpu_s']" >>"cpu.$layout"
        field "['leader_cpu_us_per_task']" >>"per.$layout"
    done
    rate=$(median <"rate.$layout") cpu=$(median <"cpu.$layout") per=$(median <"per.$layout")
    printf '%-10s %8d %14.0f %16.3f %18.3f %14.0f\n' "$layout" $((agents * cores)) "$rate" "$cpu" "$per" \
        "$(awk -v p="$per" 'BEGIN { print 1e6 / p }')"
    echo "   rounds: tasks/s $(paste -sd' ' "rate.$layout"); us/task $(paste -sd' ' "per.$layout")"
done
echo

echo "== 2. mixed runtimes (HFlow Fig. 4(b) scaled): $MIX_PER_CLASS tasks each of 0.01..0.32 s, --exec sleep on $MIX_LAYOUT =="
agents=${MIX_LAYOUT%x*} cores=${MIX_LAYOUT#*x}
python3 - "$MIX_PER_CLASS" >mix.txt <<'EOF'
import random, sys
n = int(sys.argv[1])
lines = [f"[runtime={ms}ms] task {ms}-{i}" for ms in (10, 20, 40, 80, 160, 320) for i in range(n)]
random.Random(7).shuffle(lines)
print("\n".join(lines))
EOF
bound=$(awk -v n="$MIX_PER_CLASS" -v c=$((agents * cores)) 'BEGIN { s = n * (0.01+0.02+0.04+0.08+0.16+0.32); b = s / c; if (b < 0.32) b = 0.32; print b }')
: >mix.makespan
for _ in $(seq "$ROUNDS"); do
    rm -rf .htc
    "$HTC" prepare mix.txt >/dev/null
    "$HTC" run --resume --exec sleep --agents "$agents" --cores-per-agent "$cores" -q
    field "['elapsed_s']" >>mix.makespan
done
m=$(median <mix.makespan)
printf 'cores %d, tasks %d, lower bound %.3f s, makespan (median) %.3f s = %.1f%% above the bound\n' \
    $((agents * cores)) $((MIX_PER_CLASS * 6)) "$bound" "$m" "$(awk -v m="$m" -v b="$bound" 'BEGIN { print (m / b - 1) * 100 }')"
echo "   rounds: $(paste -sd' ' mix.makespan)"
echo
echo "loadavg at end: $(cat /proc/loadavg)"
