#!/usr/bin/env bash
# Builds the RPM of slurm-htc: a source tarball of this tree with every crate vendored
# (`cargo vendor`) and the spec inside, then `rpmbuild -ta`-style binary and source packages, built
# offline. Works on RPM distributions and on Debian (package `rpm`).
#
#   packaging/build-rpm.sh [--dist-only]
#
# Environment (the Makefile sets them):
#   OUT_DIR      where the tarball and the packages go (target/packages)
#   RPM_RELEASE  the Release, default 1
# Prints the paths of what it made. rpmbuild's log is kept in OUT_DIR/rpmbuild.log.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
root=$(cd -- "$here/.." && pwd)
OUT_DIR=${OUT_DIR:-$root/target/packages}
RPM_RELEASE=${RPM_RELEASE:-1}
dist_only=0
[[ ${1-} == --dist-only ]] && dist_only=1

die() { printf 'build-rpm: %s\n' "$*" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[[ -n $version ]] || die "no version in Cargo.toml's [workspace.package]"
name=slurm-htc-$version

mkdir -p "$OUT_DIR"
OUT_DIR=$(cd -- "$OUT_DIR" && pwd)
stage=$(mktemp -d)
trap 'rm -rf -- "$stage"' EXIT
src=$stage/$name
mkdir -p "$src/.cargo"

# The working tree as git sees it (tracked files and new ones not ignored), so what is packaged
# is what was tested, committed or not. fuzz/ is its own workspace and not part of the build.
(cd "$root" && git ls-files -z --cached --others --exclude-standard -- . ':!:fuzz' |
    while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
    tar --null -T - -cf -) | tar -xf - -C "$src"

# Every crate of Cargo.lock, for every platform (cargo vendor cannot filter); cargo prints the
# source replacement that makes the build use them.
if ! (cd "$src" && cargo vendor --locked --versioned-dirs vendor >.cargo/config.toml 2>"$stage/vendor.log"); then
    cat "$stage/vendor.log" >&2
    die "cargo vendor failed"
fi
grep -q 'directory = "vendor"' "$src/.cargo/config.toml" || die "cargo vendor printed no source replacement"

sed -e "s/@VERSION@/$version/g" -e "s/@RELEASE@/$RPM_RELEASE/g" "$here/slurm-htc.spec.in" >"$src/slurm-htc.spec"

tarball=$OUT_DIR/$name.tar.gz
# Reproducible: fixed order, owner and times.
mtime=$(cd "$root" && git log -1 --format=%ct 2>/dev/null || date +%s)
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" -cf - "$name" |
    gzip -9n >"$tarball"
printf '%s\n' "$tarball"
((dist_only)) && exit 0

top=$stage/rpmbuild
mkdir -p "$top"/{BUILD,RPMS,SOURCES,SPECS,SRPMS}
cp "$tarball" "$top/SOURCES/"
cp "$src/slurm-htc.spec" "$top/SPECS/"
nodeps=()
# On Debian the RPM database is empty: the BuildRequires are dpkg's business there.
rpm -q --quiet --whatprovides /bin/sh 2>/dev/null || nodeps=(--nodeps)
# Proof that the build is offline: where we may (root), rpmbuild runs in a network namespace of
# its own, which has no interface but a down loopback.
offline=()
if unshare --net true 2>/dev/null; then offline=(unshare --net --); fi
log=$OUT_DIR/rpmbuild.log
: >"$log"
if ((${#offline[@]})); then echo "build-rpm: rpmbuild runs without network (unshare --net)" >>"$log"; fi
if ! "${offline[@]}" rpmbuild -ba "${nodeps[@]}" --define "_topdir $top" "$top/SPECS/slurm-htc.spec" >>"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "rpmbuild failed (log: $log)"
fi
for f in "$top"/RPMS/*/*.rpm "$top"/SRPMS/*.rpm; do
    cp "$f" "$OUT_DIR/"
    printf '%s\n' "$OUT_DIR/${f##*/}"
done
