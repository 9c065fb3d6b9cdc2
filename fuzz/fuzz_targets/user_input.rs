//! `--tasks` id lists, `#HTC sweep` words and the live view file on arbitrary bytes.
//! The assertions are in `checks/user_input.rs`, which `cargo test` also runs on the committed corpus.
#![no_main]

#[path = "../checks/user_input.rs"]
mod check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check::check(data));
