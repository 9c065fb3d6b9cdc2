//! A node agent (`htc-agent work`): connects to the leader, proves it belongs to the job, asks
//! for tasks, runs them through the executor and reports starts and results in batches.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc::unbounded_channel;

use crate::executor::{self, Command, ExecConfig, ExecEvent, TaskToRun};
use crate::frame::{self, read_frame, FrameError};
use crate::ledger::Outcome;
use crate::output::OutputMode;
use crate::proto::{self, frame::Body};
use crate::rundir::RunDir;
use crate::PROTOCOL_VERSION;

pub struct AgentConfig {
    pub leader: SocketAddr,
    pub run: RunDir,
    pub agent_id: u32,
    pub slots: usize,
    pub cpus: Vec<usize>,
    pub mem_mb: u64,
    pub output: OutputMode,
    pub kill_grace: Duration,
    /// How often buffered results go up when the buffer is not full.
    pub flush_every: Duration,
}

/// Results buffered before a report goes out regardless of the timer.
const REPORT_BATCH: usize = 512;

pub fn run(cfg: AgentConfig) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run_async(cfg))
}

async fn connect(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    let mut delay = Duration::from_millis(20);
    let mut last = None;
    for _ in 0..40 {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
    Err(last.unwrap()).with_context(|| format!("connecting to the leader at {addr}"))
}

async fn run_async(cfg: AgentConfig) -> anyhow::Result<()> {
    let secret = cfg.run.read_secret().context("reading the job secret")?;
    let mut stream = connect(cfg.leader).await?;
    stream.set_nodelay(true)?;
    let hostname = hostname();
    frame::write_frame(
        &mut stream,
        Body::Hello(proto::Hello {
            secret,
            agent_id: cfg.agent_id,
            cores: cfg.slots as u32,
            mem_mb: cfg.mem_mb,
            hostname: hostname.clone(),
            pid: std::process::id(),
            protocol: PROTOCOL_VERSION,
        }),
    )
    .await?;
    let mut buf = Vec::new();
    let job_id = match tokio::time::timeout(Duration::from_secs(30), read_frame(&mut stream, &mut buf)).await {
        Err(_) => bail!("no answer from the leader within 30 s"),
        Ok(Ok(Body::Welcome(w))) => w.job_id,
        Ok(Ok(Body::Reject(r))) => bail!("leader refused this agent: {}", r.reason),
        Ok(Ok(_)) => bail!("unexpected first frame from the leader"),
        Ok(Err(e)) => bail!("leader closed the connection during the handshake: {e}"),
    };
    tracing::info!(job = %job_id, agent = cfg.agent_id, slots = cfg.slots, %hostname, "joined");

    let (ev_tx, mut ev_rx) = unbounded_channel::<Vec<ExecEvent>>();
    let (exec, exec_thread) = executor::start(
        ExecConfig {
            job_id: job_id.clone(),
            agent: cfg.agent_id,
            cpus: cfg.cpus.clone(),
            slots: cfg.slots,
            mem_mb: cfg.mem_mb,
            out_dir: match cfg.output {
                OutputMode::PerTask => cfg.run.out().join("tasks"),
                _ => cfg.run.agent_out(cfg.agent_id),
            },
            output: cfg.output,
            env: std::env::vars_os().collect(),
            kill_grace: cfg.kill_grace,
        },
        move |batch| {
            let _ = ev_tx.send(batch);
        },
    )?;

    let (mut rd, mut wr) = stream.into_split();
    let (fr_tx, mut fr_rx) = unbounded_channel::<Result<Body, FrameError>>();
    // Reading a frame is not cancel-safe, so it lives in its own task rather than in select!.
    tokio::spawn(async move {
        let mut buf = Vec::new();
        loop {
            let r = read_frame(&mut rd, &mut buf).await;
            let end = r.is_err();
            if fr_tx.send(r).is_err() || end {
                break;
            }
        }
    });

    // Enough queued work to keep every slot busy across one report round trip.
    let target = (cfg.slots * 8).max(32) as u64;
    let mut outstanding: u64 = 0; // received and not yet finished
    let mut asked: u64 = 0; // requested and not yet received
    let mut seq: u64 = 0;
    let mut acked: u64 = 0;
    let mut started: Vec<proto::TaskStarted> = Vec::new();
    let mut results: Vec<proto::TaskResult> = Vec::new();
    let mut shutting_down = false;
    let mut exec_done = false;
    let mut leader_gone: Option<String> = None;
    let mut leader_closed = false;
    let mut tick = tokio::time::interval(cfg.flush_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();

    loop {
        let mut flush_now = false;
        tokio::select! {
            f = fr_rx.recv(), if leader_gone.is_none() && !leader_closed => match f {
                Some(Ok(Body::Dispatch(d))) => {
                    let n = d.tasks.len() as u64;
                    outstanding += n;
                    asked = asked.saturating_sub(n);
                    exec.send(Command::Run(d.tasks.into_iter().map(|t| TaskToRun {
                        id: t.id, attempt: t.attempt, command: t.command, shell: t.shell,
                        cores: t.cores, mem_mb: t.mem_mb, timeout_ms: t.timeout_ms,
                    }).collect()));
                }
                Some(Ok(Body::Ack(a))) => acked = acked.max(a.seq),
                Some(Ok(Body::Shutdown(s))) => {
                    tracing::info!(job = %job_id, agent = cfg.agent_id, abort = s.abort, reason = %s.reason, "shutdown");
                    shutting_down = true;
                    exec.send(if s.abort { Command::Abort } else { Command::Finish });
                }
                Some(Ok(_)) => tracing::warn!(agent = cfg.agent_id, "unexpected frame from the leader ignored"),
                // After Shutdown the leader may close first; that is the normal end.
                Some(Err(_)) | None if shutting_down => leader_closed = true,
                Some(Err(e)) => {
                    // Without a leader nobody records results: stop the tasks rather than let them
                    // run unaccounted. `htc run --resume` re-runs them.
                    leader_gone = Some(e.to_string());
                    exec.send(Command::Abort);
                }
                None => {
                    leader_gone = Some("connection closed".into());
                    exec.send(Command::Abort);
                }
            },
            batch = ev_rx.recv(), if !exec_done => match batch {
                Some(batch) => {
                    for e in batch {
                        match e {
                            ExecEvent::Started { id, attempt, start_us } => started.push(proto::TaskStarted { id, attempt, start_us }),
                            ExecEvent::Finished(f) => {
                                outstanding = outstanding.saturating_sub(1);
                                results.push(proto::TaskResult {
                                    id: f.id,
                                    attempt: f.attempt,
                                    outcome: to_proto(f.outcome) as i32,
                                    value: f.value,
                                    start_us: f.start_us,
                                    end_us: f.end_us,
                                });
                            }
                        }
                    }
                    flush_now = results.len() >= REPORT_BATCH || outstanding < target / 4;
                }
                None => exec_done = true,
            },
            _ = tick.tick() => flush_now = true,
        }
        if exec_done && (leader_gone.is_some() || shutting_down) {
            if leader_gone.is_none() && !leader_closed {
                flush(&mut out, &mut started, &mut results, &mut seq, 0, true);
                let _ = wr.write_all(&out).await;
                let _ = wr.shutdown().await;
            }
            break;
        }
        if flush_now && leader_gone.is_none() && !leader_closed {
            let want = if shutting_down { 0 } else { target.saturating_sub(outstanding + asked) };
            // Small requests cost a frame each; wait until at least a quarter of the target is due.
            let want = if want >= target / 4 || outstanding + asked == 0 { want } else { 0 };
            if want > 0 || !results.is_empty() || !started.is_empty() {
                asked += want;
                flush(&mut out, &mut started, &mut results, &mut seq, want as u32, outstanding == 0 && asked == 0);
                if wr.write_all(&out).await.is_err() {
                    leader_gone = Some("write failed".into());
                    exec.send(Command::Abort);
                }
                out.clear();
            }
        }
    }
    let _ = exec_thread.join();
    let _ = acked;
    if let Some(why) = leader_gone {
        bail!("lost the leader ({why}); running tasks were stopped");
    }
    Ok(())
}

fn flush(
    out: &mut Vec<u8>,
    started: &mut Vec<proto::TaskStarted>,
    results: &mut Vec<proto::TaskResult>,
    seq: &mut u64,
    want: u32,
    drained: bool,
) {
    if !results.is_empty() {
        *seq += 1;
    }
    // A start whose result travels in the same report needs no separate ledger write.
    if !results.is_empty() && !started.is_empty() {
        let done: std::collections::HashSet<u64> = results.iter().map(|r| r.id).collect();
        started.retain(|s| !done.contains(&s.id));
    }
    frame::encode_into(
        Body::Report(proto::Report {
            seq: *seq,
            started: std::mem::take(started),
            results: std::mem::take(results),
            want,
            drained,
        }),
        out,
    );
}

fn to_proto(o: Outcome) -> proto::Outcome {
    match o {
        Outcome::Exited => proto::Outcome::Exited,
        Outcome::Signaled => proto::Outcome::Signaled,
        Outcome::TimedOut => proto::Outcome::TimedOut,
        Outcome::SpawnFailed => proto::Outcome::SpawnFailed,
        _ => proto::Outcome::Unspecified,
    }
}

pub fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: gethostname writes at most b.len() bytes.
    let rc = unsafe { libc::gethostname(b.as_mut_ptr() as *mut libc::c_char, b.len()) };
    if rc != 0 {
        return "?".into();
    }
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..n]).into_owned()
}
