"""The Executor against real open runs of the real `htc` ($HTC, or target/release/htc of this
repository): results and outputs, failures with their reason, dependencies, cancels, keys, and
the run's close at shutdown."""

from __future__ import annotations

import concurrent.futures as cf
import os
import pathlib
import subprocess
import sys
import time
from typing import List

import pytest

from slurm_htc import Executor, HtcError, Run, TaskFailed, TaskResult

ROOT = pathlib.Path(__file__).resolve().parents[3]
HTC = os.environ.get("HTC") or str(ROOT / "target" / "release" / "htc")


@pytest.fixture
def ex(tmp_path: pathlib.Path):
    with Executor(htc=HTC, cwd=str(tmp_path)) as e:
        yield e


def test_many_submits_resolve_with_their_exit_and_output(ex: Executor) -> None:
    futures = [ex.submit(f"echo task-{i}") for i in range(200)]
    done = list(cf.as_completed(futures, timeout=120))
    assert len(done) == 200
    ids = sorted(f.result().task_id for f in futures)
    assert ids == list(range(1, 201)), "one task each, every id once"
    r = futures[7].result()
    assert isinstance(r, TaskResult) and r.exit_code == 0
    assert r.stdout() == "task-7\n"


def test_a_task_may_ask_for_every_core_of_the_run_s_agent(ex: Executor) -> None:
    # An open run's agents cannot know how wide its tasks will be: a loop per CPU would refuse
    # one of several cores ("could not start: Argument list too long", as it once did).
    wide = ex.submit("nproc", cores=len(os.sched_getaffinity(0)))
    one = ex.submit("true", cores=1)
    assert wide.result(timeout=60).exit_code == 0 and one.result(timeout=60).exit_code == 0


def test_cancelling_a_finished_task_is_no_error_and_changes_nothing(ex: Executor) -> None:
    f = ex.submit("true")
    tid = f.result(timeout=60).task_id
    assert f.cancel() is False, "a future that ended cannot be cancelled"
    run = Run(ex.run, htc=HTC, cwd=ex._run.cwd)
    run.cancel([tid])  # as Snakemake's cancel of jobs that ended meanwhile does
    assert run.status([tid])[tid]["state"] == "done"


def test_a_program_and_its_arguments_are_quoted_and_stderr_is_kept(ex: Executor) -> None:
    f = ex.submit(["sh", "-c", 'echo "$1 $2" >&2', "sh", "two words", "it's"])
    assert f.result(timeout=60).stderr() == "two words it's\n"


def test_arguments_and_scripts_holding_newlines_run_as_given(ex: Executor, tmp_path: pathlib.Path) -> None:
    words = ["a\nb", "\nx\n\n", "it's\n"]
    f = ex.submit(["printf", "[%s]", *words], env={"V": "1\n2"})
    assert f.result(timeout=60).stdout() == "".join(f"[{w}]" for w in words)
    script = ex.submit('printf "%s|" "$V"\necho second line', env={"V": "p\nq"}, cwd=tmp_path)
    assert script.result(timeout=60).stdout() == "p\nq|second line\n"


def test_a_failure_raises_with_the_run_s_reason_and_cancels_what_waits_for_it(ex: Executor) -> None:
    bad = ex.submit("exit 3", retries=0)
    after = ex.submit("true", after=[bad])
    anyway = ex.submit("echo ran", afterany=[bad])
    with pytest.raises(TaskFailed) as e:
        bad.result(timeout=60)
    assert e.value.exit_code == 3 and "exit 3" in e.value.reason
    with pytest.raises(TaskFailed) as e:
        after.result(timeout=60)
    assert f"task {bad.task_id} did not succeed" in e.value.reason, e.value.reason
    assert anyway.result(timeout=60).stdout() == "ran\n"


def test_after_orders_the_tasks(ex: Executor, tmp_path: pathlib.Path) -> None:
    first = ex.submit(f"sleep 0.3; echo first >> {tmp_path}/order")
    second = ex.submit(f"echo second >> {tmp_path}/order", after=[first])
    second.result(timeout=60)
    assert (tmp_path / "order").read_text() == "first\nsecond\n"


def test_map_commands_gives_results_in_order(ex: Executor) -> None:
    out = [r.stdout() for r in ex.map_commands(lambda i: f"echo {i * i}", range(5), timeout=60)]
    assert out == ["0\n", "1\n", "4\n", "9\n", "16\n"]


def test_cancel_stops_a_running_task_and_wait_sees_it(ex: Executor) -> None:
    long = ex.submit("sleep 600")
    long.wait_id(timeout=30)
    time.sleep(0.5)
    assert long.cancel()
    assert long.cancelled()
    done, not_done = cf.wait([long], timeout=5)
    assert long in done and not not_done
    state = subprocess.run([HTC, "task", "status", ex.run, str(long.task_id)], cwd=ex._run.cwd,
                           capture_output=True, text=True)
    deadline = time.monotonic() + 30
    while "cancelled" not in state.stdout and time.monotonic() < deadline:
        time.sleep(0.1)
        state = subprocess.run([HTC, "task", "status", ex.run, str(long.task_id)], cwd=ex._run.cwd,
                               capture_output=True, text=True)
    assert "\tcancelled\t" in state.stdout, state


def test_a_key_adds_a_task_once_and_a_name_is_shown(ex: Executor) -> None:
    a = ex.submit("echo keyed", key="job-1", name="the keyed one")
    b = ex.submit("echo keyed", key="job-1")
    assert a.wait_id(30) == b.wait_id(30)
    a.result(timeout=60)
    out = subprocess.run([HTC, "task", "status", ex.run, str(a.task_id)], cwd=ex._run.cwd,
                         capture_output=True, text=True).stdout
    assert out.rstrip("\n").split("\t")[-1] == "the keyed one"


def test_bad_options_are_refused_before_anything_is_sent(ex: Executor) -> None:
    with pytest.raises(TypeError):
        ex.submit("true", threads=2)
    with pytest.raises(ValueError):
        ex.submit("true", mem="1 G")
    with pytest.raises(ValueError):
        ex.submit("  ")


def test_a_refused_line_fails_its_future_and_the_next_submit_works(ex: Executor) -> None:
    bad = ex.submit("true", mem="lots")
    with pytest.raises(HtcError) as e:
        bad.result(timeout=60)
    assert "mem" in str(e.value)
    assert ex.submit("true").result(timeout=60).exit_code == 0


def test_shutdown_closes_the_run_it_started(tmp_path: pathlib.Path) -> None:
    ex = Executor(htc=HTC, cwd=str(tmp_path))
    f = ex.submit("sleep 0.2")
    ex.shutdown(wait=True)
    assert f.done() and f.result().exit_code == 0
    assert ex._run.leader is not None and ex._run.leader.returncode == 0, "the run ended: closed, all done"
    with pytest.raises(RuntimeError):
        ex.submit("true")


def test_an_executor_attaches_to_a_running_run_and_leaves_it_open(tmp_path: pathlib.Path) -> None:
    with Executor(htc=HTC, cwd=str(tmp_path)) as owner:
        with Executor(owner.run, htc=HTC, cwd=str(tmp_path)) as guest:
            assert guest.submit("true").result(timeout=60).exit_code == 0
        assert owner.submit("true").result(timeout=60).task_id == 2, "still open after the guest left"


def test_an_unknown_run_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    ex = Executor("no-such-run", htc=HTC, cwd=str(tmp_path))
    with pytest.raises(HtcError):
        ex.submit("true", key="k").result(timeout=30)
    ex.shutdown()


def _damage_record(ledger: pathlib.Path, task_id: int) -> int:
    """Flips a byte of each stored entry keyed by `task_id` (an 8-byte big-endian key after its
    LMDB node header's key size), as damaged storage would; how many it flipped."""
    data = bytearray(ledger.read_bytes())
    pattern = b"\x08\x00" + task_id.to_bytes(8, "big")
    flipped, at = 0, data.find(pattern)
    while at >= 0:
        data[at + len(pattern) + 2] ^= 0x10
        flipped += 1
        at = data.find(pattern, at + 1)
    ledger.write_bytes(bytes(data))
    return flipped


def test_a_task_whose_record_is_damaged_fails_its_future_and_is_not_left_out(tmp_path: pathlib.Path) -> None:
    ex = Executor(htc=HTC, cwd=str(tmp_path))
    try:
        ok = ex.submit("true")
        ok.result(timeout=60)
        stuck = ex.submit("sleep 60")
        time.sleep(0.5)
        leader = ex._run.leader
        assert leader is not None
        leader.kill()  # the run's leader dies: the executor reads the ledger from now on
        leader.wait()
        assert _damage_record(tmp_path / ".htc" / ex.run / "ledger.mdb", 2) > 0
        with pytest.raises(TaskFailed, match="damaged"):
            stuck.result(timeout=30)
        rows = Run(ex.run, htc=HTC, cwd=str(tmp_path)).status([1, 2])
        assert rows[1]["state"] == "done" and rows[2]["state"] == "damaged", rows
    finally:
        ex.shutdown(wait=False)


def test_output_that_is_not_utf8_is_there_as_bytes_and_as_text_with_the_errors_chosen(ex: Executor) -> None:
    r = ex.submit(["printf", "caf\\351\\n"]).result(timeout=60)
    assert r.stdout_bytes() == b"caf\xe9\n"
    with pytest.raises(UnicodeDecodeError):
        r.stdout()
    assert r.stdout(errors="replace") == "caf\ufffd\n"
    assert r.stdout(errors="surrogateescape").encode("utf-8", "surrogateescape") == b"caf\xe9\n"
    e = ex.submit(["sh", "-c", "printf '\\377' >&2"]).result(timeout=60)
    assert e.stderr_bytes() == b"\xff"


CRASHING = """
import os, sys
from slurm_htc import Executor
ex = Executor(htc=sys.argv[1], cwd=sys.argv[2], record=sys.argv[3])
print(ex.run, flush=True)
quick = ex.submit("echo quick >> runs.txt", key="quick")
slow = ex.submit("sleep 2; echo slow >> runs.txt", key="slow")
if sys.argv[4] == "crash":
    quick.result(timeout=60)
    os._exit(9)  # a crash: no shutdown, the run left open
print(quick.result(timeout=60).task_id, slow.result(timeout=60).task_id, flush=True)
ex.shutdown()
"""


def test_a_program_restarted_after_a_crash_finds_its_run_and_its_keyed_tasks(tmp_path: pathlib.Path) -> None:
    record = str(tmp_path / "run.txt")

    def program(mode: str) -> List[str]:
        p = subprocess.run(
            [sys.executable, "-c", CRASHING, HTC, str(tmp_path), record, mode],
            capture_output=True, text=True, timeout=120,
        )
        assert p.returncode == (9 if mode == "crash" else 0), p.stderr
        return p.stdout.split()

    [first] = program("crash")
    assert open(record).read().strip() == first, "the run it started is noted"
    run, quick, slow = program("again")
    assert run == first, "the restarted program uses the run it had started"
    assert (quick, slow) == ("1", "2"), "the keys found the same tasks"
    assert sorted((tmp_path / "runs.txt").read_text().split()) == ["quick", "slow"], "each ran once"
    assert not os.path.exists(record), "the record goes with the run, closed at shutdown"
    info = subprocess.run([HTC, "status", run, "--json"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert '"state":"running"' not in info, info


KEPT = """
import os, sys, time
from slurm_htc import Executor
ex = Executor(htc=sys.argv[1], cwd=sys.argv[2], idle_exit="3s")
ex.submit("true").result(timeout=60)
time.sleep(5)  # idle past the run's idle time, alive: the run is kept
ex.submit("true").result(timeout=60)
print(ex.run, flush=True)
os._exit(9)  # killed: nobody keeps the run any more
"""


def test_a_run_is_kept_while_its_client_lives_and_ends_soon_after_it_is_killed(tmp_path: pathlib.Path) -> None:
    p = subprocess.run([sys.executable, "-c", KEPT, HTC, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 9, p.stderr
    run = p.stdout.strip()
    t0 = time.monotonic()

    def state() -> str:
        out = subprocess.run([HTC, "status", run, "--json"], cwd=tmp_path, capture_output=True, text=True).stdout
        return out.split('"state":"', 1)[1].split('"', 1)[0]

    while state() == "running" and time.monotonic() - t0 < 30:
        time.sleep(0.2)
    assert state() == "succeeded", "the orphan run ended by itself"
    assert time.monotonic() - t0 < 3 + 4, "within its idle time of the client's last word"


def test_runs_started_side_by_side_each_know_their_own_id(tmp_path: pathlib.Path) -> None:
    # The id comes from the run's own stdout, not from the directory: two runs of one directory
    # started at once each get theirs.
    runs = [Run.start(htc=HTC, cwd=str(tmp_path), idle_exit="0") for _ in range(3)]
    try:
        assert len({r.id for r in runs}) == 3
        for r in runs:
            assert r.leader is not None and r.id.endswith(f"-{r.leader.pid}")
            assert len(r.add(["true"])) == 1
    finally:
        for r in runs:
            r.close(wait=True)


def test_a_run_that_cannot_start_says_why(tmp_path: pathlib.Path) -> None:
    (tmp_path / ".htc").write_text("")  # where the run's directory would go
    with pytest.raises(HtcError, match=r"the open run's leader did not start: htc: creating .*\.htc/"):
        Run.start(htc=HTC, cwd=str(tmp_path), timeout=30)


def test_a_command_s_mem_grows_on_the_retry_and_retry_on_leaves_other_failures_alone(
    ex: Executor, tmp_path: pathlib.Path
) -> None:
    # 100 MiB held: the first attempt (40M) runs out of memory, the second (160M) succeeds.
    hold = "perl -e 'my $x; vec($x, (100 << 20) - 1, 8) = 1; select(undef, undef, undef, 0.3)'"
    grows = ex.submit(f"{hold} && echo $HTC_ATTEMPT", mem="40M*4", retry_on="oom")
    assert grows.result(timeout=120).stdout() == "2\n"
    # Exit 3 is not what retry_on names: it fails at once, its retries unused.
    once = ex.submit("echo ran >> ran.txt; exit 3", retries=3, retry_on="oom")
    with pytest.raises(TaskFailed, match="exit 3"):
        once.result(timeout=60)
    assert (tmp_path / "ran.txt").read_text() == "ran\n"
