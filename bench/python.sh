#!/usr/bin/env bash
# The Python client (issue 41): N futures of `true` submitted through `slurm_htc.Executor` and
# resolved (every result read), real processes, against the same N tasks from a task file
# (`htc run`), and HyperQueue's Python API beside (its LocalCluster: a server and a worker
# in-process; the N programs as one job, and HQ_JOBS of them as jobs of one).
#
#   bench/python.sh
#   N=100000 ROUNDS=3 HQPY=/tmp/hqpy/bin/python bench/python.sh
#
# Env: N (100000), ROUNDS (3, medians), HTC (target/dist/htc), HQPY (a python with
#      `pip install hyperqueue==0.27.0`; left out without it), HQ_JOBS (2000), HQ_ROUNDS (1:
#      HyperQueue's worker ran ~300 `true` tasks/s here, so one round of 100,000 takes minutes),
#      OUT (bench/results/python-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
N=${N:-100000}
ROUNDS=${ROUNDS:-3}
HQ_JOBS=${HQ_JOBS:-2000}
HTC=${HTC:-$ROOT/target/dist/htc}
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
bench_setup python

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "futures: $N; rounds: $ROUNDS; htc: $HTC"

export HTC_SITE_CONFIG=/dev/null
HTC="$HTC" WORK="$WORK" N="$N" ROUNDS="$ROUNDS" PYTHONPATH="$ROOT/clients/python/src" python3 - <<'EOF'
import concurrent.futures as cf, json, os, statistics, subprocess, time
from slurm_htc import Executor

htc, work, n, rounds = os.environ["HTC"], os.environ["WORK"], int(os.environ["N"]), int(os.environ["ROUNDS"])

def leader(d, run):
    out = json.loads(subprocess.run([htc, "status", run, "--json"], cwd=d, capture_output=True, text=True,
                                    check=True).stdout)
    assert out["counts"]["done"] == n, out["counts"]
    return out["leader_cpu_us_per_task"]

def futures(r):
    d = f"{work}/py{r}"
    os.makedirs(d)
    t0 = time.time()
    with Executor(htc=htc, cwd=d) as ex:
        t1 = time.time()
        fs = [ex.submit("true") for _ in range(n)]
        t2 = time.time()
        for f in cf.as_completed(fs):
            f.result()
        t3 = time.time()
        run = ex.run
    return t3 - t1, t2 - t1, t1 - t0, leader(d, run)

def from_file(r):
    d = f"{work}/file{r}"
    os.makedirs(d)
    with open(f"{d}/t.txt", "w") as f:
        f.write("true\n" * n)
    t0 = time.time()
    subprocess.run([htc, "run", "t.txt", "-q"], cwd=d, check=True)
    t1 = time.time()
    return t1 - t0, leader(d, os.listdir(f"{d}/.htc")[0])

py = [futures(r) for r in range(rounds)]
fl = [from_file(r) for r in range(rounds)]
med = lambda v: statistics.median(v)
wall, sub, start, cost = (med([x[i] for x in py]) for i in range(4))
fwall, fcost = med([x[0] for x in fl]), med([x[1] for x in fl])
print(f"htc Executor: {n} futures of true, submit to last result {wall:.2f} s ({wall / n * 1e6:.1f} us per future; "
      f"the submits {sub:.2f} s; the run's start {start:.2f} s); leader {cost:.2f} us per task  (rounds: "
      + ", ".join(f"{x[0]:.2f} s" for x in py) + ")")
print(f"the same tasks from a file (htc run): {fwall:.2f} s ({fwall / n * 1e6:.1f} us per task); leader {fcost:.2f} us "
      f"per task  -> the Executor {wall / fwall:.2f}x the file's time, {cost / fcost:.2f}x its leader cost")
EOF

if [[ -n ${HQPY:-} ]]; then
    # Its server's banner and progress bars left out: the last line is the figure.
    WORK="$WORK" N="$N" ROUNDS="${HQ_ROUNDS:-1}" HQ_JOBS="$HQ_JOBS" "$HQPY" - >"$WORK/hq.out" 2>"$WORK/hq.err" <<'EOF' || { tail -n 20 "$WORK/hq.err"; exit 1; }
import importlib.metadata, os, statistics, time
from hyperqueue import Job, LocalCluster
from hyperqueue.cluster import WorkerConfig

work, n, rounds, jobs_of_one = os.environ["WORK"], int(os.environ["N"]), int(os.environ["ROUNDS"]), int(os.environ["HQ_JOBS"])

def one_job(r):
    with LocalCluster(server_dir=f"{work}/hq{r}", worker_config=WorkerConfig()) as c:
        client = c.client()
        t0 = time.time()
        job = Job()
        for _ in range(n):
            job.program(["true"], stdout=None, stderr=None)
        sub = client.submit(job)
        client.wait_for_jobs([sub])
        return time.time() - t0

def many_jobs(r):
    with LocalCluster(server_dir=f"{work}/hqm{r}", worker_config=WorkerConfig()) as c:
        client = c.client()
        t0 = time.time()
        subs = []
        for _ in range(jobs_of_one):
            job = Job()
            job.program(["true"], stdout=None, stderr=None)
            subs.append(client.submit(job))
        client.wait_for_jobs(subs)
        return time.time() - t0

one = [one_job(r) for r in range(rounds)]
many = [many_jobs(r) for r in range(rounds)]
w, m = statistics.median(one), statistics.median(many)
print(f"hyperqueue {importlib.metadata.version('hyperqueue')} Python API (LocalCluster, "
      f"stdout/stderr not kept): {n} programs as one job {w:.2f} s ({w / n * 1e6:.1f} us per task); "
      f"{jobs_of_one} jobs of one {m:.2f} s ({m / jobs_of_one * 1e6:.0f} us per job); medians of {rounds}")
EOF
    tail -n 1 "$WORK/hq.out"
fi
