//! The leader's network side: accepts agent connections, authenticates them (`auth`), then
//! shuttles frames between the socket and the core thread.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};

use super::core::Input;
use super::driver::Event;
use crate::auth::{self, Door};
use crate::frame::{self, read_frame, FrameError};
use crate::proto::{self, frame::Body};

pub struct NetConfig {
    pub secret: Vec<u8>,
    pub job_id: String,
    /// Agents connected now, directly or through a relay; a second Hello for one is refused.
    pub joined: Mutex<HashSet<u32>>,
}

/// Accepts connections until the process ends; each connection runs in its own task, so a slow
/// or hostile peer never holds up the others.
pub async fn serve(listener: TcpListener, cfg: Arc<NetConfig>, core: mpsc::Sender<Event>) {
    let door = Door::new(&cfg.job_id);
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                door.accepted();
                let Some(permit) = door.enter(peer) else { continue };
                let (cfg, core, door) = (cfg.clone(), core.clone(), door.clone());
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, peer, permit, &cfg, core).await {
                        door.refused(peer, &e);
                    }
                });
            }
            Err(e) => door.accept_failed(&e).await,
        }
    }
}

/// Checks a Hello (the connecting agent's own, or one relayed from below it). The connection it
/// came over is authenticated; this guards against two agents claiming one id.
fn admit(h: &proto::Hello, cfg: &NetConfig) -> Result<(), String> {
    auth::check_hello(h, None)?;
    let mut joined = cfg.joined.lock().unwrap_or_else(|e| e.into_inner());
    // A rejoin brings the agents below it along: none of them may be connected still (the old
    // relay's connection is closed first; until then the rejoining agent retries).
    let below = if h.rejoin { &h.below[..] } else { &[] };
    if let Some(a) = std::iter::once(&h.agent_id).chain(below).find(|a| joined.contains(a)) {
        return Err(format!("agent {a} is already connected"));
    }
    joined.insert(h.agent_id);
    joined.extend(below);
    Ok(())
}

fn encoded(body: Body) -> Vec<u8> {
    let mut b = Vec::new();
    frame::encode_into(body, &mut b);
    b
}

/// One connection from a direct child: its own agent plus every agent it relays for. Errors are
/// refusals before the child joined; after that, a broken connection loses its agents.
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    permit: tokio::sync::OwnedSemaphorePermit,
    cfg: &NetConfig,
    core: mpsc::Sender<Event>,
) -> Result<(), String> {
    frame::tune(&stream).map_err(|e| e.to_string())?;
    let hello = auth::accept_hello(&mut stream, &cfg.secret).await.map_err(|e| e.to_string())?;
    drop(permit);
    if let Err(why) = admit(&hello, cfg) {
        let _ = frame::write_frame(
            &mut stream,
            Body::Reject(proto::Reject { reason: why.clone(), agent_id: hello.agent_id }),
        )
        .await;
        return Err(why);
    }
    tracing::debug!(job = %cfg.job_id, %peer, agent = hello.agent_id, "agent authenticated");
    let mut buf = Vec::new();
    let (mut rd, wr) = stream.into_split();
    let tx = frame::spawn_writer(wr);
    let mut agents: HashSet<u32> = HashSet::new();
    // The agent at the other end; the others it relays for may rejoin around its loss.
    let direct = hello.agent_id;
    let mut pending = Some(hello);
    let why = loop {
        if let Some(h) = pending.take() {
            let agent = h.agent_id;
            agents.insert(agent);
            let _ = tx.send(encoded(Body::Welcome(proto::Welcome { job_id: cfg.job_id.clone(), agent_id: agent })));
            let input = if h.rejoin {
                agents.extend(&h.below);
                Input::Rejoined { agent, below: h.below }
            } else if h.fresh {
                Input::Revived { agent, cores: h.cores, mem_mb: h.mem_mb, gpus: h.gpus, hostname: h.hostname }
            } else {
                Input::Joined { agent, cores: h.cores, mem_mb: h.mem_mb, gpus: h.gpus, hostname: h.hostname }
            };
            let joined = Event::Joined(input, tx.clone());
            if core.send(joined).is_err() {
                return Ok(());
            }
        }
        match read_frame(&mut rd, &mut buf).await {
            Ok(Body::Report(report)) if agents.contains(&report.agent) => {
                if core.send(Event::Core(Input::Report { agent: report.agent, report })).is_err() {
                    return Ok(());
                }
            }
            Ok(Body::Report(report)) => {
                tracing::warn!(agent = report.agent, "report for an agent not behind this connection dropped")
            }
            Ok(Body::Hello(h)) => match admit(&h, cfg) {
                Ok(()) => pending = Some(h),
                Err(why) => {
                    tracing::warn!(job = %cfg.job_id, agent = h.agent_id, %why, "relayed agent refused");
                    let _ = tx.send(encoded(Body::Reject(proto::Reject { reason: why, agent_id: h.agent_id })));
                }
            },
            Ok(Body::Lost(l)) => {
                if agents.remove(&l.agent) {
                    cfg.joined.lock().unwrap_or_else(|e| e.into_inner()).remove(&l.agent);
                    let _ = core.send(Event::Core(Input::Lost { agent: l.agent, why: l.reason }));
                }
            }
            Ok(_) => break "unexpected frame from agent".to_string(),
            Err(FrameError::Closed) => break "connection closed".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    // Held while the core hears of it, so a rejoin (admitted under this lock) comes after.
    let mut joined = cfg.joined.lock().unwrap_or_else(|e| e.into_inner());
    for agent in agents {
        joined.remove(&agent);
        let input = if agent == direct { Input::Lost { agent, why: why.clone() } } else { Input::Detached { agent } };
        let _ = core.send(Event::Core(input));
    }
    Ok(())
}
