//! The agent's connections upward: joining its parent (proof of membership, then Hello), the
//! task that reads the parent's frames, and coming back — around a lost relay to the leader
//! (`rejoin`), as a fresh member after being given up (`revive_fresh`), or to the run's new
//! leader after a hand-over (`await_leader`). Each reconnect runs in a task of its own and
//! hands the agent's loop a `Reconnected`.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedSender;

use super::config::AgentConfig;
use crate::auth;
use crate::frame::{self, read_frame, FrameError};
use htc_engine::msg::Down;
use htc_engine::wire::proto::{self, frame::Body};
use htc_engine::wire::{self, PROTOCOL_VERSION};

pub(super) async fn connect(addr: SocketAddr) -> anyhow::Result<TcpStream> {
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

/// A new connection to the leader, and where that leader listens.
pub(super) type Reconnected = Result<(TcpStream, SocketAddr), String>;

/// Feeds what the parent says to the agent's loop; reading a frame is not cancel-safe, so it
/// lives in its own task rather than in select!. A frame that never goes down is dropped here.
pub(super) fn read_frames(
    mut rd: tokio::net::tcp::OwnedReadHalf,
    gen: u32,
    tx: UnboundedSender<(u32, Result<Down, FrameError>)>,
) {
    tokio::spawn(async move {
        let mut buf = Vec::new();
        loop {
            let r = match read_frame(&mut rd, &mut buf).await.map(wire::down::down) {
                Ok(Some(down)) => Ok(down),
                Ok(None) => {
                    tracing::warn!("unexpected frame from above ignored");
                    continue;
                }
                Err(e) => Err(e),
            };
            let end = r.is_err();
            if tx.send((gen, r)).is_err() || end {
                break;
            }
        }
    });
}

/// Reconnects to the leader around a lost relay, retrying (the leader may not have noticed the
/// loss yet, and then still counts this agent as connected) until the lease is over; the
/// machine fences the agent then anyway.
pub(super) fn rejoin(cfg: &AgentConfig, secret: &[u8], lease_us: u64, tx: UnboundedSender<Reconnected>) {
    let below: Vec<u32> = (0..cfg.tree.len()).filter(|&a| cfg.tree.next_hop(Some(cfg.agent_id), a).is_some()).collect();
    let (me, leader, secret) = (JoinAs::of(cfg), cfg.leader, secret.to_vec());
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_micros(lease_us);
        // The leader notices the relay's loss at about the same moment; until it has, it still
        // counts this agent as connected and refuses it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        while tokio::time::Instant::now() < deadline {
            match tokio::time::timeout_at(deadline, join(&me, leader, &secret, Joining::Rejoin(below.clone()))).await {
                Ok(Ok((_, stream))) => {
                    let _ = tx.send(Ok((stream, leader)));
                    return;
                }
                Ok(Err(e)) => tracing::debug!(agent = me.agent, error = %format!("{e:#}"), "rejoin attempt failed"),
                Err(_) => break,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::warn!(agent = me.agent, "could not rejoin the leader within the lease");
    });
}

/// How long an agent given up keeps trying to come back: the leader may be hung for a while
/// (and the agent's tasks are stopped already, so waiting costs nothing but the node).
const REVIVE_FOR: Duration = Duration::from_secs(60);

/// A leader whose port refuses connections this long is gone (a stopped one still accepts).
const REFUSED_FOR: Duration = Duration::from_secs(2);

/// Comes back to the leader as a fresh member after being given up, retrying (until the leader
/// has seen the old connection close it refuses the id) for `REVIVE_FOR`, or until the leader's
/// port has refused connections for `REFUSED_FOR`: then the leader is gone, and waiting would
/// only leave the agent behind it.
pub(super) fn revive_fresh(cfg: &AgentConfig, secret: &[u8], tx: UnboundedSender<Reconnected>) {
    let (me, leader, secret) = (JoinAs::of(cfg), cfg.leader, secret.to_vec());
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + REVIVE_FOR;
        let mut last = String::from("no attempt finished");
        let mut refused_since = None;
        while tokio::time::Instant::now() < deadline {
            match tokio::time::timeout_at(deadline, join(&me, leader, &secret, Joining::Fresh)).await {
                Ok(Ok((_, stream))) => {
                    let _ = tx.send(Ok((stream, leader)));
                    return;
                }
                Ok(Err(e)) => {
                    let refused = e.chain().any(|c| {
                        c.downcast_ref::<std::io::Error>()
                            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
                    });
                    let since = *refused_since.get_or_insert_with(tokio::time::Instant::now);
                    if !refused {
                        refused_since = None;
                    } else if since.elapsed() >= REFUSED_FOR {
                        let _ = tx.send(Err(format!("the leader is gone ({e:#})")));
                        return;
                    }
                    last = format!("{e:#}");
                }
                Err(_) => break,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let _ = tx.send(Err(format!("for {} s; the last attempt: {last}", REVIVE_FOR.as_secs())));
    });
}

/// How often an agent whose leader is gone looks for the run's new one.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The leader went with its job: waits up to `wait` for the run's new leader (a joined job that
/// took the run over publishes its address in the run directory) and comes to it with the tasks
/// it holds (`Hello.handover`).
pub(super) fn await_leader(cfg: &AgentConfig, secret: &[u8], wait: Duration, tx: UnboundedSender<Reconnected>) {
    let (me, old, run, secret) = (JoinAs::of(cfg), cfg.leader, cfg.run.clone(), secret.to_vec());
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + wait;
        let mut last = String::from("no new leader published its address");
        while tokio::time::Instant::now() < deadline {
            match run.leader_at() {
                Ok(Some(at)) if at.addr != old => {
                    match tokio::time::timeout_at(deadline, join(&me, at.addr, &secret, Joining::Handover)).await {
                        Ok(Ok((_, stream))) => {
                            tracing::info!(agent = me.agent, leader = %at.addr, job = %at.job, "found the run's new leader");
                            let _ = tx.send(Ok((stream, at.addr)));
                            return;
                        }
                        Ok(Err(e)) => last = format!("{e:#}"),
                        Err(_) => break,
                    }
                }
                Ok(_) => {}
                Err(e) => last = format!("reading its address: {e}"),
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
        let _ = tx.send(Err(format!("none within {} s ({last})", wait.as_secs())));
    });
}

/// Which Hello.
pub(super) enum Joining {
    First,
    /// Around a lost relay, with the agents below.
    Rejoin(Vec<u32>),
    /// After being given up, empty.
    Fresh,
    /// To the run's new leader after its old one went, with the tasks held.
    Handover,
}

/// Who says Hello.
#[derive(Clone)]
pub(super) struct JoinAs {
    agent: u32,
    slots: usize,
    mem_mb: u64,
    gpus: u32,
}

impl JoinAs {
    pub(super) fn of(cfg: &AgentConfig) -> JoinAs {
        JoinAs { agent: cfg.agent_id, slots: cfg.slots, mem_mb: cfg.mem_mb, gpus: cfg.gpus.len() as u32 }
    }
}

/// Connects to `to` (the parent, or the leader for a rejoin), proves membership of the job and
/// says Hello; returns the job id it welcomed us with and the connection.
pub(super) async fn join(
    me: &JoinAs,
    to: SocketAddr,
    secret: &[u8],
    how: Joining,
) -> anyhow::Result<(String, TcpStream)> {
    let mut stream = match how {
        // The caller retries, and wants to see each refusal.
        Joining::Fresh => TcpStream::connect(to).await.with_context(|| format!("connecting to {to}"))?,
        _ => connect(to).await?,
    };
    frame::tune(&stream)?;
    auth::connect(&mut stream, secret).await.with_context(|| format!("authenticating with {to}"))?;
    // Under Slurm the node's name as Slurm knows it: what squeue shows, and what the leader
    // names when it gives the node back (`scontrol update … NodeList=`).
    let hostname = std::env::var("SLURMD_NODENAME").ok().filter(|n| !n.is_empty()).unwrap_or_else(htc_host::hostname);
    let hello = proto::Hello {
        agent_id: me.agent,
        cores: me.slots as u32,
        mem_mb: me.mem_mb,
        gpus: me.gpus,
        hostname: hostname.clone(),
        pid: std::process::id(),
        protocol: PROTOCOL_VERSION,
        rejoin: matches!(how, Joining::Rejoin(_)),
        fresh: matches!(how, Joining::Fresh),
        handover: matches!(how, Joining::Handover),
        below: match how {
            Joining::Rejoin(below) => below,
            _ => Vec::new(),
        },
    };
    frame::write_frame(&mut stream, Body::Hello(hello)).await?;
    let mut buf = Vec::new();
    let job_id = match tokio::time::timeout(Duration::from_secs(30), read_frame(&mut stream, &mut buf)).await {
        Err(_) => bail!("no answer from {} within 30 s", to),
        Ok(Ok(Body::Welcome(w))) => w.job_id,
        Ok(Ok(Body::Reject(r))) => bail!("refused by {}: {}", to, r.reason),
        Ok(Ok(_)) => bail!("unexpected first frame from {}", to),
        Ok(Err(e)) => bail!("{} closed the connection during the handshake: {e}", to),
    };
    tracing::info!(job = %job_id, agent = me.agent, slots = me.slots, %hostname, "joined");
    Ok((job_id, stream))
}
