//! The leader's network side: accepts agent connections, checks the job secret in the first frame,
//! then shuttles frames between the socket and the core thread.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::unbounded_channel;

use super::core::Event;
use crate::frame::{self, read_frame, FrameError};
use crate::proto::{self, frame::Body};
use crate::rundir::secret_eq;
use crate::PROTOCOL_VERSION;

const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

pub struct NetConfig {
    pub secret: Vec<u8>,
    pub job_id: String,
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

async fn reject(stream: &mut TcpStream, reason: &str) {
    let _ = frame::write_frame(stream, Body::Reject(proto::Reject { reason: reason.into() })).await;
    let _ = stream.shutdown().await;
}

async fn connection(mut stream: TcpStream, cfg: &NetConfig, core: mpsc::Sender<Event>) -> Result<(), String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut stream, &mut buf)).await {
        Err(_) => return Err("no hello within 10 s".into()),
        Ok(Err(e)) => return Err(format!("bad first frame: {e}")),
        Ok(Ok(Body::Hello(h))) => h,
        Ok(Ok(_)) => {
            reject(&mut stream, "expected Hello").await;
            return Err("first frame is not a Hello".into());
        }
    };
    if !secret_eq(&hello.secret, &cfg.secret) {
        reject(&mut stream, "wrong job secret").await;
        return Err("wrong job secret".into());
    }
    if hello.protocol != PROTOCOL_VERSION {
        let why = format!("protocol {} not supported (leader speaks {PROTOCOL_VERSION})", hello.protocol);
        reject(&mut stream, &why).await;
        return Err(why);
    }
    let agent = hello.agent_id;
    let (tx, mut rx) = unbounded_channel::<Vec<u8>>();
    let (mut rd, mut wr) = stream.into_split();
    let welcome = {
        let mut b = Vec::new();
        frame::encode_into(Body::Welcome(proto::Welcome { job_id: cfg.job_id.clone(), agent_id: agent }), &mut b);
        b
    };
    wr.write_all(&welcome).await.map_err(|e| e.to_string())?;
    // Writer: coalesces whatever the core queued into one write.
    tokio::spawn(async move {
        while let Some(mut out) = rx.recv().await {
            while let Ok(more) = rx.try_recv() {
                out.extend_from_slice(&more);
            }
            if wr.write_all(&out).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    if core
        .send(Event::Joined { agent, cores: hello.cores, mem_mb: hello.mem_mb, hostname: hello.hostname.clone(), tx })
        .is_err()
    {
        return Ok(());
    }
    let why = loop {
        match read_frame(&mut rd, &mut buf).await {
            Ok(Body::Report(report)) => {
                if core.send(Event::Report { agent, report }).is_err() {
                    return Ok(());
                }
            }
            Ok(_) => break "unexpected frame from agent".to_string(),
            Err(FrameError::Closed) => break "connection closed".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    let _ = core.send(Event::Lost { agent, why });
    Ok(())
}
