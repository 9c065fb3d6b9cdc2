//! Free space on the disk that holds the tasks' output: a task that fails because that disk is
//! full must not be blamed for it (nor use up its retries).

use std::path::Path;

/// Free space below this counts as a full disk. The same bound as the ledger's
/// (`htc_store::storage::NEARLY_FULL`; the node's tests hold the two together), kept here so that
/// the executors need nothing of the store.
pub const NEARLY_FULL: u64 = 1 << 20;

/// Bytes an unprivileged writer may still use on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_space_of_a_real_directory_and_none_for_a_missing_one() {
        assert!(free_bytes(Path::new("/")).is_some());
        assert!(free_bytes(Path::new("/no/such/dir/here")).is_none());
    }
}
