"""Python functions as tasks, the client's side: a call's bytes carried in its task line (or,
when large, written to a file in the run's directory), the task line that runs it (`_call.py`
with the client's interpreter), and the outcome read back: the values, or the exception raised
again with the remote traceback as its cause.

A call has a base, `calls/BASE` under the run's directory (shared between the nodes as the run's
directory is): `BASE.in` holds a large call's bytes, `BASE.out` its outcome where a warm
worker's log (`_outlog.py`) does not. A call with a `key` has a base of its key's hash, so a
client restarted with the same key finds the result of the task the run kept for that key; the
files of a call without one go once its future is resolved.
"""

from __future__ import annotations

import base64
import hashlib
import os
import pickle
import re
import shlex
import shutil
import sys
import uuid
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Tuple

from . import _call
from ._call import Call

CALL_SCRIPT = os.path.abspath(_call.__file__)
# How much of a call's arguments its description shows.
DESCRIBE_MAX = 80


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a task, as the cause of the one raised again
    here (as `concurrent.futures.ProcessPoolExecutor` does)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


class CallFailed(Exception):
    """A call that did not return and left no exception to raise again: it exited
    (`sys.exit`), was killed (its memory limit, a signal, a segfault), or raised one that could
    not be pickled. `call` describes it; `task_id` and `reason` are the run's."""

    def __init__(self, call: str, task_id: Optional[int], reason: str) -> None:
        where = f"task {task_id}" if task_id is not None else "its task"
        super().__init__(f"{call} ({where}): {reason}")
        self.call, self.task_id, self.reason = call, task_id, reason


def describe(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Optional[Mapping[str, Any]] = None) -> str:
    """`module.name(args...)`, the arguments cut short: how errors name a call."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in (kwargs or {}).items()]
    inner = ", ".join(parts)
    if len(inner) > DESCRIBE_MAX:
        inner = inner[: DESCRIBE_MAX - 3] + "..."
    return f"{module + '.' if module and module != 'builtins' else ''}{name}({inner})"


def calls_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "calls")


def base_for(run_dir: str, key: Optional[str]) -> str:
    """Where a call's files go: by its key's hash, else a name of its own."""
    name = "k-" + hashlib.sha256(key.encode()).hexdigest()[:32] if key is not None else uuid.uuid4().hex
    return os.path.join(calls_dir(run_dir), name)


# The last header made, by the `sys.path` and directory it was made for: a program's path
# rarely changes between its calls, and making it again is a tenth of a small call's cost.
_header: Tuple[Tuple[str, ...], str, bytes] = ((), "", b"")
# Folders known to be there: a call file's folder is made once, not looked for at every call.
_made: set[str] = set()


def encode(calls: Sequence[Call]) -> bytes:
    """A call file's bytes (`_call.py` says what they hold); raises what pickling raised."""
    import cloudpickle  # type: ignore[import-untyped]

    global _header
    path, cwd = tuple(sys.path), os.getcwd()
    if _header[:2] != (path, cwd):
        sys_path = [os.path.abspath(p) if p else cwd for p in path]
        _header = (path, cwd, pickle.dumps({"sys_path": sys_path, "python": sys.executable}))
    body: bytes = cloudpickle.dumps(list(calls), protocol=pickle.HIGHEST_PROTOCOL)
    return _header[2] + body


# A call's bytes up to this size travel in its task line (the ledger keeps them as it keeps the
# line), larger ones in `BASE.in`: a file made per call costs more than a small call itself.
INLINE_MAX = 8 << 10


def call_word(base: str, data: bytes) -> Tuple[str, bool]:
    """The word that names a call in its task line (`BASE@DATA`, as `_call.split_word` reads
    it), and whether its bytes went to `BASE.in` instead (the word then ends in `@`)."""
    folder = os.path.dirname(base)
    if folder not in _made:  # where the call's outcome goes, whichever way its bytes go
        os.makedirs(folder, exist_ok=True)
        _made.add(folder)
    if len(data) <= INLINE_MAX:
        return base + "@" + base64.urlsafe_b64encode(data).rstrip(b"=").decode(), False
    write_call(base, data)
    return base + "@", True


def write_call(base: str, data: bytes) -> None:
    """`BASE.in`, whole, before the task that reads it is added (its folder made)."""
    folder = os.path.dirname(base)
    tmp = f"{base}.in.{os.getpid()}"
    try:
        f = open(tmp, "wb")
    except FileNotFoundError:  # the folder was removed since: made again
        os.makedirs(folder, exist_ok=True)
        f = open(tmp, "wb")
    with f:
        f.write(data)
    os.replace(tmp, base + ".in")


# The words a task line may hold for the run to exec it without a shell (`needs_shell` of the
# task file's parser).
LITERAL = re.compile(r"[A-Za-z0-9_./,:+%@^-]+")
WARM_SCRIPT = os.path.join(os.path.dirname(CALL_SCRIPT), "_warm.py")


class Warm(NamedTuple):
    """The warm path of a call: the `htc-call` shim the nodes run (installed beside `htc`), the
    modules the warm interpreter imports before it forks, whether the call has a memory limit,
    and whether it gets a process forked for it alone (not a worker's turn)."""

    shim: str
    preload: Sequence[str] = ()
    needs_memcg: bool = False
    fork: bool = False


def shim_beside(htc: str) -> Optional[str]:
    """The `htc-call` shim beside the `htc` binary (a name on the PATH, or a path), if there."""
    found = shutil.which(htc) or htc
    shim = os.path.join(os.path.dirname(os.path.abspath(found)), "htc-call")
    return shim if os.access(shim, os.X_OK) else None


def command(
    python: str,
    word: str,
    warm: Optional[Warm] = None,
    cwd: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Tuple[str, Optional[str], Optional[Mapping[str, str]]]:
    """The task's command, and the directory and environment its task line must still set
    (`None` where the command itself does).

    Cold: the call script run by the client's interpreter (or the one named), in the place of
    the task's shell (`exec`), so that the run sees a signal that kills the call (an abort, its
    memory limit) as such and not as the shell's exit status. Warm: the `htc-call` shim,
    which forks the call from the agent's warm interpreter or becomes that same cold command
    where it cannot; it changes to `cwd` itself, so that a line of plain words is exec'd by the
    agent with no shell between (the shim must be the agent's child: its warm interpreter is
    the agent's)."""
    cold = "exec " + " ".join(shlex.quote(w) for w in (python, CALL_SCRIPT, word))
    if warm is None:
        return cold, cwd, env
    words = [warm.shim, "--python", python, "--call-script", CALL_SCRIPT, "--zygote", WARM_SCRIPT]
    if warm.preload:
        words += ["--preload", ",".join(warm.preload)]
    if warm.needs_memcg:
        words.append("--needs-memcg")
    if warm.fork:
        words.append("--fork")
    if cwd is not None:
        words += ["--cwd", os.path.abspath(cwd)]
    words.append(word)
    if not env and all(LITERAL.fullmatch(w) for w in words):
        return " ".join(words), None, None
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items() if k.isidentifier())
    guarded = f"[ -x {shlex.quote(warm.shim)} ] && exec " + " ".join(shlex.quote(w) for w in words)
    return exports + guarded + "; " + cold, None, {k: v for k, v in (env or {}).items() if not k.isidentifier()} or None


def read_outcome(base: str) -> Optional[Tuple[str, Any]]:
    """`(kind, payload)` from `BASE.out`, `None` when the call wrote none (it was killed)."""
    import cloudpickle

    try:
        with open(base + ".out", "rb") as f:
            return cloudpickle.load(f)  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


def exception_of(call: str, task_id: Optional[int], reason: str, outcome: Optional[Tuple[str, Any]]) -> BaseException:
    """What a failed call's future raises: its own exception, the remote traceback as the cause;
    else a `CallFailed` naming the call and how it ended."""
    if outcome is not None and outcome[0] == _call.RAISED:
        exc, name, text, tb = outcome[1]
        if isinstance(exc, BaseException):
            exc.__cause__ = RemoteTraceback(tb)
            return exc
        return CallFailed(call, task_id, f"raised {name}: {text} (which could not be pickled)\n{tb}")
    if outcome is not None and outcome[0] == _call.EXITED:
        return CallFailed(call, task_id, f"called sys.exit({outcome[1]!r})")
    return CallFailed(call, task_id, reason)


def remove(base: str) -> None:
    for end in (".in", ".out"):
        try:
            os.unlink(base + end)
        except FileNotFoundError:
            pass
