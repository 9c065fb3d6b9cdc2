#!/usr/bin/env bash
# Every test of the project, in tiers: unit and in-process tests (cargo), end-to-end tests of
# `htc run` against the real binaries (cargo, node-agent/tests), then the Slurm tier against a
# real cluster started on this machine (needs root: it starts munge, slurmctld and slurmd).
#
#   tests/run-all.sh            # everything
#   HTC_SKIP_SLURM=1 ...        # only the cargo tiers (e.g. as an unprivileged developer)
#   FAULTS_ONLY="name ..." ...  # only some of tests/slurm/faults.sh's faults
#   HTC_JOBS_ONLY=name ...      # only one of tests/slurm/htc-jobs.sh's tests
# Each of the last three leaves tests out, which a passing run must not hide: they are announced
# in a banner on stderr at the start and at the end, and .ci/run refuses them.
set -euo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# Each step's wall time, printed when the next starts and as a table at the end, so that a slow CI
# says where its minutes go.
steps=() step_name='' step_t0=0 run_t0=$SECONDS
step_end() {
    [[ -n $step_name ]] || return 0
    local d=$((SECONDS - step_t0))
    steps+=("$(printf '%5d s  %s' "$d" "$step_name")")
    printf -- '-- %s: %d s\n' "$step_name" "$d"
    step_name=''
}
step() { step_end; step_name=$*; step_t0=$SECONDS; printf '\n== %s ==\n' "$*"; }
print_times() {
    step_end
    printf '\n== time per step ==\n'
    printf '%s\n' "${steps[@]}"
    printf '%5d s  in all\n' $((SECONDS - run_t0))
}
banner() {
    local rule='!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!'
    printf '\n%s\n' "$rule" >&2
    printf '!!! %s\n' "$@" >&2
    printf '%s\n\n' "$rule" >&2
}
skipped=()
[[ ${HTC_SKIP_SLURM:-0} == 1 ]] && skipped+=("HTC_SKIP_SLURM=1: the Slurm tier (tests/slurm/*.sh) is NOT run")
[[ -n ${FAULTS_ONLY:-} ]] && skipped+=("FAULTS_ONLY=\"$FAULTS_ONLY\": tests/slurm/faults.sh runs only these faults")
[[ -n ${HTC_JOBS_ONLY:-} ]] && skipped+=("HTC_JOBS_ONLY=$HTC_JOBS_ONLY: tests/slurm/htc-jobs.sh runs only this test")
rpm_pid='' rpm_build=''
# The script's own status stands: under `set -e` a failing command here (a kill of the RPM
# build's group, which has ended when all went well) would end the trap with its status, turn a
# pass into exit 1 and print no times.
on_exit() {
    local rc=$?
    set +e
    [[ -z $rpm_pid ]] || kill -- -"$rpm_pid" 2>/dev/null
    [[ -z $rpm_build ]] || rm -rf "$rpm_build"
    [[ -z ${py_pid:-} ]] || kill "$py_pid" 2>/dev/null
    [[ -z ${HTC_PY_VENV:-} ]] || rm -rf "$HTC_PY_VENV" "$HTC_PY_VENV.log"
    [[ -z ${parsl_pid:-} ]] || kill "$parsl_pid" 2>/dev/null
    [[ -z ${parsl_venv:-} ]] || rm -rf "$parsl_venv" "$parsl_venv.log"
    [[ -z ${second_pid:-} ]] || kill "$second_pid" 2>/dev/null
    [[ -z ${second:-} ]] || rm -rf "$second"
    print_times
    ((${#skipped[@]} == 0)) || banner "TESTS WERE SKIPPED: this was NOT a run of every test" "${skipped[@]}"
    exit "$rc"
}
trap on_exit EXIT
((${#skipped[@]} == 0)) || banner "TESTS SKIPPED: a pass of this run is not a pass of every test" "${skipped[@]}"

# The Python step's venv: the packages as a user installs them, Snakemake, its cluster-generic
# executor, pytest and mypy pinned (tests/py-pins.txt), from the registry. The Slurm tier runs
# Snakemake from it too (as the cluster's user: the venv is readable by all); it is removed at the
# end. Made from the start, in the background and at SCHED_IDLE: mostly a download, it overlaps
# the builds. The clients themselves are installed in their step: pip builds them in the checkout,
# which must stay clean until tests/fresh-build.sh has looked at it.
HTC_PY_VENV=$(mktemp -d /tmp/htc-py.XXXXXX)
export HTC_PY_VENV
chmod 755 "$HTC_PY_VENV"
# /usr/bin/python3 where there is one: a Python under /root (pyenv) is out of the cluster user's reach.
chrt --idle 0 bash -c '"$1" -m venv "$2" && "$2/bin/pip" install -q --disable-pip-version-check -r "$3"' \
    _ "$(command -v /usr/bin/python3 || command -v python3)" "$HTC_PY_VENV" "$root/tests/py-pins.txt" \
    >"$HTC_PY_VENV.log" 2>&1 &
py_pid=$!
# Parsl's own test suite's venv (tests/parsl-pins.txt: its conftest needs pytest 8), likewise.
parsl_venv=$(mktemp -d /tmp/htc-parsl.XXXXXX)
chrt --idle 0 bash -c '"$1" -m venv "$2" && "$2/bin/pip" install -q --disable-pip-version-check -r "$3"' \
    _ "$(command -v python3)" "$parsl_venv" "$root/tests/parsl-pins.txt" >"$parsl_venv.log" 2>&1 &
parsl_pid=$!

# The second Slurm release's root (Debian 13's 24.11, tests/cluster/release-root.sh: kept between
# runs on one machine, a minute's download on a new one) and its users' venv, made with its Python,
# likewise in the background; the build step waits for the root, the second release's tier for
# the venv. Skipped with the Slurm tier (HTC_SKIP_SLURM=1).
second=$(mktemp -d /tmp/htc-second.XXXXXX)
chmod 755 "$second"
second_venv=$second/venv
second_pid=''
if [[ ${HTC_SKIP_SLURM:-0} != 1 ]]; then
    # shellcheck disable=SC2016 # expanded by the inner bash
    chrt --idle 0 bash -c 'r=0; "$1/tests/cluster/release-root.sh" trixie >"$2/root" 2>"$2/root.log" || r=$?
        echo "$r" >"$2/root.status"; ((r == 0)) || exit "$r"
        "$1/tests/cluster/release-venv.sh" "$(cat "$2/root")" "$3" >"$2/venv.log" 2>&1' \
        _ "$root" "$second" "$second_venv" &
    second_pid=$!
fi
# wait_second_root: the root's path, once release-root.sh has ended (false if it failed).
wait_second_root() {
    while [[ ! -e $second/root.status ]]; do sleep 1; done
    if [[ $(cat "$second/root.status") != 0 ]]; then
        cat "$second/root.log" >&2
        echo "the second Slurm release's root could not be made" >&2
        return 1
    fi
    cat "$second/root"
}

step "hygiene: cargo fmt --check, cargo clippy -D warnings, the crates' layering"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
tests/layering.sh

step "pure crates in debug: their debug_assert!s (e.g. the counts' underflow check) fire here"
cargo test -p htc-core -p htc-engine --locked

step "fresh machine: the README's main command in a clean copy, without protoc or libclang"
tests/fresh-build.sh

step "build (release, once for every tier)"
# In two builds, as `make` does: the plugin's build-time tools (bindgen) would otherwise widen the
# features of the engine's (prost-build's regex) and rebuild the engine and all above it, which
# the fresh build just built.
cargo build --release --workspace --exclude spank-plugin --locked
cargo build --release -p spank-plugin --locked
if [[ ${HTC_SKIP_SLURM:-0} != 1 ]]; then
    # The plugin for the second release too, against its root's headers (its own crate only), and
    # for the newest Debian ships, against its headers alone (version.sh checks what it uses).
    second_root=$(wait_second_root)
    tests/cluster/release-plugin.sh "$second_root"
    tests/cluster/release-plugin.sh "$(tests/cluster/release-headers.sh sid)"
fi

# htc-core and htc-engine ran above, in debug (with their debug_assert!s): their release test
# binaries would add two LTO links (about 50 s) and no test.
step "cargo tests: store, exec, node, agent, plugin, end-to-end htc run"
if command -v cargo-nextest >/dev/null; then
    # nextest prints each test's time (and runs the binaries' tests side by side); the slowest
    # are listed again at the end. The lib and bin targets have no doc tests to lose.
    log=$(mktemp /tmp/htc-nextest.XXXXXX)
    rc=0
    (
        r=0
        cargo nextest run --release --workspace --exclude spank-plugin --exclude htc-core --exclude htc-engine \
            --locked --no-fail-fast || r=1
        cargo nextest run --release -p spank-plugin --locked --no-fail-fast || r=1
        exit "$r"
    ) 2>&1 | tee "$log" || rc=$?
    echo "-- the slowest tests:"
    # (`head` closes the pipe early: its SIGPIPE to sort is no failure of the tests.)
    grep -E '^\s+(PASS|FAIL|LEAK)' "$log" | sed -E 's/^\s+[A-Z]+ \[ *([0-9.]+)s\] /\1 /' | sort -u | sort -rn | head -n 15 || true
    rm -f "$log"
    ((rc == 0)) || exit "$rc"
else
    echo "(cargo-nextest is not installed: cargo test, without each test's time)"
    cargo test --release --workspace --exclude spank-plugin --exclude htc-core --exclude htc-engine --locked
    cargo test --release -p spank-plugin --locked
fi

# Steps the machine's clock (and back): alone, between tiers. Root only, as is the Slurm tier.
if [[ $(id -u) == 0 ]]; then
    step "clock steps: a run with the wall clock stepped 60 s forward, then back (tests/clock-step.sh)"
    tests/clock-step.sh
else
    skipped+=("not root: tests/clock-step.sh (a run with the machine's clock stepped) is NOT run")
fi

step "python clients: slurm_htc and the Snakemake plugin, mypy --strict, their pytest suites against real runs and real Snakemake"
py_ok=0
wait "$py_pid" || py_ok=$?
py_pid='' # reaped: its pid is no longer ours to kill
if ((py_ok != 0)); then
    cat "$HTC_PY_VENV.log"
    echo "the Python clients' venv could not be made" >&2
    exit 1
fi
"$HTC_PY_VENV/bin/pip" install -q --disable-pip-version-check "$root/clients/python" "$root/clients/snakemake"
if [[ -n $second_pid ]]; then
    # The second release's venv: the clients too, as its users install them.
    wait "$second_pid" || { cat "$second/venv.log"; echo "the second release's venv could not be made" >&2; exit 1; }
    second_pid=''
    tests/cluster/release-venv.sh "$second_root" "$second_venv" "$root/clients/python" "$root/clients/snakemake" >"$second/venv.log" 2>&1 ||
        { cat "$second/venv.log"; echo "the clients could not be installed in the second release's venv" >&2; exit 1; }
fi
# Side by side on pytest-xdist workers: the tests mostly wait on runs and on Snakemake's polls, so
# more workers than cores pay (the Snakemake suite: 109 s serial, 48 s on 3 workers here).
# Each client's unit tests (its pure parts) run first with no htc anywhere in reach, as they must
# on a machine without one; then the rest against real runs.
for c in python:4:test_units.py:test_task_line.py:test_call.py:test_parsl_units.py snakemake:3:test_tasks.py; do
    IFS=: read -r c n rest <<<"$c"
    IFS=: read -ra units <<<"$rest"
    (cd "$root/clients/$c" && "$HTC_PY_VENV/bin/mypy" --strict --cache-dir=/dev/null src)
    (cd "$root/clients/$c" && env -u HTC PATH="$HTC_PY_VENV/bin:/usr/bin:/bin" \
        "$HTC_PY_VENV/bin/python" -m pytest -q -p no:cacheprovider "${units[@]/#/tests/}")
    (cd "$root/clients/$c" && HTC="$root/target/release/htc" "$HTC_PY_VENV/bin/python" -m pytest -q -p no:cacheprovider \
        -n "$n" tests "${units[@]/#/--ignore=tests/}")
done

step "Parsl's own test suite against slurm_htc.parsl.HTCExecutor (tests/parsl-suite.sh)"
parsl_ok=0
wait "$parsl_pid" || parsl_ok=$?
parsl_pid=''
((parsl_ok == 0)) || { cat "$parsl_venv.log"; echo "the Parsl suite's venv could not be made" >&2; exit 1; }
"$parsl_venv/bin/pip" install -q --disable-pip-version-check "$root/clients/python"
tests/parsl-suite.sh "$parsl_venv"

if [[ ${HTC_SKIP_SLURM:-0} == 1 ]]; then
    echo "the cargo tiers passed; the Slurm tier was skipped (HTC_SKIP_SLURM=1)"
    exit 0
fi
[[ $(id -u) == 0 ]] || { echo "the Slurm tier needs root (set HTC_SKIP_SLURM=1 to skip it)" >&2; exit 1; }

# The RPM build (packages.sh's: a whole offline build from vendored crates, minutes of CPU) goes
# on beside the Slurm scenarios before it, at SCHED_IDLE: it gets only the CPU the scenarios'
# waits leave idle (jobs waiting on Slurm, tasks that sleep), so it does not slow them.
# packages.sh waits for the RPM and checks what it made.
rpm_build=$(mktemp -d /tmp/htc-rpm.XXXXXX)
# shellcheck disable=SC2016 # expanded by the inner bash
setsid bash -c 'chrt --idle 0 make -s -C "$1" rpm PKG_OUT="$2/pkgs" >"$2/out" 2>&1; echo $? >"$2/status"' \
    _ "$root" "$rpm_build" &
rpm_pid=$! # a process group of its own (setsid), stopped whole should this script end first
export HTC_RPM_BUILD=$rpm_build

# slurm_release INCLUDE-DIR: the release its headers are of, e.g. 22.05.8.
slurm_release() { "$root/packaging/slurm-version.sh" "$1"; }
failed=0
for t in "$root"/tests/slurm/*.sh; do
    step "slurm $(slurm_release /usr/include): $(basename "$t")"
    if ! "$t"; then
        echo "FAILED: $t"
        failed=$((failed + 1))
    fi
done
# The second release: its own cluster in its root, the same scripts. Those named here are the
# ones whose subject differs between releases (the plugin's loading and version guard, the
# workload, faults, preemption and recovery, the site's cgroups, accounting and limits, joins,
# open runs and their clients); htc-jobs.sh runs its second-release set (it says which).
for t in version.sh faults.sh site.sh htc-jobs.sh; do
    step "slurm $(slurm_release "$second_root/usr/include"): $t"
    if ! HTC_CLUSTER_ROOT=$second_root HTC_PY_VENV=$second_venv "$root/tests/slurm/$t"; then
        echo "FAILED: $t on the second release"
        failed=$((failed + 1))
    fi
done
"$root/tests/cluster/stop-cluster.sh" >/dev/null 2>&1 || true
if ((failed)); then
    echo "$failed Slurm test script(s) failed"
    exit 1
fi
if ((${#skipped[@]})); then
    echo "the tiers passed, with tests skipped"
else
    echo "all tiers passed"
fi
