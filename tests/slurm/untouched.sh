#!/usr/bin/env bash
# Jobs without --htc behave exactly as without the plugin: the same sbatch, srun and salloc jobs
# run on a real cluster without and then with spank_htc.so loaded, and their environments, argv
# and exit codes must be identical (values that differ between any two jobs, like the job id,
# are masked).
#
#   tests/slurm/untouched.sh          (as root, after cargo build --release --workspace)
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-test}
# shellcheck source=/dev/null
. "$root/tests/cluster/lib.sh"

passed=0 failed=0
check() { local d=$1; shift; if "$@"; then printf 'ok   %s\n' "$d"; passed=$((passed + 1)); else printf 'FAIL %s\n' "$d"; failed=$((failed + 1)); fi; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Values that differ between any two jobs, plugin or not.
mask() { sed -E 's/^((SLURM_JOB_ID|SLURM_JOBID|SLURM_TASK_PID|SLURM_SRUN_COMM_PORT|SLURM_STEP_LAUNCHER_PORT|SLURM_JOB_START_TIME|SLURM_JOB_END_TIME|SLURM_STEP_RESV_PORTS|SLURM_JOB_UID_|_)=).*/\1<varies>/' | sort; }

capture() { # LABEL: the same three jobs, results into $out/LABEL.*
    local label=$1 w j
    w=$(cluster_workdir plain)
    cat >"$w/job.sh" <<'EOF'
#!/bin/bash
env > env.sbatch
printf '%s\n' "$0" "$@" > argv.sbatch
exit 3
EOF
    chown -R "$HTC_CLUSTER_USER" "$w"
    j=$(as_user -C "$w" sbatch --parsable job.sh one "two words" --three)
    wait_job "$j" 120 >/dev/null
    echo "sbatch state=$(job_state "$j") exit=$(job_exit_code "$j")" >"$out/$label.codes"
    as_user -C "$w" srun -N1 bash -c 'env > env.srun; exit 4'
    echo "srun rc=$?" >>"$out/$label.codes"
    as_user -C "$w" salloc -N1 bash -c 'env > env.salloc; srun bash -c "env > env.salloc-srun"; exit 5' 2>/dev/null
    echo "salloc rc=$?" >>"$out/$label.codes"
    for f in env.sbatch env.srun env.salloc env.salloc-srun; do
        mask <"$w/$f" >"$out/$label.$f"
    done
    sed "s|^$w|<dir>|" "$w/argv.sbatch" >"$out/$label.argv"
}

"$root/tests/cluster/start-cluster.sh" -n 1 >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
cluster_plugin_clear
capture without

make -s -C "$root" install PROFILE="${HTC_PROFILE:-release}" BINDIR="$HTC_CLUSTER_DIR/htc-bin" PLUGINDIR="$HTC_CLUSTER_DIR/htc-bin" \
    PLUGSTACKDIR="$HTC_CLUSTER_DIR/plugstack.conf.d" >/dev/null
# slurmd reads plugstack.conf only when it starts: restart so every context has the plugin.
"$root/tests/cluster/start-cluster.sh" -n 1 >/dev/null || { echo "cluster did not restart"; exit 1; }
cluster_env
as_user sbatch --help >"$out/help" 2>&1
check "plugin is loaded (sbatch --help lists --htc)" grep -q -- '--htc=' "$out/help"
capture with

check "exit codes identical: $(tr '\n' ' ' <"$out/with.codes")" cmp -s "$out/without.codes" "$out/with.codes"
check "exit codes are the scripts' own (3, 4, 5)" grep -qx "sbatch state=FAILED exit=3" "$out/with.codes"
check "batch script argv identical" cmp -s "$out/without.argv" "$out/with.argv"
for f in env.sbatch env.srun env.salloc env.salloc-srun; do
    check "$f identical with and without the plugin" diff -u "$out/without.$f" "$out/with.$f"
done
check "no HTC variable in any plain job" bash -c "! grep -h -E '^(HTC_|SLURM_SPANK_HTC|_SLURM_SPANK_OPTION_htc|SLURM_SPANK__SLURM_SPANK_OPTION_htc)' $out/with.env.*"

cluster_plugin_clear
"$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
