"""The `htc` binary as this package calls it: where it is, one call, and the task lines it takes."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from typing import Iterable, Mapping, Optional, Sequence, Union

Command = Union[str, Sequence[str]]


class HtcError(RuntimeError):
    """`htc` refused or failed; the message is what it said."""


def find_binary(given: Optional[str] = None) -> str:
    """`given`, else `$HTC`, else `htc` on the PATH."""
    path = given or os.environ.get("HTC") or shutil.which("htc")
    if not path:
        raise HtcError("no htc binary: put it on the PATH, set $HTC, or pass htc= to the Executor")
    return path


def call(
    binary: str,
    args: Sequence[str],
    *,
    cwd: Optional[str] = None,
    input: Optional[str] = None,
    stderr: bool = False,
    ok: Sequence[int] = (0,),
) -> str:
    """Runs `htc ARGS`; its stdout (`stderr`: its stderr, as `htc output --stderr` prints a
    task's there), or `HtcError` with what it said on stderr for an exit status not in `ok`."""
    p = subprocess.run([binary, *args], cwd=cwd, input=input, capture_output=True, text=True)
    if p.returncode not in ok:
        said = p.stderr.strip() or f"exit {p.returncode}"
        raise HtcError(f"htc {' '.join(args[:2])}: {said}")
    return p.stderr if stderr else p.stdout


def call_bytes(binary: str, args: Sequence[str], *, cwd: Optional[str] = None, stderr: bool = False) -> bytes:
    """`call`, but the output as the bytes `htc` wrote: a task's output need not be text."""
    p = subprocess.run([binary, *args], cwd=cwd, capture_output=True)
    if p.returncode != 0:
        said = p.stderr.decode(errors="replace").strip() or f"exit {p.returncode}"
        raise HtcError(f"htc {' '.join(args[:2])}: {said}")
    return p.stderr if stderr else p.stdout


def id_ranges(ids: Iterable[int]) -> list[str]:
    """Ids as `htc` takes them: `5 17-20`, consecutive ones as one range."""
    out: list[str] = []
    run: Optional[list[int]] = None
    for i in sorted(set(ids)):
        if run is not None and i == run[1] + 1:
            run[1] = i
            continue
        if run is not None:
            out.append(str(run[0]) if run[0] == run[1] else f"{run[0]}-{run[1]}")
        run = [i, i]
    if run is not None:
        out.append(str(run[0]) if run[0] == run[1] else f"{run[0]}-{run[1]}")
    return out


# The task line's options, in the order `htc task add` writes them (docs/task-file.md).
# `mem`, `timeout` and `cores` may say how they grow from one attempt to the next ("4G*2",
# "10m+5m", "1/4/16") and `retry_on` which failed ends are retried ("oom/timeout/130-145").
OPTIONS = ("cores", "mem", "gpus", "timeout", "retries", "retry_on", "priority")


def task_line(
    cmd: Command,
    options: Mapping[str, object],
    after: Sequence[int] = (),
    afterany: Sequence[int] = (),
    cwd: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> str:
    """One task line: `[options] command`. A string is a shell command line as written; a list
    is a program and its arguments, quoted. `cwd` and `env` go in front, as `htc task add` puts
    them."""
    opts = []
    for k in OPTIONS:
        v = options.get(k)
        if v is None:
            continue
        v = _duration(v) if k == "timeout" else str(v)
        if not v or any(c.isspace() for c in v) or "]" in v:
            raise ValueError(f"{k}={v!r}: an option's value is one word")
        opts.append(f"{k}={v}")
    for name, ids in (("after", after), ("afterany", afterany)):
        if ids:
            opts.append(f"{name}={':'.join(str(i) for i in ids)}")
    if isinstance(cmd, str):
        # A script of several lines runs as written, through `eval` of it on one line.
        text = cmd if "\n" not in cmd else f"eval {_quote(cmd)}"
    else:
        text = " ".join(_quote(w) for w in cmd)
    front = ""
    if cwd is not None:
        # Checked here, where the caller sees it, not when the task runs (as `htc task add --cwd`).
        where = os.path.abspath(os.fspath(cwd))
        if not os.path.isdir(where):
            raise ValueError(f"cwd={os.fspath(cwd)!r}: no such directory")
        front += f"cd {_quote(where)} && "
    for name, value in (env or {}).items():
        if not name.isidentifier():
            raise ValueError(f"env: {name!r} is not a variable name")
        front += f"{name}={_quote(value)} "
    text = front + text
    if not text.strip():
        raise ValueError("a task's command is empty")
    if _NL in text:
        text = _NL_DEF + text
    return f"[{' '.join(opts)}] {text}"


# A task's command is one line: a newline in a word is the shell's `$htc_nl`, which `_NL_DEF`
# sets (as `htc task add` quotes it; a command substitution keeps a newline not at its end).
_NL = "'\"$htc_nl\"'"
_NL_DEF = "htc_nl=$(printf '\\n_'); htc_nl=${htc_nl%_}; "


def _quote(word: str) -> str:
    """`word` as one word for `/bin/sh`, on one line."""
    return shlex.quote(word).replace("\n", _NL)


def _duration(v: object) -> str:
    """A timeout: seconds as a number, or a duration as `htc` writes it (90s, 10m)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{max(0.0, float(v)):g}s"
    return str(v)
