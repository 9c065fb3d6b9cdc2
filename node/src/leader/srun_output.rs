//! What the agents' `srun --label` step writes on its stderr, read line by line: each agent's
//! lines (labelled with its task rank), and srun's word on a task that exited badly. An agent
//! that exits before it joined could not start on its node (its program missing there, or the
//! node's setup refused): the leader learns which node and why from here, at once, instead of
//! waiting for the whole step to end.

use std::collections::HashMap;

/// One line of srun's stderr.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// Written by the step's task `rank` (an agent, or slurmstepd in its name before the exec).
    Task { rank: u32, text: &'a str },
    /// srun: these tasks, on these nodes, exited badly (`how`: "exit code 2", a signal's name).
    Exited { nodes: &'a str, ranks: Vec<u32>, how: &'a str },
    /// srun: Slurm could not launch the step's tasks on `node` (the step is then aborted, and
    /// the tasks that did start are killed: the cause is this, not their end).
    LaunchFailed { node: &'a str, why: &'a str },
    /// Anything else srun says.
    Other(&'a str),
}

/// Reads one line (without its newline).
pub fn read(line: &str) -> Line<'_> {
    if let Some(e) = exited(line) {
        return e;
    }
    if let Some((node, why)) = line
        .strip_prefix("srun: error: Task launch for ")
        .and_then(|r| r.split_once(" failed on node "))
        .and_then(|(_, r)| r.split_once(": "))
    {
        return Line::LaunchFailed { node, why };
    }
    // `--label`: "RANK: text", the rank right-aligned (padded with spaces) to the widest one.
    let trimmed = line.trim_start_matches(' ');
    if let Some((rank, text)) = trimmed.split_once(": ") {
        if !rank.is_empty() && rank.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(rank) = rank.parse() {
                return Line::Task { rank, text };
            }
        }
    }
    Line::Other(line)
}

/// srun's "srun: error: c3: task 2: Exited with exit code 2" (one task), "srun: error:
/// c[1-2]: tasks 0-1,3: Exited with exit code 1", or "…: task 2: Killed" (a signal).
fn exited(line: &str) -> Option<Line<'_>> {
    let rest = line.strip_prefix("srun: error: ")?;
    let (nodes, rest) = rest.split_once(": task")?;
    let rest = rest.strip_prefix("s ").or_else(|| rest.strip_prefix(' '))?;
    let (list, how) = rest.split_once(": ")?;
    let ranks = ranks(list)?;
    let how = how.strip_prefix("Exited with ").unwrap_or(how);
    Some(Line::Exited { nodes, ranks, how })
}

/// "0-2,5" → [0, 1, 2, 5]; `None` for anything else.
fn ranks(list: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
        if b < a || b - a > 1_000_000 {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
}

/// Each rank's last line, to say why it exited: bounded, one short line per rank.
#[derive(Default)]
pub struct LastWords {
    by_rank: HashMap<u32, String>,
}

/// What is kept of a line.
const KEEP: usize = 300;

impl LastWords {
    pub fn said(&mut self, rank: u32, text: &str) {
        let mut cut = text.len().min(KEEP);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let words = self.by_rank.entry(rank).or_default();
        words.clear();
        words.push_str(text[..cut].trim_end());
    }

    /// Why `rank`, running `program`, exited: its last line, and srun's `how`, on `nodes`. A
    /// rank that said nothing never ran `program`: slurmstepd's exec of it failed, which it logs
    /// in slurmd's log only and reports as an exit code that is the exec's errno.
    pub fn why(&self, rank: u32, nodes: &str, how: &str, program: &str) -> String {
        if let Some(w) = self.by_rank.get(&rank).filter(|w| !w.is_empty()) {
            return format!("on {nodes}: {w} ({how})");
        }
        let errno = how.strip_prefix("exit code ").and_then(|c| c.parse::<i32>().ok()).filter(|&c| c > 0);
        match errno {
            Some(e) => format!(
                "on {nodes}: {program} did not run there ({how}: {}, as slurmstepd's exec of it reports; \
                 slurmd's log on {nodes} has its line)",
                strerror(e)
            ),
            None => format!("on {nodes}: {program} ended before it said anything ({how})"),
        }
    }
}

/// An exited rank is told once its last words had time to come: srun says a task exited as soon
/// as it hears of it, and the task's own last line, forwarded on another connection, may come
/// after (several agents failing at once were told by their exec's errno, a wrong cause).
pub const WORDS_GRACE_US: u64 = 500_000;

/// Exits waiting for their grace, in the order srun said them.
#[derive(Default)]
pub struct Exits {
    waiting: std::collections::VecDeque<Exit>,
}

/// A rank srun said exited, at `said_us`, with its nodes and how.
pub struct Exit {
    pub said_us: u64,
    pub rank: u32,
    pub nodes: String,
    pub how: String,
}

impl Exits {
    pub fn said(&mut self, now_us: u64, nodes: &str, ranks: Vec<u32>, how: &str) {
        let exit = |rank| Exit { said_us: now_us, rank, nodes: nodes.to_string(), how: how.to_string() };
        self.waiting.extend(ranks.into_iter().map(exit));
    }

    /// How long until the next is due (`None`: none waits).
    pub fn next_in_us(&self, now_us: u64) -> Option<u64> {
        self.waiting.front().map(|e| (e.said_us + WORDS_GRACE_US).saturating_sub(now_us))
    }

    /// Those due by `now_us`; every one once srun's output has ended (`ended`).
    pub fn due(&mut self, now_us: u64, ended: bool) -> Vec<Exit> {
        let n = self.waiting.iter().take_while(|e| ended || e.said_us + WORDS_GRACE_US <= now_us).count();
        self.waiting.drain(..n).collect()
    }
}

/// The C library's text for `errno`, without std's " (os error N)".
fn strerror(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    text.strip_suffix(&format!(" (os error {errno})")).map(str::to_string).unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_is_told_after_its_grace_or_when_srun_s_output_ends() {
        let mut x = Exits::default();
        assert_eq!(x.next_in_us(0), None);
        x.said(1_000, "n3", vec![2], "exit code 1");
        x.said(201_000, "n[1-2]", vec![0, 1], "exit code 1");
        assert_eq!(x.next_in_us(101_000), Some(WORDS_GRACE_US - 100_000));
        assert!(x.due(1_000 + WORDS_GRACE_US - 1, false).is_empty(), "not before its grace");
        let due = x.due(1_000 + WORDS_GRACE_US, false);
        assert_eq!(due.iter().map(|e| (e.rank, e.nodes.as_str())).collect::<Vec<_>>(), [(2, "n3")]);
        assert_eq!(x.next_in_us(1_000 + WORDS_GRACE_US), Some(200_000));
        let rest = x.due(1_000 + WORDS_GRACE_US, true);
        assert_eq!(rest.iter().map(|e| e.rank).collect::<Vec<_>>(), [0, 1], "all once the output ended");
        assert_eq!(x.next_in_us(0), None);
    }

    #[test]
    fn srun_s_lines_are_told_apart() {
        assert_eq!(
            read("srun: error: c3: task 2: Exited with exit code 2"),
            Line::Exited { nodes: "c3", ranks: vec![2], how: "exit code 2" }
        );
        assert_eq!(
            read("srun: error: c[1-2]: tasks 0-1,3: Exited with exit code 1"),
            Line::Exited { nodes: "c[1-2]", ranks: vec![0, 1, 3], how: "exit code 1" }
        );
        assert_eq!(
            read("srun: error: c4: task 7: Killed"),
            Line::Exited { nodes: "c4", ranks: vec![7], how: "Killed" }
        );
        assert_eq!(
            read(" 2: slurmstepd: error: execve(): /opt/htc-agent: No such file or directory"),
            Line::Task { rank: 2, text: "slurmstepd: error: execve(): /opt/htc-agent: No such file or directory" }
        );
        assert_eq!(read("12: htc-agent: WARN ..."), Line::Task { rank: 12, text: "htc-agent: WARN ..." });
        assert_eq!(
            read("srun: error: Task launch for StepId=1.0 failed on node n4: Header lengths are longer than data received"),
            Line::LaunchFailed { node: "n4", why: "Header lengths are longer than data received" }
        );
        for other in [
            "srun: error: Unable to create step for job 5: Invalid generic resource",
            "srun: Job step aborted",
            "srun: error: c3: task x: Exited with exit code 2",
            "srun: error: c3: tasks 5-2: Exited with exit code 2",
            "warning: a: b",
            ": nothing",
            "",
        ] {
            assert_eq!(read(other), Line::Other(other), "{other}");
        }
    }

    #[test]
    fn the_last_words_are_short_and_name_the_node() {
        let mut w = LastWords::default();
        assert_eq!(
            w.why(1, "c2", "exit code 2", "/x/htc-agent"),
            "on c2: /x/htc-agent did not run there (exit code 2: No such file or directory, as slurmstepd's exec of it \
             reports; slurmd's log on c2 has its line)"
        );
        assert_eq!(
            w.why(1, "c2", "Killed", "/x/htc-agent"),
            "on c2: /x/htc-agent ended before it said anything (Killed)"
        );
        w.said(1, "first");
        w.said(1, "htc-agent: error: --mem-limit cgroup: no memory cgroup  ");
        assert_eq!(
            w.why(1, "c2", "exit code 1", "/x/htc-agent"),
            "on c2: htc-agent: error: --mem-limit cgroup: no memory cgroup (exit code 1)"
        );
        w.said(2, &"é".repeat(400));
        assert!(w.why(2, "c3", "Killed", "/x").len() < KEEP + 40);
    }
}
