"""A function call's files without a run: the call written as the client writes it, run by the
task side (`_call.py`, as its own process with this interpreter), its outcome read back as the
client reads it. No `htc` binary is needed."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import threading
from typing import Any, Tuple

import pytest

from slurm_htc import functions
from slurm_htc._call import EXITED, RAISED, RETURNED


def run_call(tmp_path: pathlib.Path, fn: Any, *args: Any, **kwargs: Any) -> Tuple[int, Any]:
    base = str(tmp_path / "calls" / "c")
    functions.write_call(base, functions.encode([(fn, args, kwargs)]))
    p = subprocess.run(functions.command(sys.executable, base)[0], shell=True, capture_output=True, text=True, timeout=60)
    return p.returncode, functions.read_outcome(base)


class Odd(Exception):
    pass


def square(x: int) -> int:
    return x * x


def test_a_call_returns_its_value(tmp_path: pathlib.Path) -> None:
    assert run_call(tmp_path, square, 7) == (0, (RETURNED, [49]))
    assert run_call(tmp_path, lambda a, b=1: a + b, 2, b=5) == (0, (RETURNED, [7]))


def test_an_exception_travels_with_its_type_and_the_remote_traceback(tmp_path: pathlib.Path) -> None:
    def fails(x: int) -> None:
        raise Odd(f"odd {x}")

    code, outcome = run_call(tmp_path, fails, 3)
    assert code == 1 and outcome[0] == RAISED
    e = functions.exception_of("fails(3)", 9, "exit 1", outcome)
    assert isinstance(e, Odd) and str(e) == "odd 3"
    assert isinstance(e.__cause__, functions.RemoteTraceback) and "in fails" in e.__cause__.tb


def test_an_exit_is_its_status_and_a_clear_failure(tmp_path: pathlib.Path) -> None:
    code, outcome = run_call(tmp_path, sys.exit, 3)
    assert (code, outcome) == (3, (EXITED, 3))
    e = functions.exception_of("sys.exit(3)", 4, "exit 3", outcome)
    assert isinstance(e, functions.CallFailed) and "sys.exit(3)" in str(e) and "task 4" in str(e)


def test_an_abort_leaves_no_outcome_and_the_run_s_reason_is_used(tmp_path: pathlib.Path) -> None:
    code, outcome = run_call(tmp_path, os.abort)
    assert code < 0 and outcome is None
    e = functions.exception_of("os.abort()", 5, "killed by signal 6 (SIGABRT)", outcome)
    assert str(e) == "os.abort() (task 5): killed by signal 6 (SIGABRT)"


def test_a_result_that_cannot_be_pickled_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    code, outcome = run_call(tmp_path, threading.Lock)
    assert code == 1
    e = functions.exception_of("threading.Lock()", 1, "exit 1", outcome)
    assert isinstance(e, TypeError) and "the result could not be pickled" in str(e)


def test_an_exception_that_cannot_be_pickled_still_says_what_it_was(tmp_path: pathlib.Path) -> None:
    class Holds(Exception):
        def __init__(self) -> None:
            super().__init__("holds a lock")
            self.lock = threading.Lock()

    def fails() -> None:
        raise Holds()

    code, outcome = run_call(tmp_path, fails)
    e = functions.exception_of("fails()", 2, "exit 1", outcome)
    assert code == 1 and isinstance(e, functions.CallFailed)
    assert "Holds: holds a lock (which could not be pickled)" in str(e)


def test_a_module_missing_on_the_node_is_named(tmp_path: pathlib.Path) -> None:
    mod = tmp_path / "only_here"
    mod.mkdir()
    (mod / "helper.py").write_text("def f():\n    return 1\n")
    sys.path.insert(0, str(mod))
    try:
        import helper  # type: ignore[import-not-found]

        base = str(tmp_path / "calls" / "m")
        functions.write_call(base, functions.encode([(helper.f, (), {})]))
    finally:
        sys.path.remove(str(mod))
        sys.modules.pop("helper", None)
    (mod / "helper.py").unlink()  # gone, as on a node that lacks it
    p = subprocess.run(functions.command(sys.executable, base)[0], shell=True, capture_output=True, timeout=60)
    e = functions.exception_of("helper.f()", 3, "exit 1", functions.read_outcome(base))
    assert p.returncode == 1 and isinstance(e, ModuleNotFoundError)
    assert "cannot import what the call needs" in str(e) and "helper" in str(e) and sys.executable in str(e)


def test_the_client_s_path_is_the_call_s(tmp_path: pathlib.Path) -> None:
    mod = tmp_path / "lib"
    mod.mkdir()
    (mod / "helper2.py").write_text("def f(x):\n    return x + 1\n")
    sys.path.insert(0, str(mod))
    try:
        import helper2  # type: ignore[import-not-found]

        assert run_call(tmp_path, helper2.f, 1) == (0, (RETURNED, [2]))
    finally:
        sys.path.remove(str(mod))
        sys.modules.pop("helper2", None)


def test_a_call_that_cannot_be_pickled_is_refused_before_any_file_is_written() -> None:
    lock = threading.Lock()
    with pytest.raises(TypeError):
        functions.encode([(lambda: lock, (), {})])


def test_a_call_is_described_by_its_name_and_its_arguments_cut_short() -> None:
    assert functions.describe(square, (3,), {"k": "v"}) == f"{__name__}.square(3, k='v')"
    long = functions.describe(square, ("x" * 500,))
    assert long.endswith("...)") and len(long) < 200
    assert functions.describe(len, ([1],)) == "len([1])"


def test_a_keyed_call_s_files_are_found_again_by_its_key(tmp_path: pathlib.Path) -> None:
    a, b = functions.base_for(str(tmp_path), "sim-1"), functions.base_for(str(tmp_path), "sim-1")
    assert a == b != functions.base_for(str(tmp_path), "sim-2")
    assert functions.base_for(str(tmp_path), None) != functions.base_for(str(tmp_path), None)
