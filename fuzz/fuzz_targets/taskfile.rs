//! Task files: `check` on arbitrary bytes, plus the streaming `Parser` read through a tiny
//! `BufReader` (so lines straddle buffer refills) with per-task invariants.
//! The assertions are in `checks/taskfile.rs`, which `cargo test` also runs on the committed corpus.
#![no_main]

#[path = "../checks/taskfile.rs"]
mod check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check::check(data));
