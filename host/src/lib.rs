//! What every layer asks of this machine: its name, the wall clock, and what a filesystem can
//! still take and what kind it is. At the bottom of the crates that do I/O, once, so that the
//! store (whose replica records the host it was made on) and the executors (which stamp starts
//! and ends, and must not blame a task for a full disk) need nothing of each other or above.

use std::path::Path;

/// This node's host name ("?" if the system will not say).
pub fn hostname() -> String {
    match nix::unistd::gethostname() {
        Ok(name) => name.to_string_lossy().into_owned(),
        Err(_) => "?".into(),
    }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
#[inline]
pub fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Microseconds on the wall clock as this process first read it, advanced since by the
/// monotonic clock alone. What a process decides by time (leases, deadlines, a silent agent's
/// loss) reads this: a wall clock stepped (NTP, a virtual machine paused and resumed) moves
/// none of it, where a step forward past a lease once left every executor fenced for good,
/// while what it stamps (starts, ends) stays in the wall clock's terms.
pub fn steady_us() -> u64 {
    static ANCHOR: std::sync::OnceLock<(std::time::Instant, u64)> = std::sync::OnceLock::new();
    let (at, wall) = ANCHOR.get_or_init(|| (std::time::Instant::now(), now_us()));
    wall + at.elapsed().as_micros() as u64
}

/// Free space below this counts as a full disk: a task that fails then is not blamed for it (nor
/// uses up its retries), and the ledger says the disk is full instead of tearing a record.
pub const NEARLY_FULL: u64 = 1 << 20;

/// Bytes an unprivileged writer may still use on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
}

/// Whether the filesystem holding `dir` is (nearly) full; one that cannot be asked is not.
pub fn is_full(dir: &Path) -> bool {
    free_bytes(dir).is_some_and(|b| b < NEARLY_FULL)
}

/// The kind of shared filesystem holding `dir`, if it is one: LMDB's lock file and memory map are
/// not safe there, and every page it writes would cross the network.
pub fn network_fs(dir: &Path) -> Option<&'static str> {
    let st = nix::sys::statfs::statfs(dir).ok()?;
    // Magic numbers from statfs(2) and the filesystems' own headers.
    match st.filesystem_type().0 as u64 {
        0x6969 => Some("NFS"),
        0x0BD0_0BD0 => Some("Lustre"),
        0x4750_4653 => Some("GPFS"),
        0xFF53_4D42 | 0xFE53_4D42 => Some("SMB"),
        0x1983_0326 => Some("BeeGFS"),
        0x00C3_6400 => Some("CephFS"),
        0x6573_5546 => Some("FUSE"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steady_clock_starts_at_the_wall_and_never_goes_back() {
        let (wall, first) = (now_us(), steady_us());
        assert!(first.abs_diff(wall) < 1_000_000, "{first} against the wall's {wall}");
        let mut last = first;
        for _ in 0..1000 {
            let t = steady_us();
            assert!(t >= last);
            last = t;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(steady_us() >= first + 5_000);
    }

    #[test]
    fn free_space_of_a_real_directory_and_none_for_a_missing_one() {
        assert!(free_bytes(Path::new("/")).is_some());
        assert!(free_bytes(Path::new("/no/such/dir/here")).is_none());
        assert!(!is_full(Path::new("/no/such/dir/here")), "unknown is not full");
        assert_eq!(network_fs(Path::new("/proc")), None);
    }

    #[test]
    fn a_name_and_a_clock_after_2020() {
        assert!(!hostname().is_empty());
        assert!(now_us() > 1_577_836_800_000_000);
    }
}
