"""Snakemake executor plugin for slurm-htc: `snakemake --executor htc` runs a workflow's jobs as
tasks of one open run, started here, on Slurm (`--htc-nodes`), or given (`--htc-run`).

No `from __future__ import annotations` here: Snakemake reads the settings' field types as
types to build its command line options.
"""

from dataclasses import dataclass, field
from typing import Optional

from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

from .executor import Executor


@dataclass
class ExecutorSettings(ExecutorSettingsBase):  # type: ignore[misc]  # (the interface is untyped)
    run: Optional[str] = field(
        default=None,
        metadata={"help": "An open run to add the jobs to (its id or directory). Default: start one, "
                  "here or, with --htc-nodes, on Slurm; it is closed when Snakemake ends."},
    )
    nodes: Optional[int] = field(
        default=None,
        metadata={"help": "Start the run on Slurm, `sbatch --htc-open --nodes N`, and wait for it."},
    )
    time: Optional[str] = field(default=None, metadata={"help": "That job's time limit (`sbatch --time`)."})
    grow: Optional[str] = field(
        default=None, metadata={"help": "Let that run grow by allocations of its own (`sbatch --htc-grow`)."}
    )
    sbatch_args: Optional[str] = field(
        default=None, metadata={"help": "More sbatch options for that job, e.g. '--partition=short --account=x'."}
    )
    idle_exit: str = field(
        default="10s",
        metadata={"help": "A run started here or on Slurm ends this long after its last task once "
                  "Snakemake no longer speaks to it (killed): while Snakemake lives it keeps the run."},
    )
    binary: Optional[str] = field(
        default=None, metadata={"help": "The htc binary (default: $HTC, else htc on the PATH)."}
    )
    spawn_snakemake: bool = field(
        default=False,
        metadata={"help": "Run every job as `python -m snakemake` in its task, as other remote executors "
                  "do. Default: a plain shell rule's command is the task itself, as the local executor "
                  "runs it (rules with run:, script:, wrapper:, conda, containers, groups, shadow or "
                  "benchmarks are always spawned)."},
    )


common_settings = CommonSettings(
    non_local_exec=True,
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    pass_default_storage_provider_args=True,
    pass_default_resources_args=True,
    pass_envvar_declarations_to_cmd=True,
    auto_deploy_default_storage_provider=False,
    init_seconds_before_status_checks=0,
)

__all__ = ["Executor", "ExecutorSettings", "common_settings"]
