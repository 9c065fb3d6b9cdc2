#!/usr/bin/env bash
# A root with Slurm 26.05 built from Slurm's public source repository, for bench/srun-async.sh:
# `srun --async` (steps queued by the job's step manager) is what admins will compare slurm-htc
# with, and no Debian release packages 26.05 yet. Made from the Debian 13 root of the test
# harness (tests/cluster/release-root.sh trixie) with Debian's build tools added, Slurm configured
# with Debian's paths (so that tests/cluster runs it as it runs a packaged release) and installed
# over the packaged 24.11. A benchmark's root, not a CI step.
#
#   bench/async-root.sh GITDIR [TAG]     (as root; GITDIR: a clone of github.com/SchedMD/slurm,
#                                         TAG default slurm-26-05-3-1) -> prints the root's path
#
# Takes ~15 min on 2 cores. Kept in $HTC_RELEASE_ROOTS (default /var/cache/slurm-htc) as
# slurm-TAG; made again only when missing.
set -euo pipefail

git_dir=${1:?usage: bench/async-root.sh GITDIR [TAG]}
tag=${2:-slurm-26-05-3-1}
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
roots=${HTC_RELEASE_ROOTS:-/var/cache/slurm-htc}
dir=$roots/$tag
[[ $(id -u) == 0 ]] || { echo "async-root.sh: chroot needs root" >&2; exit 2; }
if [[ -f $dir/.htc-release-root ]]; then
    echo "$dir"
    exit 0
fi
git -C "$git_dir" rev-parse --verify -q "$tag^{commit}" >/dev/null || { echo "async-root.sh: no $tag in $git_dir" >&2; exit 2; }
base=$("$here/../tests/cluster/release-root.sh" trixie)
log=$roots/$tag.log
echo "async-root.sh: making $dir from $base and $tag (log: $log)" >&2
rm -rf -- "$dir.new"
cp -a -- "$base" "$dir.new"
rm -f -- "$dir.new/.htc-release-root"
cp /etc/resolv.conf "$dir.new/etc/resolv.conf"
in_root() { chrt --idle 0 chroot "$dir.new" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive "$@"; }
mount -t proc proc "$dir.new/proc"
trap 'umount "$dir.new/proc" 2>/dev/null || true' EXIT
{
    in_root apt-get update -q
    # The build's own needs: a compiler, munge's and MariaDB's client headers (slurmdbd), pkg-config.
    in_root apt-get install -y -q --no-install-recommends build-essential libmunge-dev libmariadb-dev pkg-config
    git -C "$git_dir" archive --format=tar --prefix=slurm/ "$tag" | tar -x -C "$dir.new/usr/src"
    # Debian's layout, as the packaged release the harness runs: binaries in /usr, configuration
    # in /etc/slurm, plugins beside the libraries; and, as Debian builds it, several slurmd on one
    # machine (the harness's nodes share one munged, which refuses a credential decoded twice
    # unless Slurm allows that replay: a step's launch then fails on every node but the first).
    in_root sh -c 'cd /usr/src/slurm && ./configure --prefix=/usr --sysconfdir=/etc/slurm \
        --libdir=/usr/lib/x86_64-linux-gnu --localstatedir=/var --runstatedir=/run \
        --without-rpath --disable-static --enable-multiple-slurmd && make -j"$(nproc)" && make install && ldconfig'
    # The build tools go again: the root's /usr/include is then Slurm's headers only, as the
    # plugin is built against them (tests/cluster/release-plugin.sh) with the host's libc.
    in_root apt-get purge -y -q --auto-remove build-essential libc6-dev libmunge-dev libmariadb-dev pkg-config
} >"$log" 2>&1 || { tail -n 30 "$log" >&2; echo "async-root.sh: the build failed (log: $log)" >&2; exit 1; }
umount "$dir.new/proc"
trap - EXIT
rm -rf -- "$dir.new/usr/src/slurm"
in_root /usr/sbin/slurmctld -V | awk '{ print $2 }' >"$dir.new/.htc-release-root"
mv -- "$dir.new" "$dir"
echo "$dir"
