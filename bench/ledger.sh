#!/usr/bin/env bash
# Ledger scale: `htc prepare` time / peak RSS / run-directory size for big task files, and
# the leader's and agents' peak RSS while `htc run` executes 1 M `true` tasks.
#
#   bench/ledger.sh
#   SIZES="1000000" RUN_TASKS=200000 bench/ledger.sh
#
# Env: SIZES ("1000000 10000000": task counts for `htc prepare`, lines `./sim --seed N`),
#      RUN_TASKS (1000000: `true` tasks for the run), HTC (target/dist/htc),
#      WORK (scratch dir; default mktemp under /tmp, deleted at the end unless KEEP=1),
#      OUT (report; default bench/results/ledger-<date>.txt), MIN_FREE_GB (20).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
SIZES=${SIZES:-"1000000 10000000"}
RUN_TASKS=${RUN_TASKS:-1000000}
HTC=${HTC:-$ROOT/target/dist/htc}
MIN_FREE_GB=${MIN_FREE_GB:-20}
STAMP=$(date +%Y%m%d-%H%M%S)
mkdir -p "$BENCH/results"
OUT=${OUT:-$BENCH/results/ledger-$STAMP.txt}
WORK=${WORK:-$(mktemp -d /tmp/htc-ledger.XXXXXX)}
mkdir -p "$WORK"
trap '[[ ${KEEP:-0} == 1 ]] || rm -rf "$WORK"' EXIT

exec > >(tee "$OUT") 2>&1

[[ -x /usr/bin/time ]] || { apt-get update -qq && apt-get install -y -qq time >/dev/null; }
if [[ ! -x $HTC || ! -x $(dirname "$HTC")/htc-agent ]]; then
    (cd "$ROOT" && cargo build --profile dist -p node-agent)
fi
gcc -O2 -x c -o "$WORK/mono" - <<'EOF'
#include <stdio.h>
#include <time.h>
int main(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  printf("%ld.%09ld\n", (long)t.tv_sec, t.tv_nsec); return 0; }
EOF
MONO=$WORK/mono

echo "== ledger benchmark =="
echo "date:        $(date -Is)"
echo "host:        $(uname -n)  kernel $(uname -r)"
echo "nproc:       $(nproc)"
echo "cpu:         $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "ram:         $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
echo "htc:         $("$HTC" --version)  ($(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "scratch:     $WORK ($(df -h --output=fstype,size,avail "$WORK" | tail -1 | xargs))"
echo "loadavg at start: $(cat /proc/loadavg)"
echo

free_gb=$(df --output=avail -BG "$WORK" | tail -1 | tr -dc 0-9)
if ((free_gb < MIN_FREE_GB)); then
    echo "only ${free_gb} GB free under $WORK (need $MIN_FREE_GB; set MIN_FREE_GB to override)" >&2
    exit 1
fi

# Pull fields out of `/usr/bin/time -v` output.
tv() { grep -F "$2" "$1" | tail -1 | awk -F': ' '{ print $2 }'; }

echo "== htc prepare =="
printf '| %10s | %10s | %10s | %12s | %14s | %14s | %16s |\n' tasks "file MB" "wall s" "tasks/s" "peak RSS MB" "run dir MB" "ledger.mdb MB"
printf '|%s|\n' "------------|------------|------------|--------------|----------------|----------------|------------------"
notes=()
for n in $SIZES; do
    d=$WORK/prep-$n
    mkdir -p "$d"
    awk -v n="$n" 'BEGIN { for (i = 1; i <= n; i++) print "./sim --seed " i }' > "$d/tasks.txt"
    sync
    t0=$($MONO)
    (cd "$d" && /usr/bin/time -v "$HTC" prepare tasks.txt > "$d/prepare.out" 2> "$d/prepare.time")
    t1=$($MONO)
    rundir=$(cd "$d" && ls -d .htc/*/ | head -1)
    sync
    file_mb=$(du -m --apparent-size "$d/tasks.txt" | cut -f1)
    dir_mb=$(du -sm "$d/$rundir" | cut -f1)                       # blocks actually used
    mdb_mb=$(du -m --apparent-size "$d/$rundir/ledger.mdb" | cut -f1)
    rss_kb=$(tv "$d/prepare.time" "Maximum resident set size")
    awk -v n="$n" -v f="$file_mb" -v a="$t0" -v b="$t1" -v r="$rss_kb" -v dm="$dir_mb" -v mm="$mdb_mb" 'BEGIN {
        printf "| %10d | %10d | %10.2f | %12.0f | %14.1f | %14d | %16d |\n", n, f, b - a, n / (b - a), r / 1024, dm, mm }'
    notes+=("prepare $n: cpu user $(tv "$d/prepare.time" "User time") s, sys $(tv "$d/prepare.time" "System time") s; run dir files: $(cd "$d/$rundir" && du -sm --apparent-size -- * | tr '\t\n' '= ' )")
    # How long does `htc status` take on that ledger?
    t0=$($MONO); (cd "$d" && "$HTC" status > "$d/status.out" 2>&1) || true; t1=$($MONO)
    notes+=("status on $n pending tasks: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f s", b - a }'); $(grep -m1 counts "$d/status.out" || head -1 "$d/status.out")")
    rm -rf "$d"
done
echo
printf '%s\n' "${notes[@]}"
echo

echo "== htc run: $RUN_TASKS true tasks (1 agent, default slots) =="
d=$WORK/run
mkdir -p "$d"
awk -v n="$RUN_TASKS" 'BEGIN { for (i = 0; i < n; i++) print "true" }' > "$d/tasks.txt"
sync
# The subshell takes the monotonic timestamps itself, so the 0.5 s sampling loop below
# does not add to the measured wall time.
(cd "$d" && "$MONO" > "$d/t0" && rc=0 && { /usr/bin/time -v "$HTC" run tasks.txt > "$d/run.out" 2> "$d/run.time" || rc=$?; } \
    && "$MONO" > "$d/t1" && exit $rc) &
tpid=$!
leader=""; declare -A hwm=() rss=()
peak_leader=0; peak_leader_rss=0; peak_agent=0; peak_agent_rss=0; agents_seen=""
# RSS splits into anonymous memory (heap) and file pages; the latter include the pages of
# the memory-mapped LMDB ledger that the process has touched (shared page cache, not heap).
peak_leader_anon=0; peak_leader_file=0; peak_agent_anon=0
status_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status" 2>/dev/null || true; }
while kill -0 "$tpid" 2>/dev/null; do
    # $tpid is the subshell; its child is time(1), whose child `htc` is the leader.
    [[ -z $leader ]] && leader=$(pgrep -P "$(pgrep -P "$tpid" -x time | head -1)" -x htc 2>/dev/null | head -1 || true)
    if [[ -n $leader ]]; then
        h=$(status_kb "$leader" VmHWM); r=$(status_kb "$leader" VmRSS)
        [[ -n $h ]] && ((h > peak_leader)) && peak_leader=$h
        [[ -n $r ]] && ((r > peak_leader_rss)) && peak_leader_rss=$r
        r=$(status_kb "$leader" RssAnon); [[ -n $r ]] && ((r > peak_leader_anon)) && peak_leader_anon=$r
        r=$(status_kb "$leader" RssFile); [[ -n $r ]] && ((r > peak_leader_file)) && peak_leader_file=$r
        for a in $(pgrep -P "$leader" -x htc-agent 2>/dev/null || true); do
            [[ " $agents_seen " == *" $a "* ]] || agents_seen="$agents_seen $a"
            h=$(status_kb "$a" VmHWM); r=$(status_kb "$a" VmRSS)
            [[ -n $h ]] && ((h > peak_agent)) && peak_agent=$h
            [[ -n $r ]] && ((r > peak_agent_rss)) && peak_agent_rss=$r
            r=$(status_kb "$a" RssAnon); [[ -n $r ]] && ((r > peak_agent_anon)) && peak_agent_anon=$r
        done
    fi
    sleep 0.5
done
rc=0; wait "$tpid" || rc=$?
t0=$(cat "$d/t0"); t1=$(cat "$d/t1")
wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
rundir=$(cd "$d" && ls -d .htc/*/ | head -1)
echo "exit status:             $rc"
echo "htc summary:             $(grep -m1 'tasks:' "$d/run.out" "$d/run.time" | head -1 | cut -d: -f2-)"
echo "wall (monotonic):        $wall s"
awk -v n="$RUN_TASKS" -v w="$wall" 'BEGIN { printf "tasks/s:                 %.0f\n", n / w }'
echo "cpu (whole tree):        user $(tv "$d/run.time" "User time") s, sys $(tv "$d/run.time" "System time") s" \
     "=> $(awk -v u="$(tv "$d/run.time" "User time")" -v s="$(tv "$d/run.time" "System time")" -v n="$RUN_TASKS" 'BEGIN { printf "%.3f", 1000 * (u + s) / n }') ms/task"
mb() { awk -v k="$1" 'BEGIN { printf "%.1f MB", k / 1024 }'; }
echo "leader pid $leader:     peak RSS (VmHWM, sampled every 0.5 s) $(mb "$peak_leader"), max sampled VmRSS $(mb "$peak_leader_rss") (max RssAnon $(mb "$peak_leader_anon"), max RssFile $(mb "$peak_leader_file"))"
echo "agent pid(s)$agents_seen: peak RSS (VmHWM) $(mb "$peak_agent"), max sampled VmRSS $(mb "$peak_agent_rss") (max RssAnon $(mb "$peak_agent_anon"))"
echo "max RSS of any process in the tree (time -v): $(awk -v k="$(tv "$d/run.time" "Maximum resident set size")" 'BEGIN { printf "%.1f MB", k / 1024 }')"
echo "run dir on disk:         $(du -sm "$d/$rundir" | cut -f1) MB ($(cd "$d/$rundir" && du -sm -- * | tr '\t\n' '= '))"
echo
echo "loadavg at end: $(cat /proc/loadavg)"
echo "report: $OUT"
