#!/usr/bin/env bash
# The Slurm headers of a Debian suite's libslurm-dev, unpacked from the Debian package registry
# into /var/cache/slurm-htc/headers-SUITE (kept: made again only when missing), for building the
# plugin against a release newer than any root the tests run (today sid's 26.05: the plugin's
# use of what 25.05 added is checked against them). Prints the directory, which holds
# usr/include/slurm/ as a release root does (release-plugin.sh takes it as ROOT).
#
#   release-headers.sh SUITE        e.g. sid
set -euo pipefail

(($# == 1)) || { sed -n '8p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2; }
suite=$1
[[ $suite =~ ^[a-z]+$ ]] || { echo "release-headers.sh: '$suite' is not a suite name" >&2; exit 2; }
dir=/var/cache/slurm-htc/headers-$suite
if [[ -s $dir/.htc-headers && -r $dir/usr/include/slurm/spank.h ]]; then
    echo "$dir"
    exit 0
fi
# The machine's own Debian mirror (where debootstrap and apt go too).
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
mirror=${mirror:-http://deb.debian.org/debian}
arch=$(dpkg --print-architecture)
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
curl -fsS --retry 3 -o "$tmp/Packages.xz" "$mirror/dists/$suite/main/binary-$arch/Packages.xz"
deb=$(xz -dc "$tmp/Packages.xz" | awk '/^Package: libslurm-dev$/ { p = 1 } p && !found && /^Filename:/ { print $2; found = 1 } /^$/ { p = 0 }')
[[ -n $deb ]] || { echo "release-headers.sh: no libslurm-dev in $suite" >&2; exit 1; }
curl -fsS --retry 3 -o "$tmp/libslurm-dev.deb" "$mirror/$deb"
rm -rf -- "$dir"
mkdir -p "$dir"
dpkg-deb -x "$tmp/libslurm-dev.deb" "$dir"
[[ -r $dir/usr/include/slurm/spank.h ]] || { echo "release-headers.sh: $deb has no slurm/spank.h" >&2; exit 1; }
echo "${deb##*/}" >"$dir/.htc-headers"
echo "$dir"
