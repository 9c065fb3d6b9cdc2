//! `htc run --detach`: the run goes on in the background, in a process group of its own (a
//! Ctrl-C at the terminal does not reach it), and this command prints the run's id once its
//! leader listens, then exits: how a script learns the id of the run it started,
//! `RUN=$(htc run --open --detach)`, with no race against other runs of the same directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;

/// How long the leader may take to listen.
const START_WITHIN: Duration = Duration::from_secs(120);

/// Starts this same `htc run` (its arguments but `--detach`) in the background and waits until
/// its leader listens. `resume`: the run `--resume` names, if it does. The leader's stderr goes
/// to `RUN/leader.err`.
pub fn detach(resume: Option<&str>) -> anyhow::Result<i32> {
    let args: Vec<_> = std::env::args_os().skip(1).filter(|a| a != "--detach").collect();
    std::fs::create_dir_all(".htc").context("making .htc")?;
    let log_path = PathBuf::from(format!(".htc/detached-{}.err", std::process::id()));
    let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let started = SystemTime::now();
    let mut leader = {
        use std::os::unix::process::CommandExt;
        Command::new(std::env::current_exe().context("finding htc itself")?)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .context("starting the run")?
    };
    let t0 = Instant::now();
    loop {
        if let Some(run) = listening(resume, leader.id(), started)? {
            // The open file follows the rename: the leader keeps writing to it.
            let _ = std::fs::rename(&log_path, run.join("leader.err"));
            println!("{}", run.file_name().unwrap_or_default().to_string_lossy());
            return Ok(0);
        }
        if let Some(status) = leader.try_wait()? {
            let said = std::fs::read_to_string(&log_path).unwrap_or_default();
            let _ = std::fs::remove_file(&log_path);
            eprint!("{said}");
            eprintln!("htc: the run ended before its leader listened ({status})");
            return Ok(status.code().unwrap_or(1).max(1));
        }
        if t0.elapsed() > START_WITHIN {
            let _ = leader.kill();
            anyhow::bail!(
                "the run's leader did not listen within {} s; see {}",
                START_WITHIN.as_secs(),
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The run directory of the leader `pid` once it listens: the run `--resume` named (its address
/// written since `started`), or the new run whose id ends with the leader's pid.
fn listening(resume: Option<&str>, pid: u32, started: SystemTime) -> anyhow::Result<Option<PathBuf>> {
    let fresh =
        |dir: &Path| std::fs::metadata(dir.join("leader.addr")).and_then(|m| m.modified()).is_ok_and(|t| t >= started);
    if let Some(run) = resume {
        let dir = crate::rundir::RunDir::locate(Some(run).filter(|r| !r.is_empty()))?.path;
        return Ok(fresh(&dir).then_some(dir));
    }
    let suffix = format!("-{pid}");
    let found = std::fs::read_dir(".htc")?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().ends_with(&suffix)) && fresh(p));
    Ok(found)
}
