//! The jobs a run submits itself: a grown job that joins it (`--htc-grow`: `sbatch --htc-join`,
//! cut to a hole in the scheduler's plan, and `scancel` of those that never joined), and the job
//! that continues it (`--htc-resubmit`), as `htc resume` would. Each `sbatch` runs from the
//! run's submit directory without this job's Slurm variables.

use std::process::Command;

use anyhow::{bail, Context};
use htc_store::ledger::Ledger;
use htc_store::replica::Replica;
use htc_store::rundir::RunDir;

use crate::leader::grow::{Queue, Submit};
use crate::slurm;

/// An `sbatch` for a job of `run`: from its submit directory (the run lives in its .htc/),
/// without this job's variables (they would shape the new job like this one).
pub fn sbatch_for(run: &RunDir) -> anyhow::Result<Command> {
    let submit_dir = run.path.parent().and_then(|p| p.parent()).context("the run directory has no parent")?;
    let mut cmd = Command::new("sbatch");
    cmd.current_dir(submit_dir);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if (k.starts_with("SLURM_") || k.starts_with("SBATCH_")) && k != "SLURM_CONF" {
            cmd.env_remove(k.as_ref());
        }
    }
    Ok(cmd)
}

/// What `htc resume` asks for when told nothing else: the run's shape, and the job's own options
/// as the user gave them followed by `shape` (an `htc resume -- OPTIONS` or resubmission puts
/// what it is told after them, and sbatch takes the last).
pub fn note_resume_args(run: &RunDir, nodes: usize, shape: Vec<String>) -> anyhow::Result<()> {
    let l = Ledger::open(&run.ledger(), false)?;
    let mut t = l.write()?;
    t.put_meta("slurm_nodes", &(nodes as u64).to_le_bytes())?;
    let mut args = slurm::own_job_options();
    args.extend(shape);
    t.put_meta("resume_sbatch", args.join("\n").as_bytes())?;
    t.commit()?;
    Ok(())
}

/// How many times the run was resubmitted (`--htc-resubmit` counts in the ledger).
pub fn resubmits(run: &RunDir) -> anyhow::Result<u64> {
    Ok(Ledger::open(&run.ledger(), true)?.read()?.meta_u64("resubmits")?.unwrap_or(0))
}

/// Counts resubmission `nth` and submits the job that continues the run, with the arguments
/// `note_resume_args` kept; sbatch's answer.
pub fn resubmit(run: &RunDir, nth: u64) -> anyhow::Result<String> {
    let mut ledger = Ledger::open(&run.ledger(), false)?;
    if run.replicated() {
        ledger.attach_journal(Replica::of(&run.path).writer()?);
    }
    let args: Vec<String> = ledger
        .read()?
        .meta("resume_sbatch")?
        .map(|a| String::from_utf8_lossy(a).lines().map(String::from).collect())
        .unwrap_or_default();
    let mut t = ledger.write()?;
    t.put_meta("resubmits", &nth.to_le_bytes())?;
    t.commit()?;
    let file = htc_store::load::sbatch_run_option(run, &ledger)?;
    let mut cmd = sbatch_for(run)?;
    cmd.arg(file).arg(format!("--htc-resume={}", run.id())).args(&args).arg(slurm::GUARD_SCRIPT);
    let out = cmd.output().context("running sbatch")?;
    if !out.status.success() {
        bail!("{}", slurm::sbatch_refusal(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Grown jobs (`--htc-grow`): `sbatch --htc-join=RUN` from the submit directory with the run's
/// own job's options (its partition, account, memory, ...) but the grown shape, and `scancel`.
pub struct SbatchJoin {
    pub run: RunDir,
    pub own_options: Vec<String>,
}

impl SbatchJoin {
    /// sbatch from the submit directory with the run's own job's options but `shape`.
    fn sbatch(&self, (nodes, minutes): htc_core::grow::Shape) -> anyhow::Result<Command> {
        let mut cmd = sbatch_for(&self.run)?;
        cmd.args(self.own_options.iter().filter(|o| !o.starts_with("--time=") && !o.starts_with("--nodes=")))
            .arg(format!("--nodes={nodes}"))
            .arg(format!("--time={minutes}"));
        Ok(cmd)
    }

    /// The shape to submit: the asked one, or a smaller one that the scheduler says starts
    /// sooner (a hole in its plan): one `sbatch --test-only` per shape it asks about.
    fn fit(&self, asked: htc_core::grow::Shape) -> htc_core::grow::Shape {
        let starts: Vec<_> = htc_core::grow::fit_shapes(asked)
            .into_iter()
            .map(|shape| {
                let out = self.sbatch(shape).ok().and_then(|mut c| c.arg("--test-only").arg("--wrap=:").output().ok());
                (shape, out.and_then(|o| slurm::test_only_start(&String::from_utf8_lossy(&o.stderr))))
            })
            .collect();
        let Some(shape) = htc_core::grow::pick_fit(&starts, 60) else { return asked };
        if shape != asked {
            let when = |s| starts.iter().find(|(x, _)| *x == s).and_then(|(_, t)| *t).unwrap_or(0);
            println!(
                "htc: grow: cut to {} node(s) for {} min to fit a hole: it starts {} s sooner",
                shape.0,
                shape.1,
                when(asked).saturating_sub(when(shape))
            );
        }
        shape
    }
}

impl Submit for SbatchJoin {
    fn submit(&self, nodes: u32, minutes: u64, reason: &str) -> Result<String, String> {
        println!("htc: grow: submitting a job of {nodes} node(s) for {minutes} min to join the run: {reason}");
        let (nodes, minutes) = self.fit((nodes, minutes));
        let mut cmd = self.sbatch((nodes, minutes)).map_err(|e| e.to_string())?;
        cmd.arg("--parsable").arg(format!("--htc-join={}", self.run.id())).arg(slurm::GUARD_SCRIPT);
        let out = cmd.output().map_err(|e| format!("running sbatch: {e}"))?;
        if !out.status.success() {
            // Said by the leader, as often as it asks (a refusal by a limit once).
            return Err(slurm::sbatch_refusal(&out.stderr));
        }
        let job = String::from_utf8_lossy(&out.stdout).trim().split(';').next().unwrap_or_default().to_string();
        println!("htc: grow: submitted job {job}");
        Ok(job)
    }

    fn cancel(&self, jobs: &[String]) {
        println!("htc: grow: the run has ended; cancelling job(s) {} that never joined it", jobs.join(" "));
        let _ = Command::new("scancel").args(jobs).status();
    }

    fn queue(&self) -> Option<Queue> {
        let out = Command::new("squeue").args(["-h", "-o", "%i %t %r"]).output().ok()?;
        out.status.success().then(|| Queue::parse(&String::from_utf8_lossy(&out.stdout)))
    }
}
