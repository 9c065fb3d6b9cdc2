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
#    (`htc status --json`: leader_cpu_us_per_task), whose inverse is the leader's ceiling, beside
#    the results per report seen (mean, p99): what that cost depends on.
# 1s. Tasks of SLEEP_MS (--exec sleep, each lasting its runtime hint) on SLEEP_LAYOUTS: agents
#    report as real ones do, so reports carry what ends within a report gap. Asked rate (cores /
#    runtime), achieved rate, leader us/task, results per report; then `htc simulate` of the same
#    file with the leader cost `htc calibrate` measures (the site's, or the built-in one).
# 2. A mixed workload like HFlow's Fig. 4(b) (--exec sleep): equal numbers of tasks of 0.01,
#    0.02, 0.04, 0.08, 0.16, 0.32 s, shuffled, on each of MIX_LAYOUTS, as many as make the lower
#    bound max(sum t / C, max t) MIX_SECONDS; makespan of --partition even and hflow side by side.
#    MIX_STRETCH multiplies the runtimes (fewer tasks per second for the same bound, for layouts
#    whose simulated agents would otherwise need more CPU than this machine has).
# 2b. The same mixes (runtimes not stretched) with `htc simulate`: the real leader core and agent
#    machines on a virtual clock, SIM_LATENCY_US per frame; measures the plan without this
#    machine's CPU in the way.
# 3. The same mix as real `sleep` processes on REAL_LAYOUT slots of this machine (sleeping takes
#    no CPU, so slots may exceed CPUs), REAL_PER_CLASS tasks per class.
# 4. Partition cost like HFlow's Table 3: the same mix with PLAN_SIZES tasks (six runtime classes),
#    parse + ledger load and the leader's planning (ledger scan, grouping, eq. 10 shares) timed
#    by `htc simulate` on 1000 x 24, then the plan simulated.
#
# Env: TASKS (2000000), LAYOUTS ("1000x24 100x24 10x24"; AxC/M: M agents per instance), ROUNDS (3),
#      SECTIONS ("1 1b 1s 2 2b 3 4": which of the above to run), SLEEP_MS (24), SLEEP_TASKS
#      (1000000), SLEEP_LAYOUTS ("1000x24"), PLAN_SIZES (section 4's task counts,
#      "1000 100000 1000000 10000000"),
#      MIX_LAYOUTS ("100x24 1000x24"), MIX_SECONDS (5.25), MIX_STRETCH (1), SIM_LATENCY_US (100), REAL_LAYOUT (2x8), REAL_PER_CLASS (100),
#      HTC (target/dist/htc), WORK (scratch dir, deleted unless KEEP=1), OUT (report;
#      default bench/results/scale-<date>.txt). Runs ignore site files (HTC_SITE_CONFIG=/dev/null).
#      HQ_ZERO (path to an `hq` built with RUSTFLAGS="--cfg zero_worker"; section 1b, skipped if
#      unset), HQ_TASKS (200000), HQ_WORKERS (100, of 24 CPUs each).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
TASKS=${TASKS:-2000000}
LAYOUTS=${LAYOUTS:-"1000x24 100x24 10x24"}
ROUNDS=${ROUNDS:-3}
MIX_LAYOUTS=${MIX_LAYOUTS:-"100x24 1000x24"}
MIX_SECONDS=${MIX_SECONDS:-5.25}
MIX_STRETCH=${MIX_STRETCH:-1}
SIM_LATENCY_US=${SIM_LATENCY_US:-100}
SECTIONS=${SECTIONS:-"1 1b 1s 2 2b 3 4"}
SLEEP_MS=${SLEEP_MS:-24}
SLEEP_TASKS=${SLEEP_TASKS:-1000000}
SLEEP_LAYOUTS=${SLEEP_LAYOUTS:-"1000x24"}
PLAN_SIZES=${PLAN_SIZES:-"1000 100000 1000000 10000000"}
REAL_LAYOUT=${REAL_LAYOUT:-2x8}
REAL_PER_CLASS=${REAL_PER_CLASS:-100}
HQ_ZERO=${HQ_ZERO:-}
HQ_TASKS=${HQ_TASKS:-200000}
HQ_WORKERS=${HQ_WORKERS:-100}
HTC=${HTC:-$ROOT/target/dist/htc}
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/scale-$STAMP.txt}
WORK=${WORK:-$(mktemp -d /tmp/htc-scale.XXXXXX)}
mkdir -p "$WORK"
trap '[[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"' EXIT

exec > >(tee "$OUT") 2>&1

if [[ ! -x $HTC || ! -x $(dirname "$HTC")/htc-agent ]]; then
    (cd "$ROOT" && cargo build --profile dist -p node-agent)
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
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
field() { "$HTC" status --json | python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# The default calibration, whatever this machine's user or admin stored.
export HTC_SITE_CONFIG=/dev/null

cd "$WORK"
seq 1 "$TASKS" | sed 's/^/true /' >zero.txt

if want 1; then
echo "== 1. zero-length tasks: $TASKS per run, --exec none, median of $ROUNDS =="
printf '%-10s %8s %14s %16s %18s %14s %16s\n' layout cores 'tasks/s' 'leader CPU s' 'leader us/task' 'ceiling/s' \
    'results/report'
for layout in $LAYOUTS; do
    # AxC, or AxC/M: M agents per 2nd-level instance (only the heads talk to the leader).
    inst=1
    [[ $layout == */* ]] && inst=${layout#*/}
    agents=${layout%%x*} cores=${layout#*x} cores=${cores%/*} key=${layout//\//-}
    : >"rate.$key" >"cpu.$key" >"per.$key" >"size.$key" >"p99.$key"
    for _ in $(seq "$ROUNDS"); do
        rm -rf .htc
        # Loading is measured by bench/ledger.sh; here only the leading.
        "$HTC" prepare zero.txt >/dev/null
        "$HTC" run --resume --exec none --agents "$agents" --cores-per-agent "$cores" --instance-agents "$inst" -q
        [[ $(field "['counts']['done']") == "$TASKS" ]] || { echo "not every task done" >&2; exit 1; }
        field "['rate']" >>"rate.$key"
        field "['leader_cpu_s']" >>"cpu.$key"
        field "['leader_cpu_us_per_task']" >>"per.$key"
        field "['results_per_report']" >>"size.$key"
        field "['results_per_report_p99']" >>"p99.$key"
    done
    rate=$(median <"rate.$key") cpu=$(median <"cpu.$key") per=$(median <"per.$key")
    printf '%-10s %8d %14.0f %16.3f %18.3f %14.0f %8.0f p99 %s\n' "$layout" $((agents * cores)) "$rate" "$cpu" "$per" \
        "$(awk -v p="$per" 'BEGIN { print 1e6 / p }')" "$(median <"size.$key")" "$(median <"p99.$key")"
    echo "   rounds: tasks/s $(paste -sd' ' "rate.$key"); us/task $(paste -sd' ' "per.$key")"
done
echo
fi

# HyperQueue's own overhead mode side by side: a server and HQ_WORKERS workers of 24 CPUs built
# with RUSTFLAGS="--cfg zero_worker" (each task reported finished at once, no process), one
# array job of HQ_TASKS tasks; the server's CPU per task from /proc/PID/stat.
if [[ -n $HQ_ZERO ]] && want 1b; then
    echo "== 1b. HyperQueue zero_worker: $HQ_TASKS tasks, $HQ_WORKERS workers x 24 CPUs, median of $ROUNDS =="
    echo "hq:          $("$HQ_ZERO" --version 2>&1 | head -1) ($HQ_ZERO)"
    proc_cpu() { awk -v t="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print ($12 + $13) / t }' "/proc/$1/stat"; }
    export HQ_SERVER_DIR=$WORK/hq-server
    hq_pids=()
    stop_hq() {
        "$HQ_ZERO" server stop >/dev/null 2>&1 || true
        for p in "${hq_pids[@]}"; do kill "$p" 2>/dev/null || true; done
        wait "${hq_pids[@]}" 2>/dev/null || true
        rm -rf /tmp/hq-worker* /tmp/hq-lc-* 2>/dev/null || true
    }
    trap 'stop_hq; [[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"' EXIT
    "$HQ_ZERO" server start >"$WORK/hq-server.log" 2>&1 & server=$!; hq_pids+=($server)
    for _ in $(seq 100); do "$HQ_ZERO" server info >/dev/null 2>&1 && break; sleep 0.2; done
    for _ in $(seq "$HQ_WORKERS"); do
        "$HQ_ZERO" worker start --cpus 24 >>"$WORK/hq-workers.log" 2>&1 & hq_pids+=($!)
    done
    "$HQ_ZERO" worker wait "$HQ_WORKERS" >/dev/null
    : >hq.rate; : >hq.per
    for _ in $(seq "$ROUNDS"); do
        c0=$(proc_cpu "$server") t0=$(date +%s.%N)
        "$HQ_ZERO" submit --array "1-$HQ_TASKS" --stdout none --stderr none --wait -- /bin/true >"$WORK/hq-submit.log" 2>&1
        t1=$(date +%s.%N) c1=$(proc_cpu "$server")
        awk -v n="$HQ_TASKS" -v a="$t0" -v b="$t1" 'BEGIN { print n / (b - a) }' >>hq.rate
        awk -v n="$HQ_TASKS" -v a="$c0" -v b="$c1" 'BEGIN { print (b - a) * 1e6 / n }' >>hq.per
    done
    stop_hq
    rate=$(median <hq.rate) per=$(median <hq.per)
    printf '%-10s %8d %14.0f %16s %18.3f %14.0f\n' "hq ${HQ_WORKERS}x24" $((HQ_WORKERS * 24)) "$rate" '' "$per" \
        "$(awk -v p="$per" 'BEGIN { print 1e6 / p }')"
    echo "   rounds: tasks/s $(paste -sd' ' hq.rate); server us/task $(paste -sd' ' hq.per)"
    echo "   (server CPU: utime + stime of the hq server process; the wall rate includes submit)"
    echo
fi

if want 1s; then
echo "== 1s. tasks of $SLEEP_MS ms: $SLEEP_TASKS per run, --exec sleep (reports as real agents make them), median of $ROUNDS =="
printf '%-10s %10s %10s %12s %16s %18s\n' layout 'asked/s' 'tasks/s' 'leader us/task' 'results/report' 'simulate tasks/s'
awk -v n="$SLEEP_TASKS" -v ms="$SLEEP_MS" 'BEGIN { for (i = 0; i < n; i++) printf "[runtime=%dms] t%d\n", ms, i }' >sleep.txt
for layout in $SLEEP_LAYOUTS; do
    agents=${layout%x*} cores=${layout#*x}
    : >s.rate >s.per >s.size >s.p99
    for _ in $(seq "$ROUNDS"); do
        rm -rf .htc
        "$HTC" prepare sleep.txt >/dev/null
        "$HTC" run --resume --exec sleep --agents "$agents" --cores-per-agent "$cores" -q
        [[ $(field "['counts']['done']") == "$SLEEP_TASKS" ]] || { echo "not every task done" >&2; exit 1; }
        field "['rate']" >>s.rate
        field "['leader_cpu_us_per_task']" >>s.per
        field "['results_per_report']" >>s.size
        field "['results_per_report_p99']" >>s.p99
    done
    asked=$(awk -v c=$((agents * cores)) -v ms="$SLEEP_MS" 'BEGIN { print c * 1000 / ms }')
    sim=$("$HTC" simulate sleep.txt --agents "$agents" --cores-per-agent "$cores" --json |
        python3 -c "import json,sys; j=json.load(sys.stdin); print(j['tasks'] / j['makespan_s'])")
    printf '%-10s %10.0f %10.0f %12.3f %9.0f p99 %-4s %12.0f (%.1f%% of asked)\n' "$layout" "$asked" "$(median <s.rate)" \
        "$(median <s.per)" "$(median <s.size)" "$(median <s.p99)" "$sim" "$(awk -v s="$sim" -v a="$asked" 'BEGIN { print 100 * s / a }')"
    echo "   rounds: tasks/s $(paste -sd' ' s.rate); us/task $(paste -sd' ' s.per)"
done
echo
fi

# Tasks of 0.01 .. 0.32 s, equal numbers of each, shuffled; $2 = command template.
mixfile() {
    python3 - "$1" "$2" "${3:-1}" <<'EOF'
import random, sys
n, cmd = int(sys.argv[1]), sys.argv[2]
stretch = float(sys.argv[3])
lines = [f"[runtime={ms}ms] " + cmd.format(s=ms / 1000, ms=ms, i=i)
         for ms in (int(b * stretch) for b in (10, 20, 40, 80, 160, 320)) for i in range(n)]
random.Random(7).shuffle(lines)
print("\n".join(lines))
EOF
}
# Makespan runs of one file: elapsed_s and leader_cpu_s of ROUNDS runs into ./mk.
makespans() {
    local file=$1 plan=$2
    shift 2
    : >mk
    for _ in $(seq "$ROUNDS"); do
        rm -rf .htc
        "$HTC" prepare "$file" >/dev/null
        "$HTC" run --resume --partition "$plan" -q "$@"
        [[ $(field "['counts']['done']") == "$(wc -l <"$file")" ]] || { echo "not every task done" >&2; exit 1; }
        echo "$(field "['elapsed_s']") $(field "['leader_cpu_s']")" >>mk
    done
}
mixrow() { # layout plan bound per_class
    local m cpu
    m=$(cut -d' ' -f1 mk | median) cpu=$(cut -d' ' -f2 mk | median)
    printf '%-9s %-6s %9d %9.3f %10.3f %8.1f%% %10.3f   rounds: %s\n' "$1" "$2" $(($4 * 6)) "$3" "$m" \
        "$(awk -v m="$m" -v b="$3" 'BEGIN { print (m / b - 1) * 100 }')" "$cpu" "$(cut -d' ' -f1 mk | paste -sd' ')"
}
bound_of() { awk -v n="$1" -v c="$2" -v k="${3:-1}" 'BEGIN { s = n * 0.63 * k; b = s / c; if (b < 0.32 * k) b = 0.32 * k; print b }'; }

if want 2; then
echo "== 2. mixed runtimes (HFlow Fig. 4(b) scaled): equal numbers of (0.01..0.32 s) x $MIX_STRETCH tasks, shuffled, --exec sleep =="
echo "   per class: MIX_SECONDS x cores / (0.63 x $MIX_STRETCH) tasks (lower bound max(sum t / C, max t) = $MIX_SECONDS s); median of $ROUNDS"
printf '%-9s %-6s %9s %9s %10s %9s %10s\n' layout plan tasks 'bound s' 'makespan' 'above' 'leader s'
for layout in $MIX_LAYOUTS; do
    agents=${layout%x*} cores=${layout#*x}
    n=$(awk -v c=$((agents * cores)) -v s="$MIX_SECONDS" -v k="$MIX_STRETCH" 'BEGIN { printf "%d", s * c / (0.63 * k) + 0.5 }')
    mixfile "$n" 'task {ms}-{i}' "$MIX_STRETCH" >mix.txt
    bound=$(bound_of "$n" $((agents * cores)) "$MIX_STRETCH")
    for plan in even hflow; do
        makespans mix.txt "$plan" --exec sleep --agents "$agents" --cores-per-agent "$cores"
        mixrow "$layout" "$plan" "$bound" "$n"
    done
done
echo
fi

# One row of section 2b from `htc simulate --json`.
simrow() { # layout plan json-file
    python3 - "$@" <<'EOF'
import json, sys
r = json.load(open(sys.argv[3]))
print(f"{sys.argv[1]:<9} {sys.argv[2]:<6} {r['tasks']:>9} {r['bound_s']:>9.3f} {r['makespan_s']:>10.3f} "
      f"{r['above_bound'] * 100:>8.1f}% {r['leader_busy_s']:>10.3f} {r['wall_s']:>8.1f}")
EOF
}
if want 2b; then
echo "== 2b. the same mixes on a virtual clock (htc simulate: the real leader core and agent machines, no wall clock) =="
echo "   network latency $SIM_LATENCY_US us per frame (assumed), leader 0.8 us per task; deterministic, one run each"
printf '%-9s %-6s %9s %9s %10s %9s %10s %8s\n' layout plan tasks 'bound s' 'makespan' 'above' 'leader s' 'wall s'
for layout in $MIX_LAYOUTS; do
    agents=${layout%x*} cores=${layout#*x}
    n=$(awk -v c=$((agents * cores)) -v s="$MIX_SECONDS" 'BEGIN { printf "%d", s * c / 0.63 + 0.5 }')
    mixfile "$n" 'task {ms}-{i}' >vmix.txt
    for plan in even hflow; do
        "$HTC" simulate vmix.txt --agents "$agents" --cores-per-agent "$cores" --partition "$plan" \
            --latency-us "$SIM_LATENCY_US" --json >sim.json
        simrow "$layout" "$plan" sim.json
    done
done
echo
fi

if want 3; then
echo "== 3. the same mix with real processes (sleep), $REAL_LAYOUT slots on this machine, $REAL_PER_CLASS per class =="
agents=${REAL_LAYOUT%x*} cores=${REAL_LAYOUT#*x}
mixfile "$REAL_PER_CLASS" 'sleep {s}' >real.txt
bound=$(bound_of "$REAL_PER_CLASS" $((agents * cores)))
printf '%-9s %-6s %9s %9s %10s %9s %10s\n' layout plan tasks 'bound s' 'makespan' 'above' 'leader s'
for plan in even hflow; do
    makespans real.txt "$plan" --output none --agents "$agents" --cores-per-agent "$cores"
    mixrow "$REAL_LAYOUT" "$plan" "$bound" "$REAL_PER_CLASS"
done
echo
fi

if want 4; then
echo "== 4. partition cost (HFlow Table 3): six runtime classes, parse + load and planning, htc simulate on 1000 x 24 =="
printf '%10s %9s %9s %12s %9s %8s\n' tasks 'load s' 'plan s' 'makespan s' 'above' 'sim s'
for n in $PLAN_SIZES; do
    mixfile $((n / 6)) 'task {ms}-{i}' >plan.txt
    "$HTC" simulate plan.txt --agents 1000 --cores-per-agent 24 --json >plan.json
    python3 - plan.json <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['tasks']:>10} {r['load_s']:>9.3f} {r['plan_s']:>9.3f} {r['makespan_s']:>12.3f} "
      f"{r['above_bound'] * 100:>8.1f}% {r['wall_s']:>8.1f}")
EOF
done
rm -f plan.txt
echo
fi

echo "loadavg at end: $(cat /proc/loadavg)"
