"""A Parsl executor: Parsl's apps (`@python_app`, `@bash_app`) run as tasks of one slurm-htc
open run, each call a task with its own cores, memory limit, timeout and recorded outcome.

    import parsl
    from slurm_htc.parsl import HTCExecutor

    parsl.load(parsl.Config(executors=[HTCExecutor()]))                        # here
    parsl.load(parsl.Config(executors=[HTCExecutor(slurm={"nodes": 4, "time": "2:00:00"})]))

The run is started at `start()` (an open run here, or `sbatch --htc-open` with `slurm=`), or an
existing one attached with `run=`; it is closed at `shutdown()` when this executor started it.
A call goes through `slurm_htc.Executor.submit`: pickled by cloudpickle, run by this interpreter
(or `python=`), its value or exception back on its future.

Parsl's resource specification maps to task options (`RESOURCES`); another key is refused at
submit, as Parsl's executors refuse what they cannot honour. Retries are Parsl's
(`Config(retries=N)`): the tasks themselves are not retried by the run (`retries=0`), so that
an app's failure reaches Parsl once per try, as Parsl counts them.
"""

from __future__ import annotations

import logging
import math
import os
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from parsl.executors.base import ParslExecutor
from parsl.executors.errors import InvalidResourceSpecification
from parsl.monitoring.radios.base import RadioConfig
from parsl.monitoring.radios.filesystem import FilesystemRadio
from parsl.utils import RepresentationMixin

from .executor import Executor

_log = logging.getLogger(__name__)


def _minutes(m: Any) -> str:
    return f"{max(1, math.ceil(float(m) * 60))}s"


# Parsl's resource specification keys (as Work Queue and TaskVine name them) and the task option
# each becomes: `memory` and `disk` are MB there, `running_time_min` minutes.
RESOURCES: Dict[str, Callable[[Any], "tuple[str, Any]"]] = {
    "cores": lambda v: ("cores", int(v)),
    "memory": lambda v: ("mem", f"{int(v)}M"),
    "gpus": lambda v: ("gpus", int(v)),
    "running_time_min": lambda v: ("timeout", _minutes(v)),
    "priority": lambda v: ("priority", int(v)),
}


def task_options(resource_specification: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The task options of a Parsl resource specification; `InvalidResourceSpecification` for a
    key this executor cannot honour or a value that is not a number."""
    spec = dict(resource_specification or {})
    unknown = set(spec) - set(RESOURCES)
    if unknown:
        raise InvalidResourceSpecification(
            unknown, f"HTCExecutor accepts these resource specification keys: {', '.join(sorted(RESOURCES))}"
        )
    options: Dict[str, Any] = {}
    for key, value in spec.items():
        try:
            name, option = RESOURCES[key](value)
        except (TypeError, ValueError) as e:
            raise InvalidResourceSpecification({key}, f"{key}={value!r} is not a number: {e}") from None
        options[name] = option
    return options


class HTCExecutor(ParslExecutor, RepresentationMixin):
    """Parsl apps as tasks of a slurm-htc open run.

    `run`: an open run's id or directory to attach to; else one is started at `start()`, here
    (in Parsl's run directory) or with `slurm={"nodes": …, "time": …, "grow": …,
    "sbatch_args": [...]}` through `sbatch --htc-open`. `htc`: the `htc` binary (default: `$HTC`,
    then `PATH`). `python`: the interpreter the tasks run (default: this one). `cores`, `mem`,
    `gpus`, `timeout`, `priority`: every task's defaults, which a resource specification
    overrides. `retries`: the run's own retries per task (default 0: Parsl retries).
    `warm`: apps run by the workers of a warm interpreter per node (default), which imports
    `preload` first (default: `parsl`, which every app's wrapper needs); `"fork"`: a process
    forked for each app; `False`: an interpreter each — see docs/python.md.
    """

    def __init__(
        self,
        label: str = "htc",
        run: Optional[str] = None,
        slurm: Optional[Dict[str, Any]] = None,
        htc: Optional[str] = None,
        python: Optional[str] = None,
        cores: int = 1,
        mem: Optional[str] = None,
        gpus: Optional[int] = None,
        timeout: Optional[str] = None,
        priority: Optional[int] = None,
        retries: int = 0,
        warm: Union[bool, str] = True,
        preload: Sequence[str] = ("parsl",),
        idle_exit: str = "10s",
        start_timeout: float = 120.0,
        storage_access: Optional[List[Any]] = None,
        working_dir: Optional[str] = None,
        remote_monitoring_radio: Optional[RadioConfig] = None,
    ) -> None:
        ParslExecutor.__init__(self)
        self.label = label
        self.run, self.slurm, self.htc, self.python = run, slurm, htc, python
        self.cores, self.mem, self.gpus, self.timeout = cores, mem, gpus, timeout
        self.priority, self.retries = priority, retries
        self.warm, self.preload = warm, tuple(preload)
        self.idle_exit, self.start_timeout = idle_exit, start_timeout
        self.storage_access = storage_access
        self.working_dir = working_dir
        # Tasks are processes on the run's nodes: their monitoring messages travel through the
        # run directory's filesystem, shared between the nodes as the run's own files are.
        self.remote_monitoring_radio = remote_monitoring_radio or FilesystemRadio()
        self._ex: Optional[Executor] = None

    def start(self) -> None:
        defaults: Dict[str, Any] = {
            k: v
            for k, v in (
                ("cores", self.cores),
                ("mem", self.mem),
                ("gpus", self.gpus),
                ("timeout", self.timeout),
                ("priority", self.priority),
                ("retries", self.retries),
            )
            if v is not None
        }
        # A run started here lives in Parsl's run directory (`runinfo/NNN/.htc/ID`); one attached
        # is named as its owner named it, relative to this process's working directory.
        os.makedirs(self.run_dir, exist_ok=True)
        self._ex = Executor(
            self.run,
            htc=self.htc,
            cwd=None if self.run else self.run_dir,
            slurm=self.slurm,
            idle_exit=self.idle_exit,
            start_timeout=self.start_timeout,
            python=self.python,
            warm=self.warm,
            preload=self.preload,
            **defaults,
        )
        _log.info("HTCExecutor %s: open run %s", self.label, self._ex.run)

    @property
    def htc_run(self) -> Optional[str]:
        """The open run's id once started (`htc status ID` shows it)."""
        return self._ex.run if self._ex is not None else None

    def submit(self, func: Callable[..., Any], resource_specification: Dict[str, Any], *args: Any, **kwargs: Any) -> Future:  # type: ignore[type-arg]
        if self._ex is None:
            raise RuntimeError(f"HTCExecutor {self.label}: submit before start()")
        options = task_options(resource_specification)
        return self._ex.with_options(**options).submit(func, *args, **kwargs)

    def shutdown(self) -> None:
        """Waits for the tasks submitted, then closes the run if this executor started it."""
        if self._ex is not None:
            self._ex.shutdown(wait=True)
        super().shutdown()
