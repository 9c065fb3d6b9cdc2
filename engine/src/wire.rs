//! The wire format: the messages of `proto/htc.proto` as plain Rust types (prost), how they map
//! to the engine's own (`msg`: `down` for what goes down the tree, `up` for what comes up, `task`
//! for a task), and how a dispatch is cut into frames. The only place prost types appear in the
//! engine. Framing and sockets are the node's (`frame.rs` in the node agent); nothing here does
//! I/O.

use htc_core::record::Outcome;

pub mod down;
mod task;
pub mod up;
mod why;

/// Generated from `proto/htc.proto`.
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/htc.v1.rs"));
}

/// Bumped on any incompatible change to `proto/htc.proto`; the leader refuses other versions.
pub const PROTOCOL_VERSION: u32 = 10;

/// Senders split batches at this many encoded bytes, well under the framing's largest frame
/// (16 MiB).
pub const MAX_BATCH_BYTES: usize = 4 << 20;

/// How a task ended, on the wire and in the ledger: one mapping, used by both ends.
impl From<Outcome> for proto::Outcome {
    fn from(o: Outcome) -> proto::Outcome {
        match o {
            Outcome::Exited => proto::Outcome::Exited,
            Outcome::Signaled => proto::Outcome::Signaled,
            Outcome::TimedOut => proto::Outcome::TimedOut,
            Outcome::OutOfMemory => proto::Outcome::OutOfMemory,
            Outcome::Preempted => proto::Outcome::Preempted,
            Outcome::SpawnFailed => proto::Outcome::SpawnFailed,
            Outcome::Stuck => proto::Outcome::Stuck,
            // Decided by an instance head when a member is gone.
            Outcome::Lost => proto::Outcome::Lost,
            // Decided by the leader, never reported by an agent.
            Outcome::None | Outcome::Unschedulable | Outcome::Cancelled | Outcome::Interrupted => {
                proto::Outcome::Unspecified
            }
        }
    }
}

impl From<proto::Outcome> for Outcome {
    fn from(o: proto::Outcome) -> Outcome {
        match o {
            proto::Outcome::Exited => Outcome::Exited,
            proto::Outcome::Signaled => Outcome::Signaled,
            proto::Outcome::TimedOut => Outcome::TimedOut,
            proto::Outcome::OutOfMemory => Outcome::OutOfMemory,
            proto::Outcome::Preempted => Outcome::Preempted,
            proto::Outcome::SpawnFailed => Outcome::SpawnFailed,
            proto::Outcome::Lost => Outcome::Lost,
            proto::Outcome::Stuck => Outcome::Stuck,
            proto::Outcome::Unspecified => Outcome::None,
        }
    }
}

/// Tasks for `agent` as Dispatch frames, split by bytes as well as count so that long command
/// lines never exceed a frame.
pub fn dispatches(agent: u32, specs: Vec<proto::TaskSpec>) -> Vec<proto::Dispatch> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut bytes = 0;
    for s in specs {
        bytes += s.command.len() + 32;
        batch.push(s);
        if bytes >= MAX_BATCH_BYTES {
            out.push(proto::Dispatch { tasks: std::mem::take(&mut batch), agent });
            bytes = 0;
        }
    }
    if !batch.is_empty() {
        out.push(proto::Dispatch { tasks: batch, agent });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: u64, command_bytes: usize) -> proto::TaskSpec {
        proto::TaskSpec { id, command: vec![b'x'; command_bytes], ..Default::default() }
    }

    #[test]
    fn dispatches_are_cut_by_bytes_and_keep_every_task_in_order() {
        assert!(dispatches(3, Vec::new()).is_empty());
        let small = dispatches(3, (0..1000).map(|i| spec(i, 10)).collect());
        assert_eq!(small.len(), 1, "a thousand short commands fit one frame");
        let big = dispatches(3, (0..10).map(|i| spec(i, MAX_BATCH_BYTES / 4)).collect());
        assert!(big.len() >= 3, "ten quarter-batch commands need several dispatches: {}", big.len());
        let ids: Vec<u64> = big.iter().flat_map(|d| d.tasks.iter().map(|t| t.id)).collect();
        assert_eq!(ids, (0..10).collect::<Vec<_>>());
        assert!(big.iter().all(|d| d.agent == 3));
        let bytes = |d: &proto::Dispatch| d.tasks.iter().map(|t| t.command.len() + 32).sum::<usize>();
        assert!(big.iter().all(|d| bytes(d) < MAX_BATCH_BYTES + MAX_BATCH_BYTES / 4 + 32));
    }

    #[test]
    fn outcomes_an_agent_reports_cross_the_wire_unchanged() {
        use Outcome::*;
        for o in [Exited, Signaled, TimedOut, SpawnFailed, Lost, OutOfMemory, Preempted, Stuck] {
            assert_eq!(Outcome::from(proto::Outcome::from(o)), o);
        }
        // The leader's own verdicts are never sent.
        for o in [None, Unschedulable, Cancelled] {
            assert_eq!(proto::Outcome::from(o), proto::Outcome::Unspecified);
        }
    }
}
