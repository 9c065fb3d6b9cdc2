//! Strangers knocking on a running job: connections to the leader and to a relay agent without
//! the secret, with a wrong HMAC, with a replayed handshake, with an oversized frame and with
//! random bytes. Each is refused and logged, and the job's tasks finish, each exactly once.

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use htc::auth::{self, Nonces, Role, NONCE_LEN};
use htc::frame;
use htc::proto::{self, frame::Body};

use crate::common;
use common::{wait_some, Dir, HTC};

/// The leader's address, from the command line of one of the run's agents.
fn leader_addr(run: &Path) -> Option<SocketAddr> {
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Ok(cmd) = fs::read(e.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        let at = |flag: &[u8]| args.windows(2).find(|w| w[0] == flag).map(|w| w[1]);
        if at(b"--run-dir") == Some(run.as_os_str().as_encoded_bytes()) {
            return std::str::from_utf8(at(b"--leader")?).ok()?.parse().ok();
        }
    }
    None
}

fn encode(body: Body) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode_into(body, &mut out);
    out
}

fn challenge(nonce: [u8; NONCE_LEN]) -> Body {
    Body::Challenge(proto::Challenge { nonce: nonce.to_vec(), protocol: htc::PROTOCOL_VERSION })
}

/// Reads one frame with a deadline; `None` once the peer has closed the connection.
fn read_frame(s: &mut TcpStream) -> Option<Body> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).ok()?;
    frame::decode(&buf).ok()
}

fn server_nonce(s: &mut TcpStream) -> [u8; NONCE_LEN] {
    match read_frame(s) {
        Some(Body::Challenge(c)) => c.nonce.try_into().expect("a nonce of NONCE_LEN bytes"),
        other => panic!("expected the server's Challenge, got {other:?}"),
    }
}

fn open(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// The server must answer with nothing but (at most) a Reject, then close; never a Welcome, a
/// Proof or work.
fn assert_refused(mut s: TcpStream, what: &str) {
    let start = Instant::now();
    loop {
        match read_frame(&mut s) {
            None => break,
            Some(Body::Reject(_)) | Some(Body::Challenge(_)) => {}
            Some(other) => panic!("{what}: the server answered {other:?}"),
        }
    }
    assert!(start.elapsed() < Duration::from_secs(15), "{what}: took {:?} to be dropped", start.elapsed());
}

/// An honest client's handshake bytes for this server nonce, as a recorder on the wire sees them.
fn honest_handshake(secret: &[u8], server: [u8; NONCE_LEN]) -> Vec<u8> {
    let ours = auth::nonce().unwrap();
    let n = Nonces { accepting: server, connecting: ours };
    let mut bytes = encode(challenge(ours));
    bytes.extend(encode(Body::Proof(proto::Proof { mac: auth::proof(secret, Role::Connecting, &n) })));
    bytes
}

/// Every kind of stranger against one listening agent (the leader or a relay).
fn attack(addr: SocketAddr, secret: &[u8]) {
    // 1. No secret at all: the old protocol's Hello straight away.
    let mut s = open(addr);
    let hello = proto::Hello { agent_id: 1, cores: 1, protocol: htc::PROTOCOL_VERSION, ..Default::default() };
    s.write_all(&encode(Body::Hello(hello))).unwrap();
    assert_refused(s, "no secret");

    // 2. A wrong HMAC (a guessed secret).
    let mut s = open(addr);
    let server = server_nonce(&mut s);
    s.write_all(&honest_handshake(b"a guess at the job's secret.....", server)).unwrap();
    assert!(matches!(read_frame(&mut s), Some(Body::Reject(r)) if r.reason == "authentication failed"));
    assert_refused(s, "wrong HMAC");

    // 3. A replayed handshake: record an honest one (the test owns the run, so it has the secret),
    //    then play the same bytes to a new connection.
    let mut s = open(addr);
    let server = server_nonce(&mut s);
    let recorded = honest_handshake(secret, server);
    s.write_all(&recorded).unwrap();
    assert!(matches!(read_frame(&mut s), Some(Body::Proof(_))), "the honest handshake is accepted");
    drop(s);
    let mut s = open(addr);
    let _ = server_nonce(&mut s);
    s.write_all(&recorded).unwrap();
    assert!(matches!(read_frame(&mut s), Some(Body::Reject(_))));
    assert_refused(s, "replayed handshake");

    // 4. An oversized frame.
    let mut s = open(addr);
    s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    s.write_all(&[0u8; 1024]).unwrap();
    assert_refused(s, "oversized frame");

    // 5. Random bytes, then the end of the stream.
    let mut s = open(addr);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: Vec<u8> = (0..2000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let _ = s.write_all(&noise);
    let _ = s.shutdown(Shutdown::Write);
    assert_refused(s, "random bytes");
}

#[test]
fn strangers_are_refused_and_logged_and_the_job_is_unaffected() {
    let d = Dir::new("auth");
    let ids = d.0.join("ids.txt");
    let n = 600;
    let tasks: String = (0..n).map(|_| format!("sleep 0.02; echo $HTC_TASK_ID >> {}\n", ids.display())).collect();
    fs::write(d.0.join("tasks.txt"), tasks).unwrap();
    let stderr = fs::File::create(d.0.join("leader.err")).unwrap();
    // Fan-out 1 with 3 agents: agent 0 talks to the leader and relays for agent 1, which relays
    // for agent 2; so both kinds of listener are up.
    let mut leader = Command::new(HTC)
        .args(["run", "--agents", "3", "--fanout", "1", "--cores-per-agent", "1", "tasks.txt"])
        .current_dir(&d.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();

    let run =
        wait_some(Duration::from_secs(20), || fs::read_dir(d.0.join(".htc")).ok()?.flatten().next().map(|e| e.path()))
            .expect("a run directory");
    let leader_at = wait_some(Duration::from_secs(20), || leader_addr(&run)).expect("the leader's address");
    let relay_at: SocketAddr =
        wait_some(Duration::from_secs(20), || fs::read_to_string(run.join("tree/htc-addr-0")).ok())
            .expect("relay 0's address")
            .trim()
            .parse()
            .unwrap();
    let secret = fs::read(run.join("secret")).unwrap();
    assert!(leader.try_wait().unwrap().is_none(), "the run ended before the attacks; make it longer");

    attack(leader_at, &secret);
    attack(relay_at, &secret);
    assert!(leader.try_wait().unwrap().is_none(), "the run ended during the attacks; make it longer");

    let status = wait_some(Duration::from_secs(120), || leader.try_wait().unwrap()).expect("the run finishes");
    let leader_log = fs::read_to_string(d.0.join("leader.err")).unwrap();
    let relay_log = fs::read_to_string(run.join("log/agent-0.log")).unwrap();
    assert!(status.success(), "exit {status:?}\nleader:\n{leader_log}\nrelay:\n{relay_log}");

    let mut counts: HashMap<u64, usize> = HashMap::new();
    for l in fs::read_to_string(&ids).unwrap().lines() {
        *counts.entry(l.trim().parse().unwrap()).or_default() += 1;
    }
    assert_eq!(counts.len(), n, "every task ran");
    assert!(counts.values().all(|&c| c == 1), "a task ran twice: {counts:?}");

    // Each stranger is one log line, with its reason. The honest handshake that then closed
    // without a Hello is refused too.
    for (who, log) in [("leader", &leader_log), ("relay", &relay_log)] {
        let refused: Vec<&str> = log.lines().filter(|l| l.contains("connection refused")).collect();
        assert_eq!(refused.len(), 6, "{who} log:\n{log}");
        for reason in ["got Hello", "wrong proof", "exceeds", "closed"] {
            assert!(refused.iter().any(|l| l.contains(reason)), "{who}: no refusal mentioning {reason:?}:\n{log}");
        }
        let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        assert!(!log.contains(&hex), "{who} logged the secret");
    }
}
