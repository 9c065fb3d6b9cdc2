#!/usr/bin/env bash
# Privilege: nothing runs as root on a user's behalf. On a real 2-node cluster with the real
# agent and plugin (installed by `make install`), submitted as an unprivileged user who has a
# supplementary group:
#   * every task, the agent that runs it, the leader and the node agents run with exactly the
#     user's uid, gid and groups (id -u/-g/-G, and /proc/PID/status Uid/Gid/Groups: real,
#     effective, saved and filesystem ids);
#   * user-controlled inputs never make anything run as root, nor make the plugin exec a path
#     the user controls: a fake htc-agent first on PATH, an --htc file that is an executable
#     (set-uid looking) script, the plugin's own variables exported by the user;
#   * an agent= that someone other than root can change (user-owned, in a world-writable
#     directory) or that is set-uid is refused, and never runs.
# Each user-controlled program records `id -u` if it ever runs; no record may say 0.
#
#   tests/slurm/privilege.sh          (as root)
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-priv}
export HTC_CLUSTER_CTLD_PORT=${HTC_CLUSTER_CTLD_PORT:-6919}
export HTC_CLUSTER_SLURMD_PORT=${HTC_CLUSTER_SLURMD_PORT:-17301}
harness=$root/tests/cluster
# shellcheck source=/dev/null
. "$harness/lib.sh"

dir=$HTC_CLUSTER_DIR
bin=$dir/htc-bin
install -d -m 0755 "$dir" "$dir/plugstack.conf.d"
make -s -C "$root" install PROFILE="${HTC_PROFILE:-release}" BINDIR="$bin" PLUGINDIR="$bin" PLUGSTACKDIR="$dir/plugstack.conf.d" >/dev/null ||
    { echo "make install failed" >&2; exit 2; }
chmod 0755 "$bin"
so=$bin/spank_htc.so
plug() { cluster_plugin_add htc "optional $so agent=$1"; }

"$harness/start-cluster.sh" -n 2 >/dev/null || { echo "cluster did not start" >&2; exit 2; }
cluster_env
cleanup() {
    cluster_plugin_clear
    rm -f -- "$dir/suid-agent" "$dir/link-agent"
    # Never stop a munged that another cluster may share.
    rm -f -- "$dir/run/munged.pid"
    "$harness/stop-cluster.sh" >/dev/null 2>&1
}
trap cleanup EXIT

user=$HTC_CLUSTER_USER
U=$(id -u "$user") G=$(id -g "$user")
GROUPS_WANT=$(id -G "$user" | tr ' ' '\n' | sort -n | paste -sd, -)
extra=$(getent group "$HTC_CLUSTER_GROUP" | cut -d: -f3)
check "the test user $user ($U) has the supplementary group $HTC_CLUSTER_GROUP ($extra): $GROUPS_WANT" \
    grep -qE "(^|,)$extra(,|$)" <<<"$GROUPS_WANT"

callbacks=$(nm -D --defined-only "$so" | awk '{print $3}' | grep '^slurm_spank_' | sort | paste -sd' ' -)
check "the plugin has no callback of a root-only context (prolog/epilog, user_init, task_init_privileged): $callbacks" \
    test "$callbacks" = "slurm_spank_exit slurm_spank_init slurm_spank_init_post_opt slurm_spank_task_init"

W=$(cluster_workdir priv)
# Records the identity of itself and of its parent (the agent that started it), and, with
# "hold", waits until the test has looked at the running agents.
cat >"$W/probe.sh" <<'EOF'
#!/bin/sh
st() { awk '/^Uid:/ {u=$2","$3","$4","$5} /^Gid:/ {g=$2","$3","$4","$5}
            /^Groups:/ {$1=""; n=split($0, a, " "); s=""; for (i=1; i<=n; i++) s=s (i>1?",":"") a[i]; gr=s}
            END {print u, g, gr}' "/proc/$1/status"; }
{
    echo "id $HTC_TASK_ID $(id -u) $(id -g) $(id -G | tr ' ' '\n' | sort -n | paste -sd, -)"
    echo "self $HTC_TASK_ID $(st self)"
    echo "parent $HTC_TASK_ID $(st $PPID) $(tr '\0' ' ' </proc/$PPID/cmdline | cut -d' ' -f1-2)"
} >>ids.txt
if [ "$1" = hold ]; then
    touch "held.$HTC_TASK_ID"
    i=0
    while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
fi
EOF
# A fake htc-agent first on the user's PATH: it must never be what runs.
install -d "$W/fakebin"
printf '#!/bin/sh\necho "$(id -u) fake htc-agent $*" >> %s/fake-agent-ran\nexit 0\n' "$W" >"$W/fakebin/htc-agent"
# An --htc file that is an executable, set-uid looking script: it is data (a task file), its
# lines run as the user's tasks; run as a program it would record "exec".
printf '#!/bin/sh\necho "$(id -u) ${HTC_TASK_ID:-exec}" >> %s/evil-ran\n' "$W" >"$W/evil.sh"
# An agent the user owns (an admin's mistake in plugstack.conf): it must be refused.
printf '#!/bin/sh\necho "$(id -u) user-agent" >> %s/user-agent-ran\nexit 0\n' "$W" >"$W/user-agent"
printf './probe.sh hold\n./probe.sh hold\n./probe.sh\n./probe.sh\n' >"$W/tasks.txt"
printf '#!/bin/sh\necho "$(id -u) script" >> script-ran.$SLURM_JOB_ID\n' >"$W/job.sh"
chown -R "$user" "$W"
chmod 0755 "$W/probe.sh" "$W/fakebin/htc-agent" "$W/user-agent" "$W/job.sh"
as_user chmod 4755 "$W/evil.sh"

sub() { # [VAR=VALUE...] -- SBATCH-ARGS...: sbatch as the user, PATH=fakebin first; prints the job id
    local -a vars=()
    while [[ $# -gt 0 && $1 != -- ]]; do vars+=("$1"); shift; done
    shift
    as_user -C "$W" env PATH="$W/fakebin:/usr/local/bin:/usr/bin:/bin" "${vars[@]}" sbatch --parsable "$@" 2>&1 | tail -n 1
}

# --- 1. identities of tasks, of the agents running them, of the leader and node agents ---
j=$(sub -- -N2 --exclusive --htc=tasks.txt job.sh)
scan=$W/scan.txt
: >"$scan"
for _ in $(seq 300); do
    [[ $(ls "$W"/held.* 2>/dev/null | wc -l) == 2 ]] && break
    sleep 0.1
done
for p in /proc/[0-9]*; do
    [[ $(readlink "$p/exe" 2>/dev/null) == "$bin/htc-agent" ]] || continue
    role=$(tr '\0' '\n' <"$p/cmdline" 2>/dev/null | sed -n 2p)
    awk -v pid="${p#/proc/}" -v role="$role" '
        /^Uid:/ {u=$2","$3","$4","$5} /^Gid:/ {g=$2","$3","$4","$5}
        /^Groups:/ {$1=""; n=split($0, a, " "); s=""; for (i=1; i<=n; i++) s=s (i>1?",":"") a[i]; gr=s}
        END {print role, pid, u, g, gr}' "$p/status" >>"$scan"
done
touch "$W/go"
state=$(wait_job "$j" 120)
check "job $j: COMPLETED (was $state), exit 0" test "$state" = COMPLETED -a "$(job_exit_code "$j")" = 0
check "job $j: the batch script ran once, as the prologue, as the user" test "$(cat "$W/script-ran.$j" 2>&1)" = "$U script"

# "A,B,C" -> sorted set including the primary gid G
with_gid() { { tr ',' '\n' <<<"$1"; echo "$G"; } | grep -v '^$' | sort -nu | paste -sd, -; }
want_ids="$U,$U,$U,$U $G,$G,$G,$G"
ids_ok() { # ids.txt: every task's id -u/-g/-G and its own and its parent's /proc status
    local kind t a b c rest n=0
    while read -r kind t a b c rest; do
        case $kind in
            id) [[ "$a $b $c" == "$U $G $GROUPS_WANT" ]] || { echo "  $kind $t $a $b $c"; return 1; } ;;
            self | parent)
                [[ "$a $b" == "$want_ids" && $(with_gid "$c") == "$GROUPS_WANT" ]] ||
                    { echo "  $kind $t $a $b $c $rest"; return 1; }
                ;;
        esac
        n=$((n + 1))
    done <"$W/ids.txt"
    [[ $n == 12 ]] || { echo "  $n records, want 12"; return 1; }
}
check "4 tasks: id -u/-g/-G, and /proc Uid/Gid/Groups of each task and of the agent that started it, are the user's ($U, $G, $GROUPS_WANT)" ids_ok
parents_are_agents() { [[ $(grep -c "^parent .* $bin/htc-agent " "$W/ids.txt") == 4 ]]; }
check "every task's parent is an htc-agent" parents_are_agents
scan_ok() { # leader and node agents seen running, all with the user's credentials
    local role pid a b c leads=0 works=0
    while read -r role pid a b c; do
        [[ "$a $b" == "$want_ids" && $(with_gid "$c") == "$GROUPS_WANT" ]] || { echo "  $role $pid $a $b $c"; return 1; }
        case $role in lead) leads=$((leads + 1)) ;; work) works=$((works + 1)) ;; esac
    done <"$scan"
    [[ $leads -ge 1 && $works -ge 1 ]] || { echo "  lead=$leads work=$works:"; cat "$scan"; return 1; }
}
check "running leader and node agents ($(cut -d' ' -f1 "$scan" | sort | uniq -c | awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2}')): /proc Uid/Gid/Groups are the user's" scan_ok

never_ran() { [[ ! -e $1 ]] || { echo "  $(cat "$1")"; return 1; }; }
check "the fake htc-agent first on the user's PATH never ran" never_ran "$W/fake-agent-ran"

# --- 2. an --htc file that is an executable, set-uid looking script ---
j=$(sub -- --htc=evil.sh job.sh)
wait_job "$j" 60 >/dev/null
evil_ok() { [[ $(cat "$W/evil-ran" 2>/dev/null) == "$U 1" ]] || { echo "  evil-ran: $(cat "$W/evil-ran" 2>&1)"; return 1; }; }
check "--htc=evil.sh (mode 4755): read as a task file, its line ran once as a task of uid $U, never as a program" evil_ok
rm -f "$W/evil-ran"

# --- 3. the plugin's variables, exported by the user for a plain job ---
j=$(sub SLURM_SPANK_HTC_FILE="$W/evil.sh" -- job.sh)
wait_job "$j" 60 >/dev/null
check "exported SLURM_SPANK_HTC_FILE=evil.sh: the job became an HTC job of the user, its task ran as $U" evil_ok
rm -f "$W/evil-ran"
j=$(sub SLURM_SPANK_HTC_FILE="$W/evil.sh" SLURM_SPANK_HTC_FANOUT=1 -- job.sh)
wait_job "$j" 60 >/dev/null
check "exported SLURM_SPANK_HTC_FANOUT=1 (invalid): refused (125), nothing ran" \
    test "$(job_exit_code "$j")" = 125 -a ! -e "$W/evil-ran" -a ! -e "$W/script-ran.$j"
j=$(sub _SLURM_SPANK_OPTION_htc_htc="$W/evil.sh" SLURM_SPANK__SLURM_SPANK_OPTION_htc_htc="$W/evil.sh" -- job.sh)
wait_job "$j" 60 >/dev/null
# Whichever way the plugin takes the exported option, something of this job runs (evil.sh's line as
# a task, or job.sh as the script) and records its uid; with no record at all, "none ran as root"
# would hold of a job that ran nothing.
no_root() {
    local recs
    recs=$(cat "$W/evil-ran" "$W/script-ran.$j" 2>/dev/null)
    [[ -n $recs ]] && ! grep -q '^0 ' <<<"$recs" || { echo "  records: ${recs:-none}"; return 1; }
}
check "exported _SLURM_SPANK_OPTION_htc_htc=evil.sh: it ran ($(cat "$W/evil-ran" "$W/script-ran.$j" 2>/dev/null | cut -d' ' -f2 | paste -sd, -)), none of it as root" no_root
rm -f "$W/evil-ran"

# --- 4. agent= paths that someone other than root could change, or set-uid ---
refused_agent() { # AGENT-PATH MESSAGE-REGEX RECORD-FILE
    local a=$1 re=$2 rec=$3 j
    plug "$a"
    j=$(sub -- --htc=tasks.txt job.sh)
    wait_job "$j" 60 >/dev/null
    plug "$bin/htc-agent"
    [[ $(job_exit_code "$j") == 125 ]] && grep -qE "$re" "$W/slurm-$j.out" && [[ ! -e $rec && ! -e $W/script-ran.$j ]] ||
        { echo "  exit $(job_exit_code "$j"):"; cat "$W/slurm-$j.out"; return 1; }
}
check "agent= owned by the user: refused (125), never ran" \
    refused_agent "$W/user-agent" "cannot start the agent $W/user-agent: file $W/user-agent is owned by uid $U, not root" "$W/user-agent-ran"
install -m 0755 "$W/user-agent" "$dir/work/root-agent" # root's, but in the 1777 work directory
check "agent= root's but in a world-writable directory: refused (125)" \
    refused_agent "$dir/work/root-agent" "directory $dir/work is writable by group or others \\(mode 1777\\)" "$W/user-agent-ran"
install -m 4755 "$W/user-agent" "$dir/suid-agent"
check "agent= set-uid root: refused (125), never ran" \
    refused_agent "$dir/suid-agent" "file $dir/suid-agent is set-user-ID" "$W/user-agent-ran"
ln -sfn "$bin/htc-agent" "$dir/link-agent"
plug "$dir/link-agent"
rm -f "$W"/held.* "$W/ids.txt"
j=$(sub -- --htc=tasks.txt job.sh)
wait_job "$j" 120 >/dev/null
plug "$bin/htc-agent"
check "agent= a symlink (root's) to the agent: accepted, job COMPLETED" test "$(job_state "$j")" = COMPLETED

# --- nothing user-controlled ever ran as root ---
records() { cat "$W"/*-ran "$W"/script-ran.* 2>/dev/null; cut -d' ' -f3 "$W/ids.txt" 2>/dev/null; }
# Non-empty first: with no record (ids.txt lost, say) there would be nothing to find uid 0 in.
root_never() {
    local recs
    recs=$(records)
    [[ -n $recs ]] && ! grep -q '^0\b' <<<"$recs"
}
check "no record of any user-controlled program shows uid 0" root_never

echo
echo "$passed passed, $failed failed"
if ((failed)); then
    cluster_logs 20
    exit 1
fi
