//! A node agent (`htc-agent work`): connects to its parent (the leader, or a relay agent above it
//! in the tree), proves it belongs to the job, asks for tasks, runs them through the executor and
//! reports starts and results in batches. An agent with children also relays: frames from below
//! go up unchanged, frames from above addressed to another agent go down the right branch.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use htc_core::tree;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::auth;
use crate::executor::{self, Command, ExecConfig, ExecEvent, TaskToRun};
use crate::frame::{self, read_frame, FrameError};
use crate::ledger::Outcome;
use crate::output::OutputMode;
use crate::proto::{self, frame::Body};
use crate::rundir::RunDir;
use crate::simexec::{self, ExecKind};
use crate::PROTOCOL_VERSION;

pub struct AgentConfig {
    /// Where to connect: the leader, or the parent agent in the tree.
    pub parent: SocketAddr,
    pub run: RunDir,
    pub agent_id: u32,
    pub slots: usize,
    pub cpus: Vec<usize>,
    pub mem_mb: u64,
    pub output: OutputMode,
    pub kill_grace: Duration,
    /// How often buffered results go up when the buffer is not full.
    pub flush_every: Duration,
    /// Set when this agent has children to serve: (fan-out, number of agents, bound listener).
    pub relay: Option<(u32, u32, std::net::TcpListener)>,
    /// Real processes, or a simulation that starts none.
    pub exec: ExecKind,
}

/// Results buffered before a report goes out regardless of the timer.
const REPORT_BATCH: usize = 512;
/// How long a finished relay waits for its children to close before it exits anyway.
const CHILDREN_GRACE: Duration = Duration::from_secs(30);

pub fn run(cfg: AgentConfig) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run_async(cfg))
}

/// Several agents in one process (simulations: thousands of agents on a few cores). Each keeps
/// its own connection, tree position and executor; the first error is returned after all end.
pub fn run_many(cfgs: Vec<AgentConfig>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for cfg in cfgs {
            let id = cfg.agent_id;
            set.spawn(async move { run_async(cfg).await.with_context(|| format!("agent {id}")) });
        }
        let mut first = Ok(());
        while let Some(r) = set.join_next().await {
            let r = r.map_err(anyhow::Error::from).and_then(|r| r);
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
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
    Err(last.unwrap()).with_context(|| format!("connecting to {addr}"))
}

fn encoded(body: Body) -> Vec<u8> {
    let mut b = Vec::new();
    frame::encode_into(body, &mut b);
    b
}

/// What a child connection tells the main loop.
enum Child {
    /// A direct child connected: its position and the sender for frames down to it.
    Open { pos: u64, tx: UnboundedSender<Vec<u8>> },
    /// A frame from below to pass up.
    Up(Vec<u8>),
    /// A direct child's connection ended; these agents (it and those below it) are gone.
    Closed { pos: u64, agents: Vec<u32>, why: String },
}

async fn run_async(cfg: AgentConfig) -> anyhow::Result<()> {
    let secret = cfg.run.read_secret().context("reading the job secret")?;
    let mut stream = connect(cfg.parent).await?;
    frame::tune(&stream)?;
    auth::connect(&mut stream, &secret).await.with_context(|| format!("authenticating with {}", cfg.parent))?;
    let hostname = hostname();
    let hello = proto::Hello {
        agent_id: cfg.agent_id,
        cores: cfg.slots as u32,
        mem_mb: cfg.mem_mb,
        hostname: hostname.clone(),
        pid: std::process::id(),
        protocol: PROTOCOL_VERSION,
    };
    frame::write_frame(&mut stream, Body::Hello(hello)).await?;
    let mut buf = Vec::new();
    let job_id = match tokio::time::timeout(Duration::from_secs(30), read_frame(&mut stream, &mut buf)).await {
        Err(_) => bail!("no answer from {} within 30 s", cfg.parent),
        Ok(Ok(Body::Welcome(w))) => w.job_id,
        Ok(Ok(Body::Reject(r))) => bail!("refused by {}: {}", cfg.parent, r.reason),
        Ok(Ok(_)) => bail!("unexpected first frame from {}", cfg.parent),
        Ok(Err(e)) => bail!("{} closed the connection during the handshake: {e}", cfg.parent),
    };
    tracing::info!(job = %job_id, agent = cfg.agent_id, slots = cfg.slots, %hostname, "joined");

    let me = tree::position(cfg.agent_id);
    let (child_tx, mut child_rx) = unbounded_channel::<Child>();
    let fanout = cfg.relay.as_ref().map(|r| r.0).unwrap_or(1);
    if let Some((k, n, listener)) = cfg.relay {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let secret = secret.clone();
        let door = auth::Door::new(&job_id);
        let tx = child_tx.clone();
        tokio::spawn(async move {
            loop {
                let Ok((s, peer)) = listener.accept().await else { continue };
                let Some(permit) = door.enter(peer) else { continue };
                let (secret, door, tx) = (secret.clone(), door.clone(), tx.clone());
                tokio::spawn(async move {
                    if let Err(e) = child_connection(s, permit, me, k, n, &secret, tx).await {
                        door.refused(peer, &e);
                    }
                });
            }
        });
    }
    drop(child_tx);

    let (ev_tx, mut ev_rx) = unbounded_channel::<Vec<ExecEvent>>();
    let sink = move |batch| {
        let _ = ev_tx.send(batch);
    };
    let (exec, exec_thread) = if cfg.exec != ExecKind::Real {
        simexec::start(cfg.exec, cfg.slots, sink)?
    } else {
        executor::start(
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
            sink,
        )?
    };

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
    let mut started: Vec<proto::TaskStarted> = Vec::new();
    let mut results: Vec<proto::TaskResult> = Vec::new();
    let mut shutting_down = false;
    let mut exec_done = false;
    let mut leader_gone: Option<String> = None;
    let mut leader_closed = false;
    let mut children: HashMap<u64, UnboundedSender<Vec<u8>>> = HashMap::new();
    let mut children_open = true; // until the child channel closes (no relay: at once)
    let mut exec_done_at: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(cfg.flush_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    let (mut sigterm, mut sigint) = (
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?,
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?,
    );

    loop {
        let mut flush_now = false;
        tokio::select! {
            // Killed from outside (scancel, kill): stop the tasks, which live in their own
            // process groups, rather than leave them running without an agent.
            _ = sigterm.recv(), if leader_gone.is_none() => {
                leader_gone = Some("terminated by a signal".into());
                exec.send(Command::Abort);
            }
            _ = sigint.recv(), if leader_gone.is_none() => {
                leader_gone = Some("interrupted".into());
                exec.send(Command::Abort);
            }
            f = fr_rx.recv(), if leader_gone.is_none() && !leader_closed => match f {
                Some(Ok(body)) => {
                    let dest = destination(&body);
                    if dest.is_some_and(|d| d != cfg.agent_id) {
                        // Not for us: down the branch that leads to it.
                        let d = dest.unwrap();
                        match tree::next_hop(me, tree::position(d), fanout).and_then(|c| children.get(&c)) {
                            Some(tx) => { let _ = tx.send(encoded(body)); }
                            None => tracing::debug!(agent = d, "frame for an agent not below this one dropped"),
                        }
                    } else {
                        match body {
                            Body::Dispatch(d) => {
                                let n = d.tasks.len() as u64;
                                outstanding += n;
                                asked = asked.saturating_sub(n);
                                exec.send(Command::Run(d.tasks.into_iter().map(|t| TaskToRun {
                                    id: t.id, attempt: t.attempt, command: t.command, shell: t.shell,
                                    cores: t.cores, mem_mb: t.mem_mb, timeout_ms: t.timeout_ms, runtime_ms: t.runtime_ms,
                                }).collect()));
                            }
                            Body::Ack(_) => {}
                            Body::Shutdown(s) => {
                                tracing::info!(job = %job_id, agent = cfg.agent_id, abort = s.abort, reason = %s.reason, "shutdown");
                                shutting_down = true;
                                exec.send(if s.abort { Command::Abort } else { Command::Finish });
                            }
                            _ => tracing::warn!(agent = cfg.agent_id, "unexpected frame from above ignored"),
                        }
                    }
                }
                // After Shutdown the leader may close first; that is the normal end.
                Some(Err(_)) | None if shutting_down => leader_closed = true,
                Some(Err(e)) => {
                    // Without a leader nobody records results: stop the tasks rather than let them
                    // run unaccounted. The resumed run re-runs them.
                    leader_gone = Some(e.to_string());
                    exec.send(Command::Abort);
                }
                None => {
                    leader_gone = Some("connection closed".into());
                    exec.send(Command::Abort);
                }
            },
            c = child_rx.recv(), if children_open => match c {
                Some(Child::Open { pos, tx }) => { children.insert(pos, tx); }
                Some(Child::Up(bytes)) => {
                    if leader_gone.is_none() && !leader_closed && wr.write_all(&bytes).await.is_err() {
                        leader_gone = Some("write failed".into());
                        exec.send(Command::Abort);
                    }
                }
                Some(Child::Closed { pos, agents, why }) => {
                    children.remove(&pos);
                    if !shutting_down && leader_gone.is_none() && !leader_closed {
                        for agent in agents {
                            out.extend(encoded(Body::Lost(proto::Lost { agent, reason: why.clone() })));
                        }
                        flush_now = true;
                    }
                }
                None => children_open = false,
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
                None => {
                    exec_done = true;
                    exec_done_at = Some(tokio::time::Instant::now());
                }
            },
            _ = tick.tick() => flush_now = true,
        }
        let up = leader_gone.is_none() && !leader_closed;
        if exec_done && (!up || shutting_down) {
            // A relay stays until its children are done: their last reports pass through it.
            let waited = exec_done_at.map(|t| t.elapsed()).unwrap_or_default();
            if up && !children.is_empty() && waited < CHILDREN_GRACE {
                if flush_now && (!results.is_empty() || !started.is_empty()) {
                    flush(&mut out, &mut started, &mut results, &mut seq, Flush::last(cfg.agent_id));
                }
                if !out.is_empty() {
                    let _ = wr.write_all(&out).await;
                    out.clear();
                }
                continue;
            }
            if up {
                flush(&mut out, &mut started, &mut results, &mut seq, Flush::last(cfg.agent_id));
                let _ = wr.write_all(&out).await;
                let _ = wr.shutdown().await;
            }
            break;
        }
        if flush_now && up {
            let want = if shutting_down { 0 } else { target.saturating_sub(outstanding + asked) };
            // Small requests cost a frame each; wait until at least a quarter of the target is due.
            let want = if want >= target / 4 || outstanding + asked == 0 { want } else { 0 };
            if want > 0 || !results.is_empty() || !started.is_empty() {
                asked += want;
                let idle = cfg.slots.saturating_sub(outstanding as usize) as u32;
                let report =
                    Flush { want: want as u32, drained: outstanding == 0 && asked == 0, idle, agent: cfg.agent_id };
                flush(&mut out, &mut started, &mut results, &mut seq, report);
            }
            if !out.is_empty() {
                if wr.write_all(&out).await.is_err() {
                    leader_gone = Some("write failed".into());
                    exec.send(Command::Abort);
                }
                out.clear();
            }
        }
    }
    let _ = exec_thread.join();
    if let Some(why) = leader_gone {
        bail!("lost the connection to {} ({why}); running tasks were stopped", cfg.parent);
    }
    Ok(())
}

/// The agent a downward frame is for; `None` for frames that concern the connection itself.
fn destination(b: &Body) -> Option<u32> {
    match b {
        Body::Dispatch(d) => Some(d.agent),
        Body::Ack(a) => Some(a.agent),
        Body::Shutdown(s) => Some(s.agent),
        Body::Welcome(w) => Some(w.agent_id),
        Body::Reject(r) => Some(r.agent_id),
        _ => None,
    }
}

/// Serves one direct child: authenticates it and checks its Hello here (so a stranger never
/// reaches the leader), then passes its frames, and those of the agents below it, up unchanged.
async fn child_connection(
    mut s: TcpStream,
    permit: tokio::sync::OwnedSemaphorePermit,
    me: u64,
    k: u32,
    n: u32,
    secret: &[u8],
    up: UnboundedSender<Child>,
) -> Result<(), String> {
    frame::tune(&s).map_err(|e| e.to_string())?;
    let hello = auth::accept_hello(&mut s, secret).await.map_err(|e| e.to_string())?;
    drop(permit);
    let pos = tree::position(hello.agent_id);
    if hello.agent_id >= n || pos == 0 || tree::parent(pos, k) != me {
        let why = format!("agent {} is not a child of this agent", hello.agent_id);
        let _ =
            frame::write_frame(&mut s, Body::Reject(proto::Reject { reason: why.clone(), agent_id: hello.agent_id }))
                .await;
        return Err(why);
    }
    let mut buf = Vec::new();
    let (mut rd, wr) = s.into_split();
    let tx = frame::spawn_writer(wr);
    let _ = up.send(Child::Open { pos, tx });
    let mut agents = vec![hello.agent_id];
    let _ = up.send(Child::Up(encoded(Body::Hello(hello))));
    let why = loop {
        match read_frame(&mut rd, &mut buf).await {
            Ok(body) => {
                if let Body::Hello(h) = &body {
                    agents.push(h.agent_id);
                }
                if let Body::Lost(l) = &body {
                    agents.retain(|a| *a != l.agent);
                }
                let _ = up.send(Child::Up(encoded(body)));
            }
            Err(FrameError::Closed) => break "connection to its relay closed".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    let _ =
        up.send(Child::Closed { pos, agents: agents.into_iter().collect::<HashSet<_>>().into_iter().collect(), why });
    Ok(())
}

/// What a report says besides the starts and results it carries.
struct Flush {
    want: u32,
    drained: bool,
    idle: u32,
    agent: u32,
}

impl Flush {
    /// The report of an agent that is done.
    fn last(agent: u32) -> Flush {
        Flush { want: 0, drained: true, idle: 0, agent }
    }
}

fn flush(
    out: &mut Vec<u8>,
    started: &mut Vec<proto::TaskStarted>,
    results: &mut Vec<proto::TaskResult>,
    seq: &mut u64,
    f: Flush,
) {
    if !results.is_empty() {
        *seq += 1;
    }
    // A start whose result travels in the same report needs no separate ledger write.
    if !results.is_empty() && !started.is_empty() {
        let done: HashSet<u64> = results.iter().map(|r| r.id).collect();
        started.retain(|s| !done.contains(&s.id));
    }
    frame::encode_into(
        Body::Report(proto::Report {
            seq: *seq,
            started: std::mem::take(started),
            results: std::mem::take(results),
            want: f.want,
            drained: f.drained,
            agent: f.agent,
            idle: f.idle,
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
