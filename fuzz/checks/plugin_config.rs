//! The `plugin_config` target's checks: the SPANK plugin's pure option handling (plugstack.conf
//! arguments, `--htc-*` values, the job-control variables read back in slurmstepd, and the
//! private-environment filter). Expects the plugin's pure modules as sibling modules of the same
//! names (`agent`, `argv`, `config`, `options`, `plugstack`, `request`, `value`).
//!
//! Shared by the fuzz target (`fuzz_targets/plugin_config.rs`) and the stable replay of the committed
//! corpus `corpus/plugin_config/` in `cargo test` (`spank-plugin/tests/fuzz_corpus.rs`), so both make exactly these assertions.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use super::agent::{is_private_env, private_env_names};
use super::argv::{agent_argv, display_argv, SCRIPT_FLAG};
use super::options::OPTIONS;
use super::plugstack::{parse_plugin_args, PluginConfig, FANOUT_MAX, FANOUT_MIN};
use super::request::{job_env_name, BatchRequest};
use super::value::{JoinTarget, Kind, Value};

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

    // Option values, as the option callbacks see them: every option's parser on every word. A
    // value taken reads back the same from what the job-control environment and the agent get.
    for w in &words {
        for def in OPTIONS {
            let Ok(v) = def.kind.parse(std::ffi::OsStr::from_bytes(w)) else { continue };
            assert_eq!(def.kind.parse(&v.to_arg()), Ok(v.clone()));
            match (def.kind, v) {
                (Kind::Number { min, max }, Value::Number(n)) => assert!((min..=max).contains(&n)),
                (Kind::JobId, Value::Number(n)) => assert!(n >= 1),
                (Kind::Grow, Value::Grow(g)) => {
                    assert!(g.max_jobs >= 1 && g.nodes >= 1 && g.minutes.is_none_or(|m| m >= 1))
                }
                (Kind::Run, Value::Run(JoinTarget::Job(j))) => assert!(j >= 1),
                (Kind::Run, Value::Run(JoinTarget::Dir(d))) => assert!(!d.as_os_str().is_empty()),
                (Kind::Output, Value::Output(_))
                | (Kind::Plan, Value::Plan(_))
                | (Kind::Idle, Value::Idle(_))
                | (Kind::Switch, Value::Switch(_)) => {}
                (Kind::TaskFile, Value::Path(p)) => assert_eq!(p.as_os_str().as_bytes(), *w),
                (kind, v) => panic!("{kind:?} parsed to {v:?}"),
            }
        }
    }

    // The job-control variables, read back in slurmstepd from a (possibly corrupt) environment.
    let names = ["HTC_FILE", "HTC_RETRIES", "HTC_FANOUT", "HTC_OUTPUT", "HTC_OPEN"].map(job_env_name);
    let getenv = |name: &str| {
        let i = names.iter().position(|n| n == name)?;
        words.get(i).filter(|w| !w.is_empty() || i == 0).map(|w| OsString::from_vec(w.to_vec()))
    };
    if let Ok(Some(req)) = BatchRequest::from_job_env(getenv) {
        // Absolute, or none for an open run without a task file.
        assert!(req.target.is_absolute() || req.target.as_os_str().is_empty() && req.settings.opens());
        // What sbatch would store must read back the same.
        let vars = req.job_control_vars();
        let env: Vec<(String, OsString)> = vars.iter().map(|(n, v)| (job_env_name(n), v.clone())).collect();
        let back = BatchRequest::from_job_env(|n| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()));
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
