//! PMI2 server replies: the length-prefixed `cmd=…;k=v;…;` messages and the PMI1-style
//! answer to `init`, through the client's own parsing (`htc::pmi::fuzz_parse_*`).
//! The assertions are in `checks/pmi.rs`, which `cargo test` also runs on the committed corpus.
#![no_main]

#[path = "../checks/pmi.rs"]
mod check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check::check(data));
