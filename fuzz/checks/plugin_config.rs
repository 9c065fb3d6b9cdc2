//! The `plugin_config` target's checks: the SPANK plugin's pure option handling (plugstack.conf
//! arguments, `--htc-*` values, the job-control variables read back in slurmstepd, and the
//! private-environment filter). Expects the plugin's `config.rs` as a sibling module `config`.
//!
//! Shared by the fuzz target (`fuzz_targets/plugin_config.rs`) and the stable replay of the committed
//! corpus `corpus/plugin_config/` in `cargo test` (`spank-plugin/tests/fuzz_corpus.rs`), so both make exactly these assertions.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use super::config::*;

pub fn check(data: &[u8]) {
    // NUL separates words: plugstack arguments and environment values are C strings.
    let words: Vec<&[u8]> = data.split(|&b| b == 0).collect();
    let texts: Vec<String> = words.iter().map(|w| String::from_utf8_lossy(w).into_owned()).collect();

    // plugstack.conf arguments.
    match parse_plugin_args(&texts) {
        Ok(cfg) => {
            assert!(cfg.agent.is_absolute());
            assert!(cfg.ledger_dir.as_ref().is_none_or(|d| d.is_absolute()));
            assert!(cfg.fanout.is_none_or(|k| (FANOUT_MIN..=FANOUT_MAX).contains(&k)));
        }
        Err(errors) => {
            assert!(!errors.is_empty() && errors.len() <= texts.len());
            assert!(errors.iter().all(|e| !e.is_empty()));
        }
    }

    // Option values, as the option callbacks see them.
    for t in &texts {
        if let Ok(n) = parse_retries(t) {
            assert!(n <= RETRIES_MAX);
        }
        if let Ok(k) = parse_fanout(t) {
            assert!((FANOUT_MIN..=FANOUT_MAX).contains(&k));
        }
        if let Ok(m) = parse_output(t) {
            assert_eq!(parse_output(m.name()), Ok(m));
        }
        // `--htc-grow`: a value taken reads back the same from what the batch step is given.
        if let Ok(g) = parse_grow(t) {
            assert!(g.max_jobs >= 1 && g.nodes >= 1 && g.minutes.is_none_or(|m| m >= 1));
            assert_eq!(parse_grow(&g.to_arg()), Ok(g));
        }
        match parse_join(t) {
            Ok(JoinTarget::Job(j)) => assert!(j >= 1),
            Ok(JoinTarget::Dir(d)) => assert!(!d.as_os_str().is_empty()),
            Err(_) => {}
        }
    }

    // The job-control variables, read back in slurmstepd from a (possibly corrupt) environment.
    let names = [JC_FILE, JC_RETRIES, JC_FANOUT, JC_OUTPUT].map(job_env_name);
    let getenv = |name: &str| {
        let i = names.iter().position(|n| n == name)?;
        words.get(i).filter(|w| !w.is_empty() || i == 0).map(|w| OsString::from_vec(w.to_vec()))
    };
    if let Ok(Some(req)) = JobRequest::from_job_env(getenv) {
        assert!(req.task_file.is_absolute());
        // What sbatch would store must read back the same.
        let vars = req.job_control_vars();
        let env: Vec<(String, OsString)> = vars.iter().map(|(n, v)| (job_env_name(n), v.clone())).collect();
        let back = JobRequest::from_job_env(|n| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()));
        assert_eq!(back, Ok(Some(req.clone())));
        let argv = agent_argv(&PluginConfig::default(), &req, &[OsString::from("/s")]).unwrap();
        assert_eq!(argv.iter().filter(|a| a.as_bytes() == SCRIPT_FLAG.as_bytes()).count(), 1);
    }

    // The environment filter never panics, and names what it filters.
    let names = private_env_names(words.iter().copied());
    assert!(names.len() <= words.len());
    for n in &names {
        assert!(!n.as_bytes().contains(&b'='));
        assert!(is_private_env(n.as_bytes()));
    }
    let _ = display_argv(&words.iter().map(|w| OsString::from_vec(w.to_vec())).collect::<Vec<_>>());
}
