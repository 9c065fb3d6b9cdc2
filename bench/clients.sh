#!/usr/bin/env bash
# Many clients of an open run at once (issue 52): N client processes started together, as a
# shell loop with `&` or `xargs -P N` starts them, each adding one task (`htc task add RUN --
# true`). Every process waits at a gate (a line of a FIFO) until all N are started, then all go.
# Side by side in one run:
#   raw   N `true` processes through the same gate: the rate this machine starts processes;
#   htc   N `htc task add`: refused (non-zero exit), lost (acknowledged ids missing from the run),
#         distinct ids, the wall time from the gate to the last exit;
#   hq    with HQ=/path/to/hq: N `hq submit --job J -- true` into one open HyperQueue job;
#   flood S silent strangers connected to the leader (more than it authenticates at once), then
#         one honest `htc task add`: how long it waits.
#
#   bench/clients.sh
#   N=2000 HQ=/tmp/hq/target/release/hq bench/clients.sh
#
# Env: N (10000), S (500), ROUNDS (3), HTC (target/release/htc), HQ, OUT (bench/results/).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
N=${N:-10000}
S=${S:-500}
ROUNDS=${ROUNDS:-3}
HTC=${HTC:-$ROOT/target/release/htc}
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
bench_setup clients

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "clients: $N at once; strangers: $S; rounds: $ROUNDS; htc: $HTC; hq: ${HQ:-none}"
ulimit -n "$(ulimit -Hn)"

BENCH="$BENCH" HQ="${HQ:-}" HTC="$HTC" WORK="$WORK" N="$N" S="$S" ROUNDS="$ROUNDS" python3 - <<'EOF'
import os, socket, statistics, subprocess, sys, time

sys.path.insert(0, os.environ["BENCH"])
from gate import gated  # noqa: E402

htc, work, hq = os.environ["HTC"], os.environ["WORK"], os.environ.get("HQ")
n, strangers, rounds = int(os.environ["N"]), int(os.environ["S"]), int(os.environ["ROUNDS"])
env = dict(os.environ, HTC_SITE_CONFIG="/dev/null")

def open_run(d):
    os.makedirs(d)
    # `htc run --open` prints the run's id on stdout once its leader listens, and nothing else.
    p = subprocess.Popen([htc, "run", "--open", "-q", "--exec", "none"], cwd=d, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    run = p.stdout.readline().strip()
    if not run:
        raise SystemExit(f"htc run --open in {d} printed no run id (exit {p.wait()})")
    return p, run

def close(d, p, run):
    subprocess.run([htc, "close", run], cwd=d, env=env, check=True, capture_output=True)
    p.wait()

rows = {"raw": [], "htc": [], "hq": []}
for r in range(rounds):
    d = f"{work}/raw-{r}"
    os.makedirs(d)
    codes, _, secs, _ = gated(d, [["true"]] * n, env)
    rows["raw"].append((secs, sum(c != 0 for c in codes), 0, n))

    d = f"{work}/htc-{r}"
    p, run = open_run(d)
    codes, outs, secs, errs = gated(d, [[htc, "task", "add", run, "--", "true"]] * n, env)
    ids = [int(o.strip()) for c, o in zip(codes, outs) if c == 0]
    st = subprocess.run([htc, "task", "status", run, "--all"], cwd=d, env=env, capture_output=True, text=True)
    have = {int(l.split("\t")[0]) for l in st.stdout.splitlines()}
    refused = sum(c != 0 for c in codes)
    lost = len(set(ids) - have)
    close(d, p, run)
    rows["htc"].append((secs, refused, lost, len(set(ids))))
    if refused or errs:
        print(f"   htc round {r}: {refused} failed; stderr said {len(errs)} distinct lines, e.g. {errs[:3]}")

    if hq:
        d = f"{work}/hq-{r}"
        os.makedirs(d)
        base = [hq, "--server-dir", f"{d}/server"]
        server = subprocess.Popen(base + ["server", "start"], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while subprocess.run(base + ["server", "info"], capture_output=True).returncode != 0:
            time.sleep(0.05)
        worker = subprocess.Popen(base + ["worker", "start", "--cpus", "2"], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        job = subprocess.run(base + ["job", "open"], capture_output=True, text=True, check=True).stdout
        jid = "".join(ch for ch in job.split("id:")[-1] if ch.isdigit()) or "1"
        codes, outs, secs, errs = gated(d, [base + ["submit", "--job", jid, "--", "true"]] * n, env)
        info = subprocess.run(base + ["job", "info", jid, "--output-mode", "json"], capture_output=True, text=True)
        import json
        try:
            tasks = json.loads(info.stdout)[0]["info"]["task_count"]
        except Exception:
            tasks = -1
        ok = sum(c == 0 for c in codes)
        rows["hq"].append((secs, n - ok, max(0, ok - tasks) if tasks >= 0 else -1, tasks))
        if n - ok or errs:
            print(f"   hq round {r}: {n - ok} failed; stderr said {len(errs)} distinct lines, e.g. {errs[:3]}")
        subprocess.run(base + ["server", "stop"], capture_output=True)
        worker.kill(); server.wait(); worker.wait()

print(f"\n{n} one-task clients started together, median of {rounds} rounds (wall time from the gate to the last exit)")
print(f"{'':6} {'seconds':>8} {'per s':>8} {'failed':>7} {'lost':>5} {'distinct ids / tasks':>21}")
raw_s = statistics.median(x[0] for x in rows["raw"])
for k, v in rows.items():
    if not v:
        continue
    s = statistics.median(x[0] for x in v)
    print(f"{k:6} {s:8.2f} {n / s:8,.0f} {max(x[1] for x in v):7} {max(x[2] for x in v):5} {min(x[3] for x in v):21}"
          f"   ({s / raw_s:.2f}x raw)")

# The flood: silent strangers hold the leader's handshake places; one honest client after them.
d = f"{work}/flood"
p, run = open_run(d)
addr = open(f"{d}/.htc/{run}/leader.addr").read().split("addr=")[1].split()[0]
host, port = addr.rsplit(":", 1)
waits = []
for r in range(rounds):
    held = [socket.create_connection((host, int(port))) for _ in range(strangers)]
    time.sleep(0.2)
    t0 = time.time()
    got = subprocess.run([htc, "task", "add", run, "--", "true"], cwd=d, env=env, capture_output=True, text=True)
    waits.append((time.time() - t0, got.returncode))
    for s in held:
        s.close()
    time.sleep(1)
close(d, p, run)
print(f"\n{strangers} silent strangers connected, then one honest `htc task add`: "
      f"waits {', '.join(f'{w:.1f} s (exit {c})' for w, c in waits)}")
EOF
