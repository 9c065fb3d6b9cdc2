#!/usr/bin/env bash
# Stop the test cluster made by start-cluster.sh: slurmctld, every slurmd,
# their slurmstepds and job processes, the munged it started, its network
# namespaces and its release root's view. Safe to run any number of times, with or
# without a cluster.
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
    # The daemons get SIGTERM so they exit cleanly; slurmstepd and job processes
    # get SIGKILL at once (slurmstepd sits out SIGTERM, costing seconds). Any
    # survivor gets SIGKILL after 3 s.
    daemons=() others=()
    for p in "${pids[@]}"; do
        case $(cat "/proc/$p/comm" 2>/dev/null) in
            slurmctld | slurmd) daemons+=("$p") ;;
            # slurmctld stops its own helper; killing it first makes slurmctld
            # hang for seconds on shutdown.
            slurmscriptd) ;;
            *) others+=("$p") ;;
        esac
    done
    kill_all KILL "${others[@]}"
    kill_all TERM "${daemons[@]}"
    mapfile -t pids < <(wait_gone 30 "${pids[@]}")
    kill_all KILL "${pids[@]}"
    mapfile -t pids < <(wait_gone 20 "${pids[@]}")
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
# munged only if this cluster started it, and only once no other Slurm daemon
# is left: another cluster (another HTC_CLUSTER_DIR) may be using it.
munged_pidfile=$HTC_CLUSTER_DIR/run/munged.pid
if [[ -r $munged_pidfile ]]; then
    p=$(<"$munged_pidfile")
    mapfile -t users < <(grep -lxE 'slurmctld|slurmd|slurmstepd' /proc/[0-9]*/comm 2>/dev/null |
        cut -d/ -f3 || true)
    mapfile -t users < <(alive "${users[@]}")
    if [[ $(cat "/proc/$p/comm" 2>/dev/null) != munged ]]; then
        rm -f -- "$munged_pidfile"
    elif ((${#users[@]})); then
        printf 'stop-cluster: leaving munged (pid %s) running for other Slurm daemons: %s\n' \
            "$p" "${users[*]}" >&2
        rm -f -- "$munged_pidfile"
    else
        kill -TERM "$p" 2>/dev/null || true
        if [[ -n $(wait_gone 30 "$p") ]]; then
            kill -KILL "$p" 2>/dev/null || true
            [[ -z $(wait_gone 20 "$p") ]] || _htc_die "munged (pid $p) survived SIGKILL"
        fi
        rm -f -- "$munged_pidfile"
    fi
fi

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
