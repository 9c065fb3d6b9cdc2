#!/usr/bin/env bash
# Python functions as tasks (issue 55): N calls of a function that returns its argument, every
# value read back, through `slurm_htc.Executor.submit` (a task per call, run by the warm
# interpreter's workers, its rounds taken in turn with HighThroughputExecutor's; forked from the
# warm interpreter; and cold, a new interpreter per call), its `map` with `chunksize`, Parsl's apps on
# `slurm_htc.parsl.HTCExecutor` (warm, and cold), and beside them
# Parsl's HighThroughputExecutor (LocalProvider, one block of WORKERS workers) and the standard
# library's ProcessPoolExecutor(WORKERS) (warm workers, no record of anything); then a call's
# result latency (from the function's return to `result()` returning, p50 of LAT calls); with
# SLEEP_N > 0, SLEEP_N calls of time.sleep(1) through submit, against SLEEP_N / WORKERS seconds.
# With HQPY (a python with hyperqueue==0.27.0), beside them HyperQueue's Python API's nearest
# equivalent: HQ_N function tasks of one job (`Job.function`, which gives no value back, each
# in an interpreter of its own), submitted and waited for.
#
#   bench/functions.sh
#   PY=/tmp/pyv/bin/python N=2000 bench/functions.sh
#
# Env: PY (a python with parsl==2026.10.26 and clients/python installed; default python3),
#      N (2000), COLD_N (200, cold calls), MAP_N (20000, with chunksize 100), PARSL_HTC_N (1000),
#      PARSL_COLD_N (30: cold, each task imports Parsl's modules), WORKERS (nproc), ROUNDS (3,
#      medians), LAT (50), SLEEP_N (0),
#      HQPY, HQ_N (1000), HTC (target/dist/htc), OUT (bench/results/functions-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
HTC=${HTC:-$ROOT/target/dist/htc}
PY=${PY:-python3}
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
bench_setup functions

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "htc: $HTC; python: $("$PY" -c 'import sys; print(sys.version.split()[0])')"

export HTC_SITE_CONFIG=/dev/null
# HighThroughputExecutor starts its interchange and workers by name, from the venv's bin.
PATH=$(dirname "$(command -v "$PY")"):$PATH
cd "$WORK"
HTC="$HTC" WORK="$WORK" N="${N:-2000}" COLD_N="${COLD_N:-200}" MAP_N="${MAP_N:-20000}" PARSL_HTC_N="${PARSL_HTC_N:-1000}" \
    PARSL_COLD_N="${PARSL_COLD_N:-30}" WORKERS="${WORKERS:-$(nproc)}" ROUNDS="${ROUNDS:-3}" LAT="${LAT:-50}" \
    SLEEP_N="${SLEEP_N:-0}" "$PY" - <<'EOF'
import concurrent.futures as cf, importlib.metadata, os, statistics, time
import parsl
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider
from slurm_htc import Executor
from slurm_htc.parsl import HTCExecutor

work, n, map_n, parsl_htc_n = (os.environ["WORK"], int(os.environ["N"]), int(os.environ["MAP_N"]),
                               int(os.environ["PARSL_HTC_N"]))
workers, rounds, lat_n = int(os.environ["WORKERS"]), int(os.environ["ROUNDS"]), int(os.environ["LAT"])
cold_n, parsl_cold_n, sleep_n = int(os.environ["COLD_N"]), int(os.environ["PARSL_COLD_N"]), int(os.environ["SLEEP_N"])
seq = iter(range(10**6))


def identity(x):
    return x


def stamp(_):
    import time
    return time.time()


def fresh(name):
    d = f"{work}/{name}{next(seq)}"
    os.makedirs(d)
    return d


def htc_submit(count=n, warm=True, fn=identity):
    with Executor(cwd=fresh("submit"), retries=0, warm=warm) as ex:
        ex.submit(identity, -1).result()  # the run up (and the warm interpreter)
        t0 = time.time()
        fs = [ex.submit(fn, i) for i in range(count)]
        assert [f.result() for f in fs] == [fn(i) if fn is identity else None for i in range(count)]
        return count / (time.time() - t0)


def nap(_):
    time.sleep(1)


def htc_map():
    with Executor(cwd=fresh("map"), retries=0) as ex:
        t0 = time.time()
        assert list(ex.map(identity, range(map_n), chunksize=100)) == list(range(map_n))
        return map_n / (time.time() - t0)


def parsl_rate(executor, count):
    app = parsl.python_app(identity, executors=[executor.label])
    with parsl.load(Config(executors=[executor], run_dir=fresh("runinfo"), strategy="none")):
        app(-1).result()  # the executor up (HTEX: its workers connected)
        t0 = time.time()
        fs = [app(i) for i in range(count)]
        assert [f.result() for f in fs] == list(range(count))
        return count / (time.time() - t0)


def htex():
    return parsl_rate(HighThroughputExecutor(label="htex", max_workers_per_node=workers, cores_per_worker=1,
                                             provider=LocalProvider(init_blocks=1, max_blocks=1)), n)


def on_htc(warm=True):
    return parsl_rate(HTCExecutor(label="htc", warm=warm), parsl_htc_n if warm else parsl_cold_n)


def pool():
    with cf.ProcessPoolExecutor(workers) as p:
        p.submit(identity, 0).result()
        t0 = time.time()
        assert [f.result() for f in [p.submit(identity, i) for i in range(n)]] == list(range(n))
        return n / (time.time() - t0)


def latency():
    with Executor(cwd=fresh("lat"), retries=0) as ex:
        ex.submit(stamp, 0).result()
        lat = []
        for i in range(lat_n):
            f = ex.submit(stamp, i)
            returned = f.result()  # before time.time(): the operands are evaluated left to right
            lat.append(time.time() - returned)
        return statistics.median(lat) * 1e3, sorted(lat)[int(lat_n * 0.9)] * 1e3


def show(name, count, r):
    print(f"{name}: {count} identity calls, {statistics.median(r):,.0f} calls/s  (rounds: "
          + ", ".join(f"{x:,.0f}" for x in r) + ")", flush=True)


# The goal's pair round by round, so that a machine slowing down mid-run slows both alike.
htex_name = f"Parsl {importlib.metadata.version('parsl')} HighThroughputExecutor, {workers} workers"
ours, theirs = [], []
for _ in range(rounds):
    ours.append(htc_submit())
    theirs.append(htex())
show("slurm_htc Executor.submit, a task each, warm (workers)", n, ours)
show(htex_name + " (rounds taken in turn with the line above)", n, theirs)
print("submit / HighThroughputExecutor: " + ", ".join(f"{a / b:.2f}" for a, b in zip(ours, theirs))
      + f" by round, {statistics.median(ours) / statistics.median(theirs):.2f} x of the medians", flush=True)
rows = [("slurm_htc Executor.submit, a task each, warm='fork' (a process forked per call)",
         lambda: htc_submit(warm="fork"), n),
        ("slurm_htc Executor.submit, a task each, cold", lambda: htc_submit(cold_n, warm=False), cold_n),
        ("slurm_htc Executor.map, chunksize=100", htc_map, map_n),
        ("Parsl apps on slurm_htc.parsl.HTCExecutor, warm", on_htc, parsl_htc_n),
        ("Parsl apps on slurm_htc.parsl.HTCExecutor, cold", lambda: on_htc(warm=False), parsl_cold_n),
        (f"ProcessPoolExecutor({workers})", pool, n)]
for name, f, count in rows:
    show(name, count, [f() for _ in range(rounds)])
p50, p90 = latency()
print(f"result latency, slurm_htc Executor.submit (function's return to result()): p50 {p50:.1f} ms, p90 {p90:.1f} ms "
      f"over {lat_n} calls one at a time")
if sleep_n:
    took = sleep_n / htc_submit(sleep_n, fn=nap)
    ideal = sleep_n / workers
    print(f"{sleep_n} calls of time.sleep(1) on {workers} cores, submit: {took:.1f} s, {took / ideal:.3f} x {ideal:.0f} s")
EOF
if [[ -n ${HQPY:-} ]]; then
    # Its server's banner and progress bars left out: the last line is the figure. Its workers
    # run a function task with the `python` on the PATH: the venv's.
    PATH="$(dirname "$HQPY"):$PATH" WORK="$WORK" N="${HQ_N:-1000}" ROUNDS="${ROUNDS:-3}" "$HQPY" - >"$WORK/hq.out" 2>"$WORK/hq.err" <<'EOF' || { tail -n 20 "$WORK/hq.err"; exit 1; }
import importlib.metadata, os, statistics, time
from hyperqueue import Job, LocalCluster
from hyperqueue.cluster import WorkerConfig

work, n, rounds = os.environ["WORK"], int(os.environ["N"]), int(os.environ["ROUNDS"])


def identity(x):
    return x


def functions(r):
    with LocalCluster(server_dir=f"{work}/hqf{r}", worker_config=WorkerConfig()) as c:
        client = c.client()
        t0 = time.time()
        job = Job()
        for i in range(n):
            job.function(identity, args=(i,), stdout=None, stderr=None)
        client.wait_for_jobs([client.submit(job)])
        return n / (time.time() - t0)


r = [functions(i) for i in range(rounds)]
print(f"HyperQueue {importlib.metadata.version('hyperqueue')} Python API, Job.function (LocalCluster; no value "
      f"back): {n} identity calls as one job, {statistics.median(r):,.0f} calls/s  (rounds: "
      + ", ".join(f"{x:,.0f}" for x in r) + ")")
EOF
    tail -n 1 "$WORK/hq.out"
fi
