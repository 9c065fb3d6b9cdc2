#!/usr/bin/env bash
# spank_htc.so built for the Slurm release of a root made by release-root.sh, against that root's
# headers (SLURM_INCLUDE_DIR, as an admin builds for a Slurm of their own), kept as
# target/slurm-RELEASE/libspank_htc.so; prints its path.
#
#   release-plugin.sh ROOT           build it (a few seconds: only the plugin's crate is built
#                                    again), then build the host's plugin again in its place
#   release-plugin.sh --path ROOT    only print the path (fails if it was not built)
#
# Environment: HTC_PROFILE, the cargo profile (default release, as the tests install).
set -euo pipefail

repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
path_only=0
[[ ${1-} == --path ]] && { path_only=1; shift; }
(($# == 1)) || { sed -n '6,7p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2; }
root=$1
release=$("$repo/packaging/slurm-version.sh" "$root/usr/include" | cut -d. -f1,2) || exit 2
profile=${HTC_PROFILE:-release}
out=$repo/target/slurm-$release/$profile/libspank_htc.so
if ((path_only)); then
    [[ -r $out ]] || { echo "release-plugin.sh: $out is not built: tests/cluster/release-plugin.sh $root" >&2; exit 1; }
    echo "$out"
    exit 0
fi
cd "$repo"
# One target dir for both: the plugin's dependencies are the same, so only its own crate builds
# twice (build.rs reruns when SLURM_INCLUDE_DIR changes).
SLURM_INCLUDE_DIR=$root/usr/include cargo build --profile "$profile" --locked -q -p spank-plugin
install -D -m 0755 "target/$profile/libspank_htc.so" "$out"
cargo build --profile "$profile" --locked -q -p spank-plugin
echo "$out"
