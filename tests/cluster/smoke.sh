#!/usr/bin/env bash
# Smoke test of the cluster harness itself: plain batch job on 1 node, a
# 4-node loopback cluster (srun in a batch job, srun --overlap next to a
# running step) and a 4-node netns cluster with distinct hostnames.
# Runs as root; stops the cluster at the end (HTC_KEEP_CLUSTER=1 keeps it).
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

short=$(hostname -s)
passed=0

cleanup() {
    local rc=$?
    if ((rc != 0)); then
        printf 'smoke: FAILED (%d passed before the failure)\n' "$passed" >&2
        printf '%s passed, 1 failed\n' "$passed"
    fi
    if [[ ${HTC_KEEP_CLUSTER:-0} != 1 ]]; then "$here/stop-cluster.sh" || true; fi
}
trap cleanup EXIT

fail() {
    printf 'smoke: FAIL: %s\n' "$*" >&2
    cluster_logs 15 >&2 || true
    exit 1
}
ok() {
    passed=$((passed + 1))
    printf 'ok %d - %s\n' "$passed" "$*"
}

# expect_eq WHAT EXPECTED ACTUAL
expect_eq() {
    [[ $2 == "$3" ]] || fail "$1: expected [$(tr '\n' ' ' <<<"$2")] got [$(tr '\n' ' ' <<<"$3")]"
}

# submit DIR ARGS... -> job id; sbatch runs as the test user
submit() {
    local dir=$1 id
    shift
    id=$(as_user -C "$dir" sbatch --parsable "$@") || fail "sbatch $* failed"
    printf '%s\n' "${id%%;*}"
}

# finish JOBID WHAT: wait, require COMPLETED with exit code 0
finish() {
    local state ec
    state=$(wait_job "$1" 60) || fail "$2: job $1 did not finish"
    ec=$(job_exit_code "$1")
    [[ $state == COMPLETED && $ec == 0 ]] ||
        fail "$2: job $1 ended $state with exit code $ec: $(cat "$work/slurm-$1.out" 2>/dev/null)"
}

start() {
    t_start=$EPOCHREALTIME
    "$here/start-cluster.sh" "$@" || fail "start-cluster.sh $* failed"
    cluster_env
}

# --- 1 node, loopback ---------------------------------------------------------
start -n 1
work=$(cluster_workdir smoke1)
id=$(submit "$work" --wrap hostname)
finish "$id" "sbatch --wrap hostname"
expect_eq "1-node job output" "$short" "$(cat "$work/slurm-$id.out")"
ok "1-node loopback: sbatch --wrap hostname COMPLETED in $(_htc_elapsed "$t_start") s from start"

# --- 4 nodes, loopback --------------------------------------------------------
start -n 4
work=$(cluster_workdir smoke4)
id=$(submit "$work" -N4 --wrap 'srun hostname')
finish "$id" "sbatch -N4 srun hostname"
expect_eq "srun hostname on 4 loopback nodes" "$(printf '%s\n' "$short" "$short" "$short" "$short")" \
    "$(cat "$work/slurm-$id.out")"
ok "4-node loopback: sbatch -N4 --wrap 'srun hostname' COMPLETED in $(_htc_elapsed "$t_start") s from start"

# Loopback nodes share the hostname; the node name is what tells them apart.
id=$(submit "$work" -N4 --wrap 'srun printenv SLURMD_NODENAME | sort')
finish "$id" "srun printenv SLURMD_NODENAME"
expect_eq "SLURMD_NODENAME on 4 loopback nodes" "$(printf 'n%s\n' 1 2 3 4)" "$(cat "$work/slurm-$id.out")"
ok "4-node loopback: SLURMD_NODENAME is n1..n4"

# A step that holds every allocated CPU, then an --overlap step beside it. Without
# --overlap the second step would wait ("Requested nodes are busy") and time out. Each asks for a
# part of the job's memory: memory is consumable, and --overlap shares only CPUs before 23.11.
cat >"$work/overlap.sh" <<'EOF'
#!/bin/bash
# Its stderr would get "step cancelled" noise when it is killed below.
srun -N4 --ntasks-per-node=1 --mem=100 sleep 60 2>/dev/null &
bg=$!
for _ in $(seq 100); do
    squeue -h -s -j "$SLURM_JOB_ID" -o %i | grep -x "$SLURM_JOB_ID.0" >/dev/null && break
    sleep 0.1
done
# squeue lists a step only while it runs.
squeue -h -s -j "$SLURM_JOB_ID" -o %i | grep -x "$SLURM_JOB_ID.0" | sed 's/^[0-9]*/step/'
timeout 15 srun --overlap -N4 --ntasks-per-node=1 --mem=100 printenv SLURMD_NODENAME | sort
rc=${PIPESTATUS[0]}
kill "$bg"
wait "$bg" || true
exit "$rc"
EOF
chmod 0755 "$work/overlap.sh"
t=$EPOCHREALTIME
id=$(submit "$work" -N4 overlap.sh)
finish "$id" "srun --overlap beside a running step"
expect_eq "srun --overlap output" "$(printf '%s\n' step.0 n1 n2 n3 n4)" "$(cat "$work/slurm-$id.out")"
ok "4-node loopback: srun --overlap ran beside a busy step (job took $(_htc_elapsed "$t") s)"

# --- 4 nodes, netns -----------------------------------------------------------
start -n 4 -m netns
work=$(cluster_workdir smoke-netns)
out=$(as_user -C "$work" srun -N4 hostname | sort) || fail "srun -N4 hostname failed in netns mode"
expect_eq "srun hostname on 4 netns nodes" "$(printf 'n%s\n' 1 2 3 4)" "$out"
ok "4-node netns: srun -N4 hostname printed n1..n4 $(_htc_elapsed "$t_start") s from start"

id=$(submit "$work" -N4 --wrap 'srun hostname | sort')
finish "$id" "netns sbatch -N4 srun hostname"
expect_eq "netns batch srun hostname" "$(printf 'n%s\n' 1 2 3 4)" "$(cat "$work/slurm-$id.out")"
ok "4-node netns: sbatch -N4 --wrap 'srun hostname' COMPLETED"

# The root namespace must have gained nothing: no 10.199.0.0/24 address or route.
if ip -o addr show | grep '10\.199\.' >/dev/null; then fail "root namespace got a 10.199 address"; fi
if ip route show | grep '10\.199\.' >/dev/null; then fail "root namespace got a 10.199 route"; fi
ok "netns: root namespace has no address or route of the test network"

"$here/stop-cluster.sh"
left=$(ip netns list | grep -cE "^${HTC_CLUSTER_NETNS}-" || true)
expect_eq "namespaces left after stop" 0 "$left"
ok "stop-cluster.sh removed every daemon and namespace"

printf 'smoke: %d passed, 0 failed\n' "$passed"
