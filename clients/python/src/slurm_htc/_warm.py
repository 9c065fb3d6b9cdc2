"""A warm interpreter of one node's agent: it imports cloudpickle, `_call` and the modules
named once, then runs the function calls that tasks' `htc-call` shims hand it in processes it
forked, so that a call starts in well under a millisecond instead of an interpreter's ~40 ms.

`python _warm.py SOCKET AGENT_PID FIRST_BASE [MODULE...]`, started by the first shim that
finds none (in a session of its own). It leaves that task's cgroups for the agent's (else the
first task's memory slot would hold it), listens on SOCKET (in a 0700 directory of the user's),
and ends when the agent ends or after `HTC_WARM_IDLE_S` seconds (default 120) without a call;
what still runs a call ends with it (and a child dies with it, however it dies).

A request comes from a task's shim, or from the agent itself for a call that needs no process
of its own (`htc_exec::warm`, which has the protocol): the pid whose place the call takes (the
shim's, or the agent's, whose cgroups but not its slots' are the task's), directory, umask,
call base, mode, CPUs (none given: that pid's affinity), environment, and descriptors 0-2. Mode `reuse` (a call without a memory limit): a worker runs it, an idle one or
one forked for it, which serves calls one after another; it takes the task's place for each
(the shim's cgroups but not its memory slot, CPU affinity and limits, directory, umask,
environment, descriptors, default signal handlers) and lets the task's descriptors go when the
call ends. Mode `fork`: a child forked for the call alone takes its place in its own session
and in the shim's cgroups, its memory slot too (the slot's limit and OOM count then hold).
The shim (or agent) reads `P<pid>` when the call runs, or `R<why>` (and nothing ran) when its
process could not take the task's place; then `S<code>` (negative: the signal) when the call
ended. A shim (or the agent's end of a call) that goes first (killed) takes the process that
runs its call, and its group, with it; a worker takes the next call only once the shim (the
agent's end) of its last has gone. Like `_call.py`, this
needs only the standard library and cloudpickle, not this package.
"""

from __future__ import annotations

import array
import ctypes
import gc
import importlib.util
import os
import pickle
import resource
import selectors
import signal
import socket
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

PROTOCOL = b"htc-warm 3"
IDLE_S = float(os.environ.get("HTC_WARM_IDLE_S", "120"))
REQUEST_MAX = 16 << 20
LIMITS = [getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_")]
# The signals a call may have taken over, back at their defaults for the next one.
RESET = [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM]
try:
    LIBC: Optional[ctypes.CDLL] = ctypes.CDLL(None, use_errno=True)
except OSError:
    LIBC = None
PR_SET_PDEATHSIG = 1


def cgroup_mounts() -> Dict[str, Tuple[str, str]]:
    """Hierarchy key (`memory`, `name=systemd`, `` for v2) -> (mount point, mount root)."""
    mounts: Dict[str, Tuple[str, str]] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, after = left.split(), right.split()
            if len(fields) < 5 or len(after) < 3:
                continue
            root, point, fstype = fields[3], fields[4].replace("\\040", " "), after[0]
            if fstype == "cgroup2":
                mounts.setdefault("", (point, root))
            elif fstype == "cgroup":
                for opt in after[2].split(","):
                    if opt not in ("rw", "ro") and "=" not in opt or opt.startswith("name="):
                        mounts.setdefault(opt, (point, root))
    return mounts


def cgroups_of(pid: int | str) -> Dict[str, str]:
    """`/proc/PID/cgroup` as hierarchy controllers (`cpu,cpuacct`; `` for v2) -> path."""
    out: Dict[str, str] = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) == 3:
                out[parts[1]] = parts[2]
    return out


def procs_file(mounts: Dict[str, Tuple[str, str]], controllers: str, path: str) -> Optional[str]:
    for c in controllers.split(",") if controllers else [""]:
        if c in mounts:
            point, root = mounts[c]
            rel = path[len(root):] if root != "/" and path.startswith(root) else path
            return os.path.join(point, rel.lstrip("/"), "cgroup.procs")
    return None


def outside_slots(path: str, agent: int) -> str:
    """The agent's own cgroup, not the task slot (`…/htc-AGENT/sN`) its spawning thread may be
    in for a moment (cgroup v1 moves threads)."""
    head, _, slot = path.rpartition("/")
    parent, _, mine = head.rpartition("/")
    return parent or "/" if mine == f"htc-{agent}" and slot[:1] == "s" and slot[1:].isdigit() else path


def join_cgroups(mounts: Dict[str, Tuple[str, str]], target: Dict[str, str], agent: int = 0) -> None:
    """Moves this process into the cgroups TARGET (a process's, `cgroups_of`) where they differ
    from its own (for the agent's, its own and not a slot's); raises naming the one it could not
    join."""
    mine = cgroups_of("self")
    for controllers, path in target.items():
        path = outside_slots(path, agent) if agent else path
        if mine.get(controllers) == path:
            continue
        procs = procs_file(mounts, controllers, path)
        if procs is None:
            continue
        try:
            with open(procs, "w") as f:
                f.write("0")
        except OSError as e:
            raise OSError(f"cannot join {procs}: {e.strerror}") from None


class Zygote:
    def __init__(self, sock_path: str, agent: int, first_word: str, preload: List[str]) -> None:
        self.sock_path, self.agent = sock_path, agent
        self.mounts = cgroup_mounts()
        self.children: Dict[int, Tuple[int, socket.socket]] = {}
        self.workers: Dict[int, Worker] = {}  # by pidfd
        self.idle: List[Worker] = []
        self.sel = selectors.DefaultSelector()
        self.agent_fd = os.pidfd_open(agent)
        try:
            join_cgroups(self.mounts, cgroups_of(agent), agent)
        except OSError as e:
            with open(sock_path[: -len(".sock")] + ".refused", "w") as f:
                f.write(f"it could not leave the first task's cgroups: {e}")
            sys.exit(0)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(sock_path)
        self.listener.listen(1024)
        self.preload(first_word, preload)
        self.sel.register(self.listener, selectors.EVENT_READ, ("accept", 0))
        self.sel.register(self.agent_fd, selectors.EVENT_READ, ("agent", 0))

    def preload(self, first_word: str, modules: List[str]) -> None:
        """The client's `sys.path` (from the first call's header), cloudpickle, `_call`, the
        modules named; then the heap frozen, so that the children share its pages."""
        self.call = load_beside("_call")
        self.outlog = load_beside("_outlog")
        try:
            self.call.add_path(pickle.loads(self.call.call_bytes(first_word)[1]))
        except (OSError, ValueError, pickle.UnpicklingError, EOFError):
            pass
        import cloudpickle  # type: ignore[import-untyped] # noqa: F401

        for m in modules:
            try:
                __import__(m)
            except Exception as e:  # the call imports it itself, and says so if it cannot
                print(f"cannot preload {m}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        gc.collect()
        gc.freeze()

    def serve(self) -> bool:
        """Serves until the agent ends (True) or no call came for `IDLE_S` (False)."""
        last = time.monotonic()
        while True:
            events = self.sel.select(timeout=1.0)
            for key, _ in events:
                if key.fileobj not in self.sel.get_map():
                    continue  # unregistered by an event before it in this batch
                kind, who = key.data
                if kind == "agent":
                    return True
                if kind == "accept":
                    self.accept()
                elif kind == "shim":
                    self.shim_said(key.fileobj, who)  # type: ignore[arg-type]
                elif kind == "child":
                    self.reap(who)
                elif kind == "worker-shim":
                    self.worker_shim_said(who)
                elif kind == "worker":
                    self.worker_said(who)
                else:
                    self.worker_ended(who)
            if self.children or any(w.conn for w in self.workers.values()) or events:
                last = time.monotonic()
            elif time.monotonic() - last > IDLE_S:
                return False

    def end(self) -> None:
        """The agent is gone, or this interpreter idled out: what still runs a call goes too
        (its task has ended with the agent)."""
        for pid, _ in self.children.values():
            kill_group(pid)
        for w in self.workers.values():
            kill_group(w.pid)

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            conn.settimeout(5)
            req, fds = read_request(conn)
        except (OSError, ValueError) as e:
            print(f"a request not read: {e}", file=sys.stderr, flush=True)
            conn.close()
            return
        if req["mode"] == "reuse":
            self.hand_over(conn, req, fds)
            return
        pid = self.fork()
        if pid == 0:
            self.child(conn, req, fds)  # never returns
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, conn)
        self.sel.register(pidfd, selectors.EVENT_READ, ("child", pidfd))
        self.sel.register(conn, selectors.EVENT_READ, ("shim", pid))

    def fork(self) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            die_with_parent()
        return pid

    def close_inherited(self) -> None:
        """In a child: the descriptors of the interpreter and of its other children."""
        self.sel.close()
        self.listener.close()
        os.close(self.agent_fd)
        for pidfd, (_, other) in self.children.items():
            os.close(pidfd)
            other.close()
        for w in self.workers.values():
            w.close()

    def shim_said(self, conn: socket.socket, pid: int) -> None:
        """The shim sends nothing after its request: its end closing means it is gone (killed,
        as on a timeout's SIGKILL), and the call goes with it, its group too."""
        if not closed(conn):
            return
        self.sel.unregister(conn)
        kill_group(pid)

    def reap(self, pidfd: int) -> None:
        pid, conn = self.children.pop(pidfd)
        self.sel.unregister(pidfd)
        try:
            self.sel.unregister(conn)
        except KeyError:
            pass  # the shim went first
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        tell(conn, b"S%d\n" % os.waitstatus_to_exitcode(status))
        conn.close()

    def child(self, conn: socket.socket, req: Dict[str, Any], fds: List[int]) -> None:
        code = 1
        try:
            self.close_inherited()
            try:
                os.setsid()
                take_place(self.mounts, req, fds)
            except OSError as e:
                conn.sendall(b"R" + str(e).replace("\n", " ").encode() + b"\n")
                os._exit(0)
            conn.settimeout(None)
            conn.sendall(b"P%d\n" % os.getpid())
            conn.close()
            code = self.run_call(req)
        finally:
            os._exit(code)

    def run_call(self, req: Dict[str, Any], log: Optional[Any] = None) -> int:
        """The call of REQ, here; its exit status, as `_call.py`'s would be. LOG: the worker's
        outcome log (`_outlog.Writer`)."""
        code = 1
        try:
            sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "_call.py"), req["base"]]
            code = self.call.run(req["base"], log)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except Exception:
                    pass
        return code

    # -- workers: calls without a memory limit, served one after another by one process ----

    def hand_over(self, conn: socket.socket, req: Dict[str, Any], fds: List[int]) -> None:
        """The call to an idle worker, or to one forked for it."""
        while True:
            w = self.idle.pop() if self.idle else self.new_worker()
            try:
                send_handoff(w.ctl, req, fds)
                break
            except OSError:
                kill_group(w.pid)  # ending already: its pidfd says so; the call goes to another
        for fd in fds:
            os.close(fd)
        w.conn = conn
        w.ran = False
        conn.settimeout(None)
        self.sel.register(conn, selectors.EVENT_READ, ("worker-shim", w.pidfd))

    def new_worker(self) -> "Worker":
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = self.fork()
        if pid == 0:
            code = 0
            try:
                ours.close()
                self.close_inherited()
                self.work(theirs)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        w = Worker(pid, os.pidfd_open(pid), ours)
        self.workers[w.pidfd] = w
        self.sel.register(w.pidfd, selectors.EVENT_READ, ("worker-end", w.pidfd))
        self.sel.register(ours, selectors.EVENT_READ, ("worker", w.pidfd))
        return w

    def work(self, ctl: socket.socket) -> None:
        """A worker's life: a call handed over, run in its task's place, its end told; again,
        until the interpreter closes its end."""
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        known: Dict[int, Any] = {}
        log = self.outlog.Writer()
        while True:
            try:
                req, fds = recv_handoff(ctl)
            except (OSError, ValueError, EOFError):
                return
            try:
                take_place(self.mounts, req, fds, agent=self.agent, known=known)
            except OSError as e:
                ctl.sendall(b"R" + str(e).replace("\n", " ").encode() + b"\n")
                continue
            ctl.sendall(b"P%d\n" % os.getpid())
            code = self.run_call(req, log)
            for i in range(3):
                os.dup2(devnull, i)  # the task's output is its own: this one holds it no more
            ctl.sendall(b"D%d\n" % code)

    def worker_said(self, pidfd: int) -> None:
        """`P`/`R` told to the shim as they are; `D` (the call ended) as the shim's `S`."""
        w = self.workers.get(pidfd)
        if w is None:
            return
        try:
            line = w.ctl.recv(4096)
        except OSError:
            line = b""
        if not line:
            self.sel.unregister(w.ctl)  # ending: its pidfd says how
            return
        for msg in line.splitlines(keepends=True):
            if msg[:1] in (b"D", b"R"):
                w.ran = True  # free once its shim has gone (R: it runs the call cold)
                msg = b"S" + msg[1:] if msg[:1] == b"D" else msg
            if w.conn is not None:
                tell(w.conn, msg)

    def worker_shim_said(self, pidfd: int) -> None:
        """The shim of a worker's call closed: after the call's end it has read it, and the
        worker takes the next call (not before: a signal the shim forwards then must not reach
        another's); before it, the shim was killed, and the call goes with the worker."""
        w = self.workers.get(pidfd)
        if w is None or w.conn is None or not closed(w.conn):
            return
        self.sel.unregister(w.conn)
        w.conn.close()
        w.conn = None
        if w.ran:
            self.idle.append(w)
        else:
            kill_group(w.pid)

    def worker_ended(self, pidfd: int) -> None:
        w = self.workers.pop(pidfd)
        for fileobj in (w.pidfd, w.ctl, w.conn):
            if fileobj is not None:
                try:
                    self.sel.unregister(fileobj)
                except (KeyError, ValueError):
                    pass
        if w in self.idle:
            self.idle.remove(w)
        _, status = os.waitpid(w.pid, 0)
        if w.conn is not None and not w.ran:
            tell(w.conn, b"S%d\n" % os.waitstatus_to_exitcode(status))
        w.close()


class Worker:
    """A forked child that runs calls one after another: its pid, pidfd, the socket it is
    handed calls on, and the shim of the call it runs (`ran`: that call has ended)."""

    def __init__(self, pid: int, pidfd: int, ctl: socket.socket) -> None:
        self.pid, self.pidfd, self.ctl = pid, pidfd, ctl
        self.conn: Optional[socket.socket] = None
        self.ran = False

    def close(self) -> None:
        for s in (self.ctl, self.conn):
            if s is not None:
                s.close()
        try:
            os.close(self.pidfd)
        except OSError:
            pass


def load_beside(name: str) -> Any:
    """The module NAME of this folder, loaded by path: this interpreter may not see the package."""
    spec = importlib.util.spec_from_file_location("_htc" + name, os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def closed(conn: socket.socket) -> bool:
    """Whether the peer closed CONN (it sends nothing else)."""
    try:
        return not conn.recv(64, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True


def tell(conn: socket.socket, msg: bytes) -> None:
    try:
        conn.sendall(msg)
    except OSError:
        pass  # the shim is gone; so is its task


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def die_with_parent() -> None:
    """In a child: SIGKILL when the warm interpreter dies, however it dies (PR_SET_PDEATHSIG)."""
    if LIBC is not None:
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def send_handoff(ctl: socket.socket, req: Dict[str, Any], fds: List[int]) -> None:
    data = pickle.dumps(req, protocol=pickle.HIGHEST_PROTOCOL)
    head = len(data).to_bytes(4, "little")
    sent = ctl.sendmsg([head + data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    ctl.sendall((head + data)[sent:])


def recv_handoff(ctl: socket.socket) -> Tuple[Dict[str, Any], List[int]]:
    msg, anc, _, _ = ctl.recvmsg(4, socket.CMSG_SPACE(3 * 4))
    if len(msg) < 4:
        raise EOFError
    fds = [int.from_bytes(d[i : i + 4], sys.byteorder) for lvl, k, d in anc for i in range(0, len(d) - len(d) % 4, 4)]
    size = int.from_bytes(msg, "little")
    body = b""
    while len(body) < size:
        more = ctl.recv(size - len(body))
        if not more:
            raise EOFError
        body += more
    return pickle.loads(body), fds


def read_request(conn: socket.socket) -> Tuple[Dict[str, Any], List[int]]:
    """The shim's request and the three descriptors beside it."""
    fds: List[int] = []
    msg, anc, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(int.from_bytes(data[i : i + 4], sys.byteorder) for i in range(0, len(data) - len(data) % 4, 4))
    if len(msg) < 4 or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError("a request without its length or its three descriptors")
    size = int.from_bytes(msg[:4], "little")
    if size > REQUEST_MAX:
        raise ValueError(f"a request of {size} bytes")
    body = bytearray(msg[4:])
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ValueError("a request cut short")
        body += more
    fields = bytes(body).split(b"\0")[:-1]
    if len(fields) < 7 or fields[0] != PROTOCOL:
        raise ValueError(f"a request of another protocol: {fields[:1]!r}")
    env = dict(e.split(b"=", 1) for e in fields[7:] if b"=" in e)
    req = {
        "pid": int(fields[1]),
        "cwd": fields[2],
        "umask": int(fields[3], 8),
        "base": os.fsdecode(fields[4]),
        "mode": fields[5].decode(),
        "cpus": {int(c) for c in fields[6].split(b",") if c},
        "env": env,
    }
    return req, fds


def take_place(
    mounts: Dict[str, Tuple[str, str]],
    req: Dict[str, Any],
    fds: List[int],
    agent: int = 0,
    known: Optional[Dict[int, Any]] = None,
) -> None:
    """This child in the task's place; raises `OSError` (nothing run yet) where it cannot be.
    A worker (AGENT given) joins the task's cgroups but not its slot's: it carries no call with a
    memory limit, and its pages stay charged where it first touched them. KNOWN (a worker's):
    the agent's cgroups and limits as first read, which hold for the agent's life, for the
    calls the agent hands over itself (a shim's pid could be reused: read each time)."""
    shim = req["pid"]
    if known is not None and shim == agent:
        if shim not in known:
            known[shim] = (cgroups_of(shim), limits_of(shim))
        target, limits = known[shim]
    else:
        target, limits = cgroups_of(shim), limits_of(shim)
    join_cgroups(mounts, target, agent)
    os.sched_setaffinity(0, req["cpus"] or os.sched_getaffinity(shim))
    for lim, value in limits:
        try:
            resource.setrlimit(lim, value)
        except ValueError:
            pass  # a hard limit the last call lowered: this one keeps it
    os.chdir(req["cwd"])
    os.umask(req["umask"])
    set_environ(req["env"])
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in RESET:
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout, sys.stderr, sys.stdin = sys.__stdout__, sys.__stderr__, sys.__stdin__


def limits_of(pid: int) -> List[Tuple[int, Tuple[int, int]]]:
    """PID's resource limits, those this kernel has."""
    out = []
    for lim in LIMITS:
        try:
            out.append((lim, resource.prlimit(pid, lim)))
        except ValueError:
            pass  # a limit this kernel does not have
    return out


def set_environ(env: Dict[bytes, bytes]) -> None:
    """The environment as ENV: only what differs from the last call's is set or unset."""
    cur = os.environb
    for k in [k for k in cur if k not in env]:
        del cur[k]
    for k, v in env.items():
        if cur.get(k) != v:
            cur[k] = v


def main(argv: List[str]) -> int:
    if len(argv) < 4:
        print("usage: _warm.py SOCKET AGENT_PID FIRST_BASE [MODULE...]", file=sys.stderr)
        return 2
    sys.path.pop(0)  # the script's own folder is not the client's
    sock_path = argv[1]
    z = Zygote(sock_path, int(argv[2]), argv[3], argv[4:])
    stem = sock_path[: -len(".sock")]
    # The lock goes only with the agent: a shim of its may hold it while this one idles out.
    ends = [".sock", ".log"]
    try:
        if z.serve():
            ends.append(".lock")
    finally:
        z.end()
        for end in ends:
            try:
                os.unlink(stem + end)
            except FileNotFoundError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
