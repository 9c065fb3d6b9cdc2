"""A Snakemake job as one task line of an open run: its resources as the task's options, and its
command, either the rule's own shell command (as Snakemake's local executor runs it) or
`python -m snakemake` for the job, as every remote executor runs jobs."""

import hashlib
import os
import shlex
from typing import Any, Dict, Mapping, Optional, Tuple

from slurm_htc import task_line

# The variables Snakemake's `shell()` sets from a job's threads, for the libraries that read them.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)

# A task line's command is one line of at most this many bytes (the kernel's limit for one
# argument, which `sh -c` gets); a longer or multi-line command goes through a script file.
MAX_LINE = 131_071 - 4096


# What the `python -m snakemake` that runs a spawned job takes itself, on top of the job's
# `mem_mb`: its task's memory limit is the sum, so that every rule the local executor runs with
# its `mem_mb` runs (measured: 70-150 MiB resident here; docs/snakemake.md).
WRAPPER_MB = 256


def options(job: Any, spawned: bool = False) -> Dict[str, object]:
    """The task's options from the job's threads and resources. Retries stay Snakemake's
    (`--retries`): the run tries each task once. A `spawned` job's memory has the wrapper's."""
    res: Mapping[str, Any] = job.resources
    opts: Dict[str, object] = {"cores": max(1, int(job.threads)), "retries": 0}
    mem = res.get("mem_mb")
    if isinstance(mem, int) and mem > 0:
        opts["mem"] = f"{mem + WRAPPER_MB if spawned else mem}M"
    runtime = res.get("runtime")  # minutes, as Snakemake writes it
    if isinstance(runtime, int) and runtime > 0:
        opts["timeout"] = f"{runtime}m"
    gpus = next((res[k] for k in ("gpu", "gpus", "nvidia_gpu") if isinstance(res.get(k), int)), 0)
    if gpus > 0:
        opts["gpus"] = gpus
    return opts


# The Snakemake releases whose shell prefix and suffix the direct route reads (`shell`'s private
# `_get_process_prefix` and `_process_suffix`): the range pyproject.toml declares, tested with
# the release tests/py-pins.txt pins. Outside it every job takes the spawned route.
DIRECT_SNAKEMAKE = ((9, 0), (10, 0))


def knows_snakemake(version: str) -> bool:
    """Whether the direct route may read the private parts of this Snakemake `version`."""
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        return False
    low, high = DIRECT_SNAKEMAKE
    return low <= (major, minor) < high


def direct_command(job: Any, workflow: Any) -> Optional[Tuple[str, str]]:
    """The shell and the rule's shell command, when running it as the task does all Snakemake's
    spawned process would (a plain shell rule: no group, shadow, benchmark, cache, software
    deployment or storage provider, a Snakemake of `DIRECT_SNAKEMAKE`); `None` otherwise."""
    import snakemake

    if not knows_snakemake(getattr(snakemake, "__version__", "")):
        return None
    try:
        if job.is_group() or not job.is_shell or job.is_shadow or job.benchmark:
            return None
        if getattr(job.rule, "cache", False) and workflow.workflow_settings.cache is not None:
            return None
        if job.conda_env or job.container_img or job.env_modules:
            return None
        if workflow.storage_settings.default_storage_provider is not None:
            return None
        cmd = job.shellcmd
    except AttributeError:  # a Snakemake whose job objects differ: the spawned route is safe
        return None
    if not cmd:
        return None
    from snakemake.shell import shell  # the shell and prefix Snakemake itself runs rules with

    executable = job.resources.get("shell_exec") or shell.get_executable() or "/bin/sh"
    try:
        prefix, suffix = shell._get_process_prefix(executable), shell._process_suffix
    except AttributeError:  # changed within the range after all: the spawned route is safe
        return None
    return executable, " ".join((prefix, cmd, suffix)).strip()


def line(job: Any, executable: str, command: str, workdir: str, scripts: str, spawned: bool = False) -> str:
    """The task line: `cd WORKDIR && VARS EXECUTABLE -c COMMAND`, or `EXECUTABLE SCRIPT` when the
    command is long or has more than one line (written to a file under `scripts`). The variables
    are those Snakemake's `shell()` sets: the thread counts, and `TMPDIR` from `resources.tmpdir`."""
    env = {v: str(max(1, int(job.threads))) for v in THREAD_VARIABLES}
    tmp = job.resources.get("tmpdir")
    if isinstance(tmp, str) and tmp and "<TBD>" not in tmp:  # <TBD>: left to where it runs
        env.update(TMPDIR=tmp, TMP=tmp, TEMPDIR=tmp, TEMP=tmp)
    if "\n" in command or len(command) > MAX_LINE:
        digest = hashlib.sha1(command.encode()).hexdigest()[:16]
        path = os.path.join(scripts, f"job{job.jobid}-{digest}.sh")
        with open(path, "w") as f:
            f.write(command + "\n")
        body = f"{shlex.quote(executable)} {shlex.quote(path)}"
    else:
        body = f"{shlex.quote(executable)} -c {shlex.quote(command)}"
    return task_line(body, options(job, spawned), cwd=workdir, env=env)
