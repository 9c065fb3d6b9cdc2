"""Issue 52's goals for open runs on a Slurm cluster, run as the cluster's user on its login node
(bench/cluster-open.sh starts the cluster and calls this). Three parts, each printing its table:

  clients  N `htc task add JOB -- true` started together against a NODES-node `sbatch --htc-open`
           job, ROUNDS rounds (a job each), beside N `true` through the same gate;
  rerun    TRIES tries: M tasks streamed into a NODES-node open job, SIGKILL to its leader once
           a random 10-80% have started, `htc resume JOB`, wait, close; what started twice;
  flips    FLIPS random single-bit flips of a finished NODES-node job's ledger, each followed by
           `htc verify` and the task-state readers.

Env: HTC (the installed htc), WORK (a directory the user owns), NODES, N, ROUNDS, M, TRIES, FLIPS.
"""
import collections
import glob
import json
import os
import random
import re
import resource
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gate import gated  # noqa: E402
from journal import open_attempts  # noqa: E402

HTC, WORK = os.environ["HTC"], os.environ["WORK"]
# A pipe per client: as many descriptors as this process may hold.
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
NODES = os.environ.get("NODES", "4")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def htc(cwd, *args, check=True, timeout=None):
    p = subprocess.run([HTC, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise SystemExit(f"htc {' '.join(args)}: exit {p.returncode}: {p.stderr}")
    return p


def submit_open(cwd):
    """A NODES-node open job in `cwd`, once its leader listens; its id."""
    with open(f"{cwd}/job.sh", "w") as f:
        f.write("#!/bin/bash\n")
    out = subprocess.run(["sbatch", "--parsable", "-N", NODES, "--exclusive", "--htc-open", "job.sh"],
                         cwd=cwd, capture_output=True, text=True, check=True).stdout
    job = out.strip().splitlines()[-1].split(";")[0]
    wait_leader(cwd, job)
    return job


def wait_leader(cwd, job, secs=120):
    t0 = time.time()
    while not os.path.exists(f"{cwd}/.htc/{job}/leader.addr"):
        if time.time() - t0 > secs:
            raise SystemExit(f"job {job}: no leader after {secs} s")
        time.sleep(0.1)


def job_state(job):
    out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else "GONE"


def wait_end(job, secs=300):
    t0 = time.time()
    while (state := job_state(job)) not in ENDED | {"GONE"}:
        if time.time() - t0 > secs:
            raise SystemExit(f"job {job} still {state} after {secs} s")
        time.sleep(0.2)
    return state


def clients():
    n, rounds = int(os.environ["N"]), int(os.environ["ROUNDS"])
    rows = {"raw": [], "htc": []}
    for r in range(rounds):
        d = f"{WORK}/clients-{r}"
        os.makedirs(d)
        codes, _, secs, _ = gated(d, [["true"]] * n)
        rows["raw"].append((secs, sum(c != 0 for c in codes), 0, n))
        job = submit_open(d)
        codes, outs, secs, errs = gated(d, [[HTC, "task", "add", job, "--", "true"]] * n)
        ids = [int(o.strip()) for c, o in zip(codes, outs) if c == 0]
        have = {int(line.split("\t")[0]) for line in htc(d, "task", "status", job, "--all").stdout.splitlines()}
        refused = sum(c != 0 for c in codes)
        htc(d, "close", job)
        state = wait_end(job)
        rows["htc"].append((secs, refused, len(set(ids) - have), len(set(ids))))
        print(f"   round {r}: job {job} ({state}): {secs:.2f} s, {refused} failed, {len(set(ids))} distinct ids"
              + (f"; stderr said {len(errs)} distinct lines, e.g. {errs[:3]}" if errs else ""))
    print(f"\n{n} one-task clients on the login node against a {NODES}-node open job, median of {rounds} rounds")
    print(f"{'':6} {'seconds':>8} {'per s':>8} {'failed':>7} {'lost':>5} {'distinct ids':>13}")
    raw_s = statistics.median(x[0] for x in rows["raw"])
    for k, v in rows.items():
        s = statistics.median(x[0] for x in v)
        print(f"{k:6} {s:8.2f} {n / s:8,.0f} {max(x[1] for x in v):7} {max(x[2] for x in v):5} {min(x[3] for x in v):13}"
              f"   ({s / raw_s:.2f}x raw)")


def leader_of(job):
    """The pid of job `job`'s leader (`htc-agent lead` with the job's id in its environment)."""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if any(c.endswith(b"htc-agent") for c in cmd[:1]) and b"lead" in cmd and f"SLURM_JOB_ID={job}".encode() in env:
            return int(p)
    return None


def lines_in(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def rerun():
    m, tries = int(os.environ["M"]), int(os.environ["TRIES"])
    rows = []
    for k in range(tries):
        d = f"{WORK}/rerun-{k}"
        os.makedirs(d)
        runs = f"{d}/runs.txt"
        job = submit_open(d)
        add = subprocess.run([HTC, "task", "add", job, "--file", "-"], cwd=d, capture_output=True, text=True,
                             input=f"echo $HTC_TASK_ID $HTC_ATTEMPT >> {runs}\n" * m)
        assert add.returncode == 0, add.stderr
        target = int(m * random.uniform(0.1, 0.8))
        while lines_in(runs) < target:
            time.sleep(0.01)
        pid = leader_of(job)
        assert pid, f"job {job}: no leader process"
        os.kill(pid, 9)
        state = wait_end(job)
        run = os.path.realpath(f"{d}/.htc/{job}")
        running = open_attempts(run)
        out = subprocess.run([HTC, "resume", job], cwd=d, capture_output=True, text=True)
        got = re.search(r"Submitted batch job (\d+)", out.stdout + out.stderr)
        assert got, f"htc resume {job}: {out.stdout}{out.stderr}"
        job2 = got.group(1)
        wait_leader(d, job2)
        t0 = time.time()
        while htc(d, "task", "wait", job2, "--all", "--timeout", "60s", check=False).returncode != 0:
            if time.time() - t0 > 900:
                raise SystemExit(f"the resumed job {job2} did not finish")
            time.sleep(0.5)
        htc(d, "close", job2)
        state2 = wait_end(job2)
        seen = collections.defaultdict(list)
        for line in open(runs):
            tid, att = line.split()
            seen[int(tid)].append(int(att))
        reruns = {t: a for t, a in seen.items() if len(a) > 1}
        logged = collections.defaultdict(set)
        for line in htc(d, "log", job2, "--format", "json").stdout.splitlines():
            row = json.loads(line)
            logged[row["Seq"]].add(row["Attempt"])
        visible = sum(1 for t, a in reruns.items() if len(set(a)) == len(a) and set(a) <= logged[t])
        missing = m - len(seen)
        rows.append((target, running, len(reruns), visible, missing))
        print(f"   try {k}: job {job} killed at {target} started ({state}); journal: {running} running; "
              f"resumed as {job2} ({state2}); re-runs {len(reruns)}, visible {visible}; never ran {missing}")
        subprocess.run(["rm", "-rf", d])
    print(f"\n{tries} tries of {m} streamed tasks on a {NODES}-node open job, leader killed, `htc resume`:")
    print(f"   killed after {min(r[0] for r in rows)}-{max(r[0] for r in rows)} started; running at the kill (journal) "
          f"{[r[1] for r in rows]}; re-runs {[r[2] for r in rows]}; all visible: {all(r[2] == r[3] for r in rows)}; "
          f"re-runs beyond the running: {max(0, max(r[2] - r[1] for r in rows))}; never ran: {sum(r[4] for r in rows)}")


PAGE, META_USED, P_BRANCH, P_LEAF, P_META = 4096, 16 + 136, 0x01, 0x02, 0x08


def used_bytes(ledger):
    """The byte offsets LMDB's live pages use (as node-agent/tests/ledger_flips.rs finds them):
    both meta records, and of every branch and leaf page not on the free list its header, node
    pointers and nodes."""
    u64 = lambda i: struct.unpack_from("<Q", ledger, i)[0]  # noqa: E731
    meta = PAGE if u64(PAGE + 144) > u64(144) else 0
    free_root, last = u64(meta + 80), u64(meta + 136)
    free = set()
    if free_root != 2**64 - 1:
        page = ledger[free_root * PAGE:][:PAGE]
        u16 = lambda i: struct.unpack_from("<H", page, i)[0]  # noqa: E731
        for i in range(max(u16(12) - 16, 0) // 2):
            at = u16(16 + 2 * i)
            dsize, ksize = u16(at) | (u16(at + 2) << 16), u16(at + 6)
            data = page[at + 8 + ksize:at + 8 + ksize + dsize]
            free.update(struct.unpack_from("<Q", data, j)[0] for j in range(8, len(data) - 7, 8))
    out = []
    for n in range(last + 1):
        base = n * PAGE
        flags = struct.unpack_from("<H", ledger, base + 10)[0]
        if flags & P_META:
            out.extend(range(base, base + META_USED))
        elif flags & (P_BRANCH | P_LEAF) and n not in free:
            lower, upper = (min(struct.unpack_from("<H", ledger, base + o)[0], PAGE) for o in (12, 14))
            out.extend(range(base, base + lower))
            out.extend(range(base + max(upper, lower), base + PAGE))
    return out


def readings(d, job):
    cmds = [["task", "status", job, "--all"], ["task", "status", job, "--all", "--format", "json"],
            ["task", "status", job, "1-50"], ["task", "wait", job, "--all", "--timeout", "1s"], ["status", job, "--json"]]
    procs = [subprocess.Popen([HTC, *c], cwd=d, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for c in cmds]
    outs = [p.communicate()[0].decode(errors="replace") for p in procs]
    return [(o, p.returncode) for o, p in zip(outs, procs)]


def flips():
    count = int(os.environ["FLIPS"])
    d = f"{WORK}/flips"
    os.makedirs(d)
    # Done, failed and retried tasks, run on every node.
    with open(f"{d}/tasks.txt", "w") as f:
        f.write("#HTC retries=0\n")
        for i in range(1, 2001):
            f.write("[retries=1] exit 3\n" if i % 7 == 0 else f"echo {i}\n")
    out = subprocess.run(["sbatch", "--parsable", "-N", NODES, "--exclusive", "--htc=tasks.txt", "--wrap=:"],
                         cwd=d, capture_output=True, text=True, check=True).stdout
    job = out.strip().splitlines()[-1].split(";")[0]
    state = wait_end(job)
    # A Slurm job's ledger is node-local while it runs; what stays is its replica in the run
    # directory (snapshot and journal, every byte of them used), which readers restore from.
    # A ledger in the run directory is flipped in the bytes LMDB's live pages use.
    run = f"{d}/.htc/{job}"
    if os.path.exists(f"{run}/ledger.mdb"):
        files = {f"{run}/ledger.mdb": None}
    else:
        files = {p: None for p in sorted(glob.glob(f"{run}/ledger/snapshot.*") + glob.glob(f"{run}/ledger/journal.*"))}
    assert files, f"job {job} ({state}) left no ledger: {os.listdir(run)}"
    pristine = {p: open(p, "rb").read() for p in files}
    where = [(p, at) for p, b in pristine.items() for at in (used_bytes(b) if p.endswith(".mdb") else range(len(b)))]
    truth = readings(d, job)
    assert truth == readings(d, job), "the readings are repeatable"
    rng = random.Random(int(os.environ.get("SEED", "52")))
    reported = harmless = 0
    wrong = []
    for path, at in rng.sample(where, count):
        damaged = bytearray(pristine[path])
        damaged[at] ^= 1 << rng.randrange(8)
        open(path, "wb").write(damaged)
        verdict = htc(d, "verify", job, check=False).returncode
        now = readings(d, job)
        reported += verdict != 0
        harmless += verdict == 0
        for (out, c), (tout, tc) in zip(now, truth):
            true_lines = all("\tdamaged\t" in ln or '"state":"damaged"' in ln or ln in tout.splitlines() for ln in out.splitlines())
            if not ((c in (2, 3) and true_lines) or (c == tc and out == tout)):
                wrong.append(f"{os.path.basename(path)} byte {at} of {len(damaged)}: verify {verdict}; a reader exits {c}, prints {out[:200]!r}")
        open(path, "wb").write(pristine[path])
    sizes = ", ".join(f"{os.path.basename(p)} {len(b):,} B" for p, b in pristine.items())
    print(f"\n{count} random bit flips of job {job}'s ledger ({state}, 2000 tasks on {NODES} nodes; {sizes}): "
          f"{reported} reported by verify, {harmless} changed nothing; "
          f"wrong answers (a task left out or changed without a refusal): {len(wrong)}")
    for w in wrong[:20]:
        print("   " + w)


if __name__ == "__main__":
    for part in sys.argv[1:]:
        {"clients": clients, "rerun": rerun, "flips": flips}[part]()
