#!/usr/bin/env bash
# Tasks per second against the cores used: does htc keep up with the raw spawn limit as a node
# gets more cores? (issue 42)
#
#   bench/many-core.sh                                 # 20,000 `true` tasks, 3 rounds, k = 1 2 4 … all
#   TASKS=3000 ROUNDS=1 HQ=/path/to/hq bench/many-core.sh
#   MAX_CORES=8 CONTENDERS="htc htc-1slot" bench/many-core.sh
#   TIME_BUDGET_S=420 bash DIR/many-core.sh            # from a bundle (below), within 7 minutes
#
#   HQ=/path/to/hq bench/many-core.sh --bundle bench/bundle   # everything a run needs, in one dir
#
# For each core count k (1, 2, 4, … up to every CPU this process may use, plus that count when it
# is not a power of two) every contender runs under `taskset -c <the first k allowed CPUs>`, the
# whole contender (server, agents, spawn loops, tasks) inside it:
#   raw-multi   k independent `rawloop -P 1`, each on every k-th line of the file: the limit
#   htc         `htc run tasks.txt` (the default: one agent, a slot and a spawn loop per CPU it
#               may use; htc sizes itself from sched_getaffinity, so taskset alone gives k cores)
#   htc-1slot   `htc run --agents k --cores-per-agent 1` (k one-slot agents)
#   htc-mem     the default layout, every task with `mem=64M` (`#HTC mem=64M`), enforced by
#               `--mem-limit $MEM_LIMIT` (cgroup: a memory cgroup per slot); skipped, with the
#               reason, when a probe run with that setting fails (no usable memory cgroups)
#   hq          HyperQueue, when HQ is set (or an `hq` lies beside the script): a server and a
#               worker `--cpus k` started under the same taskset for each round and k, then
#               `hq submit --array 1-N --stdout none --stderr none --wait -- true`, timed
# Rounds are the outer loop (every k in each round, contenders in an order rotated every
# measurement), so a run cut short by TIME_BUDGET_S still covers every k once. Reported: medians
# over the rounds that succeeded, tasks/s per contender and each one as % of raw-multi at the same
# k, and the CPUs each kept busy (CPU seconds of the whole process tree / wall seconds, from bash's
# `times`; hq: /proc/PID/stat of server and worker). Where affinity is recorded but not enforced
# (gVisor), taskset sets what a program sees and sizes itself by, not where it runs: the header's
# affinity test and the busy column show it.
#
# Env: TASKS (20000), ROUNDS (3), MAX_CORES (cap of the core list, itself included), CORES (an
#      explicit core list, e.g. "8 16", instead), CONTENDERS (space-separated subset; raw-multi is
#      always added), TIME_BUDGET_S (none: once spent, nothing more starts, a measurement still
#      running is killed, and the tables show what was measured), MEM (64M), MEM_LIMIT (cgroup;
#      `auto` or `watch` runs htc-mem with the RSS watch where cgroups are unusable), HTC (htc
#      binary, htc-agent beside it), HQ, OUT_DIR (bench/results; a bundle's results/), WORK
#      (scratch, default mktemp under /tmp, removed unless KEEP=1).
#
# Bundle: `--bundle DIR` copies into DIR, stripped: htc, htc-agent, rawloop and a monotonic clock
# (`mono`) built with `gcc -O2 -static` (dynamic if static fails), hq when HQ is set, and this
# script. `bash DIR/many-core.sh` then runs with no compiler, network, GNU time or parallel; it
# knows the layout by the binaries beside it. Needs bash, coreutils (taskset: util-linux), awk.
set -euo pipefail

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
BENCH=$(dirname "$SELF")
if [[ -x $BENCH/htc && -x $BENCH/htc-agent && -x $BENCH/rawloop ]]; then
    MODE=bundle
    ROOT=
    HTC=${HTC:-$BENCH/htc}
    [[ -x $BENCH/hq ]] && HQ=${HQ-$BENCH/hq}
else
    MODE=repo
    ROOT=$(cd "$BENCH/.." && pwd)
    HTC=${HTC:-$ROOT/target/dist/htc}
fi
HQ=${HQ:-}

# ---- --bundle DIR ----
copy_bin() {  # SRC DST: a stripped copy where strip works
    if command -v strip >/dev/null && strip -o "$2" "$1" 2>/dev/null; then :; else cp "$1" "$2"; fi
    chmod 755 "$2"
}
build_c() {  # SRC DST: static where possible; prints how it was linked
    if gcc -O2 -static -o "$2" "$1" 2>/dev/null; then echo static
    else gcc -O2 -o "$2" "$1"; echo dynamic; fi
    strip "$2" 2>/dev/null || true
}
MONO_C='#include <stdio.h>
#include <time.h>
int main(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  printf("%ld.%09ld\n", (long)t.tv_sec, t.tv_nsec); return 0; }'
make_bundle() {
    local dir=$1 agent how_raw how_mono
    agent=$(dirname "$HTC")/htc-agent
    [[ -x $HTC && -x $agent ]] || { echo "no $HTC or $agent (cargo build --profile dist -p node-agent)" >&2; exit 1; }
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [[ $dir == "$BENCH" ]] && { echo "--bundle: DIR must not be the script's own directory" >&2; exit 2; }
    copy_bin "$HTC" "$dir/htc"
    copy_bin "$agent" "$dir/htc-agent"
    if [[ -f $BENCH/rawloop.c ]]; then
        command -v gcc >/dev/null || { echo "gcc is needed to build rawloop" >&2; exit 1; }
        how_raw=$(build_c "$BENCH/rawloop.c" "$dir/rawloop")
        printf '%s\n' "$MONO_C" > "$dir/mono.c"
        how_mono=$(build_c "$dir/mono.c" "$dir/mono")
        rm -f "$dir/mono.c"
    else  # bundling from a bundle
        cp "$BENCH/rawloop" "$dir/rawloop"; how_raw=copied
        if [[ -x $BENCH/mono ]]; then cp "$BENCH/mono" "$dir/mono"; fi; how_mono=copied
    fi
    rm -f "$dir/hq"
    if [[ -n $HQ ]]; then copy_bin "$HQ" "$dir/hq"; fi
    cp "$SELF" "$dir/many-core.sh"
    chmod 755 "$dir/many-core.sh"
    {
        echo "many-core bundle, made $(date -Is) on $(uname -n)"
        if [[ -n $ROOT ]]; then echo "commit: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')"; fi
        echo "htc: $("$HTC" --version) from $HTC, built $(date -r "$HTC" -Is) (the commit above is the tree's, not necessarily the build's)"
        echo "rawloop: $how_raw, mono: $how_mono"
        if [[ -n $HQ ]]; then echo "hq: $("$HQ" --version 2>&1 | head -1) from $HQ"; fi
        echo "run: bash DIR/many-core.sh, DIR being this directory wherever it lies (env as in the script's header)"
    } > "$dir/BUNDLE.txt"
    echo "bundle: $dir"
    (cd "$dir" && ls -l) | sed 's/^/  /'
    echo "size: $(du -sh "$dir" | cut -f1)"
    if [[ -n $ROOT ]] && [[ $dir == "$ROOT"/* ]] && ! git -C "$ROOT" check-ignore -q "$dir" 2>/dev/null; then
        echo "warning: $dir is inside the repository and not ignored (add it to .git/info/exclude)" >&2
    fi
}
case ${1:-} in
    --bundle) [[ -n ${2:-} ]] || { echo "usage: $0 --bundle DIR" >&2; exit 2; }; make_bundle "$2"; exit 0 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) echo "usage: $0 [--bundle DIR]" >&2; exit 2 ;;
esac

TASKS=${TASKS:-20000}
ROUNDS=${ROUNDS:-3}
MEM=${MEM:-64M}
MEM_LIMIT=${MEM_LIMIT:-cgroup}
TIME_BUDGET_S=${TIME_BUDGET_S:-}
[[ -x $HTC && -x $(dirname "$HTC")/htc-agent ]] || { echo "no $HTC or htc-agent beside it (cargo build --profile dist -p node-agent)" >&2; exit 1; }
command -v taskset >/dev/null || { echo "taskset (util-linux) is needed" >&2; exit 1; }
[[ $TASKS =~ ^[1-9][0-9]*$ && $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "TASKS and ROUNDS must be positive integers" >&2; exit 2; }
[[ -z $TIME_BUDGET_S || $TIME_BUDGET_S =~ ^[0-9]+$ ]] || { echo "TIME_BUDGET_S must be whole seconds" >&2; exit 2; }

# ---- cores ----
# The CPUs this process may use, in order; k cores = the first k of them (0-(k-1) normally).
mapfile -t CPUS < <(taskset -pc $$ | sed 's/.*: *//' | tr ',' '\n' |
    awk -F- 'NF == 2 { for (i = $1; i <= $2; i++) print i; next } NF == 1 && $1 != "" { print $1 }')
((${#CPUS[@]})) || mapfile -t CPUS < <(seq 0 $(($(nproc) - 1)))   # taskset -p unreadable: 0..nproc-1
NCPU=${#CPUS[@]}
cpulist() { local k=$1 s="" i; for ((i = 0; i < k; i++)); do s+=${s:+,}${CPUS[i]}; done; echo "$s"; }
if [[ -n ${CORES:-} ]]; then
    read -ra KS <<< "$CORES"
else
    cap=${MAX_CORES:-$NCPU}
    [[ $cap =~ ^[0-9]+$ ]] || { echo "MAX_CORES must be a number" >&2; exit 2; }
    ((cap > NCPU)) && cap=$NCPU; ((cap < 1)) && cap=1
    KS=(); for ((k = 1; k <= cap; k *= 2)); do KS+=("$k"); done
    ((KS[${#KS[@]} - 1] == cap)) || KS+=("$cap")
fi
for k in "${KS[@]}"; do
    if ! [[ $k =~ ^[1-9][0-9]*$ ]] || ((k > NCPU)); then echo "core count $k: not between 1 and the $NCPU CPUs allowed" >&2; exit 2; fi
    ((k <= TASKS)) || { echo "core count $k: more than the $TASKS tasks" >&2; exit 2; }
done

# ---- contenders ----
notes=()
names=(raw-multi htc htc-1slot htc-mem)
[[ -n $HQ ]] && names+=(hq)
if [[ -n ${CONTENDERS:-} ]]; then
    sel=(raw-multi)
    for n in $CONTENDERS; do
        [[ $n == raw-multi ]] && continue
        [[ " raw-multi htc htc-1slot htc-mem hq " == *" $n "* ]] || { echo "unknown contender: $n (known: raw-multi htc htc-1slot htc-mem hq)" >&2; exit 2; }
        if [[ $n == hq && -z $HQ ]]; then notes+=("hq: skipped (HQ is not set)"); continue; fi
        sel+=("$n")
    done
    names=("${sel[@]}")
fi
declare -A desc=(
    [raw-multi]="k x rawloop -P 1, each on 1/k of the file"
    [htc]="htc run (default layout: one agent, k slots)"
    [htc-1slot]="htc run --agents k --cores-per-agent 1"
    [htc-mem]="htc run, every task mem=$MEM, --mem-limit $MEM_LIMIT"
    [hq]="hq submit --array 1-N (server + worker --cpus k), no output kept"
)

STAMP=$(date +%Y%m%d-%H%M%S)
OUT_DIR=${OUT_DIR:-$BENCH/results}
mkdir -p "$OUT_DIR"
OUT=$OUT_DIR/many-core-$STAMP.txt
TSV=$OUT_DIR/many-core-$STAMP.tsv
WORK=${WORK:-$(mktemp -d /tmp/htc-many-core.XXXXXX)}
mkdir -p "$WORK"
hq_pids=()
stop_hq() {
    if ((${#hq_pids[@]})); then
        "$HQ" server stop >/dev/null 2>&1 || true
        for p in "${hq_pids[@]}"; do kill "$p" 2>/dev/null || true; done
        wait "${hq_pids[@]}" 2>/dev/null || true
        hq_pids=()
    fi
}
cleanup() { stop_hq; [[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"; }
trap cleanup EXIT

exec > >(tee "$OUT") 2>&1

# ---- tools ----
if [[ $MODE == bundle ]]; then
    RAWLOOP=$BENCH/rawloop
    [[ -x $BENCH/mono ]] && MONO=$BENCH/mono
else
    command -v gcc >/dev/null || { echo "gcc is needed to build rawloop (or run from a bundle: --bundle DIR)" >&2; exit 1; }
    gcc -O2 -o "$WORK/rawloop" "$BENCH/rawloop.c"
    RAWLOOP=$WORK/rawloop
    printf '%s\n' "$MONO_C" > "$WORK/mono.c"
    gcc -O2 -o "$WORK/mono" "$WORK/mono.c" && MONO=$WORK/mono
fi
# Monotonic clock for wall times; date's clock is wall-clock and can jump.
if [[ -n ${MONO:-} ]]; then CLOCK="monotonic ($MONO)"; now() { "$MONO"; }
elif command -v python3 >/dev/null; then CLOCK="monotonic (python3)"; now() { python3 -c 'import time; print("%.9f" % time.monotonic())'; }
else CLOCK="wall clock (date +%s.%N: no monotonic clock helper)"; now() { date +%s.%N; }
fi
HAVE_TIMEOUT=0; command -v timeout >/dev/null && HAVE_TIMEOUT=1
T_START=$(now)
elapsed() { awk -v a="$T_START" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ---- inputs ----
awk -v n="$TASKS" 'BEGIN { for (i = 0; i < n; i++) print "true" }' > "$WORK/tasks.txt"
{ echo "#HTC mem=$MEM"; cat "$WORK/tasks.txt"; } > "$WORK/tasks-mem.txt"
for k in "${KS[@]}"; do  # raw-multi's shares: line i to share i mod k
    mkdir -p "$WORK/shares-$k"
    awk -v p="$k" -v w="$WORK/shares-$k" '{ print > (w "/share." (NR % p)) }' "$WORK/tasks.txt"
done

# The default calibration, whatever this machine's user or admin stored.
export HTC_SITE_CONFIG=/dev/null

# ---- machine facts ----
gvisor="no"
if [[ $(uname -r) == 4.4.0 ]]; then gvisor="yes (uname -r is 4.4.0, gVisor's)"
elif dmesg 2>/dev/null | grep -qi gvisor; then gvisor="yes (dmesg names gVisor)"
fi
# Is affinity enforced? Two busy loops for 1 s under `taskset -c <one CPU>`: about 1 CPU-second
# where it is, about 2 where the mask is only recorded (gVisor).
affinity_test() {
    ((NCPU >= 2 && HAVE_TIMEOUT)) || { echo "not tested (needs 2 CPUs and timeout)"; return; }
    local c
    c=$(taskset -c "${CPUS[0]}" bash -c 'for i in 1 2; do timeout 1 sh -c "while :; do :; done" & done; wait; times' |
        tail -1 | awk '{ n = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); n += p[1] * 60 + p[2] } printf "%.2f", n }')
    awk -v c="$c" 'BEGIN { printf "%s (two busy loops under taskset of one CPU for 1 s used %.2f CPU-s)\n", (c < 1.4 ? "enforced" : "NOT enforced: taskset caps what programs see, not the CPUs they use"), c }'
}
commit="?"
if [[ $MODE == repo ]]; then commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')
elif [[ -f $BENCH/BUNDLE.txt ]]; then commit=$(sed -n 's/^commit: //p' "$BENCH/BUNDLE.txt"); fi
echo "== many-core benchmark: tasks/s against cores used (issue 42) =="
echo "date:        $(date -Is)"
echo "host:        $(uname -n)  kernel $(uname -r)  $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"')"
echo "gVisor:      $gvisor"
echo "nproc:       $NCPU allowed (CPUs ${CPUS[*]:0:8}$( ((NCPU > 8)) && echo " …")), $(nproc --all 2>/dev/null || echo '?') online"
echo "cpu:         $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "ram:         $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
echo "affinity:    $(affinity_test)"
echo "memory cg:   $(grep -E '(^|[:,])memory[:,]|^0::' /proc/self/cgroup 2>/dev/null | head -1 || echo '?')"
echo "mode:        $MODE ($BENCH)"
echo "htc:         $("$HTC" --version)  ($commit)"
[[ -n $HQ ]] && echo "hq:          $("$HQ" --version 2>&1 | head -1)"
echo "clock:       $CLOCK"
echo "tasks:       $TASKS true, rounds: $ROUNDS, cores: ${KS[*]}, contenders: ${names[*]}"
echo "budget:      ${TIME_BUDGET_S:-none}${TIME_BUDGET_S:+ s}$( ((HAVE_TIMEOUT)) || echo ' (no timeout(1): a running measurement cannot be cut)')"
for x in "${notes[@]}"; do echo "$x"; done
echo "loadavg at start: $(cat /proc/loadavg)"
[[ -r /proc/pressure/cpu ]] && echo "cpu pressure at start: $(head -1 /proc/pressure/cpu)"
echo

# ---- htc-mem probe ----
if [[ " ${names[*]} " == *" htc-mem "* ]]; then
    mkdir -p "$WORK/probe"
    printf '#HTC mem=%s\ntrue\ntrue\n' "$MEM" > "$WORK/probe/t.txt"
    prc=0
    pguard=(); ((HAVE_TIMEOUT)) && pguard=(timeout -k 3 120)
    (cd "$WORK/probe" && "${pguard[@]}" "$HTC" run -q --mem-limit "$MEM_LIMIT" t.txt) > "$WORK/probe.log" 2>&1 || prc=$?
    how=$(cat "$WORK"/probe/.htc/*/log/*.log 2>/dev/null | grep -o "tasks' mem= enforced by [^=]*" | head -1 | sed 's/ [a-z]*$//' || true)
    if ((prc != 0)); then
        echo "htc-mem: skipped: a probe run with --mem-limit $MEM_LIMIT failed (rc=$prc):"
        tail -5 "$WORK/probe.log" | sed 's/^/    /'
        { cat "$WORK"/probe/.htc/*/log/*.log 2>/dev/null | grep -iE 'error|warn|cgroup' | tail -3 | sed 's/^/    /'; } || true
        echo "  (memory cgroups unusable here; MEM_LIMIT=auto measures the RSS watch instead)"
        sel=(); for n in "${names[@]}"; do [[ $n == htc-mem ]] || sel+=("$n"); done; names=("${sel[@]}")
    else
        echo "htc-mem: probe ok: ${how:-enforcement not named in the agent log}"
    fi
    rm -rf "$WORK/probe"
    echo
fi

# ---- contenders (run inside `taskset -c LIST bash -c`, with K, WORK, HTC, RAWLOOP, MEM_LIMIT) ----
c_raw_multi() {
    local i p rc=0 pids=()
    for ((i = 0; i < K; i++)); do "$RAWLOOP" -P 1 -o "$WORK/o-multi.$i" "$WORK/shares-$K/share.$i" & pids+=($!); done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    return "$rc"
}
c_htc()       { cd "$WORK/htc" && "$HTC" run "$WORK/tasks.txt"; }
c_htc_1slot() { cd "$WORK/htc" && "$HTC" run --agents "$K" --cores-per-agent 1 "$WORK/tasks.txt"; }
c_htc_mem()   { cd "$WORK/htc" && "$HTC" run --mem-limit "$MEM_LIMIT" "$WORK/tasks-mem.txt"; }
declare -A fn=([raw-multi]=c_raw_multi [htc]=c_htc [htc-1slot]=c_htc_1slot [htc-mem]=c_htc_mem)

proc_cpu() {  # CPU seconds (self + reaped children) of the given pids
    local tck s=0 p; tck=$(getconf CLK_TCK)
    for p in "$@"; do
        s=$(awk -v s="$s" -v t="$tck" '{ sub(/^.*\) /, ""); print s + ($12+$13+$14+$15)/t }' "/proc/$p/stat" 2>/dev/null || echo "$s")
    done
    echo "$s"
}
start_hq() {  # K LIST: server and worker under taskset; 0 when the worker is up
    export HQ_SERVER_DIR=$WORK/hq-server
    rm -rf "$HQ_SERVER_DIR"; mkdir -p "$HQ_SERVER_DIR"
    taskset -c "$2" "$HQ" server start > "$WORK/hq-server.log" 2>&1 & hq_pids+=($!)
    local up=0
    for _ in $(seq 100); do "$HQ" server info >/dev/null 2>&1 && { up=1; break; }; sleep 0.2; done
    ((up)) || return 1
    taskset -c "$2" "$HQ" worker start --cpus "$1" > "$WORK/hq-worker.log" 2>&1 & hq_pids+=($!)
    for _ in $(seq 150); do "$HQ" worker list 2>/dev/null | grep -qi running && return 0; sleep 0.2; done
    return 1
}

# Seconds left of the budget (a big number without one).
left() { if [[ -n $TIME_BUDGET_S ]]; then awk -v b="$TIME_BUDGET_S" -v e="$(elapsed)" 'BEGIN { printf "%d", b - e }'; else echo 999999; fi; }
MARGIN=5   # kept for stopping hq and printing the tables
declare -A last_wall
skipped=0
printf 'round\tcores\tcontender\ttasks\twall_s\tcpu_s\tslots\trc\n' > "$TSV"
reset_outputs() { rm -rf "$WORK/htc" "$WORK"/o-multi.* "$WORK/times.txt"; mkdir -p "$WORK/htc"; }

run_one() {  # round k name
    local r=$1 k=$2 n=$3 list t0 t1 rc=0 cpu=NA slots=$2 rem est wall
    list=$(cpulist "$k")
    rem=$(($(left) - MARGIN))
    est=${last_wall[$k.$n]:-0}
    [[ $n == hq ]] && est=$(awk -v e="$est" 'BEGIN { printf "%d", e + 3 }')  # + hq's start
    if awk -v e="$est" -v r="$rem" 'BEGIN { exit !(e >= r) }'; then
        printf '  round %d  k=%-3d %-10s skipped: %s s of the budget left%s\n' "$r" "$k" "$n" "$((rem > 0 ? rem : 0))" \
            "$(awk -v e="$est" 'BEGIN { if (e > 0) printf " (expected: %.1f s)", e }')"
        skipped=$((skipped + 1)); return 0
    fi
    local guard=(); ((HAVE_TIMEOUT)) && [[ -n $TIME_BUDGET_S ]] && guard=(timeout -k 3 "$((rem > 1 ? rem : 1))")
    reset_outputs
    sync
    if [[ $n == hq ]]; then
        if ! start_hq "$k" "$list"; then
            echo "  round $r  k=$k hq: server or worker did not come up; logs:"; tail -3 "$WORK"/hq-*.log | sed 's/^/    /'
            stop_hq; rc=99; wall=0
        else
            local c0 c1; c0=$(proc_cpu "${hq_pids[@]}")
            rem=$(($(left) - MARGIN)); ((HAVE_TIMEOUT)) && [[ -n $TIME_BUDGET_S ]] && guard=(timeout -k 3 "$((rem > 1 ? rem : 1))")
            t0=$(now)
            "${guard[@]}" taskset -c "$list" "$HQ" submit --array "1-$TASKS" --stdout none --stderr none --wait -- true \
                > "$WORK/log-hq.txt" 2>&1 || rc=$?
            t1=$(now)
            c1=$(proc_cpu "${hq_pids[@]}")
            cpu=$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.3f", b - a }')
            stop_hq
            wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
        fi
    else
        t0=$(now)
        "${guard[@]}" taskset -c "$list" bash -c "$(declare -f "${fn[$n]}"); $(declare -p WORK HTC RAWLOOP MEM_LIMIT)
            K=$k; ${fn[$n]}; rc=\$?; times > \"\$WORK/times.txt\"; exit \$rc" > "$WORK/log-$n.txt" 2>&1 || rc=$?
        t1=$(now)
        wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
        if [[ -s $WORK/times.txt ]]; then  # the second line: user and sys of the reaped children
            cpu=$(tail -1 "$WORK/times.txt" | awk '{ n = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); n += p[1] * 60 + p[2] } printf "%.3f", n }')
        fi
        if [[ $n == htc* ]]; then  # the slots the agents said they have
            slots=$({ cat "$WORK"/htc/.htc/*/log/*.log 2>/dev/null || true; } | { grep ' joined ' || true; } | { grep -o ' slots=[0-9]*' || true; } |
                awk -F= '{ s += $2 } END { print s + 0 }')
        fi
    fi
    ((rc == 0)) && last_wall[$k.$n]=$wall
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$k" "$n" "$TASKS" "$wall" "$cpu" "$slots" "$rc" >> "$TSV"
    awk -v r="$r" -v k="$k" -v n="$n" -v t="$TASKS" -v w="$wall" -v c="$cpu" -v s="$slots" -v rc="$rc" 'BEGIN {
        printf "  round %d  k=%-3d %-10s %7d tasks  %8.2f s  %8.0f tasks/s", r, k, n, t, w, (w > 0 ? t / w : 0)
        if (c != "NA" && w > 0) printf "  cpu %.3f ms/task  busy %5.2f CPUs", 1000 * c / t, c / w
        printf "  slots %d  rc=%d\n", s, rc }'
    if ((rc != 0)); then
        echo "    FAILED (rc=$rc$( ((rc == 124 || rc == 137)) && echo ': cut by the time budget')); log:"
        tail -5 "$WORK/log-$n.txt" 2>/dev/null | sed 's/^/    /'
    elif [[ $slots != "$k" ]]; then
        echo "    warning: the agents reported $slots slots, not $k"
    fi
}

echo "== rounds =="
nn=${#names[@]}
for ((r = 1; r <= ROUNDS; r++)); do
    echo "round $r/$ROUNDS  (loadavg $(cut -d' ' -f1-3 /proc/loadavg), $(elapsed) s in)"
    for ((ki = 0; ki < ${#KS[@]}; ki++)); do
        for ((i = 0; i < nn; i++)); do
            run_one "$r" "${KS[ki]}" "${names[$(((i + r - 1 + ki) % nn))]}"
        done
    done
done
stop_hq
echo
echo "loadavg at end: $(cat /proc/loadavg)   elapsed: $(elapsed) s"
[[ -r /proc/pressure/cpu ]] && echo "cpu pressure at end: $(head -1 /proc/pressure/cpu)"
((skipped)) && echo "skipped for the time budget: $skipped measurements"
echo

# ---- tables ----
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
declare -A rate busy nok
for k in "${KS[@]}"; do
    for n in "${names[@]}"; do
        rate[$k.$n]=$(awk -F'\t' -v k="$k" -v n="$n" 'NR > 1 && $2 == k && $3 == n && $8 == 0 && $5 > 0 { print $4 / $5 }' "$TSV" | median)
        busy[$k.$n]=$(awk -F'\t' -v k="$k" -v n="$n" 'NR > 1 && $2 == k && $3 == n && $8 == 0 && $5 > 0 && $6 != "NA" { print $6 / $5 }' "$TSV" | median)
        nok[$k.$n]=$(awk -F'\t' -v k="$k" -v n="$n" 'NR > 1 && $2 == k && $3 == n && $8 == 0' "$TSV" | wc -l)
    done
done
echo "== tasks/s, medians over the rounds that succeeded ($TASKS true tasks; % = of raw-multi at the same k) =="
line="| cores |"; rule="|------:|"
for n in "${names[@]}"; do
    if [[ $n == raw-multi ]]; then line+=$(printf ' %12s |' "$n"); rule+="-------------:|"
    else line+=$(printf ' %12s | %6s |' "$n" "%"); rule+="-------------:|-------:|"; fi
done
echo "$line"; echo "$rule"
partial=()
for k in "${KS[@]}"; do
    base=${rate[$k.raw-multi]}
    line=$(printf '| %5d |' "$k")
    for n in "${names[@]}"; do
        t=${rate[$k.$n]}
        ((${nok[$k.$n]} < ROUNDS)) && partial+=("$n@$k: ${nok[$k.$n]}/$ROUNDS")
        if [[ -z $t ]]; then cell=$(printf ' %12s |' -)
        else cell=$(awk -v t="$t" 'BEGIN { printf " %12.0f |", t }'); fi
        if [[ $n != raw-multi ]]; then
            if [[ -n $t && -n $base ]]; then cell+=$(awk -v t="$t" -v b="$base" 'BEGIN { printf " %5.1f%% |", 100 * t / b }')
            else cell+=$(printf ' %6s |' -); fi
        fi
        line+=$cell
    done
    echo "$line"
done
echo
echo "== CPUs kept busy (CPU seconds of the contender's whole tree / wall seconds, medians) =="
line="| cores |"; rule="|------:|"
for n in "${names[@]}"; do line+=$(printf ' %10s |' "$n"); rule+="-----------:|"; done
echo "$line"; echo "$rule"
for k in "${KS[@]}"; do
    line=$(printf '| %5d |' "$k")
    for n in "${names[@]}"; do
        b=${busy[$k.$n]}
        if [[ -z $b ]]; then line+=$(printf ' %10s |' -); else line+=$(awk -v b="$b" 'BEGIN { printf " %10.2f |", b }'); fi
    done
    echo "$line"
done
echo "(at most k where affinity is enforced; above k, the contender used more CPUs than taskset gave it; hq: server + worker only)"
echo
if ((${#partial[@]})); then echo "cells with fewer good rounds than $ROUNDS (failed, cut or skipped): ${partial[*]}"; echo; fi
echo "contenders:"
for n in "${names[@]}"; do printf '  %-10s %s\n' "$n" "${desc[$n]}"; done
echo
echo "per-round data: $TSV"
echo "report: $OUT"
