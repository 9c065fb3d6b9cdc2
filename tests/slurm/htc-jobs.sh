#!/usr/bin/env bash
# `sbatch --htc` end to end on a real Slurm cluster started on this machine: the plugin, the
# leader in the batch step, one srun step of agents, on 1 node (loopback) and 4 nodes (network
# namespaces, so every node has its own hostname and address). Submits as an unprivileged user.
#
#   tests/slurm/htc-jobs.sh          (as root, after cargo build --release --workspace)
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-test}
# shellcheck source=/dev/null
. "$root/tests/cluster/lib.sh"

bin=$HTC_CLUSTER_DIR/htc-bin

submit() { # DIR ARGS... -> job id on stdout, sbatch's output on stderr
    local dir=$1 out
    shift
    out=$(as_user -C "$dir" sbatch --parsable "$@" 2>&1) || { echo "$out" >&2; return 1; }
    echo "$out" | tail -n 1 | cut -d';' -f1
}

# Every id 1..N exactly once in FILE (lines "ID ...").
each_once() { # FILE N
    [[ $(cut -d' ' -f1 "$1" | sort -n | uniq | wc -l) == "$2" && $(wc -l <"$1") == "$2" && $(cut -d' ' -f1 "$1" | sort -n | head -1) == 1 && $(cut -d' ' -f1 "$1" | sort -n | tail -1) == "$2" ]]
}

run_many() { # NODES N [SBATCH OPTIONS...] -> checks on a job of N tasks recording id, hostname, node
    local nodes=$1 n=$2 w j state
    shift 2
    w=$(cluster_workdir "many-$nodes$*")
    seq 1 "$n" | sed 's|.*|echo "$HTC_TASK_ID $(hostname) $SLURMD_NODENAME $FOO" >> ids.txt|' >"$w/tasks.txt"
    printf '#!/bin/bash\nexport FOO=from-prologue\n' >"$w/job.sh"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" -N "$nodes" --exclusive "$@" --htc=tasks.txt job.sh) || { bad "$nodes node(s): submit"; return; }
    state=$(wait_job "$j" 300)
    check "$nodes node(s): job $j COMPLETED (was $state)" test "$state" = COMPLETED
    check "$nodes node(s): exit code 0" test "$(job_exit_code "$j")" = 0
    check "$nodes node(s): all $n tasks exactly once" each_once "$w/ids.txt" "$n"
    check "$nodes node(s): tasks ran on all $nodes nodes" test "$(cut -d' ' -f3 "$w/ids.txt" | sort -u | wc -l)" = "$nodes"
    check "$nodes node(s): every task saw the prologue's export" test "$(cut -d' ' -f4 "$w/ids.txt" | sort -u)" = from-prologue
    check "$nodes node(s): summary in the job output" grep -q "$n tasks: $n done, 0 failed" "$w/slurm-$j.out"
    run_dir_private "$nodes node(s)" "$w/.htc/$j"
    # One agent per node by default (each with its own output directory), running a spawn loop
    # (and an index file) per CPU: 2 per node here. The wide spawner beside them, for tasks that
    # need several CPUs, makes its files with its first task: none here.
    check "$nodes node(s): ${AGENTS_PER_NODE:-1} agent(s) per node ($(ls "$w/.htc/$j/out" | xargs))" \
        test "$(ls -d "$w/.htc/$j/out"/agent-* | wc -l)" = "$((${AGENTS_PER_NODE:-1} * nodes))"
    local loops=$((2 / ${AGENTS_PER_NODE:-1}))
    check "$nodes node(s): $loops spawn loop(s) per agent" \
        test "$(ls "$w/.htc/$j/out"/agent-*/index* | wc -l)" = "$((loops * ${AGENTS_PER_NODE:-1} * nodes))"
    if [[ -n ${INSTANCE_NODES:-} ]]; then
        # Only the heads join the leader; every other agent joins its head (agents log at info).
        check "$nodes nodes: $((nodes / INSTANCE_NODES)) instance heads joined the leader" \
            test "$(grep -c 'agent joined' "$w/slurm-$j.out")" = "$((nodes / INSTANCE_NODES))"
        check "$nodes nodes: $((nodes - nodes / INSTANCE_NODES)) members joined their heads" \
            test "$(grep -c 'member joined head=' "$w/slurm-$j.out")" = "$((nodes - nodes / INSTANCE_NODES))"
    fi
    if [[ $nodes -gt 1 ]]; then
        check "$nodes nodes: distinct hostnames" test "$(cut -d' ' -f2 "$w/ids.txt" | sort -u | wc -l)" = "$nodes"
    fi
    [[ $failed == 0 ]] || { echo "--- slurm-$j.out"; tail -n 30 "$w/slurm-$j.out"; }
}

# The run directory holds the job secret: it is the job user's and 0700 (so nothing in it can be
# reached by others), and the secret itself is 0600.
run_dir_private() { # LABEL DIR
    check "$1: run dir is the user's and 0700" test "$(stat -c '%U %a' "$2")" = "$HTC_CLUSTER_USER 700"
    check "$1: secret is 0600" test "$(stat -c '%U %a' "$2/secret")" = "$HTC_CLUSTER_USER 600"
}

bad_file_rejected() {
    local w before after out rc
    w=$(cluster_workdir bad)
    printf 'echo fine\n[cores=many] echo bad\n' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    before=$(cluster_cmd squeue -h -a -o %i | wc -l)
    out=$(as_user -C "$w" sbatch --htc=tasks.txt --wrap=: 2>&1)
    rc=$?
    after=$(cluster_cmd squeue -h -a -o %i | wc -l)
    check "bad task file: sbatch fails (rc=$rc)" test "$rc" -ne 0
    check "bad task file: error names file:line" grep -q "tasks.txt:2:2: bad value 'many' for cores" <<<"$out"
    check "bad task file: nothing queued" test "$before" = "$after"
}

failing_prologue() {
    local w j state
    w=$(cluster_workdir prologue)
    printf 'touch ran.$HTC_TASK_ID\n' >"$w/tasks.txt"
    printf '#!/bin/bash\necho setting up\nexit 4\n' >"$w/job.sh"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" --htc=tasks.txt job.sh) || { bad "failing prologue: submit"; return; }
    state=$(wait_job "$j" 120)
    check "failing prologue: job FAILED (was $state)" test "$state" = FAILED
    check "failing prologue: no task ran" test -z "$(find "$w" -name 'ran.*')"
    check "failing prologue: reason in the output" grep -q "batch script .* failed (exit status: 4); no task was run" "$w/slurm-$j.out"
}

failing_tasks() {
    local w j state
    w=$(cluster_workdir failing)
    printf 'true\n[retries=1] exit 5\n' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    # `htc submit` wraps sbatch for users without a batch script.
    j=$(as_user -C "$w" "$bin/htc" submit tasks.txt --job-name=failing | grep -o '[0-9]*$') || { bad "failing task: htc submit"; return; }
    state=$(wait_job "$j" 120)
    check "failing task: job not COMPLETED (was $state), exit code non-zero" test "$state" != COMPLETED -a "$(job_exit_code "$j")" != 0
    check "failing task: reported in the output" grep -q "task 2 (line 2): exit 5 after 2 attempts" "$w/slurm-$j.out"
    check "failing task: htc status shows it" bash -c "cd '$w' && '$bin/htc' status $j | grep -q 'done=1 failed=1'"
}

# `htc retry JOBID --failed` after a job with a failure: a new job runs the failed task again as
# its 2nd attempt, from the replica the first job left in the submit directory.
retried_job() {
    local w j j2 state out
    w=$(cluster_workdir retried)
    printf '#HTC retries=0\necho one\ntest -e fixed || exit 4; echo fixed\n' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" --htc=tasks.txt --wrap=:) || { bad "retry: submit"; return; }
    state=$(wait_job "$j" 120)
    check "retry: job $j had its failure (was $state)" grep -q "task 2 (line 3): exit 4 after 1 attempt" "$w/slurm-$j.out"
    as_user -C "$w" touch fixed
    out=$(as_user -C "$w" "$bin/htc" retry "$j" --failed 2>&1)
    j2=$(grep -o 'Submitted batch job [0-9]*' <<<"$out" | grep -o '[0-9]*$')
    check "retry: a new job ($j2) continues job $j" test -n "$j2"
    [[ -n $j2 ]] || { echo "$out"; return; }
    state=$(wait_job "$j2" 120)
    check "retry: job $j2 COMPLETED (was $state)" test "$state" = COMPLETED
    check "retry: htc status $j: both done" bash -c "cd '$w' && '$bin/htc' status $j | grep -q 'done=2 failed=0'"
    check "retry: htc log $j: task 2's two attempts" \
        test "$(as_user -C "$w" "$bin/htc" log "$j" | awk -F'\t' '$1 == 2 { print $7 }' | xargs)" = "4 0"
    check "retry: task 2's output is its new attempt's" test "$(as_user -C "$w" "$bin/htc" output "$j" 2)" = fixed
}

# A sweep under sbatch: the plugin checks it at submit (its table found beside the task file), the
# leader makes its tasks; htc output shows them in order.
swept_job() {
    local w j state
    w=$(cluster_workdir swept)
    mkdir -p "$w/in"
    printf 'a,b\n1,x\n2,"y z"\n' >"$w/in/p.csv"
    printf '#HTC sweep rows=p.csv n=1..3\necho {a} {b} {n}\n' >"$w/in/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" --htc=in/tasks.txt --wrap=:) || { bad "sweep: submit"; return; }
    state=$(wait_job "$j" 120)
    check "sweep: job $j COMPLETED (was $state)" test "$state" = COMPLETED
    check "sweep: its 6 tasks in the summary" grep -q "6 tasks: 6 done, 0 failed" "$w/slurm-$j.out"
    check "sweep: htc output in task order" test "$(as_user -C "$w" "$bin/htc" output "$j" | xargs)" = "1 x 1 1 x 2 1 x 3 2 y z 1 2 y z 2 2 y z 3"
    printf '#HTC sweep rows=p.csv +n=1..3\necho {a} {n}\n' >"$w/in/bad.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    check "sweep: a bad one is refused at submit with its place" \
        grep -q "in/bad.txt:1:23: sweep: '+n' cannot link to a table's rows" <<<"$(as_user -C "$w" sbatch --htc=in/bad.txt --wrap=: 2>&1)"
}

# Waits for a job's end by reading slurmctld's log: polling with squeue/scontrol would itself
# add controller RPCs to what is being measured.
wait_in_log() { # JOBID TIMEOUT
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        grep -q "_job_complete: JobId=$1 done" "$HTC_CLUSTER_DIR/log/slurmctld.log" && return 0
        sleep 0.1
    done
    return 1
}

# Inbound controller RPCs (sdiag, by message type) for one HTC job of N tasks.
rpcs_for() { # N -> RPC count; the breakdown goes to stderr
    local n=$1 w j
    w=$(cluster_workdir "rpc-$n")
    seq 1 "$n" | sed 's/.*/true/' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    cluster_cmd sdiag -r >/dev/null
    j=$(submit "$w" -N "$HTC_CLUSTER_NODES" --exclusive --htc=tasks.txt --wrap=:) || return 1
    wait_in_log "$j" 300 || return 1
    sleep 2 # the epilog-complete messages arrive just after the job ends
    cluster_cmd sdiag | awk '/Remote Procedure Call statistics by message type/ {on=1; next} /by user/ {on=0}
        on && /count:/ && !/REQUEST_STATS_INFO/ { c = $0; sub(/.*count:/, "", c); sub(/ .*/, "", c); print "   " $1 " " c > "/dev/stderr"; s += c }
        END { print s + 0 }'
}

# What an HTC job costs the controller, as bench/RESULTS.md (section 3) measured it on 4 nodes:
# submit, het_job_alloc_info, step_create and complete_batch once, step_complete and
# epilog_complete once per node (12), plus the leader's own two queries at its start, made since:
# `squeue` for the time left (fed_info, job_info_single, partition_info) and `scontrol show job`
# for the job's options (fed_info, job_info_single): 17 on 4 nodes, for 1,000 and 10,000 tasks
# alike (2026-11-26). The margin is one RPC per node: a node's registration (slurmctld asks every
# node for one now and then) may fall within the job. Anything more is a cost that grew.
controller_cost() {
    local a b nodes=$HTC_CLUSTER_NODES
    local most=$((4 + 2 * nodes + 5 + nodes))
    echo "RPCs of an HTC job of 1,000 tasks:"
    a=$(rpcs_for 1000)
    echo "RPCs of an HTC job of 10,000 tasks:"
    b=$(rpcs_for 10000)
    echo "sdiag inbound RPCs: 1,000 tasks: $a, 10,000 tasks: $b"
    check "controller RPCs are O(1): $a for 1k, $b for 10k tasks (<= $most each: $((most - nodes)) measured, $nodes margin)" \
        test "$a" -gt 0 -a "$a" -le "$most" -a "$b" -gt 0 -a "$b" -le "$most"
    check "controller RPCs do not grow with tasks ($a vs $b)" test "$((b - a))" -le 3 -a "$((a - b))" -le 3
}

# Long tasks use the whole allocation: 8 x `sleep 5` on 4 nodes x 2 cores run in one round, two
# per node. (The first agent to ask used to take all 8, its prefetch being 32, and ran them two at
# a time: 20 s.)
long_tasks_spread() {
    local w j state per_node elapsed
    w=$(cluster_workdir long)
    seq 1 8 | sed 's|.*|[runtime=5s] echo "$HTC_TASK_ID $SLURMD_NODENAME" >> ids.txt; sleep 5|' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" -N 4 --exclusive --htc=tasks.txt --wrap=:) || { bad "long tasks: submit"; return; }
    state=$(wait_job "$j" 120)
    check "long tasks: job $j COMPLETED (was $state)" test "$state" = COMPLETED
    per_node=$(cut -d' ' -f2 "$w/ids.txt" | sort | uniq -c | awk '{ print $1 }' | xargs)
    check "long tasks: two on each of the 4 nodes (per node: $per_node)" test "$per_node" = "2 2 2 2"
    elapsed=$(as_user -C "$w" "$bin/htc" status ".htc/$j" --json | grep -o '"elapsed_s":[0-9.]*' | cut -d: -f2)
    # The bound is 5 s; what is above it is the agents' start (one srun step) and the reports.
    check "long tasks: one round, ${elapsed} s (bound 5 s; before: 20 s)" awk -v e="$elapsed" 'BEGIN { exit !(e < 7.5) }'
}

# Issue 24, finding 7: 16 x `sleep 5` ahead of 200 x `sleep 0.1`, no runtime hints, on 4 nodes
# x 2 cores (bound 12.5 s). Each node queues the front of its even share, so the first holds
# every long task; nodes that run out of work take what waits unstarted in its queue (a Recall).
# Before: 40.9 s, all 16 on one node, two at a time.
unhinted_long_tasks_move() {
    local w j state nodes elapsed
    w=$(cluster_workdir unhinted)
    {
        for _ in $(seq 16); do echo 'echo "$HTC_TASK_ID $SLURMD_NODENAME" >> long.txt; sleep 5'; done
        for _ in $(seq 200); do echo 'sleep 0.1'; done
    } >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" -N 4 --exclusive --htc=tasks.txt --wrap=:) || { bad "unhinted: submit"; return; }
    state=$(wait_job "$j" 120)
    check "unhinted: job $j COMPLETED (was $state)" test "$state" = COMPLETED
    nodes=$(cut -d' ' -f2 "$w/long.txt" | sort | uniq -c | awk '{ print $1 }' | xargs)
    check "unhinted: the 16 long tasks ran once each, on every node (per node: $nodes)" \
        test "$(wc -l <"$w/long.txt") $(cut -d' ' -f2 "$w/long.txt" | sort -u | wc -l)" = "16 4"
    elapsed=$(as_user -C "$w" "$bin/htc" status ".htc/$j" --json | grep -o '"elapsed_s":[0-9.]*' | cut -d: -f2)
    # Within 10% of the bound, plus the agents' start (one srun step), as long_tasks_spread allows.
    check "unhinted: ${elapsed} s (bound 12.5 s; before: 40.9 s)" awk -v e="$elapsed" 'BEGIN { exit !(e < 12.5 * 1.1 + 1.5) }'
    echo "   htc status: $elapsed s; long tasks per node: $nodes"
}

# Nodes given back: one `sleep 20` and 24 x `sleep 1` on 4 nodes x 2 cores. The short ones are
# done in 3-4 s; from then on the long one is all that is left, and the nodes with nothing left go
# back to Slurm (a second after they stood idle): the run's job shrinks and Slurm has them idle
# while the run still runs; a plain job queued behind it starts on them at the scheduler's next
# pass. Every task still runs once, no agent is
# lost, and `htc status` shows the run complete. On a release older than slurm::GIVES_BACK_FROM
# (22.05: its scheduler then started no pending job for minutes) the run keeps its nodes.
nodes_given_back() {
    local w j p state given run_end plain_start left gives=yes
    [[ $(printf '%s\n' "$HTC_CLUSTER_RELEASE" 24.11 | sort -V | head -n 1) == 24.11 ]] || gives=
    w=$(cluster_workdir giveback)
    {
        echo 'sleep 20; echo "$HTC_TASK_ID $SLURMD_NODENAME" >> ids.txt'
        for _ in $(seq 24); do echo 'sleep 1; echo "$HTC_TASK_ID $SLURMD_NODENAME" >> ids.txt'; done
    } >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" -N 4 --exclusive --htc=tasks.txt --wrap=:) || { bad "give back: submit"; return; }
    wait_leader "$w" "$j" || { bad "give back: the leader of job $j did not start"; return; }
    p=$(submit "$w" -N 2 --wrap='sleep 1') || { bad "give back: the plain job: submit"; return; }
    # While the run still runs: the nodes it gave back are Slurm's to hand out (idle, or taken
    # by the plain job), none drained or down.
    local i free=''
    for ((i = 0; i < 150; i++)); do
        [[ -n $gives && $(_htc_field "$(_htc_job_record "$j")" NumNodes) -le 2 ]] || { sleep 0.1; continue; }
        left=$(cluster_cmd scontrol show hostnames "$(_htc_field "$(_htc_job_record "$j")" NodeList)")
        free=$(cluster_cmd sinfo -h -N -o '%N %T' | sort -u | grep -vw "$left" | awk '$2 ~ /^(idle|planned|allocated|mixed)$/ { print $1 }' | xargs)
        [[ $(job_state "$j") == RUNNING ]] || free=''
        break
    done
    state=$(wait_job "$j" 120)
    check "give back: job $j COMPLETED (was $state)" test "$state" = COMPLETED
    check "give back: every task ran once" each_once "$w/ids.txt" 25
    given=$(grep -c 'node given back to Slurm' "$w/slurm-$j.out")
    left=$(_htc_field "$(_htc_job_record "$j")" NumNodes)
    if [[ -z $gives ]]; then
        check "give back: Slurm $HTC_CLUSTER_RELEASE: the run kept its nodes ($left of 4, $given given back)" test "$left" = 4 -a "$given" = 0
        wait_job "$p" 60 >/dev/null
        return
    fi
    check "give back: the nodes with nothing left went back to Slurm ($given)" test "$given" -ge 2
    check "give back: no agent was lost" bash -c "! grep -qE 'agent lost|could not give' '$w/slurm-$j.out'"
    check "give back: the job ended on the nodes it kept ($left of 4)" test "$left" -le 2
    state=$(wait_job "$p" 60)
    check "give back: while the run ran, Slurm had the nodes it gave back to hand out (${free:-none})" test "$(wc -w <<<"$free")" -ge 2
    check "give back: the plain job $p queued behind it COMPLETED (was $state)" test "$state" = COMPLETED
    # Slurm starts it at its scheduler's next pass (a shrink starts none): the backfill's
    # (bf_interval, 30 s by default) may come after this run's end. A measurement, not a check.
    run_end=$(date -d "$(_htc_field "$(_htc_job_record "$j")" EndTime)" +%s)
    plain_start=$(date -d "$(_htc_field "$(_htc_job_record "$p")" StartTime)" +%s)
    echo "     the plain job started $((run_end - plain_start)) s before the run ended"
    as_user -C "$w" "$bin/htc" status "$j" >"$w/status.txt" 2>&1
    check "give back: htc status shows the run complete" grep -q "finished, all tasks succeeded" "$w/status.txt"
    ls "$w"/slurm_job_* >/dev/null 2>&1 && bad "give back: scontrol's resize scripts were left in the run's directory"
    [[ $failed == 0 ]] || tail -n 20 "$w/slurm-$j.out"
}

# Issue 24, D7: under Slurm too, a process a task starts outside its process group (`setsid`,
# as a daemon does) ends with its task, while the job goes on; HTC_KEEP_DAEMONS=1 keeps it until
# the agents end. Task 2 looks for task 1's daemon after task 1 has ended.
daemons_end_with_their_task() {
    local w j state keep seen
    for keep in 0 1; do
        w=$(cluster_workdir "daemons-$keep")
        printf '%s\n' 'setsid sleep 3097 & sleep 0.3' \
            "sleep 2; if pgrep -f 'slee[p] 3097' >/dev/null; then echo alive; else echo gone; fi > seen.txt" >"$w/tasks.txt"
        chown -R "$HTC_CLUSTER_USER" "$w"
        j=$(submit "$w" -N 1 --export=ALL,HTC_KEEP_DAEMONS=$keep --htc=tasks.txt --wrap=:) || { bad "daemons: submit"; return; }
        state=$(wait_job "$j" 60)
        seen=$(cat "$w/seen.txt" 2>/dev/null)
        check "daemons (keep=$keep): job $j COMPLETED (was $state)" test "$state" = COMPLETED
        check "daemons (keep=$keep): task 2 found task 1's daemon $seen" test "$seen" = "$([[ $keep == 1 ]] && echo alive || echo gone)"
        check "daemons (keep=$keep): nothing left after the job" bash -c "! pgrep -f 'slee[p] 3097' >/dev/null"
    done
}

# Memory under Slurm: the agents take their budget from the job's --mem (SLURM_MEM_PER_NODE,
# 600 MiB a node here) and never run two 400 MiB tasks at once on a node, though each node has
# two CPUs; every task records its agent and when it held its memory.
memory_job() { # [SBATCH OPTIONS...]
    local w j state most both oom asked
    w=$(cluster_workdir "memory$*")
    seq 1 8 | sed 's|.*|[mem=400M runtime=1s] echo "$HTC_AGENT $(date +%s.%N) 1" >> held.txt; perl -e '"'"'my $x; vec($x, (300 << 20) - 1, 8) = 1; select(undef, undef, undef, 0.5)'"'"'; echo "$HTC_AGENT $(date +%s.%N) -1" >> held.txt|' >"$w/tasks.txt"
    # A task past its mem= is stopped: the agents run as the job's user, who may not make
    # memory cgroups here, so they watch resident memory instead, and see it past 50 MiB (a
    # cgroup would have stopped it at 50).
    echo "[mem=50M retries=0] perl -e 'my \$x; vec(\$x, (300 << 20) - 1, 8) = 1; sleep 20'" >>"$w/tasks.txt"
    # One that outgrows its mem= and succeeds on the retry that grows it (50M, then 400M: it
    # waits for a node's room beside the 400 MiB tasks).
    echo "[mem=50M*8 retry_on=oom] perl -e 'my \$x; vec(\$x, (150 << 20) - 1, 8) = 1; select(undef, undef, undef, 0.3)' && echo \$HTC_ATTEMPT > grown.txt" >>"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" -N 2 --exclusive --mem=600M "$@" --htc=tasks.txt --wrap=:) || { bad "memory: submit"; return; }
    state=$(wait_job "$j" 120)
    check "memory: job $j FAILED for its one failed task (was $state)" test "$state" = FAILED
    check "memory: 9 tasks done, the 9th out of memory" grep -q "10 tasks: 9 done, 1 failed" "$w/slurm-$j.out"
    check "memory: the task that outgrew its mem= succeeded at its second attempt" test "$(cat "$w/grown.txt" 2>&1)" = 2
    asked=$(cd "$w" && "$bin/htc" log "$j" --format json | grep '"Seq":10,' | grep -o '"MemMiB":[0-9]*' | cut -d: -f2 | paste -sd' ')
    check "memory: its attempts asked 50 then 400 MiB (htc log: $asked)" test "$asked" = "50 400"
    oom=$(cd "$w" && "$bin/htc" status "$j" | grep -o 'task 9 (line 9): out of memory ([0-9]* MiB resident, past its mem=)')
    check "memory: htc status says out of memory ($oom)" test -n "$oom"
    check "memory: seen by the RSS watch, past the limit" test "$(grep -o '([0-9]*' <<<"$oom" | tr -d '(')" -gt 50
    # The most tasks holding memory at once on any agent (an end before a start at one instant).
    most=$(sort -k1,1n -k2,2n -k3,3n "$w/held.txt" | awk '$1 != a { a = $1; n = 0 } { n += $3; if (n > m) m = n } END { print m + 0 }')
    check "memory: at most one 400 MiB task at a time on a node with 600 MiB (saw $most)" test "$most" = 1
    check "memory: both nodes ran tasks" test "$(cut -d' ' -f1 "$w/held.txt" | sort -u | wc -l)" = 2
    both=$(sort -k2,2n -k3,3n "$w/held.txt" | awk '{ n += $3; if (n > m) m = n } END { print m + 0 }')
    check "memory: two at once, one on each node (saw $both)" test "$both" = 2
}

# `htc watch JOBID` from the submit directory while a 4-node job runs: a real terminal (tmux, as
# the job's user) shows the job's progress, a row per node with its hostname, and a failure.
watched_job() {
    local w j s i sock=htc-watch-$$
    w=$(cluster_workdir watch)
    { seq 1 300 | sed 's/.*/sleep 0.1/'; echo 'echo no >&2; exit 9'; } >"$w/tasks.txt"
    sed -i '1i #HTC retries=0' "$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(submit "$w" -N 4 --exclusive --htc=tasks.txt --wrap=:) || { bad "watch: submit"; return; }
    for ((i = 0; i < 300; i++)); do
        [[ -e $w/.htc/$j/live ]] && break
        sleep 0.1
    done
    as_user -C "$w" tmux -L "$sock" new-session -d -x 120 -y 40 "$bin/htc watch $j"
    screen() { as_user tmux -L "$sock" capture-pane -p; }
    s=
    for ((i = 0; i < 100; i++)); do
        s=$(screen)
        grep -q "^htc watch  run $j  running" <<<"$s" && grep -q 'nodes 4 up of 4' <<<"$s" && break
        sleep 0.2
    done
    check "watch: job $j shown running" grep -q "^htc watch  run $j  running" <<<"$s"
    check "watch: its progress" grep -q '/301 (' <<<"$s"
    check "watch: a row per node, each its own host" \
        test "$(grep -cE '^│[0-3] +[^ ]+ +[0-9]+/2 ' <<<"$s")" = 4 -a "$(grep -E '^│[0-3] ' <<<"$s" | awk '{print $2}' | sort -u | wc -l)" = 4
    for ((i = 0; i < 300; i++)); do
        s=$(screen)
        grep -q complete <<<"$s" && break
        sleep 0.2
    done
    check "watch: the job's end, all 301 counted" grep -q '301/301 (100.0%)' <<<"$s"
    check "watch: the failure with its reason" grep -q 'task 301 (line 302) on .*: exit 9' <<<"$s"
    [[ $failed == 0 ]] || printf '%s\n' "$s"
    as_user tmux -L "$sock" kill-server 2>/dev/null
    wait_job "$j" 60 >/dev/null
}

# --htc-join: a 1-node run joined by a 2-node job while it runs. Tasks run on all 3 nodes, each
# exactly once; the joined job ends when the run does; joining the finished run is refused.
joined_job() {
    local w a b state n=3000 t0 t1 alone three out
    w=$(cluster_workdir joined)
    seq 1 "$n" | sed 's|.*|sleep 0.05; echo "$HTC_TASK_ID $SLURMD_NODENAME $(date +%s.%N)" >> ids.txt|' >"$w/tasks.txt"
    printf '#!/bin/bash\nexport FOO=joined\n' >"$w/job.sh"
    chown -R "$HTC_CLUSTER_USER" "$w"
    a=$(submit "$w" -N 1 --exclusive --htc=tasks.txt job.sh) || { bad "joined: submit the run"; return; }
    wait_leader "$w" "$a"
    check "joined: the run's leader published its address" test -e "$w/.htc/$a/leader.addr"
    b=$(submit "$w" -N 2 --exclusive --htc-join="$a" job.sh) || { bad "joined: submit the joining job"; return; }
    state=$(wait_job "$a" 300)
    check "joined: the run's job $a COMPLETED (was $state)" test "$state" = COMPLETED
    state=$(wait_job "$b" 120)
    check "joined: the joining job $b ended with the run, COMPLETED (was $state)" test "$state" = COMPLETED
    check "joined: all $n tasks exactly once" each_once "$w/ids.txt" "$n"
    check "joined: tasks ran on all 3 nodes" test "$(cut -d' ' -f2 "$w/ids.txt" | sort -u | wc -l)" = 3
    check "joined: the joining job says whom it joined" grep -q "joins run .*(job $a) with 2 node(s)" "$w/slurm-$b.out"
    check "joined: the run's summary counts every task" grep -q "$n tasks: $n done, 0 failed" "$w/slurm-$a.out"
    out=$(as_user -C "$w" "$bin/htc" status "$b" --json 2>&1)
    check "joined: htc status $b (the joined job's id) shows the run" grep -q "\"done\":$n," <<<"$out"
    check "joined: no leader address once the run ended" test ! -e "$w/.htc/$a/leader.addr"
    # The rate on the run's node alone (before the first joined task ended) and on all three.
    t0=$(awk -v node="$(head -1 "$w/ids.txt" | cut -d' ' -f2)" '$2 != node {print $3; exit}' "$w/ids.txt")
    alone=$(awk -v t="$t0" 'NR == 1 {s = $3} $3 < t {k++} END {printf "%.1f", k / (t - s)}' "$w/ids.txt")
    t1=$(sort -k3 -n "$w/ids.txt" | tail -1 | cut -d' ' -f3)
    three=$(awk -v a="$t0" -v b="$t1" '$3 >= a {k++} END {printf "%.1f", k / (b - a)}' "$w/ids.txt")
    # A measurement, not a check (timings on a shared machine): bench/RESULTS.md quotes it.
    echo "     rate: $alone tasks/s on the run's node alone, $three tasks/s once joined (3 nodes)"
    local out
    if out=$(as_user -C "$w" sbatch --htc-join="$a" job.sh 2>&1); then
        bad "joined: joining the finished run was accepted"
    else
        check "joined: joining the finished run is refused ($out)" grep -q "is not running" <<<"$out"
    fi
    [[ $failed == 0 ]] || { echo "--- slurm-$a.out"; tail -n 20 "$w/slurm-$a.out"; echo "--- slurm-$b.out"; tail -n 20 "$w/slurm-$b.out"; }
}

# scancel of a joined job mid-run: the run goes on without it and finishes; what ran again is
# at most what the cancelled job's 4 slots (2 nodes, 2 CPUs each) ran in the moment of the
# scancel: the task each ran, and one each may have started in its place, since slurmstepd
# (proctrack/linuxproc) signals a task before or after its agent, in no set order, and a task's
# end frees its slot until the agent hears the signal. What had not started was given back.
joined_job_cancelled() {
    # Enough work that the joined job runs tasks before its cancel (its 4 CPUs take 20 in a
    # second) and the run's own node has some left after it (2 CPUs: 25 s for all alone).
    local w a b state n=250 i node reruns
    w=$(cluster_workdir joined-cancelled)
    seq 1 "$n" | sed 's|.*|sleep 0.2; echo "$HTC_TASK_ID $SLURMD_NODENAME" >> ids.txt|' >"$w/tasks.txt"
    printf '#!/bin/bash\n' >"$w/job.sh"
    chown -R "$HTC_CLUSTER_USER" "$w"
    a=$(submit "$w" -N 1 --exclusive --htc=tasks.txt job.sh) || { bad "cancelled join: submit the run"; return; }
    wait_leader "$w" "$a"
    # Joined by its run directory, from another directory (--chdir is not needed).
    install -d -o "$HTC_CLUSTER_USER" "$w/elsewhere"
    b=$(submit "$w/elsewhere" -N 2 --exclusive --htc-join="$w/.htc/$a" "$w/job.sh") ||
        { bad "cancelled join: submit the joining job"; return; }
    # Once the joined nodes have run tasks, the joining job is cancelled.
    for ((i = 0; i < 600; i++)); do
        node=$(head -1 "$w/ids.txt" 2>/dev/null | cut -d' ' -f2)
        [[ -n $node ]] && [[ $(awk -v n="$node" '$2 != n' "$w/ids.txt" | wc -l) -ge 20 ]] && break
        sleep 0.1
    done
    cluster_cmd scancel "$b"
    state=$(wait_job "$b" 120)
    check "cancelled join: job $b CANCELLED (was $state)" test "$state" = CANCELLED
    state=$(wait_job "$a" 300)
    check "cancelled join: the run's job $a COMPLETED without it (was $state)" test "$state" = COMPLETED
    check "cancelled join: all $n tasks ran" test "$(cut -d' ' -f1 "$w/ids.txt" | sort -u | wc -l)" = "$n"
    reruns=$(as_user -C "$w" "$bin/htc" log "$a" | awk 'NR > 1 {c[$1]++} END {for (k in c) if (c[k] > 1) r += c[k] - 1; print r + 0}')
    check "cancelled join: $reruns tasks ran again, at most 2 per slot of the 4 it had" test "$reruns" -le 8
    # A task killed just after its line was written ran twice, and is among those re-runs.
    check "cancelled join: no task ran twice but those re-run ($(($(wc -l <"$w/ids.txt") - n)) extra lines)" \
        test "$(($(wc -l <"$w/ids.txt") - n))" -le "$reruns"
    [[ $failed == 0 ]] || { echo "--- slurm-$a.out"; tail -n 20 "$w/slurm-$a.out"; echo "--- slurm-$b.out"; tail -n 20 "$w/elsewhere/slurm-$b.out"; }
}

# --htc-grow: an open run on 1 node of a 4-node cluster where 2 nodes are busy with plain jobs,
# fed from the login node in waves. Its work (400 x 0.5 s on 2 CPUs) is more than its node can do
# before its time limit, so it submits a job that joins it: asked for 2 nodes, cut to the 1 that
# is free now (sbatch --test-only says 2 start only when a plain job's time is up). A third wave
# comes while it grows; then the tail is in sight and it submits no more. Every task once; the
# plain jobs are untouched.
grown_run() {
    local w a i p plain=() state grown ids n=400 more=20
    w=$(cluster_workdir grown)
    printf '#!/bin/bash\n' >"$w/job.sh"
    seq 1 "$((n + more))" | sed 's|.*|sleep 0.5; echo "$HTC_TASK_ID $SLURMD_NODENAME" >> ids.txt|' >"$w/tasks.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    a=$(submit "$w" -N 1 --exclusive -t 2 --htc-open --htc-grow=2:2:2 job.sh) || { bad "grow: submit the run"; return; }
    wait_leader "$w" "$a" || { bad "grow: the open run's leader never listened"; cluster_logs 20; return; }
    for i in 1 2; do
        p=$(submit "$w" -N 1 --exclusive -t 2 --wrap="sleep 15") || { bad "grow: submit plain job $i"; return; }
        plain+=("$p")
    done
    ids=$(head -n 200 "$w/tasks.txt" | as_user -C "$w" "$bin/htc" task add "$a" --file - | paste -sd' ')
    ids+=" $(sed -n "201,${n}p" "$w/tasks.txt" | as_user -C "$w" "$bin/htc" task add "$a" --file - | paste -sd' ')"
    check "grow: waves 1 and 2, ids 1-$n in order" test "$ids" = "$(seq -s' ' 1 "$n")"
    for ((i = 0; i < 300; i++)); do
        grep -qs 'grow: submitted job' "$w/slurm-$a.out" && break
        sleep 0.2
    done
    ids=$(sed -n "$((n + 1)),\$p" "$w/tasks.txt" | as_user -C "$w" "$bin/htc" task add "$a" --file - | paste -sd' ')
    check "grow: wave 3 while it grows, ids $((n + 1))-$((n + more))" test "$ids" = "$(seq -s' ' $((n + 1)) $((n + more)))"
    check "grow: the close is taken" as_user -C "$w" "$bin/htc" close "$a"
    state=$(wait_job "$a" 240)
    check "grow: the run's job $a COMPLETED (was $state)" test "$state" = COMPLETED
    grown=$(grep -o 'grow: submitted job [0-9]*' "$w/slurm-$a.out" | awk '{print $NF}')
    check "grow: it submitted 1 or 2 jobs ($(echo $grown))" test "$(wc -w <<<"$grown")" -ge 1 -a "$(wc -w <<<"$grown")" -le 2
    check "grow: each submission with its reason" grep -q "grow: submitting a job of 2 node(s) for 2 min to join the run: .* tasks left" "$w/slurm-$a.out"
    check "grow: the first cut to the 1 node free now" grep -q "grow: cut to 1 node(s) for 2 min to fit a hole: it starts [0-9]* s sooner" "$w/slurm-$a.out"
    for p in $grown; do
        state=$(wait_job "$p" 120)
        check "grow: grown job $p ended with the run (was $state)" test "$state" = COMPLETED -o "$state" = CANCELLED
    done
    check "grow: a grown job joined and ran tasks" test "$(cut -d' ' -f2 "$w/ids.txt" | sort -u | wc -l)" -ge 2
    check "grow: all $((n + more)) tasks exactly once" each_once "$w/ids.txt" "$((n + more))"
    for p in "${plain[@]}"; do
        state=$(wait_job "$p" 120)
        check "grow: plain job $p COMPLETED (was $state)" test "$state" = COMPLETED
    done
    [[ $failed == 0 ]] || { echo "--- slurm-$a.out"; tail -n 30 "$w/slurm-$a.out"; }
}

# An open run on 3 nodes with every task done waits for its next ones: after standing idle for
# the site's open_idle_give_back_s (30 s by default, 5 s here) its 2 nodes besides the leader's go
# back to Slurm while it still runs, and a wave added then runs on the node it kept. Slurm 24.11
# and later (slurm::GIVES_BACK_FROM), as nodes_given_back.
open_run_gives_back() {
    local w a state i left t0 idle=5
    w=$(cluster_workdir open-giveback)
    printf '#!/bin/bash\n' >"$w/job.sh"
    printf 'open_idle_give_back_s = %s\n' "$idle" >"$w/site.conf"
    chown -R "$HTC_CLUSTER_USER" "$w"
    a=$(submit "$w" -N 3 --exclusive --export=ALL,HTC_SITE_CONFIG="$w/site.conf" --htc-open job.sh) ||
        { bad "open give back: submit"; return; }
    wait_leader "$w" "$a" || { bad "open give back: the leader never listened"; return; }
    # shellcheck disable=SC2016 # expanded by the task
    seq 1 24 | sed 's|.*|sleep 0.5; echo "$HTC_TASK_ID $SLURMD_NODENAME" >> ids.txt|' |
        as_user -C "$w" "$bin/htc" task add "$a" --file - >/dev/null
    check "open give back: the first wave done" as_user -C "$w" "$bin/htc" task wait "$a" 1-24 --timeout 60s
    t0=$(date +%s.%N)
    check "open give back: it ran on the 3 nodes" test "$(cut -d' ' -f2 "$w/ids.txt" | sort -u | wc -l)" = 3
    # The job shrinks once the leader has told Slurm (scontrol update), just after its line.
    for ((i = 0; i < 300; i++)); do
        left=$(_htc_field "$(_htc_job_record "$a")" NumNodes)
        (($(grep -c 'node given back to Slurm' "$w/slurm-$a.out") >= 2)) && [[ $left == 1 ]] && break
        sleep 0.2
    done
    check "open give back: idle, the run gave 2 nodes back and holds 1 ($left), still running ($(job_state "$a"))" \
        test "$(grep -c 'node given back to Slurm' "$w/slurm-$a.out") $left $(job_state "$a")" = "2 1 RUNNING"
    # The idle time runs from the last task's end, a moment before `htc task wait` saw it.
    local took; took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    check "open give back: not before the site's $idle s idle ($took s after the wave)" \
        awk -v t="$took" -v i="$idle" 'BEGIN { exit !(t >= i - 1) }' 
    # shellcheck disable=SC2016 # expanded by the task
    seq 25 30 | sed 's|.*|echo "$HTC_TASK_ID $SLURMD_NODENAME" >> ids.txt|' |
        as_user -C "$w" "$bin/htc" task add "$a" --file - >/dev/null
    check "open give back: the next wave done" as_user -C "$w" "$bin/htc" task wait "$a" 25-30 --timeout 60s
    check "open give back: on the node it kept ($(tail -n 6 "$w/ids.txt" | cut -d' ' -f2 | sort -u | xargs))" \
        test "$(tail -n 6 "$w/ids.txt" | cut -d' ' -f2 | sort -u | wc -l)" = 1
    check "open give back: no agent was lost" bash -c "! grep -qE 'agent lost|could not give' '$w/slurm-$a.out'"
    as_user -C "$w" "$bin/htc" close "$a" >/dev/null
    state=$(wait_job "$a" 60)
    check "open give back: closed, job $a COMPLETED (was $state)" test "$state" = COMPLETED
    check "open give back: every task ran once" each_once "$w/ids.txt" 30
    [[ $failed == 0 ]] || tail -n 20 "$w/slurm-$a.out"
}

# --htc-open: a run without a task file, fed from the login node in waves while it runs and joined
# by a second job between them; a key, dependencies, a cancel; every task's state, output and
# attempt checked against the ledger once the run ended; the close. Then an open run that ends by
# itself after its idle time.
open_run() {
    local w a b c state ids st ledger n1=100 n2=300 long
    w=$(cluster_workdir open)
    printf '#!/bin/bash\n' >"$w/job.sh"
    seq 1 "$n1" | sed 's|.*|sleep 0.1; echo "$HTC_TASK_ID $SLURMD_NODENAME" >> ids.txt|' >"$w/wave1.txt"
    seq 1 "$n2" | sed 's|.*|sleep 0.2; echo "$HTC_TASK_ID $SLURMD_NODENAME" >> ids.txt|' >"$w/wave2.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    a=$(submit "$w" -N 1 --exclusive --htc-open job.sh) || { bad "open: submit the open run"; return; }
    wait_leader "$w" "$a" || { bad "open: the open run's leader never listened"; cluster_logs 20; return; }
    check "open: the job says it is open and how to feed it" grep -qs "htc: job $a: no tasks yet on 1 node(s); open: htc task add $a" "$w/slurm-$a.out" "$w/.htc/$a/job.out"
    ids=$(as_user -C "$w" "$bin/htc" task add "$a" --file - <"$w/wave1.txt" | paste -sd' ')
    check "open: wave 1 from a pipe, ids 1-$n1 in order" test "$ids" = "$(seq -s' ' 1 "$n1")"
    b=$(submit "$w" -N 2 --exclusive --htc-join="$a" job.sh) || { bad "open: submit the joining job"; return; }
    long=$(as_user -C "$w" "$bin/htc" task add "$a" --key long -- sleep 600)
    check "open: a key gives the same id again ($long)" test "$(as_user -C "$w" "$bin/htc" task add "$a" --key long -- sleep 600)" = "$long"
    as_user -C "$w" "$bin/htc" task add "$a" --after "$long" -- touch never.txt >/dev/null
    ids=$(as_user -C "$w" "$bin/htc" task add "$a" --file "$w/wave2.txt" | paste -sd' ')
    check "open: wave 2 from a file, ids 103-$((n1 + n2 + 2))" test "$ids" = "$(seq -s' ' 103 $((n1 + n2 + 2)))"
    as_user -C "$w" "$bin/htc" task add "$a" --after "1-100,103-$((n1 + n2 + 2))" -- sh -c 'wc -l < ids.txt > count.txt' >/dev/null
    check "open: waiting for both waves and the task after them succeeds" as_user -C "$w" "$bin/htc" task wait "$a" 1-100 103-403 --timeout 180s
    # A request only the leader carries out reads no ledger on the login node (there it would be
    # rebuilt from the replica for each client): with no temporary directory to rebuild it in, a
    # cancel of a finished task still goes through.
    check "open: a cancel from the login node rebuilds no ledger there" \
        as_user -C "$w" env TMPDIR=/nonexistent "$bin/htc" task cancel "$a" 1
    st=$(as_user -C "$w" "$bin/htc" task status "$a" "$long" 102)
    check "open: the long task runs, its dependent is blocked ($(echo $st))" test "$(cut -f2 <<<"$st" | paste -sd' ')" = "running blocked"
    check "open: cancel the long task" as_user -C "$w" "$bin/htc" task cancel "$a" "$long"
    as_user -C "$w" "$bin/htc" task wait "$a" "$long" 102 --timeout 60s
    check "open: a cancelled task's wait says so (exit 1)" test $? = 1
    st=$(as_user -C "$w" "$bin/htc" task status "$a" --all)
    check "open: the leader's states: 401 done, the long task and its dependent cancelled" \
        test "$(cut -f2 <<<"$st" | sort | uniq -c | awk '{printf "%s %s ", $2, $1}')" = "cancelled 2 done 401 "
    check "open: the close is taken" as_user -C "$w" "$bin/htc" close "$a"
    state=$(wait_job "$a" 120)
    check "open: the closed run's job ends, FAILED as a run with cancelled tasks does (was $state)" test "$state" = FAILED
    state=$(wait_job "$b" 120)
    check "open: the joining job $b ended with the run, COMPLETED (was $state)" test "$state" = COMPLETED
    ledger=$(as_user -C "$w" "$bin/htc" task status "$a" --all)
    check "open: the ledger says what the leader said" test "$ledger" = "$st"
    check "open: every task of both waves once" \
        test "$(cut -d' ' -f1 "$w/ids.txt" | sort -n | paste -sd' ')" = "$(seq -s' ' 1 100) $(seq -s' ' 103 402)"
    check "open: tasks ran on all 3 nodes" test "$(cut -d' ' -f2 "$w/ids.txt" | sort -u | wc -l)" = 3
    check "open: the last task ran after both waves" test "$(cat "$w/count.txt" 2>/dev/null)" = 400
    check "open: the cancelled task's dependent never ran" test ! -e "$w/never.txt"
    check "open: no task ran twice, as htc log says" \
        test "$(as_user -C "$w" "$bin/htc" log "$a" | awk 'NR > 1 {c[$1]++} END {for (k in c) if (c[k] > 1) r++; print r + 0}')" = 0
    out=$(as_user -C "$w" "$bin/htc" task add "$a" -- true 2>&1)
    check "open: an add to the ended run is refused ($out)" grep -q "not running" <<<"$out"
    # Idle exit: one task, then nothing for 5 s: the job ends by itself.
    c=$(submit "$w" -N 1 --htc-open=5s job.sh) || { bad "open: submit the idle run"; return; }
    wait_leader "$w" "$c" || { bad "open: the idle run's leader never listened"; return; }
    as_user -C "$w" "$bin/htc" task add "$c" -- sh -c 'echo idle > idle.txt' >/dev/null
    state=$(wait_job "$c" 90)
    check "open: the idle open run ended by itself, COMPLETED (was $state)" test "$state" = COMPLETED
    check "open: its one task ran" grep -q idle "$w/idle.txt"
    [[ $failed == 0 ]] || for j in "$a" "$b" "$c"; do echo "--- slurm-$j.out"; tail -n 20 "$w/slurm-$j.out"; done
}

# The Python client on the cluster, as a user runs it on the login node: Executor(slurm=...)
# submits `sbatch --htc-open` of 2 nodes, waits for its leader, runs futures (one after all the
# others) and closes the job at shutdown.
python_client() {
    local w out job state
    w=$(cluster_workdir python)
    mkdir -p "$w/py" && cp -r "$root/clients/python/src/slurm_htc" "$w/py/"
    cat >"$w/client.py" <<EOF
from slurm_htc import Executor
with Executor(slurm={"nodes": 2, "time": "5"}, htc="$bin/htc", cores=1) as ex:
    fs = [ex.submit("sleep 0.2; echo \$SLURMD_NODENAME") for _ in range(40)]
    last = ex.submit("echo after all", after=fs)
    nodes = {f.result().stdout().strip() for f in fs}
    print(ex.run, len(nodes), last.result().stdout().strip())
EOF
    chown -R "$HTC_CLUSTER_USER" "$w"
    out=$(as_user -C "$w" env PYTHONPATH="$w/py" python3 client.py 2>&1) || true
    job=$(tail -n 1 <<<"$out" | cut -d' ' -f1)
    check "python: 40 futures on the 2 nodes of job $job, then the one after them ($(tail -n 1 <<<"$out"))" \
        test "$(tail -n 1 <<<"$out" | cut -d' ' -f2-)" = "2 after all"
    [[ $job =~ ^[0-9]+$ ]] || { echo "$out" | tail -n 20; return; }
    state=$(wait_job "$job" 60)
    check "python: the executor's job ended at its shutdown, COMPLETED (was $state)" test "$state" = COMPLETED
}

# The clients' Slurm jobs outlive no use (issue 52), on the 4 nodes: a Python client killed after
# its work leaves its run's job idle for its 10 s idle time, not the 30 minutes of a fixed one; a
# client that gives up on a pending job (Ctrl-C) cancels it, so it never starts for nobody; a
# Snakemake with nothing to do submits nothing. The node-seconds held idle are in the checks.
clients_leave_no_idle_allocation() {
    local w out job state t0 held client sm=${HTC_PY_VENV:-}/bin/snakemake
    w=$(cluster_workdir idle)
    mkdir -p "$w/py" "$w/sm" && cp -r "$root/clients/python/src/slurm_htc" "$w/py/"
    printf '%s\n' "import os" "from slurm_htc import Executor" \
        "ex = Executor(slurm={'nodes': 4, 'time': '5'}, htc='$bin/htc')" \
        "ex.submit('true').result()" "print(ex.run, flush=True)" "os._exit(9)" >"$w/killed.py"
    # SIGINT as at a terminal (a background job would inherit it ignored).
    printf '%s\n' "import logging, signal, sys" "from slurm_htc import Executor" \
        "signal.signal(signal.SIGINT, signal.default_int_handler)" \
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(message)s')" \
        "Executor(slurm={'nodes': 4, 'time': '5', 'sbatch_args': ['--begin=now+3600']}, htc='$bin/htc')" >"$w/pending.py"
    printf '%s\n' 'rule all:' '    input: "a.txt"' 'rule a:' '    output: "a.txt"' '    shell: "touch {output}"' >"$w/sm/Snakefile"
    touch "$w/sm/a.txt"
    chown -R "$HTC_CLUSTER_USER" "$w"
    out=$(as_user -C "$w" env PYTHONPATH="$w/py" python3 killed.py 2>&1) || true
    t0=$(_htc_usec)
    job=$(tail -n 1 <<<"$out")
    [[ $job =~ ^[0-9]+$ ]] || { bad "idle: the killed client's job ($out)"; return; }
    state=$(wait_job "$job" 120)
    held=$((($(_htc_usec) - t0) * 4 / 1000000))
    check "idle: a killed client's 4-node job ended by itself, $state, $held node-s after the kill (<= 60)" \
        test "$state" = COMPLETED -a "$held" -le 60
    # Pending for an hour (--begin): the client waits, saying so; a Ctrl-C cancels the job.
    as_user -C "$w" env PYTHONPATH="$w/py" python3 pending.py >"$w/pending.log" 2>&1 &
    client=$!
    for _ in $(seq 100); do grep -q "is pending" "$w/pending.log" && break; sleep 0.1; done
    pkill -INT -u "$HTC_CLUSTER_USER" -f "python3 pending.py"
    wait "$client"
    job=$(grep -o 'Slurm job [0-9]*' "$w/pending.log" | head -n 1 | cut -d' ' -f3)
    check "idle: a client waits for its pending job and says so ($(grep -m1 'is pending' "$w/pending.log"))" \
        grep -q "is pending (BeginTime)" "$w/pending.log"
    check "idle: given up (Ctrl-C), the pending job $job is cancelled, never started ($(job_state "$job"))" \
        test "$(job_state "$job")" = CANCELLED
    [[ -x $sm ]] || { bad "idle: no venv with Snakemake (HTC_PY_VENV=${HTC_PY_VENV:-})"; return; }
    out=$(as_user -C "$w/sm" "$sm" --executor htc --jobs 4 --htc-nodes 4 --htc-time 5 --htc-binary "$bin/htc" 2>&1)
    check "idle: a Snakemake with nothing to do submits no job" \
        test -z "$(ls "$w/sm/.htc" 2>/dev/null)" -a -n "$(grep 'Nothing to be done' <<<"$out")"
    grep -q 'Nothing to be done' <<<"$out" || tail -n 5 <<<"$out"
}

# `snakemake --executor htc --htc-nodes 2`: the plugin submits `sbatch --htc-open` and runs the
# workflow's jobs in that one job; the same outputs as Snakemake's local executor. Snakemake and
# the plugin come from the venv tests/run-all.sh made ($HTC_PY_VENV), readable by the user.
snakemake_on_cluster() {
    local w out job state sm=${HTC_PY_VENV:-}/bin/snakemake
    [[ -x $sm ]] || { bad "snakemake: no venv with Snakemake (HTC_PY_VENV=${HTC_PY_VENV:-})"; return; }
    w=$(cluster_workdir snakemake)
    mkdir -p "$w/local" "$w/htc"
    for d in local htc; do cp "$root/clients/snakemake/tests/Snakefile" "$w/$d/"; done
    chown -R "$HTC_CLUSTER_USER" "$w"
    as_user -C "$w/local" "$sm" --cores 2 --config samples=100 >"$w/local.log" 2>&1
    out=$(as_user -C "$w/htc" "$sm" --executor htc --jobs 100 --htc-nodes 2 --htc-time 5 \
        --htc-binary "$bin/htc" --config samples=100 2>&1)
    echo "$out" >"$w/htc.log"
    check "snakemake: 302 jobs through the plugin on 2 nodes" grep -q "302 of 302 steps (100%) done" "$w/htc.log"
    grep -q "302 of 302 steps" "$w/htc.log" || tail -n 20 "$w/htc.log"
    check "snakemake: the outputs are the local executor's" diff -r "$w/local/out" "$w/htc/out"
    job=$(ls "$w/htc/.htc" 2>/dev/null | head -n 1)
    [[ $job =~ ^[0-9]+$ ]] || { bad "snakemake: no run of a Slurm job in $w/htc/.htc"; tail -n 20 <<<"$out"; return; }
    check "snakemake: its tasks ran on both nodes ($(sort -u "$w/htc/nodes.log" | xargs))" \
        test "$(sort -u "$w/htc/nodes.log" | wc -l)" = 2
    state=$(wait_job "$job" 60)
    check "snakemake: the run's job ended when Snakemake did, COMPLETED (was $state)" test "$state" = COMPLETED
    # A run of another user (root's, here) is refused with the reason, before any job.
    mkdir -p "$w/root" && chmod 755 "$w/root"
    (cd "$w/root" && exec "$bin/htc" run --open -q --idle-exit 60s </dev/null >/dev/null 2>&1) &
    local leader=$! r
    for _ in $(seq 100); do r=$(ls "$w/root/.htc" 2>/dev/null | head -n 1); [[ -n $r && -e $w/root/.htc/$r/leader.addr ]] && break; sleep 0.1; done
    out=$(as_user -C "$w/htc" "$sm" --executor htc --jobs 1 --htc-run "$w/root/.htc/$r" \
        --htc-binary "$bin/htc" --forceall --config samples=1 2>&1)
    echo "$out" >"$w/refused.log"
    check "snakemake: another user's run is refused ($(grep -m1 'slurm-htc:' "$w/refused.log"))" \
        grep -q "slurm-htc: .*ermission denied" "$w/refused.log"
    grep -q "slurm-htc: .*ermission denied" "$w/refused.log" || tail -n 20 "$w/refused.log"
    "$bin/htc" close "$w/root/.htc/$r" >/dev/null 2>&1
    wait "$leader"
}

if [[ -n ${HTC_JOBS_ONLY:-} ]]; then # these tests (names, in order) on 4 nodes, while developing them
    printf '\n!!! HTC_JOBS_ONLY=%s: only this test runs, the others are SKIPPED\n\n' "$HTC_JOBS_ONLY" >&2
    "$root/tests/cluster/start-cluster.sh" -n 4 -m netns -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
    cluster_env
    install_htc
    for t in $HTC_JOBS_ONLY; do timed "$t"; done
    echo "$passed passed, $failed failed"
    exit $((failed > 0))
fi

if [[ -n $HTC_CLUSTER_ROOT ]]; then
    # A second release (tests/run-all.sh runs every scenario on the first): the workload, its
    # tree and instances, joins, nodes given back, open runs with the Python client and
    # Snakemake. The rest (bad input, prologue, retries, sweeps, the watch, memory) is the same
    # code whichever Slurm runs it; so is growth's plan (grown_run), whose sbatch and join this
    # release sees in site.sh's `limited`.
    echo "== 4 nodes (network namespaces), the second release's set"
    "$root/tests/cluster/start-cluster.sh" -n 4 -m netns -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
    cluster_env
    echo "-- Slurm $HTC_CLUSTER_RELEASE from $HTC_CLUSTER_ROOT"
    install_htc
    timed run_many 4 10000
    timed run_many 4 3000 --htc-fanout=2
    INSTANCE_NODES=2 timed run_many 4 3000 --htc-instance-nodes=2 --export=ALL,HTC_LOG=info
    timed joined_job
    timed nodes_given_back
    timed open_run
    timed open_run_gives_back
    timed python_client
    timed snakemake_on_cluster
    [[ $failed == 0 ]] || cluster_logs 20
    "$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
    echo "$passed passed, $failed failed"
    [[ $failed == 0 ]]
    exit
fi

echo "== 1 node (loopback)"
"$root/tests/cluster/start-cluster.sh" -n 1 -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
install_htc
timed run_many 1 10000
timed bad_file_rejected
timed failing_prologue
timed failing_tasks
timed retried_job
timed swept_job

echo "== 4 nodes (network namespaces)"
"$root/tests/cluster/start-cluster.sh" -n 4 -m netns -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
install_htc
timed run_many 4 10000
echo "-- fan-out 2: agents 2 and 3 reach the leader through agent 0 (PMI2 bootstrap)"
timed run_many 4 3000 --htc-fanout=2
echo "-- --htc-agents-per-node=2: two instances on each node, one CPU each"
AGENTS_PER_NODE=2 timed run_many 4 2000 --htc-agents-per-node=2
echo "-- --htc-instance-nodes=2: two instances of two nodes each, members fed by their head"
INSTANCE_NODES=2 timed run_many 4 3000 --htc-instance-nodes=2 --export=ALL,HTC_LOG=info
timed controller_cost
timed long_tasks_spread
timed unhinted_long_tasks_move
timed nodes_given_back
timed daemons_end_with_their_task
timed watched_job
timed memory_job
echo "-- one instance of both nodes: its head places the tasks on the node each fits"
timed memory_job --htc-instance-nodes=2
echo "-- --htc-join: a second allocation joins a running run"
timed joined_job
timed joined_job_cancelled
timed grown_run
echo "-- --htc-open: tasks added from the login node while the run runs"
timed open_run
timed python_client
timed snakemake_on_cluster
timed clients_leave_no_idle_allocation

[[ $failed == 0 ]] || cluster_logs 20
"$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
