//! Generates the SPANK bindings from `include/spank_wrapper.h` and detects optional API.
//!
//! Environment (all optional):
//! * `SLURM_INCLUDE_DIR`: directory that holds `slurm/spank.h` when it is not in the default
//!   include path (e.g. `/opt/slurm/include`).
//! * `HTC_DEFAULT_AGENT`: absolute path of the agent used when plugstack.conf gives no
//!   `agent=` argument (default `/usr/bin/htc-agent`).
//!
//! Emits `cfg(htc_has_prepend_argv)` when the headers declare `spank_prepend_task_argv`
//! (Slurm >= 23.11; absent on 22.05).

use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let header = manifest.join("../include/spank_wrapper.h");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=HTC_DEFAULT_AGENT");
    println!("cargo:rustc-check-cfg=cfg(htc_has_prepend_argv)");

    let agent = env::var("HTC_DEFAULT_AGENT").unwrap_or_else(|_| "/usr/bin/htc-agent".to_string());
    if !agent.starts_with('/') || agent.contains('\0') {
        panic!("HTC_DEFAULT_AGENT must be an absolute path, got {agent:?}");
    }
    println!("cargo:rustc-env=HTC_BUILD_DEFAULT_AGENT={agent}");

    let mut builder = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_function("spank_.*")
        .allowlist_function("slurm_(error|info|verbose|debug|debug2|debug3|spank_log)")
        .allowlist_type("spank_.*")
        .allowlist_var("ESPANK_.*|SLURM_VERSION_NUMBER|SPANK_OPTION_MAXLEN|HTC_SLURM_BATCH_SCRIPT")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    if let Ok(t) = bindgen::RustTarget::stable(75, 0) {
        builder = builder.rust_target(t);
    }
    if let Some(dir) = env::var_os("SLURM_INCLUDE_DIR") {
        builder = builder.clang_arg(format!("-I{}", PathBuf::from(dir).display()));
    }
    let bindings = builder.generate().expect(
        "bindgen failed on include/spank_wrapper.h: is <slurm/spank.h> installed (libslurm-dev / slurm-devel)?",
    );
    let text = bindings.to_string();

    for needed in
        ["fn spank_option_register", "fn spank_job_control_setenv", "fn spank_get_item", "SLURM_VERSION_NUMBER"]
    {
        if !text.contains(needed) {
            panic!("bindings lack `{needed}`: unsupported <slurm/spank.h>");
        }
    }
    if text.contains("fn spank_prepend_task_argv") {
        println!("cargo:rustc-cfg=htc_has_prepend_argv");
    }

    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR")).join("spank_bindings.rs");
    std::fs::write(&out, text).expect("write bindings");
}
