//! `htc log RUN`: one row per attempt, from the ledger. The TSV has exactly the columns of GNU
//! parallel's `--joblog` (Seq Host Starttime JobRuntime Send Receive Exitval Signal Command), with
//! its number formats and its exit value and signal conventions, so scripts written for one read
//! the other; JSON lines use the same names (as parallel's `--results x.json`) plus what only htc
//! knows (Attempt, Line, Outcome).

use std::collections::HashMap;
use std::io::Write;

use serde::Serialize;

use crate::ledger::{Attempt, Ledger, Outcome, ReadTxn, Reads, Record};
use crate::load::TaskText;
use htc_core::attempts::{AttemptEnd, Rules};
use htc_core::shape::TaskShape;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Tsv,
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "tsv" => Ok(Format::Tsv),
            "json" => Ok(Format::Json),
            _ => Err(format!("'{s}' is not a log format (tsv or json)")),
        }
    }
}

pub const TSV_HEADER: &str = "Seq\tHost\tStarttime\tJobRuntime\tSend\tReceive\tExitval\tSignal\tCommand";

/// One attempt of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row<'a> {
    pub task: u64,
    pub line: u32,
    pub attempt: u32,
    pub host: &'a str,
    /// The agent that ran it (several may share a host).
    pub agent: u32,
    pub start_us: u64,
    pub end_us: u64,
    pub outcome: Outcome,
    pub value: i32,
    pub command: &'a [u8],
    /// The GPUs the attempt was given (`gpus=`), as the task saw them.
    pub devices: Option<&'a str>,
    /// What the attempt asked: a task whose attempts grow asks more on a retry.
    pub ask: Ask,
}

/// An attempt's cores, memory (MiB, 0 = none given) and timeout (ms, 0 = none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ask {
    pub cores: u16,
    pub mem_mb: u32,
    pub timeout_ms: u32,
}

impl Ask {
    fn of(s: &TaskShape) -> Ask {
        Ask { cores: s.cores, mem_mb: s.mem_mb, timeout_ms: s.timeout_ms }
    }
}

/// Parallel's Exitval and Signal: a signal's death is exit 0 and its number (as `$? >> 8` and
/// `$? & 127`), a killed job's exit -1; what could not start is the shell's 126 or 127.
pub fn exit_and_signal(outcome: Outcome, value: i32) -> (i32, i32) {
    match outcome {
        Outcome::Exited => (value, 0),
        Outcome::Signaled => (0, value),
        Outcome::TimedOut | Outcome::Stuck => (-1, libc::SIGTERM),
        // Killed by htc with SIGKILL, as a timed-out job is killed by parallel.
        Outcome::OutOfMemory => (-1, libc::SIGKILL),
        Outcome::Preempted => (-1, libc::SIGTERM),
        Outcome::SpawnFailed => (if value == libc::EACCES || value == libc::ENOEXEC { 126 } else { 127 }, 0),
        Outcome::Lost | Outcome::Interrupted | Outcome::Unschedulable | Outcome::Cancelled | Outcome::None => (-1, 0),
    }
}

fn secs(us: u64) -> String {
    format!("{}.{:03}", us / 1_000_000, us % 1_000_000 / 1000)
}

impl Row<'_> {
    /// An attempt lost with its agent has no known start (0): it shows as starting and ending
    /// when it was given up, not at the epoch.
    fn start_us(&self) -> u64 {
        if self.start_us == 0 {
            self.end_us
        } else {
            self.start_us
        }
    }

    fn runtime_s(&self) -> f64 {
        self.end_us.saturating_sub(self.start_us()) as f64 / 1e6
    }

    /// Parallel replaces newlines in commands by NUL to keep a row a line; task lines have none.
    pub fn tsv(&self) -> Vec<u8> {
        let (exit, sig) = exit_and_signal(self.outcome, self.value);
        let mut b = format!(
            "{}\t{}\t{}\t{:10.3}\t0\t0\t{exit}\t{sig}\t",
            self.task,
            self.host,
            secs(self.start_us()),
            self.runtime_s()
        )
        .into_bytes();
        b.extend(self.command.iter().map(|&c| if c == b'\n' { 0 } else { c }));
        b.push(b'\n');
        b
    }

    pub fn json(&self) -> String {
        let (exit, sig) = exit_and_signal(self.outcome, self.value);
        let json = Json {
            seq: self.task,
            host: self.host,
            // Milliseconds, as parallel shows them; serde_json drops trailing zeros.
            starttime: (self.start_us() / 1000) as f64 / 1e3,
            job_runtime: crate::status::rounded(self.runtime_s(), 3),
            send: 0,
            receive: 0,
            exitval: exit,
            signal: sig,
            command: &String::from_utf8_lossy(self.command),
            attempt: self.attempt,
            line: self.line,
            outcome: &self.outcome.describe(self.value),
            agent: self.agent,
            cores: self.ask.cores,
            mem_mib: self.ask.mem_mb,
            timeout_s: self.ask.timeout_ms as f64 / 1000.0,
            devices: self.devices,
        };
        serde_json::to_string(&json).expect("plain data serializes")
    }
}

/// A row of `htc log --format json`: parallel's names first, then htc's, in this order.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Json<'a> {
    seq: u64,
    host: &'a str,
    starttime: f64,
    job_runtime: f64,
    send: u64,
    receive: u64,
    exitval: i32,
    signal: i32,
    command: &'a str,
    attempt: u32,
    line: u32,
    outcome: &'a str,
    agent: u32,
    cores: u16,
    #[serde(rename = "MemMiB")]
    mem_mib: u32,
    #[serde(rename = "TimeoutS")]
    timeout_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    devices: Option<&'a str>,
}

/// Hostnames by agent id, as the leader recorded them when the agents joined (`host.N`).
struct Hosts<'t, 'l> {
    txn: &'t ReadTxn<'l>,
    known: HashMap<u32, String>,
}

impl Hosts<'_, '_> {
    fn of(&mut self, agent: u32) -> &str {
        let txn = self.txn;
        self.known.entry(agent).or_insert_with(|| match txn.meta(&format!("host.{agent}")) {
            Ok(Some(h)) => String::from_utf8_lossy(h).into_owned(),
            _ => format!("agent-{agent}"),
        })
    }
}

/// Writes every ended attempt, by task id then attempt: the retried and lost ones from the
/// attempt history, then each finished task's last; `devices` are the GPUs attempts were given
/// (JSON only: the TSV keeps parallel's columns). Returns the rows written.
pub fn write(
    ledger: &Ledger,
    text: &TaskText,
    format: Format,
    devices: &HashMap<(u64, u32), String>,
    out: &mut impl Write,
) -> anyhow::Result<u64> {
    let txn = ledger.read()?;
    // Every record is read anyway: check the pages that lead to them too.
    txn.check_structure(None)?;
    let mut earlier: Vec<(u64, Attempt)> = Vec::new();
    txn.for_each_attempt(|id, a| earlier.push((id, a)))?;
    let mut hosts = Hosts { txn: &txn, known: HashMap::new() };
    if format == Format::Tsv {
        writeln!(out, "{TSV_HEADER}")?;
    }
    let mut rows = 0u64;
    let mut next = 0usize;
    let mut err: Option<std::io::Error> = None;
    txn.for_each(|id, r: &Record| {
        if err.is_some() {
            return;
        }
        // An added task's command is in the ledger, not in the run's copy of the task file.
        let added;
        let command: &[u8] = if r.command().is_added() {
            added = match txn.added_command(r.cmd_off()) {
                Ok(c) => c.map(|mut c| {
                    c.truncate(r.cmd_len() as usize);
                    c
                }),
                Err(e) => {
                    err = Some(std::io::Error::other(e.to_string()));
                    return;
                }
            };
            added.as_deref().unwrap_or_default()
        } else {
            text.command(r)
        };
        let mut mine = Vec::new();
        while next < earlier.len() && earlier[next].0 <= id {
            if earlier[next].0 == id {
                mine.push(earlier[next].1);
            }
            next += 1;
        }
        let (mine, asks) = match ended_attempts(&txn, id, r, mine) {
            Ok(both) => both,
            Err(e) => {
                err = Some(std::io::Error::other(e.to_string()));
                return;
            }
        };
        for (a, ask) in mine.into_iter().zip(asks) {
            let host = hosts.of(a.agent).to_string();
            let mut row = attempt_row(id, r.line(), &a, &host, command);
            row.devices = devices.get(&(id, row.attempt)).map(String::as_str);
            row.ask = ask;
            let written = match format {
                Format::Tsv => out.write_all(&row.tsv()),
                Format::Json => writeln!(out, "{}", row.json()),
            };
            if let Err(e) = written {
                err = Some(e);
                return;
            }
            rows += 1;
        }
    })?;
    if let Some(e) = err {
        return Err(e.into());
    }
    out.flush()?;
    Ok(rows)
}

/// Task `id`'s ended attempts (its `earlier` ones from the history, then its record's last if
/// it is finished) and what each asked.
fn ended_attempts(
    txn: &ReadTxn<'_>,
    id: u64,
    r: &Record,
    mut earlier: Vec<Attempt>,
) -> anyhow::Result<(Vec<Attempt>, Vec<Ask>)> {
    let rules = if r.shape().rules { txn.rules(id)? } else { None };
    let mut asks = asks_of(r, &earlier, rules.as_ref());
    // A task refused as unschedulable did not run again: its last run is in the history (a
    // retry that outgrew every agent), or it never ran.
    if r.state().is_final() && r.attempts() > 0 && r.outcome() != Outcome::Unschedulable {
        earlier.push(r.last_attempt());
        asks.push(Ask::of(r.shape()));
    }
    Ok((earlier, asks))
}

/// What each earlier attempt of record `r` asked: the record's values, or, for a task whose
/// attempts grow, what the leader gave each (`results::finish_attempt`): the first attempt's
/// ask, then after each failure of its own the ask of the attempt numbered one past those that
/// counted so far (an attempt lost with its agent does not count, a preempted one does, and
/// neither changes the ask).
fn asks_of(r: &Record, earlier: &[Attempt], rules: Option<&Rules>) -> Vec<Ask> {
    let Some(rules) = rules else { return vec![Ask::of(r.shape()); earlier.len()] };
    let (mut counted, mut ask) = (0u32, rules.shape_at(r.shape(), 1));
    earlier
        .iter()
        .map(|a| {
            let this = Ask::of(&ask);
            counted += (a.ended.outcome != Outcome::Lost) as u32;
            if AttemptEnd::of(a.ended.outcome, a.ended.value as u32).is_some() {
                ask = rules.shape_at(r.shape(), counted + 1);
            }
            this
        })
        .collect()
}

fn attempt_row<'a>(task: u64, line: u32, a: &Attempt, host: &'a str, command: &'a [u8]) -> Row<'a> {
    Row {
        task,
        line,
        attempt: a.attempt as u32,
        host,
        agent: a.agent,
        start_us: a.ended.start_us,
        end_us: a.ended.end_us,
        outcome: a.ended.outcome,
        value: a.ended.value,
        command,
        devices: None,
        ask: Ask::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_attempt_of_a_growing_task_shows_what_the_leader_gave_it() {
        use htc_core::attempts::Growing;
        use htc_core::record::{CommandAt, Ended};
        let shape = TaskShape { mem_mb: 100, rules: true, ..TaskShape::default() };
        let r = Record::new(CommandAt::default(), shape);
        let rules = Rules { mem: Some(Growing::Times { first: 100, tenths: 20 }), ..Rules::default() };
        let ended = |outcome, value| Attempt { attempt: 1, agent: 0, ended: Ended::new(outcome, value, 1, 2) };
        let history = [
            ended(Outcome::OutOfMemory, 120),
            ended(Outcome::Lost, 0),
            ended(Outcome::Preempted, 0),
            ended(Outcome::Exited, 1),
            ended(Outcome::Exited, 1),
        ];
        let mem: Vec<u32> = asks_of(&r, &history, Some(&rules)).iter().map(|a| a.mem_mb).collect();
        // Grown after each failure of its own, to the attempt one past those counted (the loss
        // does not count, the preemption does): 2, then 4, then 5.
        assert_eq!(mem, [100, 200, 200, 200, 800]);
        assert_eq!(asks_of(&r, &history[..1], None)[0].mem_mb, 100, "without rules: the record's");
    }

    fn row(outcome: Outcome, value: i32) -> Row<'static> {
        Row {
            task: 3,
            line: 4,
            attempt: 2,
            host: "n1",
            agent: 5,
            start_us: 1_700_000_000_123_456,
            end_us: 1_700_000_001_623_456,
            outcome,
            value,
            command: b"echo \"a\tb\"",
            devices: None,
            ask: Ask { cores: 2, mem_mb: 512, timeout_ms: 1500 },
        }
    }

    #[test]
    fn tsv_rows_read_as_parallels_joblog() {
        let r = row(Outcome::Exited, 3).tsv();
        assert_eq!(String::from_utf8(r).unwrap(), "3\tn1\t1700000000.123\t     1.500\t0\t0\t3\t0\techo \"a\tb\"\n");
        assert_eq!(TSV_HEADER.split('\t').count(), 9);
        // Parallel: a job killed by a signal exits 0 with that signal; one it killed, -1.
        assert_eq!(exit_and_signal(Outcome::Signaled, 9), (0, 9));
        assert_eq!(exit_and_signal(Outcome::TimedOut, 0), (-1, 15));
        assert_eq!(exit_and_signal(Outcome::SpawnFailed, libc::ENOENT), (127, 0));
        // Lost with its agent, start unknown: shown at the loss, not at the epoch.
        let lost = Row { start_us: 0, ..row(Outcome::Lost, 0) }.tsv();
        assert_eq!(String::from_utf8(lost).unwrap(), "3\tn1\t1700000001.623\t     0.000\t0\t0\t-1\t0\techo \"a\tb\"\n");
    }

    #[test]
    fn json_rows_carry_parallels_names_and_the_attempt() {
        let j = row(Outcome::Signaled, 9).json();
        assert_eq!(
            j,
            r#"{"Seq":3,"Host":"n1","Starttime":1700000000.123,"JobRuntime":1.5,"Send":0,"Receive":0,"Exitval":0,"Signal":9,"Command":"echo \"a\tb\"","Attempt":2,"Line":4,"Outcome":"killed by signal 9 (KILL)","Agent":5,"Cores":2,"MemMiB":512,"TimeoutS":1.5}"#
        );
        // Milliseconds as `{:.3}` rounds them; GPUs last, and only for a task that had some.
        let r = Row { end_us: 1_700_000_001_624_056, devices: Some("0,1"), ..row(Outcome::Exited, 0) };
        let j = r.json();
        assert!(j.contains(r#""JobRuntime":1.501,"#), "{j}");
        assert!(j.ends_with(r#""Agent":5,"Cores":2,"MemMiB":512,"TimeoutS":1.5,"Devices":"0,1"}"#), "{j}");
    }
}
