//! The request an HTC job's batch step carries out ([`BatchRequest`]): sbatch stores it in the
//! job-control environment, the batch step reads it back from there (or, without it, from the
//! option values slurmstepd saw).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::config::UserOptions;
use crate::options::{activator, Mode, Role, OPTIONS};
use crate::value::Value;

/// Step id of the batch step (`SLURM_BATCH_SCRIPT` in <slurm/slurm.h>).
pub const BATCH_STEP_ID: u32 = 0xffff_fffb;

/// Prefix Slurm adds to job-control names in the job environment.
pub const JOB_ENV_PREFIX: &str = "SLURM_SPANK_";

pub fn job_env_name(jc_name: &str) -> String {
    format!("{JOB_ENV_PREFIX}{jc_name}")
}

/// A validated HTC request, as the batch step needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRequest {
    pub mode: Mode,
    /// The task file (`Run`) or the run directory to join (`Join`): absolute. Empty for an open
    /// run without a task file (`--htc-open` alone).
    pub target: PathBuf,
    /// The settings that go with `mode` (`OptionDef::goes_with`); nothing else is set.
    pub settings: UserOptions,
}

impl BatchRequest {
    /// Keeps of `opts` what goes with `mode`.
    pub fn new(mode: Mode, target: PathBuf, opts: &UserOptions) -> BatchRequest {
        let mut settings = UserOptions::new();
        for (i, def, v) in opts.given() {
            if def.goes_with(mode) {
                settings.set(i, Some(v.clone()));
            }
        }
        BatchRequest { mode, target, settings }
    }

    /// What sbatch stores: `Ok(None)` without `--htc` and `--htc-join`; `Err` with the messages
    /// when the options conflict (the option callbacks already refused that). A task file must
    /// already be the canonical absolute path, and a run the directory sbatch checked.
    pub fn from_allocator(opts: &UserOptions) -> Result<Option<BatchRequest>, Vec<String>> {
        let conflicts = opts.join_conflicts();
        if !conflicts.is_empty() {
            return Err(conflicts);
        }
        Ok(Self::from_options(opts, Path::new("/")))
    }

    /// Fallback when the job-control variables are missing: the values seen by the remote
    /// option callback (only called with `--export=ALL`). A relative file, job id or run
    /// directory is the submit directory's, else `cwd`'s. `Err` when the values conflict,
    /// which sbatch refuses.
    pub fn from_remote_options(
        opts: &UserOptions,
        submit_dir: Option<&Path>,
        cwd: &Path,
    ) -> Result<Option<BatchRequest>, String> {
        if opts.has(Mode::Run) && opts.has(Mode::Join) {
            return Err("both --htc and --htc-join were given".into());
        }
        Ok(Self::from_options(opts, submit_dir.unwrap_or(cwd)))
    }

    fn from_options(opts: &UserOptions, base: &Path) -> Option<BatchRequest> {
        let (mode, target) = match (opts.get(activator(Mode::Join)), opts.get(activator(Mode::Run))) {
            (Some(Value::Run(run)), _) => (Mode::Join, run.dir(base)),
            (_, Some(Value::Path(file))) if !file.as_os_str().is_empty() => {
                (Mode::Run, resolve_against(base, file.as_os_str()))
            }
            _ if opts.opens() => (Mode::Run, PathBuf::new()),
            _ => return None,
        };
        Some(BatchRequest::new(mode, target, opts))
    }

    /// `(name, value)` pairs for `spank_job_control_setenv`: the activating option's, then the
    /// settings in table order.
    pub fn job_control_vars(&self) -> Vec<(&'static str, OsString)> {
        let mut v = Vec::new();
        if !self.target.as_os_str().is_empty() {
            v.push((OPTIONS[activator(self.mode)].job_control, self.target.clone().into_os_string()));
        }
        v.extend(self.settings.given().map(|(_, def, value)| (def.job_control, value.to_arg())));
        v
    }

    /// The request in the job environment (`SLURM_SPANK_HTC_*`), `getenv` being
    /// `spank_getenv`: `Ok(None)` when it is not an HTC job, `Err` when the variables are
    /// corrupt (both a task file and a run to join among them).
    pub fn from_job_env(getenv: impl Fn(&str) -> Option<OsString>) -> Result<Option<BatchRequest>, String> {
        let run = Self::mode_from_job_env(Mode::Run, &getenv)?;
        let join = Self::mode_from_job_env(Mode::Join, &getenv)?;
        match (run, join) {
            (Some(_), Some(_)) => Err(format!(
                "both {} and {} are set",
                job_env_name(OPTIONS[activator(Mode::Run)].job_control),
                job_env_name(OPTIONS[activator(Mode::Join)].job_control)
            )),
            (r, j) => Ok(r.or(j)),
        }
    }

    /// A request of `mode` in the job environment, ignoring any other mode's.
    pub fn mode_from_job_env(
        mode: Mode,
        getenv: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Option<BatchRequest>, String> {
        let name = job_env_name(OPTIONS[activator(mode)].job_control);
        let opens = || OPTIONS.iter().any(|d| d.role == Role::Opens && getenv(&job_env_name(d.job_control)).is_some());
        let (target, given) = match getenv(&name).map(PathBuf::from) {
            Some(target) => (target, true),
            None if mode == Mode::Run && opens() => (PathBuf::new(), false),
            None => return Ok(None),
        };
        // A task file given must be absolute, empty included; only one not given is left out.
        if given && !target.is_absolute() {
            return Err(match mode {
                Mode::Run => format!("{name}={}: not an absolute path", target.display()),
                Mode::Join => format!("{name}: {} is not an absolute run directory", target.display()),
            });
        }
        let mut settings = UserOptions::new();
        for (i, def) in OPTIONS.iter().enumerate().filter(|(_, def)| def.goes_with(mode)) {
            let name = job_env_name(def.job_control);
            if let Some(text) = getenv(&name) {
                settings.set(i, Some(def.kind.parse(&text).map_err(|e| format!("{name}: {e}"))?));
            }
        }
        Ok(Some(BatchRequest { mode, target, settings }))
    }
}

/// `base/p` unless `p` is absolute.
pub fn resolve_against(base: &Path, p: &OsStr) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::opts;

    /// The job environment of `vars`, as `spank_getenv` would see it.
    fn job_env(vars: &[(&str, OsString)]) -> impl Fn(&str) -> Option<OsString> {
        let env: Vec<(String, OsString)> = vars.iter().map(|(n, v)| (job_env_name(n), v.clone())).collect();
        move |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
    }

    #[test]
    fn job_control_round_trip() {
        let o = opts(&[
            ("htc", "/home/u/t.txt"),
            ("htc-retries", "4"),
            ("htc-output", "per-task"),
            ("htc-partition", "even"),
            ("htc-agents-per-node", "3"),
            ("htc-instance-nodes", "2"),
            ("htc-max-fails", "9"),
            ("htc-resume", "77"),
            ("htc-resubmit", "3"),
            ("htc-grow", "5:2:90"),
        ]);
        let req = BatchRequest::from_allocator(&o).unwrap().unwrap();
        assert_eq!((req.mode, req.target.as_path()), (Mode::Run, Path::new("/home/u/t.txt")));
        let vars = req.job_control_vars();
        assert_eq!(
            vars,
            vec![
                ("HTC_FILE", OsString::from("/home/u/t.txt")),
                ("HTC_RETRIES", "4".into()),
                ("HTC_OUTPUT", "per-task".into()),
                ("HTC_PARTITION", "even".into()),
                ("HTC_AGENTS_PER_NODE", "3".into()),
                ("HTC_INSTANCE_NODES", "2".into()),
                ("HTC_MAX_FAILS", "9".into()),
                ("HTC_RESUME", "77".into()),
                ("HTC_RESUBMIT", "3".into()),
                ("HTC_GROW", "5:2:90".into())
            ]
        );
        assert_eq!(BatchRequest::from_job_env(job_env(&vars)), Ok(Some(req)));
        assert_eq!(BatchRequest::from_allocator(&UserOptions::default()), Ok(None));
        assert_eq!(BatchRequest::from_job_env(|_| None), Ok(None));
        // Settings without --htc or --htc-join make no request.
        assert_eq!(BatchRequest::from_allocator(&opts(&[("htc-grow", "2"), ("htc-resubmit", "1")])), Ok(None));
    }

    #[test]
    fn grow_rides_with_htc_to_the_batch_step() {
        let o = opts(&[("htc", "/t"), ("htc-grow", "3:1:30")]);
        let req = BatchRequest::from_allocator(&o).unwrap().unwrap();
        assert_eq!(req.job_control_vars(), vec![("HTC_FILE", OsString::from("/t")), ("HTC_GROW", "3:1:30".into())]);
        let get = |n: &str| match n {
            "SLURM_SPANK_HTC_FILE" => Some("/t".into()),
            "SLURM_SPANK_HTC_GROW" => Some("3:1:30".into()),
            _ => None,
        };
        assert_eq!(BatchRequest::from_job_env(get), Ok(Some(req.clone())));
        // ... and, without the job-control variables, from the remote option values.
        assert_eq!(BatchRequest::from_remote_options(&o, None, Path::new("/")), Ok(Some(req)));
    }

    #[test]
    fn an_open_run_needs_no_task_file() {
        let agent = crate::plugstack::PluginConfig::default().agent.into_os_string();
        let o = opts(&[("htc-open", ""), ("htc-grow", "2")]);
        let req = BatchRequest::from_allocator(&o).unwrap().unwrap();
        assert_eq!((req.mode, req.target.as_os_str()), (Mode::Run, OsStr::new("")));
        let vars = req.job_control_vars();
        assert_eq!(vars, vec![("HTC_GROW", OsString::from("2:1")), ("HTC_OPEN", "1800000ms".into())]);
        assert_eq!(BatchRequest::from_job_env(job_env(&vars)), Ok(Some(req.clone())));
        assert_eq!(BatchRequest::from_remote_options(&o, None, Path::new("/")), Ok(Some(req.clone())));
        let argv = crate::argv::agent_argv_prefix(&Default::default(), &req);
        let want = [agent, "lead".into(), "--grow".into(), "2:1".into(), "--open".into(), "1800000ms".into()];
        assert_eq!(argv[..6], want, "no --task-file: {argv:?}");
        // With a task file, that comes first as for any run.
        let o = opts(&[("htc", "/t"), ("htc-open", "0")]);
        let req = BatchRequest::from_allocator(&o).unwrap().unwrap();
        assert_eq!(req.job_control_vars(), vec![("HTC_FILE", OsString::from("/t")), ("HTC_OPEN", "0ms".into())]);
        assert_eq!(BatchRequest::from_job_env(job_env(&req.job_control_vars())), Ok(Some(req)));
    }

    #[test]
    fn join_request_round_trip() {
        // sbatch stores the run directory it checked, absolute.
        let o = opts(&[("htc-join", "/home/u/.htc/1234"), ("htc-agents-per-node", "2"), ("htc-instance-nodes", "4")]);
        let req = BatchRequest::from_allocator(&o).unwrap().unwrap();
        assert_eq!((req.mode, req.target.as_path()), (Mode::Join, Path::new("/home/u/.htc/1234")));
        let vars = req.job_control_vars();
        assert_eq!(
            vars,
            vec![
                ("HTC_JOIN", OsString::from("/home/u/.htc/1234")),
                ("HTC_AGENTS_PER_NODE", "2".into()),
                ("HTC_INSTANCE_NODES", "4".into())
            ]
        );
        assert_eq!(BatchRequest::from_job_env(job_env(&vars)), Ok(Some(req)));
        // A joining job is not a --htc job: the --htc reader leaves it alone.
        assert_eq!(BatchRequest::mode_from_job_env(Mode::Run, job_env(&vars)), Ok(None));
        // Conflicts are no request.
        let o = opts(&[("htc-join", "1"), ("htc-grow", "3:1:30")]);
        assert_eq!(BatchRequest::from_allocator(&o), Err(o.join_conflicts()));
        let o = opts(&[("htc-join", "1234"), ("htc", "tasks.txt")]);
        assert_eq!(BatchRequest::from_allocator(&o), Err(o.join_conflicts()));
    }

    #[test]
    fn join_job_env_and_remote_fallback() {
        let e = BatchRequest::from_job_env(|n| match n {
            "SLURM_SPANK_HTC_FILE" => Some("/t".into()),
            "SLURM_SPANK_HTC_JOIN" => Some("/r/12".into()),
            _ => None,
        })
        .unwrap_err();
        assert_eq!(e, "both SLURM_SPANK_HTC_FILE and SLURM_SPANK_HTC_JOIN are set");
        let e = BatchRequest::from_job_env(|n| (n == "SLURM_SPANK_HTC_JOIN").then(|| "x/../1".into())).unwrap_err();
        assert_eq!(e, "SLURM_SPANK_HTC_JOIN: x/../1 is not an absolute run directory");
        let e = BatchRequest::from_job_env(|n| match n {
            "SLURM_SPANK_HTC_JOIN" => Some("/r/12".into()),
            "SLURM_SPANK_HTC_INSTANCE_NODES" => Some("0".into()),
            _ => None,
        })
        .unwrap_err();
        assert_eq!(e, "SLURM_SPANK_HTC_INSTANCE_NODES: '0' is not a whole number from 1 to 65536");
        // A joining job reads none of the run's settings.
        let r = BatchRequest::from_job_env(|n| match n {
            "SLURM_SPANK_HTC_JOIN" => Some("/r/12".into()),
            "SLURM_SPANK_HTC_RETRIES" => Some("x".into()),
            _ => None,
        });
        assert_eq!(
            r,
            Ok(Some(BatchRequest { mode: Mode::Join, target: "/r/12".into(), settings: UserOptions::new() }))
        );

        let cwd = Path::new("/cwd");
        let o = opts(&[("htc-join", "5"), ("htc-agents-per-node", "3")]);
        assert_eq!(
            BatchRequest::from_remote_options(&o, None, cwd),
            Ok(Some(BatchRequest {
                mode: Mode::Join,
                target: "/cwd/.htc/5".into(),
                settings: opts(&[("htc-agents-per-node", "3")])
            }))
        );
        let o2 = opts(&[("htc-join", "../p/.htc/5")]);
        assert!(matches!(
            BatchRequest::from_remote_options(&o2, Some(Path::new("/sub")), cwd),
            Ok(Some(ref j)) if j.mode == Mode::Join && j.target == Path::new("/sub/../p/.htc/5")
        ));
        let both = opts(&[("htc-join", "5"), ("htc", "t.txt")]);
        assert_eq!(
            BatchRequest::from_remote_options(&both, None, cwd),
            Err("both --htc and --htc-join were given".into())
        );
        assert_eq!(BatchRequest::from_remote_options(&UserOptions::default(), None, cwd), Ok(None));
    }

    #[test]
    fn remote_fallback_resolves_relative_files() {
        let target = |o: &UserOptions, sd: Option<&str>, cwd: &str| {
            let r = BatchRequest::from_remote_options(o, sd.map(Path::new), Path::new(cwd)).unwrap().unwrap();
            assert_eq!(r.mode, Mode::Run);
            r.target
        };
        let rel = opts(&[("htc", "sub/t.txt")]);
        assert_eq!(target(&rel, Some("/home/u/proj"), "/elsewhere"), Path::new("/home/u/proj/sub/t.txt"));
        assert_eq!(target(&rel, None, "/cwd"), Path::new("/cwd/sub/t.txt"));
        assert_eq!(target(&opts(&[("htc", "/data/t.txt")]), Some("/x"), "/y"), Path::new("/data/t.txt"));
        // An empty --htc= is no request.
        assert_eq!(BatchRequest::from_remote_options(&opts(&[("htc", "")]), None, Path::new("/")), Ok(None));
    }

    #[test]
    fn job_env_corruption_is_an_error() {
        let e = BatchRequest::from_job_env(|n| (n == "SLURM_SPANK_HTC_FILE").then(|| "rel.txt".into())).unwrap_err();
        assert_eq!(e, "SLURM_SPANK_HTC_FILE=rel.txt: not an absolute path");
        for (var, bad) in [
            ("SLURM_SPANK_HTC_FANOUT", "1"),
            ("SLURM_SPANK_HTC_AGENTS_PER_NODE", "lots"),
            ("SLURM_SPANK_HTC_INSTANCE_NODES", "0"),
            ("SLURM_SPANK_HTC_GROW", "0:1"),
            ("SLURM_SPANK_HTC_GROW", "1:1:999999999999999-1"),
        ] {
            let e = BatchRequest::from_job_env(|n| match n {
                "SLURM_SPANK_HTC_FILE" => Some("/t".into()),
                _ if n == var => Some(bad.into()),
                _ => None,
            })
            .unwrap_err();
            assert!(e.starts_with(&format!("{var}: ")), "{e}");
        }
        assert_eq!(BATCH_STEP_ID, 0xfffffffb);
    }
}
