#!/usr/bin/env bash
# Re-runs after a leader's death (issue 52): an open run gets N short tasks streamed in by one
# client (`htc task add RUN --file -`); at a random moment while they run, its leader gets
# SIGKILL; `htc run --resume` finishes the run. Each task notes its id and `$HTC_ATTEMPT` as it
# starts (a line appended to a file), so what ran twice is seen apart from the run's own account.
# Per try:
#   running   task processes alive at the kill (children of the agents), and the attempts that
#             the resume found started and not ended (the agents' journals)
#   reruns    tasks that started more than once
#   visible   re-runs whose every start had its own attempt number, each with its `htc log` row
#
#   bench/rerun-after-kill.sh
#   N=50000 TRIES=10 bench/rerun-after-kill.sh
#
# Env: N (50000), TRIES (10), HTC (target/release/htc), OUT (bench/results/).
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
N=${N:-50000}
TRIES=${TRIES:-10}
HTC=${HTC:-$ROOT/target/release/htc}
# shellcheck source=bench/lib.sh
. "$BENCH/lib.sh"
bench_setup rerun-after-kill

echo "date: $(date -u +%FT%TZ)  host: $(hostname)  nproc: $(nproc)  commit: $(git -C "$ROOT" rev-parse --short HEAD)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "tasks per try: $N streamed; tries: $TRIES; htc: $HTC"

BENCH="$BENCH" HTC="$HTC" WORK="$WORK" N="$N" TRIES="$TRIES" python3 - <<'EOF'
import collections, json, os, random, signal, subprocess, sys, time

sys.path.insert(0, os.environ["BENCH"])
from journal import open_attempts  # noqa: E402

htc, work = os.environ["HTC"], os.environ["WORK"]
n, tries = int(os.environ["N"]), int(os.environ["TRIES"])
env = dict(os.environ, HTC_SITE_CONFIG="/dev/null")

def procs_naming(part):
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if part.encode() in f.read():
                    found.append(int(p))
        except OSError:
            pass
    return found

def children(pids):
    kids = 0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids += ppid in pids
    return kids

def htc_cmd(cwd, *args, check=True):
    p = subprocess.run([htc, *args], cwd=cwd, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise SystemExit(f"htc {' '.join(args)}: exit {p.returncode}: {p.stderr}")
    return p

rows = []
for k in range(tries):
    cwd = f"{work}/try{k}"
    os.makedirs(cwd)
    runs = f"{cwd}/runs.txt"
    # `htc run --open` prints the run's id on stdout once its leader listens, and nothing else.
    leader = subprocess.Popen([htc, "run", "--open", "-q"], cwd=cwd, env=env, text=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(f"{cwd}/leader.err", "w"))
    rid = leader.stdout.readline().strip()
    assert rid, f"htc run --open printed no run id: {open(f'{cwd}/leader.err').read()}"
    run = os.path.realpath(f"{cwd}/.htc/{rid}")
    lines = "".join(f"echo $HTC_TASK_ID $HTC_ATTEMPT >> {runs}\n" for _ in range(n))
    add = subprocess.run([htc, "task", "add", rid, "--file", "-"], cwd=cwd, env=env, input=lines,
                         capture_output=True, text=True)
    assert add.returncode == 0, add.stderr
    # A random moment while the tasks run: between 10% and 80% of them started.
    target = int(n * random.uniform(0.1, 0.8))
    while True:
        try:
            started = sum(1 for _ in open(runs))
        except FileNotFoundError:
            started = 0
        if started >= target:
            break
        time.sleep(0.01)
    agents = [p for p in procs_naming(run) if p != leader.pid]
    running = children(set(agents))
    os.kill(leader.pid, signal.SIGKILL)
    leader.wait()
    t0 = time.time()
    while [p for p in procs_naming(run) if p != leader.pid] and time.time() - t0 < 60:
        time.sleep(0.05)
    journaled = open_attempts(run)
    resumed = subprocess.Popen([htc, "run", "--resume", rid], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while htc_cmd(cwd, "task", "wait", rid, "--all", "--timeout", "60s", check=False).returncode != 0:
        if time.time() - t0 > 600:
            raise SystemExit("the resumed run did not finish")
        time.sleep(0.5)
    htc_cmd(cwd, "close", rid)
    said = resumed.communicate()[1].strip().splitlines()
    seen = collections.defaultdict(list)
    for line in open(runs):
        tid, att = line.split()
        seen[int(tid)].append(int(att))
    reruns = {t: a for t, a in seen.items() if len(a) > 1}
    logged = collections.defaultdict(set)
    for line in htc_cmd(cwd, "log", rid, "--format", "json").stdout.splitlines():
        r = json.loads(line)
        logged[r["Seq"]].add(r["Attempt"])
    visible = sum(1 for t, a in reruns.items() if len(set(a)) == len(a) and set(a) <= logged[t])
    missing = n - len(seen)
    rows.append((target, running, journaled, len(reruns), visible, missing))
    print(f"try {k}: killed at {target} started; running {running} (journal: {journaled} open); "
          f"re-runs {len(reruns)}, visible {visible}; never ran {missing}; resume said: {said[0] if said else '-'}")
    subprocess.run(["rm", "-rf", cwd])

worst = max(r[3] - max(r[1], r[2]) for r in rows)
print(f"tries {len(rows)}: re-runs {[r[3] for r in rows]}; running at the kill {[r[1] for r in rows]}; "
      f"journal open {[r[2] for r in rows]}; all visible: {all(r[3] == r[4] for r in rows)}; "
      f"re-runs beyond the running: {max(0, worst)}; never ran: {sum(r[5] for r in rows)}")
EOF
