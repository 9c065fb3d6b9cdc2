//! `spank_htc.so`: the slurm-htc SPANK plugin.
//!
//! * sbatch: `--htc=FILE` (and `--htc-retries`, `--htc-fanout`, `--htc-output`); the task file
//!   is checked at submit time, and a bad one fails sbatch (exit 255) before anything is queued.
//! * slurmstepd, batch step of an `--htc` job: the batch step becomes
//!   `htc-agent lead --task-file FILE … --script <batch script> [args…]`.
//! * Everything else (jobs without `--htc`, srun steps, slurmd) is left alone.
//!
//! See README.md for installation, plugstack arguments and the agent's argv contract.
//! Pure logic lives in [`config`] (unit-tested); the FFI parts are not built for tests, since
//! the SPANK symbols only exist inside Slurm's processes.

pub mod config;

#[cfg(not(test))]
#[allow(non_camel_case_types, non_upper_case_globals, non_snake_case, dead_code, clippy::all)]
mod ffi {
    include!(concat!(env!("OUT_DIR"), "/spank_bindings.rs"));
}

#[cfg(not(test))]
pub mod spank;

#[cfg(not(test))]
mod plugin;
