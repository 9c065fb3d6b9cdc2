#!/usr/bin/env bash
# One Snakemake workflow four ways on the test cluster (issue 41): SAMPLES samples x 3 shell
# steps, then a merge (a `run:` block), i.e. 3*SAMPLES+2 jobs:
#   local        snakemake --cores NODES*2 (Snakemake's local executor on as many cores as the
#                cluster has: its own cost per job, the reference)
#   htc          snakemake --executor htc --htc-nodes NODES: one `sbatch --htc-open`, every job a
#                task of that one run
#   slurm        snakemake --executor slurm (snakemake-executor-plugin-slurm, its defaults: one
#                sbatch per job)
#   slurm-array  the same with --slurm-array-jobs=all (job arrays where it can)
# Reported per contender: makespan (snakemake's start to its end), the controller's inbound RPCs
# (`sdiag`, reset before each), and the wait of PLAIN plain one-node jobs submitted 5 s after the
# workflow started (citizenship: StartTime - SubmitTime). The outputs of every contender are
# compared with the local executor's.
#
#   bench/snakemake.sh [-n NODES]     (as root; `make install` builds and installs the dist binaries)
#
# Env: SAMPLES (100), PLAIN (2), JOBS (100: snakemake --jobs for the Slurm plugin; the htc plugin
#      gets 1000), CONTENDERS (default: all four), VENV (a venv with Snakemake and the plugins,
#      readable by the cluster's user; made under /tmp when unset).
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
nodes=4
[[ ${1-} == -n ]] && nodes=$2
SAMPLES=${SAMPLES:-100}
PLAIN=${PLAIN:-2}
JOBS=${JOBS:-100}
CONTENDERS=${CONTENDERS:-local htc slurm slurm-array}
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-bench}
export HTC_CLUSTER_CTLD_PORT=${HTC_CLUSTER_CTLD_PORT:-6827}
export HTC_CLUSTER_SLURMD_PORT=${HTC_CLUSTER_SLURMD_PORT:-17301}
# shellcheck source=/dev/null
. "$root/tests/cluster/lib.sh"

out=$root/bench/results/snakemake-$(date -u +%Y%m%d-%H%M%S).txt
mkdir -p "$root/bench/results"
exec > >(tee "$out") 2>&1

# Snakemake and the plugins, pinned; from /usr/bin/python3 (a Python under /root is out of the
# cluster user's reach).
if [[ -z ${VENV:-} ]]; then
    VENV=$(mktemp -d /tmp/htc-smk-bench.XXXXXX) VENV_MADE=1
    chmod 755 "$VENV"
    "$(command -v /usr/bin/python3 || command -v python3)" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "snakemake==9.27.1" \
        "snakemake-interface-executor-plugins==9.4.0" "snakemake-executor-plugin-slurm==2.8.0" \
        "$root/clients/python" "$root/clients/snakemake" || exit 1
fi
sm=$VENV/bin/snakemake

"$root/tests/cluster/start-cluster.sh" -n "$nodes" -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
bin=$HTC_CLUSTER_DIR/htc-bin
make -s -C "$root" install BINDIR="$bin" PLUGINDIR="$bin" PLUGSTACKDIR="$HTC_CLUSTER_DIR/plugstack.conf.d" >/dev/null

# The Slurm plugin's job step drops every SLURM_* variable, SLURM_CONF too, before its inner
# srun: that srun finds the configuration where a real cluster keeps it, or not at all.
made_conf=
if [[ ! -e /etc/slurm/slurm.conf ]]; then
    mkdir -p /etc/slurm && ln -s "$SLURM_CONF" /etc/slurm/slurm.conf && made_conf=1
fi
trap '[[ -z $made_conf ]] || rm -f /etc/slurm/slurm.conf' EXIT
cores=$((nodes * 2))
echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
echo "cluster: $nodes nodes x 2 CPUs on this machine (network namespaces), Slurm $(sinfo -V 2>/dev/null | cut -d' ' -f2)"
echo "snakemake $("$sm" --version), $("$VENV/bin/pip" list 2>/dev/null | grep -E '^snakemake-executor-plugin' | tr -s ' ' | tr '\n' ' ')"
echo "htc $(cd "$root" && git rev-parse --short HEAD); workflow: $SAMPLES samples x 3 steps + merge = $((3 * SAMPLES + 2)) jobs"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"

usec() { printf '%s\n' "${EPOCHREALTIME//[!0-9]/}"; }
inbound_rpcs() { # the controller's inbound RPCs since `sdiag -r`
    cluster_cmd sdiag | awk '/by message type/ {on=1; next} /by user/ {on=0}
        on && /count:/ && !/REQUEST_STATS_INFO/ { c = $0; sub(/.*count:/, "", c); sub(/ .*/, "", c); s += c }
        END { print s + 0 }'
}
waits_of() { # JOBIDS...: each one's StartTime - SubmitTime, in seconds
    local j s t
    for j in "$@"; do
        s=$(cluster_cmd scontrol show job "$j" -o | grep -o 'SubmitTime=[^ ]*' | cut -d= -f2)
        t=$(cluster_cmd scontrol show job "$j" -o | grep -o 'StartTime=[^ ]*' | cut -d= -f2)
        echo $(($(date -d "$t" +%s) - $(date -d "$s" +%s)))
    done
}

args_of() { # CONTENDER -> snakemake's arguments
    case $1 in
        local) echo "--cores $cores" ;;
        htc) echo "--executor htc --jobs 1000 --htc-nodes $nodes --htc-time 30 --htc-binary $bin/htc" ;;
        slurm) echo "--executor slurm --jobs $JOBS --slurm-status-command squeue --default-resources runtime=10 mem_mb=100" ;;
        slurm-array) echo "--executor slurm --jobs $JOBS --slurm-status-command squeue --slurm-array-jobs=all --default-resources runtime=10 mem_mb=100" ;;
    esac
}

declare -A res
for c in $CONTENDERS; do
    w=$(cluster_workdir "smk-$c")
    cp "$root/clients/snakemake/tests/Snakefile" "$w/"
    chown -R "$HTC_CLUSTER_USER" "$w"
    # shellcheck disable=SC2046 # the arguments are words
    cluster_cmd sdiag -r >/dev/null
    t0=$(usec)
    as_user -C "$w" env PATH="$bin:$VENV/bin:/usr/bin:/bin" "$sm" $(args_of "$c") --config samples="$SAMPLES" \
        >"$w/snakemake.log" 2>&1 &
    smpid=$!
    plain=()
    if [[ $c != local ]]; then
        sleep 5
        for ((i = 0; i < PLAIN; i++)); do
            plain+=("$(as_user -C "$w" sbatch --parsable -N 1 -t 2 --wrap 'sleep 5' | cut -d';' -f1)")
        done
    fi
    wait "$smpid"
    rc=$?
    t1=$(usec)
    for j in "${plain[@]}"; do wait_job "$j" 600 >/dev/null; done
    sleep 2 # the last epilog-complete messages
    rpcs=$(inbound_rpcs)
    pw=$( ((${#plain[@]})) && waits_of "${plain[@]}" | xargs)
    same=-
    if [[ $c != local && -d $HTC_CLUSTER_DIR/work/smk-local/out ]]; then
        diff -r -q "$HTC_CLUSTER_DIR/work/smk-local/out" "$w/out" >/dev/null && same=yes || same=NO
    fi
    res[$c]=$(awk -v a="$t0" -v b="$t1" -v r="$rpcs" -v rc="$rc" -v pw="${pw:--}" -v s="$same" \
        'BEGIN { printf "%.1f\t%d\t%s\t%s\t%d", (b - a) / 1e6, r, pw, s, rc }')
    printf '%-12s makespan %6.1f s  rpcs %6d  plain waits (s): %-8s  outputs as local: %s  rc=%d\n' "$c" \
        $(cut -f1,2 <<<"${res[$c]}") "${pw:--}" "$same" "$rc"
    [[ $rc == 0 ]] || tail -n 15 "$w/snakemake.log"
done

echo
echo "| contender | makespan s | vs local | controller RPCs | plain jobs' wait s | outputs = local's | rc |"
echo "|---|--:|--:|--:|---|---|--:|"
base=$(cut -f1 <<<"${res[local]:-}")
for c in $CONTENDERS; do
    IFS=$'\t' read -r m r pw s rc <<<"${res[$c]}"
    printf '| %s | %.1f | %s | %d | %s | %s | %d |\n' "$c" "$m" \
        "$([[ -n $base ]] && awk -v m="$m" -v b="$base" 'BEGIN { printf "%.2fx", m / b }' || echo -)" "$r" "$pw" "$s" "$rc"
done
"$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
[[ -z ${VENV_MADE:-} ]] || rm -rf "$VENV"
echo "report: $out"
