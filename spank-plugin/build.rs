//! Generates the SPANK bindings from `include/spank_wrapper.h`.
//!
//! Environment (all optional):
//! * `SLURM_INCLUDE_DIR`: directory that holds `slurm/spank.h` when it is not in the default
//!   include path (e.g. `/opt/slurm/include`).
//! * `HTC_DEFAULT_AGENT`: absolute path of the agent used when plugstack.conf gives no
//!   `agent=` argument (default `/usr/bin/htc-agent`).
//! * `HTC_SLURM_VERSION_OVERRIDE`: for tests only, a `SLURM_VERSION_NUMBER` (e.g. `0x170200`)
//!   the plugin claims to be built for instead of the headers' one, so that the version guard
//!   (src/version.rs) can be exercised on a cluster of the headers' release. Build such a
//!   variant into its own `CARGO_TARGET_DIR`.
//!
//! `spank_prepend_task_argv` (Slurm >= 23.11) is not linked but looked up at run time
//! (src/spank.rs), so one plugin binary never references a function its host may lack; the
//! symbol `slurm_spank_init_failure_mode` (Slurm >= 25.05) is defined only when the headers
//! define `ESPANK_JOB_FAILURE`.

use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let header = manifest.join("../include/spank_wrapper.h");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=HTC_DEFAULT_AGENT");
    println!("cargo:rerun-if-env-changed=HTC_SLURM_VERSION_OVERRIDE");

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

    // Slurm >= 25.05: a plugin may say that a failure of its init fails the job rather than
    // drain the node (src/plugin.rs); only where the headers define the value.
    println!("cargo:rustc-check-cfg=cfg(spank_init_failure_mode)");
    if text.contains("ESPANK_JOB_FAILURE") {
        println!("cargo:rustc-cfg=spank_init_failure_mode");
    }

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out_dir.join("spank_bindings.rs"), text).expect("write bindings");

    let version_override = match env::var("HTC_SLURM_VERSION_OVERRIDE") {
        Ok(s) if !s.trim().is_empty() => {
            let v = parse_version_number(s.trim()).unwrap_or_else(|| {
                panic!("HTC_SLURM_VERSION_OVERRIDE must be a SLURM_VERSION_NUMBER like 0x170200, got {s:?}")
            });
            println!("cargo:warning=spank_htc built as if for Slurm {}.{:02} (HTC_SLURM_VERSION_OVERRIDE={s}): for tests only", v >> 16, (v >> 8) & 0xff);
            format!("Some({v:#08x})")
        }
        _ => "None".to_string(),
    };
    std::fs::write(
        out_dir.join("build_info.rs"),
        format!("/// `HTC_SLURM_VERSION_OVERRIDE` at build time.\npub const SLURM_VERSION_OVERRIDE: Option<u32> = {version_override};\n"),
    )
    .expect("write build_info.rs");
}

/// `0xMMmmuu` or decimal, with a plausible major (Slurm's are two-digit years).
fn parse_version_number(s: &str) -> Option<u32> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16).ok()?,
        None => s.parse().ok()?,
    };
    ((1..=0xff_ffff).contains(&v) && (v >> 16) >= 1 && ((v >> 8) & 0xff) <= 12).then_some(v)
}
