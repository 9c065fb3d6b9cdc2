//! A client of an open run (`htc task add`, `htc task cancel`, `htc close`): finds the run's
//! leader through the run directory (`RunDir::leader_at`, as a joining allocation does), proves
//! the run's secret, and sends requests over one connection, each answered in order.

use std::net::SocketAddr;

use htc_engine::wire::proto::{self, frame::Body, request::What};
use htc_store::rundir::RunDir;
use tokio::net::TcpStream;

use crate::{auth, frame};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{run}: not a run this user can read ({source})")]
    Unreadable { run: String, source: std::io::Error },
    #[error("{run}: the run is not running (no leader listens: it ended, or has not started)")]
    NotRunning { run: String },
    #[error("{run}: its leader at {addr} does not answer ({why}); the run may have ended")]
    NoAnswer { run: String, addr: SocketAddr, why: String },
    #[error("{run}: the leader at {addr} did not accept this run's secret ({why})")]
    Secret { run: String, addr: SocketAddr, why: String },
    /// The leader refused the request (nothing of it was done).
    #[error("{0}")]
    Refused(String),
}

/// A connection to a run's leader.
pub struct Client {
    rt: tokio::runtime::Runtime,
    s: TcpStream,
    run: String,
    addr: SocketAddr,
    seq: u64,
    buf: Vec<u8>,
}

/// What only a request of one task may carry: the key that makes its add idempotent, and
/// its name.
#[derive(Debug, Clone, Copy, Default)]
pub struct OneTask<'a> {
    pub key: Option<&'a [u8]>,
    pub name: Option<&'a str>,
}

impl Client {
    pub fn connect(run: &RunDir) -> Result<Client, ClientError> {
        let name = run.path.display().to_string();
        let unreadable = |source| ClientError::Unreadable { run: name.clone(), source };
        let at = run.leader_at().map_err(unreadable)?.ok_or_else(|| ClientError::NotRunning { run: name.clone() })?;
        let secret = run.read_secret().map_err(unreadable)?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(unreadable)?;
        let no_answer = |why: String| ClientError::NoAnswer { run: name.clone(), addr: at.addr, why };
        let s = rt.block_on(async {
            let mut s = tokio::time::timeout(auth::HANDSHAKE_TIMEOUT, TcpStream::connect(at.addr))
                .await
                .map_err(|_| no_answer("timed out".into()))?
                .map_err(|e| no_answer(e.to_string()))?;
            frame::tune(&s).map_err(|e| no_answer(e.to_string()))?;
            auth::connect(&mut s, &secret).await.map_err(|e| ClientError::Secret {
                run: name.clone(),
                addr: at.addr,
                why: e.to_string(),
            })?;
            let hello = proto::ClientHello { protocol: htc_engine::wire::PROTOCOL_VERSION };
            frame::write_frame(&mut s, Body::ClientHello(hello)).await.map_err(|e| no_answer(e.to_string()))?;
            Ok::<_, ClientError>(s)
        })?;
        Ok(Client { rt, s, run: name, addr: at.addr, seq: 0, buf: Vec::new() })
    }

    /// Adds task lines (the task file's syntax), all or nothing: their ids, in order, once they
    /// are committed. `source` and `first_line` name the lines in a refusal.
    pub fn add(
        &mut self,
        lines: &[u8],
        source: &str,
        first_line: u64,
        one: OneTask<'_>,
    ) -> Result<Vec<u64>, ClientError> {
        let add = proto::AddTasks {
            lines: lines.to_vec(),
            source: source.to_string(),
            first_line,
            key: one.key.unwrap_or_default().to_vec(),
            name: one.name.unwrap_or_default().to_string(),
        };
        self.ask(What::Add(add))
    }

    /// Cancels these tasks: what is queued never starts, what runs is stopped.
    pub fn cancel(&mut self, ids: Vec<u64>) -> Result<Vec<u64>, ClientError> {
        self.ask(What::Cancel(proto::TaskIds { ids }))
    }

    /// Closes the run: it takes no more tasks and ends once what it holds is done (with
    /// `cancel`: cancelled).
    pub fn close(&mut self, cancel: bool) -> Result<(), ClientError> {
        self.ask(What::Close(proto::CloseRun { cancel })).map(drop)
    }

    /// How these tasks stand (all: `None`), as the leader knows them.
    pub fn status(&mut self, ids: Option<Vec<u64>>) -> Result<Vec<htc_core::record::TaskStatus>, ClientError> {
        let q = proto::StatusOf { all: ids.is_none(), ids: ids.unwrap_or_default() };
        let reply = self.request(What::Status(q))?;
        Ok(reply
            .states
            .into_iter()
            .map(|t| htc_core::record::TaskStatus {
                id: t.id,
                state: word(&t.state),
                exit: t.exit,
                reason: t.reason,
                name: (!t.name.is_empty()).then_some(t.name),
            })
            .collect())
    }

    fn ask(&mut self, what: What) -> Result<Vec<u64>, ClientError> {
        self.request(what).map(|r| r.ids)
    }

    fn request(&mut self, what: What) -> Result<proto::Reply, ClientError> {
        self.seq += 1;
        let request = proto::Request { seq: self.seq, what: Some(what) };
        let (run, addr) = (self.run.clone(), self.addr);
        let no_answer = |why: String| ClientError::NoAnswer { run: run.clone(), addr, why };
        let (s, buf) = (&mut self.s, &mut self.buf);
        let reply = self.rt.block_on(async {
            frame::write_frame(s, Body::Request(request)).await.map_err(|e| no_answer(e.to_string()))?;
            match frame::read_frame(s, buf).await {
                Ok(Body::Reply(r)) => Ok(r),
                Ok(_) => Err(no_answer("an unexpected answer".into())),
                Err(e) => Err(no_answer(e.to_string())),
            }
        })?;
        if !reply.error.is_empty() {
            return Err(ClientError::Refused(reply.error));
        }
        Ok(reply)
    }
}

/// A state word as the leader sent it, one of those `TaskStatus` has.
fn word(s: &str) -> &'static str {
    ["waiting", "blocked", "running", "done", "failed", "cancelled", htc_core::record::DAMAGED]
        .into_iter()
        .find(|w| *w == s)
        .unwrap_or("unknown")
}
