//! The leader's network side: accepts agent connections, checks the job secret in the first frame,
//! then shuttles frames between the socket and the core thread.

use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use super::core::Event;
use crate::frame::{self, read_frame, FrameError};
use crate::proto::{self, frame::Body};
use crate::rundir::secret_eq;
use crate::PROTOCOL_VERSION;

const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

pub struct NetConfig {
    pub secret: Vec<u8>,
    pub job_id: String,
    /// Agents connected now, directly or through a relay; a second Hello for one is refused.
    pub joined: Mutex<HashSet<u32>>,
}

/// Accepts connections until the process ends; each connection runs in its own task.
pub async fn serve(listener: TcpListener, cfg: Arc<NetConfig>, core: mpsc::Sender<Event>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let cfg = cfg.clone();
                let core = core.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, &cfg, core).await {
                        tracing::warn!(job = %cfg.job_id, %peer, error = %e, "agent connection refused");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn reject(stream: &mut TcpStream, reason: &str, agent_id: u32) {
    let _ = frame::write_frame(stream, Body::Reject(proto::Reject { reason: reason.into(), agent_id })).await;
    let _ = stream.shutdown().await;
}

/// Checks a Hello (the connecting agent's own, or one relayed from below it).
fn admit(h: &proto::Hello, cfg: &NetConfig) -> Result<(), String> {
    if !secret_eq(&h.secret, &cfg.secret) {
        return Err("wrong job secret".into());
    }
    if h.protocol != PROTOCOL_VERSION {
        return Err(format!("protocol {} not supported (leader speaks {PROTOCOL_VERSION})", h.protocol));
    }
    let mut joined = cfg.joined.lock().unwrap_or_else(|e| e.into_inner());
    if !joined.insert(h.agent_id) {
        return Err(format!("agent {} is already connected", h.agent_id));
    }
    Ok(())
}

fn encoded(body: Body) -> Vec<u8> {
    let mut b = Vec::new();
    frame::encode_into(body, &mut b);
    b
}

/// One connection from a direct child: its own agent plus every agent it relays for.
async fn connection(mut stream: TcpStream, cfg: &NetConfig, core: mpsc::Sender<Event>) -> Result<(), String> {
    frame::tune(&stream).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let hello =
        match tokio::time::timeout(HELLO_TIMEOUT, frame::read_frame_limited(&mut stream, &mut buf, frame::MAX_HELLO))
            .await
        {
            Err(_) => return Err("no hello within 10 s".into()),
            Ok(Err(e)) => return Err(format!("bad first frame: {e}")),
            Ok(Ok(Body::Hello(h))) => h,
            Ok(Ok(_)) => {
                reject(&mut stream, "expected Hello", 0).await;
                return Err("first frame is not a Hello".into());
            }
        };
    if let Err(why) = admit(&hello, cfg) {
        reject(&mut stream, &why, hello.agent_id).await;
        return Err(why);
    }
    let (mut rd, wr) = stream.into_split();
    let tx = frame::spawn_writer(wr);
    let mut agents: HashSet<u32> = HashSet::new();
    let mut pending = Some(hello);
    let why = loop {
        if let Some(h) = pending.take() {
            let agent = h.agent_id;
            agents.insert(agent);
            let _ = tx.send(encoded(Body::Welcome(proto::Welcome { job_id: cfg.job_id.clone(), agent_id: agent })));
            let joined =
                Event::Joined { agent, cores: h.cores, mem_mb: h.mem_mb, hostname: h.hostname, tx: tx.clone() };
            if core.send(joined).is_err() {
                return Ok(());
            }
        }
        match read_frame(&mut rd, &mut buf).await {
            Ok(Body::Report(report)) if agents.contains(&report.agent) => {
                if core.send(Event::Report { agent: report.agent, report }).is_err() {
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
                    let _ = core.send(Event::Lost { agent: l.agent, why: l.reason });
                }
            }
            Ok(_) => break "unexpected frame from agent".to_string(),
            Err(FrameError::Closed) => break "connection closed".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    let mut joined = cfg.joined.lock().unwrap_or_else(|e| e.into_inner());
    for agent in agents {
        joined.remove(&agent);
        let _ = core.send(Event::Lost { agent, why: why.clone() });
    }
    Ok(())
}
