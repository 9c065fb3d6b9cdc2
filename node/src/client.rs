//! A client of an open run (`htc task add`, `htc task cancel`, `htc close`): finds the run's
//! leader through the run directory (`RunDir::leader_at`, as a joining allocation does), proves
//! the run's secret, and sends requests over one connection, each answered in order.

use std::net::SocketAddr;
use std::time::Duration;

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
    #[error("{run}: its leader at {addr} does not answer ({why})")]
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

/// What a cancel did, by task.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cancelled {
    pub cancelled: Vec<u64>,
    /// Ended before the cancel: left as they were.
    pub ended: Vec<u64>,
    /// Not tasks of the run.
    pub unknown: Vec<u64>,
}

/// What only a request of one task may carry: the key that makes its add idempotent, and
/// its name.
#[derive(Debug, Clone, Copy, Default)]
pub struct OneTask<'a> {
    pub key: Option<&'a [u8]>,
    pub name: Option<&'a str>,
}

/// How long a client keeps trying to reach a leader that does not let it in (busy with
/// thousands of others, or stopped), unless `HTC_CLIENT_PATIENCE` (seconds) says otherwise.
pub const PATIENCE: Duration = Duration::from_secs(120);
/// After this long without getting in, the client says once that it waits, and for whom.
const SAY_AFTER: Duration = Duration::from_secs(5);

/// The wait before try `n` (from 1): 20 ms doubling up to 1 s, each drawn at random from its
/// upper half, so that thousands of clients that failed together do not come back together.
pub fn backoff(n: u32, random: u64) -> Duration {
    let top = (20u64 << n.saturating_sub(1).min(6)).min(1000);
    Duration::from_millis(top / 2 + random % (top / 2 + 1))
}

/// Why one try to get in failed: the run's fault (load, a stop) is retried, an answer is not.
enum Try {
    /// Busy or stopped: try again.
    Busy(String),
    /// Nothing listens there.
    Refused,
    Final(ClientError),
}

impl Client {
    /// Connects to the run's leader and proves the run's secret. A leader that is busy (its
    /// queue full, a handshake cut short) or stopped is tried again, with growing waits, for up
    /// to `PATIENCE`: load is answered with waiting, never taken for a wrong secret.
    pub fn connect(run: &RunDir) -> Result<Client, ClientError> {
        Client::connect_within(run, patience())
    }

    /// `connect`, giving up after `patience`: a reader with somewhere else to look (the ledger)
    /// need not wait as long as a request only the leader can carry out.
    pub fn connect_within(run: &RunDir, patience: Duration) -> Result<Client, ClientError> {
        let name = run.path.display().to_string();
        let unreadable = |source| ClientError::Unreadable { run: name.clone(), source };
        let secret = run.read_secret().map_err(unreadable)?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(unreadable)?;
        let start = std::time::Instant::now();
        let (mut tries, mut said) = (0u32, false);
        loop {
            tries += 1;
            // Read again at each try: a run resumed by a new leader listens at a new address.
            let at =
                run.leader_at().map_err(unreadable)?.ok_or_else(|| ClientError::NotRunning { run: name.clone() })?;
            let left = patience.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
            // Said once, while a try still waits (a stopped leader's queue holds it for long).
            let say = (!said).then(|| start + SAY_AFTER);
            let note = || {
                let p = patience.as_secs();
                eprintln!(
                    "htc: waiting for the leader of {name} at {} (busy, or stopped); giving up after {p} s",
                    at.addr
                )
            };
            let got = rt.block_on(async {
                // (A timer is made inside the runtime.)
                saying(tokio::time::timeout(left, try_connect(at.addr, &secret, &name)), say, note).await
            });
            said |= say.is_some_and(|t| std::time::Instant::now() >= t);
            let why = match got.unwrap_or_else(|_| Err(Try::Busy("the handshake did not finish in time".into()))) {
                Ok(s) => return Ok(Client { rt, s, run: name, addr: at.addr, seq: 0, buf: Vec::new() }),
                Err(Try::Final(e)) => return Err(e),
                // Nothing listens at the address the run names (a full queue drops a connection,
                // it does not refuse it): its leader is gone.
                Err(Try::Refused) => return Err(ClientError::NotRunning { run: name }),
                Err(Try::Busy(why)) => why,
            };
            let waited = start.elapsed();
            if waited >= patience {
                let why = format!("{why}; {tries} tries in {} s: busy, or stopped", waited.as_secs());
                return Err(ClientError::NoAnswer { run: name, addr: at.addr, why });
            }
            let random = u64::from_le_bytes(auth::nonce().map(|n| n[..8].try_into().unwrap()).unwrap_or_default());
            std::thread::sleep(backoff(tries, random).min(patience.saturating_sub(waited)));
        }
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

    /// Cancels these tasks: what is queued never starts, what runs is stopped. Which of them
    /// it cancelled, which had ended already, and which the run does not have.
    pub fn cancel(&mut self, ids: Vec<u64>) -> Result<Cancelled, ClientError> {
        let reply = self.request(What::Cancel(proto::TaskIds { ids }))?;
        let before: std::collections::HashMap<u64, &str> =
            reply.states.iter().map(|t| (t.id, t.state.as_str())).collect();
        let mut out = Cancelled::default();
        for id in reply.ids {
            match before.get(&id) {
                None => out.unknown.push(id),
                Some(&("done" | "failed" | "cancelled")) => out.ended.push(id),
                Some(_) => out.cancelled.push(id),
            }
        }
        Ok(out)
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

    /// Why these tasks are where they are, as the leader sees them now (`htc task explain`).
    pub fn explain(&mut self, ids: Vec<u64>) -> Result<Vec<proto::TaskWhy>, ClientError> {
        self.request(What::Explain(proto::TaskIds { ids })).map(|r| r.whys)
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
        let patience = patience();
        let reply = self.rt.block_on(async {
            frame::write_frame(s, Body::Request(request)).await.map_err(|e| no_answer(e.to_string()))?;
            // A stopped or swamped leader: said after a while, given up at the client's patience
            // (what was asked may have been done: an add under the same --key is safe to repeat).
            let answer = frame::read_frame(s, buf);
            tokio::pin!(answer);
            let read = match tokio::time::timeout(SAY_AFTER.min(patience), &mut answer).await {
                Ok(read) => read,
                Err(_) => {
                    eprintln!(
                        "htc: waiting for the answer of the leader of {run} at {addr}; giving up after {} s",
                        patience.as_secs()
                    );
                    tokio::time::timeout(patience.saturating_sub(SAY_AFTER), answer).await.map_err(|_| {
                        no_answer(format!(
                            "no answer within {} s (busy, or stopped); what was asked may have been done",
                            patience.as_secs()
                        ))
                    })?
                }
            };
            match read {
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

/// `fut`, calling `note` once if it is still waiting at `at`.
async fn saying<F: std::future::Future>(fut: F, at: Option<std::time::Instant>, note: impl FnOnce()) -> F::Output {
    tokio::pin!(fut);
    let Some(at) = at else { return fut.await };
    tokio::select! {
        out = &mut fut => return out,
        _ = tokio::time::sleep_until(at.into()) => note(),
    }
    fut.await
}

/// `HTC_CLIENT_PATIENCE` seconds, else `PATIENCE`.
pub fn patience() -> Duration {
    std::env::var("HTC_CLIENT_PATIENCE")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(PATIENCE, Duration::from_secs_f64)
}

/// One try to get in: connect, the handshake, the client's Hello.
async fn try_connect(addr: SocketAddr, secret: &[u8], run: &str) -> Result<TcpStream, Try> {
    let busy = |why: String| Try::Busy(why);
    let mut s = match tokio::time::timeout(auth::HANDSHAKE_TIMEOUT, TcpStream::connect(addr)).await {
        Err(_) => return Err(busy("connecting timed out".into())),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Err(Try::Refused),
        Ok(Err(e)) => return Err(busy(e.to_string())),
        Ok(Ok(s)) => s,
    };
    frame::tune(&s).map_err(|e| busy(e.to_string()))?;
    match auth::connect(&mut s, secret).await {
        Ok(()) => {}
        // The leader's answer to a wrong proof, or a proof of its own that is wrong: a secret
        // that does not match, which no retry changes.
        Err(e @ (auth::AuthError::Refused(_) | auth::AuthError::WrongProof | auth::AuthError::Protocol(_))) => {
            return Err(Try::Final(ClientError::Secret { run: run.into(), addr, why: e.to_string() }));
        }
        // Closed, reset or timed out in the handshake: the leader turned it out or is busy.
        Err(e) => return Err(busy(format!("the handshake did not finish: {e}"))),
    }
    let hello = proto::ClientHello { protocol: htc_engine::wire::PROTOCOL_VERSION };
    frame::write_frame(&mut s, Body::ClientHello(hello)).await.map_err(|e| busy(e.to_string()))?;
    Ok(s)
}

/// A state word as the leader sent it, one of those `TaskStatus` has.
fn word(s: &str) -> &'static str {
    ["waiting", "blocked", "running", "done", "failed", "cancelled", htc_core::record::DAMAGED]
        .into_iter()
        .find(|w| *w == s)
        .unwrap_or("unknown")
}
