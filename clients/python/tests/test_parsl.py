"""Parsl apps as tasks of a real open run (the real `htc`: $HTC, or target/release/htc): values
and exceptions of python apps, bash apps and their files, dependencies, a resource
specification reaching the task, Parsl's retries, and an existing run attached by id."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Iterator

import parsl
import pytest
from parsl import bash_app, python_app
from parsl.executors.errors import InvalidResourceSpecification

from slurm_htc import Executor
from slurm_htc.parsl import HTCExecutor

ROOT = pathlib.Path(__file__).resolve().parents[3]
HTC = os.environ.get("HTC") or str(ROOT / "target" / "release" / "htc")


@pytest.fixture
def dfk(tmp_path: pathlib.Path) -> Iterator[Any]:
    config = parsl.Config(executors=[HTCExecutor(htc=HTC)], run_dir=str(tmp_path / "runinfo"), retries=1)
    with parsl.load(config) as d:
        yield d


@python_app
def double(x: int) -> int:
    return 2 * x


@python_app
def add(a: int, b: int) -> int:
    return a + b


@python_app
def cores_and_task(parsl_resource_specification: Any = {}) -> "tuple[str, str, int]":
    import os

    return os.environ["HTC_CORES"], os.environ["HTC_TASK_ID"], os.getpid()


@python_app
def fails(x: int, tries: str) -> None:
    with open(tries, "a") as f:
        f.write("tried\n")
    raise KeyError(f"no {x}")


@python_app
def fails_once(marker: str) -> str:
    import os

    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("first try")
    return "second try"


@bash_app
def echo(word: str, stdout: str = parsl.AUTO_LOGNAME) -> str:
    return f"echo {word}; echo $HTC_TASK_ID >&2"


def test_python_apps_give_their_values_in_a_task_each_and_wait_for_their_inputs(dfk: Any) -> None:
    futures = [double(i) for i in range(10)]
    assert [f.result(timeout=120) for f in futures] == [2 * i for i in range(10)]
    assert add(double(3), double(4)).result(timeout=120) == 14
    (cores_a, task_a, pid_a), (_, task_b, _) = cores_and_task().result(timeout=60), cores_and_task().result(timeout=60)
    assert cores_a == "1" and task_a != task_b and pid_a != os.getpid(), "a task each, not in this process"


def test_an_exception_is_raised_again_by_result_after_parsl_s_retries(dfk: Any, tmp_path: pathlib.Path) -> None:
    tries = tmp_path / "tries"
    with pytest.raises(KeyError, match="no 7"):
        fails(7, str(tries)).result(timeout=120)
    assert tries.read_text() == "tried\n" * 2, "Parsl's retries=1: two tries, the run retrying neither"


def test_parsl_s_retry_runs_the_app_again(dfk: Any, tmp_path: pathlib.Path) -> None:
    assert fails_once(str(tmp_path / "tried")).result(timeout=120) == "second try"


def test_a_bash_app_writes_its_stdout_where_parsl_says(dfk: Any, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "echo.out"
    f = echo("hello", stdout=str(out))
    assert f.result(timeout=120) == 0
    assert out.read_text() == "hello\n"


def test_a_resource_specification_reaches_the_task_and_an_unknown_key_is_refused(dfk: Any) -> None:
    f = cores_and_task(parsl_resource_specification={"cores": 2, "memory": 200, "running_time_min": 1})
    assert f.result(timeout=120)[0] == "2"
    with pytest.raises(InvalidResourceSpecification):
        cores_and_task(parsl_resource_specification={"num_nodes": 2}).result(timeout=60)


def test_an_open_run_started_elsewhere_is_attached_and_left_open(tmp_path: pathlib.Path) -> None:
    with Executor(htc=HTC, cwd=str(tmp_path)) as ex:
        config = parsl.Config(executors=[HTCExecutor(htc=HTC, run=str(tmp_path / ".htc" / ex.run))], run_dir=str(tmp_path / "runinfo"))
        with parsl.load(config):
            assert double(21).result(timeout=120) == 42
        # Parsl's cleanup closed its executor, not the run it was lent.
        assert ex.submit(pow, 2, 5).result(timeout=60) == 32
