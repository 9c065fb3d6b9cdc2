//! Ledger replicas (snapshot and journal files): `htc::replica::decode_frames` on arbitrary bytes,
//! and, for what decodes, a round trip.
//! The assertions are in `checks/replica.rs`, which `cargo test` also runs on the committed corpus.
#![no_main]

#[path = "../checks/replica.rs"]
mod check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check::check(data));
