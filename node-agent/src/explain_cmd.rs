//! `htc task explain RUN IDS`: why each task is where it is, in words and as JSON, as the run's
//! leader sees it now (`htc_engine::leader::core::explain`); with no leader running, what the
//! ledger alone tells (ended, waiting for others, or waiting for the run to go on).

use std::io::Write;

use serde::Serialize;

use crate::ledger::{Ledger, Reads};
use crate::rundir::RunDir;
use htc_engine::wire::proto::TaskWhy;
use htc_node::client::{Client, ClientError};

/// An answer as `--format json` writes it, a line per task.
#[derive(Serialize)]
struct Json<'a> {
    id: u64,
    state: &'a str,
    kind: &'a str,
    why: &'a str,
    #[serde(skip_serializing_if = "<[u64]>::is_empty")]
    ids: &'a [u64],
    #[serde(skip_serializing_if = "is_zero")]
    more: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<u32>,
    #[serde(skip_serializing_if = "str::is_empty")]
    host: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ask: Option<Room>,
    #[serde(skip_serializing_if = "Option::is_none")]
    room: Option<Room>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    left_s: Option<f64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Cores, MiB and GPUs.
#[derive(Serialize)]
struct Room {
    cores: u64,
    mem_mib: u64,
    gpus: u64,
}

fn room(parts: &[u64]) -> Option<Room> {
    match *parts {
        [cores, mem_mib, gpus] => Some(Room { cores, mem_mib, gpus }),
        _ => None,
    }
}

/// `htc task explain`: 0 when every task was found, 2 when one was not.
pub fn explain(run: &str, ids: &[String], format: &str) -> anyhow::Result<i32> {
    if !matches!(format, "tsv" | "json") {
        anyhow::bail!("--format {format}: tsv or json");
    }
    let asked = crate::id_args::id_list(ids)?;
    let dir = RunDir::find(Some(run))?;
    let whys = match whys(&dir, &asked)? {
        Ok(whys) => whys,
        Err(e) => {
            eprintln!("htc: {e}");
            return Ok(1);
        }
    };
    let mut o = std::io::BufWriter::new(std::io::stdout().lock());
    for w in &whys {
        if format == "json" {
            writeln!(o, "{}", serde_json::to_string(&json(w))?)?;
        } else {
            writeln!(o, "{}\t{}\t{}", w.id, w.state, w.words)?;
        }
    }
    o.flush()?;
    let known: std::collections::HashSet<u64> = whys.iter().map(|w| w.id).collect();
    let unknown: Vec<u64> = asked.into_iter().filter(|id| !known.contains(id)).collect();
    if !unknown.is_empty() {
        eprintln!("htc: no task {}", htc_core::idset::format(&unknown));
        return Ok(2);
    }
    Ok(0)
}

fn json(w: &TaskWhy) -> Json<'_> {
    let s = |ms: u64| (w.kind == "time_limit").then_some(ms as f64 / 1000.0);
    Json {
        id: w.id,
        state: &w.state,
        kind: &w.kind,
        why: &w.words,
        ids: &w.ids,
        more: w.more,
        agent: w.agent,
        host: &w.host,
        ask: room(&w.ask),
        room: room(&w.room),
        runtime_s: s(w.runtime_ms),
        left_s: s(w.left_ms),
    }
}

/// The leader's answer, or the ledger's when no leader answers.
pub(crate) fn whys(dir: &std::path::Path, ids: &[u64]) -> anyhow::Result<Result<Vec<TaskWhy>, ClientError>> {
    let patience = htc_node::client::patience().min(htc_node::auth::HANDSHAKE_TIMEOUT);
    match Client::connect_within(&RunDir::new(dir), patience) {
        Ok(mut c) => match c.explain(ids.to_vec()) {
            Ok(whys) => Ok(Ok(whys)),
            Err(ClientError::NoAnswer { .. }) | Err(ClientError::Refused(_)) => from_ledger(dir, ids).map(Ok),
            Err(e) => Ok(Err(e)),
        },
        Err(_) => from_ledger(dir, ids).map(Ok),
    }
}

/// What the ledger alone tells: an ended task's end, the tasks a waiting one waits for that
/// have not ended, or that the run must go on for it to run.
fn from_ledger(dir: &std::path::Path, ids: &[u64]) -> anyhow::Result<Vec<TaskWhy>> {
    let run = RunDir::open_for_reading(dir.to_path_buf())?;
    let ledger = Ledger::open(&run.ledger(), true)?;
    let t = ledger.read()?;
    let mut out = Vec::new();
    for &id in ids {
        let r = match t.get(id) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                let (state, kind, words) = (htc_core::record::DAMAGED.into(), "damaged".into(), e.to_string());
                out.push(TaskWhy { id, state, kind, words, ..Default::default() });
                continue;
            }
        };
        let open: Vec<u64> = match t.needs(id)? {
            Some(n) if !r.state().is_final() => n
                .each()
                .map(|(d, _)| d)
                .filter(|&d| !t.get(d).ok().flatten().is_some_and(|r| r.state().is_final()))
                .take(20)
                .collect(),
            _ => Vec::new(),
        };
        let state = htc_core::record::TaskStatus::of(id, &r, r.state(), !open.is_empty()).state.to_string();
        let w = if r.state().is_final() {
            TaskWhy { kind: "ended".into(), words: "it has ended".into(), ..Default::default() }
        } else if open.is_empty() {
            let words = "no leader runs the run: it runs once the run goes on (htc resume, htc run --resume)";
            TaskWhy { kind: "not_running".into(), words: words.into(), ..Default::default() }
        } else {
            let words = format!("waiting for task(s) {} to end, once the run goes on", htc_core::idset::format(&open));
            TaskWhy { kind: "after".into(), words, ids: open, ..Default::default() }
        };
        out.push(TaskWhy { id, state, ..w });
    }
    Ok(out)
}
