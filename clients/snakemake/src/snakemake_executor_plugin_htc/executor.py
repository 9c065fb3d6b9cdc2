"""`snakemake --executor htc`: Snakemake's jobs as tasks of one slurm-htc open run.

Every ready job goes in one `htc task add` request; the states of all active jobs come from one
`htc task status` per poll; a cancel is one `htc task cancel`. The run is started here (`htc run
--open`) or on Slurm (`sbatch --htc-open`), or attached to (`--htc-run`). A job whose output
Snakemake marked incomplete with one of our task ids (Snakemake was killed) is taken up again,
with `--rerun-incomplete` or without: still running, it is waited for; done, it is reported so;
failed, it is added anew. The run itself is started with the first job (a workflow with nothing
to do starts nothing) and noted in `.snakemake/htc/run`: the next Snakemake uses a run that a
killed one left open, and closes it at its end. A second Ctrl-C does not cut a cancel short.
SIGTERM is Snakemake's, as with the local executor: no more jobs start, those submitted are
waited for and recorded, the run is closed, and Snakemake exits 1; from the first jobs on, its
handler runs in a thread of its own, so that a SIGTERM cannot hang Snakemake (see `_Terminate`).
"""

import json
import os
import queue
import signal
import threading
import time
from collections import defaultdict
from typing import Any, AsyncGenerator, Dict, List, Optional, Tuple

from slurm_htc import DAMAGED, HtcError, Run, drop_record, read_record, write_record
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface

from . import tasks

# Polls come this often after a change, doubling to the last while nothing changes; with many
# jobs active, no more often than `POLL_PER_JOB_S` each (the leader answers ~1 µs per id).
POLL_FIRST_S, POLL_MAX_S, POLL_PER_JOB_S = 0.01, 1.0, 20e-6
# After this long without a change, whether the run still has a leader is asked too.
LIVENESS_S = 10.0
# How often a living Snakemake tells its run so (`--htc-idle-exit` is 10 s by default).
KEEP_ALIVE_S = 3.0
# States of a run in which its waiting tasks will not run (`htc status --json`).
GONE = ("interrupted", "succeeded", "failed", "not_started")
# Where a Snakemake notes the run it started, in its working directory: the next one uses that
# run if this one was killed and left it open (Snakemake's lock keeps two from one directory).
RECORD = os.path.join(".snakemake", "htc", "run")


def external_id(run: Run, task_id: int) -> str:
    return f"{run.id}/{task_id}"


def parse_external_id(text: str) -> Optional[Tuple[str, int]]:
    """`RUN/ID` as `external_id` writes it; `None` for another executor's id."""
    run, _, tid = text.rpartition("/")
    return (run, int(tid)) if run and tid.isdigit() else None


class Executor(RemoteExecutor):  # type: ignore[misc]  # (the interface is untyped)
    # The base class starts polling before `__post_init__` runs: these hold from the start.
    _runs: Dict[str, Run] = {}
    _run_: Optional[Run] = None
    _owned = False
    _pause = POLL_FIRST_S
    _changed_at = _live_at = 0.0

    def __post_init__(self) -> None:
        s = self.workflow.executor_settings
        self._workdir: str = self.workflow.workdir_init
        self._binary = s.binary
        # The run, started (or found) with the first job: a workflow with nothing to do starts
        # nothing, on this machine or on Slurm.
        self._run_: Optional[Run] = None
        # Whether this Snakemake closes the run when it ends: one it started, or one a killed
        # Snakemake of this directory started and left (recorded in `RECORD`); not `--htc-run`.
        self._owned = False
        # Runs a job's task may be in: ours, and those a killed Snakemake left tasks in.
        self._runs = {}
        # Jobs submitted that have not ended, by external id: the active jobs, and those a status
        # check holds meanwhile (Snakemake takes them out of its list while it checks).
        self._out: Dict[str, SubmittedJobInfo] = {}
        self._changed_at = self._live_at = time.monotonic()
        self._gone: Dict[str, int] = defaultdict(int)
        self._stop = threading.Event()
        self._interrupts = _Interrupts(self.logger)
        self._interrupts.install()
        # Snakemake's scheduler sets its SIGTERM handler after this executor is made: it is taken
        # over with the first jobs (`run_jobs`, in the main thread), before any task exists.
        self._terminate = _Terminate()

    @property
    def _run(self) -> Run:
        if self._run_ is None:
            try:
                self._run_ = self._open_run()
            except HtcError as e:
                raise WorkflowError(f"slurm-htc: {e}")
            self._runs[self._run_.id] = self._run_
            threading.Thread(target=self._keep_alive, args=(self._run_,), name="htc-keep-alive", daemon=True).start()
        return self._run_

    def _keep_alive(self, run: Run) -> None:
        """While this Snakemake lives, the run it uses is told so (its idle time counts from then):
        a Snakemake killed leaves an idle run, or allocation, for `--htc-idle-exit` only."""
        while not self._stop.wait(KEEP_ALIVE_S):
            run.keep_alive()

    def _open_run(self) -> Run:
        """`--htc-run`'s run; else the open run a killed Snakemake of this directory left, if it
        still takes tasks; else a new one, here or on Slurm, recorded for the next Snakemake."""
        s = self.workflow.executor_settings
        if s.run:
            run = Run(s.run, htc=self._binary, cwd=self._workdir)
            run.check_open()
            self.logger.info(f"slurm-htc: jobs go to the open run {run.id}")
            return run
        record = os.path.join(self._workdir, RECORD)
        left = read_record(record)
        if left:
            try:
                run = Run(left, htc=self._binary, cwd=self._workdir)
                run.check_open()
                self._owned = True
                self.logger.info(f"slurm-htc: jobs go to the open run {run.id}, which a killed Snakemake started")
                return run
            except HtcError as e:
                self.logger.debug(f"slurm-htc: the run {left} an earlier Snakemake left: {e}")
        slurm = {"nodes": s.nodes, "time": s.time, "grow": s.grow, "sbatch_args": (s.sbatch_args or "").split()}
        if s.nodes:
            run = Run.start_slurm(slurm, htc=self._binary, cwd=self._workdir, idle_exit=s.idle_exit, say=self.logger.info)
        else:
            run = Run.start(htc=self._binary, cwd=self._workdir, idle_exit=s.idle_exit, own_session=True)
        self._owned = True
        write_record(record, run.id)
        self.logger.info(f"slurm-htc: jobs go to the open run {run.id}")
        return run

    # -- submitting ------------------------------------------------------------------------

    def run_job(self, job: JobExecutorInterface) -> None:
        self.run_jobs([job])

    def run_jobs(self, jobs: List[JobExecutorInterface]) -> None:
        """All ready jobs in one request."""
        self._terminate.install()
        added: List[JobExecutorInterface] = []
        lines: List[str] = []
        for job in jobs:
            self.run_job_pre(job)
            if self._take_up(job):
                continue
            try:
                lines.append(self._line(job))
                added.append(job)
            except (WorkflowError, ValueError, OSError) as e:
                self.report_job_error(SubmittedJobInfo(job), msg=f"slurm-htc: {e}")
        try:
            ids: List[Optional[int]] = list(self._run.add(lines))
        except HtcError:
            # One bad line refuses the whole request: each job alone, so that only it fails.
            ids = [self._add_alone(job, line) for job, line in zip(added, lines)]
        for job, task_id in zip(added, ids):
            if task_id is not None:
                self._submitted(SubmittedJobInfo(job, external_jobid=external_id(self._run, task_id)))
        self._pause = POLL_FIRST_S

    def _submitted(self, info: SubmittedJobInfo) -> None:
        """A job is a task now: Snakemake is told, and it is this executor's until it ended."""
        self._out[info.external_jobid] = info
        self.report_job_submission(info)

    def _add_alone(self, job: JobExecutorInterface, line: str) -> Optional[int]:
        try:
            return self._run.add([line])[0]
        except HtcError as e:
            self.report_job_error(SubmittedJobInfo(job), msg=f"slurm-htc: the run took no task: {e}")
            return None

    def _line(self, job: JobExecutorInterface) -> str:
        direct = None if self.workflow.executor_settings.spawn_snakemake else tasks.direct_command(job, self.workflow)
        if direct is None:
            return tasks.line(job, "/bin/sh", self.format_job_exec(job), self._workdir, self.tmpdir, spawned=True)
        # As the local executor does before it runs a rule: output directories made, old
        # outputs removed, inputs waited for (the spawned Snakemake would do it otherwise).
        self.workflow.async_run(job.prepare())
        executable, command = direct
        return tasks.line(job, executable, command, self._workdir, self.tmpdir)

    def _take_up(self, job: JobExecutorInterface) -> bool:
        """A task a killed Snakemake left for this job: waited for (true), or out of the way."""
        ours = [p for p in map(parse_external_id, self.workflow.persistence.external_jobids(job)) if p]
        if len(ours) != 1:
            return False
        run_id, task_id = ours[0]
        try:
            run = self._runs.get(run_id) or Run(run_id, htc=self._binary, cwd=self._workdir)
            row = run.status([task_id]).get(task_id)
        except HtcError:
            return False  # that run is gone: the job runs anew
        if row is None or row["state"] in ("failed", "cancelled", DAMAGED):
            return False
        # With or without --rerun-incomplete: its task is the job's run, still going or done;
        # running it anew beside it would write its outputs twice at once.
        self._runs[run.id] = run
        self.logger.info(f"slurm-htc: job {job.jobid} is task {task_id} of {run.id}, left by an earlier Snakemake")
        self._submitted(SubmittedJobInfo(job, external_jobid=external_id(run, task_id)))
        return True

    # -- states ----------------------------------------------------------------------------

    async def check_active_jobs(
        self, active_jobs: List[SubmittedJobInfo]
    ) -> AsyncGenerator[SubmittedJobInfo, None]:
        """One `htc task status` per run (there is one, unless a killed Snakemake left tasks in
        another) for all active jobs."""
        by_run: Dict[str, List[Tuple[int, SubmittedJobInfo]]] = defaultdict(list)
        for info in active_jobs:
            parsed = parse_external_id(info.external_jobid or "")
            assert parsed is not None, info.external_jobid
            by_run[parsed[0]].append((parsed[1], info))
        changed = False
        for run_id, items in by_run.items():
            run = self._runs[run_id]
            try:
                async with self.status_rate_limiter:
                    rows = run.status([t for t, _ in items])
            except HtcError as e:
                # Between two leaders (a hand-over), or the run gone: the liveness check decides.
                self.logger.debug(f"slurm-htc: status of {run_id}: {e}")
                rows = {}
            gone = self._gone_reason(run) if time.monotonic() - self._changed_at > LIVENESS_S else None
            for task_id, info in items:
                row = rows.get(task_id)
                state = row["state"] if row else None
                if state == "done":
                    self.report_job_success(info)
                elif state in ("failed", "cancelled", DAMAGED):
                    self.report_job_error(info, msg=self._why(run, task_id, row or {}))
                elif gone is not None:
                    self.report_job_error(info, msg=f"slurm-htc: task {task_id} will not run: {gone}")
                else:
                    yield info
                    continue
                self._out.pop(info.external_jobid, None)
                changed = True
        self._pace(changed, len(active_jobs))

    def _pace(self, changed: bool, active: int) -> None:
        now = time.monotonic()
        least = max(POLL_FIRST_S, POLL_PER_JOB_S * active)
        if changed:
            self._changed_at = now
            self._pause = least
        else:
            self._pause = min(max(self._pause, least) * 2, max(POLL_MAX_S, least))
        self.next_seconds_between_status_checks = self._pause

    def _gone_reason(self, run: Run) -> Optional[str]:
        """Why `run`'s waiting tasks will not run, once it was seen without a leader twice, at
        least `LIVENESS_S` apart; `None` while it runs."""
        if time.monotonic() - self._live_at < LIVENESS_S:
            return None
        self._live_at = time.monotonic()
        try:
            state = json.loads(run.htc("status", run.id, "--json")).get("state")
        except (HtcError, ValueError):
            state = "unreadable"
        if state not in GONE and state != "unreadable":
            self._gone[run.id] = 0
            return None
        self._gone[run.id] += 1
        if self._gone[run.id] < 2:
            return None
        return f"the run {run.id} is {state} (`htc run --resume` or `scontrol requeue` continues it)"

    def _why(self, run: Run, task_id: int, row: Dict[str, Any]) -> str:
        reason = row.get("reason") or row.get("state") or "failed"
        text = f"slurm-htc: task {task_id} of {run.id}: {reason}"
        try:
            # A job's stderr need not be text: the report of its failure must not fail.
            err = run.output(task_id, "stderr", errors="replace").strip()
        except HtcError:
            err = ""
        if err:
            tail = "\n".join(err.splitlines()[-20:])
            text += f"\nits stderr (the end; all of it: htc output {run.id} {task_id} --stderr):\n{tail}\n"
        return text

    # -- the end ---------------------------------------------------------------------------

    def cancel(self) -> None:
        """Snakemake's Ctrl-C: the jobs cancelled, their books closed, the run closed, all of it
        whatever more Ctrl-Cs come meanwhile (an impatient user's second one would otherwise leave
        finished jobs marked incomplete, to run again, and the run open)."""
        self._interrupts.patient()
        # The status checks stop first: nothing is reported meanwhile.
        with self.lock:
            self.wait = False
        self.wait_thread.join()
        active = list(self._out.values())
        self.cancel_jobs(active)
        self._close_the_rest(active)
        if self._owned and self._run_ is not None:
            # What a request cut short by the Ctrl-C added, unknown to Snakemake, stops too.
            self._run_.close(cancel=True)
        self.shutdown()

    def _close_the_rest(self, active: List[SubmittedJobInfo]) -> None:
        """The books of the jobs the Ctrl-C caught between Snakemake's scheduler and this
        executor: those reported done that the scheduler had not closed yet (it closes them in
        its next round, which a Ctrl-C ends) are closed as done; those it had started that were
        never submitted (the Ctrl-C came during their `htc task add`) as not done. Else they are
        left marked incomplete, and the next Snakemake refuses to start or runs them again."""
        scheduler = getattr(self.workflow, "scheduler", None)
        finished = list(getattr(scheduler, "_tofinish", None) or ())
        for job in finished:
            self._close_job(job, True)
        seen = {id(info.job) for info in active} | {id(job) for job in finished}
        seen |= {id(job) for job in getattr(scheduler, "_toerror", None) or ()}
        for job in list(getattr(scheduler, "running", None) or ()):
            if id(job) not in seen and not getattr(job, "is_local", False):
                self._close_job(job, False)

    def cancel_jobs(self, active_jobs: List[SubmittedJobInfo]) -> None:
        """One `htc task cancel` per run for all active jobs; then each job's books are closed
        as the local executor leaves them after a Ctrl-C: a job whose task had ended well is
        recorded as done, any other has its outputs and its incomplete mark removed. A new
        Snakemake then runs only what is missing, without `--rerun-incomplete`."""
        by_run: Dict[str, List[Tuple[int, SubmittedJobInfo]]] = defaultdict(list)
        for info in active_jobs:
            parsed = parse_external_id(info.external_jobid or "")
            if parsed:
                by_run[parsed[0]].append((parsed[1], info))
        for run_id, items in by_run.items():
            run = self._runs[run_id]
            ids = [t for t, _ in items]
            try:
                run.cancel(ids)
                rows = run.status(ids)
            except HtcError as e:
                self.logger.info(f"slurm-htc: cancel in {run_id}: {e}")
                continue
            for task_id, info in items:
                self._close_books(info, rows.get(task_id, {}).get("state") == "done")

    def _close_books(self, info: SubmittedJobInfo, done: bool) -> None:
        self._close_job(info.job, done)

    def _close_job(self, job: Any, done: bool) -> None:
        if done:
            try:
                self.workflow.async_run(job.postprocess())
                return
            except Exception as e:  # its outputs are not there after all: cleaned up below
                self.logger.debug(f"slurm-htc: job {job.jobid}: {e}")
        try:
            self.workflow.async_run(job.postprocess(error=True))
        except Exception as e:
            self.logger.info(f"slurm-htc: job {job.jobid} left incomplete: {e}")

    def shutdown(self) -> None:
        self._interrupts.patient()
        self._shutdown()
        self._interrupts.uninstall()
        self._terminate.uninstall()

    def _shutdown(self) -> None:
        super().shutdown()
        self._stop.set()
        run = self._run_
        if run is None or not self._owned:
            return
        # Ends once what it holds is done; a run Snakemake was cancelled from holds nothing.
        run.close()
        drop_record(os.path.join(self._workdir, RECORD), run.id)
        if run.leader is not None:
            try:
                run.leader.wait(timeout=30)
            except Exception:  # subprocess.TimeoutExpired: it ends on its own later
                pass


# Ctrl-Cs past the first that are noted, not raised, while the jobs are cancelled and their books
# closed; the next one stops Snakemake at once (jobs may be left marked incomplete then).
PATIENCE = 3


class _Interrupts:
    """SIGINT for a Snakemake whose jobs are remote: the first Ctrl-C is a `KeyboardInterrupt`, as
    always (Snakemake then cancels the jobs); the next `PATIENCE` are noted, so that an impatient
    user's second Ctrl-C cannot cut the cancel short, which would leave finished jobs marked
    incomplete (to run again) and the run open."""

    def __init__(self, logger: Any) -> None:
        self.logger, self.count = logger, 0
        self.before: Any = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.before = signal.signal(signal.SIGINT, self.caught)

    def uninstall(self) -> None:
        """The handler there was before, once Snakemake's run is over (it may go on in-process)."""
        if self.before is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self.before)
            self.before = None

    def patient(self) -> None:
        """From now on, a Ctrl-C is noted (up to `PATIENCE`), not raised: a cancel or the close
        of the books is under way."""
        self.count = max(self.count, 1)

    def caught(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1 or self.count > PATIENCE + 1:
            raise KeyboardInterrupt
        left = PATIENCE + 1 - self.count
        self.logger.info(
            "slurm-htc: cancelling the jobs and closing their books; Snakemake ends once that is done"
            f" ({left} more Ctrl-C to stop at once, leaving jobs marked incomplete)"
        )


class _Terminate:
    """SIGTERM for a Snakemake whose jobs are remote: Snakemake's own handler (the scheduler's
    `exit_gracefully`: no more jobs start, those running are waited for and recorded, then
    Snakemake exits 1, as with the local executor), run in a thread of its own. Run as the signal
    handler, in the main thread, it takes the scheduler's lock, which that same thread holds while
    it selects jobs or records finished ones: a SIGTERM then hangs Snakemake for good, with its
    run kept alive and its tasks' ends never recorded. Here the handler only queues the signal
    (`SimpleQueue.put` is safe in a signal handler) and the thread waits for the lock."""

    def __init__(self) -> None:
        self.before: Any = None
        self.signals: "queue.SimpleQueue[Optional[int]]" = queue.SimpleQueue()

    def install(self) -> None:
        if self.before is not None or threading.current_thread() is not threading.main_thread():
            return
        before = signal.getsignal(signal.SIGTERM)
        if not callable(before):  # no Python handler (SIG_DFL, SIG_IGN): nothing to take over
            return
        self.before = before
        threading.Thread(target=self._deliver, args=(before,), name="htc-sigterm", daemon=True).start()
        signal.signal(signal.SIGTERM, self.caught)

    def uninstall(self) -> None:
        if self.before is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.before)
            self.before = None
            self.signals.put(None)

    def caught(self, signum: int, frame: Any) -> None:
        self.signals.put(signum)

    def _deliver(self, handler: Any) -> None:
        while (signum := self.signals.get()) is not None:
            handler(signum, None)
