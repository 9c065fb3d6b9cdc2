//! `htc task add|status|cancel` and `htc close`: what a script or a workflow manager asks of an
//! open run. Adds, cancels and close go to the run's leader (`htc_node::client`); status reads
//! the run's ledger, so a flood of queries never reaches the leader, and it answers when no
//! leader runs.

use std::io::{BufRead, Write};
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use crate::cli::htc::TaskAddArgs;
use crate::id_args::id_list;
use crate::ledger::{Reads, State};
use crate::rundir::RunDir;
use htc_core::after::Kind;
use htc_core::record::TaskStatus;
use htc_node::client::{Client, ClientError, OneTask};
use htc_store::vouch::Found as Vouched;

/// Lines sent in one request when adding from a stream; a batch also goes when no line came for
/// `STREAM_WAIT`, so that `tail -f queue | htc task add RUN --file -` adds a line as it comes.
const STREAM_BATCH: usize = 10_000;
const STREAM_WAIT: Duration = Duration::from_millis(20);

/// `htc task add`: prints each new task's id on a line of its own. 0 when added; 2 when the
/// request was refused (nothing of it added); 1 when the run cannot be reached.
pub fn add(a: TaskAddArgs) -> anyhow::Result<i32> {
    let run = leaders_run(&a.run)?;
    let mut c = match Client::connect(&run) {
        Ok(c) => c,
        Err(e) => return Ok(said(&e)),
    };
    let out = std::io::stdout();
    let mut print = |ids: Vec<u64>| -> anyhow::Result<()> {
        let mut o = out.lock();
        ids.into_iter().try_for_each(|id| writeln!(o, "{id}"))?;
        Ok(o.flush()?)
    };
    let result = match &a.file {
        Some(f) if f.as_os_str() == "-" && (a.key.is_some() || a.name.is_some()) => {
            eprintln!("htc: --key and --name name one task; a stream (--file -) adds many");
            return Ok(2);
        }
        Some(f) if f.as_os_str() == "-" => {
            stream(&mut c, std::io::BufReader::new(std::io::stdin()), "(stdin)", &mut print)
        }
        Some(f) => {
            let text = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            c.add(&text, &f.display().to_string(), 1, one(&a)).map(&mut print)
        }
        None => {
            let line = match task_line(&a) {
                Ok(l) => l,
                Err(why) => {
                    eprintln!("htc: {why}");
                    return Ok(2);
                }
            };
            c.add(&line, "the command line", 1, one(&a)).map(&mut print)
        }
    };
    match result {
        Ok(printed) => printed.map(|()| 0),
        Err(e) => Ok(said(&e)),
    }
}

/// The run a request only its leader carries out goes to (add, cancel, close): found, its ledger
/// not opened. Opening it for reading would rebuild a Slurm run's replica on this host, the
/// whole ledger for each client: 10,000 clients at once on a login node would each rebuild it.
fn leaders_run(run: &str) -> anyhow::Result<RunDir> {
    Ok(RunDir::new(RunDir::find(Some(run))?))
}

/// The key and name of the request's one task, if given.
fn one(a: &TaskAddArgs) -> OneTask<'_> {
    OneTask { key: a.key.as_deref().map(str::as_bytes), name: a.name.as_deref() }
}

/// Adds a stream's lines as they come, in batches; `#HTC` lines go again in front of every
/// later batch, since they set the defaults of the lines after them.
fn stream(
    c: &mut Client,
    input: impl BufRead + Send + 'static,
    source: &str,
    print: &mut dyn FnMut(Vec<u64>) -> anyhow::Result<()>,
) -> Result<anyhow::Result<()>, ClientError> {
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        for line in input.split(b'\n') {
            let Ok(mut l) = line else { break };
            l.push(b'\n');
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let (mut directives, mut batch, mut first, mut next_line) = (Vec::new(), Vec::new(), 1u64, 1u64);
    let mut lines_in_batch = 0;
    // An empty stream is still one request: a run that takes no tasks refuses it, and an open
    // run counts it as its client's word (`--idle-exit` counts from it).
    let mut sent = false;
    loop {
        let line = rx.recv_timeout(STREAM_WAIT);
        let ended = matches!(line, Err(std::sync::mpsc::RecvTimeoutError::Disconnected));
        if let Ok(l) = line {
            if l.trim_ascii_start().starts_with(b"#HTC") && !l.trim_ascii_start().starts_with(b"#HTC sweep") {
                directives.extend_from_slice(&l);
            }
            batch.extend_from_slice(&l);
            lines_in_batch += 1;
            next_line += 1;
            // A sweep's directive stays with its template line.
            let holds = l.trim_ascii_start().starts_with(b"#HTC sweep");
            if lines_in_batch < STREAM_BATCH || holds {
                continue;
            }
        }
        if lines_in_batch > 0 && !batch.iter().all(|b| b.is_ascii_whitespace()) {
            let mut text = directives.clone();
            let carried = text.iter().filter(|&&b| b == b'\n').count() as u64;
            text.extend_from_slice(&batch);
            // The carried directives come first: the batch's own lines keep their numbers.
            let ids = c.add(&text, source, first.saturating_sub(carried).max(1), OneTask::default())?;
            sent = true;
            if let Err(e) = print(ids) {
                return Ok(Err(e));
            }
        }
        (batch, lines_in_batch, first) = (Vec::new(), 0, next_line);
        if ended {
            if !sent {
                c.add(b"", source, 1, OneTask::default())?;
            }
            return Ok(Ok(()));
        }
    }
}

/// The task line `htc task add … -- CMD ARGS` stands for: its options, and the command with
/// each argument quoted for `/bin/sh` where it needs it.
pub fn task_line(a: &TaskAddArgs) -> Result<Vec<u8>, String> {
    if a.command.is_empty() {
        return Err("no command: give it after `--` (htc task add RUN -- CMD ARGS…), or --file".into());
    }
    let mut opts = Vec::new();
    let mut opt = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            opts.push(format!("{k}={v}"));
        }
    };
    opt("cores", a.cores.clone());
    opt("mem", a.mem.clone());
    opt("gpus", a.gpus.map(|n| n.to_string()));
    opt("timeout", a.timeout.clone());
    opt("retries", a.retries.map(|n| n.to_string()));
    opt("retry_on", a.retry_on.clone());
    opt("stuck", a.stuck.clone());
    opt("priority", a.priority.map(|n| n.to_string()));
    for (kind, ids) in [(Kind::After, &a.after), (Kind::AfterAny, &a.afterany)] {
        opt(kind.option(), ids.as_ref().map(|i| i.replace(',', ":")));
    }
    if opts.iter().any(|o| o.contains(char::is_whitespace)) {
        return Err("an option's value cannot hold blanks".into());
    }
    let mut cmd = Vec::new();
    if let Some(d) = &a.cwd {
        // Checked here, where the user sees the error, not when the task runs; a relative one
        // is where this command was given, wherever the run's workdir is.
        let d = std::path::absolute(d).map_err(|e| format!("--cwd {}: {e}", d.display()))?;
        if !d.is_dir() {
            return Err(format!("--cwd {}: no such directory", d.display()));
        }
        cmd.extend_from_slice(b"cd ");
        cmd.extend_from_slice(&quote(d.as_os_str().as_encoded_bytes()));
        cmd.extend_from_slice(b" && ");
    }
    let mut vars = exported(a.export.as_deref(), std::env::vars_os())?;
    for e in &a.env {
        let (name, value) = e.split_once('=').ok_or_else(|| format!("--env {e}: not NAME=VALUE"))?;
        if !is_var_name(name.as_bytes()) {
            return Err(format!("--env {e}: {name:?} is not a variable name"));
        }
        vars.push((name.into(), value.into()));
    }
    for (name, value) in vars {
        cmd.extend_from_slice(name.as_encoded_bytes());
        cmd.push(b'=');
        cmd.extend_from_slice(&quote(value.as_encoded_bytes()));
        cmd.push(b' ');
    }
    let args: Vec<Vec<u8>> = a.command.iter().map(|s| quote(s.as_encoded_bytes())).collect();
    cmd.extend_from_slice(&args.join(&b' '));
    debug_assert!(!cmd.contains(&b'\n'), "quote() leaves no newline");
    let mut line = Vec::new();
    // `[]` keeps a command that starts with `[` from being read as options.
    line.extend_from_slice(format!("[{}] ", opts.join(" ")).as_bytes());
    if cmd.windows(NL.len()).any(|w| w == NL) {
        line.extend_from_slice(NL_DEF);
    }
    line.extend_from_slice(&cmd);
    line.push(b'\n');
    Ok(line)
}

fn is_var_name(name: &[u8]) -> bool {
    !name.is_empty() && !name[0].is_ascii_digit() && name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// The variables `--export` sends, from the caller's environment `env`: `ALL` (but for those a
/// shell could not set, and `SLURM_*`/`HTC_*`: they describe the caller's job and task, not the
/// one the task runs in), or the names listed (each must be set).
fn exported(
    export: Option<&str>,
    env: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<Vec<(std::ffi::OsString, std::ffi::OsString)>, String> {
    let Some(export) = export.map(str::trim) else { return Ok(Vec::new()) };
    let env: Vec<_> = env.collect();
    if export.eq_ignore_ascii_case("ALL") {
        let sendable = |(n, _): &(std::ffi::OsString, std::ffi::OsString)| {
            let n = n.as_encoded_bytes();
            is_var_name(n) && !n.starts_with(b"SLURM_") && !n.starts_with(b"HTC_")
        };
        return Ok(env.into_iter().filter(sendable).collect());
    }
    let mut vars = Vec::new();
    for name in export.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !is_var_name(name.as_bytes()) {
            return Err(format!("--export {export}: {name:?} is not a variable name"));
        }
        let Some((_, value)) = env.iter().find(|(n, _)| n == name) else {
            return Err(format!("--export {export}: {name} is not set here"));
        };
        vars.push((name.into(), value.clone()));
    }
    Ok(vars)
}

/// A newline in a word, quoted: a task's command is one line, so a newline is the shell's
/// `$htc_nl`, which `NL_DEF` sets (POSIX: a command substitution keeps a newline that is not
/// its last character).
const NL: &[u8] = b"'\"$htc_nl\"'";
const NL_DEF: &[u8] = b"htc_nl=$(printf '\\n_'); htc_nl=${htc_nl%_}; ";

/// `s` as one word for `/bin/sh`: as it is when it needs no quoting, else in single quotes (a
/// newline in it as `NL`).
fn quote(s: &[u8]) -> Vec<u8> {
    let plain = |b: &u8| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(b);
    if !s.is_empty() && s.iter().all(plain) {
        return s.to_vec();
    }
    let mut q = vec![b'\''];
    for &b in s {
        if b == b'\'' {
            q.extend_from_slice(b"'\\''");
        } else if b == b'\n' {
            q.extend_from_slice(NL);
        } else {
            q.push(b);
        }
    }
    q.push(b'\'');
    q
}

/// Says why a request did not go through; the exit status for it.
fn said(e: &ClientError) -> i32 {
    eprintln!("htc: {e}");
    match e {
        ClientError::Refused(_) => 2,
        _ => 1,
    }
}

/// `htc task cancel RUN IDS`.
pub fn cancel(run: &str, ids: &[String]) -> anyhow::Result<i32> {
    let ids = id_list(ids)?;
    let run = leaders_run(run)?;
    let mut c = match Client::connect(&run) {
        Ok(c) => c,
        Err(e) => return Ok(said(&e)),
    };
    match c.cancel(ids) {
        Ok(done) => {
            let list = |ids: &[u64]| htc_core::idset::format(ids);
            let mut said = format!("htc: {} cancelled", done.cancelled.len());
            if !done.cancelled.is_empty() {
                said += &format!(" ({})", list(&done.cancelled));
            }
            if !done.ended.is_empty() {
                said += &format!("; {} had ended already, left as they were ({})", done.ended.len(), list(&done.ended));
            }
            eprintln!("{said}");
            if done.unknown.is_empty() {
                return Ok(0);
            }
            eprintln!("htc: no task {} in {}", list(&done.unknown), run.path.display());
            Ok(2)
        }
        Err(e) => Ok(said(&e)),
    }
}

/// `htc close RUN [--cancel]`.
pub fn close(run: &str, cancel: bool) -> anyhow::Result<i32> {
    let run = leaders_run(run)?;
    let mut c = match Client::connect(&run) {
        Ok(c) => c,
        Err(e) => return Ok(said(&e)),
    };
    match c.close(cancel) {
        Ok(()) => {
            let what = if cancel { "what it holds is cancelled" } else { "it ends once what it holds is done" };
            eprintln!("htc: {} closed: it takes no more tasks; {what}", run.path.display());
            Ok(0)
        }
        Err(e) => Ok(said(&e)),
    }
}

#[derive(Serialize)]
struct Row<'a> {
    id: u64,
    state: &'a str,
    exit: Option<i32>,
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    /// Why a task that waits is not running (`htc task explain`'s kind and words).
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<Why<'a>>,
}

#[derive(Serialize)]
struct Why<'a> {
    kind: &'a str,
    words: &'a str,
}

/// Waiting tasks past this many in one `--format json` answer go without their `why`: each
/// costs the leader a look at its queues.
const EXPLAINED: usize = 10_000;

/// `htc task status RUN IDS|--all`: a line each, as the run's leader knows them, or from the
/// run's ledger when no leader runs.
pub fn status(run: &str, ids: &[String], all: bool, format: &str) -> anyhow::Result<i32> {
    if !matches!(format, "tsv" | "json" | "word") {
        anyhow::bail!("--format {format}: tsv, json or word");
    }
    let asked = if all { None } else { Some(id_list(ids)?) };
    let dir = RunDir::find(Some(run))?;
    let (rows, total) = match statuses(&dir, asked.as_deref())? {
        Ok(found) => found,
        Err(e) => return Ok(said(&e)),
    };
    let out = std::io::stdout();
    let mut o = std::io::BufWriter::new(out.lock());
    let mut known = std::collections::HashSet::new();
    let whys = if format == "json" { waiting_whys(&dir, &rows)? } else { Default::default() };
    for r in &rows {
        known.insert(r.id);
        if format == "json" {
            let why = whys.get(&r.id).map(|w| Why { kind: &w.kind, words: &w.words });
            let row = Row { id: r.id, state: r.state, exit: r.exit, reason: &r.reason, name: r.name.as_deref(), why };
            writeln!(o, "{}", serde_json::to_string(&row)?)?;
        } else if format == "word" {
            writeln!(o, "{}", word(r.state))?;
        } else {
            let exit = r.exit.map_or("-".to_string(), |v| v.to_string());
            // A name, for a task given one, is a fifth column.
            let name = r.name.as_deref().map_or(String::new(), |n| format!("\t{n}"));
            writeln!(o, "{}\t{}\t{exit}\t{}{name}", r.id, r.state, r.reason)?;
        }
    }
    o.flush()?;
    if let Some(code) = damaged(&dir, &rows) {
        return Ok(code);
    }
    let unknown: Vec<u64> = asked.unwrap_or_default().into_iter().filter(|id| !known.contains(id)).collect();
    if !unknown.is_empty() {
        let of = total.map_or(String::new(), |t| format!(" (the run has {t})"));
        eprintln!("htc: no task {}{of}", unknown.iter().map(u64::to_string).collect::<Vec<_>>().join(", "));
        return Ok(2);
    }
    Ok(0)
}

/// Why each of the waiting tasks of `rows` waits (the first `EXPLAINED`), by id; none when
/// that cannot be asked.
fn waiting_whys(
    dir: &std::path::Path,
    rows: &[TaskStatus],
) -> anyhow::Result<std::collections::HashMap<u64, htc_engine::wire::proto::TaskWhy>> {
    let waiting: Vec<u64> =
        rows.iter().filter(|r| matches!(r.state, "waiting" | "blocked")).map(|r| r.id).take(EXPLAINED).collect();
    if waiting.is_empty() {
        return Ok(Default::default());
    }
    Ok(crate::explain_cmd::whys(dir, &waiting)?.map(|w| w.into_iter().map(|w| (w.id, w)).collect()).unwrap_or_default())
}

/// The exit status of a reader whose answer holds tasks the ledger cannot vouch for.
pub const DAMAGED_EXIT: i32 = 3;

/// Says which of `rows` the ledger cannot vouch for, if any: then the exit status for it.
fn damaged(dir: &std::path::Path, rows: &[TaskStatus]) -> Option<i32> {
    let ids: Vec<u64> = rows.iter().filter(|r| r.state == htc_core::record::DAMAGED).map(|r| r.id).collect();
    if ids.is_empty() {
        return None;
    }
    let list = htc_core::idset::format(&ids);
    eprintln!(
        "htc: {}: the ledger is damaged: it cannot vouch for task{} {list}; `htc verify {}` tells what it still vouches for",
        dir.display(),
        if ids.len() == 1 { "" } else { "s" },
        dir.display()
    );
    Some(DAMAGED_EXIT)
}

/// A state as the one word that tools calling a status command take (Snakemake's
/// cluster-generic executor, and the grid executors built like it): `success`, `failed`, or
/// `running` for a task that has not ended.
fn word(state: &str) -> &'static str {
    match state {
        "done" => "success",
        // What cannot be vouched for did not succeed.
        "failed" | "cancelled" | htc_core::record::DAMAGED => "failed",
        _ => "running",
    }
}

/// Tasks as the run's leader knows them, or as its ledger has them when no leader runs (then
/// with the run's task count).
type Found = (Vec<TaskStatus>, Option<u64>);

fn statuses(dir: &std::path::Path, ids: Option<&[u64]>) -> anyhow::Result<Result<Found, ClientError>> {
    // The ledger answers when the leader does not let this reader in soon (as when it is
    // busy or gone): as long as before, one handshake's time.
    let patience = htc_node::client::patience().min(htc_node::auth::HANDSHAKE_TIMEOUT);
    match Client::connect_within(&RunDir::new(dir), patience) {
        Ok(mut c) => match c.status(ids.map(<[u64]>::to_vec)) {
            Ok(rows) => Ok(Ok((rows, None))),
            // The leader ending (closed, its tasks done) between the connect and its answer:
            // what it committed is in the ledger.
            Err(ClientError::NoAnswer { .. }) | Err(ClientError::Refused(_)) => {
                Ok(Ok(from_ledger(dir.to_path_buf(), ids)?))
            }
            Err(e) => Ok(Err(e)),
        },
        Err(_) => Ok(Ok(from_ledger(dir.to_path_buf(), ids)?)),
    }
}

/// `htc task wait RUN IDS|--all [--any] [--timeout]`: until every task waited for (one, with
/// `--any`) has ended. 0 when all of them succeeded (the one, with `--any`); 1 when one failed
/// or was cancelled; 2 for an unknown task; 3 for one the ledger cannot vouch for (damaged);
/// 124 at the timeout.
pub fn wait(run: &str, ids: &[String], all: bool, any: bool, timeout: Option<Duration>) -> anyhow::Result<i32> {
    let mut asked = if all { None } else { Some(id_list(ids)?) };
    let dir = RunDir::find(Some(run))?;
    let start = std::time::Instant::now();
    let mut pause = Duration::from_millis(5);
    // Each call after the first asks only about the tasks not ended yet: a wait for a million
    // tasks reads each of them about once, not once per call.
    let (mut ended_n, mut ended_bad) = (0usize, false);
    loop {
        let (rows, _) = match statuses(&dir, asked.as_deref())? {
            Ok(found) => found,
            Err(e) => return Ok(said(&e)),
        };
        // Rows come for the ids asked that exist: one missing is a task the run does not have.
        if let Some(asked) = asked.as_ref().filter(|a| a.len() != rows.len()) {
            let found: std::collections::HashSet<u64> = rows.iter().map(|r| r.id).collect();
            if let Some(id) = asked.iter().find(|id| !found.contains(id)) {
                eprintln!("htc: no task {id}");
                return Ok(2);
            }
        }
        // A task whose record is damaged will never be seen to end.
        if let Some(code) = damaged(&dir, &rows) {
            return Ok(code);
        }
        let ended = |r: &&TaskStatus| matches!(r.state, "done" | "failed" | "cancelled");
        let bad = |r: &TaskStatus| r.state != "done";
        let finished: Vec<&TaskStatus> = rows.iter().filter(ended).collect();
        if any && !finished.is_empty() {
            return Ok(i32::from(bad(finished[0])));
        }
        ended_bad |= finished.iter().any(|r| bad(r));
        ended_n += finished.len();
        if !any && finished.len() == rows.len() {
            return Ok(i32::from(ended_bad));
        }
        if timeout.is_some_and(|t| start.elapsed() >= t) {
            let left = rows.len() - finished.len();
            eprintln!("htc: {left} of {} tasks not finished at the timeout", ended_n + left);
            return Ok(124);
        }
        asked = Some(rows.iter().filter(|r| !ended(r)).map(|r| r.id).collect());
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Tasks as the ledger has them (no leader runs), and the run's task count. A task the run has
/// whose record is damaged is a `damaged` row, never left out.
fn from_ledger(dir: std::path::PathBuf, ids: Option<&[u64]>) -> anyhow::Result<(Vec<TaskStatus>, Option<u64>)> {
    let run = RunDir::open_for_reading(dir)?;
    let ledger = crate::ledger::Ledger::open(&run.ledger(), true)?;
    let t = ledger.read()?;
    // A damaged meta page could name an older tree, whose pages may since have been reused.
    t.check_commit()?;
    let total = htc_store::vouch::total(&t)?;
    let found = match ids {
        Some(ids) => htc_store::vouch::tasks(&t, ids, total)?,
        None => htc_store::vouch::range(&t, 1..total + 1, total)?,
    };
    let mut needs = std::collections::HashMap::new();
    t.for_each_needs(|id, n| {
        needs.insert(id, n);
    })?;
    let state_of = |id: u64| t.get(id).ok().flatten().map(|r| r.state());
    let named = t.has_names()?;
    let mut rows = Vec::with_capacity(found.len());
    for (id, f) in found {
        let r = match f {
            Vouched::Record(r) => r,
            Vouched::Damaged(why) => {
                rows.push(TaskStatus::damaged(id, why));
                continue;
            }
            Vouched::Unknown => continue,
        };
        let blocked = r.state() == State::Pending
            && needs.get(&id).is_some_and(|n| {
                n.each().any(|(d, k)| match (k, state_of(d)) {
                    (Kind::After, s) => s != Some(State::Done),
                    (Kind::AfterAny, s) => !s.is_some_and(State::is_final),
                })
            });
        let mut row = TaskStatus::of(id, &r, r.state(), blocked);
        if named {
            row.name = t.added_name(id, &r)?.map(|n| String::from_utf8_lossy(&n).into_owned());
        }
        rows.push(row);
    }
    Ok((rows, Some(total)))
}

#[cfg(test)]
mod tests {
    use super::{exported, quote, word, NL_DEF};
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn a_state_is_one_of_the_three_words_status_commands_print() {
        let words: Vec<_> =
            ["waiting", "blocked", "running", "done", "failed", "cancelled"].into_iter().map(word).collect();
        assert_eq!(words, ["running", "running", "running", "success", "failed", "failed"]);
    }

    fn env() -> impl Iterator<Item = (OsString, OsString)> {
        [("PATH", "/opt/bin:/bin"), ("SLURM_JOB_ID", "7"), ("HTC_TASK_ID", "3"), ("F", "a\nb"), ("X", "1 2")]
            .into_iter()
            .map(|(n, v)| (n.into(), v.into()))
    }

    fn names(v: Vec<(OsString, OsString)>) -> Vec<String> {
        v.into_iter().map(|(n, _)| n.into_string().unwrap()).collect()
    }

    #[test]
    fn export_sends_the_caller_s_variables_as_asked() {
        assert!(exported(None, env()).unwrap().is_empty(), "by default the run's environment");
        assert_eq!(names(exported(Some("ALL"), env()).unwrap()), ["PATH", "F", "X"], "not the job's, nor the task's");
        assert_eq!(exported(Some("X, PATH"), env()).unwrap()[0], ("X".into(), "1 2".into()));
        assert_eq!(exported(Some("NOPE"), env()).unwrap_err(), "--export NOPE: NOPE is not set here");
        assert_eq!(exported(Some("F"), env()).unwrap()[0], ("F".into(), "a\nb".into()));
        assert!(exported(Some("1X"), env()).unwrap_err().contains("is not a variable name"));
    }

    /// A word with newlines (anywhere: first, last, twice) is quoted on one line, and the shell
    /// reads it back byte for byte.
    #[test]
    fn words_holding_newlines_are_one_line_the_shell_reads_back() {
        let words: [&[u8]; 5] = [b"a\nb", b"\nx\n\n", b"it's\n", b"\n", b"plain"];
        let mut line = NL_DEF.to_vec();
        line.extend_from_slice(b"printf '[%s]'");
        for w in words {
            line.push(b' ');
            line.extend_from_slice(&quote(w));
        }
        assert!(!line.contains(&b'\n'));
        let o = std::process::Command::new("/bin/sh").arg("-c").arg(OsString::from_vec(line)).output().unwrap();
        let want: Vec<u8> = words.iter().flat_map(|w| [b"[".as_slice(), w, b"]"].concat()).collect();
        assert_eq!(String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&want));
    }
}
