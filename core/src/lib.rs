//! slurm-htc domain core: what a task file says and how tasks are split among instances.
//! Pure logic with no runtime, shared by the node agent and the SPANK plugin.

pub mod affinity;
pub mod after;
pub mod arrivals;
pub mod attempts;
pub mod backfill;
pub mod fanout;
pub mod grow;
pub mod hflow;
pub mod hist;
pub mod idmap;
pub mod idset;
pub mod orders;
pub mod output;
pub mod partition;
pub mod recall;
pub mod record;
pub mod salvage;
pub mod shape;
pub mod shellsyntax;
pub mod slots;
pub mod spawn_loop;
pub mod stuck;
pub mod sweep;
pub mod task;
pub mod taskfile;
pub mod tree;
pub mod virtual_agent;
pub mod virtual_exec;
pub mod work;

/// Tests' random numbers: xorshift from `seed`; `next(m)` is below `m`.
#[cfg(test)]
pub(crate) fn test_rng(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |m| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    }
}
