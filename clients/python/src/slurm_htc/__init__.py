"""slurm-htc from Python: `Executor` runs Python functions and commands as tasks of an open run,
each submit a `concurrent.futures.Future` (`map`, `as_completed`, `wait`, `cancel`, `shutdown`
as usual).

    from slurm_htc import Executor
    with Executor(cores=1) as ex:
        values = list(ex.map(simulate, range(100)))        # simulate(i) in a task each
        futures = [ex.submit_command(["gzip", "-k", f]) for f in files]
        for f in concurrent.futures.as_completed(futures):
            print(f.result().task_id)

`Run` is the open run underneath, one `htc` call per method (add, status, cancel, close), for
tools that keep their own books (the Snakemake plugin).
"""

from ._htc import HtcError, task_line
from .executor import Executor, Options, TaskFailed, TaskFuture, TaskResult
from .functions import CallFailed, RemoteTraceback
from .run import DAMAGED, ENDED, Run, drop_record, read_record, write_record

__all__ = ["CallFailed", "DAMAGED", "ENDED", "Executor", "Options", "RemoteTraceback", "HtcError", "Run", "TaskFailed", "TaskFuture", "TaskResult", "drop_record", "read_record", "task_line", "write_record"]
__version__ = "0.1.0"
