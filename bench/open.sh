#!/usr/bin/env bash
# Open runs (issue 40): what a client of a running run waits for, with the real `htc` and real
# processes.
#   1. add latency: `htc task add RUN -- true` one after another into an idle open run, from the
#      call to the id printed (the CLI's start, connect, the secret's proof, the commit);
#   2. start latency: from the id printed to the task's first instruction (it writes the time);
#   3. adds through one stream: N lines through `htc task add RUN --file -` (the tasks run with
#      --exec none, so what is measured is the add path, not the spawn rate), to the last id;
#   4. `htc task status RUN --all` of those N tasks;
#   5. CONCURRENT one-task `htc task add` processes at once (64 at a time): every id distinct,
#      none lost, and the rate;
#   6. the leader's CPU per task (`htc status --json`) with LEADER tasks arriving in batches of
#      100 while it runs (and, as a second figure, of 1,000), against the same tasks in a file
#      (both --exec none). The run is closed once the last add is acknowledged and ends when its
#      tasks are done: no `htc task wait`, whose queries are part 4's and not an arrival's cost.
#
#   bench/open.sh
#   ADDS=500 STREAM=1000000 bench/open.sh
#
#   7. with HQ=/path/to/hq: HyperQueue's open jobs beside, where it has the operation (add
#      latency, start latency, the state of STREAM tasks).
#
# Env: ADDS (200), STREAM (200000), CONCURRENT (10000), LEADER (200000), HTC (target/dist/htc),
#      HQ (an `hq` binary; section 7 is left out without it), OUT (bench/results/open-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
ADDS=${ADDS:-200}
STREAM=${STREAM:-200000}
CONCURRENT=${CONCURRENT:-10000}
LEADER=${LEADER:-200000}
HTC=${HTC:-$ROOT/target/dist/htc}
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
bench_setup open

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "adds: $ADDS one by one; stream: $STREAM lines; concurrent: $CONCURRENT; leader: $LEADER tasks; htc: $HTC"

HQ="${HQ:-}" HTC="$HTC" WORK="$WORK" ADDS="$ADDS" STREAM="$STREAM" CONCURRENT="$CONCURRENT" LEADER="$LEADER" python3 - <<'EOF'
import os, subprocess, time, statistics, glob, json
from concurrent.futures import ThreadPoolExecutor

htc, work = os.environ["HTC"], os.environ["WORK"]
adds, stream = int(os.environ["ADDS"]), int(os.environ["STREAM"])
concurrent, leader_n = int(os.environ["CONCURRENT"]), int(os.environ["LEADER"])
env = dict(os.environ, HTC_SITE_CONFIG="/dev/null")

def open_run(d, *extra):
    os.makedirs(d)
    # `htc run --open` prints the run's id on stdout once its leader listens, and nothing else.
    p = subprocess.Popen([htc, "run", "--open", "-q", *extra], cwd=d, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    run = p.stdout.readline().strip()
    if not run:
        raise SystemExit(f"htc run --open in {d} printed no run id (exit {p.wait()})")
    return p, run

def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]

# 1 and 2: one by one, each task writing when it started.
d = f"{work}/latency"
p, run = open_run(d)
acked, ids = [], []
for i in range(adds):
    t0 = time.time()
    out = subprocess.run([htc, "task", "add", run, "--", "sh", "-c", 'date +%s.%N > "s.$HTC_TASK_ID"'],
                         cwd=d, env=env, capture_output=True, text=True, check=True).stdout
    t1 = time.time()
    acked.append((int(out), t1, t1 - t0))
    time.sleep(0.02)  # idle between adds: each finds the run idle
subprocess.run([htc, "task", "wait", run, "--all"], cwd=d, env=env, check=True)
starts = []
for id_, t1, _ in acked:
    with open(f"{d}/s.{id_}") as f:
        starts.append(float(f.read()) - t1)
subprocess.run([htc, "close", run], cwd=d, env=env, check=True, capture_output=True)
p.wait()
lat = [a[2] * 1e3 for a in acked]
st = [s * 1e3 for s in starts]
print(f"\n1. add latency, call to id printed ({adds} adds): p50 {pct(lat, .5):.1f} ms  p99 {pct(lat, .99):.1f} ms  max {max(lat):.1f} ms")
print(f"2. start latency, id printed to the task's start: p50 {pct(st, .5):.1f} ms  p99 {pct(st, .99):.1f} ms  max {max(st):.1f} ms")
htc_add, htc_start = (pct(lat, .5), pct(lat, .99)), (pct(st, .5), pct(st, .99))

# 3 and 4: one stream.
d = f"{work}/stream"
p, run = open_run(d, "--exec", "none")
lines = "true\n" * stream
t0 = time.time()
r = subprocess.run([htc, "task", "add", run, "--file", "-"], cwd=d, env=env, input=lines,
                   capture_output=True, text=True, check=True)
t1 = time.time()
n = len(r.stdout.split())
assert n == stream, (n, stream)
print(f"3. {stream} adds through one stream: {t1 - t0:.2f} s to the last id ({stream / (t1 - t0):,.0f} tasks/s)")
subprocess.run([htc, "task", "wait", run, "--all"], cwd=d, env=env, check=True)
t0 = time.time()
r = subprocess.run([htc, "task", "status", run, "--all"], cwd=d, env=env, capture_output=True, text=True, check=True)
t1 = time.time()
assert len(r.stdout.splitlines()) == stream
print(f"4. htc task status --all of {stream} tasks (leader running): {(t1 - t0) * 1e3:.0f} ms")
htc_status_ms = (t1 - t0) * 1e3
subprocess.run([htc, "close", run], cwd=d, env=env, check=True, capture_output=True)
p.wait()

# 5. Many clients at once.
d = f"{work}/concurrent"
p, run = open_run(d, "--exec", "none")
def one(i):
    r = subprocess.run([htc, "task", "add", run, "--", "true", str(i)], cwd=d, env=env, capture_output=True, text=True)
    return r.returncode, r.stdout.strip()
t0 = time.time()
with ThreadPoolExecutor(64) as ex:
    got = list(ex.map(one, range(concurrent)))
t1 = time.time()
ok = [int(o) for rc, o in got if rc == 0]
subprocess.run([htc, "task", "wait", run, "--all"], cwd=d, env=env, check=True)
st = subprocess.run([htc, "task", "status", run, "--all"], cwd=d, env=env, capture_output=True, text=True, check=True)
subprocess.run([htc, "close", run], cwd=d, env=env, check=True, capture_output=True)
p.wait()
print(f"5. {concurrent} one-task adds, 64 at a time: {len(ok)} acknowledged, {len(set(ok))} distinct ids, "
      f"{len(st.stdout.splitlines())} tasks in the run; {concurrent / (t1 - t0):,.0f} adds/s")

# 6. The leader's CPU per task: arriving in batches of 100, against the same tasks in a file.
def status_json(d, run):
    return json.loads(subprocess.run([htc, "status", run, "--json"], cwd=d, env=env, capture_output=True,
                                     text=True, check=True).stdout)
def leader_cpu(d, run):
    """The leader's µs per task, leading alone and with what it spent before (the file's load),
    and the run's seconds."""
    out = status_json(d, run)
    n = out["counts"]["done"]
    return out["leader_cpu_us_per_task"], (out["leader_cpu_s"] + out["load_cpu_s"]) * 1e6 / n, out["elapsed_s"]
d = f"{work}/file"
os.makedirs(d)
with open(f"{d}/t.txt", "w") as f:
    f.write("true\n" * leader_n)
subprocess.run([htc, "run", "t.txt", "--exec", "none", "-q"], cwd=d, env=env, check=True)
from_file = leader_cpu(d, os.path.basename(glob.glob(f"{d}/.htc/*")[0]))
def arriving(d, batch):
    p, run = open_run(d, "--exec", "none")
    w = subprocess.Popen([htc, "task", "add", run, "--file", "-"], cwd=d, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL)
    for _ in range(leader_n // batch):
        w.stdin.write(b"true\n" * batch)
        w.stdin.flush()
        time.sleep(0.025)  # past the stream's batching wait: each batch a request of its own
    w.stdin.close()
    w.wait()
    subprocess.run([htc, "close", run], cwd=d, env=env, check=True, capture_output=True)
    p.wait()
    return leader_cpu(d, run)
# What an open run costs while nothing arrives (its timer, heartbeats, the live view), per second.
d = f"{work}/idle"
p, run = open_run(d, "--exec", "none")
time.sleep(10)
subprocess.run([htc, "close", run], cwd=d, env=env, check=True, capture_output=True)
p.wait()
idle = status_json(d, run)
idle_per_s = idle["leader_cpu_s"] / idle["elapsed_s"]
costs = {}
for batch in (100, 1000):
    a = arriving(f"{work}/arriving-{batch}", batch)
    costs[batch] = a
    print(f"6. leader CPU per task, {leader_n} tasks: arriving in batches of {batch} {a[0]:.2f} us, "
          f"in a file {from_file[0]:.2f} us ({a[0] / from_file[0]:.2f}x); with what each spent before "
          f"leading (the file's load, the process's start): {a[1]:.2f} against {from_file[1]:.2f} us "
          f"({a[1] / from_file[1]:.2f}x)")
# Each run's cost as idle seconds + requests + tasks: the two batch sizes give the last two.
(a100, _, t100), (a1000, _, t1000) = costs[100], costs[1000]
left = lambda a, t: a * leader_n - idle_per_s * t * 1e6
per_request = (left(a100, t100) - left(a1000, t1000)) / (leader_n / 100 - leader_n / 1000)
per_task = (left(a1000, t1000) - per_request * leader_n / 1000) / leader_n
print(f"   of which: an idle open run {idle_per_s * 1e3:.2f} ms per second ({idle_per_s * t100 * 1e6 / leader_n:.2f} us "
      f"per task over the {t100:.0f} s of batches of 100), {per_request:.0f} us per request, {per_task:.2f} us per task")

# 7. HyperQueue's open jobs beside, where it has the operation: `hq job open`, then
#    `hq submit --job J` per task (its add; it has no dependencies between submits, no keys),
#    and `hq task list` for the state of many tasks.
hq = os.environ.get("HQ")
if hq:
    d = f"{work}/hq"
    os.makedirs(d)
    base = [hq, "--server-dir", f"{d}/server"]
    q = lambda *a, **kw: subprocess.run(base + list(a), cwd=d, capture_output=True, text=True, **kw)
    srv = subprocess.Popen(base + ["server", "start"], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while q("server", "info").returncode != 0:
        time.sleep(0.05)
    wk = subprocess.Popen(base + ["worker", "start"], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not json.loads(q("--output-mode", "json", "worker", "list").stdout or "[]"):
        time.sleep(0.05)
    job = json.loads(q("--output-mode", "json", "job", "open", check=True).stdout)["id"]
    acked = []
    for i in range(adds):
        t0 = time.time()
        q("submit", "--job", str(job), "--", "sh", "-c", 'date +%s.%N > "s.$HQ_TASK_ID"', check=True)
        t1 = time.time()
        acked.append((t1, t1 - t0))
        time.sleep(0.02)
    q("job", "close", str(job), check=True)
    q("job", "wait", str(job))
    files = sorted(glob.glob(f"{d}/s.*"), key=lambda f: int(f.rsplit(".", 1)[1]))
    assert len(files) == adds, (len(files), adds)
    starts = [float(open(f).read()) - t1 for f, (t1, _) in zip(files, acked)]
    lat = [a[1] * 1e3 for a in acked]
    st = [s * 1e3 for s in starts]
    version = q("--version").stdout.strip()
    print(f"\n7. {version} beside, the same operations:")
    print(f"   add (hq submit --job): p50 {pct(lat, .5):.1f} ms  p99 {pct(lat, .99):.1f} ms   "
          f"(htc task add: p50 {htc_add[0]:.1f} ms  p99 {htc_add[1]:.1f} ms)")
    print(f"   start after the add: p50 {pct(st, .5):.1f} ms  p99 {pct(st, .99):.1f} ms   "
          f"(htc: p50 {htc_start[0]:.1f} ms  p99 {htc_start[1]:.1f} ms)")
    # The state of many tasks: one job of n tasks (an array, HQ's batched submit), which run as
    # real processes there (HQ's no-op worker needs a build of its own); htc's the same number,
    # with --exec none, from its leader.
    n = min(stream, 20000)
    big = json.loads(q("--output-mode", "json", "submit", "--array", f"1-{n}", "--", "true", check=True).stdout)["id"]
    q("job", "wait", str(big))
    t0 = time.time()
    r = q("--output-mode", "json", "task", "list", str(big), check=True)
    t1 = time.time()
    hq_ms = (t1 - t0) * 1e3
    dh = f"{work}/hq-htc"
    p, run = open_run(dh, "--exec", "none")
    subprocess.run([htc, "task", "add", run, "--file", "-"], cwd=dh, env=env, input="true\n" * n,
                   capture_output=True, text=True, check=True)
    subprocess.run([htc, "task", "wait", run, "--all"], cwd=dh, env=env, check=True)
    t0 = time.time()
    r = subprocess.run([htc, "task", "status", run, "--all", "--format", "json"], cwd=dh, env=env,
                       capture_output=True, text=True, check=True)
    t1 = time.time()
    assert len(r.stdout.splitlines()) >= 1
    subprocess.run([htc, "close", run], cwd=dh, env=env, check=True, capture_output=True)
    p.wait()
    print(f"   state of {n} tasks in one call, as JSON: hq task list {hq_ms:.0f} ms   "
          f"(htc task status --all: {(t1 - t0) * 1e3:.0f} ms)")
    wk.terminate()
    q("server", "stop")
    srv.wait()
EOF
