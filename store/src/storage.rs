//! What the filesystems under a run can still take: a full disk must be an error with a name, not
//! a task "failure" that uses up retries or a torn record that hides what was done.

use std::path::Path;

/// Free space below this counts as a full disk: tasks that fail then are not blamed for it. The
/// executors keep the same bound (`htc_exec::disk::NEARLY_FULL`).
pub const NEARLY_FULL: u64 = 1 << 20;

/// Bytes an unprivileged writer may still use on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
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

/// Whether the filesystem holding `dir` is (nearly) full.
pub fn is_full(dir: &Path) -> bool {
    free_bytes(dir).is_some_and(|b| b < NEARLY_FULL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_of_a_real_directory_and_none_for_a_missing_one() {
        assert!(free_bytes(Path::new("/")).is_some());
        assert!(free_bytes(Path::new("/no/such/dir/here")).is_none());
        assert!(!is_full(Path::new("/no/such/dir/here")), "unknown is not full");
        assert_eq!(network_fs(Path::new("/proc")), None);
    }
}
