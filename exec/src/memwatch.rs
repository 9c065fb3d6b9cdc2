//! A task's `mem=` as a limit: the resident memory of each watched task's process group (the
//! task and everything it started), summed over one pass of /proc. Works on any kernel and in
//! any cgroup setup (cgroup v1, as on this project's test machines, or a v2 tree the job may not
//! write to); the price is that a task is caught at the next look (`EVERY`), not at the byte.

use std::collections::HashMap;
use std::time::Duration;

/// How often running tasks with a limit are looked at.
pub const EVERY: Duration = Duration::from_millis(100);

/// Resident MiB of each process group in `groups`, from one pass over /proc.
pub fn group_rss_mb(groups: &[libc::pid_t]) -> HashMap<libc::pid_t, u64> {
    let mut pages: HashMap<libc::pid_t, u64> = groups.iter().map(|&g| (g, 0)).collect();
    let Ok(dir) = std::fs::read_dir("/proc") else { return HashMap::new() };
    let mut buf = Vec::with_capacity(512);
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        // A process that ended meanwhile is simply not counted.
        if read_into(&format!("/proc/{pid}/stat"), &mut buf).is_err() {
            continue;
        }
        if let Some((pgrp, rss)) = parse_stat(&buf) {
            if let Some(p) = pages.get_mut(&pgrp) {
                *p += rss;
            }
        }
    }
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(0).max(4096) as u64;
    pages.into_iter().map(|(g, p)| (g, (p * page) >> 20)).collect()
}

/// The whole of a (/proc) file into `buf`, in place of what it held.
pub(crate) fn read_into(path: &str, buf: &mut Vec<u8>) -> std::io::Result<()> {
    use std::io::Read;
    buf.clear();
    std::fs::File::open(path)?.read_to_end(buf).map(|_| ())
}

/// The process group (field 5) and resident pages (field 24) of a /proc/PID/stat line. The
/// command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'.
pub fn parse_stat(stat: &[u8]) -> Option<(libc::pid_t, u64)> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut f = rest.split_ascii_whitespace();
    // After the name: state (3), ppid (4), pgrp (5) ... rss is field 24, the 22nd after it.
    let pgrp = f.nth(2)?.parse().ok()?;
    let rss = f.nth(18)?.parse().ok()?;
    Some((pgrp, rss))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_whatever_the_command_name() {
        let line = b"4242 (my (odd) prog) S 1 4240 4240 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 777 123456789 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat(line), Some((4240, 2560)));
        assert_eq!(parse_stat(b"12 (x) S 1"), None, "cut short");
        assert_eq!(parse_stat(b"no name here"), None);
    }

    #[test]
    fn a_group_that_holds_memory_is_seen_holding_it() {
        // A child in a group of its own that touches 64 MiB, then waits.
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("perl")
            .args(["-e", "$x = 'a' x (64 << 20); sleep 30"])
            .stdout(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .expect("perl runs");
        let pgid = child.id() as libc::pid_t;
        let mut seen = 0;
        for _ in 0..100 {
            seen = group_rss_mb(&[pgid])[&pgid];
            if seen >= 64 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!((64..200).contains(&seen), "{seen} MiB");
        assert_eq!(group_rss_mb(&[pgid])[&pgid], 0, "gone: nothing");
    }
}
