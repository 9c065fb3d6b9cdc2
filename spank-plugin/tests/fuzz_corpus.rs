//! The `plugin_config` fuzz target's committed corpus (`fuzz/corpus/plugin_config/`) replayed
//! through the target's own checks (`fuzz/checks/plugin_config.rs`) in `cargo test`. The plugin
//! is a cdylib with nothing to link against, so its FFI-free modules are compiled in here by
//! path, as the fuzz target does.

#[allow(dead_code)]
#[path = "../src/agent.rs"]
mod agent;
#[allow(dead_code)]
#[path = "../src/argv.rs"]
mod argv;
#[allow(dead_code)]
#[path = "../src/config.rs"]
mod config;
#[allow(dead_code)]
#[path = "../src/options.rs"]
mod options;
#[allow(dead_code)]
#[path = "../src/plugstack.rs"]
mod plugstack;
#[allow(dead_code)]
#[path = "../src/request.rs"]
mod request;
#[allow(dead_code)]
#[path = "../src/submit.rs"]
mod submit;
#[allow(dead_code)]
#[path = "../src/value.rs"]
mod value;

#[path = "../../fuzz/checks/plugin_config.rs"]
mod check;
#[path = "../../fuzz/checks/replay.rs"]
mod replay;

#[test]
fn plugin_config_corpus() {
    replay::replay("plugin_config", check::check);
}
