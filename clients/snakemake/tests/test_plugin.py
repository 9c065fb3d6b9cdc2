"""`snakemake --executor htc` against real open runs: Snakemake from the package registry (pinned
by the caller), the real `htc` ($HTC), real processes and signals."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

import pytest

HTC = os.environ.get("HTC", "htc")
BIN = pathlib.Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")

WORKFLOW = (pathlib.Path(__file__).parent / "Snakefile").read_text()

# Each job appends to runs.log as its last act: how often each ran to its end, whoever ran it (a
# job cancelled midway runs again, which is what Snakemake expects).
SLOW = """
N = int(config.get("samples", 8))
rule all:
    input: expand("out/{i}.txt", i=range(N))
rule slow:
    output: "out/{i}.txt"
    shell: "sleep 2; echo {wildcards.i} > {output}; echo {wildcards.i} >> runs.log"
"""


def snakemake(wd: pathlib.Path, *args: str, timeout: float = 240) -> "subprocess.CompletedProcess[str]":
    env = dict(os.environ, HTC=HTC, PATH=f"{BIN}:{os.environ['PATH']}")
    return subprocess.run(
        [SNAKEMAKE, *args], cwd=wd, env=env, capture_output=True, text=True, timeout=timeout
    )


def start(wd: pathlib.Path, *args: str) -> "subprocess.Popen[str]":
    env = dict(os.environ, HTC=HTC, PATH=f"{BIN}:{os.environ['PATH']}")
    log = open(wd / "snakemake.log", "w")
    # SIGINT as a terminal's Ctrl-C delivers it (a background job would inherit it ignored).
    return subprocess.Popen(
        [SNAKEMAKE, *args], cwd=wd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def outputs(wd: pathlib.Path) -> Dict[str, bytes]:
    return {str(p.relative_to(wd)): p.read_bytes() for p in sorted((wd / "out").rglob("*")) if p.is_file()}


def htc(wd: pathlib.Path, *args: str) -> str:
    return subprocess.run([HTC, *args], cwd=wd, capture_output=True, text=True, check=True).stdout


def runs(wd: pathlib.Path) -> List[str]:
    # A run being made has a hidden name (.ID.new) until it is whole; the rest of .htc/ are runs.
    if not (wd / ".htc").exists():
        return []
    return sorted(p.name for p in (wd / ".htc").iterdir() if p.is_dir() and not p.name.startswith("."))


def states(wd: pathlib.Path, run: str) -> List[str]:
    return [line.split("\t")[1] for line in htc(wd, "task", "status", run, "--all").splitlines()]


def wait_for(what, timeout: float = 30.0, step: float = 0.05):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(step)
    raise AssertionError("timed out")


def test_a_workflow_gives_what_the_local_executor_gives(tmp_path: pathlib.Path) -> None:
    local, ours = tmp_path / "local", tmp_path / "htc"
    for wd in (local, ours):
        wd.mkdir()
        (wd / "Snakefile").write_text(WORKFLOW)
    n = 100  # 301 jobs
    p = snakemake(local, "--cores", "2", "--config", f"samples={n}")
    assert p.returncode == 0, p.stderr[-3000:]
    p = snakemake(ours, "--executor", "htc", "--jobs", "100", "--config", f"samples={n}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert outputs(ours) == outputs(local)
    assert len(outputs(ours)) == 3 * n + 1
    [run] = runs(ours)
    assert states(ours, run) == ["done"] * (3 * n + 1), "one task per job, each once"
    info = htc(ours, "status", run, "--json")
    assert '"state":"succeeded"' in info, "the run it started was closed and ended: " + info
    # Nothing is left to do: Snakemake's books agree with the outputs.
    p = snakemake(ours, "--executor", "htc", "--jobs", "100", "--config", f"samples={n}")
    assert p.returncode == 0 and "Nothing to be done" in p.stderr, p.stderr[-2000:]


def test_ctrl_c_cancels_the_jobs_and_a_new_snakemake_finishes_only_what_is_missing(tmp_path: pathlib.Path) -> None:
    (tmp_path / "Snakefile").write_text(SLOW)
    sm = start(tmp_path, "--executor", "htc", "--jobs", "4", "--config", "samples=8")
    wait_for(lambda: (tmp_path / "runs.log").exists() and "running" in states(tmp_path, runs(tmp_path)[0]))
    sm.send_signal(signal.SIGINT)
    assert sm.wait(60) != 0
    [first] = runs(tmp_path)
    left = states(tmp_path, first)
    assert "cancelled" in left and not {"waiting", "running"} & set(left), left
    p = snakemake(tmp_path, "--executor", "htc", "--jobs", "4", "--config", "samples=8")
    assert p.returncode == 0, p.stderr[-3000:]
    # What ended well before the Ctrl-C is not run again; the rest is. (A task whose end raced
    # the cancel counts as cancelled, and its job runs again: Snakemake's jobs may.)
    [second] = [r for r in runs(tmp_path) if r != first]
    assert len(states(tmp_path, second)) == 8 - left.count("done"), (left, states(tmp_path, second))
    assert [(tmp_path / f"out/{i}.txt").read_text() for i in range(8)] == [f"{i}\n" for i in range(8)]


def killed_with_two_running(tmp_path: pathlib.Path, sleep: str) -> str:
    """A Snakemake killed (SIGKILL: no cancel, its lock left behind) while both its jobs' tasks
    run; its run goes on with them. The run's id."""
    (tmp_path / "Snakefile").write_text(SLOW.replace("sleep 2", f"sleep {sleep}"))
    sm = start(tmp_path, "--executor", "htc", "--jobs", "8", "--config", "samples=2")
    wait_for(lambda: runs(tmp_path) and states(tmp_path, runs(tmp_path)[0]).count("running") == 2)
    sm.kill()
    sm.wait()
    assert snakemake(tmp_path, "--unlock").returncode == 0
    [run] = runs(tmp_path)
    return run


@pytest.mark.parametrize("rerun_incomplete", [False, True], ids=["plain", "rerun-incomplete"])
def test_a_killed_snakemake_s_run_and_tasks_are_taken_up_not_run_twice(tmp_path: pathlib.Path, rerun_incomplete: bool) -> None:
    # Both tasks outlast the restart: the next Snakemake finds them still running, in the run it
    # finds open, and with --rerun-incomplete too waits for them rather than run them again. Its
    # two new jobs go to that run as well, no second run beside it, and it closes the run.
    # Jobs 0 and 1 outlast the restart; the new ones, 2 and 3, are quick.
    run = killed_with_two_running(tmp_path, "$(( {wildcards.i} < 2 ? 6 : 0 ))")
    flags = ["--rerun-incomplete"] if rerun_incomplete else []
    p = snakemake(tmp_path, "--executor", "htc", "--jobs", "8", *flags, "--config", "samples=4")
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"jobs go to the open run {run}, which a killed Snakemake started" in p.stderr, p.stderr[-3000:]
    assert p.stderr.count("left by an earlier Snakemake") == 2, p.stderr[-3000:]
    ran = (tmp_path / "runs.log").read_text().split()
    assert sorted(ran, key=int) == ["0", "1", "2", "3"], f"each job ran once: {ran}"
    assert runs(tmp_path) == [run] and states(tmp_path, run) == ["done"] * 4, "no second run"
    assert '"state":"succeeded"' in htc(tmp_path, "status", run, "--json"), "the run was closed at the end"
    assert not (tmp_path / ".snakemake/htc/run").exists(), "the record goes with the run"


def test_a_workflow_with_nothing_to_do_starts_no_run(tmp_path: pathlib.Path) -> None:
    (tmp_path / "Snakefile").write_text(SLOW.replace("sleep 2", "true"))
    assert snakemake(tmp_path, "--executor", "htc", "--jobs", "2", "--config", "samples=2").returncode == 0
    [run] = runs(tmp_path)
    p = snakemake(tmp_path, "--executor", "htc", "--jobs", "2", "--config", "samples=2")
    assert p.returncode == 0 and "Nothing to be done" in p.stderr, p.stderr[-2000:]
    assert runs(tmp_path) == [run], "no run started for nothing"


def test_a_second_ctrl_c_does_not_cut_the_cancel_short(tmp_path: pathlib.Path) -> None:
    # Many short jobs, so that some end while the cancel closes the books.
    (tmp_path / "Snakefile").write_text(SLOW.replace("sleep 2", "sleep 0.0$(( {wildcards.i} % 10 ))"))
    sm = start(tmp_path, "--executor", "htc", "--jobs", "50", "--config", "samples=200")
    wait_for(lambda: (tmp_path / "runs.log").exists() and len((tmp_path / "runs.log").read_text().split()) > 30, timeout=60)
    sm.send_signal(signal.SIGINT)
    time.sleep(0.05)
    sm.send_signal(signal.SIGINT)  # the impatient user's
    assert sm.wait(120) != 0
    [run] = runs(tmp_path)
    assert '"state":"running"' not in htc(tmp_path, "status", run, "--json"), "the run was closed"
    # The jobs whose tasks the run recorded done (a task whose end raced the cancel is recorded
    # cancelled, and its job may run again, as Snakemake's jobs may).
    state = dict(line.split("\t")[:2] for line in htc(tmp_path, "task", "status", run, "--all").splitlines())
    done_before = {
        json.loads(row)["Command"].split(">> runs.log")[0].split("echo ")[-1].strip()
        for row in htc(tmp_path, "log", run, "--format", "json").splitlines()
        if state[str(json.loads(row)["Seq"])] == "done"
    }
    assert len(done_before) > 20
    p = snakemake(tmp_path, "--executor", "htc", "--jobs", "50", "--config", "samples=200")
    assert p.returncode == 0, p.stderr[-3000:]
    ran = (tmp_path / "runs.log").read_text().split()
    again = [i for i in done_before if ran.count(i) > 1]
    assert not again, f"{len(again)} jobs that had finished ran again: {sorted(again, key=int)[:20]}"
    assert len(set(ran)) == 200


def test_sigterm_does_what_the_local_executor_does_and_never_hangs(tmp_path: pathlib.Path) -> None:
    # Snakemake's SIGTERM, as with the local executor: no more jobs start, those submitted are
    # waited for and recorded, exit 1; here the run is closed too. Many ready jobs, and SIGTERM
    # repeated, so that one lands while the scheduler holds its lock (selecting jobs, recording
    # finished ones), where Snakemake's own handler, run as the signal handler, hangs it for good.
    n = 150
    (tmp_path / "Snakefile").write_text(SLOW.replace("sleep 2", "sleep 0.0$(( {wildcards.i} % 10 ))"))
    sm = start(tmp_path, "--executor", "htc", "--jobs", "30", "--config", f"samples={n}")
    wait_for(lambda: (tmp_path / "runs.log").exists() and len((tmp_path / "runs.log").read_text().split()) > 10, timeout=60)
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        sm.send_signal(signal.SIGTERM)
        time.sleep(0.02)
    try:
        rc = sm.wait(30)
    except subprocess.TimeoutExpired:
        sm.kill()
        sm.wait()
        raise AssertionError("Snakemake hung on SIGTERM")
    log = (tmp_path / "snakemake.log").read_text()
    assert rc == 1 and "Will exit after finishing currently running jobs" in log, log[-3000:]
    [run] = runs(tmp_path)
    done = states(tmp_path, run)
    ran = (tmp_path / "runs.log").read_text().split()
    assert set(done) == {"done"} and len(done) < n, f"the jobs submitted were waited for, no more started: {done}"
    assert len(ran) == len(set(ran)) == len(done)
    assert '"state":"succeeded"' in htc(tmp_path, "status", run, "--json"), "the run was closed"
    assert not (tmp_path / ".snakemake/htc/run").exists()
    # Nothing is left marked incomplete (so --rerun-incomplete changes nothing), and the next
    # Snakemake would run exactly the jobs that had not run.
    assert not list((tmp_path / ".snakemake/incomplete").rglob("*"))
    p = snakemake(tmp_path, "--dry-run", "--executor", "htc", "--jobs", "30", "--config", f"samples={n}")
    assert p.returncode == 0, p.stderr[-3000:]
    todo = {int(line.split("out/")[1].split(".")[0]) for line in p.stdout.splitlines() if line.strip().startswith("output: out/")}
    assert todo == set(range(n)) - set(map(int, ran)), p.stdout[-3000:]


def test_a_job_no_node_can_hold_fails_with_the_reason(tmp_path: pathlib.Path) -> None:
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    input: "wide.txt", "big.txt"\n'
        'rule wide:\n    output: "wide.txt"\n    threads: 4096\n    shell: "touch {output}"\n'
        'rule big:\n    output: "big.txt"\n    resources: mem_mb=1000000000\n    shell: "touch {output}"\n'
    )
    p = snakemake(tmp_path, "--executor", "htc", "--jobs", "2", "--keep-going", timeout=120)
    assert p.returncode != 0
    assert p.stderr.count("needs more cores, memory or GPUs than any agent has") == 2, p.stderr[-3000:]


def open_run(wd: pathlib.Path) -> tuple["subprocess.Popen[str]", str]:
    """An open run in `wd` and its id, which `htc run --open` prints once its leader listens."""
    leader = subprocess.Popen([HTC, "run", "--open", "-q"], cwd=wd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert leader.stdout is not None
    run = leader.stdout.readline().strip()
    assert run, "htc run --open ended without printing its id"
    return leader, run


def test_a_run_that_takes_no_tasks_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    (tmp_path / "Snakefile").write_text(SLOW)
    leader, run = open_run(tmp_path)
    htc(tmp_path, "close", run)
    leader.wait(30)
    p = snakemake(tmp_path, "--executor", "htc", "--jobs", "2", "--htc-run", run)
    assert p.returncode != 0
    assert f"the run {run} is succeeded: it takes no tasks" in p.stderr, p.stderr[-2000:]


def test_the_generic_route_htc_task_commands_as_cluster_generic_s(tmp_path: pathlib.Path) -> None:
    (tmp_path / "Snakefile").write_text(WORKFLOW)
    leader, run = open_run(tmp_path)
    cancel = tmp_path / "htc-cancel"
    cancel.write_text(f'#!/bin/sh\nexec {HTC} task cancel {run} "$@"\n')
    cancel.chmod(0o755)
    p = snakemake(
        tmp_path, "--executor", "cluster-generic", "--jobs", "10", "--seconds-between-status-checks", "1",
        "--cluster-generic-submit-cmd", f"{HTC} task add {run} --cores {{threads}} --",
        "--cluster-generic-status-cmd", f"{HTC} task status {run} --format word",
        "--cluster-generic-cancel-cmd", str(cancel),
        "--config", "samples=2",
    )
    htc(tmp_path, "close", run)
    leader.wait(30)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "out/merged.txt").read_text() == "5 s000\n5 s001\n"
    assert states(tmp_path, run) == ["done"] * 7


def test_a_failed_job_s_error_carries_its_stderr_and_the_jobs_added_with_it_run(tmp_path: pathlib.Path) -> None:
    # Both are ready at once, so they go in one request.
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    input: "good.txt", "bad.txt"\n'
        'rule good:\n    output: "good.txt"\n    shell: "touch {output}"\n'
        "rule bad:\n    output: \"bad.txt\"\n    shell: \"echo 'unclosed > {output}\"\n"
    )
    p = snakemake(tmp_path, "--executor", "htc", "--jobs", "2", "--keep-going", timeout=120)
    assert p.returncode != 0
    assert ": exit 2\nits stderr" in p.stderr and "unexpected EOF" in p.stderr, p.stderr[-3000:]
    assert (tmp_path / "good.txt").exists(), "the good job of the same request ran"


def test_a_job_s_attempt_dependent_memory_grows_its_task_s_mem_on_snakemake_s_retry(tmp_path: pathlib.Path) -> None:
    # The job holds 100 MiB: its first attempt asks 40 and is stopped out of memory; Snakemake's
    # retry asks 320 (its `attempt` in the resource), which is the task's `mem=`, and succeeds.
    hold = "perl -e 'my $x; vec($x, (100 << 20) - 1, 8) = 1; select(undef, undef, undef, 0.3)'"
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    input: "big.txt"\n'
        'rule big:\n    output: "big.txt"\n'
        "    resources: mem_mb=lambda wildcards, attempt: 40 * attempt ** 3\n"
        f'    shell: "{hold} && echo {{resources.mem_mb}} > {{output}}"\n'
    )
    p = snakemake(tmp_path, "--executor", "htc", "--jobs", "1", "--retries", "1", timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "big.txt").read_text() == "320\n"
    (run,) = runs(tmp_path)
    asked = [
        (row["MemMiB"], row["Outcome"])
        for row in map(json.loads, htc(tmp_path, "log", run, "--format", "json").splitlines())
    ]
    assert [m for m, _ in asked] == [40, 320], asked
    assert asked[0][1].startswith("out of memory"), asked
