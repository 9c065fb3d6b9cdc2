#!/usr/bin/env bash
# A root of its own holding another Slurm release, for a test cluster of that release (issue 53):
# Debian 13 ("trixie") ships Slurm 24.11, beside the host's Debian 12 and its 22.05. Made with
# debootstrap from the Debian package registry (about a minute and 300 MB here) and kept: a root
# that was made whole is used again; one cut short is made afresh. Prints the root's path and,
# on stderr, the Slurm release it holds.
#
#   release-root.sh [SUITE]          (as root; SUITE: trixie)
#
# Environment (all optional):
#   HTC_RELEASE_ROOTS   where roots are kept, default /var/cache/slurm-htc
#   HTC_DEBIAN_MIRROR   the package registry, default the host's (its apt sources), else
#                       http://deb.debian.org/debian
#
# The daemons run chrooted in it (`mount -t proc`, `--rbind /sys` and `/dev` first; see
# ../shared/slurm-findings.md §7); binaries built on the host run there unchanged, and the plugin
# is built against its headers: SLURM_INCLUDE_DIR=ROOT/usr/include.
set -euo pipefail

suite=${1:-trixie}
case $suite in
    trixie) ;;
    *) echo "release-root.sh: no Slurm release is known for suite '$suite' (trixie: 24.11)" >&2; exit 2 ;;
esac
[[ $(id -u) == 0 ]] || { echo "release-root.sh: debootstrap and chroot need root" >&2; exit 2; }

roots=${HTC_RELEASE_ROOTS:-/var/cache/slurm-htc}
dir=$roots/$suite
# Written last: a root without it was cut short (a full disk, a lost mirror, a stopped run).
stamp=$dir/.htc-release-root
# The packages the cluster's daemons (slurmdbd too: accounting), the plugin's build and the
# user's Python (the Snakemake tests make their venv there) need, and no more. The database
# server is the host's: one MariaDB serves both releases' slurmdbd.
include=slurm-wlm,slurmctld,slurmd,slurm-client,slurmdbd,munge,libslurm-dev,python3,python3-venv
# A root made with another package list is made afresh.
made_with=$dir/.htc-release-include

mirror() {
    if [[ -n ${HTC_DEBIAN_MIRROR:-} ]]; then
        echo "$HTC_DEBIAN_MIRROR"
        return
    fi
    local m
    m=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)\/\{0,1\}$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
    echo "${m:-http://deb.debian.org/debian}"
}

# A root in use by a cluster is not made afresh under it: its view (tests/cluster/root-view.sh)
# would show a half-made tree.
if [[ -f $stamp && $(cat "$made_with" 2>/dev/null) != "$include" ]] && grep -q "/run/slurm-htc-view/" /proc/self/mountinfo; then
    echo "release-root.sh: $dir must be made afresh, but a test cluster uses it: stop it first (stop-cluster.sh)" >&2
    exit 1
fi
if [[ ! -f $stamp || $(cat "$made_with" 2>/dev/null) != "$include" ]]; then
    if ! command -v debootstrap >/dev/null; then
        echo "release-root.sh: installing debootstrap" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null
    fi
    mkdir -p "$roots"
    rm -rf -- "$dir.new"
    echo "release-root.sh: making $dir from $(mirror) (about a minute)" >&2
    if ! debootstrap --variant=minbase --include="$include" \
        "$suite" "$dir.new" "$(mirror)" >"$roots/$suite.log" 2>&1; then
        echo "release-root.sh: debootstrap failed; the last of $roots/$suite.log:" >&2
        tail -n 5 "$roots/$suite.log" >&2
        exit 1
    fi
    rm -rf -- "$dir"
    mv -- "$dir.new" "$dir"
    echo "$include" >"$made_with"
    chroot "$dir" dpkg-query -W -f='${Version}\n' slurm-wlm >"$stamp"
fi
echo "release-root.sh: $dir holds Slurm $(cat "$stamp")" >&2
echo "$dir"
