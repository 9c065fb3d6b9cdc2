"""slurm-htc from Python: `Executor` runs commands as tasks of an open run, each submit a
`concurrent.futures.Future` (`map`, `as_completed`, `wait`, `cancel`, `shutdown` as usual).

    from slurm_htc import Executor
    with Executor(cores=1) as ex:
        futures = [ex.submit(["gzip", "-k", f]) for f in files]
        for f in concurrent.futures.as_completed(futures):
            print(f.result().task_id)
"""

from ._htc import HtcError
from .executor import Executor, TaskFailed, TaskFuture, TaskResult

__all__ = ["Executor", "HtcError", "TaskFailed", "TaskFuture", "TaskResult"]
__version__ = "0.1.0"
