//! The `plugin_config` fuzz target's committed corpus (`fuzz/corpus/plugin_config/`) replayed
//! through the target's own checks (`fuzz/checks/plugin_config.rs`) in `cargo test`. The plugin
//! is a cdylib with nothing to link against, so its FFI-free `config.rs` is compiled in here by
//! path, as the fuzz target does.

#[allow(dead_code)]
#[path = "../src/config.rs"]
mod config;

#[path = "../../fuzz/checks/plugin_config.rs"]
mod check;
#[path = "../../fuzz/checks/replay.rs"]
mod replay;

#[test]
fn plugin_config_corpus() {
    replay::replay("plugin_config", check::check);
}
