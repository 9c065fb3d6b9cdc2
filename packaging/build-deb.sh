#!/usr/bin/env bash
# Builds the .deb of slurm-htc from an already built tree (`make deb` builds it first):
# stages the files in a temporary root and packs it with dpkg-deb. No debhelper, no cargo-deb.
#
#   packaging/build-deb.sh
#
# Environment (the Makefile sets them):
#   BIN_DIR       cargo's output directory with htc, htc-agent, htc-call, libspank_htc.so (target/dist)
#   MAN_DIR       the generated man pages (target/man, from `make man`)
#   OUT_DIR       where the .deb goes (target/packages)
#   DEB_REVISION  Debian revision, default 1 (a rebuild of the same version gets a higher one)
#   DEB_MAINTAINER  the Maintainer field
#   SLURM_INCLUDE_DIR  where slurm/slurm_version.h is, default /usr/include
# Prints the path of the .deb.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
root=$(cd -- "$here/.." && pwd)
BIN_DIR=${BIN_DIR:-$root/target/dist}
MAN_DIR=${MAN_DIR:-$root/target/man}
OUT_DIR=${OUT_DIR:-$root/target/packages}
DEB_REVISION=${DEB_REVISION:-1}
DEB_MAINTAINER=${DEB_MAINTAINER:-slurm-htc packagers <root@localhost>}

die() { printf 'build-deb: %s\n' "$*" >&2; exit 1; }
for f in htc htc-agent htc-call libspank_htc.so; do [[ -f $BIN_DIR/$f ]] || die "$BIN_DIR/$f missing (make all)"; done
for f in htc.1 htc-agent.8 spank_htc.8; do [[ -f $MAN_DIR/$f ]] || die "$MAN_DIR/$f missing (make man)"; done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[[ -n $version ]] || die "no version in Cargo.toml's [workspace.package]"
slurm=$("$here/slurm-version.sh")
IFS=. read -r smaj smin _ <<<"$slurm"
smin=$((10#$smin))
slurm_mm=$(printf '%d.%02d' "$smaj" "$smin")
slurm_next=$(printf '%d.%02d' "$smaj" $((smin + 1)))
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
plugindir=/usr/lib/$multiarch/slurm-wlm

stage=$(mktemp -d)
trap 'rm -rf -- "$stage"' EXIT
pkg=$stage/root
umask 022
install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg$plugindir" "$pkg/etc/slurm/plugstack.conf.d" \
    "$pkg/usr/share/man/man1" "$pkg/usr/share/man/man8" "$pkg/usr/share/doc/slurm-htc"

# Stripped as dh_strip would: the release profile keeps line tables for backtraces in dev builds.
install -m 0755 "$BIN_DIR/htc" "$BIN_DIR/htc-agent" "$BIN_DIR/htc-call" "$pkg/usr/bin/"
strip --remove-section=.comment --remove-section=.note "$pkg/usr/bin/htc" "$pkg/usr/bin/htc-agent" "$pkg/usr/bin/htc-call"
install -m 0644 "$BIN_DIR/libspank_htc.so" "$pkg$plugindir/spank_htc.so"
strip --remove-section=.comment --remove-section=.note --strip-unneeded "$pkg$plugindir/spank_htc.so"

sed -e "s|@PLUGINDIR@|$plugindir|g" -e 's|@BINDIR@|/usr/bin|g' -e 's|@PLUGIN_ARGS@||g' \
    "$here/htc.conf.in" >"$pkg/etc/slurm/plugstack.conf.d/htc.conf"
chmod 0644 "$pkg/etc/slurm/plugstack.conf.d/htc.conf"

gzip -9n <"$MAN_DIR/htc.1" >"$pkg/usr/share/man/man1/htc.1.gz"
gzip -9n <"$MAN_DIR/htc-agent.8" >"$pkg/usr/share/man/man8/htc-agent.8.gz"
gzip -9n <"$MAN_DIR/spank_htc.8" >"$pkg/usr/share/man/man8/spank_htc.8.gz"
install -m 0644 "$here/debian/copyright" "$pkg/usr/share/doc/slurm-htc/copyright"

install -m 0755 "$here/debian/preinst" "$here/debian/postrm" "$pkg/DEBIAN/"
printf '/etc/slurm/plugstack.conf.d/htc.conf\n' >"$pkg/DEBIAN/conffiles"

# Shared-library dependencies (libc, libgcc) the way dh_shlibdeps finds them; dpkg-shlibdeps
# wants a debian/control in its working directory.
mkdir -p "$stage/src/debian"
printf 'Source: slurm-htc\n\nPackage: slurm-htc\nArchitecture: any\n' >"$stage/src/debian/control"
shlibs=$(cd "$stage/src" && dpkg-shlibdeps -O -e"$pkg/usr/bin/htc" -e"$pkg/usr/bin/htc-agent" -e"$pkg/usr/bin/htc-call" \
    -e"$pkg$plugindir/spank_htc.so" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[[ -n $shlibs ]] || die "dpkg-shlibdeps found no dependencies"

size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<EOF
Package: slurm-htc
Version: $version-$DEB_REVISION
Architecture: $arch
Maintainer: $DEB_MAINTAINER
Installed-Size: $size
Depends: $shlibs, slurm-wlm-basic-plugins (>= $slurm_mm), slurm-wlm-basic-plugins (<< $slurm_next)
Section: admin
Priority: optional
Description: many small tasks in one Slurm allocation (sbatch --htc), for Slurm $slurm_mm
 slurm-htc makes Slurm allocate once and runs millions of small tasks inside
 that allocation with its own agents, keeping every task's state in a ledger so
 that nothing done is lost and nothing done runs twice.
 .
 This package has the SPANK plugin spank_htc.so (sbatch --htc=FILE), its
 plugstack.conf.d line, the agent htc-agent and the user command htc.
 .
 Built against Slurm $slurm: the plugin works with Slurm $slurm_mm.x only (loaded
 by another release it stays inert and refuses --htc, saying why).
EOF
(cd "$pkg" && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' -printf '%P\0' | sort -z |
    xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"
chmod 0644 "$pkg/DEBIAN/control" "$pkg/DEBIAN/conffiles" "$pkg/DEBIAN/md5sums"

mkdir -p "$OUT_DIR"
deb=$OUT_DIR/slurm-htc_${version}-${DEB_REVISION}_$arch.deb
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$deb" >/dev/null
printf '%s\n' "$deb"
