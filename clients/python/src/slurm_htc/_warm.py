"""A warm interpreter of one node's agent: it imports cloudpickle, `_call` and the modules
named once, then forks a child per function call that a task's `htc-call` shim asks for,
so that a call starts in ~1 ms instead of an interpreter's ~40 ms.

`python _warm.py SOCKET AGENT_PID FIRST_BASE [MODULE...]`, started by the first shim that
finds none (in a session of its own). It leaves that task's cgroups for the agent's (else the
first task's memory slot would hold it), listens on SOCKET (in a 0700 directory of the user's),
and ends when the agent ends or after `HTC_WARM_IDLE_S` seconds (default 120) without a call.

Per request (the shim's pid, directory, umask, call base, environment, and its descriptors
0-2), the child takes the task's place before it runs anything: its own session, the shim's
cgroups (the slot's memory limit and OOM count then hold for the call), CPU affinity and
limits, directory, umask, environment and descriptors. It writes `P<pid>` when it runs the
call, or `R<why>` (and runs nothing) when it could not take the task's place. The interpreter
writes `S<code>` (negative: the signal) when the child ends, and kills the child's group if
the shim goes first (it was killed). Like `_call.py`, it needs only the standard library and
cloudpickle, not this package.
"""

from __future__ import annotations

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

PROTOCOL = b"htc-warm 1"
IDLE_S = float(os.environ.get("HTC_WARM_IDLE_S", "120"))
REQUEST_MAX = 16 << 20
LIMITS = [getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_")]


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


def join_cgroups(mounts: Dict[str, Tuple[str, str]], target: int | str, agent: int = 0) -> None:
    """Moves this process into TARGET's cgroups where they differ from its own (for the agent,
    its own and not a slot's); raises naming the one it could not join."""
    mine = cgroups_of("self")
    for controllers, path in cgroups_of(target).items():
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
    def __init__(self, sock_path: str, agent: int, first_base: str, preload: List[str]) -> None:
        self.sock_path, self.agent = sock_path, agent
        self.mounts = cgroup_mounts()
        self.children: Dict[int, Tuple[int, socket.socket]] = {}
        self.sel = selectors.DefaultSelector()
        self.agent_fd = os.pidfd_open(agent)
        try:
            join_cgroups(self.mounts, agent, agent)
        except OSError as e:
            with open(sock_path[: -len(".sock")] + ".refused", "w") as f:
                f.write(f"it could not leave the first task's cgroups: {e}")
            sys.exit(0)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(sock_path)
        self.listener.listen(1024)
        self.preload(first_base, preload)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.agent_fd, selectors.EVENT_READ, "agent")

    def preload(self, first_base: str, modules: List[str]) -> None:
        """The client's `sys.path` (from the first call's header), cloudpickle, `_call`, the
        modules named; then the heap frozen, so that the children share its pages."""
        try:
            with open(first_base + ".in", "rb") as f:
                header = pickle.load(f)
            for p in reversed(header.get("sys_path", [])):
                if p not in sys.path:
                    sys.path.insert(0, p)
        except (OSError, pickle.UnpicklingError, EOFError):
            pass
        import cloudpickle  # type: ignore[import-untyped] # noqa: F401

        spec = importlib.util.spec_from_file_location("_htc_call", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_call.py"))
        assert spec is not None and spec.loader is not None
        self.call = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.call)
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
                if key.data == "agent":
                    return True
                if key.data == "accept":
                    self.accept()
                elif isinstance(key.data, tuple):
                    self.shim_said(key.fileobj, key.data[1])  # type: ignore[arg-type]
                else:
                    self.reap(key.data)
            if self.children or events:
                last = time.monotonic()
            elif time.monotonic() - last > IDLE_S:
                return False

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            conn.settimeout(5)
            req, fds = read_request(conn)
        except (OSError, ValueError) as e:
            print(f"a request not read: {e}", file=sys.stderr, flush=True)
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.child(conn, req, fds)  # never returns
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, conn)
        self.sel.register(pidfd, selectors.EVENT_READ, pidfd)
        self.sel.register(conn, selectors.EVENT_READ, ("shim", pid))

    def shim_said(self, conn: socket.socket, pid: int) -> None:
        """The shim sends nothing after its request: its end closing means it is gone (killed,
        as on a timeout's SIGKILL), and the call goes with it, its group too."""
        try:
            if conn.recv(64, socket.MSG_DONTWAIT):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self.sel.unregister(conn)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def reap(self, pidfd: int) -> None:
        pid, conn = self.children.pop(pidfd)
        self.sel.unregister(pidfd)
        try:
            self.sel.unregister(conn)
        except KeyError:
            pass  # the shim went first
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        try:
            conn.sendall(b"S%d\n" % os.waitstatus_to_exitcode(status))
        except OSError:
            pass  # the shim is gone; so is its task
        conn.close()

    def child(self, conn: socket.socket, req: Dict[str, Any], fds: List[int]) -> None:
        code = 1
        try:
            self.sel.close()
            self.listener.close()
            os.close(self.agent_fd)
            for pidfd, (_, other) in self.children.items():
                os.close(pidfd)
                other.close()
            try:
                take_place(self.mounts, req, fds)
            except OSError as e:
                conn.sendall(b"R" + str(e).replace("\n", " ").encode() + b"\n")
                os._exit(0)
            conn.settimeout(None)
            conn.sendall(b"P%d\n" % os.getpid())
            conn.close()
            sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "_call.py"), req["base"]]
            code = self.call.run(req["base"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)


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
    if len(fields) < 5 or fields[0] != PROTOCOL:
        raise ValueError(f"a request of another protocol: {fields[:1]!r}")
    env = dict(e.split(b"=", 1) for e in fields[5:] if b"=" in e)
    req = {"pid": int(fields[1]), "cwd": fields[2], "umask": int(fields[3], 8), "base": os.fsdecode(fields[4]), "env": env}
    return req, fds


def take_place(mounts: Dict[str, Tuple[str, str]], req: Dict[str, Any], fds: List[int]) -> None:
    """This child in the task's place; raises `OSError` (nothing run yet) where it cannot be."""
    shim = req["pid"]
    os.setsid()
    join_cgroups(mounts, shim)
    os.sched_setaffinity(0, os.sched_getaffinity(shim))
    for lim in LIMITS:
        try:
            resource.setrlimit(lim, resource.prlimit(shim, lim))
        except ValueError:
            pass  # a limit this kernel does not have
    os.chdir(req["cwd"])
    os.umask(req["umask"])
    os.environb.clear()
    os.environb.update(req["env"])
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
        for end in ends:
            try:
                os.unlink(stem + end)
            except FileNotFoundError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
