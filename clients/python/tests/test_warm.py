"""The warm path of function calls on a real open run (the real `htc` and `htc-call`): calls
forked from one warm interpreter per agent, each still in its task's place (directory,
environment, output, memory cgroup), killed with its task (timeout, cancel), and the cold
command wherever the warm interpreter cannot serve (it cannot start, it was killed)."""

from __future__ import annotations

import os
import pathlib
import signal
import stat
import subprocess
import sys
import time
from typing import Iterator, List, Tuple

import pytest

from slurm_htc import CallFailed, Executor

ROOT = pathlib.Path(__file__).resolve().parents[3]
HTC = os.environ.get("HTC") or str(ROOT / "target" / "release" / "htc")


@pytest.fixture
def ex(tmp_path: pathlib.Path) -> Iterator[Executor]:
    with Executor(htc=HTC, cwd=str(tmp_path), retries=0) as e:
        yield e


def parent() -> Tuple[int, str]:
    """The call's parent and its command line: the warm interpreter, or the agent (cold)."""
    ppid = os.getppid()
    with open(f"/proc/{ppid}/cmdline", "rb") as f:
        return ppid, f.read().replace(b"\0", b" ").decode()


def where() -> Tuple[str, str, str]:
    print("said by the call")
    print("and to stderr", file=sys.stderr)
    return os.getcwd(), os.environ.get("HTC_TASK_ID", ""), os.environ.get("CALL_MARK", "")


def pid_then_sleep(path: str) -> None:
    pathlib.Path(path).write_text(str(os.getpid()))
    time.sleep(120)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone between the open and the read
        return False


def gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def warm_interpreters() -> List[int]:
    out = subprocess.run(["pgrep", "-f", "slurm_htc/_warm.py"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_calls_are_forked_from_one_warm_interpreter_in_their_task_s_place(ex: Executor, tmp_path: pathlib.Path) -> None:
    parents = [f.result(timeout=120) for f in [ex.submit(parent) for _ in range(12)]]
    assert all("_warm.py" in cmd for _, cmd in parents), parents[:2]
    assert len({pid for pid, _ in parents}) == 1, "one warm interpreter serves the agent's calls"
    (tmp_path / "sub").mkdir()
    f = ex.with_options(cwd=str(tmp_path / "sub"), env={"CALL_MARK": "from the client's 'env'"}).submit(where)
    cwd, task_id, mark = f.result(timeout=60)
    assert ex.submit(os.getcwd).result(timeout=60) == os.getcwd(), "a call runs where the client does"
    assert (cwd, task_id, mark) == (str(tmp_path / "sub"), str(f.task_id), "from the client's 'env'")
    assert parent()[1] != "" and "_warm.py" in ex.submit(parent).result(timeout=60)[1]
    out = subprocess.run([HTC, "output", ex.run, str(f.task_id)], capture_output=True, text=True, cwd=tmp_path)
    err = subprocess.run([HTC, "output", "--stderr", ex.run, str(f.task_id)], capture_output=True, text=True, cwd=tmp_path)
    assert "said by the call" in out.stdout and "and to stderr" in err.stderr, (out, err)


def pid_and_left(mark: str) -> Tuple[int, object, str]:
    """The call's process, what an earlier call of that process left in it, its CALL_MARK."""
    left = getattr(sys, "_htc_test_mark", None)
    sys._htc_test_mark = mark  # type: ignore[attr-defined]
    print(f"output of {mark}")
    return os.getpid(), left, os.environ.get("CALL_MARK", "")


def test_workers_serve_calls_one_after_another_each_in_its_own_task_s_place(ex: Executor, tmp_path: pathlib.Path) -> None:
    slots = len(os.sched_getaffinity(0))
    futures = [ex.with_options(env={"CALL_MARK": "set"}).submit(pid_and_left, "m0")]
    runs = [futures[0].result(timeout=60)]
    for i in range(1, 12):  # one after another: each finds the workers idle
        futures.append(ex.submit(pid_and_left, f"m{i}"))
        runs.append(futures[-1].result(timeout=60))
    workers = {pid for pid, _, _ in runs}
    assert len(workers) <= slots, f"{len(workers)} processes for 12 calls one after another"
    assert any(left is not None for _, left, _ in runs), "a worker's next call sees what the last left"
    assert [m for _, _, m in runs] == ["set"] + [""] * 11, "each call has its own task's environment"
    for i in (0, 5):
        out = subprocess.run([HTC, "output", ex.run, str(futures[i].task_id)], capture_output=True, text=True, cwd=tmp_path)
        assert out.stdout == f"output of m{i}\n", out
    with pytest.raises(CallFailed, match="exit"):
        ex.submit(sys.exit, 3).result(timeout=60)
    assert ex.submit(pid_and_left, "after").result(timeout=60)[0] in workers, "sys.exit ends the call, not its worker"
    hog = ex.with_options(mem="200M").submit(pid_and_left, "limited").result(timeout=60)[0]
    assert hog not in workers, "a call with a memory limit has a process of its own"
    assert ex.submit(pid_and_left, "again").result(timeout=60)[0] in workers


def shims(under: str) -> int:
    """How many `htc-call` shims of calls under UNDER (a test's run: others run beside it) run now."""
    n = 0
    for p in os.listdir("/proc"):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        n += words[0].endswith(b"htc-call") and any(under.encode() in w for w in words)
    return n


def ignore_term_then_sleep(path: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pid_then_sleep(path)


def test_the_agent_hands_calls_to_the_warm_interpreter_itself_and_still_ends_them(ex: Executor, tmp_path: pathlib.Path) -> None:
    # The first call's shim starts the warm interpreter; then the agent hands calls over with
    # no process of their own, and a timeout, a cancel and SIGKILL after the grace still end them.
    assert ex.submit(shims, str(tmp_path)).result(timeout=60) == 1
    assert [ex.submit(shims, str(tmp_path)).result(timeout=60) for _ in range(3)] == [0, 0, 0]
    assert ex.submit(where).result(timeout=60)[2] == "", "the agent's own environment is not the call's"
    for name, fn in (("term", pid_then_sleep), ("kill", ignore_term_then_sleep)):
        slow = ex.with_options(timeout="1s").submit(fn, str(tmp_path / name))
        with pytest.raises(CallFailed, match="timed out|timeout"):
            slow.result(timeout=60)
        assert gone_within(int((tmp_path / name).read_text()), 5), name
    held = ex.submit(pid_then_sleep, str(tmp_path / "held"))
    while not (tmp_path / "held").exists() or not (tmp_path / "held").read_text():
        time.sleep(0.05)
    assert held.cancel() or held.cancelled() or held.done()
    assert gone_within(int((tmp_path / "held").read_text()), 10), "a handed-over call goes with its cancelled task"
    with pytest.raises(CallFailed, match="signal 6|SIGABRT"):
        ex.submit(os.abort).result(timeout=60)
    assert ex.submit(shims, str(tmp_path)).result(timeout=60) == 0, "served again, by a worker forked anew"


def test_fork_gives_each_call_a_process_of_its_own(tmp_path: pathlib.Path) -> None:
    with Executor(htc=HTC, cwd=str(tmp_path), retries=0, warm="fork") as ex:
        runs = [ex.submit(pid_and_left, str(i)).result(timeout=60) for i in range(6)]
        assert len({pid for pid, _, _ in runs}) == 6 and all(left is None for _, left, _ in runs)
        assert "_warm.py" in ex.submit(parent).result(timeout=60)[1]
    with pytest.raises(ValueError, match="warm="):
        Executor(htc=HTC, cwd=str(tmp_path), warm="pool")


def test_a_call_is_cold_where_asked(tmp_path: pathlib.Path) -> None:
    with Executor(htc=HTC, cwd=str(tmp_path), retries=0, warm=False) as ex:
        _, cmd = ex.submit(parent).result(timeout=60)
        assert "htc-agent" in cmd, cmd


def test_a_timeout_and_a_cancel_end_the_forked_call(ex: Executor, tmp_path: pathlib.Path) -> None:
    slow = ex.with_options(timeout="2s").submit(pid_then_sleep, str(tmp_path / "slow"))
    with pytest.raises(CallFailed, match="timed out|timeout"):
        slow.result(timeout=60)
    assert gone_within(int((tmp_path / "slow").read_text()), 5)
    held = ex.submit(pid_then_sleep, str(tmp_path / "held"))
    while not (tmp_path / "held").exists() or not (tmp_path / "held").read_text():
        time.sleep(0.05)
    assert held.cancel() or held.cancelled() or held.done()
    assert gone_within(int((tmp_path / "held").read_text()), 10), "the call goes with its cancelled task"


def test_a_killed_shim_takes_its_call_with_it(ex: Executor, tmp_path: pathlib.Path) -> None:
    f = ex.submit(pid_then_sleep, str(tmp_path / "p"))
    while not (tmp_path / "p").exists() or not (tmp_path / "p").read_text():
        time.sleep(0.05)
    child = int((tmp_path / "p").read_text())
    ppid_of = lambda pid: int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])  # noqa: E731
    shims = subprocess.run(["pgrep", "-f", f"htc-call .*{f._call[1] if f._call else ''}"], capture_output=True, text=True).stdout.split()
    assert shims and ppid_of(child) in warm_interpreters()
    os.kill(int(shims[0]), signal.SIGKILL)
    assert gone_within(child, 5), "kill -9 of the task reaches the forked call"
    with pytest.raises(CallFailed, match="signal 9|SIGKILL|killed"):
        f.result(timeout=60)


def test_a_memory_limit_holds_for_a_forked_call(ex: Executor, tmp_path: pathlib.Path) -> None:
    def hog(path: str) -> int:
        pathlib.Path(path).write_text(parent()[1])
        return len(bytearray(300 * 2**20))

    f = ex.with_options(mem="60M").submit(hog, str(tmp_path / "who"))
    with pytest.raises(CallFailed, match="memory"):
        f.result(timeout=120)
    assert "_warm.py" in (tmp_path / "who").read_text(), "the call was forked, and its slot's limit held"


def test_the_cold_command_serves_where_no_warm_interpreter_starts(tmp_path: pathlib.Path) -> None:
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\ncase "$1" in *_warm.py) exit 3;; esac\nexec {sys.executable} "$@"\n')
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    with Executor(htc=HTC, cwd=str(tmp_path), retries=0, python=str(py)) as ex:
        assert [f.result(timeout=120) for f in [ex.submit(pow, 2, i) for i in range(4)]] == [1, 2, 4, 8]
        _, cmd = ex.submit(parent).result(timeout=60)
        assert "_warm.py" not in cmd


def test_a_killed_warm_interpreter_is_started_again_and_goes_with_the_run(tmp_path: pathlib.Path) -> None:
    with Executor(htc=HTC, cwd=str(tmp_path), retries=0) as ex:
        first, _ = ex.submit(parent).result(timeout=60)
        os.kill(first, signal.SIGKILL)
        gone_within(first, 5)
        assert ex.submit(pow, 3, 2).result(timeout=60) == 9
        second, cmd = ex.submit(parent).result(timeout=60)
        assert second != first and "_warm.py" in cmd
        agent = cmd.split()[3]  # python _warm.py SOCKET AGENT_PID FIRST_BASE
    assert gone_within(second, 10), "the warm interpreter ends with its agent"
    # Killed with its agent (the guard ends what an agent leaves), it may leave its files: the
    # next start of a warm interpreter on the node removes those of agents that are gone.
    with Executor(htc=HTC, cwd=str(tmp_path), retries=0) as ex:
        assert ex.submit(pow, 2, 5).result(timeout=60) == 32
        left = [p.name for p in pathlib.Path(f"/tmp/htc-warm-{os.getuid()}").glob(f"{agent}-*")]
        assert not left, f"the files of a gone agent's warm interpreter: {left}"
