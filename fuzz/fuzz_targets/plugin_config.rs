//! The SPANK plugin's pure option handling: plugstack.conf arguments, `--htc-*` values, the
//! job-control variables read back in slurmstepd, and the private-environment filter.
//!
//! spank-plugin is a cdylib with no rlib to link, so its FFI-free `config.rs` is compiled in
//! here by path (it needs only std, htc-core and `HTC_BUILD_DEFAULT_AGENT`, see build.rs).
//! The assertions are in `checks/plugin_config.rs`, which `cargo test` also runs on the committed corpus.
#![no_main]

#[allow(dead_code)]
#[path = "../../spank-plugin/src/config.rs"]
mod config;

#[path = "../checks/plugin_config.rs"]
mod check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check::check(data));
