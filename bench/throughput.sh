#!/usr/bin/env bash
# Throughput of `htc run` against the raw spawn loop and common tools, on tiny `true` tasks.
#
#   bench/throughput.sh                 # 100,000 tasks, 5 rounds
#   TASKS=20000 ROUNDS=3 bench/throughput.sh
#   HQ=/path/to/hq bench/throughput.sh  # also HyperQueue
#   HTC_BASE=/path/to/old/htc bench/throughput.sh   # also an older build, side by side
#
# Env: TASKS (100000), ROUNDS (5), PAR (2: concurrency for every contender),
#      CONTENDERS (default: all; space-separated subset of the names below; raw-multi, the
#      limit, and raw-spawn, the single spawn loop, are always added), PAR_TASKS (10000: GNU parallel runs only this many; its tasks/s is per task so it
#      compares directly), HTC / HTC_AGENT (default target/dist/{htc,htc-agent}),
#      HQ (path to an `hq` binary; skipped if unset), WORK (scratch dir, default mktemp
#      under /tmp, deleted at the end unless KEEP=1), OUT (report file; default
#      bench/results/throughput-<date>.txt), BG_LOAD (0: that many busy loops, each in a
#      session of its own (so its own scheduler autogroup, like another user's build), run
#      for the whole benchmark to reproduce a shared machine under control).
#
# Contenders run side by side: in every round each runs once, in an order rotated by one
# each round, so background noise hits all of them alike. Reported: medians over rounds, as a
# share of the limit: PAR independent spawn loops (`rawloop -P 1`), each on 1/PAR of the file,
# all at once (one spawner per CPU, as a node's agents could be), and of the single spawn loop
# (`rawloop -P PAR`) beside it.
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
TASKS=${TASKS:-100000}
ROUNDS=${ROUNDS:-5}
PAR=${PAR:-2}
PAR_TASKS=${PAR_TASKS:-10000}
HTC=${HTC:-$ROOT/target/dist/htc}
HQ=${HQ:-}
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/throughput-$STAMP.txt}
WORK=${WORK:-$(mktemp -d /tmp/htc-bench.XXXXXX)}
mkdir -p "$WORK"
cleanup() { [[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"; }
trap cleanup EXIT

exec > >(tee "$OUT") 2>&1

# ---- tools ----
need=()
command -v parallel >/dev/null || need+=(parallel)
[[ -x /usr/bin/time ]] || need+=(time)
if ((${#need[@]})); then
    echo "installing: ${need[*]}"
    apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v gcc >/dev/null || { echo "gcc is needed to build rawloop" >&2; exit 1; }
if [[ ! -x $HTC || ! -x $(dirname "$HTC")/htc-agent ]]; then
    (cd "$ROOT" && cargo build --profile dist -p node-agent)
fi
gcc -O2 -o "$WORK/rawloop" "$BENCH/rawloop.c"
# Monotonic clock for wall times (date/EPOCHREALTIME are wall-clock and can jump).
gcc -O2 -x c -o "$WORK/mono" - <<'EOF'
#include <stdio.h>
#include <time.h>
int main(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  printf("%ld.%09ld\n", (long)t.tv_sec, t.tv_nsec); return 0; }
EOF
MONO=$WORK/mono
TIME=/usr/bin/time

# ---- inputs ----
awk -v n="$TASKS" 'BEGIN { for (i = 0; i < n; i++) print "true" }' > "$WORK/tasks.txt"
head -n "$PAR_TASKS" "$WORK/tasks.txt" > "$WORK/tasks-parallel.txt"
# raw-multi's shares: line i goes to share i mod PAR.
awk -v p="$PAR" -v w="$WORK" '{ print > (w "/share." (NR % p)) }' "$WORK/tasks.txt"
seq "$TASKS" > "$WORK/xargs-input.txt"

# ---- machine facts ----
facts() {
    echo "date:        $(date -Is)"
    echo "host:        $(uname -n)  kernel $(uname -r)"
    echo "nproc:       $(nproc)"
    echo "cpu:         $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "ram:         $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
    echo "glibc:       $(ldd --version | head -1)"
    echo "htc:         $("$HTC" --version)  ($(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    echo "xargs:       $(xargs --version | head -1)"
    echo "parallel:    $(parallel --version | head -1)"
    if [[ -n $HQ ]]; then echo "hq:          $("$HQ" --version 2>&1 | head -1)"; fi
    echo "tasks:       $TASKS (GNU parallel: $PAR_TASKS), rounds: $ROUNDS, concurrency: $PAR"
}
echo "== throughput benchmark =="
facts
echo "loadavg at start: $(cat /proc/loadavg)"
[[ -r /proc/pressure/cpu ]] && echo "cpu pressure at start: $(head -1 /proc/pressure/cpu)"
echo "top CPU users at start:"; { ps -eo pcpu,etime,comm --sort=-pcpu | head -6 | sed 's/^/  /'; } || true
echo

# The default calibration, whatever this machine's user or admin stored.
export HTC_SITE_CONFIG=/dev/null

# ---- contenders ----
# Each prints nothing on stdout; the runner measures it. Output of the tasks goes to files.
c_raw_spawn() { "$WORK/rawloop" -P "$PAR" -o "$WORK/o-raw" "$WORK/tasks.txt"; }
c_raw_multi() {
    local i
    for ((i = 0; i < PAR; i++)); do "$WORK/rawloop" -P 1 -o "$WORK/o-multi.$i" "$WORK/share.$i" & done
    wait
}
c_raw_pin()   { "$WORK/rawloop" -a -P "$PAR" -o "$WORK/o-pin" "$WORK/tasks.txt"; }
c_raw_fork()  { "$WORK/rawloop" -f -P "$PAR" -o "$WORK/o-fork" "$WORK/tasks.txt"; }
c_htc_def()   { cd "$WORK/htc" && "$HTC" run "$WORK/tasks.txt"; }
c_htc_base()  { cd "$WORK/htc" && "$HTC_BASE" run "$WORK/tasks.txt"; }
c_htc_1x()    { cd "$WORK/htc" && "$HTC" run --agents 1 --cores-per-agent "$PAR" "$WORK/tasks.txt"; }
c_htc_1l()    { cd "$WORK/htc" && "$HTC" run --agents 1 --cores-per-agent "$PAR" --spawners 1 "$WORK/tasks.txt"; }
c_htc_2x()    { cd "$WORK/htc" && "$HTC" run --agents "$PAR" --cores-per-agent 1 "$WORK/tasks.txt"; }
# More agents than CPUs (one slot each): throughput must not drop as agents are added.
c_htc_4x()    { cd "$WORK/htc" && "$HTC" run --agents 4 --cores-per-agent 1 "$WORK/tasks.txt"; }
c_htc_16x()   { cd "$WORK/htc" && "$HTC" run --agents 16 --cores-per-agent 1 "$WORK/tasks.txt"; }
# xargs takes arguments, not commands, from its input: `true N` for each line N.
c_xargs()     { xargs -P "$PAR" -L 1 true < "$WORK/xargs-input.txt" > "$WORK/xargs.out" 2>&1; }
c_parallel()  { parallel --will-cite -j "$PAR" < "$WORK/tasks-parallel.txt" > "$WORK/parallel.out" 2>&1; }

names=(raw-multi raw-spawn raw-pinned raw-fork htc htc-1agent htc-1loop htc-2agents htc-4agents htc-16agents xargs parallel)
declare -A fn=( [raw-multi]=c_raw_multi [raw-spawn]=c_raw_spawn [raw-pinned]=c_raw_pin [raw-fork]=c_raw_fork [htc]=c_htc_def
                [htc-1agent]=c_htc_1x [htc-1loop]=c_htc_1l [htc-2agents]=c_htc_2x [htc-4agents]=c_htc_4x [htc-16agents]=c_htc_16x
                [xargs]=c_xargs [parallel]=c_parallel )
declare -A ntask=( [raw-multi]=$TASKS [raw-spawn]=$TASKS [raw-pinned]=$TASKS [raw-fork]=$TASKS [htc]=$TASKS [htc-1agent]=$TASKS [htc-1loop]=$TASKS
                   [htc-2agents]=$TASKS [htc-4agents]=$TASKS [htc-16agents]=$TASKS [xargs]=$TASKS
                   [parallel]=$PAR_TASKS )
declare -A desc=(
    [raw-multi]="$PAR x rawloop -P 1, 1/$PAR of the file each"
    [raw-spawn]="rawloop -P $PAR (posix_spawn)"
    [raw-pinned]="rawloop -a -P $PAR (posix_spawn, slot i on CPU i)"
    [raw-fork]="rawloop -f -P $PAR (fork+exec)"
    [htc]="htc run (defaults: one agent, a spawn loop per CPU)"
    [htc-1agent]="htc run --agents 1 --cores-per-agent $PAR (a spawn loop per core)"
    [htc-1loop]="htc run --agents 1 --cores-per-agent $PAR --spawners 1"
    [htc-2agents]="htc run --agents $PAR --cores-per-agent 1"
    [htc-4agents]="htc run --agents 4 --cores-per-agent 1 (4 slots)"
    [htc-16agents]="htc run --agents 16 --cores-per-agent 1 (16 slots)"
    [xargs]="xargs -P $PAR -L 1 true"
    [parallel]="parallel -j $PAR ($PAR_TASKS tasks)"
)

# An older build of htc (its htc-agent beside it), for before/after figures in one run.
HTC_BASE=${HTC_BASE:-}
if [[ -n $HTC_BASE ]]; then
    names+=(htc-base); fn[htc-base]=c_htc_base; ntask[htc-base]=$TASKS
    desc[htc-base]="htc run, the build at $HTC_BASE (defaults)"
fi

if [[ -n ${CONTENDERS:-} ]]; then
    sel=(raw-multi raw-spawn)
    for n in $CONTENDERS; do
        [[ $n == hq ]] && continue   # hq is added below when HQ is set
        [[ -n ${fn[$n]:-} ]] || { echo "unknown contender: $n (known: ${names[*]})" >&2; exit 2; }
        [[ $n == raw-spawn || $n == raw-multi ]] || sel+=("$n")
    done
    names=("${sel[@]}")
fi

# HyperQueue: server + worker are daemons, not children of the timer, so their CPU comes
# from /proc/PID/stat (utime+stime+cutime+cstime; the worker reaps its tasks) before/after.
hq_pids=()
if [[ -n $HQ ]]; then
    export HQ_SERVER_DIR=$WORK/hq-server
    mkdir -p "$HQ_SERVER_DIR"
    "$HQ" server start > "$WORK/hq-server.log" 2>&1 & hq_pids+=($!)
    for _ in $(seq 100); do "$HQ" server info >/dev/null 2>&1 && break; sleep 0.2; done
    "$HQ" worker start --cpus "$PAR" > "$WORK/hq-worker.log" 2>&1 & hq_pids+=($!)
    for _ in $(seq 150); do "$HQ" worker list 2>/dev/null | grep -qi running && break; sleep 0.2; done
    names+=(hq)
    fn[hq]=c_hq; ntask[hq]=$TASKS
    desc[hq]="hq submit --array 1-$TASKS (worker --cpus $PAR, no output kept)"
fi
c_hq() { "$HQ" submit --array "1-$TASKS" --stdout none --stderr none --wait -- true > "$WORK/hq-submit.log" 2>&1; }
proc_cpu() {  # seconds of CPU (self + reaped children) of the given pids
    local tck s=0 p; tck=$(getconf CLK_TCK)
    for p in "$@"; do
        s=$(awk -v s="$s" -v t="$tck" '{ sub(/^.*\) /, ""); print s + ($12+$13+$14+$15)/t }' "/proc/$p/stat")
    done
    echo "$s"
}
stop_hq() {
    if ((${#hq_pids[@]})); then
        "$HQ" server stop >/dev/null 2>&1 || true
        for p in "${hq_pids[@]}"; do kill "$p" 2>/dev/null || true; done
        wait "${hq_pids[@]}" 2>/dev/null || true
        hq_pids=()
    fi
}
trap 'stop_hq; cleanup' EXIT

bg_pids=()
stop_bg() { for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null || true; done; bg_pids=(); }
BG_LOAD=${BG_LOAD:-0}
if ((BG_LOAD > 0)); then
    : > "$WORK/bg.pids"
    for ((i = 0; i < BG_LOAD; i++)); do
        setsid sh -c 'echo $$ >> "$1"; while :; do :; done' sh "$WORK/bg.pids" &
    done
    for _ in $(seq 50); do (($(wc -l < "$WORK/bg.pids") >= BG_LOAD)) && break; sleep 0.1; done
    mapfile -t bg_pids < "$WORK/bg.pids"
    echo "background load: $BG_LOAD busy loops in sessions of their own (pids ${bg_pids[*]})"
fi
trap 'stop_bg; stop_hq; cleanup' EXIT

reset_outputs() { rm -rf "$WORK/htc" "$WORK/o-raw" "$WORK"/o-multi.* "$WORK/o-pin" "$WORK/o-fork" "$WORK"/*.out; mkdir -p "$WORK/htc"; }

RAW=$WORK/raw.tsv
printf 'round\tcontender\ttasks\twall_s\tuser_s\tsys_s\trc\n' > "$RAW"
run_one() {  # round name
    local r=$1 n=$2 t0 t1 rc=0 u s
    reset_outputs
    sync
    if [[ $n == hq ]]; then
        local c0; c0=$(proc_cpu "${hq_pids[@]}")
        t0=$($MONO); c_hq || rc=$?; t1=$($MONO)
        local c1; c1=$(proc_cpu "${hq_pids[@]}")
        u=$(awk -v a="$c0" -v b="$c1" 'BEGIN { print b - a }'); s=0   # user+sys together
    else
        t0=$($MONO)
        $TIME -f '%U %S' -o "$WORK/time.txt" bash -c "$(declare -f "${fn[$n]}"); $(declare -p WORK PAR HTC HTC_BASE); ${fn[$n]}" \
            > "$WORK/log-$n.txt" 2>&1 || rc=$?
        t1=$($MONO)
        read -r u s < <(tail -1 "$WORK/time.txt")
    fi
    local wall; wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$n" "${ntask[$n]}" "$wall" "$u" "$s" "$rc" >> "$RAW"
    awk -v r="$r" -v n="$n" -v k="${ntask[$n]}" -v w="$wall" -v u="$u" -v s="$s" -v rc="$rc" 'BEGIN {
        printf "  round %d  %-12s %7d tasks  %8.2f s  %8.0f tasks/s  cpu %.3f ms/task  rc=%d\n",
               r, n, k, w, k / w, 1000 * (u + s) / k, rc }'
    if [[ $rc != 0 ]]; then echo "    FAILED (rc=$rc); log:"; tail -5 "$WORK/log-$n.txt" | sed 's/^/    /'; fi
}

echo "== rounds =="
nn=${#names[@]}
for ((r = 1; r <= ROUNDS; r++)); do
    echo "round $r/$ROUNDS  (loadavg $(cut -d' ' -f1-3 /proc/loadavg))"
    for ((i = 0; i < nn; i++)); do
        run_one "$r" "${names[$(((i + r - 1) % nn))]}"
    done
done
stop_hq
stop_bg
echo
echo "loadavg at end: $(cat /proc/loadavg)"
[[ -r /proc/pressure/cpu ]] && echo "cpu pressure at end: $(head -1 /proc/pressure/cpu)"
echo

# ---- medians ----
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
declare -A med_rate med_cpu med_wall nfail
for n in "${names[@]}"; do
    med_rate[$n]=$(awk -F'\t' -v n="$n" '$2 == n { print $3 / $4 }' "$RAW" | median)
    med_cpu[$n]=$(awk -F'\t' -v n="$n" '$2 == n { print 1000 * ($5 + $6) / $3 }' "$RAW" | median)
    med_wall[$n]=$(awk -F'\t' -v n="$n" '$2 == n { print $4 }' "$RAW" | median)
    nfail[$n]=$(awk -F'\t' -v n="$n" '$2 == n && $7 != 0' "$RAW" | wc -l)
done
base=${med_rate[raw-multi]}
one=${med_rate[raw-spawn]}
echo "== medians over $ROUNDS rounds ($TASKS true tasks; concurrency $PAR) =="
printf '| %-12s | %-46s | %10s | %10s | %12s | %13s | %13s | %6s |\n' contender command "wall s" "tasks/s" "CPU ms/task" "vs raw-multi" "vs raw-spawn" "failed"
printf '|%s|%s|%s|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..14})" "$(printf -- '-%.0s' {1..48})" "$(printf -- '-%.0s' {1..12})" \
    "$(printf -- '-%.0s' {1..12})" "$(printf -- '-%.0s' {1..14})" "$(printf -- '-%.0s' {1..15})" "$(printf -- '-%.0s' {1..15})" "$(printf -- '-%.0s' {1..8})"
for n in "${names[@]}"; do
    awk -v n="$n" -v d="${desc[$n]}" -v w="${med_wall[$n]}" -v t="${med_rate[$n]}" -v c="${med_cpu[$n]}" \
        -v b="$base" -v o="$one" -v f="${nfail[$n]}" 'BEGIN {
        printf "| %-12s | %-46s | %10.2f | %10.0f | %12.3f | %12.1f%% | %12.1f%% | %6d |\n", n, d, w, t, c, 100 * t / b, 100 * t / o, f }'
done
echo
if [[ " ${names[*]} " == *" parallel "* ]]; then
    echo "(wall s: median wall time of the contender's own task count; parallel ran $PAR_TASKS tasks)"
fi
echo "raw per-round data:"
sed 's/^/  /' "$RAW"
cp "$RAW" "${OUT%.txt}.tsv"
echo "report: $OUT (per-round data: ${OUT%.txt}.tsv)"
