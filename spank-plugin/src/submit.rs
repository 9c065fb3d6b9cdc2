//! What sbatch checks before an HTC job is queued, beyond the values' syntax: that the task
//! file of `--htc=FILE` is one the agent can run, and that the run `--htc-join=RUN` names is
//! running. Both read files as the submitting user, which is what makes the checks honest.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::value::{JoinTarget, Kind, Value};

/// How many task-file errors sbatch prints before giving up.
pub const MAX_REPORTED_ERRORS: usize = 5;

/// A value sbatch accepted: what the job keeps of it, and a note for `sbatch -v`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub value: Value,
    pub note: Option<String>,
}

/// Why sbatch refuses a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// One reason, to follow "htc: --NAME=VALUE: ".
    Value(String),
    /// Messages that say what they are about (`file:line:col: reason`), each its own line.
    Lines(Vec<String>),
}

/// The submit-time check of a parsed value of `kind` (after the `--htc-join` conflicts, so
/// that a conflict is reported before a long read of the task file). The task file becomes its
/// canonical absolute path, the run its directory, as the batch step will be given them.
pub fn check(kind: Kind, value: Value) -> Result<Accepted, Refusal> {
    match (kind, value) {
        (Kind::TaskFile, Value::Path(file)) => match check_task_file(file.as_os_str()) {
            Ok((abs, tasks)) => {
                Ok(Accepted { note: Some(format!("{}: {tasks} tasks", abs.display())), value: Value::Path(abs) })
            }
            Err(msgs) => Err(Refusal::Lines(msgs)),
        },
        (Kind::Run, Value::Run(run)) => {
            // The submit directory: sbatch's cwd, as for a relative --htc=FILE.
            let base = std::env::current_dir()
                .map_err(|e| Refusal::Value(format!("cannot tell the current directory: {e}")))?;
            let dir = check_join_run(&base, &run).map_err(Refusal::Value)?;
            Ok(Accepted {
                note: Some(format!("joining the run {}", dir.display())),
                value: Value::Run(JoinTarget::Dir(dir)),
            })
        }
        (_, value) => Ok(Accepted { value, note: None }),
    }
}

/// Submit-time check of `--htc=FILE` (relative paths resolve against the process's cwd,
/// i.e. the submit directory). Returns the canonical absolute path and the task count, or
/// the messages to print (`file:line:col: reason`, at most `MAX_REPORTED_ERRORS` + a note).
pub fn check_task_file(arg: &OsStr) -> Result<(PathBuf, u64), Vec<String>> {
    if arg.is_empty() {
        return Err(vec!["--htc needs a task file: --htc=FILE".into()]);
    }
    let path = Path::new(arg);
    match htc_core::taskfile::check_path(path, MAX_REPORTED_ERRORS) {
        Ok(summary) => match std::fs::canonicalize(path) {
            Ok(abs) => Ok((abs, summary.tasks)),
            Err(e) => Err(vec![format!("{}: cannot resolve the path: {e}", path.display())]),
        },
        Err(errors) => {
            let mut msgs: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            if errors.len() >= MAX_REPORTED_ERRORS {
                msgs.push(format!(
                    "(stopped after {MAX_REPORTED_ERRORS} errors; `htc check {}` lists them all)",
                    path.display()
                ));
            }
            Err(msgs)
        }
    }
}

/// Submit-time check of `--htc-join=RUN` against `base`, the submit directory (sbatch's cwd,
/// as for a relative `--htc=FILE`): the run directory (`base/.htc/JOBID`, or the one named) must
/// exist, be readable by this user, and hold the running leader's `leader.addr`. Returns the
/// run directory, absolute; the messages follow "htc: --htc-join=RUN: ".
pub fn check_join_run(base: &Path, run: &JoinTarget) -> Result<PathBuf, String> {
    let dir = run.dir(base);
    let name = run.name(base);
    let no_run = || {
        match run {
        JoinTarget::Job(j) => format!(
            "no run .htc/{j} in {} (run sbatch from the directory the run was submitted from, or give the run directory)",
            base.display()
        ),
        JoinTarget::Dir(_) => format!("there is no run directory {}", dir.display()),
    }
    };
    let not_running = || format!("{name} is not running (it ended, or has not started yet)");
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{} is not a run directory", dir.display())),
        Err(e) => return Err(join_io_error(&name, &e, no_run)),
    }
    let leader = dir.join("leader.addr");
    // Only a regular file is opened (a FIFO there would block sbatch in open).
    match std::fs::metadata(&leader) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err(not_running()),
        Err(e) => return Err(join_io_error(&name, &e, not_running)),
    }
    // The joining agent reads it as this user: so must this check.
    match std::fs::File::open(&leader) {
        Ok(_) => Ok(dir),
        Err(e) => Err(join_io_error(&name, &e, not_running)),
    }
}

/// The message for a failed look at the run directory of `--htc-join` (`name`: how it is
/// called; `missing`: the message for a path that does not exist).
fn join_io_error(name: &str, e: &std::io::Error, missing: impl FnOnce() -> String) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::NotFound | ErrorKind::NotADirectory => missing(),
        ErrorKind::PermissionDenied => format!("cannot read {name}: permission denied (belongs to another user?)"),
        _ => format!("cannot read {name}: {e}"),
    }
}

/// Which allocator runs the plugin (both are "allocator context" for SPANK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    Sbatch,
    Salloc,
    Other,
}

pub fn allocator_from_exe(exe: &Path) -> Allocator {
    match exe.file_name().and_then(|n| n.to_str()) {
        Some("sbatch") => Allocator::Sbatch,
        Some("salloc") => Allocator::Salloc,
        _ => Allocator::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn allocator_detection() {
        assert_eq!(allocator_from_exe(Path::new("/usr/bin/sbatch")), Allocator::Sbatch);
        assert_eq!(allocator_from_exe(Path::new("/opt/slurm/bin/salloc")), Allocator::Salloc);
        assert_eq!(allocator_from_exe(Path::new("/usr/bin/scrun")), Allocator::Other);
    }

    #[test]
    fn task_file_check() {
        let dir = std::env::temp_dir().join(format!("spank-htc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.txt");
        std::fs::File::create(&good).unwrap().write_all(b"# c\necho 1\necho 2\n").unwrap();
        let (abs, n) = check_task_file(good.as_os_str()).unwrap();
        assert_eq!(n, 2);
        assert_eq!(abs, std::fs::canonicalize(&good).unwrap());

        let missing = dir.join("missing.txt");
        let e = check_task_file(missing.as_os_str()).unwrap_err();
        assert_eq!(e.len(), 1);
        assert!(e[0].starts_with(&missing.display().to_string()) && e[0].contains("No such file"), "{e:?}");

        let bad = dir.join("bad.txt");
        std::fs::File::create(&bad).unwrap().write_all(b"echo ok\n[nope=1] x\n").unwrap();
        let e = check_task_file(bad.as_os_str()).unwrap_err();
        assert!(e[0].starts_with(&format!("{}:2", bad.display())), "{e:?}");

        let many = dir.join("many.txt");
        let mut f = std::fs::File::create(&many).unwrap();
        for _ in 0..20 {
            f.write_all(b"[bad] x\n").unwrap();
        }
        let e = check_task_file(many.as_os_str()).unwrap_err();
        assert_eq!(e.len(), MAX_REPORTED_ERRORS + 1, "{e:?}");
        assert!(e.last().unwrap().contains("htc check"));

        let empty = dir.join("empty.txt");
        std::fs::File::create(&empty).unwrap();
        assert!(check_task_file(empty.as_os_str()).is_err());
        assert!(check_task_file(dir.as_os_str()).unwrap_err()[0].contains("directory"));
        assert!(check_task_file(OsStr::new("")).unwrap_err()[0].contains("--htc=FILE"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn join_run_directory_checks() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("spank-htc-join-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let b = base.display();

        // No .htc at all, then no .htc/1234.
        let e = check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err();
        assert_eq!(e, format!("no run .htc/1234 in {b} (run sbatch from the directory the run was submitted from, or give the run directory)"));
        std::fs::create_dir_all(base.join(".htc/99")).unwrap();
        assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), e);

        // The run is there, but no leader has published its address.
        let run = base.join(".htc/1234");
        std::fs::create_dir_all(&run).unwrap();
        let not_running = format!("the run .htc/1234 in {b} is not running (it ended, or has not started yet)");
        assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), not_running);
        std::fs::create_dir(run.join("leader.addr")).unwrap();
        assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), not_running);
        std::fs::remove_dir(run.join("leader.addr")).unwrap();

        // Running.
        std::fs::write(
            run.join("leader.addr"),
            "addr=127.0.0.1:5000
job=1234
cluster=
",
        )
        .unwrap();
        assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)), Ok(run.clone()));
        // The same run by its directory, from another one.
        let elsewhere = base.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let by_dir = JoinTarget::Dir("../.htc/1234".into());
        assert_eq!(check_join_run(&elsewhere, &by_dir), Ok(elsewhere.join("../.htc/1234")));
        let e = check_join_run(&elsewhere, &JoinTarget::Dir("../.htc/5".into())).unwrap_err();
        assert_eq!(e, format!("there is no run directory {}", elsewhere.join("../.htc/5").display()));
        // A run reached through a link (`htc resume` links the new job id to the run).
        std::os::unix::fs::symlink("1234", base.join(".htc/1300")).unwrap();
        assert_eq!(check_join_run(&base, &JoinTarget::Job(1300)), Ok(base.join(".htc/1300")));

        // Not a directory.
        std::fs::write(base.join(".htc/77"), "").unwrap();
        assert!(check_join_run(&base, &JoinTarget::Job(77)).unwrap_err().contains("is not a run directory"));

        // Unreadable (another user's): root reads everything, so only checked as a user.
        let denied = format!("cannot read the run .htc/1234 in {b}: permission denied (belongs to another user?)");
        let eacces = std::io::Error::from_raw_os_error(13);
        let name = format!("the run .htc/1234 in {b}");
        assert_eq!(join_io_error(&name, &eacces, || unreachable!()), denied);
        let eio = std::io::Error::from_raw_os_error(5);
        assert!(join_io_error(&name, &eio, || unreachable!())
            .starts_with(&format!("cannot read the run .htc/1234 in {b}: ")));
        let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(0);
        if uid != 0 {
            std::fs::set_permissions(run.join("leader.addr"), std::fs::Permissions::from_mode(0o000)).unwrap();
            assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), denied);
            std::fs::set_permissions(run.join("leader.addr"), std::fs::Permissions::from_mode(0o600)).unwrap();
            std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o000)).unwrap();
            assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), denied);
            std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::fs::set_permissions(base.join(".htc"), std::fs::Permissions::from_mode(0o000)).unwrap();
            assert_eq!(check_join_run(&base, &JoinTarget::Job(1234)).unwrap_err(), denied);
            std::fs::set_permissions(base.join(".htc"), std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        std::fs::remove_dir_all(&base).unwrap();
    }
}
