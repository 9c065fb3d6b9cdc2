#!/usr/bin/env bash
# A Python venv for the users of a release root's test cluster, made with that root's Python (a
# venv is bound to the Python that made it, and jobs in the root run the root's): the packages of
# tests/py-pins.txt, then any pip arguments given (e.g. the clients, ./clients/python).
#
#   release-venv.sh ROOT DIR [PIP-ARGS...]     (as root)
#
# DIR must be under /tmp, which the cluster's view of the root shares (root-view.sh). The root
# itself is not changed: /dev, /proc, DIR, the checkout and the host's certificates (pip then
# trusts what the host's pip trusts) are mounted into it only in a mount namespace of this
# script's own, gone when it ends.
set -euo pipefail

repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
(($# >= 2)) || { sed -n '6p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2; }
root=$1 dir=$2
shift 2
[[ -f $root/.htc-release-root ]] || { echo "release-venv.sh: $root is not a release root (release-root.sh)" >&2; exit 2; }
[[ $dir == /tmp/?* ]] || { echo "release-venv.sh: $dir is not under /tmp" >&2; exit 2; }
mkdir -p -- "$dir"
pins=()
while read -r line; do
    [[ -z $line || $line == \#* ]] || pins+=("$line")
done <"$repo/tests/py-pins.txt"
# shellcheck disable=SC2016 # expanded by the inner bash
exec unshare --mount --propagation private bash -c '
    set -e
    root=$1 dir=$2 repo=$3
    shift 3
    mount --rbind /dev "$root/dev"
    mount -t proc proc "$root/proc"
    for p in "$dir" "$repo"; do mkdir -p "$root$p"; mount --bind "$p" "$root$p"; done
    mount -o bind,ro /etc/ssl/certs "$root/etc/ssl/certs"
    exec chroot "$root" /bin/sh -c '"'"'[ -d "${PIP_FIND_LINKS:-/}" ] || unset PIP_FIND_LINKS; cd "$1" && shift && python3 -m venv "$1" && d=$1 && shift &&
        "$d/bin/pip" install -q --disable-pip-version-check "$@"'"'"' sh "$repo" "$dir" "$@"
' _ "$root" "$dir" "$repo" "${pins[@]}" "$@"
