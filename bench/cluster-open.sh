#!/usr/bin/env bash
# Issue 52's goals for open runs on the 4-node test cluster (network namespaces, 2 CPUs a node),
# one cluster of its own for the whole run: many clients at once, re-runs after a leader's
# SIGKILL, and bit flips under the task-state readers (bench/cluster_open.py says what each
# part does). Everything runs as the cluster's user on the login node, as a user runs it.
#
#   bench/cluster-open.sh                (as root, after cargo build --release --workspace)
#   PARTS="clients" N=2000 bench/cluster-open.sh
#
# Env: PARTS ("clients rerun flips"), N (10000), ROUNDS (3), M (50000), TRIES (10), FLIPS (100),
# HTC_PROFILE (release; dist for what ships).
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-bench}
export HTC_CLUSTER_CTLD_PORT=${HTC_CLUSTER_CTLD_PORT:-6827}
export HTC_CLUSTER_SLURMD_PORT=${HTC_CLUSTER_SLURMD_PORT:-17301}
# shellcheck source=/dev/null
. "$root/tests/cluster/lib.sh"

out=$root/bench/results/cluster-open-$(date -u +%Y%m%d-%H%M%S).txt
mkdir -p "$root/bench/results"
exec > >(tee "$out") 2>&1

"$root/tests/cluster/start-cluster.sh" -n 4 -m netns -c 2 >/dev/null || { echo "cluster did not start"; exit 1; }
cluster_env
install_htc
work=$(cluster_workdir cluster-open)
install -m 0644 "$root/bench/cluster_open.py" "$root/bench/gate.py" "$root/bench/journal.py" "$work/"

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$root" rev-parse --short HEAD)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "cluster: 4 nodes x 2 CPUs in network namespaces, Slurm $(sinfo -V 2>/dev/null | cut -d' ' -f2); build: ${HTC_PROFILE:-release}"
echo "clients: ${N:=10000} x ${ROUNDS:=3} rounds; re-runs: ${M:=50000} tasks x ${TRIES:=10} tries; flips: ${FLIPS:=100}"
ulimit -n "$(ulimit -Hn)"
# as_user clears the environment; the parts' settings go through env on its command line.
as_user -C "$work" env HTC="$HTC_CLUSTER_DIR/htc-bin/htc" WORK="$work" NODES=4 N="$N" ROUNDS="$ROUNDS" M="$M" \
    TRIES="$TRIES" FLIPS="$FLIPS" python3 -u "$work/cluster_open.py" ${PARTS:-clients rerun flips}
rc=$?
"$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1
echo "report: $out"
exit $rc
