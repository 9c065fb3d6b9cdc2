#!/usr/bin/env python3
"""The agent's ceiling: what each task costs the parts of `htc run` that all of a node's cores share.

Run by bench/agent-ceiling.sh, which builds what it needs; see there for the knobs. For each
layout (`true` tasks, and the same with `mem=`) it runs `htc run` beside one `rawloop -P 1` per
CPU on the same tasks, rounds as the outer loop, and reports medians per task:

- CPU of each thread of the leader and of the agent (from /proc/TID/schedstat, sampled every
  20 ms; a thread's last 20 ms before it exits can be missed);
- context switches of each thread (voluntary: it waited, on a futex, epoll or the like);
- cross-CPU interrupts over the run, from /proc/interrupts: TLB shootdowns, function-call IPIs
  and rescheduling IPIs, with the machine's idle rate over the same time taken off, beside the
  raw loop's (whose children cause their own);
- system calls per task of each thread kind, from one run under `strace -f` (slow, so only the
  counts are used: futex, epoll_wait, mm-wide calls, writes to cgroup files);
- a move of a thread into a v1 memory cgroup and back (what a `mem=` task costs there), timed
  alone: it takes the kernel's global cgroup_threadgroup_rwsem for writing.

The ceiling is 1 / the largest of the serialized costs (a thread every task passes through, the
cgroup moves), in tasks/s per node. The main threads' cost per second with nothing to do (timers,
heartbeats: measured with one task that sleeps) is taken off first: it does not grow with the
rate, so at a node's ceiling it is a small share of each task's.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

IPI_LINES = {"TLB": "TLB shootdowns", "CAL": "function-call IPIs", "RES": "rescheduling IPIs"}
MM_CALLS = ("mmap", "munmap", "mprotect", "madvise", "mremap", "brk")


def interrupts() -> dict[str, int]:
    """Sums over CPUs of the cross-CPU interrupt lines of /proc/interrupts (absent: 0)."""
    out = {k: 0 for k in IPI_LINES}
    try:
        text = Path("/proc/interrupts").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, rest = line.strip().partition(":")
        if name in out:
            out[name] = sum(int(w) for w in rest.split() if w.isdigit())
    return out


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


@dataclass
class ThreadStat:
    role: str
    cpu_ns: int = 0
    voluntary: int = 0
    involuntary: int = 0


@dataclass
class Sample:
    """What one run of `htc run` cost, by thread role (roles summed over their threads)."""

    wall_s: float = 0.0
    ipis: dict[str, int] = field(default_factory=dict)
    threads: dict[int, ThreadStat] = field(default_factory=dict)

    def by_role(self) -> dict[str, ThreadStat]:
        roles: dict[str, ThreadStat] = {}
        for t in self.threads.values():
            r = roles.setdefault(t.role, ThreadStat(t.role))
            r.cpu_ns += t.cpu_ns
            r.voluntary += t.voluntary
            r.involuntary += t.involuntary
        return roles

    def busiest(self, role: str) -> int:
        """CPU of the busiest thread of a role (ns)."""
        return max((t.cpu_ns for t in self.threads.values() if t.role == role), default=0)


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(comm, ppid) of a process."""
    s = read(f"/proc/{pid}/stat")
    if s is None:
        return None
    comm = s[s.index("(") + 1 : s.rindex(")")]
    return comm, int(s[s.rindex(")") + 2 :].split()[1])


def thread_role(comm: str, tid: int, pid: int, kind: str) -> str:
    if tid == pid:
        return f"{kind} main"
    if comm == "executor":
        return "agent executor"
    return f"{kind} other ({comm})"


class Sampler:
    """Follows the leader's and its agents' threads while a run lasts."""

    def __init__(self, leader: int) -> None:
        self.leader = leader
        self.procs: dict[int, str] = {leader: "leader"}
        self.threads: dict[int, ThreadStat] = {}
        self.stop = threading.Event()

    def find_agents(self) -> None:
        """Agents are htc-agent processes below the leader (a supervisor and the agent it forks)."""
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) in self.procs:
                continue
            st = proc_stat(int(d))
            if st and st[0] == "htc-agent" and st[1] in self.procs:
                self.procs[int(d)] = "agent"

    def poll(self) -> None:
        for pid, kind in list(self.procs.items()):
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for t in tids:
                tid = int(t)
                sched = read(f"/proc/{pid}/task/{tid}/schedstat")
                status = read(f"/proc/{pid}/task/{tid}/status")
                if sched is None or status is None:
                    continue
                comm = (read(f"/proc/{pid}/task/{tid}/comm") or "?").strip()
                ts = self.threads.setdefault(tid, ThreadStat(thread_role(comm, tid, pid, kind)))
                ts.cpu_ns = int(sched.split()[0])
                m = re.search(r"voluntary_ctxt_switches:\s+(\d+)\s+nonvoluntary_ctxt_switches:\s+(\d+)", status)
                if m:
                    ts.voluntary, ts.involuntary = int(m.group(1)), int(m.group(2))

    def run(self) -> None:
        last_scan = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now - last_scan > (0.05 if len(self.procs) < 3 else 1.0):
                self.find_agents()
                last_scan = now
            self.poll()
            self.stop.wait(0.02)


def run_htc(htc: str, args: list[str], tasks: Path, work: Path) -> Sample:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    before = interrupts()
    t0 = time.monotonic()
    # htc's stderr goes to a file in its work directory, to be shown should the run fail.
    err = (work / "htc.stderr").open("wb")
    p = subprocess.Popen([htc, "run", "-q", *args, str(tasks)], cwd=work, stdout=subprocess.DEVNULL, stderr=err)
    s = Sampler(p.pid)
    th = threading.Thread(target=s.run)
    th.start()
    rc = p.wait()
    wall = time.monotonic() - t0
    s.stop.set()
    th.join()
    err.close()
    if rc != 0:
        said = (work / "htc.stderr").read_text(errors="replace")[-4000:]
        raise SystemExit(f"htc run {' '.join(args)} failed: exit {rc}; its stderr ends:\n{said}")
    after = interrupts()
    return Sample(wall, {k: after[k] - before[k] for k in before}, s.threads)


def run_raw(rawloop: str, tasks: Path, work: Path, cpus: int) -> Sample:
    """One `rawloop -P 1` per CPU, each on every CPU-th line."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    lines = [ln for ln in tasks.read_text().splitlines() if ln and not ln.startswith("#")]
    parts = []
    for i in range(cpus):
        f = work / f"part{i}"
        f.write_text("\n".join(lines[i::cpus]) + "\n")
        parts.append(f)
    before = interrupts()
    t0 = time.monotonic()
    ps = [
        subprocess.Popen([rawloop, "-P", "1", "-o", str(work / f"out{i}"), str(f)], stderr=subprocess.DEVNULL)
        for i, f in enumerate(parts)
    ]
    for p in ps:
        p.wait()
    wall = time.monotonic() - t0
    after = interrupts()
    return Sample(wall, {k: after[k] - before[k] for k in before})


def idle_ipi_rate(seconds: float = 2.0) -> dict[str, float]:
    a = interrupts()
    time.sleep(seconds)
    b = interrupts()
    return {k: (b[k] - a[k]) / seconds for k in a}


# ---- system calls, from one run under strace -f -ff ----

CLONE = re.compile(r"\bclone3?\((.*)\)\s+=\s+(\d+)")
CALL = re.compile(r"^(?:\d+:\d+:\d+\.\d+ )?(\w+)\(")


def strace_counts(htc: str, args: list[str], tasks: Path, work: Path) -> dict[str, dict[str, int]]:
    """System calls by thread kind: leader main/other, agent main/executor/other."""
    shutil.rmtree(work, ignore_errors=True)
    (work / "tr").mkdir(parents=True)
    subprocess.run(
        ["strace", "-f", "-ff", "-y", "-qq", "-o", str(work / "tr" / "t"), htc, "run", "-q", *args, str(tasks)],
        cwd=work,
        stdout=subprocess.DEVNULL,
        check=True,
    )
    files = {int(f.name.split(".")[-1]): f for f in (work / "tr").iterdir()}
    text = {pid: f.read_text(errors="replace") for pid, f in files.items()}
    # Who made whom, and how: a thread (CLONE_THREAD) or a process.
    parent: dict[int, tuple[int, bool]] = {}
    for pid, t in text.items():
        for m in CLONE.finditer(t):
            parent[int(m.group(2))] = (pid, "CLONE_THREAD" in m.group(1))
    leader = min(p for p, t in text.items() if re.search(r'execve\("[^"]*/htc"', t))

    def process_of(tid: int) -> int:
        while tid in parent and parent[tid][1]:
            tid = parent[tid][0]
        return tid

    def kind(pid: int) -> str | None:
        """leader / agent / None (a task, or something else)."""
        t = text.get(pid, "")
        if pid == leader:
            return "leader"
        if re.search(r'execve\("[^"]*/htc-agent"', t):
            return "agent"
        up = parent.get(pid)
        # The agent proper: forked (no exec) by the htc-agent supervisor.
        if up and not up[1] and kind(process_of(up[0])) == "agent" and "execve(" not in t:
            return "agent"
        return None

    counts: dict[str, dict[str, int]] = {}
    for tid, t in text.items():
        proc = process_of(tid)
        k = kind(proc)
        if k is None:
            continue
        if tid == proc:
            role = f"{k} main"
        elif "CLONE_VFORK" in t:
            role = "agent executor"
        else:
            role = f"{k} other"
        c = counts.setdefault(role, {})
        for line in t.splitlines():
            m = CALL.match(line)
            if not m:
                continue
            name = m.group(1)
            if name == "write" and "/sys/fs/cgroup" in line:
                name = "write (cgroup file)"
            c[name] = c.get(name, 0) + 1
    return counts


def v1_move_us(rounds: int = 2000) -> float | None:
    """A thread moved into a v1 memory cgroup and back, µs (None: not v1 or not allowed)."""
    own = read("/proc/self/cgroup") or ""
    line = next((ln for ln in own.splitlines() if re.match(r"\d+:([^:]*,)?memory(,[^:]*)?:", ln)), None)
    if line is None:
        return None
    base = "/sys/fs/cgroup/memory" + line.split(":", 2)[2]
    probe = f"{base}/htc-ceiling-{os.getpid()}"
    try:
        os.mkdir(probe)
    except OSError:
        return None
    try:
        tid = str(threading.get_native_id()).encode()
        into, home = os.open(f"{probe}/tasks", os.O_WRONLY), os.open(f"{base}/tasks", os.O_WRONLY)
        t0 = time.perf_counter()
        for _ in range(rounds):
            os.write(into, tid)
            os.write(home, tid)
        dt = time.perf_counter() - t0
        os.close(into)
        os.close(home)
        return dt / rounds * 1e6
    finally:
        os.rmdir(probe)


def memory_hierarchy() -> str:
    own = read("/proc/self/cgroup") or ""
    if re.search(r"^\d+:([^:]*,)?memory(,[^:]*)?:", own, re.M):
        return "cgroup v1"
    return "cgroup v2" if "0::" in own else "none"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--htc", required=True)
    ap.add_argument("--rawloop", required=True)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--strace-tasks", type=int, default=3000)
    ap.add_argument("--mem", default="64M")
    ap.add_argument("--mem-limit", default="auto")
    ap.add_argument("--layouts", default="true mem")
    ap.add_argument("--base", default="", help="an older htc (its htc-agent beside it), run side by side")
    a = ap.parse_args()

    cpus = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="htc-ceiling."))
    try:
        tasks = work / "tasks.txt"
        tasks.write_text("true\n" * a.tasks)
        mem_tasks = work / "tasks-mem.txt"
        mem_tasks.write_text(f"#HTC mem={a.mem}\n" + "true\n" * a.tasks)
        layouts = {
            "true": (tasks, []),
            "mem": (mem_tasks, ["--mem-limit", a.mem_limit]),
        }
        # `loopsN`: N spawn loops on this machine's CPUs (`--cores-per-agent N`), each handing
        # off its few tasks: what the agent's main thread pays per task as a many-core node's
        # loops fan in to it, measured where there are few cores.
        for name in a.layouts.split():
            if m := re.fullmatch(r"loops(\d+)", name):
                layouts[name] = (tasks, ["--cores-per-agent", m.group(1)])
        chosen = {k: (a.htc, *v) for k, v in layouts.items() if k in a.layouts.split()}
        if a.base:
            chosen.update({f"{k} (base)": (a.base, *v) for k, v in layouts.items() if k in a.layouts.split()})
        print(f"machine: {cpus} CPUs, {os.uname().release}, memory cgroups: {memory_hierarchy()}")
        print(f"tasks: {a.tasks} `true` per run, {a.rounds} rounds, medians; mem= tasks: mem={a.mem}")
        idle = idle_ipi_rate()
        print("idle IPIs/s: " + ", ".join(f"{k} {v:.0f}" for k, v in idle.items()))

        raw: list[Sample] = []
        runs: dict[str, list[Sample]] = {k: [] for k in chosen}
        for r in range(a.rounds):
            raw.append(run_raw(a.rawloop, tasks, work / "raw", cpus))
            for name, (htc, f, args) in chosen.items():
                runs[name].append(run_htc(htc, args, f, work / "run"))
            print(f"round {r + 1}: raw {a.tasks / raw[-1].wall_s:.0f}/s, " + ", ".join(
                f"{n} {a.tasks / s[-1].wall_s:.0f}/s" for n, s in runs.items()))

        report(a.tasks, raw, runs, idle)
        # What the threads cost per second with one task that sleeps: timers and heartbeats,
        # paid whatever the rate, which a per-task figure at this machine's rate includes.
        quiet = work / "quiet.txt"
        quiet.write_text("sleep 3\n")
        builds = {"": a.htc, **({" (base)": a.base} if a.base else {})}
        per_s: dict[str, dict[str, float]] = {}
        for tag, htc in builds.items():
            q = run_htc(htc, [], quiet, work / "run")
            per_s[tag] = {r: q.busiest(r) / q.wall_s for r in ("leader main", "agent main")}
            print(f"idle cost{tag}, one `sleep 3` task: " + ", ".join(
                f"{r} {v / 1000:.0f} µs/s" for r, v in per_s[tag].items()))
        serial: dict[str, float] = {}
        for name, samples in runs.items():
            rate = per_s[" (base)" if name.endswith("(base)") else ""]
            for role in ("leader main", "agent main"):
                us = statistics.median((s.busiest(role) - rate[role] * s.wall_s) for s in samples) / a.tasks / 1000
                serial[f"{role} ({name})"] = us
            for role in {r for s in samples for r in s.by_role() if "other" in r and r.startswith("leader")}:
                us = statistics.median(s.busiest(role) for s in samples) / a.tasks / 1000
                serial[f"{role} ({name})"] = us

        if shutil.which("strace") and a.strace_tasks > 0:
            print(f"\nsystem calls per task, one run of {a.strace_tasks} tasks under strace -f (counts only):")
            for name, (htc, f, args) in chosen.items():
                small = work / "small.txt"
                head = f.read_text().splitlines(keepends=True)
                small.write_text("".join(head[: a.strace_tasks + (1 if head[0].startswith("#") else 0)]))
                counts = strace_counts(htc, args, small, work / "strace")
                for role, c in sorted(counts.items()):
                    total = sum(c.values())
                    mm = sum(c.get(k, 0) for k in MM_CALLS)
                    top = sorted(c.items(), key=lambda kv: -kv[1])[:8]
                    print(
                        f"  {name:12} {role:15} all {total / a.strace_tasks:6.2f}  futex {c.get('futex', 0) / a.strace_tasks:5.2f}"
                        f"  mm-wide {mm / a.strace_tasks:5.3f}  cgroup writes {c.get('write (cgroup file)', 0) / a.strace_tasks:4.2f}"
                        f"  | " + " ".join(f"{k} {v / a.strace_tasks:.2f}" for k, v in top)
                    )
        else:
            print("\n(no system-call counts: strace not found, or STRACE_TASKS=0)")

        move = v1_move_us()
        if move is not None and "mem" in chosen:
            for name in [n for n in chosen if n.startswith("mem")]:
                serial[f"v1 cgroup move in+out ({name})"] = move
            print(f"\nv1 memory cgroup: a thread moved in and back out: {move:.1f} µs (global rwsem, per mem= task)")
        print("\nserialized costs per task (µs; the main threads' idle cost per second taken off): " + ", ".join(f"{k} {v:.2f}" for k, v in serial.items()))
        for name in chosen:
            mine = {k: v for k, v in serial.items() if f"({name})" in k}
            worst = max(mine, key=lambda k: mine[k])
            print(f"ceiling, {name}: {1e6 / mine[worst]:,.0f} tasks/s per node (bound by {worst}: {mine[worst]:.2f} µs)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(n: int, raw: list[Sample], runs: dict[str, list[Sample]], idle: dict[str, float]) -> None:
    def ipis(samples: list[Sample]) -> str:
        parts = []
        for k in IPI_LINES:
            per = statistics.median((s.ipis[k] - idle[k] * s.wall_s) / n for s in samples)
            parts.append(f"{k} {per:6.3f}")
        return "  ".join(parts)

    raw_rate = statistics.median(n / s.wall_s for s in raw)
    print(f"\n{'run':24} {'tasks/s':>9} {'of raw':>7}   IPIs per task, idle rate taken off")
    print(f"{'raw (rawloop -P 1 per CPU)':24} {raw_rate:9.0f} {'100%':>7}   {ipis(raw)}")
    for name, samples in runs.items():
        rate = statistics.median(n / s.wall_s for s in samples)
        print(f"{'htc ' + name:24} {rate:9.0f} {rate / raw_rate:7.1%}   {ipis(samples)}")
    print(f"\n{'thread':32} {'CPU µs/task':>11} {'busiest':>8} {'vol. sw/task':>12} {'invol.':>7}")
    for name, samples in runs.items():
        roles = sorted({r for s in samples for r in s.by_role()})
        for role in roles:
            med = lambda f: statistics.median(f(s.by_role().get(role, ThreadStat(role))) for s in samples)  # noqa: E731
            cpu = med(lambda t: t.cpu_ns) / n / 1000
            busiest = statistics.median(s.busiest(role) for s in samples) / n / 1000
            print(
                f"{name + ': ' + role:32} {cpu:11.2f} {busiest:8.2f} {med(lambda t: t.voluntary) / n:12.3f}"
                f" {med(lambda t: t.involuntary) / n:7.3f}"
            )


if __name__ == "__main__":
    main()
