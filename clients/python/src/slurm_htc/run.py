"""`Run`: one open run as the `htc` binary reaches it: started here or on Slurm, or attached to;
tasks added in one request, their states asked in one call, cancelled in one, the run closed.
`Executor` (futures) and the Snakemake plugin are both built on it."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import tempfile
import time
from typing import IO, Any, Callable, Dict, List, Mapping, Optional, Sequence

from ._htc import HtcError, call, call_bytes, find_binary, id_ranges

# The state of a task whose record in the run's ledger is damaged: the run cannot vouch for it,
# so a client takes it as failed (never as done, and never leaves it out).
DAMAGED = "damaged"
# The states after which a task changes no more, as a client sees them.
ENDED = ("done", "failed", "cancelled", DAMAGED)
# `htc task status`'s exit status when its answer holds damaged tasks (their rows say so).
DAMAGED_EXIT = 3

# The batch script of the jobs this client submits, as `htc submit` has it: where the plugin is
# loaded the agent runs it as the run's prologue (HTC_PROLOGUE=1) and it does nothing; on a node
# without it Slurm runs it as a plain job, which then fails saying so instead of passing for a run
# that did nothing.
GUARD_SCRIPT = (
    '--wrap=[ "$HTC_PROLOGUE" = 1 ] || { echo "htc: job $SLURM_JOB_ID ran as a plain batch script on '
    "$SLURMD_NODENAME: the slurm-htc plugin is not loaded there (its plugstack line, or spank_htc.so); this job ran none of the run's tasks\" >&2; exit 1; }"
)



class Run:
    """An open run: `Run(id)` attaches to a running one (its id or directory), `Run.start()`
    starts one here (`htc run --open`), `Run.start_slurm({...})` submits `sbatch --htc-open`.
    Each method is one `htc` call; errors raise `HtcError` with what `htc` said."""

    def __init__(self, run: str, *, htc: Optional[str] = None, cwd: Optional[str] = None) -> None:
        self.id = run
        self.binary = find_binary(htc)
        self.cwd = os.fspath(cwd) if cwd is not None else None
        # The leader's process, when this `Run` started it here.
        self.leader: Optional[subprocess.Popen] = None  # type: ignore[type-arg]
        self.started = False

    @classmethod
    def start(
        cls,
        *,
        htc: Optional[str] = None,
        cwd: Optional[str] = None,
        idle_exit: str = "30m",
        timeout: float = 120.0,
        own_session: bool = False,
    ) -> "Run":
        """Starts an open run here, in `cwd`; it ends `idle_exit` after its last task once nothing
        is added (or at `close`). With `own_session`, a Ctrl-C at this terminal does not reach
        the leader: the caller cancels what it wants, as Snakemake does."""
        binary = find_binary(htc)
        log = tempfile.TemporaryFile(mode="w+")
        leader = subprocess.Popen(
            [binary, "run", "--open", "-q", "--idle-exit", idle_exit],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=own_session,
        )
        run = cls(_read_run_id(leader, timeout, log), htc=binary, cwd=cwd)
        run.leader, run.started = leader, True
        return run

    @classmethod
    def start_slurm(
        cls,
        slurm: Mapping[str, Any],
        *,
        htc: Optional[str] = None,
        cwd: Optional[str] = None,
        idle_exit: str = "30m",
        timeout: float = 120.0,
        say: Optional[Callable[[str], None]] = None,
    ) -> "Run":
        """Submits `sbatch --htc-open` (`slurm`: `nodes`, `time`, `grow`, `sbatch_args`) and
        waits until its leader listens: as long as the job is pending (a busy cluster's normal
        wait; `say` is told its state and reason as they change), then at most `timeout` once it
        runs. A job that ends first, a leader that does not come, or a Ctrl-C here: the job is
        cancelled (nothing is left to start later and hold nodes for nobody) and `HtcError`
        (or the `KeyboardInterrupt`) raised."""
        args = ["sbatch", "--parsable", f"--htc-open={idle_exit}"]
        if slurm.get("nodes") is not None:
            args.append(f"--nodes={slurm['nodes']}")
        if slurm.get("time") is not None:
            args.append(f"--time={slurm['time']}")
        if slurm.get("grow"):
            args.append(f"--htc-grow={slurm['grow']}")
        args += [str(a) for a in slurm.get("sbatch_args", ())] + [GUARD_SCRIPT]
        p = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
        if p.returncode != 0:
            raise HtcError(f"sbatch: {p.stderr.strip() or p.returncode}")
        job = p.stdout.strip().split(";")[0]
        addr = os.path.join(cwd or ".", ".htc", job, "leader.addr")
        try:
            run = cls(_wait_slurm_leader(job, addr, timeout, say or (lambda _: None)), htc=htc, cwd=cwd)
        except BaseException:
            subprocess.run(["scancel", job], capture_output=True)
            raise
        run.started = True
        return run

    def keep_alive(self) -> None:
        """Says the client is still there (an empty add): an open run's idle time counts from its
        last task's end or its last add, whichever is later. A run gone is no error here."""
        try:
            self.htc("task", "add", self.id, "--file", "-", input="")
        except HtcError:
            pass

    def check_open(self) -> None:
        """`HtcError` unless the run is running and takes tasks from this user: a run named by a
        user or a record must be one that takes tasks, a clear error now, not a failure of every
        task later. The empty add adds nothing, but a closed run, or another user's, refuses it."""
        info = json.loads(self.htc("status", self.id, "--json"))
        if info.get("state") != "running":
            raise HtcError(f"the run {self.id} is {info.get('state')}: it takes no tasks")
        self.htc("task", "add", self.id, "--file", "-", input="")

    def htc(self, *args: str, input: Optional[str] = None) -> str:
        """`htc ARGS` in the run's working directory; its stdout."""
        return call(self.binary, list(args), cwd=self.cwd, input=input)

    def add(self, lines: Sequence[str], *, key: Optional[str] = None, name: Optional[str] = None) -> List[int]:
        """Adds task lines (`[options] command`) in one request; their ids, in order. With `key`
        (one line), adding again under the same key gives the same id."""
        if not lines:
            return []
        # A key or a name is for one task, which `htc` takes from a file, not from a stream.
        one = key is not None or name is not None
        args = ["task", "add", self.id, "--file", "/dev/stdin" if one else "-"]
        args += ["--key", key] if key is not None else []
        args += ["--name", name] if name is not None else []
        out = self.htc(*args, input="".join(line + "\n" for line in lines))
        ids = [int(w) for w in out.split()]
        if len(ids) != len(lines):
            raise HtcError(f"htc task add: {len(lines)} lines sent, {len(ids)} ids back")
        return ids

    def status(self, ids: Sequence[int]) -> Dict[int, Dict[str, Any]]:
        """The states of `ids` (one call): by id, `{"state", "exit", "reason", ...}` as `htc task
        status --format json` gives them; a task whose record is damaged has state `damaged`."""
        if not ids:
            return {}
        args = ["task", "status", self.id, "--format", "json", *id_ranges(ids)]
        out = call(self.binary, args, cwd=self.cwd, ok=(0, DAMAGED_EXIT))
        rows = (json.loads(line) for line in out.splitlines())
        return {int(row["id"]): row for row in rows}

    def cancel(self, ids: Sequence[int]) -> None:
        """Cancels `ids` (one call): what waits never starts, what runs is stopped."""
        if ids:
            self.htc("task", "cancel", self.id, *id_ranges(ids))

    def output_bytes(self, task_id: int, stream: str = "stdout") -> bytes:
        """A task's stdout or stderr, the bytes the run kept."""
        # `htc output --stderr` writes the task's stderr on its own stderr.
        err = stream == "stderr"
        args = ["output", self.id, str(task_id), "--stderr" if err else "--stdout"]
        return call_bytes(self.binary, args, cwd=self.cwd, stderr=err)

    def output(self, task_id: int, stream: str = "stdout", *, errors: str = "strict") -> str:
        """A task's stdout or stderr as UTF-8 text, decoded with `errors` as `bytes.decode`
        takes it (`strict` raises `UnicodeDecodeError` on bytes that are not UTF-8; `replace`,
        `surrogateescape`, ... do not)."""
        return self.output_bytes(task_id, stream).decode("utf-8", errors)

    def close(self, *, wait: bool = False, cancel: bool = False) -> None:
        """The run takes no more tasks and ends once what it holds is done (with `cancel`: what
        it holds is cancelled); with `wait`, returns then (when it was started here). A run
        already ended is no error."""
        try:
            self.htc("close", self.id, *(["--cancel"] if cancel else []))
        except HtcError:
            pass
        if wait and self.leader is not None:
            self.leader.wait()


def read_record(path: str) -> str:
    """The run id a record file (`write_record`) names; empty when there is none."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def write_record(path: str, run_id: str) -> None:
    """Notes `run_id` in `path` (its directory made), whole or not at all: how a client finds the
    run it started again after a crash."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".new", "w") as f:
        f.write(run_id + "\n")
    os.replace(path + ".new", path)


def drop_record(path: str, run_id: str) -> None:
    """Removes the record, if it still names `run_id` (its run was closed)."""
    if read_record(path) == run_id:
        os.unlink(path)


# How often a pending job's state is asked of Slurm: from the first to the last, doubling (one
# `squeue` call each: a long wait costs the controller a few calls a minute).
QUEUE_FIRST_S, QUEUE_MAX_S = 1.0, 15.0


def _wait_slurm_leader(job: str, addr: str, timeout: float, say: Callable[[str], None]) -> str:
    """The run id of Slurm job `job` once its leader listens (it writes `addr`): waited for as
    long as the job is pending, then `timeout` at most."""
    said, pause, next_look = "", QUEUE_FIRST_S, 0.0
    running_since: Optional[float] = None
    while True:
        if os.path.exists(addr):
            return job
        now = time.monotonic()
        if now >= next_look:
            q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True)
            state, _, reason = q.stdout.strip().partition(" ")
            if not state and (q.returncode == 0 or "Invalid job id" in q.stderr):
                state = "ENDED"  # gone from the queue
            if state in ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED"):
                running_since = None
            elif state in ("RUNNING", "SIGNALING"):  # signalled: still running
                running_since = running_since or now
            elif state:
                raise HtcError(
                    f"the Slurm job {job} of the open run ended ({state.lower()}) before its leader "
                    f"listened; see slurm-{job}.out"
                )
            # No state: the controller did not answer; asked again later.
            news = f"the Slurm job {job} of the open run is {state.lower()}"
            news += f" ({reason})" if reason and reason != "None" else ""
            changed = bool(state) and news != said
            if changed:
                say(news)
                said = news
            pause = QUEUE_FIRST_S if changed else min(pause * 2, QUEUE_MAX_S)
            next_look = now + pause
        if running_since is not None and now - running_since > timeout:
            raise HtcError(f"the open run's leader did not start within {timeout:g} s of its Slurm job {job} running")
        time.sleep(0.05)


def _read_run_id(
    leader: subprocess.Popen,  # type: ignore[type-arg]
    timeout: float,
    log: IO[str],
) -> str:
    """The id `htc run --open` prints on stdout, one line, once its leader listens (its only
    line there; docs/open-runs.md), read within `timeout`. A leader that ends first, or says
    nothing in time (then killed), is an `HtcError` with what it wrote on stderr."""
    out = leader.stdout
    assert out is not None
    line = b""
    with selectors.DefaultSelector() as sel:
        sel.register(out, selectors.EVENT_READ)
        end = time.monotonic() + timeout
        while not line.endswith(b"\n"):
            left = end - time.monotonic()
            if left <= 0 or not sel.select(left):
                break
            chunk = os.read(out.fileno(), 256)
            if not chunk:  # it ended
                break
            line += chunk
    out.close()
    if line.endswith(b"\n"):
        return line.decode().strip()
    if leader.poll() is None:
        leader.kill()
        leader.wait()
    log.seek(0)
    said = log.read().strip()
    raise HtcError(f"the open run's leader did not start: {said or 'no leader listened in time'}")
