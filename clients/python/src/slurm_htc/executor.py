"""`Executor`: Python functions and commands run as tasks of a slurm-htc open run, each a
`concurrent.futures.Future`: `submit(fn, *args, **kwargs)`'s result is what `fn` returned, and
what it raised is raised again (`functions`); `submit_command`'s is a `TaskResult`.

Adds go through one `htc task add --file -` stream (grouped into few requests); the states of
all unfinished tasks are asked in one `htc task status` call per poll; a cancel is one `htc task
cancel`. The run is attached to, or started here (`htc run --open`) or on Slurm (`sbatch
--htc-open`) and closed at `shutdown`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import functions
from ._call import RETURNED, Call
from ._htc import OPTIONS, Command, HtcError, task_line
from ._outlog import Reader as OutcomeLogs
from ._stream import Stream
from .run import ENDED, Run, drop_record, read_record, write_record

# Polls start this often after news and slow down to the last when nothing changes; with many
# tasks unfinished, no more often than `POLL_PER_TASK_S` each, so that the leader spends on the
# client's questions a few percent of what it spends on the tasks (~1 µs per id asked).
POLL_FIRST_S, POLL_MAX_S, POLL_PER_TASK_S = 0.005, 0.5, 20e-6
# A run this executor started ends `IDLE_EXIT` after its last task unless the executor still
# speaks to it: while it lives it does so at least every `KEEP_ALIVE_S`. So a program killed
# leaves an idle run (on Slurm, an allocation) for seconds, not the half hour of a fixed idle time.
IDLE_EXIT, KEEP_ALIVE_S = "10s", 3.0
# A call's value is taken from its outcome (a warm worker's log, or a file of its own) as soon as
# the call has written it: the calls' folder is listed this often (no more often than
# `SCAN_PER_ENTRY_S` per file in it, so a folder of many calls costs a few percent of a core),
# long before a status poll's backoff would see the task's end.
SCAN_FIRST_S, SCAN_MAX_S, SCAN_PER_ENTRY_S = 0.002, 0.5, 5e-6

# A function call as its future knows it: its description, base, whether it has a key, whether
# it is a chunk of `map`'s, whether its bytes went to `BASE.in`.
CallRef = Tuple[str, str, bool, bool, bool]


# Which run an executor started or found, and a Slurm job's wait: `logging.getLogger("slurm_htc")`.
_log = logging.getLogger("slurm_htc")


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

    def stdout(self, errors: str = "strict") -> str:
        """Its stdout as UTF-8 text, decoded with `errors` (as `bytes.decode`: `replace`,
        `surrogateescape`, ... for output that may not be UTF-8)."""
        return self._ex._run.output(self.task_id, "stdout", errors=errors)

    def stderr(self, errors: str = "strict") -> str:
        """Its stderr as UTF-8 text, decoded with `errors`."""
        return self._ex._run.output(self.task_id, "stderr", errors=errors)

    def stdout_bytes(self) -> bytes:
        """Its stdout, the bytes it wrote."""
        return self._ex._run.output_bytes(self.task_id, "stdout")

    def stderr_bytes(self) -> bytes:
        """Its stderr, the bytes it wrote."""
        return self._ex._run.output_bytes(self.task_id, "stderr")

    def __repr__(self) -> str:
        return f"TaskResult(task_id={self.task_id}, exit_code={self.exit_code})"


class TaskFuture(concurrent.futures.Future):  # type: ignore[type-arg]
    """A task's future: its id once the run has the task (`task_id`), then its end."""

    # Set by `cancel` before it asks the run: the poll that then sees the task cancelled marks
    # the future cancelled (not failed), whichever of the two comes first.
    _cancelling = False

    def __init__(self, executor: "Executor") -> None:
        super().__init__()
        # One condition for all of an executor's futures, not one each: a pending future costs
        # its client well under 1 KiB then (a `Condition` with its deque and lock is ~1 KiB).
        # Its waits wake at every future's change, so `result`, `exception` and `wait_id` wait
        # for their own; a single lock, not stripes, since `concurrent.futures.wait` takes its
        # futures' conditions in the order of their ids, which stripes would not keep.
        self._condition = executor._futures_cond
        self._ex = executor
        self.task_id: Optional[int] = None
        # A function call's description, base, whether it has a key, whether it is a chunk
        # (`map`), whether its bytes went to a file (`functions`); `None` for a command.
        self._call: Optional[CallRef] = None

    def cancel(self) -> bool:
        """Cancels the task in the run (queued: it never starts; running: it is stopped)."""
        if self.done():
            return False
        with self._condition:
            self._condition.wait_for(self._known)
        if self.task_id is not None:
            self._cancelling = True
            self._ex._cancel([self.task_id])
        return self._cancelled_here()

    def _cancelled_here(self) -> bool:
        """Marks the future cancelled, and tells its waiters (`wait`, `as_completed`), as an
        executor's worker does for a future it will not run. Once only: `cancel` and the poll
        that sees the task cancelled may both come here."""
        with self._condition:
            if self.cancelled():
                return True
            if not super().cancel():
                return False
            self.set_running_or_notify_cancel()
            return True

    def result(self, timeout: Optional[float] = None) -> Any:
        with self._condition:
            self._condition.wait_for(self.done, timeout)
        return super().result(0)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        with self._condition:
            self._condition.wait_for(self.done, timeout)
        return super().exception(0)

    def _settle(self, value: Any = None, error: Optional[BaseException] = None) -> None:
        """The poll's end of the future. A `cancel` that came between the poll's look and this
        stands (the run was asked to stop the task): the poll thread must not die of it."""
        try:
            if error is not None:
                self.set_exception(error)
            else:
                self.set_result(value)
        except concurrent.futures.InvalidStateError:
            pass

    def _known(self) -> bool:
        """The run has the task (its id is here), or it was never added (the future failed)."""
        return self.task_id is not None or self.done()

    def _learn(self, task_id: int) -> None:
        with self._condition:
            self.task_id = task_id
            self._condition.notify_all()

    def wait_id(self, timeout: Optional[float] = None) -> int:
        """The task's id, once the run has it."""
        with self._condition:
            known = self._condition.wait_for(self._known, timeout)
        if not known:
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
    """Runs Python functions and commands as tasks of an open run.

    `submit(fn, *args, **kwargs)` runs `fn(*args, **kwargs)` in a task (pickled with
    cloudpickle, run by this interpreter or `python=`); its future's result is the value, and an
    exception it raised is raised again with the remote traceback as its cause. A command (a
    shell command line as a `str`, or a program and its arguments) goes through
    `submit_command`, or `submit` with a `str`, as before. Task options for a function's call
    (`key=`, `after=`, `cores=`, ...) come from `with_options(...)`, since every keyword of
    `submit(fn, ...)` is `fn`'s.

    `Executor()` starts an open run here (`htc run --open` in `cwd`); `Executor(run)` attaches to
    a running one (its id or directory); `Executor(slurm={"nodes": 4, "time": "2:00:00"})` submits
    `sbatch --htc-open` and waits for its leader. Keyword defaults (`cores`, `mem`, `gpus`,
    `timeout`, `retries`, `priority`) apply to every `submit`. A run this executor started is
    closed at `shutdown`; its id is `run` (and logged to the `slurm_htc` logger).

    With `record=PATH` a program finds its run again after a crash: the executor notes the run it
    starts in that file, and a later `Executor(record=PATH)` attaches to the run the file names
    while it still takes tasks (and closes it at its `shutdown`, removing the file) instead of
    starting another. Submits with the same `key=` then get the same tasks: those that finished
    give their results without running again.

    `warm`: how a node runs calls. `True` (the default): each node's warm interpreter (one per
    agent, which imports cloudpickle and `preload` once) hands them to workers it forked, each
    of which runs calls one after another, as a process pool's workers do (what a call leaves in
    its interpreter, a module imported, a global set, the next call of that worker sees); a
    call with a memory limit (`mem=`) gets a process forked for it alone. `"fork"`: a process
    forked for each call. `False`: a new interpreter for each call.
    """

    def __init__(
        self,
        run: Optional[str] = None,
        *,
        htc: Optional[str] = None,
        cwd: Optional[str] = None,
        slurm: Optional[Mapping[str, Any]] = None,
        idle_exit: str = IDLE_EXIT,
        start_timeout: float = 120.0,
        record: Optional[str] = None,
        python: Optional[str] = None,
        warm: Union[bool, str] = True,
        preload: Sequence[str] = (),
        **defaults: Any,
    ) -> None:
        if warm not in (True, False, "fork"):
            raise ValueError(f"warm={warm!r}: True, 'fork' or False")
        self._defaults = dict(defaults)
        unknown = set(self._defaults) - set(OPTIONS)
        if unknown:
            raise TypeError(f"unknown task option(s): {', '.join(sorted(unknown))}")
        left = read_record(record) if record is not None and run is None else ""
        self._run = Run(run or left, htc=htc, cwd=cwd)
        if left:
            try:
                self._run.check_open()
                # Closed at shutdown, as the program that started it would have.
                self._run.started = True
                _log.info("slurm-htc: using the open run %s, noted in %s", left, record)
            except HtcError as e:
                _log.info("slurm-htc: not the run %s noted in %s: %s", left, record, e)
                left = ""
        if run is None and not left:
            if slurm is not None:
                say = functools.partial(_log.info, "slurm-htc: %s")
                self._run = Run.start_slurm(slurm, htc=htc, cwd=cwd, idle_exit=idle_exit, timeout=start_timeout, say=say)
            else:
                self._run = Run.start(htc=htc, cwd=cwd, idle_exit=idle_exit, timeout=start_timeout)
            _log.info("slurm-htc: started the open run %s", self._run.id)
            if record is not None:
                write_record(record, self._run.id)
        self._record = record
        self._python = python or sys.executable
        shim = functions.shim_beside(self._run.binary) if warm else None
        self._warm = functions.Warm(shim, tuple(preload), fork=warm == "fork") if shim else None
        self._run_dir = _run_dir(self._run.id, self._run.cwd)
        self._keep_alive_s = min(KEEP_ALIVE_S, _seconds(idle_exit) / 3) if _seconds(idle_exit) > 0 else KEEP_ALIVE_S
        self.run = self._run.id
        self._lock = threading.Condition()
        self._futures_cond = threading.Condition()
        self._feed = _Feed()
        # Futures of tasks not ended, by task id: two submits under one key are one task.
        self._pending: Dict[int, List[TaskFuture]] = {}
        self._news = False
        # Outcome files read that held no value (a call that raised, which the run may retry):
        # by call file, the change time then, so that the folder's look reads each once.
        self._not_returned: Dict[str, int] = {}
        # The warm workers' outcome logs, read from where the last look ended; by call, why a
        # value logged could not be read (told once its task has ended).
        self._logs = OutcomeLogs()
        self._unreadable: Dict[str, str] = {}
        # The futures of calls without a key not yet resolved, by base name, whether the run has
        # acknowledged their tasks or not: a fast call's value can be logged before its id comes.
        self._by_name: Dict[str, TaskFuture] = {}
        self._shut = False
        self._poller = threading.Thread(target=self._poll, name="slurm-htc-poll", daemon=True)
        self._poller.start()

    # -- submitting -------------------------------------------------------------------------

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> TaskFuture:
        """`fn(*args, **kwargs)` in a task: the future's result is its value, or raises what it
        raised. A `str` or a list of strings is a command (`submit_command`, whose options then
        come as keywords)."""
        if callable(fn):
            return self._submit_calls(functions.describe(fn, args, kwargs), [(fn, args, kwargs)], {}, chunked=False)
        if args:
            raise TypeError("a command takes no positional arguments after it: pass a list, or a callable")
        return self.submit_command(fn, **kwargs)

    def with_options(self, **options: Any) -> "Options":
        """This executor with task options for the calls and commands submitted through it:
        `ex.with_options(key="sim-3", cores=4, after=[f]).submit(simulate, 3)`."""
        _check_options(options, calls=True)
        return Options(self, options)

    def submit_command(
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
        _check_options(options)
        opts = {**self._defaults, **options}
        line = task_line(cmd, opts, _ids(after), _ids(afterany), cwd, env)
        fut = TaskFuture(self)
        self._add(fut, line, key, name)
        return fut

    def _submit_calls(
        self,
        what: str,
        calls: Sequence[Call],
        options: Mapping[str, Any],
        *,
        chunked: bool,
    ) -> TaskFuture:
        """Calls as one task: written to their file, then added; a call that cannot be pickled
        is an error on its future, naming it."""
        if self._shut:
            raise RuntimeError(f"cannot submit {what} after shutdown")
        opts = {**self._defaults, **options}
        key, name = opts.pop("key", None), opts.pop("name", None)
        after, afterany = opts.pop("after", ()), opts.pop("afterany", ())
        cwd, env = opts.pop("cwd", None) or os.getcwd(), opts.pop("env", None)
        fut = TaskFuture(self)
        base = functions.base_for(self._run_dir, key)
        try:
            data = functions.encode(calls)
        except Exception as e:
            fut.set_exception(TypeError(f"cannot pickle the call {what}: {type(e).__name__}: {e}"))
            return fut
        word, filed = functions.call_word(base, data)
        fut._call = (what, base, key is not None, chunked, filed)
        warm = self._warm._replace(needs_memcg=bool(opts.get("mem"))) if self._warm else None
        if not os.path.isdir(cwd):
            fut.set_exception(ValueError(f"cwd={cwd!r}: no such directory"))
            return fut
        cmd, cwd, env = functions.command(self._python, word, warm, cwd, env)
        line = task_line(cmd, opts, _ids(after), _ids(afterany), cwd, env)
        if key is None:
            with self._lock:
                self._by_name[os.path.basename(base)] = fut
        self._add(fut, line, key, name)
        return fut

    def _add(self, fut: TaskFuture, line: str, key: Optional[str], name: Optional[str]) -> None:
        if key is not None or name is not None:
            self._add_one(fut, line, key, name)
        else:
            self._add_streamed(fut, line)

    def _add_one(self, fut: TaskFuture, line: str, key: Optional[str], name: Optional[str]) -> None:
        """A task with a key or a name: a request of its own (a key names one task)."""
        try:
            [task_id] = self._run.add([line], key=key, name=name)
        except HtcError as e:
            fut.set_exception(e)
            return
        self._known(fut, task_id)

    def _add_streamed(self, fut: TaskFuture, line: str) -> None:
        with self._lock:
            for _ in range(2):
                if self._feed.stream is None:
                    self._feed = _Feed()
                    feed = self._feed
                    feed.stream = Stream(
                        self._run.binary,
                        self.run,
                        self._run.cwd,
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

    def _acknowledged(self, feed: _Feed, task_id: int) -> None:
        """The stream's next id: the task of the oldest line it owes."""
        self._known(feed.owed.popleft(), task_id)

    def _known(self, fut: TaskFuture, task_id: int) -> None:
        fut._learn(task_id)  # first: a future the poll resolves has its id
        with self._lock:
            if fut.done() and fut._call is not None:
                return  # its value was logged before its id came
            self._pending.setdefault(task_id, []).append(fut)
            self._news = True
            self._lock.notify_all()

    def _ended(self, feed: _Feed, why: Optional[str]) -> None:
        with self._lock:
            if self._feed is feed:
                self._feed.stream = None
            lost = list(feed.owed)
            feed.owed.clear()
        for fut in lost:
            self._forget(fut)
            fut.set_exception(HtcError(why or "the add stream ended before the task was added"))

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: Optional[float] = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
        """`fn(*items)` for the items of `iterables` taken together, in tasks of `chunksize` calls
        each; the values in order, as they come (`concurrent.futures.Executor.map`)."""
        return self._map(fn, iterables, timeout, chunksize, {})

    def _map(
        self,
        fn: Callable[..., Any],
        iterables: Sequence[Iterable[Any]],
        timeout: Optional[float],
        chunksize: int,
        options: Mapping[str, Any],
    ) -> Iterator[Any]:
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1")
        end = None if timeout is None else time.monotonic() + timeout
        items = list(zip(*iterables))
        futures = []
        for i in range(0, len(items), chunksize):
            chunk = items[i : i + chunksize]
            what = functions.describe(fn, chunk[0]) + (f" and {len(chunk) - 1} more" if len(chunk) > 1 else "")
            futures.append(self._submit_calls(what, [(fn, args, {}) for args in chunk], options, chunked=True))

        def results() -> Iterator[Any]:
            try:
                for f in futures:
                    yield from f.result(None if end is None else max(0.0, end - time.monotonic()))
            finally:
                for f in futures:
                    f.cancel()

        return results()

    def map_commands(
        self,
        fn: Callable[..., Command],
        *iterables: Iterable[Any],
        timeout: Optional[float] = None,
        **options: Any,
    ) -> Iterator[TaskResult]:
        """`fn(*items)` gives each task's command; the `TaskResult`s in order, as they come."""
        futures = [self.submit_command(fn(*items), **options) for items in zip(*iterables)]
        end = None if timeout is None else time.monotonic() + timeout

        def results() -> Iterator[TaskResult]:
            for f in futures:
                yield f.result(None if end is None else max(0.0, end - time.monotonic()))

        return results()

    # -- states, cancels, the end -----------------------------------------------------------

    def _cancel(self, ids: Sequence[int]) -> None:
        self._run.cancel(ids)

    def _poll(self) -> None:
        pause, status_at = POLL_FIRST_S, 0.0
        while True:
            with self._lock:
                while not self._pending and not self._shut:
                    if not self._lock.wait(self._keep_alive_s) and not self._pending and not self._shut:
                        self._lock.release()
                        try:
                            self._run.keep_alive()
                        finally:
                            self._lock.acquire()
                if not self._pending and self._shut:
                    return
                ids = list(self._pending)
                fresh, self._news = self._news, False
            due = fresh or time.monotonic() >= status_at
            try:
                look = self._returned()
                changed = due and self._resolve(ids)
            except Exception:  # this thread's end would leave every future waiting
                _log.exception("slurm-htc: run %s: a poll failed; the next one comes in %.1f s", self.run, POLL_MAX_S)
                time.sleep(POLL_MAX_S)
                continue
            if due:
                # New tasks or ends bring the pace back up, never above one poll per `least`: a
                # stream of submits must not turn into a stream of status calls.
                least = max(POLL_FIRST_S, POLL_PER_TASK_S * len(ids))
                pause = least if changed or fresh else min(max(pause, least) * 2, max(POLL_MAX_S, least))
                status_at = time.monotonic() + pause
            time.sleep(max(0.0, min(look, status_at - time.monotonic())))

    def _returned(self) -> float:
        """Resolves the futures of calls that returned, from the warm workers' logs and the
        outcome files in the calls' folder, without waiting for the ledger's record of their
        tasks' ends (what failed is the status poll's: the run may still retry it). The pause
        until the next look."""
        with self._lock:
            by_name = {
                os.path.basename(f._call[1]): task_id
                for task_id, futs in self._pending.items()
                for f in futs
                if f._call is not None
            }
        if not by_name and not self._by_name:
            return SCAN_MAX_S
        folder = functions.calls_dir(self._run_dir)
        try:
            names = os.listdir(folder)
        except OSError:
            return SCAN_MAX_S
        damaged = len(self._logs.damage)
        for name, payload in self._logs.read(folder, names, self._by_name):
            self._take_logged(name, payload)
        if len(self._logs.damage) > damaged:
            _log.warning("slurm-htc: run %s: damaged outcome logs, read no further: %s", self.run, self._logs.damage)
        for name in names:
            task_id = by_name.get(name[:-4]) if name.endswith(".out") else None
            if task_id is not None:
                self._take_returned(task_id)
        return max(SCAN_FIRST_S, SCAN_PER_ENTRY_S * (len(names) + len(by_name)))

    def _take_logged(self, name: str, payload: bytes) -> None:
        """The value a warm worker logged for the call NAME (its task's id known or not yet)."""
        import cloudpickle  # type: ignore[import-untyped]

        try:
            outcome = cloudpickle.loads(payload)
        except Exception as e:  # told when its task has ended: the status poll's to resolve
            self._unreadable[name] = f"its result could not be read: {type(e).__name__}: {e}"
            return
        self._unreadable.pop(name, None)
        with self._lock:
            fut = self._by_name.get(name)
        if fut is not None:
            self._settle_returned(fut.task_id, [fut], outcome, from_file=False)

    def _take_returned(self, task_id: int) -> None:
        with self._lock:
            futs = [f for f in self._pending.get(task_id, []) if f._call is not None]
        if not futs:
            return
        base = futs[0]._call[1]  # type: ignore[index]
        try:
            changed = os.stat(base + ".out").st_mtime_ns
        except OSError:
            return
        if self._not_returned.get(base) == changed:
            return
        try:
            outcome = functions.read_outcome(base)
        except Exception:
            outcome = None  # damaged: the status poll names it once the task has ended
        if outcome is None or outcome[0] != RETURNED:
            self._not_returned[base] = changed
            return
        self._not_returned.pop(base, None)
        self._settle_returned(task_id, futs, outcome, from_file=True)

    def _settle_returned(self, task_id: Optional[int], futs: List[TaskFuture], outcome: Tuple[str, Any], from_file: bool) -> None:
        """FUTS, the call futures of TASK_ID (`None`: not known yet), resolved with the values the
        call returned; a call without a key leaves no file behind."""
        _, base, keyed, chunked, filed = futs[0]._call  # type: ignore[misc]
        with self._lock:
            left = [f for f in self._pending.pop(task_id, []) if f not in futs] if task_id is not None else []
            if left:
                self._pending[task_id] = left  # type: ignore[index]
            self._by_name.pop(os.path.basename(base), None)
        if not keyed and (from_file or filed):
            functions.remove(base)
        for f in futs:
            if not f.done():
                f._settle(outcome[1] if chunked else outcome[1][0])

    def _forget(self, fut: TaskFuture) -> None:
        """A call future resolved otherwise than by a logged value: no log record is its now."""
        if fut._call is not None:
            with self._lock:
                self._by_name.pop(os.path.basename(fut._call[1]), None)

    def _why_unread(self, base: str) -> str:
        """Why the value of the call at BASE may not have been read: what its log record held
        could not be unpickled, or a log is damaged (a value past the damage is not read)."""
        name = os.path.basename(base)
        if name in self._unreadable:
            return self._unreadable.pop(name)
        if self._logs.damage:
            where = "; ".join(f"{os.path.join(functions.calls_dir(self._run_dir), log)}: {why}" for log, why in self._logs.damage.items())
            return f"it ended without a result that could be read (a damaged outcome log: {where})"
        return ""

    def _resolve(self, ids: Sequence[int]) -> bool:
        """One `htc task status` of `ids`: the futures of those that ended are resolved."""
        try:
            rows = self._run.status(ids)
        except HtcError:
            return False  # the run between leaders (a hand-over): asked again at the next poll
        ended = [row for row in rows.values() if row["state"] in ENDED]
        with self._lock:
            # A value logged after the last look is found by another before its call is
            # resolved as one that ended without a result.
            unread = any(f._call is not None for row in ended if row["state"] == "done" for f in self._pending.get(row["id"], []))
        if unread:
            self._returned()
        with self._lock:
            futs = [(row, fut) for row in ended for fut in self._pending.pop(row["id"], [])]
        for row, fut in futs:
            if fut._call is not None:
                self._forget(fut)
                self._not_returned.pop(fut._call[1], None)
            if row["state"] == "cancelled" and fut._cancelling:
                fut._cancelled_here()
            if fut.done():
                if fut._call is not None and not fut._call[2]:
                    functions.remove(fut._call[1])
                continue
            if fut._call is not None:
                _resolve_call(fut, fut._call, row, self._why_unread(fut._call[1]))
            elif row["state"] == "done":
                fut._settle(TaskResult(self, row["id"], row.get("exit") or 0))
            else:
                fut._settle(error=TaskFailed(row["id"], row.get("exit"), row.get("reason") or row["state"]))
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
                self._forget(f)
                f._cancelled_here()
                if f._call is not None and not f._call[2]:
                    functions.remove(f._call[1])
        if wait:
            concurrent.futures.wait(pending)
            self._poller.join()
        if self._run.started:
            self._run.close(wait=wait)
            if self._record is not None:
                drop_record(self._record, self._run.id)


class Options:
    """An executor with task options for what is submitted through it (`Executor.with_options`)."""

    def __init__(self, executor: Executor, options: Mapping[str, Any]) -> None:
        self._ex, self._options = executor, dict(options)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> TaskFuture:
        """As `Executor.submit`, with these options."""
        if callable(fn):
            what = functions.describe(fn, args, kwargs)
            return self._ex._submit_calls(what, [(fn, args, kwargs)], self._options, chunked=False)
        if args or kwargs:
            raise TypeError("a command takes its options in with_options(...) here")
        return self._ex.submit_command(fn, **self._options)

    def map(
        self, fn: Callable[..., Any], *iterables: Iterable[Any], timeout: Optional[float] = None, chunksize: int = 1
    ) -> Iterator[Any]:
        """As `Executor.map`, with these options (a `key` is not one of them: it names one task)."""
        if "key" in self._options or "name" in self._options:
            raise TypeError("map's calls are several tasks: key= and name= name one")
        return self._ex._map(fn, iterables, timeout, chunksize, self._options)


def _resolve_call(fut: TaskFuture, call: CallRef, row: Mapping[str, Any], unread: str = "") -> None:
    """A function call's future from its task's end and the outcome it wrote; the files of a
    call without a key go first, so that a resolved future's call has left nothing behind.
    UNREAD: why a value it may have logged could not be read."""
    what, base, keyed, chunked, _ = call
    try:
        outcome = functions.read_outcome(base)
    except Exception as e:  # a damaged or unreadable outcome file
        outcome, unreadable = None, f"its result could not be read: {type(e).__name__}: {e}"
    else:
        unreadable = unread if outcome is None and row["state"] == "done" else ""
    if not keyed:
        functions.remove(base)
    if row["state"] == "done" and outcome is not None and outcome[0] == RETURNED:
        fut._settle(outcome[1] if chunked else outcome[1][0])
        return
    reason = unreadable or row.get("reason") or row["state"]
    if row["state"] == "done" and not unreadable:
        reason = "it ended without a result"
    fut._settle(error=functions.exception_of(what, row["id"], reason, outcome))


def _check_options(options: Mapping[str, Any], *, calls: bool = False) -> None:
    known = set(OPTIONS) | ({"key", "name", "after", "afterany", "cwd", "env"} if calls else set())
    unknown = set(options) - known
    if unknown:
        raise TypeError(f"unknown task option(s): {', '.join(sorted(unknown))}")


def _run_dir(run: str, cwd: Optional[str]) -> str:
    """The run's directory: the one named, else `.htc/ID` under the working directory."""
    if os.path.isdir(run):
        return os.path.abspath(run)
    return os.path.abspath(os.path.join(cwd or ".", ".htc", run))


def _seconds(duration: str) -> float:
    """`90`, `90s`, `15m`, `2h` in seconds (as `htc` reads an idle time); 0 when unreadable."""
    d = duration.strip()
    unit = {"s": 1, "m": 60, "h": 3600}.get(d[-1:], 0)
    try:
        return float(d[:-1]) * unit if unit else float(d)
    except ValueError:
        return 0.0


def _ids(futures: Sequence[concurrent.futures.Future]) -> list[int]:  # type: ignore[type-arg]
    """The task ids of `futures` (each waits until the run acknowledged its task)."""
    out = []
    for f in futures:
        if not isinstance(f, TaskFuture):
            raise TypeError("after= and afterany= take futures of this executor's submit")
        out.append(f.wait_id())
    return out
