//! Mutual authentication of a connection between two agents of one job. Each side sends a fresh
//! random nonce; the connecting side proves it knows the job secret with an HMAC over both nonces,
//! and the accepting side answers with its own proof only after checking that one. The secret
//! never crosses the wire, and a recorded handshake is worthless on a new connection because the
//! other side's nonce is new. The connecting side checks the answer too, so a stranger cannot
//! pose as a leader or relay and hand an agent commands to run.
//!
//! The proof is pure (`proof`, `verify`); `accept` and `connect` are the I/O around it, and `Door`
//! keeps a flood of strangers from costing more than a bounded number of sockets and log lines.

use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::frame::{self, FrameError, MAX_HELLO};
use htc_engine::wire::proto::{self, frame::Body};
use htc_engine::wire::PROTOCOL_VERSION;

pub const NONCE_LEN: usize = 32;
/// A peer that has not finished the handshake (and said Hello) by then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections in their handshake at once, so strangers cannot use up the agent's file
/// descriptors: more wait in the listener's queue (`slurm::BACKLOG`) until a place is free.
pub const MAX_PENDING: usize = 64;
/// When every place is taken, the connection that has held one longest is turned out once it has
/// held it this long: an honest peer finishes in a round trip, so a few strangers that connect
/// and say nothing cannot keep the run's agents and clients waiting for `HANDSHAKE_TIMEOUT`.
pub const TURN_OUT_AFTER: Duration = Duration::from_secs(2);

type HmacSha256 = Hmac<Sha256>;

/// Which side of the connection signs: the labels differ so a proof can never be reflected back.
#[derive(Clone, Copy, Debug)]
pub enum Role {
    Connecting,
    Accepting,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Connecting => b"htc-auth-v1 connecting",
            Role::Accepting => b"htc-auth-v1 accepting",
        }
    }
}

/// The two nonces of one handshake.
pub struct Nonces {
    pub accepting: [u8; NONCE_LEN],
    pub connecting: [u8; NONCE_LEN],
}

fn keyed(secret: &[u8], role: Role, n: &Nonces) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(role.label());
    mac.update(&PROTOCOL_VERSION.to_be_bytes());
    mac.update(&n.accepting);
    mac.update(&n.connecting);
    mac
}

/// The proof `role` sends: HMAC-SHA256 under the secret of the role, the protocol and both nonces.
pub fn proof(secret: &[u8], role: Role, n: &Nonces) -> Vec<u8> {
    keyed(secret, role, n).finalize().into_bytes().to_vec()
}

/// Checks a proof from `role` in constant time.
pub fn verify(secret: &[u8], role: Role, n: &Nonces, mac: &[u8]) -> bool {
    keyed(secret, role, n).verify_slice(mac).is_ok()
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("no handshake within {} s", HANDSHAKE_TIMEOUT.as_secs())]
    Timeout,
    #[error("expected {expected} during the handshake, got {got}")]
    Unexpected { expected: &'static str, got: &'static str },
    #[error("nonce of {0} bytes (expected {NONCE_LEN})")]
    BadNonce(usize),
    #[error("peer speaks protocol {0}, this agent speaks {PROTOCOL_VERSION}")]
    Protocol(u32),
    #[error("wrong proof of the job secret")]
    WrongProof,
    #[error("refused by the peer: {0}")]
    Refused(String),
    #[error("no random nonce: {0}")]
    Random(std::io::Error),
    #[error("turned out: its handshake took over {} s while every place was taken", TURN_OUT_AFTER.as_secs())]
    TurnedOut,
}

/// A fresh nonce from the kernel's CSPRNG.
pub fn nonce() -> Result<[u8; NONCE_LEN], AuthError> {
    let mut n = [0u8; NONCE_LEN];
    let mut got = 0;
    while got < NONCE_LEN {
        // SAFETY: getrandom writes at most the given length into the buffer.
        let rc = unsafe { libc::getrandom(n[got..].as_mut_ptr().cast(), NONCE_LEN - got, 0) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(AuthError::Random(e));
        }
        got += rc as usize;
    }
    Ok(n)
}

fn name(b: &Body) -> &'static str {
    match b {
        Body::Hello(_) => "Hello",
        Body::Welcome(_) => "Welcome",
        Body::Dispatch(_) => "Dispatch",
        Body::Report(_) => "Report",
        Body::Ack(_) => "Ack",
        Body::Shutdown(_) => "Shutdown",
        Body::Reject(_) => "Reject",
        Body::Lost(_) => "Lost",
        Body::Challenge(_) => "Challenge",
        Body::Proof(_) => "Proof",
        Body::Preempt(_) => "Preempt",
        Body::Recall(_) => "Recall",
        Body::Attach(_) => "Attach",
        Body::Attached(_) => "Attached",
        Body::ClientHello(_) => "ClientHello",
        Body::Request(_) => "Request",
        Body::Reply(_) => "Reply",
    }
}

/// Reads one small pre-authentication frame: a stranger never makes us buffer more than
/// `MAX_HELLO` bytes.
async fn read_small<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> Result<Body, AuthError> {
    Ok(frame::read_frame_limited(s, buf, MAX_HELLO).await?)
}

async fn read_challenge<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> Result<[u8; NONCE_LEN], AuthError> {
    match read_small(s, buf).await? {
        Body::Challenge(c) if c.protocol != PROTOCOL_VERSION => Err(AuthError::Protocol(c.protocol)),
        Body::Challenge(c) => c.nonce.as_slice().try_into().map_err(|_| AuthError::BadNonce(c.nonce.len())),
        Body::Reject(r) => Err(AuthError::Refused(r.reason)),
        other => Err(AuthError::Unexpected { expected: "Challenge", got: name(&other) }),
    }
}

async fn read_proof<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> Result<Vec<u8>, AuthError> {
    match read_small(s, buf).await? {
        Body::Proof(p) => Ok(p.mac),
        Body::Reject(r) => Err(AuthError::Refused(r.reason)),
        other => Err(AuthError::Unexpected { expected: "Proof", got: name(&other) }),
    }
}

async fn send<S: AsyncWrite + Unpin>(s: &mut S, body: Body) -> Result<(), AuthError> {
    Ok(frame::write_frame(s, body).await?)
}

/// The accepting side of the handshake. On a wrong proof the peer is told "authentication
/// failed" (nothing more) before the caller drops it.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, secret: &[u8]) -> Result<(), AuthError> {
    let ours = nonce()?;
    let run = async {
        send(s, Body::Challenge(proto::Challenge { nonce: ours.to_vec(), protocol: PROTOCOL_VERSION })).await?;
        let mut buf = Vec::new();
        let theirs = read_challenge(s, &mut buf).await?;
        let mac = read_proof(s, &mut buf).await?;
        let n = Nonces { accepting: ours, connecting: theirs };
        if !verify(secret, Role::Connecting, &n, &mac) {
            let reject = proto::Reject { reason: "authentication failed".into(), agent_id: 0 };
            let _ = send(s, Body::Reject(reject)).await;
            return Err(AuthError::WrongProof);
        }
        send(s, Body::Proof(proto::Proof { mac: proof(secret, Role::Accepting, &n) })).await
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, run).await.unwrap_or(Err(AuthError::Timeout))
}

/// The connecting side of the handshake: proves itself, then checks the accepting side's proof.
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, secret: &[u8]) -> Result<(), AuthError> {
    let ours = nonce()?;
    let run = async {
        send(s, Body::Challenge(proto::Challenge { nonce: ours.to_vec(), protocol: PROTOCOL_VERSION })).await?;
        let mut buf = Vec::new();
        let theirs = read_challenge(s, &mut buf).await?;
        let n = Nonces { accepting: theirs, connecting: ours };
        send(s, Body::Proof(proto::Proof { mac: proof(secret, Role::Connecting, &n) })).await?;
        let mac = read_proof(s, &mut buf).await?;
        if verify(secret, Role::Accepting, &n, &mac) {
            Ok(())
        } else {
            Err(AuthError::WrongProof)
        }
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, run).await.unwrap_or(Err(AuthError::Timeout))
}

/// What a connection to the leader starts with once authenticated: an agent's Hello, or a
/// joining allocation's Attach.
#[derive(Debug)]
pub enum First {
    Hello(proto::Hello),
    Attach(proto::Attach),
    /// A client of an open run (`htc task add`, …).
    Client(proto::ClientHello),
}

/// The accepting side up to the peer's Hello: the handshake, then a Hello as the first frame,
/// each within `HANDSHAKE_TIMEOUT`.
pub async fn accept_hello<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &[u8],
    pass: Pass,
) -> Result<proto::Hello, AuthError> {
    match accept_first(s, secret, pass).await? {
        First::Hello(h) => Ok(h),
        First::Attach(_) => Err(AuthError::Unexpected { expected: "Hello", got: "Attach" }),
        First::Client(_) => Err(AuthError::Unexpected { expected: "Hello", got: "ClientHello" }),
    }
}

/// The accepting side up to the first frame, a Hello or an Attach (the leader takes both).
/// `pass` is the connection's place at the door, held only until the peer has proven the secret:
/// then it is no stranger, and once it has the proof of this side it takes itself as let in, so
/// turning it out before its first frame would fail its first request, not its handshake.
pub async fn accept_first<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &[u8],
    mut pass: Pass,
) -> Result<First, AuthError> {
    pass.hold(accept(s, secret)).await?;
    drop(pass);
    let mut buf = Vec::new();
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_small(s, &mut buf)).await {
        Err(_) => Err(AuthError::Timeout),
        Ok(Ok(Body::Hello(h))) => Ok(First::Hello(h)),
        Ok(Ok(Body::Attach(a))) => Ok(First::Attach(a)),
        Ok(Ok(Body::ClientHello(c))) => Ok(First::Client(c)),
        Ok(Ok(other)) => Err(AuthError::Unexpected { expected: "Hello", got: name(&other) }),
        Ok(Err(e)) => Err(e),
    }
}

/// Where a relay sits in the tree, for checking the Hellos of its direct children.
#[derive(Debug, Clone)]
pub struct RelayPlace {
    pub me: u32,
    pub tree: std::sync::Arc<htc_core::tree::Tree>,
}

/// The one check of a Hello that came over an authenticated connection, at the leader (`None`)
/// or at a relay: the protocol must be ours, and a relay admits only its own direct children,
/// so a misplaced agent is refused where it knocked rather than further up. The leader adds
/// that no agent id is connected twice.
pub fn check_hello(h: &proto::Hello, relay: Option<&RelayPlace>) -> Result<(), String> {
    if h.protocol != htc_engine::wire::PROTOCOL_VERSION {
        return Err(format!(
            "protocol {} not supported (this side speaks {})",
            h.protocol,
            htc_engine::wire::PROTOCOL_VERSION
        ));
    }
    if let Some(r) = relay {
        if !r.tree.is_child(h.agent_id, Some(r.me)) {
            return Err(format!("agent {} is not a child of this agent", h.agent_id));
        }
    }
    Ok(())
}

/// Refusal lines logged per window; past that, refusals are counted and summed up when the
/// window ends, so a flood of strangers cannot fill the job's log and none goes unmentioned.
const LOG_PER_WINDOW: u32 = 20;
const LOG_WINDOW: Duration = Duration::from_secs(60);

/// Decides which refusals get a log line: pure, fed the time of each refusal.
#[derive(Default)]
pub struct Refusals {
    window: Option<Instant>,
    logged: u32,
    quiet: u64,
}

impl Refusals {
    /// When the window whose refusals go unlogged ends: its summary is due then (`summary`).
    /// `Some` only for the first refusal past the window's lines, so one summary is scheduled.
    pub fn summary_due(&self) -> Option<Instant> {
        (self.quiet == 1).then_some(self.window?.checked_add(LOG_WINDOW)?)
    }

    /// At a window's end: how many refusals went unlogged in it (taken), if any.
    pub fn summary(&mut self) -> Option<u64> {
        Some(std::mem::take(&mut self.quiet)).filter(|&n| n > 0)
    }

    /// `Some(n)`: log this refusal, and say that `n` others went unlogged before it.
    pub fn on_refusal(&mut self, now: Instant) -> Option<u64> {
        if self.window.is_none_or(|start| now.duration_since(start) >= LOG_WINDOW) {
            self.window = Some(now);
            self.logged = 0;
        }
        if self.logged < LOG_PER_WINDOW {
            self.logged += 1;
            Some(std::mem::take(&mut self.quiet))
        } else {
            self.quiet += 1;
            None
        }
    }
}

/// The wait after `failures` accepts failed in a row (0: the first): 10 ms doubling, at most 1 s.
pub fn accept_backoff(failures: u32) -> Duration {
    Duration::from_millis(10u64 << failures.min(7)).min(Duration::from_secs(1))
}

/// Who holds the door's places, oldest first: pure, fed the time.
#[derive(Default)]
pub struct Holders {
    next: u64,
    held: std::collections::VecDeque<(u64, Instant)>,
}

impl Holders {
    /// A new holder since `now`: its number.
    pub fn enter(&mut self, now: Instant) -> u64 {
        self.next += 1;
        self.held.push_back((self.next, now));
        self.next
    }

    /// Holder `id` left (its handshake ended, or it was turned out).
    pub fn leave(&mut self, id: u64) {
        if let Some(i) = self.held.iter().position(|(h, _)| *h == id) {
            self.held.remove(i);
        }
    }

    /// With every place taken at `now`: the holder to turn out (the oldest, once it has held its
    /// place `TURN_OUT_AFTER`), or when to ask again.
    pub fn turn_out(&self, now: Instant) -> Result<u64, Instant> {
        match self.held.front() {
            Some(&(id, since)) if now.duration_since(since) >= TURN_OUT_AFTER => Ok(id),
            Some(&(_, since)) => Err(since + TURN_OUT_AFTER),
            None => Err(now + TURN_OUT_AFTER),
        }
    }
}

/// A connection's place in its handshake, given by `Door::pass`; freed when dropped (after its
/// Hello).
pub struct Pass {
    _permit: OwnedSemaphorePermit,
    id: u64,
    turned_out: tokio::sync::oneshot::Receiver<()>,
    door: Arc<Door>,
}

impl Pass {
    /// `handshake`, unless the door turns this connection out first.
    pub async fn hold<T>(
        &mut self,
        handshake: impl std::future::Future<Output = Result<T, AuthError>>,
    ) -> Result<T, AuthError> {
        tokio::select! {
            r = handshake => r,
            _ = &mut self.turned_out => Err(AuthError::TurnedOut),
        }
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut h = self.door.holders();
        h.0.leave(self.id);
        h.1.remove(&self.id);
    }
}

/// The door's clock: tokio's, so that a test with paused time sees its turn-outs at once.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

type Held = (Holders, std::collections::HashMap<u64, tokio::sync::oneshot::Sender<()>>);

/// Where strangers are turned away: bounds the connections in their handshake and logs refusals.
pub struct Door {
    pending: Arc<Semaphore>,
    held: Mutex<Held>,
    refusals: Mutex<Refusals>,
    job: String,
    /// Accepts failed in a row (out of descriptors, say).
    failing: std::sync::atomic::AtomicU32,
    /// Failure lines, at most one a minute: a freed descriptor lets one accept through between
    /// failures, which must not start a new line each time.
    failure_log: Mutex<htc_exec::throttle::Throttle>,
    /// A failure line was written and no recovery line yet.
    failure_logged: std::sync::atomic::AtomicBool,
}

impl Door {
    pub fn new(job: &str) -> Arc<Door> {
        Arc::new(Door {
            pending: Arc::new(Semaphore::new(MAX_PENDING)),
            held: Default::default(),
            refusals: Default::default(),
            job: job.into(),
            failing: Default::default(),
            failure_log: Mutex::new(htc_exec::throttle::Throttle::new(Duration::from_secs(60))),
            failure_logged: Default::default(),
        })
    }

    /// Waits before the next accept after a failed one, 10 ms doubling up to 1 s, and logs at
    /// most one failure a minute: a listener out of descriptors (EMFILE) neither spins nor floods
    /// the log. Call `accepted` after a success.
    pub async fn accept_failed(&self, e: &std::io::Error) {
        let n = self.failing.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let allowed = self.failure_log.lock().unwrap_or_else(|e| e.into_inner()).allow(std::time::Instant::now());
        if let Some(more) = allowed {
            tracing::warn!(job = %self.job, error = %e, failures_not_logged = more, "accepting a connection failed; retrying with backoff");
            self.failure_logged.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        tokio::time::sleep(accept_backoff(n)).await;
    }

    pub fn accepted(&self) {
        if self.failing.swap(0, std::sync::atomic::Ordering::Relaxed) > 0
            && self.failure_logged.swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!(job = %self.job, "accepting connections again");
        }
    }

    fn holders(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for one more connection in its handshake, held until it has said Hello: waits
    /// while all `MAX_PENDING` are taken (the connections wait in the listener's queue, none is
    /// refused), turning out the oldest holder once it has held its place `TURN_OUT_AFTER`.
    /// Call before accepting the connection it is for.
    pub async fn pass(self: &Arc<Self>) -> Pass {
        let permit = loop {
            if let Ok(p) = self.pending.clone().try_acquire_owned() {
                break p;
            }
            let again = {
                let mut h = self.holders();
                match h.0.turn_out(now()) {
                    Ok(id) => {
                        h.0.leave(id);
                        if let Some(tx) = h.1.remove(&id) {
                            let _ = tx.send(());
                        }
                        // Its permit comes back as its task ends.
                        now() + Duration::from_millis(1)
                    }
                    Err(at) => at,
                }
            };
            tokio::select! {
                p = self.pending.clone().acquire_owned() => break p.expect("the door's semaphore is never closed"),
                _ = tokio::time::sleep_until(again.into()) => {}
            }
        };
        let (tx, turned_out) = tokio::sync::oneshot::channel();
        let id = {
            let mut h = self.holders();
            let id = h.0.enter(now());
            h.1.insert(id, tx);
            id
        };
        Pass { _permit: permit, id, turned_out, door: self.clone() }
    }

    /// Logs one refused connection (rate-limited; what is not logged is summed up at the end of
    /// its window).
    pub fn refused(self: &Arc<Self>, peer: SocketAddr, why: &dyn Display) {
        let (verdict, due) = {
            let mut r = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
            let v = r.on_refusal(Instant::now());
            (v, r.summary_due())
        };
        if let (Some(at), Ok(rt)) = (due, tokio::runtime::Handle::try_current()) {
            let door = self.clone();
            rt.spawn(async move {
                tokio::time::sleep_until(at.into()).await;
                let n = door.refusals.lock().unwrap_or_else(|e| e.into_inner()).summary();
                if let Some(n) = n {
                    tracing::warn!(job = %door.job, unlogged = n, "{n} more connections were refused in the last minute");
                }
            });
        }
        match verdict {
            Some(0) => tracing::warn!(job = %self.job, %peer, reason = %why, "connection refused"),
            Some(quiet) => {
                tracing::warn!(job = %self.job, %peer, reason = %why, unlogged = quiet, "connection refused (and {quiet} more not logged)")
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn nonces() -> Nonces {
        Nonces { accepting: [1; NONCE_LEN], connecting: [2; NONCE_LEN] }
    }

    /// RFC 4231 test case 2, so the construction is HMAC-SHA256 and not something like it.
    #[test]
    fn hmac_is_rfc_4231() {
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn proofs_bind_secret_role_and_both_nonces() {
        let n = nonces();
        let p = proof(SECRET, Role::Connecting, &n);
        assert_eq!(p.len(), 32);
        assert!(verify(SECRET, Role::Connecting, &n, &p));
        assert!(!verify(b"another secret of the same size!", Role::Connecting, &n, &p));
        assert!(!verify(SECRET, Role::Accepting, &n, &p), "a proof cannot be reflected to the other role");
        let other = Nonces { accepting: [3; NONCE_LEN], connecting: [2; NONCE_LEN] };
        assert!(!verify(SECRET, Role::Connecting, &other, &p), "a proof is worthless for a new challenge");
        let swapped = Nonces { accepting: n.connecting, connecting: n.accepting };
        assert!(!verify(SECRET, Role::Connecting, &swapped, &p));
        assert!(!verify(SECRET, Role::Connecting, &n, &p[..31]));
        assert!(!verify(SECRET, Role::Connecting, &n, b""));
    }

    #[test]
    fn nonces_are_fresh() {
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }

    #[tokio::test]
    async fn handshake_succeeds_with_the_secret_on_both_sides() {
        let (mut a, mut c) = tokio::io::duplex(4096);
        let (ra, rc) = tokio::join!(accept(&mut a, SECRET), connect(&mut c, SECRET));
        ra.unwrap();
        rc.unwrap();
    }

    #[tokio::test]
    async fn wrong_secret_fails_on_both_sides() {
        let (mut a, mut c) = tokio::io::duplex(4096);
        let (ra, rc) = tokio::join!(accept(&mut a, SECRET), connect(&mut c, b"not the job secret"));
        assert!(matches!(ra, Err(AuthError::WrongProof)), "{ra:?}");
        assert!(matches!(rc, Err(AuthError::Refused(ref r)) if r == "authentication failed"), "{rc:?}");
    }

    #[tokio::test]
    async fn a_fake_acceptor_is_caught_by_the_connecting_side() {
        let (mut a, mut c) = tokio::io::duplex(4096);
        let (ra, rc) = tokio::join!(accept(&mut a, b"the impostor's guess"), connect(&mut c, SECRET));
        // The impostor cannot check the proof either, so it refuses; had it answered anything,
        // the connecting side would have found the proof wrong.
        assert!(ra.is_err());
        assert!(rc.is_err());
    }

    /// Keeps the bytes of an honest connecting side's handshake and replays them on a new
    /// connection, as someone who recorded the traffic would.
    #[tokio::test]
    async fn a_replayed_handshake_is_refused() {
        let (mut a, mut c) = tokio::io::duplex(4096);
        let server = tokio::spawn(async move { accept(&mut a, SECRET).await });
        let mut buf = Vec::new();
        let theirs = read_challenge(&mut c, &mut buf).await.unwrap();
        let ours = nonce().unwrap();
        let n = Nonces { accepting: theirs, connecting: ours };
        let mut sent = Vec::new();
        frame::encode_into(
            Body::Challenge(proto::Challenge { nonce: ours.to_vec(), protocol: PROTOCOL_VERSION }),
            &mut sent,
        );
        frame::encode_into(Body::Proof(proto::Proof { mac: proof(SECRET, Role::Connecting, &n) }), &mut sent);
        c.write_all(&sent).await.unwrap();
        server.await.unwrap().expect("the honest handshake passes");

        let (mut a2, mut c2) = tokio::io::duplex(4096);
        c2.write_all(&sent).await.unwrap();
        assert!(matches!(accept(&mut a2, SECRET).await, Err(AuthError::WrongProof)));
    }

    #[tokio::test]
    async fn strangers_are_refused_quickly() {
        // A bare Hello (the old protocol) instead of a Challenge.
        let (mut a, mut c) = tokio::io::duplex(4096);
        let hello = proto::Hello { agent_id: 1, protocol: PROTOCOL_VERSION, ..Default::default() };
        frame::write_frame(&mut c, Body::Hello(hello)).await.unwrap();
        assert!(matches!(accept(&mut a, SECRET).await, Err(AuthError::Unexpected { got: "Hello", .. })));
        // An oversized first frame.
        let (mut a, mut c) = tokio::io::duplex(4096);
        c.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        assert!(matches!(accept(&mut a, SECRET).await, Err(AuthError::Frame(FrameError::TooLarge(..)))));
        // A short nonce.
        let (mut a, mut c) = tokio::io::duplex(4096);
        let ch = proto::Challenge { nonce: vec![7; 4], protocol: PROTOCOL_VERSION };
        frame::write_frame(&mut c, Body::Challenge(ch)).await.unwrap();
        assert!(matches!(accept(&mut a, SECRET).await, Err(AuthError::BadNonce(4))));
        // Another protocol version.
        let (mut a, mut c) = tokio::io::duplex(4096);
        let ch = proto::Challenge { nonce: vec![7; NONCE_LEN], protocol: PROTOCOL_VERSION + 1 };
        frame::write_frame(&mut c, Body::Challenge(ch)).await.unwrap();
        assert!(matches!(accept(&mut a, SECRET).await, Err(AuthError::Protocol(_))));
    }

    // In real time (HANDSHAKE_TIMEOUT, 10 s: beside the other tests), as tokio's paused time would
    // need its test-util feature, which would rebuild tokio and all above it for the tests.
    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let (mut a, _c) = tokio::io::duplex(4096);
        assert!(matches!(accept(&mut a, SECRET).await, Err(AuthError::Timeout)));
    }

    #[test]
    fn refusal_logging_is_bounded_per_window() {
        let mut r = Refusals::default();
        let t0 = Instant::now();
        for _ in 0..LOG_PER_WINDOW {
            assert_eq!(r.on_refusal(t0), Some(0));
        }
        assert_eq!(r.summary_due(), None);
        for i in 0..5 {
            assert_eq!(r.on_refusal(t0 + Duration::from_secs(1)), None);
            // The first refusal past the lines schedules the window's summary, the others not.
            assert_eq!(r.summary_due(), (i == 0).then_some(t0 + LOG_WINDOW));
        }
        assert_eq!(r.on_refusal(t0 + LOG_WINDOW), Some(5), "the next window's first line counts the quiet ones");
        assert_eq!(r.on_refusal(t0 + LOG_WINDOW), Some(0));
        // Without a next refusal, the summary at the window's end says them.
        for _ in 0..LOG_PER_WINDOW + 3 {
            r.on_refusal(t0 + 2 * LOG_WINDOW);
        }
        assert_eq!((r.summary(), r.summary()), (Some(3), None));
    }

    #[test]
    fn a_full_door_turns_out_its_oldest_holder_once_it_held_its_place_long_enough() {
        let mut h = Holders::default();
        let t0 = Instant::now();
        assert_eq!(h.turn_out(t0), Err(t0 + TURN_OUT_AFTER), "no holder: nothing to turn out");
        let (a, b) = (h.enter(t0), h.enter(t0 + Duration::from_millis(500)));
        assert_eq!(h.turn_out(t0 + Duration::from_secs(1)), Err(t0 + TURN_OUT_AFTER), "not yet: ask again then");
        assert_eq!(h.turn_out(t0 + TURN_OUT_AFTER), Ok(a), "the oldest, once it held its place long enough");
        h.leave(a);
        assert_eq!(h.turn_out(t0 + TURN_OUT_AFTER), Err(t0 + Duration::from_millis(500) + TURN_OUT_AFTER));
        h.leave(b);
        h.leave(b);
        assert_eq!(h.turn_out(t0 + TURN_OUT_AFTER * 10).ok(), None, "a holder that left is not turned out");
    }

    #[tokio::test]
    async fn connections_wait_for_a_place_and_a_silent_holder_is_turned_out_for_them() {
        let door = Door::new("job");
        let mut passes = Vec::new();
        for _ in 0..MAX_PENDING {
            passes.push(door.pass().await);
        }
        // Every place taken: the next waits; when the oldest has held its place too long, it is
        // turned out and its place is the next one's.
        let mut oldest = passes.remove(0);
        let next = tokio::spawn({
            let door = door.clone();
            async move { door.pass().await }
        });
        let silent = oldest.hold(std::future::pending::<Result<(), AuthError>>());
        assert!(matches!(silent.await, Err(AuthError::TurnedOut)));
        drop(oldest);
        let got = tokio::time::timeout(TURN_OUT_AFTER * 2, next).await;
        assert!(got.is_ok(), "the waiting connection got the place");
    }

    #[tokio::test]
    async fn a_peer_that_proved_the_secret_is_not_turned_out_while_its_first_frame_is_slow() {
        let door = Door::new("job");
        let secret = b"s3cret";
        let (mut a, mut c) = tokio::io::duplex(4096);
        let first = door.pass().await;
        let accepting = tokio::spawn(async move { accept_first(&mut a, secret, first).await });
        connect(&mut c, secret).await.unwrap();
        // Every other place taken, and one more waiting: without its place given back after the
        // proof, this connection would be the oldest holder and turned out.
        let mut others = Vec::new();
        for _ in 1..MAX_PENDING {
            others.push(door.pass().await);
        }
        let waiting = tokio::spawn({
            let door = door.clone();
            async move { door.pass().await }
        });
        // The peer, let in, is slow to say what it is (a client swapped out on a busy node).
        tokio::time::sleep(TURN_OUT_AFTER + Duration::from_millis(500)).await;
        let hello = proto::ClientHello { protocol: PROTOCOL_VERSION };
        frame::write_frame(&mut c, Body::ClientHello(hello)).await.unwrap();
        let got = accepting.await.unwrap();
        assert!(matches!(got, Ok(First::Client(_))), "{:?}", got.err());
        assert!(waiting.is_finished(), "the place it left was given to the waiting connection");
    }

    #[test]
    fn a_failing_accept_backs_off_instead_of_spinning() {
        let waits: Vec<u64> = (0..10).map(|n| accept_backoff(n).as_millis() as u64).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        assert_eq!(accept_backoff(u32::MAX), Duration::from_secs(1));
    }
}
