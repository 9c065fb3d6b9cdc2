//! The live view of a running run: a small file (`RUN/live`) the leader rewrites every second,
//! with the counts, every instance's row and the latest failures. `htc watch` reads it alone, so
//! watching costs the same for ten tasks as for ten million, and works from a login node for a
//! Slurm job whose ledger is on a compute node (the run directory is in the submit directory).
//!
//! The format is lines of tab-separated fields, the first word naming the line; readers skip
//! lines they do not know, so a newer leader's file still reads.

use std::fmt::Write as _;

use htc_core::task::Counts;

pub const FILE: &str = "live";
const MAGIC: &str = "htc-live 1";

/// How many failed attempts the view keeps, newest last.
pub const RECENT_FAILURES: usize = 12;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    pub job: String,
    /// When the leader wrote it (unix µs).
    pub now_us: u64,
    /// When the leader's session started (unix µs).
    pub session_start_us: u64,
    /// `running`, or how the session ended (`complete`, `interrupted: …`).
    pub state: String,
    pub counts: Counts,
    /// Tasks finished before this session (a resumed run's), so the rate counts only this one's.
    pub finished_start: u64,
    /// Pending tasks that wait for others (`after=`), among `counts`' pending.
    pub blocked: u64,
    pub nodes: Vec<Node>,
    pub failures: Vec<Failure>,
    /// The allocations that joined the run (`--htc-join`), in the order they came.
    pub allocations: Vec<Allocation>,
}

/// An allocation that joined the run: its job, agents, end and what its agents ran.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocation {
    pub job: String,
    pub first_agent: u32,
    pub agents: u32,
    pub nodes: u32,
    /// When it must be gone (unix µs); 0: no end known.
    pub ends_us: u64,
    /// `running`, `leaving`, `gone`.
    pub state: String,
    /// Attempts its agents ended.
    pub tasks: u64,
}

/// One instance (an agent, or a head with its members): what it has and what it did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    pub agent: u32,
    pub host: String,
    pub cores: u32,
    /// Cores running a task, as the agent last said.
    pub busy: u32,
    pub done: u64,
    pub failed: u64,
    pub heard_us: u64,
    /// `up`, `lost`, `drained`.
    pub state: String,
}

/// A failed attempt: retried (`retrying`) or the task's last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Failure {
    pub task: u64,
    pub line: u32,
    pub host: String,
    pub at_us: u64,
    pub reason: String,
    pub retrying: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}:{line}: not a live view line ({why})")]
    Bad { path: String, line: usize, why: String },
}

/// Tabs and line ends would split a field: hostnames and reasons have none, but make sure.
fn clean(s: &str) -> String {
    s.chars().map(|c| if c == '\t' || c == '\n' || c == '\r' { ' ' } else { c }).collect()
}

impl View {
    pub fn finished(&self) -> u64 {
        self.counts.finished()
    }

    pub fn encode(&self) -> String {
        let mut s = String::with_capacity(128 + 64 * self.nodes.len());
        let c = &self.counts.0;
        let _ = writeln!(s, "{MAGIC}");
        let _ = writeln!(s, "job\t{}", clean(&self.job));
        let _ = writeln!(s, "time\t{}\t{}", self.now_us, self.session_start_us);
        let _ = writeln!(s, "state\t{}", clean(&self.state));
        // Cancelled last: a reader of the five states before it reads the line as it was.
        let _ = writeln!(
            s,
            "counts\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            c[0], c[1], c[2], c[3], c[4], self.finished_start, c[5], self.blocked
        );
        for n in &self.nodes {
            let _ = writeln!(
                s,
                "node\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                n.agent,
                clean(&n.host),
                n.cores,
                n.busy,
                n.done,
                n.failed,
                n.heard_us,
                clean(&n.state)
            );
        }
        for a in &self.allocations {
            let _ = writeln!(
                s,
                "allocation\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                clean(&a.job),
                a.first_agent,
                a.agents,
                a.nodes,
                a.ends_us,
                clean(&a.state),
                a.tasks
            );
        }
        for f in &self.failures {
            let _ = writeln!(
                s,
                "failure\t{}\t{}\t{}\t{}\t{}\t{}",
                f.task,
                f.line,
                clean(&f.host),
                f.at_us,
                f.retrying as u8,
                clean(&f.reason)
            );
        }
        s
    }

    /// Reads what `encode` wrote; `path` names the file in errors.
    pub fn decode(text: &str, path: &str) -> Result<View, LiveError> {
        let bad = |line: usize, why: &str| LiveError::Bad { path: path.into(), line, why: why.into() };
        let mut lines = text.lines().enumerate();
        if lines.next().map(|(_, l)| l) != Some(MAGIC) {
            return Err(bad(1, "it does not start with `htc-live 1`"));
        }
        let mut v = View::default();
        for (i, l) in lines {
            let f: Vec<&str> = l.split('\t').collect();
            let n = |k: usize| -> Result<u64, LiveError> {
                f.get(k).and_then(|x| x.parse().ok()).ok_or_else(|| bad(i + 1, &format!("field {k} is not a number")))
            };
            let s = |k: usize| f.get(k).map(|x| x.to_string()).unwrap_or_default();
            match f[0] {
                "job" => v.job = s(1),
                "time" => (v.now_us, v.session_start_us) = (n(1)?, n(2)?),
                "state" => v.state = s(1),
                "counts" => {
                    for (k, c) in v.counts.0[..5].iter_mut().enumerate() {
                        *c = n(k + 1)?;
                    }
                    v.finished_start = n(6)?;
                    v.counts.0[5] = if f.len() > 7 { n(7)? } else { 0 };
                    v.blocked = if f.len() > 8 { n(8)? } else { 0 };
                }
                "node" => v.nodes.push(Node {
                    agent: n(1)? as u32,
                    host: s(2),
                    cores: n(3)? as u32,
                    busy: n(4)? as u32,
                    done: n(5)?,
                    failed: n(6)?,
                    heard_us: n(7)?,
                    state: s(8),
                }),
                "allocation" => v.allocations.push(Allocation {
                    job: s(1),
                    first_agent: n(2)? as u32,
                    agents: n(3)? as u32,
                    nodes: n(4)? as u32,
                    ends_us: n(5)?,
                    state: s(6),
                    tasks: n(7)?,
                }),
                "failure" => v.failures.push(Failure {
                    task: n(1)?,
                    line: n(2)? as u32,
                    host: s(3),
                    at_us: n(4)?,
                    retrying: n(5)? != 0,
                    reason: s(6),
                }),
                _ => {}
            }
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use htc_core::task::State;

    fn sample() -> View {
        View {
            job: "1234".into(),
            now_us: 1_700_000_000_000_000,
            session_start_us: 1_699_999_990_000_000,
            state: "running".into(),
            counts: Counts([5, 1, 2, 90, 2, 3]),
            finished_start: 10,
            blocked: 4,
            nodes: vec![
                Node {
                    agent: 0,
                    host: "n1".into(),
                    cores: 4,
                    busy: 3,
                    done: 50,
                    failed: 1,
                    heard_us: 7,
                    state: "up".into(),
                },
                Node { agent: 1, host: "n2".into(), state: "lost".into(), ..Default::default() },
            ],
            failures: vec![Failure {
                task: 17,
                line: 19,
                host: "n1".into(),
                at_us: 9,
                reason: "exit 3".into(),
                retrying: true,
            }],
            allocations: vec![Allocation {
                job: "1240".into(),
                first_agent: 2,
                agents: 2,
                nodes: 2,
                ends_us: 1_700_000_600_000_000,
                state: "running".into(),
                tasks: 33,
            }],
        }
    }

    #[test]
    fn roundtrip_and_tabs_in_fields_cannot_split_them() {
        let v = sample();
        assert_eq!(View::decode(&v.encode(), "live").unwrap(), v);
        assert_eq!(v.finished(), 95);
        // A view written before tasks could be cancelled says none were.
        let old = v.encode().replace("\t10\t3\t4\n", "\t10\n");
        assert_eq!(View::decode(&old, "live").unwrap().counts.get(State::Cancelled), 0);
        // ... and one written before blocked tasks were counted, none blocked.
        let old = v.encode().replace("\t10\t3\t4\n", "\t10\t3\n");
        let back = View::decode(&old, "live").unwrap();
        assert_eq!((back.counts.get(State::Cancelled), back.blocked), (3, 0));
        let mut tabbed = sample();
        tabbed.nodes[1].host = "n\t2".into();
        tabbed.failures[0].reason = "line\nbreak".into();
        let back = View::decode(&tabbed.encode(), "live").unwrap();
        assert_eq!((back.nodes[1].host.as_str(), back.failures[0].reason.as_str()), ("n 2", "line break"));
    }

    #[test]
    fn unknown_lines_are_skipped_and_damage_is_named() {
        let text = sample().encode() + "future\tthing\n";
        assert_eq!(View::decode(&text, "live").unwrap(), sample());
        let e = View::decode("htc-live 1\nnode\t1\tx\tNaN\n", "RUN/live").unwrap_err().to_string();
        assert_eq!(e, "RUN/live:2: not a live view line (field 3 is not a number)");
        assert!(View::decode("", "x").is_err());
    }
}
