"""`Executor`: commands run as tasks of a slurm-htc open run, each a `concurrent.futures.Future`.

Adds go through one `htc task add --file -` stream (grouped into few requests); the states of
all unfinished tasks are asked in one `htc task status` call per poll; a cancel is one `htc task
cancel`. The run is attached to, or started here (`htc run --open`) or on Slurm (`sbatch
--htc-open`) and closed at `shutdown`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import glob
import json
import os
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

from ._htc import Command, HtcError, call, find_binary, id_ranges, task_line
from ._stream import Stream

# Polls start this often after news and slow down to the last when nothing changes; with many
# tasks unfinished, no more often than `POLL_PER_TASK_S` each, so that the leader spends on the
# client's questions a few percent of what it spends on the tasks (~1 µs per id asked).
POLL_FIRST_S, POLL_MAX_S, POLL_PER_TASK_S = 0.005, 0.5, 20e-6


class TaskFailed(Exception):
    """The task failed for good (its retries spent), or was cancelled by the run (a dependency
    that failed); `reason` is the run's, as `htc task status` gives it."""

    def __init__(self, task_id: int, exit_code: Optional[int], reason: str) -> None:
        super().__init__(f"task {task_id}: {reason}")
        self.task_id, self.exit_code, self.reason = task_id, exit_code, reason


class TaskResult:
    """A task that succeeded: its id, its exit value (0), and its output, read when asked."""

    def __init__(self, executor: "Executor", task_id: int, exit_code: int) -> None:
        self._ex, self.task_id, self.exit_code = executor, task_id, exit_code

    def stdout(self) -> str:
        return self._ex._htc("output", self._ex.run, str(self.task_id), "--stdout")

    def stderr(self) -> str:
        return call(self._ex._bin, ["output", self._ex.run, str(self.task_id), "--stderr"], cwd=self._ex._cwd, stderr=True)

    def __repr__(self) -> str:
        return f"TaskResult(task_id={self.task_id}, exit_code={self.exit_code})"


class TaskFuture(concurrent.futures.Future):  # type: ignore[type-arg]
    """A task's future: its id once the run has the task (`task_id`), then its end."""

    def __init__(self, executor: "Executor") -> None:
        super().__init__()
        self._ex = executor
        self.task_id: Optional[int] = None
        self._known = threading.Event()

    def cancel(self) -> bool:
        """Cancels the task in the run (queued: it never starts; running: it is stopped)."""
        if self.done():
            return False
        self._known.wait()
        if self.task_id is not None:
            self._ex._cancel([self.task_id])
        return self._cancelled_here()

    def _cancelled_here(self) -> bool:
        """Marks the future cancelled, and tells its waiters (`wait`, `as_completed`), as an
        executor's worker does for a future it will not run."""
        if not super().cancel():
            return False
        self.set_running_or_notify_cancel()
        return True

    def wait_id(self, timeout: Optional[float] = None) -> int:
        """The task's id, once the run has it."""
        if not self._known.wait(timeout):
            raise TimeoutError("the run has not acknowledged the task yet")
        if self.task_id is None:
            raise self.exception() or HtcError("the task was not added")
        return self.task_id


class _Feed:
    """A stream and the futures whose ids it owes, in the order their lines went."""

    def __init__(self) -> None:
        self.stream: Optional[Stream] = None
        self.owed: Deque[TaskFuture] = collections.deque()


class Executor(concurrent.futures.Executor):
    """Runs commands as tasks of an open run.

    `Executor()` starts an open run here (`htc run --open` in `cwd`); `Executor(run)` attaches to
    a running one (its id or directory); `Executor(slurm={"nodes": 4, "time": "2:00:00"})` submits
    `sbatch --htc-open` and waits for its leader. Keyword defaults (`cores`, `mem`, `gpus`,
    `timeout`, `retries`, `priority`) apply to every `submit`. A run this executor started is
    closed at `shutdown`.
    """

    def __init__(
        self,
        run: Optional[str] = None,
        *,
        htc: Optional[str] = None,
        cwd: Optional[str] = None,
        slurm: Optional[Mapping[str, Any]] = None,
        idle_exit: str = "30m",
        start_timeout: float = 120.0,
        **defaults: Any,
    ) -> None:
        self._bin = find_binary(htc)
        self._cwd = os.fspath(cwd) if cwd is not None else None
        self._defaults = dict(defaults)
        unknown = set(self._defaults) - {"cores", "mem", "gpus", "timeout", "retries", "priority"}
        if unknown:
            raise TypeError(f"unknown task option(s): {', '.join(sorted(unknown))}")
        self._leader: Optional[subprocess.Popen] = None  # type: ignore[type-arg]
        self._started = run is None
        if run is not None:
            self.run = run
        elif slurm is not None:
            self.run = self._start_slurm(slurm, idle_exit, start_timeout)
        else:
            self.run = self._start_local(idle_exit, start_timeout)
        self._lock = threading.Condition()
        self._feed = _Feed()
        # Futures of tasks not ended, by task id: two submits under one key are one task.
        self._pending: Dict[int, List[TaskFuture]] = {}
        self._news = False
        self._shut = False
        self._poller = threading.Thread(target=self._poll, name="slurm-htc-poll", daemon=True)
        self._poller.start()

    # -- starting and attaching -------------------------------------------------------------

    def _start_local(self, idle_exit: str, timeout: float) -> str:
        log = tempfile.TemporaryFile(mode="w+")
        self._leader = subprocess.Popen(
            [self._bin, "run", "--open", "-q", "--idle-exit", idle_exit],
            cwd=self._cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        # The run's id ends with its leader's pid.
        pattern = os.path.join(self._cwd or ".", ".htc", f"*-{self._leader.pid}", "leader.addr")
        return self._wait_leader(pattern, timeout, log)

    def _start_slurm(self, slurm: Mapping[str, Any], idle_exit: str, timeout: float) -> str:
        args = ["sbatch", "--parsable", f"--htc-open={idle_exit}"]
        if "nodes" in slurm:
            args.append(f"--nodes={slurm['nodes']}")
        if "time" in slurm:
            args.append(f"--time={slurm['time']}")
        if slurm.get("grow"):
            args.append(f"--htc-grow={slurm['grow']}")
        args += [str(a) for a in slurm.get("sbatch_args", ())] + ["--wrap=:"]
        p = subprocess.run(args, cwd=self._cwd, capture_output=True, text=True)
        if p.returncode != 0:
            raise HtcError(f"sbatch: {p.stderr.strip() or p.returncode}")
        job = p.stdout.strip().split(";")[0]
        return self._wait_leader(os.path.join(self._cwd or ".", ".htc", job, "leader.addr"), timeout, None)

    def _wait_leader(self, pattern: str, timeout: float, log: Optional[Any]) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = glob.glob(pattern)
            if found:
                return os.path.basename(os.path.dirname(found[0]))
            if self._leader is not None and self._leader.poll() is not None:
                break
            time.sleep(0.01)
        said = ""
        if log is not None:
            log.seek(0)
            said = log.read().strip()
        if self._leader is not None and self._leader.poll() is None:
            self._leader.kill()
        raise HtcError(f"the open run's leader did not start: {said or 'no leader listened in time'}")

    # -- submitting -------------------------------------------------------------------------

    def submit(  # type: ignore[override]
        self,
        cmd: Command,
        /,
        *,
        after: Sequence[concurrent.futures.Future] = (),  # type: ignore[type-arg]
        afterany: Sequence[concurrent.futures.Future] = (),  # type: ignore[type-arg]
        key: Optional[str] = None,
        name: Optional[str] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        **options: Any,
    ) -> TaskFuture:
        """Adds `cmd` (a shell command line, or a program and its arguments) as a task; its future
        holds a `TaskResult` once it succeeded, or raises `TaskFailed`. Tasks named in `after`
        start once those succeeded; in `afterany`, once they ended. With `key`, submitting again
        under the same key (after a crash) gives the same task."""
        if self._shut:
            raise RuntimeError("cannot submit after shutdown")
        unknown = set(options) - {"cores", "mem", "gpus", "timeout", "retries", "priority"}
        if unknown:
            raise TypeError(f"unknown task option(s): {', '.join(sorted(unknown))}")
        opts = {**self._defaults, **options}
        line = task_line(cmd, opts, _ids(after), _ids(afterany), cwd, env)
        fut = TaskFuture(self)
        if key is not None or name is not None:
            self._add_one(fut, line, key, name)
        else:
            self._add_streamed(fut, line)
        return fut

    def _add_one(self, fut: TaskFuture, line: str, key: Optional[str], name: Optional[str]) -> None:
        """A task with a key or a name: a request of its own (a key names one task)."""
        args = ["task", "add", self.run, "--file", "/dev/stdin"]
        args += ["--key", key] if key is not None else []
        args += ["--name", name] if name is not None else []
        try:
            task_id = int(call(self._bin, args, cwd=self._cwd, input=line + "\n"))
        except (HtcError, ValueError) as e:
            fut.set_exception(e if isinstance(e, HtcError) else HtcError(str(e)))
            fut._known.set()
            return
        self._known(fut, task_id)

    def _add_streamed(self, fut: TaskFuture, line: str) -> None:
        with self._lock:
            for _ in range(2):
                if self._feed.stream is None:
                    self._feed = _Feed()
                    feed = self._feed
                    feed.stream = Stream(
                        self._bin,
                        self.run,
                        self._cwd,
                        functools.partial(self._acknowledged, feed),
                        functools.partial(self._ended, feed),
                    )
                self._feed.owed.append(fut)
                assert self._feed.stream is not None
                if self._feed.stream.write(line):
                    return
                self._feed.owed.pop()
                self._feed.stream = None
        fut.set_exception(HtcError("the run takes no tasks: its add stream ended"))
        fut._known.set()

    def _acknowledged(self, feed: _Feed, task_id: int) -> None:
        """The stream's next id: the task of the oldest line it owes."""
        self._known(feed.owed.popleft(), task_id)

    def _known(self, fut: TaskFuture, task_id: int) -> None:
        fut.task_id = task_id
        with self._lock:
            self._pending.setdefault(task_id, []).append(fut)
            self._news = True
            self._lock.notify_all()
        fut._known.set()

    def _ended(self, feed: _Feed, why: Optional[str]) -> None:
        with self._lock:
            if self._feed is feed:
                self._feed.stream = None
            lost = list(feed.owed)
            feed.owed.clear()
        for fut in lost:
            fut.set_exception(HtcError(why or "the add stream ended before the task was added"))
            fut._known.set()

    def map(  # type: ignore[override]
        self,
        fn: Callable[..., Command],
        *iterables: Iterable[Any],
        timeout: Optional[float] = None,
        **options: Any,
    ) -> Iterator[TaskResult]:
        """`fn(*items)` gives each task's command; the results in order, as they come."""
        futures = [self.submit(fn(*items), **options) for items in zip(*iterables)]
        end = None if timeout is None else time.monotonic() + timeout

        def results() -> Iterator[TaskResult]:
            for f in futures:
                yield f.result(None if end is None else max(0.0, end - time.monotonic()))

        return results()

    # -- states, cancels, the end -----------------------------------------------------------

    def _htc(self, *args: str) -> str:
        return call(self._bin, list(args), cwd=self._cwd)

    def _cancel(self, ids: Sequence[int]) -> None:
        self._htc("task", "cancel", self.run, *id_ranges(ids))

    def _poll(self) -> None:
        pause = POLL_FIRST_S
        while True:
            with self._lock:
                while not self._pending and not self._shut:
                    self._lock.wait()
                if not self._pending and self._shut:
                    return
                ids = list(self._pending)
                fresh, self._news = self._news, False
            changed = self._resolve(ids)
            # New tasks or ends bring the pace back up, never above one poll per `least`: a
            # stream of submits must not turn into a stream of status calls.
            least = max(POLL_FIRST_S, POLL_PER_TASK_S * len(ids))
            pause = least if changed or fresh else min(max(pause, least) * 2, max(POLL_MAX_S, least))
            time.sleep(pause)

    def _resolve(self, ids: Sequence[int]) -> bool:
        """One `htc task status` of `ids`: the futures of those that ended are resolved."""
        try:
            out = self._htc("task", "status", self.run, "--format", "json", *id_ranges(ids))
        except HtcError:
            return False  # the run between leaders (a hand-over): asked again at the next poll
        ended = []
        for row in map(json.loads, out.splitlines()):
            if row["state"] in ("done", "failed", "cancelled"):
                ended.append(row)
        with self._lock:
            futs = [(row, fut) for row in ended for fut in self._pending.pop(row["id"], [])]
        for row, fut in futs:
            if fut.done():
                continue
            if row["state"] == "done":
                fut.set_result(TaskResult(self, row["id"], row.get("exit") or 0))
            else:
                fut.set_exception(TaskFailed(row["id"], row.get("exit"), row.get("reason") or row["state"]))
        return bool(ended)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more submits. With `wait`, returns once every task submitted ended; with
        `cancel_futures`, what has not ended is cancelled first. A run this executor started is
        closed (it ends once what it holds is done)."""
        with self._lock:
            if self._shut:
                return
            stream = self._feed.stream
        if stream is not None:
            stream.close()  # the last lines' ids come before it returns
        with self._lock:
            self._shut = True
            self._lock.notify_all()
            pending = [f for futs in self._pending.values() for f in futs]
        if cancel_futures and pending:
            # One `htc task cancel` for all of them, then each future marked as cancelled.
            self._cancel([f.task_id for f in pending if f.task_id is not None])
            for f in pending:
                f._cancelled_here()
        if wait:
            concurrent.futures.wait(pending)
            self._poller.join()
        if self._started:
            try:
                self._htc("close", self.run)
            except HtcError:
                pass  # ended already
            if self._leader is not None and wait:
                self._leader.wait()


def _ids(futures: Sequence[concurrent.futures.Future]) -> list[int]:  # type: ignore[type-arg]
    """The task ids of `futures` (each waits until the run acknowledged its task)."""
    out = []
    for f in futures:
        if not isinstance(f, TaskFuture):
            raise TypeError("after= and afterany= take futures of this executor's submit")
        out.append(f.wait_id())
    return out
