#!/usr/bin/env bash
# End-to-end check of spank_htc.so against a REAL Slurm (tests/cluster harness), with a fake
# agent that records its argv/env. Runs its own throw-away cluster (own state dir and ports,
# so it does not disturb a test cluster someone else runs on the default ones).
#
#   tests/slurm/plugin.sh [--keep]      (as root; build first:
#                                                       cargo build -p spank-plugin --release)
#
# Environment: SO (plugin, default target/release/libspank_htc.so), HTC_CLUSTER_DIR
# (default /var/lib/slurm-htc-spank), HTC_CLUSTER_CTLD_PORT (6917), HTC_CLUSTER_SLURMD_PORT (17101).
set -uo pipefail
shopt -s extglob

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
keep=0
[[ ${1-} == --keep ]] && keep=1
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-spank}
export HTC_CLUSTER_NETNS=${HTC_CLUSTER_NETNS:-spankhtc}
export HTC_CLUSTER_CTLD_PORT=${HTC_CLUSTER_CTLD_PORT:-6917}
export HTC_CLUSTER_SLURMD_PORT=${HTC_CLUSTER_SLURMD_PORT:-17101}
so_src=${SO:-$root/target/release/libspank_htc.so}
harness=$root/tests/cluster
[[ -r $so_src ]] || { echo "no plugin at $so_src: cargo build -p spank-plugin --release" >&2; exit 2; }
[[ -x $harness/start-cluster.sh ]] || { echo "no cluster harness in $harness" >&2; exit 2; }

# shellcheck source=/dev/null
. "$harness/lib.sh"

fails=0
ok() { printf 'ok   %s\n' "$*"; }
bad() { printf 'FAIL %s\n' "$*"; fails=$((fails + 1)); }
check() { # DESCRIPTION COMMAND...
    local d=$1
    shift
    if "$@"; then ok "$d"; else bad "$d"; fi
}

dir=$HTC_CLUSTER_DIR
so=$dir/spank_htc.so
agent=$dir/fake-agent
conf_d=$dir/plugstack.conf.d
plug() { printf '%s\n' "$*" >"$conf_d/htc.conf"; }

install -d -m 0755 "$dir" "$conf_d"
install -m 0755 "$so_src" "$so"
cat >"$agent" <<'EOF'
#!/bin/sh
# Fake htc-agent: records argv, env and identity in the cwd, optionally runs one srun step
# (which the plugin must leave alone), exits with $FAKE_AGENT_EXIT (default 7).
rec="$PWD/agent.$SLURM_JOB_ID"
{
  echo "uid=$(id -u)"
  i=0; for a in "$0" "$@"; do echo "argv[$i]=$a"; i=$((i+1)); done
} > "$rec.argv"
env | LC_ALL=C sort > "$rec.env"
if [ -n "$FAKE_AGENT_SRUN" ]; then
  srun --overlap -N1 -n1 sh -c 'echo "step=$SLURM_STEP_ID"' > "$rec.srun" 2>&1
fi
echo "fake agent ran for job $SLURM_JOB_ID"
exit ${FAKE_AGENT_EXIT:-7}
EOF
chmod 0755 "$agent"
plug "optional $so agent=$agent"

"$harness/start-cluster.sh" -n 2 >/dev/null || { echo "cluster did not start" >&2; exit 2; }
cluster_env
stop() {
    # Never stop a munged that another cluster may share.
    rm -f -- "$dir/run/munged.pid"
    ((keep)) || "$harness/stop-cluster.sh"
}
trap stop EXIT

W=$(cluster_workdir e2e)
printf '# two tasks\necho 1\necho 2\n' >"$W/tasks.txt"
printf 'echo ok\n[nope=1] x\n' >"$W/bad.txt"
: >"$W/empty.txt"
printf 'echo ok\necho "unclosed\n' >"$W/quote.txt"
cat >"$W/job.sh" <<'EOF'
#!/bin/sh
touch script-ran.$SLURM_JOB_ID
env | LC_ALL=C sort > script-env.$SLURM_JOB_ID
exit 3
EOF
chmod 0644 "$W"/*.txt
chmod 0755 "$W/job.sh"

sub() { as_user -C "$W" "$@"; }
fails_with() { # EXPECTED-STDERR-REGEX CMD... : exit 255, message, nothing queued
    local re=$1 out rc before after
    shift
    before=$(cluster_cmd squeue -h -a | wc -l)
    out=$(sub "$@" 2>&1)
    rc=$?
    after=$(cluster_cmd squeue -h -a | wc -l)
    [[ $rc == 255 && $out =~ $re && $before == "$after" ]] || { printf '  rc=%s out=%s\n' "$rc" "$out"; return 1; }
}
argv_is() { # FILE EXPECTED-ARGS... (argv[0]…)
    local f=$1 i=0 a
    shift
    local -a want=("uid=$(id -u "$HTC_CLUSTER_USER")")
    for a in "$@"; do want+=("argv[$i]=$a"); i=$((i + 1)); done
    diff <(printf '%s\n' "${want[@]}") "$f" >/dev/null || { diff <(printf '%s\n' "${want[@]}") "$f"; return 1; }
}
# The environment must have been written (grep's "no such file" would read as "no match").
no_private_env() { [[ -s $1 ]] && ! grep -E '^(SLURM_SPANK_HTC_|_SLURM_SPANK_OPTION_htc_|SLURM_SPANK__SLURM_SPANK_OPTION_htc_)' "$1"; }
finished() { wait_job "$1" 60 >/dev/null; }

# --- submit side ---
help_lists_htc() { sub sbatch --help | grep -- '--htc=FILE' >/dev/null; }
check "sbatch --help lists --htc" help_lists_htc
check "--htc=/nonexistent: exit 255, no job" fails_with 'htc: /nonexistent: cannot read: No such file' sbatch --htc=/nonexistent --wrap=:
check "malformed file: file:line:col" fails_with 'htc: bad.txt:2:2: unknown option' sbatch --htc=bad.txt --wrap=:
check "empty file" fails_with 'htc: empty.txt: no tasks' sbatch --htc=empty.txt --wrap=:
check "shell syntax error: file:line:col, at submit" fails_with "htc: quote.txt:2:6: shell syntax: double quote" \
    sbatch --htc=quote.txt --wrap=:
check "--htc-retries=abc" fails_with 'htc: --htc-retries=abc:' sbatch --htc=tasks.txt --htc-retries=abc --wrap=:
check "--htc-output=files" fails_with 'htc: --htc-output=files:' sbatch --htc=tasks.txt --htc-output=files --wrap=:
check "--htc-partition=fluxp" fails_with "htc: --htc-partition=fluxp: 'fluxp' is not a partition plan \\(hflow or even\\)" \
    sbatch --htc=tasks.txt --htc-partition=fluxp --wrap=:
check "--htc-agents-per-node=0" fails_with "htc: --htc-agents-per-node=0: '0' is not a whole number from 1 to 4096" \
    sbatch --htc=tasks.txt --htc-agents-per-node=0 --wrap=:
check "--htc-resume=../x" fails_with "htc: --htc-resume=../x: '../x' is not a job id" sbatch --htc=tasks.txt --htc-resume=../x --wrap=:
check "--htc-max-fails=0" fails_with "htc: --htc-max-fails=0:" sbatch --htc=tasks.txt --htc-max-fails=0 --wrap=:
check "--htc-instance-nodes=0" fails_with "htc: --htc-instance-nodes=0: '0' is not a whole number from 1 to 65536" \
    sbatch --htc=tasks.txt --htc-instance-nodes=0 --wrap=:
check "--htc-grow=0" fails_with "htc: --htc-grow=0: '0' is not a number of jobs \\(1 to 1000\\)" \
    sbatch --htc=tasks.txt --htc-grow=0 --wrap=:
check "salloc --htc" fails_with 'works with sbatch only' salloc --htc=tasks.txt true

# --htc-join: the run directory (.htc/JOBID in sbatch's cwd, or the one named), checked as the
# user at submit time.
sub mkdir -p .htc/4242 .htc/4243
sub sh -c 'printf "addr=127.0.0.1:9\njob=4243\ncluster=\n" > .htc/4243/leader.addr'
install -d -m 0700 "$W/.htc/4244" # root's, as another user's run would be
: >"$W/.htc/4244/leader.addr"
check "--htc-join=0" fails_with "htc: --htc-join=0: '0' is not a job id" sbatch --htc-join=0 --wrap=:
check "--htc-join=abc" fails_with "htc: --htc-join=abc: there is no run directory .*/e2e/abc" sbatch --htc-join=abc --wrap=:
check "--htc-join=DIR: a run not running, named from elsewhere" fails_with \
    "htc: --htc-join=$W/.htc/4242: the run directory $W/.htc/4242 is not running" \
    sh -c "cd / && sbatch --htc-join=$W/.htc/4242 --wrap=:"
check "--htc-join: no such run" fails_with \
    "htc: --htc-join=999: no run \\.htc/999 in .*/e2e \\(run sbatch from the directory the run was submitted from, or give the run directory\\)" \
    sbatch --htc-join=999 --wrap=:
check "--htc-join: run not running" fails_with \
    "htc: --htc-join=4242: the run \\.htc/4242 in .*/e2e is not running \\(it ended, or has not started yet\\)" \
    sbatch --htc-join=4242 --wrap=:
check "--htc-join: another user's run" fails_with \
    "htc: --htc-join=4244: cannot read the run \\.htc/4244 in .*/e2e: permission denied \\(belongs to another user\\?\\)" \
    sbatch --htc-join=4244 --wrap=:
check "--htc-join with --htc" fails_with "--htc-join joins a running run; it takes no --htc=FILE" \
    sbatch --htc=tasks.txt --htc-join=4243 --wrap=:
check "--htc with --htc-join" fails_with "--htc-join joins a running run; it takes no --htc=FILE" \
    sbatch --htc-join=4243 --htc=tasks.txt --wrap=:
check "--htc-join with --htc-retries" fails_with "--htc-retries cannot be used with --htc-join" \
    sbatch --htc-join=4243 --htc-retries=2 --wrap=:
check "--htc-join with --htc-resume" fails_with "--htc-resume cannot be used with --htc-join" \
    sbatch --htc-resume=12 --htc-join=4243 --wrap=:
check "--htc-join with --htc-grow" fails_with "--htc-grow cannot be used with --htc-join \\(the run's own job grows it\\)" \
    sbatch --htc-join=4243 --htc-grow=2 --wrap=:
check "salloc --htc-join" fails_with 'htc: --htc-join=4243: --htc-join works with sbatch only' salloc --htc-join=4243 true

# --- batch step ---
j=$(sub env FAKE_AGENT_SRUN=1 sbatch --parsable -N2 --htc=tasks.txt --htc-retries=3 --htc-output=per-task --htc-partition=even --htc-agents-per-node=3 --htc-instance-nodes=2 --htc-max-fails=5 job.sh a1 "two words" --flag)
finished "$j"
check "htc job: exit code is the agent's (7)" test "$(job_exit_code "$j")" = 7
check "htc job: batch script not run" test ! -e "$W/script-ran.$j"
check "htc job: agent argv" argv_is "$W/agent.$j.argv" "$agent" lead --task-file "$W/tasks.txt" --retries 3 --output per-task \
    --partition even --agents-per-node 3 --instance-nodes 2 --max-fails 5 --script "$dir/spool/slurmd-n1/job$(printf %05d "$j")/slurm_script" a1 "two words" --flag
check "htc job: job env (SLURM_JOB_ID, SLURM_NODELIST, SLURM_SUBMIT_DIR)" grep -qx "SLURM_JOB_ID=$j" "$W/agent.$j.env"
check "htc job: no private HTC vars in the agent env" no_private_env "$W/agent.$j.env"
check "htc job: srun step inside is not hijacked" grep -qx 'step=0' "$W/agent.$j.srun"

j=$(sub sbatch --parsable --export=NONE --htc=tasks.txt job.sh)
finished "$j"
check "--export=NONE: agent still runs" argv_is "$W/agent.$j.argv" "$agent" lead --task-file "$W/tasks.txt" \
    --script "$dir/spool/slurmd-n1/job$(printf %05d "$j")/slurm_script"

j=$(sub sbatch --parsable --htc=tasks.txt --htc-resubmit=2 --htc-grow=3:1:30 job.sh)
finished "$j"
check "--htc-grow job: agent argv has --grow 3:1:30 after --resubmit" argv_is "$W/agent.$j.argv" "$agent" lead \
    --task-file "$W/tasks.txt" --resubmit 2 --grow 3:1:30 --script "$dir/spool/slurmd-n1/job$(printf %05d "$j")/slurm_script"

j=$(sub sbatch --parsable -N2 --export=NONE --htc-join=4243 --htc-agents-per-node=2 --htc-instance-nodes=2 job.sh a1 --flag)
finished "$j"
check "--htc-join job: agent argv" argv_is "$W/agent.$j.argv" "$agent" lead --join-run "$W/.htc/4243" --agents-per-node 2 \
    --instance-nodes 2 --script "$dir/spool/slurmd-n1/job$(printf %05d "$j")/slurm_script" a1 --flag
check "--htc-join job: batch script not run" test ! -e "$W/script-ran.$j"
check "--htc-join job: no private HTC vars in the agent env" no_private_env "$W/agent.$j.env"

printf '#!/bin/sh\n#SBATCH --htc=tasks.txt\n#SBATCH --htc-fanout=4\ntouch script-ran.$SLURM_JOB_ID\n' >"$W/htc.sh"
chmod 0755 "$W/htc.sh"
j=$(sub env FAKE_AGENT_EXIT=0 sbatch --parsable htc.sh)
finished "$j"
check "#SBATCH --htc: agent exit 0 -> COMPLETED" test "$(job_state "$j")" = COMPLETED
check "#SBATCH --htc-fanout=4 -> --fanout 4" grep -qx 'argv\[5\]=4' "$W/agent.$j.argv"

install -d -o "$HTC_CLUSTER_USER" "$W/sub"
j=$(sub sbatch --parsable --chdir="$W/sub" --htc=tasks.txt --wrap=:)
finished "$j"
check "--chdir + relative --htc: resolved against the submit dir, agent runs in --chdir" \
    grep -qx "argv\[3\]=$W/tasks.txt" "$W/sub/agent.$j.argv"

j=$(sub sbatch --parsable job.sh)
finished "$j"
check "plain job: script runs, exit 3" test "$(job_exit_code "$j")" = 3 -a -e "$W/script-ran.$j"
check "plain job: no HTC vars" no_private_env "$W/script-env.$j"

j=$(sub sbatch --parsable --array=1-2 --htc=tasks.txt job.sh)
finished "${j}_1"
check "--array with --htc: refused (125), script not run" test "$(job_exit_code "${j}_1")" = 125 -a ! -e "$W/script-ran.${j}_1"

# --- plugstack arguments ---
plug "optional $so agent=/nonexistent/htc-agent"
j=$(sub sbatch --parsable --htc=tasks.txt job.sh)
finished "$j"
check "missing agent: exit 127, message in output, script not run" bash -c \
    "[[ \$(grep -c 'cannot start the agent /nonexistent/htc-agent' '$W/slurm-$j.out') == 1 && ! -e '$W/script-ran.$j' ]]"
check "missing agent: exit code 127" test "$(job_exit_code "$j")" = 127

plug "optional $so agent=relative fanout=1"
check "misconfigured plugin: --htc refused" fails_with 'misconfigured' sbatch --htc=tasks.txt --wrap=:
plain_submit_silent() { [[ $(sub sbatch --wrap=: 2>&1) == 'Submitted batch job '+([0-9]) ]]; }
check "misconfigured plugin: plain sbatch silent" plain_submit_silent

plug "optional $so disabled"
check "disabled: --htc refused" fails_with 'disabled' sbatch --htc=tasks.txt --wrap=:
plug "optional $so agent=$agent"

echo
if ((fails)); then
    echo "e2e: $fails check(s) FAILED"
    cluster_logs 20
    exit 1
fi
echo "e2e: all checks passed"
