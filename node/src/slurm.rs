//! Running inside a Slurm allocation: what the job environment says about this node and the job,
//! and where the leader can be reached. Plain Slurm glue, below the leader: the `srun` step that
//! starts the agents is the leader's (`leader::srun`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::process::{Command, Stdio};

use anyhow::Context;

/// The batch script of every job slurm-htc submits (`htc submit`, `htc resume`, grown and
/// resubmitted jobs): where the plugin is loaded the agent runs it as the run's prologue, with
/// `HTC_PROLOGUE=1`, and it does nothing; where it is not (a node without the plugin, or without
/// its plugstack line), Slurm only warns in slurmd's log and runs the script as a plain job,
/// which then fails saying so instead of passing for a run that did nothing.
pub const GUARD_SCRIPT: &str =
    "--wrap=[ \"$HTC_PROLOGUE\" = 1 ] || { echo \"htc: job $SLURM_JOB_ID ran as a plain batch script on \
$SLURMD_NODENAME: the slurm-htc plugin is not loaded there (its plugstack line, or spank_htc.so); \
this job ran none of the run's tasks\" >&2; exit 1; }";

/// What sbatch said on stderr when it refused a job, in one line for the run's output: its
/// lines (each `sbatch: error: …`) joined, `sbatch:` said once.
pub fn sbatch_refusal(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .map(|l| l.strip_prefix("sbatch: ").unwrap_or(l))
        .collect();
    format!("sbatch: {}", lines.join("; "))
}

/// The Slurm cluster this process runs on ("" outside a Slurm job): a run joins only
/// allocations of its own cluster.
pub fn cluster_name() -> String {
    std::env::var("SLURM_CLUSTER_NAME").unwrap_or_default()
}

pub fn var(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("${name} is not set (not inside a Slurm job?)"))
}

/// `SLURM_JOB_CPUS_PER_NODE`, e.g. `2(x3),1`, as (CPUs, nodes) runs; `None` if malformed.
fn cpu_runs(spec: &str) -> Option<Vec<(usize, usize)>> {
    spec.split(',')
        .map(|part| match part.split_once("(x") {
            Some((n, r)) => Some((n.trim().parse().ok()?, r.trim_end_matches(')').parse().ok()?)),
            None => Some((part.trim().parse().ok()?, 1)),
        })
        .collect()
}

/// CPUs of node `index` from `SLURM_JOB_CPUS_PER_NODE`, e.g. `2(x3),1` (node 3 has 1 CPU).
pub fn cpus_on_node(spec: &str, index: usize) -> Option<usize> {
    let mut at = 0usize;
    for (n, reps) in cpu_runs(spec)? {
        if index < at + reps {
            return Some(n);
        }
        at += reps;
    }
    None
}

/// This agent's share of its node's `cpus`, when `agents` agents share the node and it is the
/// `local`-th: (first CPU index, how many); the first `cpus % agents` get one more.
pub fn node_share(cpus: usize, agents: usize, local: usize) -> (usize, usize) {
    let agents = agents.max(1);
    let (base, extra) = (cpus / agents, cpus % agents);
    let first = local * base + local.min(extra);
    (first, (base + usize::from(local < extra)).max(1))
}

/// The fewest CPUs the job has on any of its nodes.
pub fn min_cpus_per_node() -> Option<usize> {
    cpu_runs(&std::env::var("SLURM_JOB_CPUS_PER_NODE").ok()?)?.iter().map(|&(n, _)| n).min()
}

/// The sbatch options of job `line` (`scontrol show job -o`) that a continuation of its run must
/// keep as the user asked for them: name, time limit, partition, account, QOS, memory,
/// constraints, nodes excluded, exclusivity, reservation, GPUs and other generic resources, mail,
/// comment, licenses, and where its output goes (`-o`/`-e` as patterns, `output_pattern`). Values
/// Slurm shows for "none" are left out.
pub fn job_options(line: &str) -> Vec<String> {
    let fields = scontrol_fields(line);
    let get = |k: &str| {
        fields
            .iter()
            .find(|(fk, _)| *fk == k)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty() && !["(null)", "N/A", "NONE", "None"].contains(v))
    };
    let mut v = Vec::new();
    let mut opt = |name: &str, val: Option<&str>| {
        if let Some(val) = val {
            v.push(format!("--{name}={val}"));
        }
    };
    opt("job-name", get("JobName"));
    opt("time", get("TimeLimit"));
    opt("partition", get("Partition"));
    opt("account", get("Account"));
    opt("qos", get("QOS"));
    opt("mem", get("MinMemoryNode").filter(|m| *m != "0"));
    opt("mem-per-cpu", get("MinMemoryCPU").filter(|m| *m != "0"));
    opt("constraint", get("Features"));
    opt("reservation", get("Reservation"));
    // Nodes the user kept the job off stay off; nodes asked for by name (`-w`) are not asked
    // again: a continuation may be of another size, and those nodes may be why it is needed.
    opt("exclude", get("ExcNodeList"));
    opt(
        "gres",
        get("TresPerNode")
            .map(|t| t.split(',').map(|g| g.strip_prefix("gres:").unwrap_or(g)).collect::<Vec<_>>().join(","))
            .as_deref(),
    );
    opt("mail-user", get("MailUser"));
    opt("mail-type", get("MailType"));
    opt("comment", get("Comment"));
    opt("licenses", get("Licenses"));
    match get("OverSubscribe") {
        Some("NO") => v.push("--exclusive".into()),
        Some("USER") => v.push("--exclusive=user".into()),
        Some("MCS") => v.push("--exclusive=mcs".into()),
        _ => {}
    }
    let (id, dir) = (get("JobId").unwrap_or_default(), get("WorkDir").unwrap_or_default());
    let out = get("StdOut").map(|p| output_pattern(p, id));
    let err = get("StdErr").map(|p| output_pattern(p, id));
    let default_out = format!("{dir}/slurm-%j.out");
    if let Some(o) = out.as_deref().filter(|o| *o != default_out) {
        v.push(format!("--output={o}"));
    }
    if let Some(e) = err.as_deref().filter(|e| Some(*e) != out.as_deref()) {
        v.push(format!("--error={e}"));
    }
    v
}

/// An output path `scontrol show job` gives for job `id`, as the pattern that names the same file
/// for another job: Slurm shows `-o tl-%j.out` expanded (`tl-74.out`), and a continuation given
/// that name would write into the first job's file. The id is taken for `%j` in the file's name
/// where it stands as a whole number (so job 74 leaves `out-174.txt` alone); what else Slurm
/// expands there (the user, the job name) is the same for the continuation.
pub fn output_pattern(path: &str, id: &str) -> String {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    let mut out = String::with_capacity(path.len());
    let mut rest = name;
    while let Some(at) = (!id.is_empty()).then(|| rest.find(id)).flatten() {
        let before = rest[..at].chars().next_back();
        let after = rest[at + id.len()..].chars().next();
        let whole = !before.is_some_and(|c| c.is_ascii_digit()) && !after.is_some_and(|c| c.is_ascii_digit());
        out.push_str(&rest[..at]);
        out.push_str(if whole { "%j" } else { id });
        rest = &rest[at + id.len()..];
    }
    out.push_str(rest);
    if path.contains('/') {
        format!("{dir}/{out}")
    } else {
        out
    }
}

/// `Key=Value` pairs of a one-line `scontrol show` record; a value may hold spaces (a job
/// name), so a word without `=` belongs to the value before it.
fn scontrol_fields(line: &str) -> Vec<(&str, String)> {
    let mut out: Vec<(&str, String)> = Vec::new();
    for word in line.split_whitespace() {
        match word.split_once('=') {
            Some((k, val))
                if !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'/' || b == b':') =>
            {
                out.push((k, val.to_string()))
            }
            _ => {
                if let Some((_, val)) = out.last_mut() {
                    val.push(' ');
                    val.push_str(word);
                }
            }
        }
    }
    out
}

/// This job's own options as the user gave them (`job_options`), from one `scontrol show job`
/// (one controller RPC per session); none when Slurm cannot be asked.
pub fn own_job_options() -> Vec<String> {
    let Ok(job) = var("SLURM_JOB_ID") else { return Vec::new() };
    match Command::new("scontrol").args(["show", "job", "-o", &job]).stderr(Stdio::null()).output() {
        Ok(o) if o.status.success() => job_options(String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("")),
        _ => {
            tracing::warn!(job, "scontrol show job failed: a continuation job gets only the run's shape");
            Vec::new()
        }
    }
}

/// The job's CPUs on all its nodes together.
pub fn job_cpus() -> Option<u64> {
    let runs = cpu_runs(&std::env::var("SLURM_JOB_CPUS_PER_NODE").ok()?)?;
    Some(runs.iter().map(|&(n, reps)| (n * reps) as u64).sum())
}

/// The address other nodes reach this one at: the node name as the cluster resolves it (Slurm's
/// NodeHostname/NodeAddr are usually resolvable names), else the host name, else loopback.
/// Loopback addresses (Debian maps the host name to 127.0.1.1) are taken only when nothing
/// else resolves, as on a one-machine test cluster.
pub fn node_ip() -> IpAddr {
    let mut names = Vec::new();
    if let Ok(n) = std::env::var("SLURMD_NODENAME") {
        names.push(n);
    }
    names.push(htc_host::hostname());
    let addrs: Vec<IpAddr> = names
        .iter()
        .filter_map(|n| (n.as_str(), 0).to_socket_addrs().ok())
        .flatten()
        .map(|a: SocketAddr| a.ip())
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4() && !a.is_loopback())
        .or_else(|| addrs.iter().find(|a| !a.is_loopback()))
        .or_else(|| addrs.first())
        .copied()
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// Listens on `addr`, the node's cluster address, so that agents are not reachable on every
/// interface of the node. When that address is not one of this host's (a node name that resolves
/// elsewhere), listens on every interface instead and says so.
pub fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let l = bind(addr)?;
    deepen_backlog(&l)?;
    Ok(l)
}

/// Connections the kernel holds for the listener until it accepts them (capped by
/// `net.core.somaxconn`, 4096 on current kernels). The accept loop takes no more connections
/// than it can authenticate at once (`auth::MAX_PENDING`); the rest wait here, and past this
/// queue a client's SYN is retried by its kernel: thousands of clients at once wait, none is
/// refused. (The standard library listens with a queue of 128.)
pub const BACKLOG: i32 = 4096;

fn deepen_backlog(l: &std::net::TcpListener) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: listen(2) on a socket this listener owns; on Linux a second listen of a listening
    // socket only sets its queue's length.
    if unsafe { libc::listen(l.as_raw_fd(), BACKLOG) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    match std::net::TcpListener::bind(addr) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable && !addr.ip().is_unspecified() => {
            tracing::warn!(%addr, "the node's address is not on this host; listening on every interface");
            let any = if addr.is_ipv4() {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            } else {
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
            };
            std::net::TcpListener::bind(SocketAddr::new(any, addr.port()))
        }
        r => r,
    }
}

/// The job's time left, from `squeue` (one controller RPC): `None` for no limit, or if it
/// cannot be asked.
pub fn time_left() -> Option<u64> {
    let job = var("SLURM_JOB_ID").ok()?;
    let out = Command::new("squeue").args(["-h", "-j", &job, "-o", "%L"]).output().ok()?;
    parse_time_left(String::from_utf8_lossy(&out.stdout).trim())
}

/// The grace Slurm gives job `job` now that it was signalled: what is left of its partition's
/// `GraceTime` since its `PreemptTime`, while it still runs. `None` for a job not preempted (a
/// cancel, its time limit, a signal sent by hand), a grace longer than `GRACE_AT_MOST_US`, or if
/// Slurm cannot be asked. Two to four controller RPCs (the job, its partition), once a run. Times are
/// asked in UTC so that they compare with this clock.
pub fn grace_left(job: &str) -> Option<u64> {
    let started = std::time::Instant::now();
    let show = |what: &str, name: &str| -> Option<String> {
        let out = Command::new("scontrol")
            .args(["show", what, "-o", name])
            .env("TZ", "UTC")
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").to_string())
    };
    // The partition's GraceTime is asked beside the job's state: on a controller busy with the
    // preemption each ask may take a second, and the agents wait `GIVE_BACK_US` in all.
    let partition = var("SLURM_JOB_PARTITION").ok().filter(|p| !p.is_empty() && !p.contains(','));
    let part_look = partition.clone().map(|p| std::thread::spawn(move || show("partition", &p)));
    // Slurm may signal a preempted job's steps before a look sees the preemption recorded; a
    // job that runs on unpreempted was signalled by hand.
    let mut job_line = String::new();
    for look in 0..PREEMPT_LOOKS {
        if look > 0 {
            std::thread::sleep(std::time::Duration::from_millis(150));
        }
        job_line = show("job", job)?;
        let state = job_line.split_whitespace().find_map(|w| w.strip_prefix("JobState=")).unwrap_or("");
        if !runs(state) || !job_line.contains("PreemptTime=None") {
            break;
        }
    }
    let state = job_line.split_whitespace().find_map(|w| w.strip_prefix("JobState=")).unwrap_or("").to_string();
    let preempted = runs(&state) && !job_line.contains("PreemptTime=None");
    let looked_ms = started.elapsed().as_millis() as u64;
    if !preempted {
        tracing::warn!(job, %state, looked_ms, "signalled; Slurm records no preemption: no grace");
        return None; // the partition's look, if started, ends on its own
    }
    let part_line = match part_look.and_then(|h| h.join().ok()).flatten() {
        Some(line) => line,
        None => show("partition", &scontrol_fields(&job_line).into_iter().find(|(k, _)| *k == "Partition")?.1)?,
    };
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    let grace = parse_grace(&job_line, &part_line, now_s);
    tracing::warn!(
        job,
        grace_us = grace,
        looked_ms = started.elapsed().as_millis() as u64,
        "signalled; Slurm records a preemption"
    );
    grace
}

/// Whether Slurm's name for a job's state is one of a running job: a job being signalled (a
/// preemption's SIGTERM, on 24.11 under load) shows `SIGNALING` instead of `RUNNING`.
fn runs(state: &str) -> bool {
    matches!(state, "RUNNING" | "SIGNALING")
}

/// How many times `grace_left` looks for the job's preemption before it takes the signal for
/// none: within the agents' wait for the leader's word (`GIVE_BACK_US`, 5 s).
const PREEMPT_LOOKS: u32 = 3;

/// The longest grace `grace_left` takes for one: sites give preempted jobs minutes, not hours.
const GRACE_AT_MOST_US: u64 = 30 * 60 * 1_000_000;

/// A signalled job's grace, from its `scontrol show job -o` and its partition's `scontrol show
/// partition -o` lines (times in UTC), at `now_s` (see `grace_left`).
pub fn parse_grace(job_line: &str, part_line: &str, now_s: u64) -> Option<u64> {
    let job = scontrol_fields(job_line);
    let field = |k: &str| job.iter().find(|(key, _)| *key == k).map(|(_, v)| v.as_str());
    if !runs(field("JobState")?) {
        return None;
    }
    let preempted_s = slurm_time(field("PreemptTime")?)?;
    let part = scontrol_fields(part_line);
    let grace_s: u64 = part.iter().find(|(k, _)| *k == "GraceTime")?.1.parse().ok()?;
    let left_us = (preempted_s + grace_s).checked_sub(now_s)? * 1_000_000;
    (left_us > 0 && grace_s * 1_000_000 <= GRACE_AT_MOST_US).then_some(left_us)
}

/// The release of the Slurm this runs under, from `scontrol --version` (`slurm 24.11.5`): its
/// major and minor numbers. A local call, no controller RPC.
pub fn release() -> Option<(u32, u32)> {
    let out = Command::new("scontrol").arg("--version").stderr(Stdio::null()).output().ok()?;
    parse_release(&String::from_utf8_lossy(&out.stdout))
}

/// `slurm 24.11.5` (or `slurm-wlm 22.05.8`) -> (24, 11).
pub fn parse_release(s: &str) -> Option<(u32, u32)> {
    let version = s.split_whitespace().nth(1)?;
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The first release whose scheduler was seen to take a shrunk job's nodes at once: after a
/// job shrank, 22.05's started no pending job for up to three minutes on the test cluster
/// (only its periodic pass did), 24.11's started them at once (`tests/slurm/htc-jobs.sh
/// nodes_given_back`). Releases between are untested, so nodes are given back there only when
/// asked (`--htc-keep-nodes=no`).
pub const GIVES_BACK_FROM: (u32, u32) = (24, 11);

/// Shrinks job `job` to its nodes but `given` (`scontrol update JobId=… NodeList=…`, the job's
/// own right): Slurm frees them at once for the jobs that wait. Its nodes are the job's node
/// list as this process got it (`SLURM_JOB_NODELIST`), expanded by `scontrol show hostnames`.
/// scontrol writes the job's new environment as `slurm_job_<id>_resize.{sh,csh}` into its
/// working directory: it runs in `dir` (the run directory), and they are removed.
pub fn shrink_job(job: &str, given: &[String], dir: &std::path::Path) -> anyhow::Result<()> {
    let list = var("SLURM_JOB_NODELIST")?;
    let out = Command::new("scontrol").args(["show", "hostnames", &list]).output().context("running scontrol")?;
    anyhow::ensure!(
        out.status.success(),
        "scontrol show hostnames {list}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let nodes = String::from_utf8_lossy(&out.stdout).into_owned();
    let keep: Vec<&str> = nodes.split_whitespace().filter(|n| !given.iter().any(|g| g == n)).collect();
    anyhow::ensure!(!keep.is_empty(), "no node of {list} would be left");
    let arg = format!("NodeList={}", keep.join(","));
    let out = Command::new("scontrol")
        .args(["update", &format!("JobId={job}"), &arg])
        .current_dir(dir)
        .output()
        .context("running scontrol")?;
    for ext in ["sh", "csh"] {
        let _ = std::fs::remove_file(dir.join(format!("slurm_job_{job}_resize.{ext}")));
    }
    anyhow::ensure!(
        out.status.success(),
        "scontrol update JobId={job} {arg}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    tracing::info!(job, %arg, "the job was shrunk");
    Ok(())
}

/// Whether Slurm says job `job` is over (any state but pending, configuring, running or
/// suspended; or gone from its memory). None when `squeue` cannot be asked.
pub fn job_over(job: &str) -> Option<bool> {
    let out = Command::new("squeue").args(["-h", "-t", "all", "-j", job, "-o", "%T"]).output().ok()?;
    let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        // A purged job: "Invalid job id specified".
        return String::from_utf8_lossy(&out.stderr).contains("Invalid job id").then_some(true);
    }
    Some(!(runs(&state) || matches!(state.as_str(), "PENDING" | "CONFIGURING" | "SUSPENDED" | "RESIZING")))
}

/// `squeue`'s `%L`: `[days-][hours:]minutes:seconds`, or `UNLIMITED`/`NOT_SET`; in µs.
pub fn parse_time_left(s: &str) -> Option<u64> {
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().ok()?, r),
        None => (0, s),
    };
    let parts: Vec<u64> = rest.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let secs = match parts.as_slice() {
        [m, s] => m * 60 + s,
        [h, m, s] => h * 3600 + m * 60 + s,
        _ => return None,
    };
    Some((days * 86_400 + secs) * 1_000_000)
}

/// When `sbatch --test-only` says a job would start ("sbatch: Job 12 to start at
/// 2026-11-27T03:10:00 using 2 processors on nodes n2 in partition debug", on stderr), in
/// seconds, reading the time as if it were UTC: only compared with other answers of the same
/// clock. `None` for any other answer (a refusal, a job that could never run).
pub fn test_only_start(text: &str) -> Option<u64> {
    slurm_time(text.split(" to start at ").nth(1)?.split_whitespace().next()?)
}

/// A time as Slurm prints it (`2026-11-27T03:10:00`), in seconds since the epoch as if it were
/// UTC; `None` for anything else (`None`, `Unknown`).
fn slurm_time(at: &str) -> Option<u64> {
    let (date, time) = at.split_once('T')?;
    let num = |s: &str| s.parse::<u64>().ok();
    let d: Vec<u64> = date.split('-').map(num).collect::<Option<_>>()?;
    let t: Vec<u64> = time.split(':').map(num).collect::<Option<_>>()?;
    let ([y, mo, day], [h, mi, se]) = (d.as_slice(), t.as_slice()) else { return None };
    if !(1..=12).contains(mo) || !(1..=31).contains(day) || *h > 23 || *mi > 59 || *se > 60 || *y < 1970 {
        return None;
    }
    Some(days_since_epoch(*y, *mo, *day) * 86_400 + h * 3600 + mi * 60 + se)
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`), for dates from 1970 on.
fn days_since_epoch(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refusal_of_sbatch_s_is_one_line() {
        let said = b"sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)\n";
        assert_eq!(
            super::sbatch_refusal(said),
            "sbatch: error: QOSMaxSubmitJobPerUserLimit; error: Batch job submission failed: Job violates \
accounting/QOS policy (job submit limit, user's size and/or time limits)"
        );
        assert_eq!(super::sbatch_refusal(b"\n"), "sbatch: ");
    }

    #[test]
    fn the_start_sbatch_test_only_foresees_is_read() {
        let line = "sbatch: Job 57 to start at 2026-11-27T03:10:05 using 2 processors on nodes n2 in partition debug";
        assert_eq!(super::test_only_start(line), Some(1_795_749_005));
        let later =
            "sbatch: Job 58 to start at 2026-11-28T00:00:00 using 4 processors on nodes n[1-2] in partition debug";
        assert_eq!(super::test_only_start(later).unwrap() - super::test_only_start(line).unwrap(), 74_995);
        assert_eq!(super::test_only_start("2000-03-01T00:00:00"), None, "no sentence, no time");
        assert_eq!(super::test_only_start("Job 1 to start at 2000-03-01T00:00:00 using"), Some(951_868_800));
        for bad in [
            "sbatch: error: Requested node configuration is not available",
            "Job 1 to start at soon",
            "Job 1 to start at 2026-13-01T00:00:00",
        ] {
            assert_eq!(super::test_only_start(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_continuation_keeps_the_options_the_user_gave_the_first_job() {
        let line = "JobId=17 JobName=my long name UserId=u(1000) GroupId=u(1000) MCS_label=N/A Priority=1 \
            Nice=0 Account=proj QOS=normal JobState=RUNNING Reason=None Dependency=(null) TimeLimit=00:01:00 \
            Partition=debug NodeList=n[1-4] NumNodes=4 NumCPUs=8 CPUs/Task=1 ReqB:S:C:T=0:0:*:* \
            TRES=cpu=8,mem=1200M,node=4 MinCPUsNode=1 MinMemoryNode=300M MinTmpDiskNode=0 Features=fast&big \
            ReqNodeList=n[1-4] ExcNodeList=n[7-9] OverSubscribe=NO Reservation=(null) Contiguous=0 Licenses=(null) Comment=a run TresPerNode=gres:gpu:2 \
            MailUser=u@x MailType=END Command=(null)";
        assert_eq!(
            super::job_options(line),
            [
                "--job-name=my long name",
                "--time=00:01:00",
                "--partition=debug",
                "--account=proj",
                "--qos=normal",
                "--mem=300M",
                "--constraint=fast&big",
                "--exclude=n[7-9]",
                "--gres=gpu:2",
                "--mail-user=u@x",
                "--mail-type=END",
                "--comment=a run",
                "--exclusive",
            ]
        );
        let shared =
            "JobId=3 JobName=wrap Account=(null) QOS=(null) TimeLimit=UNLIMITED Partition=p ExcNodeList=(null) \
            MinMemoryCPU=1G OverSubscribe=OK WorkDir=/home/u StdErr=/home/u/slurm-3.out StdIn=/dev/null \
            StdOut=/home/u/slurm-3.out";
        assert_eq!(
            super::job_options(shared),
            ["--job-name=wrap", "--time=UNLIMITED", "--partition=p", "--mem-per-cpu=1G"],
            "Slurm's default output is left to Slurm"
        );
    }

    #[test]
    fn a_continuation_writes_its_output_where_the_user_asked_with_its_own_id() {
        // sbatch -o tl-%j.out -e logs/err-%j-%u.txt, job 74
        let line = "JobId=74 JobName=tl WorkDir=/home/u StdErr=/home/u/logs/err-74-u.txt StdIn=/dev/null \
            StdOut=/home/u/tl-74.out";
        assert_eq!(
            super::job_options(line),
            ["--job-name=tl", "--output=/home/u/tl-%j.out", "--error=/home/u/logs/err-%j-u.txt"]
        );
        // -o alone: stderr goes with stdout, as for the first job.
        let line = "JobId=74 WorkDir=/w StdErr=/w/all.log StdOut=/w/all.log";
        assert_eq!(super::job_options(line), ["--output=/w/all.log"]);
        // The id only where it stands whole, and not in the directory (a directory named for
        // the first job is where the user chose to write).
        assert_eq!(super::output_pattern("/runs/74/out-174-74.txt", "74"), "/runs/74/out-174-%j.txt");
        assert_eq!(super::output_pattern("o74", "74"), "o%j");
        assert_eq!(super::output_pattern("/w/x.out", ""), "/w/x.out");
    }

    #[test]
    fn the_release_is_read_from_scontrol_s_version() {
        assert_eq!(super::parse_release("slurm 24.11.5\n"), Some((24, 11)));
        assert_eq!(super::parse_release("slurm-wlm 22.05.8"), Some((22, 5)));
        assert_eq!(super::parse_release("slurm"), None);
        assert!(super::parse_release("slurm 22.05.8") < Some(super::GIVES_BACK_FROM));
    }

    #[test]
    fn a_grace_is_what_is_left_of_the_partition_s_grace_time_since_the_preemption() {
        use super::parse_grace;
        let job = |state: &str, at: &str| {
            format!("JobId=7 JobName=my job UserId=u(1) JobState={state} Reason=None PreemptTime={at} Partition=scavenger NodeList=n[1-4]")
        };
        let part = "PartitionName=scavenger AllowGroups=ALL GraceTime=15 PreemptMode=CANCEL";
        let at = 1_795_749_005; // 2026-11-27T03:10:05
        let preempted = job("RUNNING", "2026-11-27T03:10:05");
        assert_eq!(parse_grace(&preempted, part, at + 4), Some(11_000_000));
        assert_eq!(parse_grace(&preempted, part, at + 15), None, "over");
        assert_eq!(parse_grace(&job("RUNNING", "None"), part, at), None, "a signal that is no preemption");
        let signalling = job("SIGNALING", "2026-11-27T03:10:05");
        assert_eq!(parse_grace(&signalling, part, at), Some(15_000_000), "SIGNALING is running");
        assert_eq!(parse_grace(&job("COMPLETING", "2026-11-27T03:10:05"), part, at), None);
        assert_eq!(parse_grace(&preempted, "PartitionName=scavenger GraceTime=0", at), None, "no grace");
        assert_eq!(parse_grace(&preempted, "PartitionName=scavenger GraceTime=7200", at), None, "hours: none");
        assert_eq!(parse_grace("", part, at), None);
    }

    #[test]
    fn squeue_time_left_is_read_in_every_form_it_takes() {
        assert_eq!(parse_time_left("59:58"), Some(3_598_000_000));
        assert_eq!(parse_time_left("1:00:00"), Some(3_600_000_000));
        assert_eq!(parse_time_left("2-03:04:05"), Some((2 * 86_400 + 3 * 3600 + 4 * 60 + 5) * 1_000_000));
        for none in ["UNLIMITED", "NOT_SET", "", "1:2:3:4", "x-1:00"] {
            assert_eq!(parse_time_left(none), None, "{none}");
        }
    }

    use super::*;

    #[test]
    fn agents_sharing_a_node_split_its_cpus_without_overlap() {
        assert_eq!(node_share(48, 24, 0), (0, 2));
        assert_eq!(node_share(48, 24, 23), (46, 2));
        // 50 CPUs, 24 agents: the first two get 3.
        assert_eq!(node_share(50, 24, 0), (0, 3));
        assert_eq!(node_share(50, 24, 1), (3, 3));
        assert_eq!(node_share(50, 24, 2), (6, 2));
        assert_eq!(node_share(50, 24, 23), (48, 2));
        for (cpus, agents) in [(48, 24), (50, 24), (7, 3), (2, 2), (1, 1)] {
            let mut next = 0;
            for l in 0..agents {
                let (first, n) = node_share(cpus, agents, l);
                assert_eq!(first, next, "{cpus} {agents} {l}");
                next += n;
            }
            assert_eq!(next, cpus);
        }
        // More agents than CPUs (a node smaller than the smallest): each still gets one.
        assert_eq!(node_share(2, 4, 3).1, 1);
    }

    #[test]
    fn cpus_per_node_spec() {
        assert_eq!(cpus_on_node("2(x3),1", 0), Some(2));
        assert_eq!(cpus_on_node("2(x3),1", 2), Some(2));
        assert_eq!(cpus_on_node("2(x3),1", 3), Some(1));
        assert_eq!(cpus_on_node("2(x3),1", 4), None);
        assert_eq!(cpus_on_node("48", 0), Some(48));
        assert_eq!(cpus_on_node("x", 0), None);
    }
}
