#!/usr/bin/env bash
# What a site's configuration (start-cluster.sh: cgroups with cores and memory constrained, task
# affinity, slurmdbd accounting enforcing associations, limits and QOS, a scavenger partition)
# asks of `sbatch --htc` jobs, on 4 nodes (network namespaces), as an unprivileged user:
#   confined   every task in the job's cgroups, on one of the cores Slurm gave its agent, within
#              the step's memory, and the agent's log says how it enforces mem=
#   accounted  sacct shows the job under the user's account with the CPU time its tasks used,
#              and one step for the agents, not one per task
#   limited    a grown job submitted under the run's account and QOS; the one after it, which
#              the QOS's MaxSubmitJobsPerUser refuses, said once and not asked again, while the
#              run goes on with what it has
#   resubmit_refused  --htc-resubmit under that QOS, full: the resubmission refused, said once
#              with Slurm's reason and the resume advice, not asked again
#   agent_missing   the agent's program missing on one node: the run stops in one line naming
#              the node and why, no node drained; `htc resume` under the run's account and QOS,
#              refused once by the QOS's limit, then finishing it once the node is fixed
#   plugin_missing  the plugin on some nodes only: a run works where the batch step's node has
#              it; `htc submit`'s job on a node without it fails saying so
#   cgroups_unusable  memory cgroups the agents cannot use: under `mem_limit = cgroup` the run
#              stops in one line naming a node and why; by default they watch, and say so
#
#   tests/slurm/site.sh          (as root, after cargo build --release --workspace)
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-test}
# shellcheck source=/dev/null
. "$root/tests/cluster/lib.sh"

bin=$HTC_CLUSTER_DIR/htc-bin

submit() { # DIR ARGS... -> job id
    local dir=$1 out
    shift
    out=$(as_user -C "$dir" sbatch --parsable "$@" 2>&1) || { echo "$out" >&2; return 1; }
    echo "$out" | tail -n 1 | cut -d';' -f1
}

# CPU ids of a list such as 0-1,3 (Cpus_allowed_list, scontrol's CPU_IDs), one a line.
cpu_ids() {
    tr ',' '\n' <<<"$1" | awk -F- 'NF { for (c = $1; c <= ($2 == "" ? $1 : $2); c++) print c }'
}

# Two agents on each node (--htc-agents-per-node=2), a CPU each; every task writes where it ran:
# its node, agent, the CPUs it may use, its memory cgroup and the limit of the step above it.
confined() {
    local w j state bad_cg bad_cpu shared limits how
    w=$(cluster_workdir confined)
    # shellcheck disable=SC2016 # expanded by the task
    seq 1 40 | sed 's|.*|cg=$(sed -n "s/^[0-9]*:memory://p" /proc/self/cgroup); d=/sys/fs/cgroup/memory$cg; while b=${d##*/}; [ -n "$b" ] \&\& { [ ! -e "$d/memory.limit_in_bytes" ] \|\| [ "${b#task_}" != "$b" ]; }; do d=${d%/*}; done; echo "$HTC_TASK_ID $SLURMD_NODENAME $HTC_AGENT $(awk "/^Cpus_allowed_list/ { print \\$2 }" /proc/self/status) $cg $(cat $d/memory.limit_in_bytes)" >> where.txt; sleep 0.2|' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" -N 4 --exclusive --mem=600M --htc-agents-per-node=2 --export=ALL,HTC_LOG=info --htc=tasks.txt --wrap=:) ||
        { bad "confined: submit"; return; }
    state=$(wait_job "$j" 120)
    check "confined: job $j COMPLETED (was $state)" test "$state" = COMPLETED
    check "confined: all 40 tasks wrote where they ran" test "$(cut -d' ' -f1 "$w/where.txt" 2>/dev/null | sort -u | wc -l)" = 40
    # slurm_<node>/uid_<uid>/job_<job>/step_<step>: the job's, on the node the task ran on.
    bad_cg=$(awk -v j="$j" -v u="$(id -u "$HTC_CLUSTER_USER")" '$5 !~ ("^/slurm_" $2 "/uid_" u "/job_" j "/step_") { print $1 }' "$w/where.txt" | head -n 3 | xargs)
    check "confined: every task in its node's cgroup of job $j${bad_cg:+ (not: tasks $bad_cg)}" test -z "$bad_cg"
    bad_cpu=$(awk '$4 !~ /^[0-9]+$/ { print $1 }' "$w/where.txt" | head -n 3 | xargs)
    check "confined: every task bound to one CPU${bad_cpu:+ (not: tasks $bad_cpu)}" test -z "$bad_cpu"
    # The two agents of a node were given one CPU each: their tasks never share one.
    shared=$(awk '{ a[$2 " " $4][$3] = 1 } END { for (k in a) { n = 0; for (x in a[k]) n++; if (n > 1) print k } }' "$w/where.txt" | xargs)
    check "confined: a node's two agents' tasks on CPUs of their own${shared:+ (shared: $shared)}" test -z "$shared"
    check "confined: both CPUs of every node used ($(awk '{ print $2 ":" $4 }' "$w/where.txt" | sort -u | xargs))" \
        test "$(awk '{ print $2 ":" $4 }' "$w/where.txt" | sort -u | wc -l)" = 8
    limits=$(cut -d' ' -f6 "$w/where.txt" | sort -u | xargs)
    check "confined: every task within its step's --mem limit ($limits)" test "$limits" = $((600 << 20))
    # The agents' slot cgroups go with them, so that Slurm can remove the job's on every node.
    local left i
    for ((i = 0; i < 50; i++)); do
        left=$(find /sys/fs/cgroup/memory/ -maxdepth 4 -type d -name "job_$j" 2>/dev/null | xargs)
        [[ -z $left ]] && break
        sleep 0.2
    done
    check "confined: no cgroup of job $j left on any node${left:+ ($(find $left -type d -name 'htc-*' | head -n 3 | xargs))}" test -z "$left"
    how=$(grep -o "tasks' mem= enforced by [a-z ]*" "$w/slurm-$j.out" | sort | uniq -c | sed 's/^ *//' | paste -sd';')
    check "confined: each of the 8 agents logs how it enforces mem= ($how)" \
        test "$(grep -c "tasks' mem= enforced by" "$w/slurm-$j.out")" = 8
    [[ $failed == 0 ]] || { head -n 5 "$w/where.txt"; tail -n 20 "$w/slurm-$j.out"; }
}

# sacct's TotalCPU as seconds: [D-]HH:MM:SS, MM:SS.mmm or HH:MM:SS.mmm.
cpu_seconds() {
    awk -v t="$1" 'BEGIN { d = 0; if (t ~ /-/) { split(t, a, "-"); d = a[1]; t = a[2] }
        n = split(t, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; printf "%d\n", s + d * 86400 }'
}

# 16 tasks each burning 1 s of CPU on 2 nodes.
accounted() {
    local w j state rec steps cpu i
    w=$(cluster_workdir accounted)
    seq 1 16 | sed 's|.*|perl -e '"'"'1 while (times)[0] < 1'"'"'|' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" -N 2 --exclusive --htc=tasks.txt --wrap=:) || { bad "accounted: submit"; return; }
    state=$(wait_job "$j" 120)
    check "accounted: job $j COMPLETED (was $state)" test "$state" = COMPLETED
    # slurmctld sends the job's end and each step's to slurmdbd on its own time: the steps'
    # CPU (summed into the job's line) may come seconds after the job's end.
    for ((i = 0; i < 150; i++)); do
        # Not -X: the job's own line has the steps' CPU summed only beside them.
        rec=$(cluster_cmd sacct -n -P -j "$j" -o JobID,State,Account,User,UserCPU 2>/dev/null | sed -n "s/^$j|//p")
        cpu=$(cpu_seconds "$(cut -d'|' -f4 <<<"$rec")")
        [[ $rec == COMPLETED* && $cpu -ge 15 ]] && break
        sleep 0.2
    done
    check "accounted: sacct has job $j COMPLETED, account htc, user $HTC_CLUSTER_USER ($rec)" \
        test "$(cut -d'|' -f1-3 <<<"$rec")" = "COMPLETED|htc|$HTC_CLUSTER_USER"
    # The tasks' loop counts user time; its calls of times() cost system time besides.
    check "accounted: the job's user CPU time is its tasks' 16 s (sacct: $cpu s)" test "$cpu" -ge 15 -a "$cpu" -le 30
    steps=$(cluster_cmd sacct -n -P -j "$j" -o JobID | grep -c '\.')
    check "accounted: no step per task ($steps steps: $(cluster_cmd sacct -n -P -j "$j" -o JobID | grep '\.' | xargs))" \
        test "$steps" -le 3
}

# An open run under account spare and QOS capped (MaxSubmitJobsPerUser=2) that wants to grow by
# up to 3 jobs: the first grown job makes 2 of the user's jobs; the second is refused, and not
# asked for again while the first is there. The site's least time between two submissions
# (grow_gap_s, 30 s by default) is 5 s here, so that "not again" is seen in seconds.
limited() {
    local w a i grown rec state said gap=5
    w=$(cluster_workdir limited)
    printf '#!/bin/bash\n' >"$w/job.sh"
    printf 'grow_gap_s = %s\n' "$gap" >"$w/site.conf"
    chown -R "$HTC_CLUSTER_USER" "$w"
    a=$(submit "$w" -N 1 --exclusive -t 3 -A spare --qos=capped --export=ALL,HTC_SITE_CONFIG="$w/site.conf" \
        --htc-open --htc-grow=3:1:3 job.sh) ||
        { bad "limited: submit the run"; return; }
    wait_leader "$w" "$a" || { bad "limited: the open run's leader never listened"; return; }
    # 600 tasks of 2 s: 1,200 core-s, more than the run's 2 CPUs and one grown job (3 min, so
    # that it is still there when the test ends: its end would let the run ask once more) do.
    seq 1 600 | sed 's/.*/sleep 2/' | as_user -C "$w" "$bin/htc" task add "$a" --file - >/dev/null
    for ((i = 0; i < 600; i++)); do
        grep -qs "the site's limits refuse" "$w/slurm-$a.out" && break
        sleep 0.2
    done
    grown=$(grep -o 'grow: submitted job [0-9]*' "$w/slurm-$a.out" | awk '{ print $NF }' | xargs)
    check "limited: one grown job submitted ($grown)" test "$(wc -w <<<"$grown")" = 1
    for g in $grown; do
        rec=$(_htc_job_record "$g")
        check "limited: grown job $g under the run's account and QOS ($(_htc_field "$rec" Account) $(_htc_field "$rec" QOS))" \
            test "$(_htc_field "$rec" Account) $(_htc_field "$rec" QOS)" = "spare capped"
    done
    check "limited: the refusal is said, with Slurm's reason" \
        grep -q "grow: the site's limits refuse another job; the run goes on with the nodes it has (sbatch: .*MaxSubmitJob" "$w/slurm-$a.out"
    # Three times the least time between two submissions: nothing asked again.
    sleep $((3 * gap))
    said=$(grep -c "grow: submitting a job" "$w/slurm-$a.out")
    check "limited: not asked again ($said submissions asked in all, the refused one included)" test "$said" = 2
    check "limited: the refusal said once" test "$(grep -c "the site's limits refuse" "$w/slurm-$a.out")" = 1
    # The run goes on: what is left is cancelled, the run closed, and it ends well.
    as_user -C "$w" "$bin/htc" task cancel "$a" 1-600 >/dev/null
    as_user -C "$w" "$bin/htc" close "$a" >/dev/null
    state=$(wait_job "$a" 120)
    check "limited: the run's job $a ended (was $state)" test "$state" = COMPLETED -o "$state" = FAILED
    for g in $grown; do
        state=$(wait_job "$g" 120)
        check "limited: grown job $g ended with the run (was $state)" test "$state" = COMPLETED -o "$state" = CANCELLED
    done
    [[ $failed == 0 ]] || { echo "--- slurm-$a.out"; tail -n 30 "$w/slurm-$a.out"; }
}

# --htc-resubmit under the run's QOS, whose MaxSubmitJobsPerUser (2) the run's job and a held one
# of the user's fill: the run ends at once (a task's runtime= does not fit its minute), the leader's
# resubmission is refused, said once with Slurm's reason and the resume advice, and not asked again.
resubmit_refused() {
    local w j h state done
    w=$(cluster_workdir resubmit-refused)
    # shellcheck disable=SC2016 # expanded by the task
    { printf '[runtime=1s] echo "$HTC_TASK_ID" >> ids.txt\n%.0s' 1 2 3 4; printf '[runtime=10m] sleep 600\n'; } >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    h=$(submit "$w" -N 1 -A spare --qos=capped --hold --wrap=:) || { bad "resubmit refused: submit the held job"; return; }
    j=$(submit "$w" -N 1 -t 1 -A spare --qos=capped --htc=tasks.txt --htc-resubmit=2 --wrap=:) ||
        { cluster_cmd scancel "$h"; bad "resubmit refused: submit"; return; }
    state=$(wait_job "$j" 120)
    check "resubmit refused: no job but the held one left ($(cluster_cmd squeue -h -u "$HTC_CLUSTER_USER" -o %i | xargs))" \
        test "$(cluster_cmd squeue -h -u "$HTC_CLUSTER_USER" -o %i | xargs)" = "$h"
    cluster_cmd scancel "$h"
    check "resubmit refused: job $j ended before its limit (was $state)" test "$state" = FAILED
    check "resubmit refused: said once, with Slurm's reason and the resume advice" \
        test "$(grep -c "could not resubmit: .*MaxSubmitJob.*continue with: htc resume $j" "$w/slurm-$j.out")" = 1
    check "resubmit refused: asked once" test "$(grep -cE 'could not resubmit|resubmitted \(' "$w/slurm-$j.out")" = 1
    done=$(as_user -C "$w" "$bin/htc" status "$j" --json | grep -o '"done":[0-9]*' | cut -d: -f2)
    check "resubmit refused: the short tasks done ($done of 4)" test "$done" = 4
    [[ $failed == 0 ]] || tail -n 20 "$w/slurm-$j.out"
}

# What an admin may get wrong on one node, made in that node's own mount namespace (its slurmd's,
# which every slurmstepd it starts inherits: start-cluster.sh), undone after.
on_node() { # NODE CMD...
    local pid
    pid=$(pgrep -f -- "slurmd -f $HTC_CLUSTER_DIR/slurm.conf -N $1\$" | head -n 1)
    [[ -n $pid ]] || { echo "no slurmd for $1" >&2; return 1; }
    shift
    nsenter -t "$pid" -m -- "$@"
}
# Over PATH (as the node's slurmd sees it, in the release's view if any) on NODE: DIR.
cover() { on_node "$1" mount --bind "$3" "${HTC_CLUSTER_VIEW:-}$2"; }
uncover() { on_node "$1" umount "${HTC_CLUSTER_VIEW:-}$2"; }
none_drained() { ! cluster_cmd sinfo -h -N -o '%T' | grep -qiE 'drain|down|fail'; }
# What every admin mistake must come to: the job FAILED, one line of its output saying why, no
# node drained.
failed_in_one_line() { # LABEL JOB STATE OUTPUT REGEX
    local said
    check "$1: job $2 FAILED (was $3)" test "$3" = FAILED
    said=$(grep -c -- "$5" "$4")
    check "$1: one line says why ($said)" test "$said" = 1
    [[ $said == 1 ]] || tail -n 20 "$4"
    check "$1: no node drained" none_drained
}

# The agent's program missing on a node that is not the batch node: the run stops at once, in one
# line naming the node and why; no node drained; once the node is fixed, a resume finishes it.
agent_missing() {
    local w j j2 state out copy=$HTC_CLUSTER_DIR/htc-bin-without-agent
    w=$(cluster_workdir agent-missing)
    # shellcheck disable=SC2016 # expanded by the task
    seq 1 40 | sed 's/.*/sleep 0.5; echo "$HTC_TASK_ID" >> ids.txt/' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    rm -rf "$copy" && cp -a "$bin" "$copy" && rm -f "$copy/htc-agent"
    cover n3 "$bin" "$copy" || { bad "agent missing: could not hide the agent on n3"; return; }
    j=$(submit "$w" -N 4 --exclusive -A spare --qos=capped --htc=tasks.txt --wrap=:) ||
        { uncover n3 "$bin"; bad "agent missing: submit"; return; }
    state=$(wait_job "$j" 120)
    uncover n3 "$bin"
    failed_in_one_line "agent missing on n3" "$j" "$state" "$w/slurm-$j.out" \
        '^htc: the agent could not start on n3: .*htc-agent.*No such file or directory'
    # The resume under the run's account and QOS, whose MaxSubmitJobsPerUser (2) two held jobs
    # of the user's fill first: refused with Slurm's reason, once, and nothing of the run changed.
    local h1 h2 rc rec
    h1=$(submit "$w" -N 1 -A spare --qos=capped --hold --wrap=:) && h2=$(submit "$w" -N 1 -A spare --qos=capped --hold --wrap=:)
    out=$(as_user -C "$w" "$bin/htc" resume "$j" 2>&1)
    rc=$?
    cluster_cmd scancel "$h1" "$h2"
    check "resume under the QOS's limit: refused (rc $rc), Slurm's reason said once" \
        test "$rc" != 0 -a "$(grep -c 'MaxSubmitJob' <<<"$out")" = 1
    out=$(as_user -C "$w" "$bin/htc" resume "$j" 2>&1)
    j2=$(grep -o 'Submitted batch job [0-9]*' <<<"$out" | awk '{ print $4 }')
    [[ -n $j2 ]] || { bad "agent missing: htc resume $j: $out"; return; }
    rec=$(_htc_job_record "$j2")
    check "resume: job $j2 under the run's account and QOS ($(_htc_field "$rec" Account) $(_htc_field "$rec" QOS))" \
        test "$(_htc_field "$rec" Account) $(_htc_field "$rec" QOS)" = "spare capped"
    state=$(wait_job "$j2" 120)
    check "agent missing: the node fixed, job $j2 resumes the run to its end (was $state)" test "$state" = COMPLETED
    check "agent missing: every task ran ($(sort -u "$w/ids.txt" | wc -l) of 40)" test "$(sort -u "$w/ids.txt" | wc -l)" = 40
    [[ $failed == 0 ]] || tail -n 20 "$w/slurm-$j.out"
}

# The plugin loaded on some nodes only: where it is not, Slurm runs the batch script as a plain job
# (it warns only in slurmd's log); the plugin is not needed on the other nodes of a run.
plugin_missing() {
    local w j state out empty=$HTC_CLUSTER_DIR/plugstack-none.d
    w=$(cluster_workdir plugin-missing)
    # Tasks of 0.3 s: n4's agent joins while there is still work (echo alone ends before it does).
    # shellcheck disable=SC2016 # expanded by the task
    seq 1 40 | sed 's/.*/echo "$HTC_TASK_ID $SLURMD_NODENAME" >> ids.txt; sleep 0.3/' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    install -d -m 0755 "$empty"
    cover n4 "$HTC_CLUSTER_DIR/plugstack.conf.d" "$empty" || { bad "plugin missing: could not hide it on n4"; return; }
    j=$(submit "$w" -N 4 --exclusive --htc=tasks.txt --wrap=:) || bad "plugin missing: submit"
    state=$(wait_job "$j" 120)
    check "plugin missing on n4 only, the batch step on n1: job $j COMPLETED (was $state)" test "$state" = COMPLETED
    check "plugin missing on n4: every task ran once, n4's too ($(grep -c ' n4$' "$w/ids.txt"))" \
        bash -c "[[ \$(cut -d' ' -f1 '$w/ids.txt' | sort -u | wc -l) == 40 && \$(wc -l <'$w/ids.txt') == 40 ]] && grep -q ' n4$' '$w/ids.txt'"
    out=$(as_user -C "$w" "$bin/htc" submit tasks.txt -N 1 -w n4 --parsable 2>&1)
    j=$(tail -n 1 <<<"$out" | cut -d';' -f1)
    state=$(wait_job "$j" 60)
    uncover n4 "$HTC_CLUSTER_DIR/plugstack.conf.d"
    failed_in_one_line "plugin missing on n4, htc submit's job there" "$j" "$state" "$w/slurm-$j.out" \
        "^htc: job $j ran as a plain batch script on n4: the slurm-htc plugin is not loaded there"
}

# Where the agents cannot use memory cgroups: on this site's Slurm (cgroup/v1) a step's own
# cgroup is the job user's to make cgroups in but its `tasks` file is root's, so an agent could
# not step its spawning threads back out of its slots' cgroups. With a site.conf of
# `mem_limit = cgroup` the run stops in one line naming a node and why (each agent finds it before
# it joins), no node drained; by default (auto) every agent enforces mem= by the RSS watch, and
# says so and why.
cgroups_unusable() {
    local w j state how
    w=$(cluster_workdir cgroups-unusable)
    # shellcheck disable=SC2016 # expanded by the task
    seq 1 40 | sed 's/.*/echo "$HTC_TASK_ID $SLURMD_NODENAME" >> ids.txt; sleep 0.3/' >"$w/tasks.txt"
    printf 'mem_limit = cgroup\n' >"$w/site.conf"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" -N 4 --exclusive --export="ALL,HTC_SITE_CONFIG=$w/site.conf" --htc=tasks.txt --wrap=:) ||
        bad "cgroups unusable: submit"
    state=$(wait_job "$j" 120)
    failed_in_one_line "memory cgroups unusable, mem_limit = cgroup" "$j" "$state" "$w/slurm-$j.out" \
        '^htc: the agent could not start on n[1-4]: htc-agent: --mem-limit cgroup: .*Permission denied'
    rm -f "$w/ids.txt"
    j=$(submit "$w" -N 4 --exclusive --export=ALL,HTC_LOG=info --htc=tasks.txt --wrap=:) || bad "cgroups unusable: submit"
    state=$(wait_job "$j" 120)
    check "memory cgroups unusable, by default: job $j COMPLETED (was $state)" test "$state" = COMPLETED
    check "memory cgroups unusable, by default: every task ran once" \
        test "$(cut -d' ' -f1 "$w/ids.txt" | sort -u | wc -l) $(wc -l <"$w/ids.txt")" = "40 40"
    how=$(grep -c "tasks' mem= enforced by watching their resident memory agent=[0-9]* why=.*Permission denied" "$w/slurm-$j.out")
    check "memory cgroups unusable, by default: each of the 4 agents says it watches instead, and why ($how)" test "$how" = 4
    [[ $failed == 0 ]] || tail -n 20 "$w/slurm-$j.out"
}

echo "== 4 nodes (network namespaces), the site's configuration"
"$root/tests/cluster/start-cluster.sh" -n 4 -m netns -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
echo "-- Slurm $HTC_CLUSTER_RELEASE${HTC_CLUSTER_ROOT:+ from $HTC_CLUSTER_ROOT}"
install_htc
if [[ -n ${SITE_ONLY:-} ]]; then
    printf '\n!!! SITE_ONLY="%s": only these run, the others are SKIPPED\n\n' "$SITE_ONLY" >&2
    for t in $SITE_ONLY; do timed "$t"; done
else
    timed confined
    # limited waits most of its minute on the grower's quiet time; on 2 nodes (its run's and one
    # grown job's), beside accounted on the other 2, under another QOS than limited's cap.
    side_by_side accounted limited
    timed resubmit_refused
    timed agent_missing
    timed plugin_missing
    timed cgroups_unusable
fi
[[ $failed == 0 ]] || cluster_logs 20
"$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
results
