//! slurm-htc domain core: what a task file says and how tasks are split among instances.
//! Pure logic with no runtime, shared by the node agent and the SPANK plugin.

pub mod hflow;
pub mod output;
pub mod partition;
pub mod task;
pub mod taskfile;
pub mod tree;
