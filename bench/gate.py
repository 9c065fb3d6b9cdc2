"""Processes started together (for the benchmarks of many clients at once): every process waits
at a gate (a line of a FIFO) until all are started, then all go, as a shell loop with `&` or
`xargs -P N` starts them."""
import os
import subprocess
import time


def gated(cwd, argv, env=None):
    """Runs `argv` (a list per process) as processes started together in `cwd`; returns (exit
    codes, stdouts, seconds from the gate's opening to the last exit, the distinct stderr lines)."""
    gate = f"{cwd}/gate"
    if os.path.exists(gate):
        os.unlink(gate)
    os.mkfifo(gate)
    fd = os.open(gate, os.O_RDWR)
    # A pipe each for stdout (the id); stderr shared, one file: 10,000 clients stay within the
    # descriptors a process may hold.
    err = open(f"{cwd}/stderr.txt", "w+b")
    procs = [subprocess.Popen(["sh", "-c", 'read _ < "$0" && exec "$@"', gate, *a], cwd=cwd, env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
             for a in argv]
    time.sleep(1.0)
    t0 = time.time()
    os.write(fd, b"\n" * len(procs))
    outs = [p.communicate()[0] for p in procs]
    t1 = time.time()
    os.close(fd)
    err.seek(0)
    said = sorted({l.strip() for l in err.read().decode(errors="replace").splitlines() if l.strip()})
    err.close()
    return [p.returncode for p in procs], outs, t1 - t0, said
