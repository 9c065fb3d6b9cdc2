#!/usr/bin/env bash
# The packages, as an admin gets them: builds the .deb and the RPM (offline, from the source
# tarball with vendored crates), checks their file lists and metadata, removes what `make install`
# put on this machine, installs the .deb, reads its man pages, runs `sbatch --htc` on the test
# cluster with the installed files only, shows that a running job survives an upgrade and a
# removal of the package, and purges it at the end so later tests start clean.
#
#   tests/slurm/packages.sh          (as root, on Debian, with rpm, dpkg-dev and man-db)
set -uo pipefail

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
export HTC_CLUSTER_DIR=${HTC_CLUSTER_DIR:-/var/lib/slurm-htc-test}
# shellcheck source=/dev/null
. "$root/tests/cluster/lib.sh"

finish() {
    echo "$passed passed, $failed failed"
    [[ $failed == 0 ]]
    exit
}

[[ $EUID == 0 ]] || { echo "packages.sh: needs root (dpkg -i, the test cluster)"; exit 1; }
for t in rpmbuild rpm rpm2archive dpkg-deb dpkg-shlibdeps dpkg-architecture strip man; do
    command -v "$t" >/dev/null || { echo "packages.sh: $t missing (bash .ci/run installs it)"; exit 1; }
done

out=$(mktemp -d)
trap 'rm -rf -- "$out"' EXIT
pkgs=$root/target/packages-test
rm -rf -- "$pkgs"

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
slurm=$("$root/packaging/slurm-version.sh")
IFS=. read -r smaj smin _ <<<"$slurm"
slurm_mm=$(printf '%d.%02d' "$smaj" $((10#$smin)))
slurm_next=$(printf '%d.%02d' "$smaj" $((10#$smin + 1)))
arch=$(dpkg --print-architecture)
plugindir=/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/slurm-wlm
conf=/etc/slurm/plugstack.conf.d/htc.conf
deb1=$pkgs/slurm-htc_${version}-1_$arch.deb
deb2=$pkgs/slurm-htc_${version}-2_$arch.deb

# A package left by an earlier, interrupted run would be deleted file by file by `make uninstall`.
dpkg -P slurm-htc >/dev/null 2>&1

echo "== build"
# The .deb packs the tests' release build (`make deb` packs the dist one, with LTO): its files and
# metadata are the same. The RPM below is built as shipped.
make -s -C "$root" deb PROFILE="${HTC_PROFILE:-release}" PKG_OUT="$pkgs" DEB_REVISION=1 >/dev/null
check "the .deb builds ($deb1)" test -s "$deb1"
make -s -C "$root" deb PROFILE="${HTC_PROFILE:-release}" PKG_OUT="$pkgs" DEB_REVISION=2 >/dev/null
check "a second .deb with a higher version builds" test -s "$deb2"
if [[ -n ${HTC_RPM_BUILD:-} ]]; then
    # tests/run-all.sh started the RPM build beside the Slurm scenarios before this script (it
    # takes minutes of CPU that their waits leave idle): wait for it and take what it made.
    echo "(the RPM build started by run-all.sh beside the Slurm scenarios: waiting for it)"
    for _ in $(seq 3600); do [[ -e $HTC_RPM_BUILD/status ]] && break; sleep 1; done
    cat "$HTC_RPM_BUILD/out" >"$out/rpm.out" 2>/dev/null
    [[ $(cat "$HTC_RPM_BUILD/status" 2>/dev/null) == 0 ]] || cat "$out/rpm.out"
    cp -p "$HTC_RPM_BUILD"/pkgs/* "$pkgs/" 2>/dev/null
else
    make -s -C "$root" rpm PKG_OUT="$pkgs" >"$out/rpm.out" 2>&1 || cat "$out/rpm.out"
fi
rpmfile=$(ls "$pkgs"/slurm-htc-"$version"-1.*.rpm 2>/dev/null | grep -v '\.src\.rpm$' | head -n 1)
check "the RPM and the source RPM build" test -s "$rpmfile" -a -s "$pkgs/slurm-htc-$version-1.src.rpm"
check "the RPM was built without network, from vendored crates" \
    grep -q 'rpmbuild runs without network' "$pkgs/rpmbuild.log"
tar -tzf "$pkgs/slurm-htc-$version.tar.gz" >"$out/tarball" 2>/dev/null
check "the source tarball has the spec, vendor/ and the source replacement" bash -c \
    "grep -qx 'slurm-htc-$version/slurm-htc.spec' '$out/tarball' && grep -q '^slurm-htc-$version/vendor/clap-' '$out/tarball' && grep -qx 'slurm-htc-$version/.cargo/config.toml' '$out/tarball'"

echo "== .deb: files and metadata"
# Files only (directories are dpkg's business), as dpkg-deb -c names them.
cat >"$out/deb.expected" <<EOF
./etc/slurm/plugstack.conf.d/htc.conf
./usr/bin/htc
./usr/bin/htc-agent
./usr/bin/htc-call
.$plugindir/spank_htc.so
./usr/share/doc/slurm-htc/copyright
./usr/share/man/man1/htc.1.gz
./usr/share/man/man8/htc-agent.8.gz
./usr/share/man/man8/spank_htc.8.gz
EOF
dpkg-deb -c "$deb1" | awk '$1 !~ /^d/ { print $6 }' | sort >"$out/deb.files"
check "dpkg-deb -c: exactly the expected files" diff -u "$out/deb.expected" "$out/deb.files"
check "the plugin is root:root 0644, the programs 0755" bash -c \
    "dpkg-deb -c '$deb1' | grep -q '^-rw-r--r-- root/root .* .$plugindir/spank_htc.so$' && [[ \$(dpkg-deb -c '$deb1' | grep -c '^-rwxr-xr-x root/root .* ./usr/bin/htc') == 3 ]]"
dpkg-deb -f "$deb1" Depends Description >"$out/deb.meta"
check "Depends pins Slurm $slurm_mm (>= $slurm_mm, << $slurm_next)" grep -qF \
    "slurm-wlm-basic-plugins (>= $slurm_mm), slurm-wlm-basic-plugins (<< $slurm_next)" "$out/deb.meta"
check "the description names the Slurm it was built against ($slurm)" grep -qF "Built against Slurm $slurm" "$out/deb.meta"
check "htc.conf is a conffile" test "$(dpkg-deb --info "$deb1" conffiles)" = "$conf"
dpkg-deb --fsys-tarfile "$deb1" | tar -xOf - ".$conf" >"$out/deb.conf"
check "htc.conf: one optional line for the installed plugin and agent" test \
    "$(grep -v '^#' "$out/deb.conf")" = "optional $plugindir/spank_htc.so agent=/usr/bin/htc-agent"
check "htc.conf documents the plugin arguments" bash -c \
    "for a in agent= fanout= ledger_dir= disabled; do grep -q \"^#.*\$a\" '$out/deb.conf' || exit 1; done"
# The package for another release (Debian 13's 24.11, its plugin built against that root's
# headers by release-plugin.sh) says so, and this machine's Slurm keeps it out.
other_root=$("$root/tests/cluster/release-root.sh" trixie 2>"$out/other-root.log")
other_so=$("$root/tests/cluster/release-plugin.sh" --path "$other_root")
[[ -r $other_so ]] || "$root/tests/cluster/release-plugin.sh" "$other_root" >>"$out/other-root.log" 2>&1
other=$("$root/packaging/slurm-version.sh" "$other_root/usr/include")
IFS=. read -r omaj omin _ <<<"$other"
other_mm=$(printf '%d.%02d' "$omaj" "$((10#$omin))")
mkdir -p "$out/other-bin" "$out/other-pkg"
cp "$root/target/${HTC_PROFILE:-release}"/{htc,htc-agent,htc-call} "$out/other-bin/"
cp "$other_so" "$out/other-bin/libspank_htc.so" 2>/dev/null
BIN_DIR=$out/other-bin MAN_DIR=$root/target/man OUT_DIR=$out/other-pkg SLURM_INCLUDE_DIR=$other_root/usr/include \
    "$root/packaging/build-deb.sh" >"$out/other-deb.out" 2>&1
other_deb=$(tail -n 1 "$out/other-deb.out")
check "a .deb for Slurm $other builds ($other_deb)" test -s "$other_deb"
check "its Depends pins Slurm $other_mm" bash -c \
    "dpkg-deb -f '$other_deb' Depends | grep -qF 'slurm-wlm-basic-plugins (>= $other_mm)'"
DEBIAN_FRONTEND=noninteractive apt-get install -s -q "$other_deb" >"$out/other-apt.out" 2>&1 </dev/null
check "apt refuses it beside Slurm $slurm: unmet dependency ($(grep -m1 -o 'Depends: slurm-wlm-basic-plugins[^,]*' "$out/other-apt.out"))" \
    grep -q "Depends: slurm-wlm-basic-plugins (>= $other_mm)" "$out/other-apt.out"
DEBIAN_FRONTEND=noninteractive dpkg -i "$other_deb" >"$out/other-dpkg.out" 2>&1 </dev/null
check "dpkg -i refuses to configure it (exit $?: $(grep -m1 -o 'depends on slurm-wlm-basic-plugins[^;]*' "$out/other-dpkg.out"))" \
    bash -c "grep -q 'dependency problems' '$out/other-dpkg.out' && ! dpkg-query -W -f='\${db:Status-Status}' slurm-htc 2>/dev/null | grep -qx installed"
DEBIAN_FRONTEND=noninteractive dpkg -P slurm-htc >/dev/null 2>&1 </dev/null

mkdir -p "$out/ctrl"
dpkg-deb -e "$deb1" "$out/ctrl"
check "the maintainer scripts (preinst, postrm) start, stop or signal nothing" bash -c \
    "test \"\$(ls '$out/ctrl' | grep -E 'inst|rm' | tr '\n' ' ')\" = 'postrm preinst ' && ! sed 's/#.*//' '$out'/ctrl/p* | grep -E 'kill|systemctl|service|invoke-rc|start-stop|restart|reload|scontrol|slurmctld|slurmd'"

echo "== RPM: files and metadata"
cat >"$out/rpm.expected" <<EOF
/etc/slurm/plugstack.conf.d
$conf
/usr/bin/htc
/usr/bin/htc-agent
/usr/bin/htc-call
/usr/lib64/slurm/spank_htc.so
/usr/share/doc/slurm-htc*/README.md
/usr/share/man/man1/htc.1*
/usr/share/man/man8/htc-agent.8*
/usr/share/man/man8/spank_htc.8*
EOF
# rpm adds build-id links (/usr/lib/.build-id/…) of every ELF file, as on any RHEL package; the
# doc directory is versioned on some distributions, and man pages are compressed on others.
rpm -qlp "$rpmfile" 2>/dev/null | grep -v '^/usr/lib/\.build-id' |
    sed -E -e 's|^/usr/share/doc/slurm-htc[^/]*|/usr/share/doc/slurm-htc*|' -e 's/\.(gz|bz2|xz|zst)$//' \
        -e 's|^(/usr/share/man/.*\.[18])$|\1*|' | grep -vx '/usr/share/doc/slurm-htc\*' | sort >"$out/rpm.files"
check "rpm -qlp: exactly the expected files" diff -u <(sort "$out/rpm.expected") "$out/rpm.files"
rpm -qp --requires "$rpmfile" >"$out/rpm.requires" 2>/dev/null
check "Requires pins Slurm $slurm_mm (slurm(arch) >= $slurm_mm, slurm < $slurm_next)" bash -c \
    "grep -qE '^slurm\\([^)]*\\) >= $slurm_mm\$' '$out/rpm.requires' && grep -qx 'slurm < $slurm_next' '$out/rpm.requires'"
check "the RPM's description names Slurm $slurm" bash -c \
    "rpm -qp --qf '%{DESCRIPTION}' '$rpmfile' 2>/dev/null | grep -qF 'Built against Slurm $slurm'"
check "htc.conf is %config(noreplace)" bash -c \
    "[[ \$(rpm -qp --configfiles '$rpmfile' 2>/dev/null) == '$conf' ]] && rpm -qp --qf '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' '$rpmfile' 2>/dev/null | grep -qx 'cn $conf'"
check "the RPM has no scriptlets" test -z "$(rpm -qp --scripts "$rpmfile" 2>/dev/null)"
rpm2archive - <"$rpmfile" | tar -xzOf - ".$conf" >"$out/rpm.conf" 2>/dev/null
check "the RPM's htc.conf names /usr/lib64/slurm/spank_htc.so" test \
    "$(grep -v '^#' "$out/rpm.conf")" = "optional /usr/lib64/slurm/spank_htc.so agent=/usr/bin/htc-agent"

echo "== the RPM's binaries (the dist build with LTO, as shipped) run a run"
# The tests above and before drive the release build (no LTO); these are what admins install.
rpmbin=$out/rpm-root
mkdir -p "$rpmbin"
rpm2archive - <"$rpmfile" | tar -xzf - -C "$rpmbin" ./usr/bin/htc ./usr/bin/htc-agent
{ seq 1 3000 | sed 's/.*/true/'; echo 'exit 3'; } >"$rpmbin/tasks.txt"
(cd "$rpmbin" && HTC_SITE_CONFIG=/dev/null ./usr/bin/htc run tasks.txt -q) >"$out/rpm-run.out" 2>&1
check "the RPM's htc runs 3001 tasks with its htc-agent, one failing (exit 1)" test $? = 1
(cd "$rpmbin" && ./usr/bin/htc status --json) >"$out/rpm-status.json" 2>&1
check "the RPM's htc status: 3000 done, 1 failed" bash -c \
    "grep -q '\"done\":3000' '$out/rpm-status.json' && grep -q '\"failed\":1' '$out/rpm-status.json'"

echo "== install the .deb (after removing what make install put here)"
make -s -C "$root" uninstall >/dev/null
check "no make-install leftovers in /usr/local" bash -c \
    "! ls /usr/local/bin/htc /usr/local/bin/htc-agent /usr/local/share/man/man1/htc.1 '$plugindir/spank_htc.so' '$conf' 2>/dev/null | grep -q ."
# Debian's minimal (docker) images drop man pages with a dpkg path-exclude; then `man htc` can never
# work after installing a package, so say so instead of failing obscurely.
if grep -rsqE '^path-exclude[= ]+/usr/share/man' /etc/dpkg/dpkg.cfg.d/; then
    bad "dpkg excludes /usr/share/man ($(grep -rlE '^path-exclude[= ]+/usr/share/man' /etc/dpkg/dpkg.cfg.d/)); bash .ci/run lifts that"
fi
if DEBIAN_FRONTEND=noninteractive dpkg -i "$deb1" >"$out/dpkg.out" 2>&1 </dev/null; then ok "dpkg -i $(basename "$deb1")"; else bad "dpkg -i: $(cat "$out/dpkg.out")"; finish; fi
check "htc and htc-agent on PATH are the package's" test "$(command -v htc) $(command -v htc-agent)" = "/usr/bin/htc /usr/bin/htc-agent"
check "htc --version runs" bash -c "htc --version | grep -qF '$version'"

echo "== man pages"
for page in "1 htc" "8 htc-agent" "8 spank_htc"; do
    read -r sec name <<<"$page"
    check "man -w $sec $name is the package's" test "$(man -w "$sec" "$name" 2>/dev/null)" = "/usr/share/man/man$sec/$name.$sec.gz"
    MANWIDTH=100 man -P cat "$sec" "$name" >"$out/man.$name" 2>"$out/man.$name.err"
    check "man $sec $name renders (NAME, SYNOPSIS, no warnings)" bash -c \
        "grep -q '^NAME' '$out/man.$name' && grep -q '^SYNOPSIS' '$out/man.$name' && ! grep -q . '$out/man.$name.err'"
done
check "man htc documents every subcommand" bash -c \
    "for s in run prepare submit check status output; do grep -q \"^   htc \$s\$\" '$out/man.htc' || exit 1; done"
check "man htc-agent documents lead's --script" grep -q -- '--script SCRIPT' "$out/man.htc-agent"
check "man spank_htc documents the plugstack arguments" bash -c \
    "for a in agent=PATH fanout=K ledger_dir=DIR disabled; do grep -q \"^       \$a\" '$out/man.spank_htc' || exit 1; done"

echo "== sbatch --htc with the installed files only"
"$root/tests/cluster/start-cluster.sh" -n 2 -c 2 >/dev/null || { bad "cluster did not start"; finish; }
cluster_env
cluster_plugin_clear
# What Debian's /etc/slurm/plugstack.conf says; the test cluster has a plugstack of its own.
cluster_plugin_add packages "include /etc/slurm/plugstack.conf.d/*.conf"
# slurmd reads plugstack only when it starts.
"$root/tests/cluster/start-cluster.sh" -n 2 -c 2 >/dev/null || { bad "cluster did not restart"; finish; }
cluster_env
as_user sbatch --help >"$out/help" 2>&1
check "sbatch --help lists --htc from the installed plugin" grep -q -- '--htc=' "$out/help"

submit() { # DIR ARGS... -> job id
    local dir=$1 o
    shift
    o=$(as_user -C "$dir" sbatch --parsable "$@" 2>&1) || { echo "$o" >&2; return 1; }
    echo "$o" | tail -n 1 | cut -d';' -f1
}
each_once() { # FILE N: ids 1..N, each exactly once
    [[ $(cut -d' ' -f1 "$1" | sort -n | uniq | tr '\n' ' ') == "$(seq -s ' ' 1 "$2") " && $(wc -l <"$1") == "$2" ]]
}

n=200
w=$(cluster_workdir pkg-e2e)
# The task's parent is the agent that runs it.
seq 1 "$n" | sed 's|.*|echo "$HTC_TASK_ID $(readlink /proc/$PPID/exe) $SLURMD_NODENAME" >> ids.txt|' >"$w/tasks.txt"
chown -R "$HTC_CLUSTER_USER" "$w"
if j=$(submit "$w" -N 2 --exclusive --htc=tasks.txt --wrap=:); then
    state=$(wait_job "$j" 300)
    check "job $j COMPLETED (was $state), exit code 0" test "$state" = COMPLETED -a "$(job_exit_code "$j")" = 0
    check "all $n tasks ran exactly once" each_once "$w/ids.txt" "$n"
    check "every task was run by /usr/bin/htc-agent" test "$(cut -d' ' -f2 "$w/ids.txt" | sort -u)" = /usr/bin/htc-agent
    check "tasks ran on both nodes" test "$(cut -d' ' -f3 "$w/ids.txt" | sort -u | wc -l)" = 2
    check "summary in the job output" grep -q "$n tasks: $n done, 0 failed" "$w/slurm-$j.out"
else
    bad "sbatch --htc was refused"
fi

echo "== a running job survives an upgrade and a removal"
n=60
w=$(cluster_workdir pkg-upgrade)
seq 1 "$n" | sed 's|.*|sleep 1; echo "$HTC_TASK_ID" >> ids.txt|' >"$w/tasks.txt"
chown -R "$HTC_CLUSTER_USER" "$w"
printf '# edited by tests/slurm/packages.sh\n' >>"$conf"
lines() { wc -l <"$w/ids.txt" 2>/dev/null || echo 0; }
wait_lines() { # N: until ids.txt has at least N lines (30 s at most)
    local i
    for ((i = 0; i < 300; i++)); do (($(lines) >= $1)) && return 0; sleep 0.1; done
    return 1
}
if j=$(submit "$w" -N 2 --exclusive --htc=tasks.txt --wrap=:); then
    check "job $j is running tasks" wait_lines 4
    DEBIAN_FRONTEND=noninteractive dpkg -i "$deb2" >"$out/dpkg2.out" 2>&1 </dev/null
    check "dpkg -i of ${version}-2 over ${version}-1 (rc $?)" test "$(dpkg-query -W -f '${Version}' slurm-htc)" = "$version-2"
    check "the admin's edit of htc.conf survived the upgrade" grep -q 'edited by tests/slurm/packages.sh' "$conf"
    check "job $j still running after the upgrade" test "$(job_state "$j")" = RUNNING
    at_upgrade=$(lines)
    wait_lines $((at_upgrade + 4)) && ok "tasks keep finishing after the upgrade ($at_upgrade -> $(lines))" ||
        bad "no progress after the upgrade"
    DEBIAN_FRONTEND=noninteractive dpkg -r slurm-htc >"$out/dpkg-r.out" 2>&1 </dev/null
    check "dpkg -r slurm-htc (rc $?): agent and plugin gone" test ! -e /usr/bin/htc-agent -a ! -e "$plugindir/spank_htc.so"
    check "job $j still running after the removal" test "$(job_state "$j")" = RUNNING
    at_removal=$(lines)
    state=$(wait_job "$j" 300)
    check "job $j COMPLETED after upgrade and removal (was $state), exit code 0" test "$state" = COMPLETED -a "$(job_exit_code "$j")" = 0
    check "all $n tasks ran exactly once ($((n - at_removal)) of them after the removal)" each_once "$w/ids.txt" "$n"
    check "some tasks ran after the removal" test "$at_removal" -lt "$n"
else
    bad "sbatch --htc was refused"
fi

echo "== after removal"
check "the plugstack line is set aside (htc.conf.removed keeps the admin's edit)" bash -c \
    "test ! -e '$conf' && grep -q 'edited by tests/slurm/packages.sh' '$conf.removed'"
# With the line left in place Slurm would print dlopen errors on every sbatch, srun and step.
w=$(cluster_workdir pkg-removed)
as_user -C "$w" srun -N1 true >"$out/srun.out" 2>&1
check "srun after removal: rc 0 and not a word about the plugin" bash -c "[[ $? == 0 ]] && ! grep -q . '$out/srun.out'"
as_user -C "$w" sbatch --wrap=: >"$out/sbatch.out" 2>&1
check "sbatch after removal: no error about the plugin" bash -c "! grep -qi 'spank\\|error' '$out/sbatch.out'"
DEBIAN_FRONTEND=noninteractive dpkg -i "$deb2" >"$out/dpkg3.out" 2>&1 </dev/null
check "a reinstall takes the set-aside htc.conf back, with the admin's edit" bash -c \
    "grep -q 'edited by tests/slurm/packages.sh' '$conf' && test ! -e '$conf.removed'"
as_user sbatch --help >"$out/help2" 2>&1
check "after the reinstall sbatch --help lists --htc again" grep -q -- '--htc=' "$out/help2"

echo "== purge"
DEBIAN_FRONTEND=noninteractive dpkg -P slurm-htc >"$out/dpkg-p.out" 2>&1 </dev/null
# `if`, not `! ... ;`: a negated pipeline that is not the last command decides nothing.
check "dpkg -P removes everything, the plugstack line too" bash -c \
    "if dpkg-query -W slurm-htc 2>/dev/null | grep -q .; then exit 1; fi; for f in /usr/bin/htc /usr/bin/htc-agent '$plugindir/spank_htc.so' '$conf' '$conf.removed' /usr/share/man/man1/htc.1.gz; do test ! -e \"\$f\" || exit 1; done"
cluster_plugin_clear

[[ $failed == 0 ]] || cluster_logs 20
finish
