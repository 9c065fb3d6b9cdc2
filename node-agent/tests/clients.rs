//! Many clients of an open run at once, as a shell loop with `&`, `xargs -P` or a workflow
//! manager's command back end starts them: every one gets in (load is answered with waiting),
//! silent strangers do not keep them out, and a stopped leader is waited for, then given up on
//! with a message that says so.

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::common;
use common::{wait_for, Dir, HTC};

fn open_run(d: &Dir) -> (Child, String) {
    let leader = d.spawn_htc(&["run", "--open", "-q", "--agents", "1", "--cores-per-agent", "2"], &[]);
    assert!(wait_for(|| d.leader_listens(), Duration::from_secs(30)), "the open run's leader never listened");
    (leader, d.run_id())
}

fn leader_addr(d: &Dir) -> SocketAddr {
    let text = std::fs::read_to_string(d.run_dir().join("leader.addr")).unwrap();
    text.lines().find_map(|l| l.strip_prefix("addr=")).unwrap().parse().unwrap()
}

fn client(d: &Dir, args: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(HTC)
        .args(args)
        .current_dir(&d.0)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Exit status, stdout and stderr of a client started with `client`.
fn finish(c: Child) -> (i32, String, String) {
    let o = c.wait_with_output().unwrap();
    let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.code().unwrap_or(-1), s(&o.stdout), s(&o.stderr))
}

/// Clients that start together: each waits for a line of the FIFO `gate` (which `release` writes
/// for all of them at once), then becomes `htc ARGS`.
struct Gate {
    path: std::path::PathBuf,
    fifo: std::fs::File,
    held: usize,
}

impl Gate {
    fn new(d: &Dir) -> Gate {
        let path = d.0.join("gate");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        // Read and write: opening does not wait for a reader, and the lines stay for a client
        // that reaches its read late.
        let fifo = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        Gate { path, fifo, held: 0 }
    }

    fn client(&mut self, d: &Dir, args: &[&str]) -> Child {
        self.held += 1;
        let mut c = Command::new("sh");
        c.arg("-c").arg(r#"read _ < "$0" && exec "$@""#).arg(&self.path).arg(HTC).args(args);
        c.current_dir(&d.0).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().unwrap()
    }

    fn release(&mut self) {
        use std::io::Write;
        // Most are at their read by now; one write lets them all go.
        std::thread::sleep(Duration::from_millis(500));
        self.fifo.write_all(&vec![b'\n'; self.held]).unwrap();
    }
}

#[test]
fn hundreds_of_clients_at_once_are_all_let_in_with_distinct_ids() {
    let d = Dir::new("clients-many");
    let (mut leader, run) = open_run(&d);
    let n = 300;
    // Adds, statuses and waits side by side, all let go at once.
    let mut gate = Gate::new(&d);
    let adds: Vec<Child> = (0..n).map(|_| gate.client(&d, &["task", "add", &run, "--", "true"])).collect();
    let others: Vec<Child> = (0..n / 3)
        .flat_map(|_| {
            [
                gate.client(&d, &["task", "status", &run, "--all"]),
                gate.client(&d, &["task", "wait", &run, "--all", "--timeout", "60s"]),
            ]
        })
        .collect();
    // The leader held up (stopped, or starved of CPU) while they come: when it goes on, all of
    // them knock at once, as they would on a machine with many more cores than this one.
    let pid = Pid::from_raw(leader.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    gate.release();
    std::thread::sleep(Duration::from_secs(1));
    kill(pid, Signal::SIGCONT).unwrap();
    let mut ids = Vec::new();
    let mut failed = Vec::new();
    for c in adds {
        match finish(c) {
            (0, out, _) => ids.push(out.trim().parse::<u64>().unwrap()),
            other => failed.push(other),
        }
    }
    for c in others {
        let (rc, out, err) = finish(c);
        // Every task succeeds, so a wait ends 0 too.
        if rc != 0 {
            failed.push((rc, out, err));
        }
    }
    assert!(failed.is_empty(), "{} of {} clients failed, e.g. {:?}", failed.len(), n + 2 * (n / 3), &failed[..1]);
    ids.sort_unstable();
    assert_eq!(ids, (1..=n as u64).collect::<Vec<_>>(), "one task each, every id once");
    let (rc, _, err) = finish(client(&d, &["close", &run], &[]));
    assert_eq!(rc, 0, "{err}");
    assert!(leader.wait().unwrap().success());
}

#[test]
fn silent_strangers_do_not_keep_the_run_s_clients_out() {
    let d = Dir::new("clients-strangers");
    let (mut leader, run) = open_run(&d);
    let addr = leader_addr(&d);
    // More strangers than the leader holds in their handshake at once (64), each saying
    // nothing: they would hold every place for the handshake's 10 s.
    let strangers: Vec<TcpStream> = (0..150).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let (rc, out, err) = finish(client(&d, &["task", "add", &run, "--", "true"], &[]));
    let took = t0.elapsed();
    assert_eq!((rc, out.as_str()), (0, "1\n"), "{err}");
    // Turned out two seconds after they took their place, 64 at a time: the client is in
    // after about three rounds, not refused and not after every stranger's full timeout.
    assert!(took < Duration::from_secs(20), "the client got in after {took:?}");
    drop(strangers);
    let (rc, _, err) = finish(client(&d, &["close", &run], &[]));
    assert_eq!(rc, 0, "{err}");
    assert!(leader.wait().unwrap().success());
}

#[test]
fn a_stopped_leader_is_waited_for_then_given_up_on_and_a_continued_one_answers() {
    let d = Dir::new("clients-stopped");
    let (mut leader, run) = open_run(&d);
    kill(Pid::from_raw(leader.id() as i32), Signal::SIGSTOP).unwrap();
    let t0 = Instant::now();
    let (rc, _, err) = finish(client(&d, &["task", "add", &run, "--", "true"], &[("HTC_CLIENT_PATIENCE", "7")]));
    let took = t0.elapsed();
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("waiting for the leader"), "it says that it waits: {err}");
    assert!(err.contains("busy, or stopped") && !err.contains("secret"), "{err}");
    assert!(took >= Duration::from_secs(6) && took < Duration::from_secs(15), "gave up after {took:?}");
    // Continued while a client waits: the client gets in.
    let waiting = client(&d, &["task", "add", &run, "--", "true"], &[]);
    std::thread::sleep(Duration::from_secs(2));
    kill(Pid::from_raw(leader.id() as i32), Signal::SIGCONT).unwrap();
    let (rc, out, err) = finish(waiting);
    assert_eq!((rc, out.as_str()), (0, "1\n"), "{err}");
    let (rc, _, err) = finish(client(&d, &["close", &run], &[]));
    assert_eq!(rc, 0, "{err}");
    assert!(leader.wait().unwrap().success());
}
