"""One `htc task add RUN --file -` process kept open: task lines in, their ids out, in order. The
stream groups what comes within a few milliseconds into one request, so a hundred thousand
submits cost a few dozen ledger commits, not a process each."""

from __future__ import annotations

import subprocess
import threading
from typing import Callable, Optional


class Stream:
    """Lines written go to the run; `on_id(id)` is called from a reader thread for each line's id,
    in the order written, once the run has it durably; `on_end(why)` once the stream ends (`why`
    is `None` when it was closed, else what `htc` said, and the lines without an id are lost)."""

    def __init__(
        self,
        binary: str,
        run: str,
        cwd: Optional[str],
        on_id: Callable[[int], None],
        on_end: Callable[[Optional[str]], None],
    ) -> None:
        self._p = subprocess.Popen(
            [binary, "task", "add", run, "--file", "-"],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()
        self._closed = False
        self._on_id, self._on_end = on_id, on_end
        self._reader = threading.Thread(target=self._read, name="slurm-htc-ids", daemon=True)
        self._reader.start()

    def write(self, line: str) -> bool:
        """Sends one task line; false once the stream has ended (the caller starts another)."""
        with self._lock:
            if self._closed or self._p.poll() is not None:
                return False
            try:
                assert self._p.stdin is not None
                self._p.stdin.write(line + "\n")
                self._p.stdin.flush()
                return True
            except (BrokenPipeError, ValueError):
                return False

    def close(self) -> None:
        """No more lines: the last ones' ids still come, then `on_end(None)`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                assert self._p.stdin is not None
                self._p.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
        self._reader.join()

    def _read(self) -> None:
        assert self._p.stdout is not None and self._p.stderr is not None
        for line in self._p.stdout:
            self._on_id(int(line))
        rc = self._p.wait()
        said = self._p.stderr.read().strip()
        self._on_end(None if rc == 0 else (said or f"htc task add ended with exit {rc}"))
