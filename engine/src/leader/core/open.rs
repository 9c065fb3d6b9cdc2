//! What an open run is made of, apart from the core (`adds` decides with them): a task a client
//! adds, the answer it gets, and the run's openness.

use htc_core::after::Needs;
use htc_core::shape::TaskShape;

/// A task a client adds, as its line said it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    /// Its line in what the client sent (for the reason of a refusal).
    pub line: u64,
    pub command: Vec<u8>,
    pub shell: bool,
    pub shape: TaskShape,
    pub needs: Needs,
    /// Its rules for its attempts (what grows, which ends are retried).
    pub rules: htc_core::attempts::Rules,
    /// The client's key: a task added again under the same key is the same task.
    pub key: Option<Vec<u8>>,
    /// The name the client gave it (`htc task add --name`), shown by `htc task status`.
    pub name: Option<Vec<u8>>,
    /// Its `class=`, by name: the run's number for it is the core's to give (`shape.class` is
    /// set then); `None` for `default`.
    pub class: Option<String>,
}

/// The ids of a request's tasks, in order, or why none was added.
pub type Answer = Result<Vec<u64>, String>;

/// An open run's state.
#[derive(Debug, Clone, Copy)]
pub struct Openness {
    /// `htc close`: it takes no more tasks, and ends when what it holds is done.
    pub closed: bool,
    /// With nothing to do for this long, it ends (`--idle-exit`); `None`: never.
    pub idle_exit_us: Option<u64>,
    /// When it last had something to do (a task not final, or an add).
    pub busy_us: u64,
}
