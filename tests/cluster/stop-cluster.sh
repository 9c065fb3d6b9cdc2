#!/usr/bin/env bash
# Stop the test cluster made by start-cluster.sh: slurmctld, every slurmd,
# their slurmstepds and job processes, its slurmdbd, the munged and MariaDB it
# started, its network namespaces and its release root's view. Safe to run any
# number of times, with or without a cluster.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
# shellcheck source=root-view.sh
. "$here/root-view.sh"

[[ $EUID -eq 0 ]] || _htc_die "must run as root"

# Settings of the cluster that is running, which may differ from the defaults.
if [[ -r $HTC_CLUSTER_DIR/env ]]; then
    # shellcheck source=/dev/null
    . "$HTC_CLUSTER_DIR/env"
fi
conf="$HTC_CLUSTER_DIR/slurm.conf"
# A chrooted slurmstepd's files read, from here, as the view's path of them.
view=$(root_view_path)

# pid ppid state, for every process, read straight from /proc (procps may be absent).
proc_table() {
    local f line rest pid
    for f in /proc/[0-9]*/stat; do
        { read -r line <"$f"; } 2>/dev/null || continue
        pid=${line%% *}
        rest=${line##*) } # comm may contain spaces and parentheses
        # shellcheck disable=SC2086 # split "state ppid ..." into fields
        set -- $rest
        printf '%s %s %s\n' "$pid" "$2" "$1"
    done
}

# Daemons carry the marker in their environment. slurmstepd overwrites its
# environment block (setproctitle), so it is recognised by its open log file
# in this cluster's log dir. Job processes are found as descendants of those,
# or, if orphaned, by a job env that points at this cluster's slurm.conf.
collect_pids() {
    local -A want=()
    local pid ppid state p f l
    while read -r p; do
        [[ -n $p ]] && want[$p]=1
    done < <(
        grep -lzxF "$(_htc_marker)" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true
        grep -lzxF "SLURM_CONF=$conf" /proc/[0-9]*/environ 2>/dev/null |
            xargs -r grep -lz '^SLURM_JOB_ID=' 2>/dev/null | cut -d/ -f3 || true
    )
    while read -r p; do
        for f in /proc/"$p"/fd/*; do
            l=$(readlink "$f" 2>/dev/null) || continue
            if [[ $l == "$HTC_CLUSTER_DIR"/log/* || $l == "$view$HTC_CLUSTER_DIR"/log/* ]]; then
                want[$p]=1
                break
            fi
        done
    done < <(grep -lxE 'slurmstepd|slurmd|slurmctld' /proc/[0-9]*/comm 2>/dev/null | cut -d/ -f3 || true)
    ((${#want[@]})) || return 0
    # Add descendants until nothing new turns up (a job tree is only a few levels deep).
    local table added=1
    table=$(proc_table)
    while ((added)); do
        added=0
        while read -r pid ppid state; do
            if [[ -n ${want[$ppid]-} && -z ${want[$pid]-} ]]; then
                want[$pid]=1
                added=1
            fi
        done <<<"$table"
    done
    unset "want[$$]" "want[$PPID]"
    # Zombies are dead already; /process_api as PID 1 reaps them when it likes.
    while read -r pid ppid state; do
        if [[ -n ${want[$pid]-} && $state != Z ]]; then printf '%s\n' "$pid"; fi
    done <<<"$table"
}

kill_all() {
    local sig=$1 p
    shift
    for p in "$@"; do kill "-$sig" "$p" 2>/dev/null || true; done
}

alive() { # PIDs... -> those not gone and not zombies
    local p s rest
    for p in "$@"; do
        { read -r s <"/proc/$p/stat"; } 2>/dev/null || continue
        rest=${s##*) }
        [[ ${rest%% *} == Z ]] || printf '%s\n' "$p"
    done
}

wait_gone() { # TENTHS PIDS... -> prints the ones that outlived the wait
    local n=$1
    shift
    local -a left=("$@")
    while ((n-- > 0 && ${#left[@]})); do
        sleep 0.1
        mapfile -t left < <(alive "${left[@]}")
    done
    if ((${#left[@]})); then printf '%s\n' "${left[@]}"; fi
}

mapfile -t pids < <(collect_pids)
if ((${#pids[@]})); then
    # Everything gets SIGKILL: the next start wipes the cluster's state (and empties its
    # accounting records), so nothing is lost that a clean exit would keep, and a clean exit
    # costs seconds (slurmctld 2 s with accounting, slurmd 1.3 s with its cgroups, slurmdbd 1 s;
    # slurmstepd sits out SIGTERM).
    kill_all KILL "${pids[@]}"
    mapfile -t pids < <(wait_gone 30 "${pids[@]}")
    # A dying slurmd may just have forked something.
    mapfile -t late < <(collect_pids)
    kill_all KILL "${late[@]}"
    mapfile -t late < <(wait_gone 20 "${late[@]}")
    pids+=("${late[@]}")
    if ((${#pids[@]})); then
        printf 'stop-cluster: processes still alive: %s\n' "${pids[*]}" >&2
        exit 1
    fi
fi
# The cgroups Slurm made for the jobs (slurm_nK/uid_U/job_J/... in each v1 controller), which a
# slurmstepd killed with the cluster leaves behind: the next cluster's job of the same id on a
# node of the same name would find them, with another job's cpuset and limits. Empty once their
# processes are gone, so rmdir takes them, deepest first; the nodes' own slurm_nK stay.
for i in $(seq "${HTC_CLUSTER_NODES:-0}"); do
    for d in /sys/fs/cgroup/*/slurm_n"$i"/uid_*; do
        [[ -d $d ]] && { find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; }
    done
done

# stop_shared NAME PIDFILE USERS: the munged or MariaDB this cluster started (its pid file), only
# once no process named as in USERS (a regex of names) is left: another cluster (another
# HTC_CLUSTER_DIR) may be using it.
stop_shared() {
    local name=$1 pidfile=$2 p users
    [[ -r $pidfile ]] || return 0
    p=$(<"$pidfile")
    mapfile -t users < <(grep -lxE "$3" /proc/[0-9]*/comm 2>/dev/null | cut -d/ -f3 || true)
    mapfile -t users < <(alive "${users[@]}")
    if [[ $(cat "/proc/$p/comm" 2>/dev/null) != "$name" ]]; then
        :
    elif ((${#users[@]})); then
        # The pid file stays: the last stop-cluster.sh to find no user stops it.
        printf 'stop-cluster: leaving %s (pid %s) running for others: %s\n' "$name" "$p" "${users[*]}" >&2
        return 0
    else
        kill -TERM "$p" 2>/dev/null || true
        # MariaDB writes its buffers out before it exits.
        if [[ -n $(wait_gone 100 "$p") ]]; then
            kill -KILL "$p" 2>/dev/null || true
            [[ -z $(wait_gone 20 "$p") ]] || _htc_die "$name (pid $p) survived SIGKILL"
        fi
    fi
    rm -f -- "$pidfile"
}
stop_shared munged "$HTC_CLUSTER_DIR/run/munged.pid" 'slurmctld|slurmd|slurmstepd|slurmdbd'
# MariaDB is kept when start-cluster.sh clears the slate for the next cluster (a second a start).
# shellcheck source=accounting.sh
. "$here/accounting.sh"
[[ ${HTC_CLUSTER_KEEP_DB:-0} == 1 ]] || stop_shared mariadbd "$acct_db_pidfile" 'slurmdbd'

# Only namespaces named with our prefix, which start-cluster.sh made.
if [[ -d /run/netns ]]; then
    for ns in $(ip netns list | cut -d' ' -f1); do
        if [[ $ns =~ ^${HTC_CLUSTER_NETNS}-(head|n[0-9]+)$ ]]; then
            ip netns delete "$ns"
        fi
    done
fi

# Last: nothing of the cluster holds a file in the view any more.
root_view_umount
