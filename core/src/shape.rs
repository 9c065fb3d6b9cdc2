//! What a task asks: the one type the task file parses into, the ledger's record keeps, the wire
//! carries to an agent and the executor runs by. A new ask is a field here, its place in the
//! ledger's layout, its wire mapping, and the code that honours it — nothing else.
//!
//! `class` and `runtime_ms` are hints rather than demands (they steer the plan, not where a task
//! may run), but they are said on the same line, stored with the rest and travel the same way
//! (the `sleep` simulation runs by the hint), so they are part of the shape: a second type for
//! them would bring back the copying this one ends.

/// Default retries for a task whose attempt fails (non-zero exit, signal, timeout).
pub const DEFAULT_RETRIES: u8 = 2;

/// The most cores one task may ask for (`cores=`).
pub const MAX_CORES: u32 = 4096;

/// The longest `stuck=` watch, in seconds: what the record's three bytes for it hold (194 days).
pub const MAX_STUCK_S: u32 = (1 << 24) - 1;

/// What one task asks for. Zero means "not given" for `mem_mb`, `timeout_ms`, `runtime_ms`,
/// `max_output`, `affinity` and `stuck_s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskShape {
    pub cores: u16,
    pub mem_mb: u32,
    /// `gpus=`: devices the task gets to itself.
    pub gpus: u8,
    pub timeout_ms: u32,
    /// Retries allowed after the first attempt. In a record this is the task's budget as its
    /// life moved it (a preemption or `htc retry` grows it).
    pub retries: u8,
    /// `class=`, as an index into the run's class names (0 = `default`).
    pub class: u16,
    /// The `runtime=` hint.
    pub runtime_ms: u32,
    /// `max_output=`: bytes kept of each of stdout and stderr, as stored (`output_cap`); 0 = all.
    pub max_output: u16,
    /// `priority=`: higher starts first (file order within a priority).
    pub priority: i16,
    /// `exclusive`: nothing else runs on the task's node meanwhile.
    pub exclusive: bool,
    /// `preemptible`: may be stopped (and run again later) for higher-priority work.
    pub preemptible: bool,
    /// `affinity=KEY`, hashed (`affinity::key_hash`).
    pub affinity: u32,
    /// Its attempts have rules (`attempts::Rules`: what grows, which ends are retried), kept
    /// in the ledger beside the record; the record's own values are its current attempt's.
    pub rules: bool,
    /// `stuck=`: killed as stuck after this many seconds of almost no CPU and no I/O.
    pub stuck_s: u32,
}

impl Default for TaskShape {
    /// What a task file line of only a command asks.
    fn default() -> Self {
        TaskShape {
            cores: 1,
            mem_mb: 0,
            gpus: 0,
            timeout_ms: 0,
            retries: DEFAULT_RETRIES,
            class: 0,
            runtime_ms: 0,
            max_output: 0,
            priority: 0,
            exclusive: false,
            preemptible: false,
            affinity: 0,
            rules: false,
            stuck_s: 0,
        }
    }
}

impl TaskShape {
    /// Bytes kept of each of stdout and stderr; 0 = all.
    pub fn max_output_bytes(&self) -> u64 {
        output_cap::bytes(self.max_output)
    }

    /// What an agent is told of the task: the leader's own asks (retries, class, exclusive,
    /// affinity, rules) at their defaults, since they decide where and how often it runs, not how.
    pub fn for_agent(&self) -> TaskShape {
        let d = TaskShape::default();
        TaskShape {
            retries: d.retries,
            class: d.class,
            exclusive: d.exclusive,
            affinity: d.affinity,
            rules: d.rules,
            ..*self
        }
    }

    /// Sets the output cap from a byte count as the wire carries it (one that `output_cap`
    /// encoded, so nothing is lost; any other is rounded up to what the ledger could store).
    pub fn with_max_output_bytes(self, bytes: u64) -> TaskShape {
        TaskShape { max_output: output_cap::encode(bytes).unwrap_or(u16::MAX), ..self }
    }
}

/// A per-task output cap in the two bytes a task record has for it: KiB up to 32 MiB, MiB
/// above (up to 32 GiB), rounded up; 0 is no cap.
pub mod output_cap {
    const MIB_FLAG: u16 = 0x8000;

    pub fn encode(bytes: u64) -> Option<u16> {
        let kib = bytes.div_ceil(1024);
        if kib < MIB_FLAG as u64 {
            return Some(kib as u16);
        }
        let mib = bytes.div_ceil(1 << 20);
        (mib < MIB_FLAG as u64).then_some(MIB_FLAG | mib as u16)
    }

    pub fn bytes(code: u16) -> u64 {
        if code & MIB_FLAG != 0 {
            ((code & !MIB_FLAG) as u64) << 20
        } else {
            (code as u64) << 10
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_cap_survives_the_trip_through_bytes() {
        for code in [0u16, 1, 64, 0x7fff, 0x8001, 0x8000 | 40, 0xffff] {
            let s = TaskShape { max_output: code, ..Default::default() };
            let back = TaskShape::default().with_max_output_bytes(s.max_output_bytes());
            assert_eq!(back.max_output_bytes(), s.max_output_bytes(), "code {code:#x}");
        }
    }

    #[test]
    fn an_agent_is_told_how_a_task_runs_not_where_or_how_often() {
        let s = TaskShape {
            cores: 3,
            mem_mb: 9,
            gpus: 1,
            timeout_ms: 5,
            retries: 7,
            class: 2,
            runtime_ms: 4,
            max_output: 6,
            priority: -1,
            exclusive: true,
            preemptible: true,
            affinity: 11,
            rules: true,
            stuck_s: 8,
        };
        let d = TaskShape::default();
        let expect = TaskShape { retries: d.retries, class: 0, exclusive: false, affinity: 0, rules: false, ..s };
        assert_eq!(s.for_agent(), expect);
    }
}
