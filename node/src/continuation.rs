//! A run continued by another Slurm job than the one that began it: a requeued job, `htc resume`
//! (`--htc-resume`), a joined job that takes the run over. Each rebuilds the ledger on its own
//! node from the replica in the run directory, makes what was in flight pending again, and names
//! the run under its own job id too.

use std::path::{Path, PathBuf};

use anyhow::Context;
use htc_core::output::OutputMode;
use htc_store::ledger::Ledger;
use htc_store::replica::{self, Replica};
use htc_store::rundir::RunDir;

use crate::leader::driver::{reset_interrupted, Survivors};

/// Whether a Slurm job's run finished loading: its replica has a snapshot (written once the
/// tasks are in), or, in a run directory from before the ledger moved to the node, the ledger in
/// it has its total.
pub fn is_complete(run: &RunDir) -> bool {
    let legacy = || {
        run.ledger().exists()
            && Ledger::open(&run.ledger(), true).ok().and_then(|l| l.read().ok()?.meta_u64("total").ok()?).is_some()
    };
    run.secret().exists() && (Replica::of(&run.path).exists() || legacy())
}

/// `.htc/JOB` beside the run, naming it: the job continuing it is another name of the run.
pub fn link_job(run: &RunDir, job_id: &str) -> anyhow::Result<()> {
    let link = run.path.with_file_name(job_id);
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(run.path.file_name().unwrap_or_default(), &link)
        .with_context(|| format!("linking {} to the run", link.display()))
}

/// `RunDir::take_over`, with the run named in its error.
pub fn adopt(run: RunDir, local: &Path) -> anyhow::Result<RunDir> {
    let path = run.path.clone();
    run.take_over(local).with_context(|| format!("rebuilding the ledger of {} on this node", path.display()))
}

/// `htc resume`'s job: continues the run of job `earlier` in `base/.htc`, reachable under this
/// job's id too, so that `htc status` and `htc output` work with either id. `Err` says why
/// there is nothing to resume; else the run and what to tell the user.
pub fn resume_run(
    base: &Path,
    earlier: u32,
    job_id: &str,
    local: &Path,
    ledger_dir: Option<&Path>,
) -> anyhow::Result<Result<(RunDir, String), String>> {
    let runs = base.join(".htc");
    let Ok(path) = std::fs::canonicalize(runs.join(earlier.to_string())) else {
        return Ok(Err(format!("job {earlier} left no run in {} to resume", runs.display())));
    };
    let run = RunDir::new(path);
    if !is_complete(&run) {
        return Ok(Err(format!("{} is not a complete run; nothing to resume", run.path.display())));
    }
    let (run, n) = {
        let _lock = run.lock()?;
        let run = adopt(run, local)?;
        let n = reset_interrupted(&run, Survivors::None)?;
        remove_earlier_ledgers(&run, job_id, ledger_dir);
        (run, n)
    };
    link_job(&run, job_id)?;
    let said = format!("htc: job {job_id} continues the run of job {earlier} ({})", n.said());
    Ok(Ok((run, said)))
}

/// A joined job takes the run over, holding its lock: the ledger on this node, what was in
/// flight pending again, the run named under this job's id. `Err` says why this node cannot
/// hold the ledger; else the run and how many tasks are left.
pub fn take_over(
    run: &RunDir,
    job_id: &str,
    ledger_dir: Option<&Path>,
) -> anyhow::Result<Result<(RunDir, u64), String>> {
    let local = match replica::node_local(ledger_dir, job_id) {
        Ok(p) => p,
        Err(why) => return Ok(Err(why.to_string())),
    };
    let run = adopt(run.clone(), &local)?;
    // Its agents that kept running bring what they hold: only ends are salvaged.
    let n = reset_interrupted(&run, Survivors::Maybe)?.left;
    remove_earlier_ledgers(&run, job_id, ledger_dir);
    link_job(&run, job_id)?;
    Ok(Ok((run, n)))
}

/// What a killed leader of this run left on this node's disk is behind the replica once this
/// job holds the run (a resume, a take-over): removed, as a session that ends removes its own.
/// Call with the run's lock held.
fn remove_earlier_ledgers(run: &RunDir, job_id: &str, ledger_dir: Option<&Path>) {
    let earlier: Vec<String> = run.job_ids().into_iter().filter(|id| id != job_id).collect();
    for d in replica::remove_stale_node_local(ledger_dir, &earlier) {
        tracing::info!(job = job_id, dir = %d.display(), "removed an earlier session's node-local ledger");
    }
}

/// The run's own output mode, which a job taking it over keeps (not its own default).
pub fn output_mode(run: &RunDir) -> anyhow::Result<Option<OutputMode>> {
    let l = Ledger::open(&run.ledger(), true)?;
    let mode = l.read()?.meta("output")?.and_then(|b| std::str::from_utf8(b).ok()?.parse().ok());
    Ok(mode)
}

/// The run directory `--join-run` names: a job id is `.htc/JOBID` in the submit directory
/// (`base`), anything else a path.
pub fn join_run_dir(run: &Path, base: &Path) -> PathBuf {
    match run.to_str().filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())) {
        Some(job) => base.join(".htc").join(job),
        None => base.join(run),
    }
}

/// What the agents of the session before a take-over journaled of the tasks whose last
/// journaled attempt started and did not end (every entry of those tasks): `take_over` left them
/// to their agents' word, and the new leader records those no agent brings back as interrupted.
/// Read before this session's agents write: after the take-over, before the leader starts.
pub fn awaited_starts(run: &RunDir) -> Vec<htc_core::salvage::Told> {
    let Ok((mut told, _)) = htc_exec::results::read_run(&run.out()) else { return Vec::new() };
    told.sort_by_key(|t| (t.id, t.attempt, t.end.is_some()));
    let open: std::collections::HashSet<u64> = told
        .chunk_by(|a, b| a.id == b.id)
        .filter(|g| g.last().is_some_and(|t| t.end.is_none()))
        .map(|g| g[0].id)
        .collect();
    told.retain(|t| open.contains(&t.id));
    told
}

/// Agents of the run's other joined jobs that may come to a leader taking the run over with
/// their tasks: those of one-agent instances (the only ones that wait for a new leader) of jobs
/// still running when the old leader last wrote its live view.
pub fn others_kept(run: &RunDir, job_id: &str) -> usize {
    let Ok(Some(view)) = crate::livefile::read(&run.path) else { return 0 };
    view.allocations
        .iter()
        .filter(|a| a.job != job_id && a.state == "running" && a.agents == a.nodes)
        .map(|a| a.agents as usize)
        .sum()
}

/// The replica holds everything once a session ends (its last snapshot): the node's disk is
/// the admin's again.
pub fn release_node_local(run: &RunDir) {
    if run.replicated() && Replica::of(&run.path).exists() {
        replica::remove_node_local(&run.ledger());
    }
}
