#!/usr/bin/env bash
# The crates' layering, checked from Cargo's own dependency graph: each crate may depend only on
# the crates below it, and the pure ones (htc-core, htc-engine) on nothing that does I/O. Cargo
# already refuses cycles; this refuses a dependency that would make one possible or that would
# let I/O into the engine (say, tokio added to htc-engine "just for a channel"). Cargo does not
# refuse a cycle between the modules of one crate; tests/modcycles.py, run at the end, does, and
# tests/structure.py holds the shape of the busiest parts (impls, sizes, long functions).
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0
# crate: the workspace crates it may use (normal dependencies, directly or not).
declare -A may=(
    [htc-core]=""
    [htc-engine]="htc-core"
    [htc-host]=""
    [htc-store]="htc-core htc-host"
    [htc-exec]="htc-core htc-host"
    [htc-node]="htc-core htc-engine htc-host htc-store htc-exec"
)
ours="htc-core htc-engine htc-host htc-store htc-exec htc-node node-agent spank-plugin"
for crate in "${!may[@]}"; do
    deps=$(cargo tree -p "$crate" -e normal --prefix none --format '{p}' --locked | awk '{print $1}' | sort -u)
    for d in $deps; do
        [[ $d == "$crate" ]] && continue
        if [[ " $ours " == *" $d "* && " ${may[$crate]} " != *" $d "* ]]; then
            echo "layering: $crate depends on $d, which is not below it" >&2
            fail=1
        fi
    done
    case $crate in
    htc-core | htc-engine)
        for banned in tokio lmdb-rkv lmdb-rkv-sys libc nix mio; do
            if grep -qx "$banned" <<<"$deps"; then
                echo "layering: the pure crate $crate depends on $banned" >&2
                fail=1
            fi
        done
        ;;
    esac
done
((fail == 0)) && echo "layering: every crate uses only the crates below it; htc-core and htc-engine do no I/O"
# What decides by time reads the steady clock (htc_host::steady_us), never the wall clock, which
# a step (NTP, a resumed virtual machine) moves under leases and deadlines: tests/clock-step.sh.
if wall=$(grep -rnE '(^|[^.a-z_])now_us\(\)|SystemTime::now' exec/src/executor exec/src/simexec.rs node/src/agent \
    node/src/leader/driver.rs node/src/leader/session.rs node/src/leader/mod.rs); then
    echo "layering: the wall clock read where time decides (use htc_host::steady_us):" >&2
    echo "$wall" >&2
    fail=1
fi
# Inside each crate, no module may import itself through others (what counts: the script's header).
python3 tests/modcycles.py || fail=1
# The shape kept for the busiest parts (what counts: the script's header).
python3 tests/structure.py || fail=1
exit "$fail"
