//! What a running task did, for its stuck watch (`htc_core::stuck`): the CPU time and the bytes
//! read and written of its process and every live descendant, from /proc. A process's own
//! counters hold those of the children it reaped (`cutime`/`cstime`, and its `io` file), so a
//! walk down the tree from the task's process counts everything that ran, and only the task's
//! own processes are read, however many others the node runs.
//!
//! The children of a process are found in `/proc/PID/task/TID/children`; a kernel without it
//! (CONFIG_PROC_CHILDREN off) gives the task's own process and what it reaped, which is the
//! whole of a task that waits for each child.

use htc_core::stuck::Sample;

use crate::memwatch::read_into;

/// Processes read at most per task: a fork bomb does not make one look unbounded.
const MAX_PROCS: usize = 4096;

/// The counters of `pid` and its live descendants; None if `pid` itself cannot be read (gone,
/// or its `io` refused), which the watch never counts as idle.
pub fn tree_sample(pid: libc::pid_t) -> Option<Sample> {
    let tick_us = 1_000_000 / clock_ticks();
    let mut buf = Vec::with_capacity(1024);
    let mut todo = vec![pid];
    let mut total = Sample::default();
    let mut seen = 0;
    let mut blind = false;
    while let Some(p) = todo.pop() {
        let Some((ticks, (io, calls), threads)) = counters(p, &mut buf) else {
            if p == pid {
                return None;
            }
            // A descendant that ended meanwhile: its parent counts it once reaped.
            continue;
        };
        // A process that used CPU but made no read or write call at all (none of its libraries
        // loaded) has counters the kernel did not keep for this reader: what it did is unseen.
        blind |= ticks > 0 && calls == 0;
        total.cpu_us += ticks * tick_us;
        total.io_bytes += io;
        seen += 1;
        if seen >= MAX_PROCS {
            break;
        }
        children(p, threads, &mut buf, &mut todo);
    }
    (!blind).then_some(total)
}

/// Clock ticks of `pid` (with its reaped children's), its bytes read and written with its
/// read and write calls, its threads.
fn counters(pid: libc::pid_t, buf: &mut Vec<u8>) -> Option<(u64, (u64, u64), u64)> {
    read_into(&format!("/proc/{pid}/stat"), buf).ok()?;
    let (ticks, threads) = parse_stat_times(buf)?;
    read_into(&format!("/proc/{pid}/io"), buf).ok()?;
    Some((ticks, parse_io(buf)?, threads))
}

/// Pushes the children of each of `pid`'s threads onto `todo`.
fn children(pid: libc::pid_t, threads: u64, buf: &mut Vec<u8>, todo: &mut Vec<libc::pid_t>) {
    let mut of_thread = |tid: &str, buf: &mut Vec<u8>| {
        if read_into(&format!("/proc/{pid}/task/{tid}/children"), buf).is_ok() {
            let text = String::from_utf8_lossy(buf);
            todo.extend(text.split_ascii_whitespace().filter_map(|c| c.parse::<libc::pid_t>().ok()));
        }
    };
    if threads <= 1 {
        return of_thread(&pid.to_string(), buf);
    }
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
    for e in dir.flatten() {
        if let Some(tid) = e.file_name().to_str() {
            of_thread(tid, buf);
        }
    }
}

fn clock_ticks() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().filter(|&t| t > 0).unwrap_or(100) as u64
}

/// utime + stime + cutime + cstime (fields 14 to 17) and num_threads (field 20) of a
/// /proc/PID/stat line, fields counted after the command name's last ')'.
pub fn parse_stat_times(stat: &[u8]) -> Option<(u64, u64)> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut f = rest.split_ascii_whitespace();
    // After the name: state is field 3, so field N is the (N-3)th after it.
    let utime = f.nth(11)?;
    let (stime, cutime, cstime) = (f.next()?, f.next()?, f.next()?);
    let ticks = |v: &str| v.parse::<i64>().ok().map(|t| t.max(0) as u64);
    let times = ticks(utime)? + ticks(stime)? + ticks(cutime)? + ticks(cstime)?;
    // priority (18) and nice (19), then num_threads.
    let threads = f.nth(2)?.parse().ok()?;
    Some((times, threads))
}

/// rchar + wchar of a /proc/PID/io file (every byte its read and write calls moved, files,
/// pipes and sockets alike), and syscr + syscw (those calls).
pub fn parse_io(io: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(io).ok()?;
    let field = |name: &str| -> Option<u64> { text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()) };
    Some((field("rchar:")? + field("wchar:")?, field("syscr:")? + field("syscw:")?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stat_and_io_lines_parse() {
        // utime 5, stime 3, cutime 7, cstime 1; 4 threads.
        let line = b"4242 (my (odd) prog) S 1 4240 4240 0 -1 4194560 100 0 0 0 5 3 7 1 20 0 4 0 777 123456789 2560 18446744073709551615";
        assert_eq!(parse_stat_times(line), Some((16, 4)));
        assert_eq!(parse_stat_times(b"12 (x) S 1 2 3"), None, "cut short");
        let io =
            b"rchar: 1000\nwchar: 24\nsyscr: 3\nsyscw: 2\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_io(io), Some((1024, 5)));
        assert_eq!(parse_io(b"rchar: 1\n"), None);
    }

    fn sample_after(cmd: &str, wait: Duration) -> (Option<Sample>, Option<Sample>) {
        let mut child = std::process::Command::new("sh").args(["-c", cmd]).spawn().expect("sh runs");
        let pid = child.id() as libc::pid_t;
        std::thread::sleep(Duration::from_millis(100));
        let first = tree_sample(pid);
        std::thread::sleep(wait);
        let then = tree_sample(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        (first, then)
    }

    #[test]
    fn a_busy_grandchild_is_counted_and_a_sleeping_tree_does_nothing() {
        // The shell waits for a subshell that spins: the CPU is two levels down.
        // (A spinner that makes no system call at all reads as unseen: never idle either.)
        match sample_after("(while :; do :; done); true", Duration::from_millis(500)) {
            (Some(a), Some(b)) => assert!(b.cpu_us - a.cpu_us > 200_000, "{a:?} then {b:?}"),
            (_, b) => assert_eq!(b, None, "unseen, not idle"),
        }
        let (a, b) = sample_after("sleep 5; true", Duration::from_millis(500));
        let (a, b) = (a.expect("readable"), b.expect("readable"));
        assert!(b.cpu_us - a.cpu_us < 20_000 && b.io_bytes == a.io_bytes, "{a:?} then {b:?}");
        // Output is I/O; where the kernel keeps a process's counters from this reader, the
        // sample is refused rather than read as idle.
        let writer = "import time\nwhile True:\n    open('/dev/null', 'wb').write(b'x' * 100)\n    time.sleep(0.01)";
        match sample_after(&format!("python3 -c \"{writer}\"; true"), Duration::from_millis(500)) {
            (Some(a), Some(b)) => assert!(b.io_bytes - a.io_bytes > 2500, "{a:?} then {b:?}"),
            (_, b) => assert_eq!(b, None, "unseen, not idle"),
        }
    }

    #[test]
    fn a_process_that_is_gone_cannot_be_read() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as libc::pid_t;
        child.wait().unwrap();
        assert_eq!(tree_sample(pid), None);
    }
}
