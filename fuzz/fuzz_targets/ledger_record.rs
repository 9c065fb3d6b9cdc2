//! Ledger task records: `htc::ledger::decode_record` on arbitrary bytes, a round trip for what
//! decodes, and every single-bit flip of it refused.
//! The assertions are in `checks/ledger_record.rs`, which `cargo test` also runs on the committed corpus.
#![no_main]

#[path = "../checks/ledger_record.rs"]
mod check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check::check(data);
});
