#!/usr/bin/env bash
# Parsl's own test suite (`parsl/tests` of the pinned release, tests/parsl-pins.txt) against
# `slurm_htc.parsl.HTCExecutor`: `pytest --config clients/python/tests/parsl/htc_config.py`, the
# tests Parsl runs for a config given to it (those not tied to a config of their own), in a
# folder of its own. Left out, each for a reason:
#   -m cleannet         they fetch files from the internet (FTP, HTTPS); tests here reach only
#                       loopback
#   -m unix_filesystem_permissions_required (as root only)
#                       they expect a write to /bad/dir to be refused, which root's is not
#   test_error_handling/test_resource_spec.py (its one test, test_resource)
#                       it asserts that only HighThroughputExecutor, WorkQueueExecutor and
#                       ThreadPoolExecutor refuse a resource specification; this executor
#                       honours `memory` (the call dies at its 1 MB) and refuses `cpus`, by name
#   test_staging/test_staging_stdout.py::test_stdout_stderr_staging_zip
#                       a race in the test: it opens the zip once the stdout's stage-out is done,
#                       without the lock the stage-outs take, while the stderr's (a task of its
#                       own, run beside it) may be rewriting the zip's directory: BadZipFile,
#                       seen once here with two slots (any executor that runs the two at once)
#
#   tests/parsl-suite.sh VENV        (VENV: tests/parsl-pins.txt and clients/python installed)
set -euo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
(($# == 1)) || { sed -n '20p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2; }
venv=$(cd -- "$1" && pwd)
tests=$("$venv/bin/python" -c 'import os, parsl.tests; print(os.path.dirname(parsl.tests.__file__))')
marks='not cleannet'
(($(id -u) != 0)) || marks+=' and not unix_filesystem_permissions_required'
work=$(mktemp -d /tmp/htc-parsl-suite.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
HTC=${HTC:-$root/target/release/htc} "$venv/bin/python" -m pytest -p no:cacheprovider -q -rfEs \
    "$tests" --config "$root/clients/python/tests/parsl/htc_config.py" -m "$marks" \
    -k 'not (test_error_handling and test_resource_spec) and not test_stdout_stderr_staging_zip'
