//! The SPANK plugin's pure option handling: plugstack.conf arguments, `--htc-*` values, the
//! job-control variables read back in slurmstepd, and the private-environment filter.
//!
//! spank-plugin is a cdylib with no rlib to link, so its FFI-free modules are compiled in here
//! by path (they need only std, htc-core, each other and `HTC_BUILD_DEFAULT_AGENT`, see
//! build.rs).
//! The assertions are in `checks/plugin_config.rs`, which `cargo test` also runs on the committed corpus.
#![no_main]

#[allow(dead_code)]
#[path = "../../spank-plugin/src/agent.rs"]
mod agent;
#[allow(dead_code)]
#[path = "../../spank-plugin/src/argv.rs"]
mod argv;
#[allow(dead_code)]
#[path = "../../spank-plugin/src/config.rs"]
mod config;
#[allow(dead_code)]
#[path = "../../spank-plugin/src/options.rs"]
mod options;
#[allow(dead_code)]
#[path = "../../spank-plugin/src/plugstack.rs"]
mod plugstack;
#[allow(dead_code)]
#[path = "../../spank-plugin/src/request.rs"]
mod request;
#[allow(dead_code)]
#[path = "../../spank-plugin/src/submit.rs"]
mod submit;
#[allow(dead_code)]
#[path = "../../spank-plugin/src/value.rs"]
mod value;

#[path = "../checks/plugin_config.rs"]
mod check;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check::check(data));
