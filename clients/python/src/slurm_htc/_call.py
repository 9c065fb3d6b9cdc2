"""The task side of a function call: `python _call.py BASE@DATA` reads the call (DATA, the
call's bytes in base64url, or where DATA is empty the file `BASE.in`), runs it, and writes how it
ended to `BASE.out`, whole (written aside, synced, renamed) before the task exits, so that a
result the run records as done is one a client can read, now or after a restart. A warm worker
passes a log instead (`_outlog.py`), where the value of a call without a key goes.

Run by path with the client's interpreter, it needs only the standard library and cloudpickle:
not this package, which a node's interpreter may not see on its path. The exit status tells the
run how the call ended: 0 it returned, 1 it raised (or its result could not be kept), the
status of `sys.exit(n)` for a call that exited. A call killed (its memory limit, a signal, a
segfault) writes nothing, and the client reads the run's reason instead.

The call's bytes (inline, or `BASE.in`): a pickle (the standard library's) of the client's
`sys.path` and interpreter, then a cloudpickle of the calls: `[(fn, args, kwargs), ...]` (one
per call; several for `map`'s `chunksize`). `BASE.out` (and a log record's payload): a
cloudpickle of `(kind, payload)`, by kind: `return` the values (a list, one per call), `raise`
`(exception or None, its type's name, its text, the traceback as text)`, `exit` the status
`sys.exit` was given.
"""

from __future__ import annotations

import base64
import os
import pickle
import socket
import sys
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

RETURNED, RAISED, EXITED = "return", "raise", "exit"

# One call: the function, its positional and its keyword arguments.
Call = Tuple[Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]


def split_word(word: str) -> Tuple[str, Optional[bytes]]:
    """A call's word: its base, and its bytes where the word carries them (after the last `@`;
    base64url has none, a path may)."""
    base, at, data = word.rpartition("@")
    if not at:
        return word, None
    return base, base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)) if data else None


def call_bytes(word: str) -> Tuple[str, bytes]:
    """The base of WORD and its call's bytes, inline or from `BASE.in`."""
    base, data = split_word(word)
    if data is None:
        with open(base + ".in", "rb") as f:
            data = f.read()
    return base, data


def is_keyed(base: str) -> bool:
    """Whether the call has a key (its base the key's hash, as the client names it)."""
    return os.path.basename(base).startswith("k-")


def write_outcome(base: str, kind: str, payload: Any, log: Optional[Any] = None) -> None:
    """`BASE.out`, whole or not at all, and on disk before the task's end is recorded; the value
    of a call without a key to LOG (an `_outlog.Writer`) where there is one and it takes it."""
    import cloudpickle  # type: ignore[import-untyped]

    data = cloudpickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
    if log is not None and kind == RETURNED and not is_keyed(base):
        if log.append(os.path.dirname(base), os.path.basename(base), data):
            return
    tmp = f"{base}.out.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, base + ".out")


def raised(e: BaseException, tb: str) -> Tuple[Any, str, str, str]:
    """How an exception travels: itself when it pickles, else its type's name and text."""
    import cloudpickle

    name = f"{type(e).__module__}.{type(e).__qualname__}"
    try:
        cloudpickle.loads(cloudpickle.dumps(e))
        return (e, name, str(e), tb)
    except Exception:
        return (None, name, str(e), tb)


def add_path(header: Dict[str, Any]) -> None:
    """The client's `sys.path` before this interpreter's, so that what the functions import by
    name is found as the client found it."""
    for p in reversed(header.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)


def read_calls(data: bytes) -> List[Call]:
    """The calls in a call's bytes, the client's path added first."""
    import io

    import cloudpickle

    f = io.BytesIO(data)
    add_path(pickle.load(f))
    calls: List[Call] = cloudpickle.load(f)
    return calls


def run(word: str, log: Optional[Any] = None) -> int:
    """Runs the calls of WORD, writes their outcome; the task's exit status."""
    base, _ = split_word(word)
    try:
        calls = read_calls(call_bytes(word)[1])
    except ImportError as e:
        why = (
            f"cannot import what the call needs on {socket.gethostname()} with {sys.executable}: {e} "
            "(install it there, or name another interpreter with Executor(python=...))"
        )
        write_outcome(base, RAISED, raised(type(e)(why), traceback.format_exc()))
        return 1
    values: List[Any] = []
    for fn, args, kwargs in calls:
        try:
            values.append(fn(*args, **kwargs))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            write_outcome(base, EXITED, e.code)
            return code if code != 0 else 1
        except BaseException as e:  # noqa: B902 - whatever it raised travels to the future
            write_outcome(base, RAISED, raised(e, traceback.format_exc()))
            return 1
    try:
        write_outcome(base, RETURNED, values, log)
    except OSError as e:  # a full disk, the run's directory gone: a failure the run may retry
        print(f"slurm-htc: the outcome of {base} could not be written: {e}", file=sys.stderr, flush=True)
        return 1
    except Exception as e:
        tb = traceback.format_exc()
        why = f"the result could not be pickled: {type(e).__name__}: {e}"
        write_outcome(base, RAISED, raised(TypeError(why), tb))
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: _call.py BASE@DATA (the call's bytes inline, or in BASE.in; writes BASE.out)")
    # The script's own folder is not the client's: what the call imports comes from its path.
    sys.path.pop(0)
    sys.exit(run(sys.argv[1]))
