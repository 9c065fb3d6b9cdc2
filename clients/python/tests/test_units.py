"""The client's pure parts: task lines and their options, id ranges, durations, the run record.
These need no `htc` binary (`pytest tests/test_units.py` on a machine without one)."""

from __future__ import annotations

import importlib.metadata
import pathlib

import pytest

from slurm_htc import __version__, drop_record, read_record, task_line, write_record
from slurm_htc._htc import OPTIONS, id_ranges
from slurm_htc.executor import _seconds


def test_ids_are_written_as_htc_takes_them_consecutive_ones_as_a_range() -> None:
    assert id_ranges([]) == []
    assert id_ranges([5]) == ["5"]
    assert id_ranges([20, 17, 18, 19, 5, 5]) == ["5", "17-20"]
    assert id_ranges([0, 1, 3, 4, 6]) == ["0-1", "3-4", "6"]


def test_options_are_written_in_htc_s_order_and_none_is_left_out() -> None:
    opts = {"priority": -2, "retries": 3, "timeout": 90, "gpus": None, "mem": "2G", "cores": 4}
    assert task_line("true", opts) == "[cores=4 mem=2G timeout=90s retries=3 priority=-2] true"
    assert OPTIONS == ("cores", "mem", "gpus", "timeout", "retries", "retry_on", "priority")


@pytest.mark.parametrize("given, written", [(90, "90s"), (0.5, "0.5s"), (-3, "0s"), ("10m", "10m"), ("2h", "2h")])
def test_a_timeout_is_seconds_or_a_duration_as_htc_writes_it(given: object, written: str) -> None:
    assert task_line("true", {"timeout": given}) == f"[timeout={written}] true"


def test_dependencies_follow_the_options() -> None:
    assert task_line(["cat", "x"], {"cores": 1}, after=[3, 4], afterany=[9]) == "[cores=1 after=3:4 afterany=9] cat x"


@pytest.mark.parametrize(
    "cmd, options, kwargs, says",
    [
        ("true", {"mem": "2 G"}, {}, "an option's value is one word"),
        ("true", {"cores": "1]"}, {}, "an option's value is one word"),
        ("true", {"cores": ""}, {}, "an option's value is one word"),
        ("   ", {}, {}, "a task's command is empty"),
        ("true", {}, {"env": {"NOT-A-NAME": "1"}}, "is not a variable name"),
        ("true", {}, {"cwd": "/nonexistent/dir"}, "no such directory"),
    ],
)
def test_what_cannot_be_a_task_line_is_refused_where_the_caller_sees_it(
    cmd: str, options: dict[str, object], kwargs: dict[str, object], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        task_line(cmd, options, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("soon", 0), ("", 0)])
def test_an_idle_time_reads_as_htc_reads_it(text: str, seconds: float) -> None:
    assert _seconds(text) == seconds


def test_a_record_names_its_run_until_that_run_is_dropped(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "sub" / "run-id")
    assert read_record(path) == ""
    write_record(path, "local-1-2")
    assert read_record(path) == "local-1-2"
    drop_record(path, "another-run")  # a record of another run is left
    assert read_record(path) == "local-1-2"
    drop_record(path, "local-1-2")
    assert read_record(path) == "" and not (tmp_path / "sub" / "run-id").exists()


def test_the_version_is_written_once_and_the_installed_package_says_it() -> None:
    assert importlib.metadata.version("slurm-htc") == __version__


def test_a_worker_s_environment_becomes_each_call_s_exactly() -> None:
    import os
    import subprocess

    from slurm_htc._warm import set_environ

    saved = dict(os.environb)
    try:
        for env in ({b"PATH": saved[b"PATH"], b"A": b"1", b"B": b"x"}, {b"PATH": saved[b"PATH"], b"A": b"2"}):
            set_environ(env)
            assert dict(os.environb) == env
            # Set for the process too, not only for Python's view: a child sees it.
            seen = subprocess.run(["sh", "-c", 'echo "$A-${B:-none}"'], capture_output=True, check=True)
            assert seen.stdout.decode().strip() == f"{env[b'A'].decode()}-{env.get(b'B', b'none').decode()}"
    finally:
        set_environ(saved)
    assert dict(os.environb) == saved
