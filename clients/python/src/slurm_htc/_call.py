"""The task side of a function call: `python _call.py BASE` reads the call from `BASE.in`, runs
it, and writes how it ended to `BASE.out`, whole (written aside, synced, renamed) before the task
exits, so that a result the run records as done is one a client can read, now or after a restart.

Run by path with the client's interpreter, it needs only the standard library and cloudpickle:
not this package, which a node's interpreter may not see on its path. The exit status tells the
run how the call ended: 0 it returned, 1 it raised (or its result could not be kept), the
status of `sys.exit(n)` for a call that exited. A call killed (its memory limit, a signal, a
segfault) writes nothing, and the client reads the run's reason instead.

`BASE.in`: a pickle (the standard library's) of the client's `sys.path` and interpreter, then a
cloudpickle of the calls: `[(fn, args, kwargs), ...]` (one per call; several for `map`'s
`chunksize`). `BASE.out`: a cloudpickle of `(kind, payload)`, by kind: `return` the values (a
list, one per call), `raise` `(exception or None, its type's name, its text, the traceback as
text)`, `exit` the status `sys.exit` was given.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import traceback
from typing import Any, Callable, Dict, List, Tuple

RETURNED, RAISED, EXITED = "return", "raise", "exit"

# One call: the function, its positional and its keyword arguments.
Call = Tuple[Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]


def write_outcome(base: str, kind: str, payload: Any) -> None:
    """`BASE.out`, whole or not at all, and on disk before the task's end is recorded."""
    import cloudpickle  # type: ignore[import-untyped]

    data = cloudpickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
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


def read_calls(base: str) -> List[Call]:
    """The calls in `BASE.in`, with the client's `sys.path` added to this interpreter's first, so
    that what the functions import by name is found as the client found it."""
    import cloudpickle

    with open(base + ".in", "rb") as f:
        header = pickle.load(f)
        for p in reversed(header.get("sys_path", [])):
            if p not in sys.path:
                sys.path.insert(0, p)
        calls: List[Call] = cloudpickle.load(f)
    return calls


def run(base: str) -> int:
    """Runs the calls of `BASE.in`, writes `BASE.out`; the task's exit status."""
    try:
        calls = read_calls(base)
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
        write_outcome(base, RETURNED, values)
    except Exception as e:
        tb = traceback.format_exc()
        why = f"the result could not be pickled: {type(e).__name__}: {e}"
        write_outcome(base, RAISED, raised(TypeError(why), tb))
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: _call.py BASE (reads BASE.in, writes BASE.out)")
    # The script's own folder is not the client's: what the call imports comes from its path.
    sys.path.pop(0)
    sys.exit(run(sys.argv[1]))
