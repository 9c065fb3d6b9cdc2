"""The plugin's pure parts: a job's resources as task options, its task line, and which
Snakemake releases the direct route reads. No `htc` binary and no run are needed."""

import pathlib
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest
import snakemake

from snakemake_executor_plugin_htc import tasks


def job(threads: int = 1, jobid: int = 7, **resources: Any) -> Any:
    return SimpleNamespace(threads=threads, jobid=jobid, resources=resources)


def test_threads_and_resources_become_the_task_s_options() -> None:
    assert tasks.options(job()) == {"cores": 1, "retries": 0}
    assert tasks.options(job(threads=0)) == {"cores": 1, "retries": 0}
    assert tasks.options(job(4, mem_mb=1000, runtime=30, gpus=2)) == {
        "cores": 4, "retries": 0, "mem": "1000M", "timeout": "30m", "gpus": 2,
    }
    # Unset or unknowable resources ask for nothing.
    assert tasks.options(job(mem_mb="<TBD>", runtime=0, gpu=0)) == {"cores": 1, "retries": 0}
    assert tasks.options(job(nvidia_gpu=1))["gpus"] == 1


def test_a_spawned_job_s_memory_has_room_for_its_snakemake() -> None:
    assert tasks.options(job(mem_mb=1000), spawned=True)["mem"] == f"{1000 + tasks.WRAPPER_MB}M"


def test_the_line_sets_what_snakemake_s_shell_sets_and_runs_as_written(tmp_path: pathlib.Path) -> None:
    line = tasks.line(job(3, tmpdir=str(tmp_path)), "/bin/sh", 'echo "$OMP_NUM_THREADS $TMPDIR" "it\'s"', str(tmp_path), str(tmp_path))
    assert line.startswith("[cores=3 retries=0] cd ")
    out = subprocess.run(["/bin/sh", "-c", line.split("] ", 1)[1]], capture_output=True, text=True, check=True)
    assert out.stdout == f"3 {tmp_path} it's\n"
    # A tmpdir left to where the job runs is not set.
    assert "TMPDIR" not in tasks.line(job(tmpdir="<TBD>/x"), "/bin/sh", "true", str(tmp_path), str(tmp_path))


def test_a_command_of_several_lines_goes_through_a_script_file(tmp_path: pathlib.Path) -> None:
    line = tasks.line(job(jobid=12), "/bin/sh", "echo one\necho two", str(tmp_path), str(tmp_path))
    [script] = tmp_path.glob("job12-*.sh")
    assert script.read_text() == "echo one\necho two\n" and str(script) in line
    out = subprocess.run(["/bin/sh", "-c", line.split("] ", 1)[1]], capture_output=True, text=True, check=True)
    assert out.stdout == "one\ntwo\n"


@pytest.mark.parametrize(
    "version, known",
    [("9.0.0", True), ("9.27.1", True), ("9.99", True), ("8.30.0", False), ("10.0.0", False), ("", False), ("dev", False)],
)
def test_the_direct_route_reads_only_the_snakemake_releases_it_declares(version: str, known: bool) -> None:
    assert tasks.knows_snakemake(version) == known


def test_the_pinned_snakemake_is_inside_the_declared_range() -> None:
    assert tasks.knows_snakemake(snakemake.__version__), snakemake.__version__


def test_outside_the_range_every_job_is_spawned(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = SimpleNamespace(
        is_group=lambda: False, is_shell=True, is_shadow=False, benchmark=None, rule=SimpleNamespace(),
        conda_env=None, container_img=None, env_modules=None, shellcmd="echo hi", resources={},
    )
    workflow = SimpleNamespace(
        workflow_settings=SimpleNamespace(cache=None), storage_settings=SimpleNamespace(default_storage_provider=None)
    )
    direct = tasks.direct_command(plain, workflow)
    assert direct is not None and "echo hi" in direct[1]
    monkeypatch.setattr(snakemake, "__version__", "10.1.0")
    assert tasks.direct_command(plain, workflow) is None
