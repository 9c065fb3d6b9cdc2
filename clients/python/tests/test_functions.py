"""Python functions as tasks of a real open run (the real `htc`: $HTC, or target/release/htc):
values back, exceptions raised again with the remote traceback, exits, aborts, memory limits,
big and unpicklable results, keys across a client's crash, `map` with `chunksize`."""

from __future__ import annotations

import concurrent.futures as cf
import gc
import os
import pathlib
import subprocess
import sys
import threading
import time
import tracemalloc
from typing import Iterator, List

import pytest

from slurm_htc import CallFailed, Executor, RemoteTraceback
from slurm_htc import _outlog

ROOT = pathlib.Path(__file__).resolve().parents[3]
HTC = os.environ.get("HTC") or str(ROOT / "target" / "release" / "htc")


@pytest.fixture
def ex(tmp_path: pathlib.Path) -> Iterator[Executor]:
    with Executor(htc=HTC, cwd=str(tmp_path), retries=0) as e:
        yield e


class Odd(ValueError):
    pass


def square(x: int) -> int:
    return x * x


def fails(x: int) -> None:
    raise Odd(f"odd {x}")


def test_a_function_s_value_is_its_future_s_result(ex: Executor) -> None:
    futures = [ex.submit(square, i) for i in range(20)]
    assert [f.result(timeout=120) for f in futures] == [i * i for i in range(20)]
    assert ex.submit(lambda a, *, b: (a, b), 1, b=[2]).result(timeout=60) == (1, [2])
    calls = pathlib.Path(ex._run_dir) / "calls"
    assert not call_files(calls), "a call's files go once its future is resolved"
    # The values came through the warm workers' logs: one per worker, not a file per call.
    assert len(list(calls.glob("o-*.log"))) <= 4, sorted(calls.iterdir())


def call_files(calls: pathlib.Path) -> List[pathlib.Path]:
    """The files of calls in CALLS: what is there but the warm workers' outcome logs."""
    return sorted(p for p in calls.iterdir() if not _outlog.is_log(p.name))


def test_an_exception_is_raised_again_with_its_type_and_the_remote_traceback(ex: Executor) -> None:
    f = ex.submit(fails, 3)
    with pytest.raises(Odd, match="odd 3") as info:
        f.result(timeout=60)
    assert isinstance(info.value.__cause__, RemoteTraceback) and "in fails" in str(info.value.__cause__)


def test_an_exit_an_abort_and_a_memory_limit_fail_naming_the_call(ex: Executor) -> None:
    exits = ex.submit(sys.exit, 3)
    aborts = ex.submit(os.abort)
    hog = ex.with_options(mem="50M").submit(bytearray, 400 * 2**20)
    with pytest.raises(CallFailed, match=r"sys.exit\(3\) \(task \d+\): called sys.exit\(3\)"):
        exits.result(timeout=60)
    with pytest.raises(CallFailed, match=r"posix.abort\(\) \(task \d+\): .*(signal 6|SIGABRT)"):
        aborts.result(timeout=60)
    with pytest.raises(CallFailed, match=r"bytearray\(419430400\) \(task \d+\): out of memory"):
        hog.result(timeout=60)


def test_what_cannot_be_pickled_is_a_clear_error_and_nothing_else_is_lost(ex: Executor) -> None:
    lock = threading.Lock()
    bad = ex.submit(lambda: lock)
    with pytest.raises(TypeError, match="cannot pickle the call"):
        bad.result(timeout=10)
    with pytest.raises(TypeError, match="the result could not be pickled"):
        ex.submit(threading.Lock).result(timeout=60)
    assert ex.submit(square, 4).result(timeout=60) == 16


def test_a_big_result_comes_back_whole(ex: Executor) -> None:
    assert len(ex.submit(bytes, 100 * 2**20).result(timeout=120)) == 100 * 2**20


def test_map_gives_values_in_order_chunksize_calls_per_task(ex: Executor) -> None:
    assert list(ex.map(square, range(10), timeout=120)) == [i * i for i in range(10)]
    assert list(ex.map(pow, range(7), [2] * 7, chunksize=3, timeout=120)) == [i**2 for i in range(7)]
    counts = subprocess.run([HTC, "status", ex.run, "--json"], cwd=ex._run.cwd, capture_output=True, text=True).stdout
    assert '"total":13' in counts.replace(" ", ""), counts


def test_options_apply_to_calls_and_after_orders_them(ex: Executor, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "order"
    first = ex.submit(lambda: (__import__("time").sleep(0.3), out.open("a").write("first\n")))
    second = ex.with_options(after=[first], cores=1).submit(lambda: out.open("a").write("second\n"))
    second.result(timeout=60)
    assert out.read_text() == "first\nsecond\n"
    assert ex.with_options(cwd=str(tmp_path)).submit(os.getcwd).result(timeout=60) == str(tmp_path)
    with pytest.raises(TypeError, match="unknown task option"):
        ex.with_options(colour="red")


def test_a_cancelled_call_never_runs(ex: Executor, tmp_path: pathlib.Path) -> None:
    blocker = ex.with_options(cores=len(os.sched_getaffinity(0))).submit(__import__("time").sleep, 600)
    marker = tmp_path / "ran"
    late = ex.submit(marker.write_text, "yes")
    late.wait_id(timeout=30)
    # Both asked before anything is asserted: a failed assertion must not leave the blocker to
    # hold the run (and the fixture's shutdown) for its 600 s.
    cancels = (late.cancel(), blocker.cancel())
    assert cancels == (True, True), (late, blocker)
    cf.wait([late, blocker], timeout=30)
    assert late.cancelled() and not marker.exists()
    calls, until = pathlib.Path(ex._run_dir) / "calls", time.monotonic() + 30
    while call_files(calls) and time.monotonic() < until:
        time.sleep(0.05)
    assert not call_files(calls), ("a cancelled call's files go once the run says so", call_files(calls))


def test_cancels_racing_the_calls_ends_leave_every_future_settled(ex: Executor) -> None:
    futures = [ex.submit(square, i) for i in range(300)]
    futures[150].result(timeout=120)
    for f in reversed(futures):  # some cancelled as their task ends, some after
        f.cancel()
    cf.wait(futures, timeout=120)
    assert all(f.cancelled() or f.result(0) == i * i for i, f in enumerate(futures))
    assert ex.submit(square, 7).result(timeout=60) == 49, "the poll goes on"


def test_a_pending_call_costs_its_client_under_1_kib(ex: Executor) -> None:
    blocker = ex.with_options(cores=len(os.sched_getaffinity(0))).submit(time.sleep, 600)
    blocker.wait_id(timeout=30)
    futures: List[cf.Future[int]] = []
    try:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        futures += [ex.submit(square, i) for i in range(2000)]
        for f in futures:
            f.wait_id(timeout=60)
        gc.collect()
        per_future = (tracemalloc.get_traced_memory()[0] - before) / len(futures)
        tracemalloc.stop()
        assert not any(f.done() for f in futures), "all still pending while measured"
        assert per_future < 1024, f"{per_future:.0f} bytes per pending future"
    finally:
        for f in [blocker, *futures]:
            f.cancel()


def test_submit_after_shutdown_is_refused(tmp_path: pathlib.Path) -> None:
    e = Executor(htc=HTC, cwd=str(tmp_path))
    e.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        e.submit(square, 2)


CRASHING = """
import os, sys, pathlib
from slurm_htc import Executor

def once(tag):
    with open("runs.txt", "a") as f:
        f.write(tag + "\\n")
    return tag.upper()

ex = Executor(htc=sys.argv[1], cwd=sys.argv[2], record=sys.argv[3])
print(ex.run, flush=True)
f = ex.with_options(key="once").submit(once, "a")
if sys.argv[4] == "crash":
    f.result(timeout=60)
    os._exit(9)
print(f.result(timeout=60), flush=True)
ex.shutdown()
"""


def test_a_client_restarted_with_keys_reads_finished_results_without_running_them_again(tmp_path: pathlib.Path) -> None:
    record = str(tmp_path / "run.txt")

    def program(mode: str) -> List[str]:
        p = subprocess.run(
            [sys.executable, "-c", CRASHING, HTC, str(tmp_path), record, mode],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )
        assert p.returncode == (9 if mode == "crash" else 0), p.stderr
        return p.stdout.split()

    [run] = program("crash")
    assert program("again") == [run, "A"]
    assert (tmp_path / "runs.txt").read_text() == "a\n", "the call ran once"


def late(x: int, fail: bool = False) -> int:
    import time

    time.sleep(0.5)  # past the status poll that the task's add brings
    if fail:
        raise Odd(f"odd {x}")
    return x * x


def test_a_value_comes_from_its_outcome_file_without_the_status_poll(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Status polls an hour apart once tasks are added: only the look at the calls' folder can
    # give the values, while a failure waits for the task's recorded end (the run might retry it).
    from slurm_htc import executor

    monkeypatch.setattr(executor, "POLL_FIRST_S", 3600.0)
    monkeypatch.setattr(executor, "POLL_MAX_S", 3600.0)
    e = Executor(htc=HTC, cwd=str(tmp_path), retries=0)
    try:
        assert [f.result(timeout=60) for f in [e.submit(late, i) for i in range(5)]] == [0, 1, 4, 9, 16]
        failed = e.submit(late, 3, True)
        done, _ = cf.wait([failed], timeout=5)
        assert not done, "a failure is the status poll's to report"
        e.submit(square, 0).result(timeout=60)  # its add brings a status poll, which sees the failure
        with pytest.raises(Odd, match="odd 3"):
            failed.result(timeout=10)
    finally:
        e.shutdown(wait=False, cancel_futures=True)  # a failure here must not wait an hour
