# shellcheck shell=bash
# Helpers for tests that run against the throw-away Slurm cluster made by
# start-cluster.sh. Source it (as root), then call cluster_env.
#
#   cluster_env                 export SLURM_CONF, HTC_CLUSTER_* from the running cluster
#   cluster_cmd CMD...          run a Slurm client as root where the controller is reachable
#   as_user [-C DIR] CMD...     run CMD as $HTC_CLUSTER_USER in DIR (default: $PWD)
#   cluster_workdir NAME        make (fresh) $HTC_CLUSTER_DIR/work/NAME owned by the user, print it
#   wait_job JOBID [TIMEOUT]    wait until the job is finished, print its final state
#   job_state JOBID             print JobState (PENDING, RUNNING, COMPLETED, ...)
#   job_exit_code JOBID         print the exit status part of ExitCode=status:signal
#   job_exit_signal JOBID       print the signal part of ExitCode=status:signal
#   cluster_plugin_add NAME LINE  write LINE to plugstack.conf.d/NAME.conf (a SPANK plugin)
#   cluster_plugin_clear        remove every plugstack.conf.d/*.conf
#   cluster_logs [LINES]        print the tail of every daemon log (for failure reports)
#   _htc_detached CMD...        start a daemon holding none of the caller's descriptors
#
# Not `set -e` here on purpose: this file is sourced into the caller's shell.

: "${HTC_CLUSTER_DIR:=/var/lib/slurm-htc-test}"
: "${HTC_CLUSTER_USER:=htcuser}"
: "${HTC_CLUSTER_GROUP:=htcextra}"
# A release root (release-root.sh) for a cluster of another Slurm release; empty: the host's.
: "${HTC_CLUSTER_ROOT:=}"
# Prefix of the network namespaces in netns mode; only those are ever deleted.
# Derived from the state dir so clusters in different dirs never share one.
: "${HTC_CLUSTER_NETNS:=htc-${HTC_CLUSTER_DIR##*/}}"

# slurmctld and slurmd get this variable in their environment, so
# stop-cluster.sh can find them without matching on names that another cluster
# on the machine shares.
_htc_marker() { printf 'HTC_CLUSTER_DAEMON=%s' "$HTC_CLUSTER_DIR"; }

# _htc_node_slurmd I [SRC DEST]...: node nI's slurmd (netns mode) in its network namespace and in
# a UTS and mount namespace of its own: its hostname, the cluster's hosts file as /etc/hosts, and
# each SRC bind-mounted over DEST (a path as the node sees it, in the release's view if any).
# start-cluster.sh starts every node so; a test that needs one node set up otherwise starts its
# slurmd again so. Not `ip netns exec`: it remounts /sys, hiding /sys/fs/cgroup, and slurmd
# 22.05 then refuses to start.
_htc_node_slurmd() {
    local i=$1 view=${HTC_CLUSTER_VIEW:-} root=() mounts
    shift
    [[ -z $view ]] || root=(chroot "$view")
    mounts=$(printf 'mount --bind %q %q && ' "$HTC_CLUSTER_DIR/hosts" "$view/etc/hosts")
    while (($# >= 2)); do
        mounts+=$(printf 'mount --bind %q %q && ' "$1" "$view$2")
        shift 2
    done
    nsenter --net="/run/netns/$HTC_CLUSTER_NETNS-n$i" -- unshare --uts --mount -- \
        sh -c "$mounts hostname n$i && exec \"\$@\"" sh "${root[@]}" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        "$(_htc_marker)" /usr/sbin/slurmd -f "$HTC_CLUSTER_DIR/slurm.conf" -N "n$i"
}

# _htc_detached CMD...: start a daemon that outlives the caller, with no descriptor of ours but
# stdin, stdout and stderr (to /dev/null): a daemon keeps every descriptor it inherits, and one
# held by a caller's `flock /tmp/htc-slurm.lock` (or a pipe a caller reads to its end) would be
# held until the daemon dies.
_htc_detached() {
    (
        local fd
        for fd in /proc/$BASHPID/fd/*; do
            fd=${fd##*/}
            if ((fd > 2)); then eval "exec $fd>&-"; fi
        done
        exec "$@" </dev/null >/dev/null 2>&1
    ) &
}

_htc_die() { printf '%s: error: %s\n' "${0##*/}" "$*" >&2; exit 1; }

# Microseconds since the epoch; the radix char of $EPOCHREALTIME follows the locale.
_htc_usec() { printf '%s\n' "${EPOCHREALTIME//[!0-9]/}"; }

# $EPOCHREALTIME differences without forking bc/awk for every timing.
_htc_elapsed() { # START -> seconds with 2 decimals
    local now=${EPOCHREALTIME//[!0-9]/} start=${1//[!0-9]/}
    local d=$(( (now - start) / 10000 ))
    printf '%d.%02d' $((d / 100)) $((d % 100))
}

cluster_env() {
    local envfile="$HTC_CLUSTER_DIR/env"
    if [[ ! -r $envfile ]]; then
        printf 'cluster_env: %s missing; run tests/cluster/start-cluster.sh first\n' "$envfile" >&2
        return 1
    fi
    # shellcheck source=/dev/null
    . "$envfile"
}

cluster_cmd() {
    "$HTC_CLUSTER_CLIENT" "$@"
}

as_user() {
    local dir=$PWD
    if [[ ${1-} == -C ]]; then dir=$2; shift 2; fi
    local home
    home=$(getent passwd "$HTC_CLUSTER_USER" | cut -d: -f6)
    # Without -C the caller's directory, unless the user may not enter it (a checkout in a 0700
    # mktemp dir, say): then the user's home, rather than failing every command there.
    if [[ $dir == "$PWD" ]] && ! runuser -u "$HTC_CLUSTER_USER" -- test -x "$dir" 2>/dev/null; then
        dir=$home
    fi
    # A clean environment so jobs (which export the submitter's env by default)
    # see the same variables no matter what the calling test had exported.
    # shellcheck disable=SC2016 # expanded by the inner sh
    "$HTC_CLUSTER_CLIENT" runuser -u "$HTC_CLUSTER_USER" -- env -i \
        HOME="$home" USER="$HTC_CLUSTER_USER" LOGNAME="$HTC_CLUSTER_USER" SHELL=/bin/bash \
        PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 SLURM_CONF="$SLURM_CONF" \
        sh -c 'cd "$1" || exit 125; shift; exec "$@"' as_user "$dir" "$@"
}

cluster_workdir() {
    local d="$HTC_CLUSTER_DIR/work/$1"
    rm -rf -- "$d"
    install -d -o "$HTC_CLUSTER_USER" -g "$(id -gn "$HTC_CLUSTER_USER")" -m 0755 -- "$d"
    printf '%s\n' "$d"
}

# One-line `scontrol show job` record; empty (and status 1) once slurmctld has
# forgotten the job (after MinJobAge=600 s) or never knew it.
_htc_job_record() {
    cluster_cmd scontrol -o show job "$1" 2>/dev/null
}

_htc_field() { # RECORD KEY
    local rec=" $1 " v
    [[ $rec == *" $2="* ]] || return 1
    v=${rec#*" $2="}
    printf '%s\n' "${v%% *}"
}

job_state() {
    local rec
    rec=$(_htc_job_record "$1") || { echo UNKNOWN; return 1; }
    _htc_field "$rec" JobState
}

job_exit_code() {
    local rec ec
    rec=$(_htc_job_record "$1") || return 1
    ec=$(_htc_field "$rec" ExitCode) || return 1
    printf '%s\n' "${ec%%:*}"
}

job_exit_signal() {
    local rec ec
    rec=$(_htc_job_record "$1") || return 1
    ec=$(_htc_field "$rec" ExitCode) || return 1
    printf '%s\n' "${ec##*:}"
}

# Accounting is none, so the final state only exists in slurmctld's memory;
# MinJobAge=600 keeps it there long enough for any test to read it.
wait_job() {
    local id=$1 timeout=${2:-120} state
    local deadline=$(($(_htc_usec) + timeout * 1000000))
    while :; do
        state=$(job_state "$id") || {
            printf 'wait_job: job %s unknown to slurmctld\n' "$id" >&2
            return 1
        }
        case $state in
            PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | RESIZING | \
                REQUEUED | REQUEUE_FED | REQUEUE_HOLD | SIGNALING | STAGE_OUT | STOPPED) ;;
            *)
                printf '%s\n' "$state"
                return 0
                ;;
        esac
        if (($(_htc_usec) >= deadline)); then
            printf 'wait_job: job %s still %s after %s s\n' "$id" "$state" "$timeout" >&2
            cluster_cmd scontrol show job "$id" >&2
            return 2
        fi
        sleep 0.2
    done
}

# release_requeued JOB: Slurm holds a requeued job (scontrol requeue, a node failure) for about
# two minutes before it may start again (its begin time is put off); no test depends on that
# wait, so once the job is back in the queue its begin time is set to now. The second's pause
# keeps the new launch credential younger than the revocation of the old one.
release_requeued() {
    local i
    for ((i = 0; i < 600; i++)); do
        [[ $(job_state "$1") == PENDING ]] && break
        sleep 0.2
    done
    sleep 1
    cluster_cmd scontrol update jobid="$1" starttime=now
}

# wait_idle N [TIMEOUT]: until N of the cluster's nodes are idle and responding (those of the last
# scenario may still be completing, or coming back from a fault: `idle*`, which `sinfo -t idle`
# counts too, is a node whose slurmd has not registered again, and gets no job), at most TIMEOUT s
# (90); true when they are. Scenarios that need their nodes at once (a limit runs from each job's
# start) wait for them.
wait_idle() {
    local i
    for ((i = 0; i < ${2:-90} * 5; i++)); do
        (($(cluster_cmd sinfo -h -N -o '%N %t' | awk '$2 == "idle" { print $1 }' | sort -u | wc -l) >= $1)) && return 0
        sleep 0.2
    done
    echo "wait_idle: fewer than $1 nodes idle after ${2:-90} s:" >&2
    cluster_cmd sinfo -N >&2
    return 1
}

# wait_leader DIR JOB: until the HTC run of JOB in DIR has a leader that takes joins (it
# publishes DIR/.htc/JOB/leader.addr), at most 60 s; true when it has.
wait_leader() {
    local i
    for ((i = 0; i < 300; i++)); do
        [[ -e $1/.htc/$2/leader.addr ]] && return 0
        sleep 0.2
    done
    return 1
}

# cluster_plugin_add NAME LINE: enable a SPANK plugin for this cluster, e.g.
#   cluster_plugin_add htc "optional /path/libspank_htc.so agent=/path/htc-agent"
# sbatch/srun/slurmstepd read plugstack afresh each time; slurmd (prolog/epilog
# callbacks) only at its start, so restart the cluster if those matter.
# The file survives restarts; cluster_plugin_clear removes all of them.
cluster_plugin_add() {
    install -d -m 0755 "$HTC_CLUSTER_DIR/plugstack.conf.d"
    printf '%s\n' "$2" >"$HTC_CLUSTER_DIR/plugstack.conf.d/$1.conf"
    chmod 0644 "$HTC_CLUSTER_DIR/plugstack.conf.d/$1.conf"
}

# cluster_plugin_so: the spank_htc.so built for the release the cluster runs: the host's build
# (target/PROFILE), or release-plugin.sh's for a release root's.
cluster_plugin_so() {
    local root so
    root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
    if [[ -n ${HTC_CLUSTER_ROOT:-} ]]; then
        so=$("$root/tests/cluster/release-plugin.sh" --path "$HTC_CLUSTER_ROOT") || return 1
    else
        so=$root/target/${HTC_PROFILE:-release}/libspank_htc.so
    fi
    [[ -r $so ]] || { printf 'cluster_plugin_so: no plugin at %s\n' "$so" >&2; return 1; }
    printf '%s\n' "$so"
}

cluster_plugin_clear() {
    rm -f -- "$HTC_CLUSTER_DIR"/plugstack.conf.d/*.conf
}

cluster_logs() {
    local lines=${1:-30} f
    for f in "$HTC_CLUSTER_DIR"/log/*.log; do
        [[ -e $f ]] || continue
        printf '==> %s <==\n' "$f"
        tail -n "$lines" -- "$f"
    done
}

# Bookkeeping for the test scripts in tests/slurm: `check DESCRIPTION COMMAND...` runs the
# command and counts an `ok` or a `FAIL` line; `results` prints the closing "N passed, N failed"
# line and fails when anything did.
passed=0 failed=0
ok() { printf 'ok   %s\n' "$*"; passed=$((passed + 1)); }
bad() { printf 'FAIL %s\n' "$*"; failed=$((failed + 1)); }
check() { local d=$1; shift; if "$@"; then ok "$d"; else bad "$d"; fi; }
# `timed CMD...`: runs one scenario and prints its wall time, so a script's minutes can be
# read scenario by scenario.
timed() {
    local t0=$SECONDS rc=0
    "$@" || rc=$?
    printf -- '-- time: %s: %d s\n' "$*" $((SECONDS - t0))
    return $rc
}
# `side_by_side F...`: scenarios whose minutes go to waiting on Slurm (a time limit) run at
# once, each in a subshell whose output is kept and then printed in turn, its checks counted
# here. Each F is a command line, split at spaces ("name arg..."). They must not share nodes
# (the cluster needs room for all) or look for each other's processes.
side_by_side() {
    local f o outs=() pids=() p q
    for f in "$@"; do
        o=$(mktemp)
        outs+=("$o")
        (
            passed=0 failed=0
            # shellcheck disable=SC2086 # a command line, split into its words
            timed $f
            echo "side_by_side_counts $passed $failed"
        ) >"$o" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    for o in "${outs[@]}"; do
        grep -v '^side_by_side_counts ' "$o"
        read -r _ p q < <(grep '^side_by_side_counts ' "$o" | tail -n 1)
        # A scenario that died without counting counts as a failure.
        passed=$((passed + ${p:-0})) failed=$((failed + ${q:-1}))
        rm -f "$o"
    done
}
results() { echo "$passed passed, $failed failed"; [[ $failed == 0 ]]; }

# The documented install path (`make install`), into the test cluster's own directories:
# binaries and plugin in $HTC_CLUSTER_DIR/htc-bin, the plugstack line beside the cluster's config.
# The tests install the `release` build they ran on (HTC_PROFILE=dist, as the benchmarks set it,
# for what ships; packages.sh tests the packages built that way), and the plugin built for the
# cluster's release (cluster_plugin_so).
install_htc() {
    local root bin=$HTC_CLUSTER_DIR/htc-bin so
    root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
    # Without it the scenarios would run what an earlier install left: the script stops here.
    so=$(cluster_plugin_so) || { echo "install_htc: nothing to install; stopping" >&2; exit 1; }
    make -s -C "$root" install PROFILE="${HTC_PROFILE:-release}" BINDIR="$bin" PLUGINDIR="$bin" \
        PLUGIN_SO="$so" PLUGSTACKDIR="$HTC_CLUSTER_DIR/plugstack.conf.d" >/dev/null ||
        { echo "install_htc: make install failed; stopping" >&2; exit 1; }
    chmod 0755 "$bin"
}
