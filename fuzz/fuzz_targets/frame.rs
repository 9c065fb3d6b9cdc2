//! Network frames: `htc::frame::decode` on arbitrary bytes (the body after the length prefix),
//! and, for what decodes, an encode/decode round trip.
//! The assertions are in `checks/frame.rs`, which `cargo test` also runs on the committed corpus.
#![no_main]

#[path = "../checks/frame.rs"]
mod check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check::check(data));
