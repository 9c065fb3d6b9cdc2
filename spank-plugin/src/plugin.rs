//! The exported SPANK symbols and callbacks.
//!
//! | context | what happens |
//! | --- | --- |
//! | allocator (sbatch) | options registered; `--htc=FILE` or `--htc-join=RUN` checked (exit 255 on error); values stored with `spank_job_control_setenv` |
//! | local (srun) | options registered (they reach srun through the job env); nothing else |
//! | remote (slurmstepd) | options registered and recorded; in `task_init` of the **batch step** of an HTC job only: exec of `htc-agent lead …` (`lead --join-run RUNDIR …` for a joining job) |
//! | slurmd | plugstack arguments checked and errors logged once |
//!
//! Loaded by a Slurm of another major.minor than the one it was built for, the plugin is
//! inert (see [`version_guard`]): it registers its options only to refuse them, logs one line
//! in slurmd, fails the batch step of an HTC job that reaches it, and does nothing else.
//!
//! Every callback runs through [`guard`]: a panic becomes `slurm_error` + return -1.

use std::ffi::{OsStr, OsString};
use std::os::raw::{c_char, c_int, c_uint};
use std::os::unix::ffi::OsStrExt;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

use crate::agent::{self, AgentPathError};
use crate::argv;
use crate::config::UserOptions;
use crate::options::{self, Mode, OPTIONS};
use crate::plugstack::{self, PluginConfig};
use crate::request::{self, BatchRequest};
use crate::spank::{self, log, Context, OptionSpec, Spank};
use crate::submit::{self, Allocator, Refusal};
use crate::version::{self, Release};
use crate::{build_info, ffi};

// ---- plugin identification (SPANK_PLUGIN(htc, 1)) ----

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static plugin_name: [u8; 4] = *b"htc\0";
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static plugin_type: [u8; 6] = *b"spank\0";
/// Slurm's loader accepts the plugin only if this equals its own major.minor. It is the
/// headers' `SLURM_VERSION_NUMBER` unless [`version_guard`] found another release loading the
/// plugin (an atomic, so that it lives in writable memory; the loader reads it as a
/// `uint32_t`, which has the same layout).
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static plugin_version: AtomicU32 = AtomicU32::new(BUILD_VERSION);
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static spank_plugin_version: c_uint = 1;
/// Slurm 25.05 and later read this when the plugin's `slurm_spank_init` fails: the job fails,
/// instead of their default (`ESPANK_NODE_FAILURE`) of draining the node. The plugin fails
/// nothing there by design (a bad plugstack line leaves it inert), so this is the guarantee
/// should that ever change. Defined only where the headers have it (build.rs): no older release
/// is handed a symbol it does not know.
#[cfg(spank_init_failure_mode)]
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static slurm_spank_init_failure_mode: c_int = ffi::ESPANK_JOB_FAILURE as c_int;

const _: () = assert!(ffi::HTC_SLURM_BATCH_SCRIPT as u64 == request::BATCH_STEP_ID as u64);
const _: () = assert!(std::mem::size_of::<AtomicU32>() == std::mem::size_of::<c_uint>());
const _: () = assert!(plugin_name.len() == options::PLUGIN_NAME.len() + 1);

// ---- the version guard ----

/// The release the plugin was built for: the headers', or `HTC_SLURM_VERSION_OVERRIDE`
/// (tests only).
#[allow(clippy::unnecessary_cast)] // bindgen's type for the macro may differ between headers
const BUILD_VERSION: u32 = match build_info::SLURM_VERSION_OVERRIDE {
    Some(v) => v,
    None => ffi::SLURM_VERSION_NUMBER as u32,
};

/// `Release::version_number()` of the other release that loaded the plugin; 0: not inert.
static INERT_HOST: AtomicU32 = AtomicU32::new(0);

/// ELF constructor: runs inside `dlopen`, which Slurm's loader calls before it reads
/// `plugin_version` (`plugin_load_from_file` in src/common/plugin.c, 22.05 to 26.x).
#[used]
#[link_section = ".init_array"]
static VERSION_GUARD: extern "C" fn() = version_guard;

/// Asks the host for its release (`slurm_api_version()` of its libslurmfull, see
/// [`version`]); if it is not the one the plugin was built for, claims the host's release so
/// that the loader accepts the plugin, and makes every callback inert. The inert callbacks
/// only use SPANK functions whose prototypes, and enum values, spank.h has not changed from
/// 21.08 to 26.x (`spank_context`, `spank_option_register`, `spank_get_item(S_JOB_STEPID)`,
/// `spank_getenv`, `slurm_error`/`slurm_verbose`/`slurm_debug`): that is what makes loading a
/// plugin built for another release safe, and why nothing else runs. Without the symbol
/// (not a Slurm process) nothing changes and Slurm's own check decides.
extern "C" fn version_guard() {
    // Nothing here can panic, but a constructor must never unwind into the dynamic loader.
    let _ = panic::catch_unwind(|| {
        let api = spank::host_symbol(c"slurm_api_version").map(|sym| {
            // SAFETY: `long slurm_api_version(void)` in slurm.h of every release; it returns
            // a compile-time constant and needs no initialisation.
            let f = unsafe { std::mem::transmute::<*mut libc::c_void, unsafe extern "C" fn() -> libc::c_long>(sym) };
            // SAFETY: see above.
            unsafe { f() as i64 }
        });
        if let version::Mode::Inert { host, .. } = version::decide(BUILD_VERSION, api) {
            INERT_HOST.store(host.version_number(), Ordering::SeqCst);
            plugin_version.store(host.version_number(), Ordering::SeqCst);
        }
    });
}

/// `(built for, running under)` when the plugin is inert.
fn inert() -> Option<(Release, Release)> {
    match INERT_HOST.load(Ordering::SeqCst) {
        0 => None,
        host => Some((Release::from_version_number(BUILD_VERSION), Release::from_version_number(host))),
    }
}

fn inert_reason() -> String {
    match inert() {
        Some((built, host)) => version::inert_reason(built, host),
        None => String::new(),
    }
}

// ---- per-process state (one process = one sbatch, or one slurmstepd step) ----

struct State {
    /// `None` until `slurm_spank_init` parsed the plugstack arguments.
    config: Option<Result<PluginConfig, Vec<String>>>,
    opts: UserOptions,
    /// Inert: an option that activates the plugin was seen (its value does not matter).
    inert_htc_option: bool,
}

static STATE: Mutex<State> = Mutex::new(State { config: None, opts: UserOptions::new(), inert_htc_option: false });

fn state() -> MutexGuard<'static, State> {
    // Single-threaded use; a poisoned lock only means an earlier callback panicked.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

// ---- the panic guard ----

static HOOK: Once = Once::new();
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Runs a callback body; a panic is logged with `slurm_error` and turned into -1.
fn guard(what: &str, f: impl FnOnce() -> c_int) -> c_int {
    HOOK.call_once(|| {
        // Replace the default hook (which writes to stderr and may touch thread-locals) with
        // one that only records the message for the log line below.
        panic::set_hook(Box::new(|info| {
            let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
                (*s).to_string()
            } else if let Some(s) = info.payload().downcast_ref::<String>() {
                s.clone()
            } else {
                "unknown panic".to_string()
            };
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{msg}{at}"));
        }));
    });
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(rc) => rc,
        Err(_) => {
            let msg = LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
            // Logging itself must not unwind out of here.
            let _ = panic::catch_unwind(|| log::error(&format!("htc: internal error in {what}: {msg}")));
            -1
        }
    }
}

// ---- options ----

/// How messages name the option registered with `val`.
fn opt_name(val: c_int) -> String {
    options::from_val(val).map_or_else(|| "--htc-?".to_string(), |i| OPTIONS[i].flag())
}

/// Registers every option of the table; `Err` with the message of the first that failed.
fn register_options(sp: &Spank) -> Result<(), String> {
    for (i, def) in OPTIONS.iter().enumerate() {
        let spec = OptionSpec {
            name: def.name.to_bytes_with_nul(),
            arginfo: Some(def.arginfo.to_bytes_with_nul()),
            usage: def.usage.to_bytes_with_nul(),
            val: options::val(i),
            value_optional: def.kind.value_optional(),
        };
        sp.register_option(&spec, option_cb).map_err(|e| format!("htc: cannot register option {}: {e}", def.flag()))?;
    }
    Ok(())
}

/// # Safety
///
/// Only Slurm calls it, as the callback of the options this plugin registers: `optarg` is null
/// or a NUL-terminated string valid for the call.
unsafe extern "C" fn option_cb(val: c_int, optarg: *const c_char, remote: c_int) -> c_int {
    guard("option callback", || {
        let arg: OsString = if optarg.is_null() {
            OsString::new()
        } else {
            // SAFETY: not null, so a NUL-terminated string valid for the call (see above).
            OsStr::from_bytes(unsafe { std::ffi::CStr::from_ptr(optarg) }.to_bytes()).to_os_string()
        };
        let ctx = spank::context();
        if inert().is_some() {
            return inert_option(val, &arg, remote, ctx);
        }
        if remote != 0 || ctx == Context::Remote {
            remote_option(val, &arg);
            0
        } else if ctx == Context::Allocator {
            allocator_option(val, &arg)
        } else {
            // srun (local context) also sees the options through the job environment: they
            // mean nothing there, and must never fail an srun.
            log::debug(&format!("htc: {}={} ignored in this context", opt_name(val), arg.to_string_lossy()));
            0
        }
    })
}

/// Inert: sbatch/salloc refuse every `--htc*` option with the reason (exit 255, nothing
/// queued); srun and slurmstepd only note that an option that activates the plugin was seen.
fn inert_option(val: c_int, arg: &OsStr, remote: c_int, ctx: Context) -> c_int {
    if remote == 0 && ctx == Context::Allocator {
        log::error(&format!("htc: {}={}: {}", opt_name(val), arg.to_string_lossy(), inert_reason()));
        return -1;
    }
    // Any value marks an HTC job (which an inert batch step must fail, see below).
    if options::from_val(val).is_some_and(|i| OPTIONS[i].starts_a_job()) {
        state().inert_htc_option = true;
    }
    0
}

/// slurmstepd: record the values (sbatch validated them; nothing is opened here, as root). A
/// value that does not parse is dropped.
fn remote_option(val: c_int, arg: &OsStr) {
    if let Some(i) = options::from_val(val) {
        state().opts.set(i, OPTIONS[i].kind.parse(arg).ok());
    }
}

/// sbatch/salloc: validate; -1 makes the command print "Invalid --htc… argument" and exit
/// 255 without submitting anything.
fn allocator_option(val: c_int, arg: &OsStr) -> c_int {
    let Some(i) = options::from_val(val) else { return 0 };
    let def = &OPTIONS[i];
    let name = def.flag();
    let fail = |msg: &str| {
        log::error(&format!("htc: {name}={}: {msg}", arg.to_string_lossy()));
        -1
    };
    if def.starts_a_job() {
        if let Some(rc) = refuse_activation(&name, &fail) {
            return rc;
        }
    }
    let value = match def.kind.parse(arg) {
        Ok(v) => v,
        Err(e) => return fail(&e),
    };
    // Before the check, which may read a long task file; whichever came first (command line
    // or `#SBATCH`), the later option is the one refused.
    let mut opts = state().opts.clone();
    opts.set(i, Some(value.clone()));
    if let Some(e) = opts.join_conflicts().first() {
        return fail(e);
    }
    match submit::check(def.kind, value) {
        Ok(accepted) => {
            if let Some(note) = accepted.note {
                log::verbose(&format!("htc: {note}"));
            }
            state().opts.set(i, Some(accepted.value));
            0
        }
        Err(Refusal::Value(e)) => fail(&e),
        Err(Refusal::Lines(msgs)) => {
            for m in msgs {
                log::error(&format!("htc: {m}"));
            }
            -1
        }
    }
}

/// The checks before `--htc` or `--htc-join` may turn a job into an HTC job: a usable plugin
/// configuration, and sbatch. `Some(rc)`: refused (the reason logged).
fn refuse_activation(name: &str, fail: &dyn Fn(&str) -> c_int) -> Option<c_int> {
    let cfg = state().config.clone();
    match cfg {
        Some(Ok(c)) if c.disabled => {
            return Some(fail(
                "slurm-htc is disabled on this cluster (plugstack.conf says 'disabled'); ask your administrators",
            ))
        }
        Some(Ok(_)) => {}
        Some(Err(errors)) => {
            for e in &errors {
                log::error(&format!("htc: plugstack.conf: {e}"));
            }
            return Some(fail("slurm-htc is misconfigured on this cluster (see above); ask your administrators"));
        }
        None => return Some(fail("plugin not initialized")),
    }
    if let Ok(exe) = std::env::current_exe() {
        if submit::allocator_from_exe(&exe) == Allocator::Salloc {
            return Some(fail(&format!("{name} works with sbatch only (it replaces the batch script)")));
        }
    }
    None
}

// ---- callbacks ----

/// # Safety
/// Called by Slurm with its handle and the plugstack arguments.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_init(sp: ffi::spank_t, ac: c_int, av: *mut *mut c_char) -> c_int {
    guard("slurm_spank_init", || {
        if inert().is_some() {
            return inert_init(sp);
        }
        // SAFETY: Slurm's argc/argv.
        let args = unsafe { spank::plugin_args(ac, av) };
        let cfg = plugstack::parse_plugin_args(&args);
        let ctx = spank::context();
        if let (Context::Slurmd, Err(errors)) = (ctx, &cfg) {
            // slurmd starts once: the admin's log is the right place to complain.
            for e in errors {
                log::error(&format!("htc: plugstack.conf: {e}; --htc jobs will be refused"));
            }
        }
        {
            let mut st = state();
            st.config = Some(cfg);
            st.opts = UserOptions::default();
        }
        match ctx {
            Context::Allocator | Context::Local | Context::Remote => {
                // SAFETY: Slurm's handle for this callback.
                let Some(sp) = (unsafe { Spank::from_raw(sp) }) else { return -1 };
                match register_options(&sp) {
                    Ok(()) => 0,
                    Err(e) => {
                        log::error(&e);
                        -1
                    }
                }
            }
            _ => 0,
        }
    })
}

/// Inert `slurm_spank_init`: the options are registered so that using them is refused with
/// the reason (instead of sbatch's "unrecognized option"). slurmd, which starts once per
/// boot, logs the one line that tells the admin; sbatch/srun/salloc say it only with `-v`
/// and slurmstepd only at debug level, so jobs without `--htc` see no difference.
fn inert_init(sp: ffi::spank_t) -> c_int {
    let reason = inert_reason();
    let ctx = spank::context();
    match ctx {
        Context::Slurmd => log::error(&format!("htc: {reason}")),
        Context::Allocator | Context::Local => log::verbose(&format!("htc: {reason}")),
        Context::Remote => log::debug(&format!("htc: {reason}")),
        _ => {}
    }
    {
        let mut st = state();
        st.config = None;
        st.opts = UserOptions::default();
        st.inert_htc_option = false;
    }
    if matches!(ctx, Context::Allocator | Context::Local | Context::Remote) {
        // SAFETY: Slurm's handle for this callback.
        let Some(sp) = (unsafe { Spank::from_raw(sp) }) else { return 0 };
        // Not worth failing a plain job over: --htc just stays unknown.
        let _ = register_options(&sp);
    }
    0
}

/// # Safety
/// Called by Slurm with its handle.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_init_post_opt(sp: ffi::spank_t, _ac: c_int, _av: *mut *mut c_char) -> c_int {
    guard("slurm_spank_init_post_opt", || {
        if inert().is_some() || spank::context() != Context::Allocator {
            return 0;
        }
        let opts = state().opts.clone();
        let req = match BatchRequest::from_allocator(&opts) {
            Ok(Some(r)) => r,
            Ok(None) => {
                let orphans = opts.orphans();
                if !orphans.is_empty() {
                    log::info(&format!("htc: {} ignored without --htc=FILE", orphans.join(", ")));
                }
                return 0;
            }
            // The option callbacks refused these already; never queue such a job.
            Err(conflicts) => {
                for e in conflicts {
                    log::error(&format!("htc: {e}"));
                }
                return -1;
            }
        };
        // SAFETY: Slurm's handle for this callback.
        let Some(sp) = (unsafe { Spank::from_raw(sp) }) else { return -1 };
        for (name, value) in req.job_control_vars() {
            if let Err(e) = sp.job_control_setenv(name, &value, true) {
                // The batch step falls back to the option value (needs --export=ALL).
                log::error(&format!("htc: cannot pass {name} to the job: {e}"));
                return -1;
            }
        }
        0
    })
}

/// # Safety
/// Called by Slurm with its handle, in the task process, as the job's user.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_task_init(sp: ffi::spank_t, _ac: c_int, _av: *mut *mut c_char) -> c_int {
    let rc = guard("slurm_spank_task_init", || {
        if spank::context() != Context::Remote {
            return 0;
        }
        // SAFETY: Slurm's handle for this callback.
        let Some(sp) = (unsafe { Spank::from_raw(sp) }) else { return 0 };
        match sp.job_stepid() {
            Ok(request::BATCH_STEP_ID) => {}
            Ok(_) => return 0, // srun steps: never exec there (it would recurse)
            Err(e) => {
                log::debug(&format!("htc: S_JOB_STEPID: {e}"));
                return 0;
            }
        }
        if inert().is_some() {
            return inert_batch_task_init(&sp);
        }
        batch_task_init(&sp)
    });
    if rc != 0 && HTC_BATCH_TASK.load(Ordering::Relaxed) {
        // A panic after this became an HTC batch task: still never run the script.
        fatal("htc: internal error while starting the agent; the tasks were not run", EXIT_REFUSED);
    }
    rc
}

/// # Safety
/// Called by Slurm.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_exit(_sp: ffi::spank_t, _ac: c_int, _av: *mut *mut c_char) -> c_int {
    guard("slurm_spank_exit", || {
        let mut st = state();
        st.opts = UserOptions::default();
        st.config = None;
        st.inert_htc_option = false;
        0
    })
}

// ---- the batch step ----

/// Exit status of the batch step when the plugin cannot start the agent (shell conventions).
const EXIT_REFUSED: c_int = 125;
const EXIT_NOT_EXECUTABLE: c_int = 126;
const EXIT_NOT_FOUND: c_int = 127;

/// Set once this process is known to be the batch task of an HTC job: from then on the batch
/// script must never run, whatever happens.
static HTC_BATCH_TASK: AtomicBool = AtomicBool::new(false);

/// A fatal problem in the batch step of an HTC job. Returning -1 is not enough: for an
/// `optional` plugin Slurm ignores it and runs the batch script (measured on 22.05). So the
/// task process ends here, before the script is exec'd, and `code` becomes the job's exit
/// status. In the task process slurm_error also reaches the job's stderr (slurm-%j.out).
fn fatal(msg: &str, code: c_int) -> ! {
    log::error(msg);
    // SAFETY: _exit in the forked task process: no atexit handlers, no stdio flush of
    // buffers inherited from slurmstepd.
    unsafe { libc::_exit(code) }
}

/// Inert, batch step: an HTC job that was accepted by a submit host with a matching plugin
/// (e.g. during a rolling upgrade) must not quietly run its script as a plain job, which
/// would run the prologue but none of the tasks and still succeed. It fails as with
/// `disabled` (exit 125, the reason in the job's output). Any other batch step is untouched.
fn inert_batch_task_init(sp: &Spank) -> c_int {
    let present = |name: &str| matches!(sp.getenv(name), Ok(Some(_)));
    let htc_job = OPTIONS
        .iter()
        .filter(|def| def.starts_a_job())
        .any(|def| present(&request::job_env_name(def.job_control)) || present(&def.option_job_env()))
        || state().inert_htc_option;
    if !htc_job {
        return 0;
    }
    HTC_BATCH_TASK.store(true, Ordering::Relaxed);
    fatal(&format!("htc: {}; the tasks were not run", inert_reason()), EXIT_REFUSED)
}

fn batch_task_init(sp: &Spank) -> c_int {
    let from_env = BatchRequest::from_job_env(|name| sp.getenv(name).ok().flatten());
    let req = match from_env {
        Ok(Some(r)) => r,
        Ok(None) => {
            let opts = state().opts.clone();
            let submit_dir = sp.getenv("SLURM_SUBMIT_DIR").ok().flatten();
            let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
            match BatchRequest::from_remote_options(&opts, submit_dir.as_deref().map(Path::new), &cwd) {
                Ok(Some(r)) => r,
                Ok(None) => return 0, // not an HTC job: untouched
                Err(e) => {
                    HTC_BATCH_TASK.store(true, Ordering::Relaxed);
                    fatal(&format!("htc: {e}; the tasks were not run"), EXIT_REFUSED)
                }
            }
        }
        Err(e) => {
            HTC_BATCH_TASK.store(true, Ordering::Relaxed);
            fatal(&format!("htc: corrupt job environment: {e}; the tasks were not run"), EXIT_REFUSED)
        }
    };
    HTC_BATCH_TASK.store(true, Ordering::Relaxed);

    let cfg = match state().config.clone() {
        Some(Ok(c)) => c,
        Some(Err(errors)) => {
            for e in &errors {
                log::error(&format!("htc: plugstack.conf: {e}"));
            }
            fatal(
                "htc: slurm-htc is misconfigured on this node (plugstack.conf); the tasks were not run",
                EXIT_REFUSED,
            );
        }
        None => fatal("htc: plugin not initialized; the tasks were not run", EXIT_REFUSED),
    };
    if cfg.disabled {
        fatal("htc: slurm-htc has been disabled on this cluster; the tasks were not run", EXIT_REFUSED);
    }

    // The agent runs with exactly the job's credentials, never anyone else's (slurmstepd
    // dropped root's before task_init; this makes sure nothing, not even a saved id or a
    // supplementary group, is left of them).
    let job_uid = match sp.job_uid() {
        Ok(u) => u,
        Err(e) => fatal(&format!("htc: S_JOB_UID: {e}; the tasks were not run"), EXIT_REFUSED),
    };
    let job_gid = match sp.job_gid() {
        Ok(g) => g,
        Err(e) => fatal(&format!("htc: S_JOB_GID: {e}; the tasks were not run"), EXIT_REFUSED),
    };
    let job_groups = sp.job_supplementary_gids().unwrap_or_default();
    if let Err(e) = agent::check_identity(&spank::identity(), job_uid, job_gid, &job_groups) {
        fatal(&format!("htc: refusing to start the agent: {e}; the tasks were not run"), EXIT_REFUSED);
    }

    // Every element of an array would run all the tasks again. (The elements of an array of
    // joining jobs would each join the run, which is no harm.)
    if let (Mode::Run, Ok(array_id)) = (req.mode, sp.job_array_id()) {
        if array_id != 0 {
            fatal(
                &format!("htc: --htc cannot be combined with --array (array job {array_id}): every element would run all the tasks; the tasks were not run"),
                EXIT_REFUSED,
            );
        }
    }

    let job_argv = match sp.job_argv() {
        Ok(a) => a,
        Err(e) => fatal(&format!("htc: S_JOB_ARGV: {e}; the tasks were not run"), EXIT_REFUSED),
    };
    start_agent(sp, &cfg, &req, &job_argv)
}

/// Starts the agent in place of the batch script, after checking that only root can change
/// what `agent=` points to (see [`agent::check_agent_path`]). The canonical path is what
/// runs; argv[0] stays the configured path where the plugin execs itself.
fn start_agent(sp: &Spank, cfg: &PluginConfig, req: &BatchRequest, job_argv: &[OsString]) -> c_int {
    let argv = match argv::agent_argv(cfg, req, job_argv) {
        Ok(a) => a,
        Err(e) => fatal(&format!("htc: {e}; the tasks were not run"), EXIT_REFUSED),
    };
    let exe = match agent::check_agent_path(&cfg.agent) {
        Ok(p) => p,
        Err(e) => {
            let code = match e {
                AgentPathError::NotFound(_) => EXIT_NOT_FOUND,
                AgentPathError::Inaccessible(_) => EXIT_NOT_EXECUTABLE,
                AgentPathError::Unsafe(_) => EXIT_REFUSED,
            };
            fatal(
                &format!(
                    "htc: cannot start the agent {}: {e} (plugstack.conf: agent=); the tasks were not run",
                    cfg.agent.display()
                ),
                code,
            )
        }
    };

    // Slurm >= 23.11: slurmstepd execs `agent … --script <script> <args>` itself.
    let mut prefix = argv::agent_argv_prefix(cfg, req);
    prefix[0] = exe.clone().into_os_string();
    if spank::host_symbol(c"spank_prepend_task_argv").is_some() {
        // Keep the private variables away from the agent (see agent::is_private_env).
        if let Ok(env) = sp.job_env() {
            for name in agent::private_env_names(env.iter().map(|e| e.as_bytes())) {
                let _ = sp.unsetenv(&name);
            }
        }
        log::verbose(&format!("htc: batch step runs {} <script>", argv::display_argv(&prefix)));
        match sp.prepend_task_argv(&prefix) {
            Some(Ok(())) => return 0,
            Some(Err(e)) => fatal(&format!("htc: spank_prepend_task_argv: {e}; the tasks were not run"), EXIT_REFUSED),
            None => {} // cannot happen (just looked up); exec below
        }
    }

    // Slurm < 23.11: become the agent right here (we are the task process, as the user,
    // with the job's stdio and cwd), with the job's environment.
    let env = match sp.job_env() {
        Ok(e) => e,
        Err(e) => fatal(&format!("htc: S_JOB_ENV: {e}; the tasks were not run"), EXIT_REFUSED),
    };
    let env: Vec<std::ffi::CString> = env.into_iter().filter(|e| !agent::is_private_env(e.as_bytes())).collect();
    let c_exe = spank::os_cstring(exe.as_os_str());
    let c_argv: Vec<std::ffi::CString> = argv.iter().map(|a| spank::os_cstring(a)).collect();
    let mut argv_ptrs: Vec<*const c_char> = c_argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());

    log::verbose(&format!("htc: batch step execs {}", argv::display_argv(&argv)));
    reset_signals();
    // SAFETY: NUL-terminated path, NULL-terminated argv/envp arrays of live C strings.
    unsafe { libc::execve(c_exe.as_ptr(), argv_ptrs.as_ptr(), env_ptrs.as_ptr()) };
    let err = std::io::Error::last_os_error();
    let code = match err.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => EXIT_NOT_FOUND,
        _ => EXIT_NOT_EXECUTABLE,
    };
    fatal(
        &format!(
            "htc: cannot start the agent {}: {err} (plugstack.conf: agent=); the tasks were not run",
            cfg.agent.display()
        ),
        code,
    )
}

/// Default dispositions and an empty signal mask, as a freshly exec'd batch script has.
fn reset_signals() {
    // SAFETY: plain libc calls on local data; invalid/uncatchable signals just fail.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        for sig in 1..=libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}
