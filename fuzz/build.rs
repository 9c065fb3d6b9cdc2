//! spank-plugin's config.rs reads its default agent path with `env!` from the plugin's own
//! build script; give the fuzz build the same default.
fn main() {
    println!("cargo:rerun-if-env-changed=HTC_DEFAULT_AGENT");
    let agent = std::env::var("HTC_DEFAULT_AGENT").unwrap_or_else(|_| "/usr/bin/htc-agent".to_string());
    println!("cargo:rustc-env=HTC_BUILD_DEFAULT_AGENT={agent}");
}
