"""slurm-htc from Python: `Executor` runs commands as tasks of an open run, each submit a
`concurrent.futures.Future` (`map`, `as_completed`, `wait`, `cancel`, `shutdown` as usual).

    from slurm_htc import Executor
    with Executor(cores=1) as ex:
        futures = [ex.submit(["gzip", "-k", f]) for f in files]
        for f in concurrent.futures.as_completed(futures):
            print(f.result().task_id)

`Run` is the open run underneath, one `htc` call per method (add, status, cancel, close), for
tools that keep their own books (the Snakemake plugin).
"""

from ._htc import HtcError, task_line
from .executor import Executor, TaskFailed, TaskFuture, TaskResult
from .run import DAMAGED, ENDED, Run, drop_record, read_record, write_record

__all__ = ["DAMAGED", "ENDED", "Executor", "HtcError", "Run", "TaskFailed", "TaskFuture", "TaskResult", "drop_record", "read_record", "task_line", "write_record"]
__version__ = "0.1.0"
