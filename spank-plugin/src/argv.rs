//! The agent's command line in the batch step of an HTC job (README.md, "the agent's argv
//! contract"):
//!
//! `AGENT lead --task-file FILE [--retries N] [--fanout K] [--output MODE] [--partition PLAN]
//! [--agents-per-node N] [--instance-nodes N] [--max-fails N] [--resume-run JOBID] [--resubmit N]
//! [--grow SPEC] [--open IDLE] [--ledger-dir DIR] --script SCRIPT [ARGS…]` (without
//! `--task-file` for `--htc-open` alone), or for a joining job
//! `AGENT lead --join-run RUNDIR [--agents-per-node N] [--instance-nodes N] [--ledger-dir DIR]
//! --script SCRIPT [ARGS…]`: the activating option's flag, then each setting of the options
//! table that goes with the job's mode, in table order.

use std::ffi::OsString;

use crate::options::{activator, OPTIONS};
use crate::plugstack::PluginConfig;
use crate::request::BatchRequest;

/// The token after which the agent's argv holds the batch script and its arguments.
pub const SCRIPT_FLAG: &str = "--script";

/// The agent's argv up to and including `--script`. The batch script's own argv (script path,
/// then its arguments) follows; with `spank_prepend_task_argv` Slurm appends it, with `execve`
/// the plugin does. A setting the user did not give may come from plugstack.conf (the site's
/// `fanout=`), but only where it goes with the mode: a joining job gets the run's fan-out.
pub fn agent_argv_prefix(cfg: &PluginConfig, req: &BatchRequest) -> Vec<OsString> {
    let first = &OPTIONS[activator(req.mode)];
    let mut v: Vec<OsString> = vec![cfg.agent.clone().into(), "lead".into()];
    // An open run without a task file has no activator's value (`--htc-open` follows).
    if !req.target.as_os_str().is_empty() {
        v.extend([first.agent_flag.into(), req.target.clone().into()]);
    }
    for (i, def) in OPTIONS.iter().enumerate().filter(|(_, def)| def.goes_with(req.mode)) {
        let value = req.settings.get(i).cloned().or_else(|| def.site_default.and_then(|site| site(cfg)));
        if let Some(value) = value {
            v.push(def.agent_flag.into());
            v.push(value.to_arg());
        }
    }
    if let Some(d) = &cfg.ledger_dir {
        v.push("--ledger-dir".into());
        v.push(d.clone().into());
    }
    v.push(SCRIPT_FLAG.into());
    v
}

/// The complete argv for `execve`: the prefix, then the batch step's argv (`S_JOB_ARGV`).
pub fn agent_argv(cfg: &PluginConfig, req: &BatchRequest, job_argv: &[OsString]) -> Result<Vec<OsString>, String> {
    match job_argv.first() {
        None => Err("the batch step has no script (empty S_JOB_ARGV)".into()),
        Some(s) if s.is_empty() => Err("the batch step's script path is empty".into()),
        Some(_) => {
            let mut argv = agent_argv_prefix(cfg, req);
            argv.extend(job_argv.iter().cloned());
            Ok(argv)
        }
    }
}

/// Human-readable argv, for logs.
pub fn display_argv(argv: &[OsString]) -> String {
    let mut s = String::new();
    for (i, a) in argv.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        let a = a.to_string_lossy();
        if !a.is_empty() && a.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-=+,:@%".contains(&b)) {
            s.push_str(&a);
        } else {
            s.push('\'');
            s.push_str(&a.replace('\'', "'\\''"));
            s.push('\'');
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::opts;
    use crate::plugstack::DEFAULT_AGENT;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn request(given: &[(&str, &str)]) -> BatchRequest {
        BatchRequest::from_allocator(&opts(given)).unwrap().unwrap()
    }

    fn site() -> PluginConfig {
        PluginConfig { agent: "/opt/a".into(), ledger_dir: Some("/tmp/l".into()), fanout: Some(8), disabled: false }
    }

    #[test]
    fn argv_minimal_and_full() {
        let req = request(&[("htc", "/home/u/t.txt")]);
        let argv = agent_argv(&PluginConfig::default(), &req, &os(&["/var/spool/slurmd/job00042/slurm_script"]));
        assert_eq!(
            argv.unwrap(),
            os(&[
                DEFAULT_AGENT,
                "lead",
                "--task-file",
                "/home/u/t.txt",
                "--script",
                "/var/spool/slurmd/job00042/slurm_script"
            ])
        );

        let full = [
            ("htc", "/t"),
            ("htc-retries", "0"),
            ("htc-fanout", "4"),
            ("htc-output", "none"),
            ("htc-partition", "even"),
            ("htc-agents-per-node", "2"),
            ("htc-instance-nodes", "3"),
            ("htc-max-fails", "4"),
            ("htc-resume", "12"),
            ("htc-resubmit", "2"),
            ("htc-grow", "3:2:30"),
        ];
        let req = request(&full);
        let argv = agent_argv(&site(), &req, &os(&["/s", "arg1", "--flag"])).unwrap();
        assert_eq!(
            argv,
            os(&[
                "/opt/a",
                "lead",
                "--task-file",
                "/t",
                "--retries",
                "0",
                "--fanout",
                "4",
                "--output",
                "none",
                "--partition",
                "even",
                "--agents-per-node",
                "2",
                "--instance-nodes",
                "3",
                "--max-fails",
                "4",
                "--resume-run",
                "12",
                "--resubmit",
                "2",
                "--grow",
                "3:2:30",
                "--ledger-dir",
                "/tmp/l",
                "--script",
                "/s",
                "arg1",
                "--flag"
            ])
        );
        // The site's fanout applies when the user gave none.
        let p = agent_argv_prefix(&site(), &request(&[("htc", "/t"), ("htc-retries", "0")]));
        assert_eq!(
            p,
            os(&[
                "/opt/a",
                "lead",
                "--task-file",
                "/t",
                "--retries",
                "0",
                "--fanout",
                "8",
                "--ledger-dir",
                "/tmp/l",
                "--script"
            ])
        );
        // --script is the first occurrence: everything after it belongs to the script.
        let pos = argv.iter().position(|a| a == SCRIPT_FLAG).unwrap();
        assert_eq!(&argv[pos + 1..], os(&["/s", "arg1", "--flag"]).as_slice());
        assert_eq!(agent_argv(&site(), &req, &[]), Err("the batch step has no script (empty S_JOB_ARGV)".into()));
        assert_eq!(agent_argv(&site(), &req, &os(&[""])), Err("the batch step's script path is empty".into()));
    }

    #[test]
    fn argv_with_grow() {
        let job_argv = os(&["/var/spool/slurmd/job00042/slurm_script", "a1"]);
        let req = request(&[("htc", "/home/u/proj/tasks.txt"), ("htc-grow", "3:1:30")]);
        assert_eq!(
            agent_argv(&PluginConfig::default(), &req, &job_argv).unwrap(),
            os(&[
                DEFAULT_AGENT,
                "lead",
                "--task-file",
                "/home/u/proj/tasks.txt",
                "--grow",
                "3:1:30",
                "--script",
                "/var/spool/slurmd/job00042/slurm_script",
                "a1"
            ])
        );
        // After --resubmit, before --ledger-dir; NODES and TIME as to_arg writes them.
        let cfg = PluginConfig { ledger_dir: Some("/tmp/l".into()), ..PluginConfig::default() };
        let req = request(&[("htc", "/home/u/proj/tasks.txt"), ("htc-resubmit", "2"), ("htc-grow", "4:2:1-00:30")]);
        assert_eq!(
            agent_argv(&cfg, &req, &job_argv).unwrap(),
            os(&[
                DEFAULT_AGENT,
                "lead",
                "--task-file",
                "/home/u/proj/tasks.txt",
                "--resubmit",
                "2",
                "--grow",
                "4:2:1470",
                "--ledger-dir",
                "/tmp/l",
                "--script",
                "/var/spool/slurmd/job00042/slurm_script",
                "a1"
            ])
        );
        let argv = agent_argv_prefix(&cfg, &request(&[("htc", "/t"), ("htc-grow", "5")]));
        assert!(argv.windows(2).any(|w| w == os(&["--grow", "5:1"]).as_slice()), "{argv:?}");
    }

    #[test]
    fn join_argv() {
        let req =
            request(&[("htc-join", "/home/u/.htc/1234"), ("htc-agents-per-node", "2"), ("htc-instance-nodes", "4")]);
        let job_argv = os(&["/var/spool/slurmd/job00042/slurm_script", "a1", "--flag"]);
        assert_eq!(
            agent_argv(&PluginConfig::default(), &req, &job_argv).unwrap(),
            os(&[
                DEFAULT_AGENT,
                "lead",
                "--join-run",
                "/home/u/.htc/1234",
                "--agents-per-node",
                "2",
                "--instance-nodes",
                "4",
                "--script",
                "/var/spool/slurmd/job00042/slurm_script",
                "a1",
                "--flag"
            ])
        );
        // The site's fanout is not passed (the run's applies); its ledger_dir is.
        let minimal = request(&[("htc-join", "/r/7")]);
        assert_eq!(
            agent_argv(&site(), &minimal, &os(&["/s"])).unwrap(),
            os(&["/opt/a", "lead", "--join-run", "/r/7", "--ledger-dir", "/tmp/l", "--script", "/s"])
        );
        assert_eq!(agent_argv_prefix(&site(), &minimal).last().unwrap(), SCRIPT_FLAG);
        assert!(agent_argv(&site(), &minimal, &[]).is_err());
        assert!(agent_argv(&site(), &minimal, &os(&[""])).is_err());
    }

    #[test]
    fn argv_for_logs() {
        assert_eq!(display_argv(&os(&["/a", "x y", "it's", ""])), "/a 'x y' 'it'\\''s' ''");
    }
}
