#!/usr/bin/env bash
# Dependencies between tasks (issue 40), with the real `htc`:
#   1. a chain of CHAIN tasks, each `after=` the one before, real `true` processes: tasks/s
#      from the run's start to its end (the whole chain is one task at a time: what it measures
#      is the way from a result to the next start, through the leader);
#   2. a fan-out/fan-in of FAN tasks (1 -> FAN -> 1) with --exec none: the leader's CPU per task
#      (`htc status --json`) and the htc run process's peak anonymous memory (its heap; the
#      ledger's mapped pages are the kernel's to drop), against the same FAN + 2 tasks without
#      dependencies (the memory a waiting task costs beyond today's).
#
#   bench/deps.sh
#   CHAIN=10000 FAN=1000000 bench/deps.sh
#
# Env: CHAIN (10000), FAN (1000000), ROUNDS (3, medians), HTC (target/dist/htc),
#      OUT (bench/results/deps-<date>.txt).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
CHAIN=${CHAIN:-10000}
FAN=${FAN:-1000000}
ROUNDS=${ROUNDS:-3}
HTC=${HTC:-$ROOT/target/dist/htc}
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
bench_setup deps

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "chain: $CHAIN tasks; fan-out/fan-in: $FAN; rounds: $ROUNDS; htc: $HTC"

HTC="$HTC" WORK="$WORK" CHAIN="$CHAIN" FAN="$FAN" ROUNDS="$ROUNDS" python3 - <<'EOF'
import glob, json, os, statistics, subprocess, time

htc, work = os.environ["HTC"], os.environ["WORK"]
chain, fan, rounds = int(os.environ["CHAIN"]), int(os.environ["FAN"]), int(os.environ["ROUNDS"])
env = dict(os.environ, HTC_SITE_CONFIG="/dev/null")

def anon_kib(pid):
    """The process's anonymous resident memory (its heap, not the ledger's mapped pages), KiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:"))
    except (OSError, StopIteration):
        return 0

def run(name, lines, *extra):
    """`htc run` of these lines: wall seconds, the leader's µs per task, peak anonymous RSS
    (KiB, sampled every 5 ms)."""
    d = f"{work}/{name}"
    os.makedirs(d)
    with open(f"{d}/t.txt", "w") as f:
        f.writelines(lines)
    t0 = time.time()
    p = subprocess.Popen([htc, "run", "t.txt", "-q", *extra], cwd=d, env=env)
    anon = 0
    while p.poll() is None:
        anon = max(anon, anon_kib(p.pid))
        time.sleep(0.005)
    status = p.returncode
    wall = time.time() - t0
    assert status == 0, f"{name}: htc run failed"
    run_id = os.path.basename(glob.glob(f"{d}/.htc/*")[0])
    out = json.loads(subprocess.run([htc, "status", run_id, "--json"], cwd=d, env=env,
                                    capture_output=True, text=True, check=True).stdout)
    assert out["counts"]["done"] == len(lines), f"{name}: {out['counts']}"
    subprocess.run(["rm", "-rf", d])
    return wall, out["leader_cpu_us_per_task"], anon

med = statistics.median

# 1. The chain: line i waits for line i-1.
lines = ["true\n"] + [f"[after={i}] true\n" for i in range(1, chain)]
walls = [run(f"chain{r}", lines)[0] for r in range(rounds)]
print(f"1. chain of {chain} real tasks: {chain / med(walls):.0f} tasks/s "
      f"(median of {rounds}: {', '.join(f'{w:.2f}' for w in walls)} s)")

# 2. Fan-out/fan-in against the same tasks without dependencies.
deps = ["true\n"] + [f"[after=1] true\n"] * fan + [f"[after=2-{fan + 1}] true\n"]
free = ["true\n"] * (fan + 2)
with_deps = [run(f"fan{r}", deps, "--exec", "none") for r in range(rounds)]
without = [run(f"free{r}", free, "--exec", "none") for r in range(rounds)]
us_deps, us_free = med(x[1] for x in with_deps), med(x[1] for x in without)
print(f"2. fan-out/fan-in of {fan} (1 -> {fan} -> 1), --exec none, medians of {rounds}:")
print(f"   leader CPU per task {us_deps:.2f} us (without dependencies {us_free:.2f} us)")
anon_deps, anon_free = med(x[2] for x in with_deps), med(x[2] for x in without)
print(f"   htc run peak anonymous RSS (its heap) {anon_deps / 1024:.0f} MiB (without {anon_free / 1024:.0f} MiB): "
      f"{(anon_deps - anon_free) * 1024 / fan:.1f} B per waiting task beyond")
print(f"   wall {med(x[0] for x in with_deps):.2f} s (without {med(x[0] for x in without):.2f} s)")
EOF
