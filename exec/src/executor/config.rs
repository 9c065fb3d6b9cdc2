//! What one spawn loop is given: its slots and CPUs, where its output goes, the tasks' base
//! environment, and its share of the agent's GPUs and memory cgroups.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::output::OutputMode;

#[derive(Debug, Clone)]
pub struct ExecConfig {
    pub job_id: String,
    pub agent: u32,
    /// CPU of each slot; empty means no binding. Its length is the number of slots otherwise.
    pub cpus: Vec<usize>,
    pub slots: usize,
    pub out_dir: PathBuf,
    pub output: OutputMode,
    /// The tasks' base environment (HTC_* are added per task).
    pub env: Vec<(OsString, OsString)>,
    /// Time between SIGTERM and SIGKILL for a task that timed out or is aborted.
    pub kill_grace: Duration,
    /// This executor's place among the agent's spawners: its slots are numbered from
    /// `first_slot` in the output directory they share, and it keeps its own index file.
    pub spawner: usize,
    pub first_slot: usize,
    /// The agent's GPUs, shared by its spawn loops.
    pub gpus: crate::gpu::Pool,
    /// Where slots get memory cgroups for tasks with `mem=`; None: the RSS watch enforces it.
    pub memcg: Option<std::sync::Arc<crate::memcg::Root>>,
    /// How long a task's process group outlives the task before it is killed (`--keep-daemons`:
    /// `LINGER`), so that a daemon on its way out of it (`setsid server &` as a task's last
    /// command) gets out; zero: at the task's end.
    pub linger: Duration,
    /// This loop's results journal (`crate::results`): every start and end it reports is
    /// written there first. None: not kept (tests of the loop alone).
    pub results: Option<PathBuf>,
}

/// Time for a daemon that a task started as it ended to leave the task's process group: `setsid`
/// is a fork and an exec away (10 of 10 left within 200 ms here, 3 of 10 with no wait at all).
pub const LINGER: Duration = Duration::from_millis(500);

impl ExecConfig {
    /// The index of output records, one per spawner in the agent's output directory.
    pub fn index_name(&self) -> String {
        index_name(self.spawner)
    }
}

/// `index` for the first spawner, `index.N` for the others (`output::index_files` finds them).
pub(super) fn index_name(spawner: usize) -> String {
    if spawner == 0 {
        "index".into()
    } else {
        format!("index.{spawner}")
    }
}
