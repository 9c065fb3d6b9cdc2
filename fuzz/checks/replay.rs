//! Replays a committed corpus, `fuzz/corpus/TARGET/`, through a target's checks on a stable
//! toolchain. Included by the `cargo test` replays in node-agent and spank-plugin (both one
//! directory below the repository root).

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// Runs `check` on every file of the target's corpus and gives back what it said of each; fails
/// if the corpus is missing or empty (a replay of nothing proves nothing) and names every input
/// whose check panicked.
pub fn replay<R>(target: &str, check: impl Fn(&[u8]) -> R) -> Vec<R> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("fuzz corpus {}: {e}", dir.display()));
    let mut inputs: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "fuzz corpus {} is empty", dir.display());
    let mut said = Vec::new();
    let mut failed = Vec::new();
    for p in &inputs {
        let data = fs::read(p).unwrap();
        match catch_unwind(AssertUnwindSafe(|| check(&data))) {
            Ok(r) => said.push(r),
            Err(_) => failed.push(p.display().to_string()),
        }
    }
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs fail the checks:\n{}",
        failed.len(),
        inputs.len(),
        failed.join("\n")
    );
    eprintln!("{target}: {} inputs replayed", inputs.len());
    said
}
