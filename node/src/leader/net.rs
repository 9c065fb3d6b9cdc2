//! The leader's network side: accepts agent connections, authenticates them (`auth`), then
//! shuttles frames between the socket and the core thread.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};

use super::core::Input;
use super::driver::Event;
use crate::auth::{self, Door};
use crate::frame::{self, read_frame, FrameError};
use htc_engine::msg::{Came, Hello, Stop, ToAgent};
use htc_engine::wire::proto::{self, frame::Body};

pub struct NetConfig {
    pub secret: Vec<u8>,
    pub job_id: String,
    /// The Slurm cluster the run's leader is on ("" locally): a joining allocation must be too.
    pub cluster: String,
    /// The run's tree fan-out, which a joining allocation's heads follow.
    pub fanout: u32,
    /// What a joining allocation's agents must know of the run: its widest task's cores and
    /// its output mode.
    pub widest_task: u64,
    pub output: String,
    /// Where the run's tasks run: a joining allocation's run there too.
    pub workdir: String,
    /// Agents connected now, directly or through a relay, with the connection they came over; a
    /// second Hello for one is refused.
    joined: Mutex<HashMap<u32, u64>>,
    next_connection: AtomicU64,
    /// A child sent nothing by the core thread for this long gets a heartbeat from here.
    heartbeat: std::time::Duration,
}

impl NetConfig {
    pub fn new(secret: Vec<u8>, job_id: String, heartbeat: std::time::Duration) -> NetConfig {
        NetConfig {
            secret,
            job_id,
            cluster: String::new(),
            fanout: 1,
            widest_task: 1,
            output: String::new(),
            workdir: String::new(),
            joined: Default::default(),
            next_connection: AtomicU64::new(1),
            heartbeat,
        }
    }

    /// The core gave `agent` up: its connection (often still open, its network cut or its
    /// process stopped) no longer holds its place, so the agent can come back fresh at once. The
    /// old connection stops carrying its reports and ends without telling the core again.
    pub fn give_up(&self, agent: u32) {
        self.lock().remove(&agent);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, u64>> {
        self.joined.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `agent` is still joined over connection `conn`.
    fn holds(&self, agent: u32, conn: u64) -> bool {
        self.lock().get(&agent) == Some(&conn)
    }
}

/// Accepts connections until the process ends; each connection runs in its own task, so a slow
/// or hostile peer never holds up the others.
pub async fn serve(listener: TcpListener, cfg: Arc<NetConfig>, core: mpsc::Sender<Event>) {
    let door = Door::new(&cfg.job_id);
    loop {
        // A place first: while every one is taken, connections wait in the listener's queue.
        let pass = door.pass().await;
        match listener.accept().await {
            Ok((stream, peer)) => {
                door.accepted();
                let (cfg, core, door) = (cfg.clone(), core.clone(), door.clone());
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, peer, pass, &cfg, core).await {
                        door.refused(peer, &e);
                    }
                });
            }
            Err(e) => {
                drop(pass);
                door.accept_failed(&e).await
            }
        }
    }
}

/// Checks a Hello (the connecting agent's own, or one relayed from below it). The connection it
/// came over is authenticated; this guards against two agents claiming one id.
fn admit(h: &proto::Hello, cfg: &NetConfig, conn: u64) -> Result<(), String> {
    auth::check_hello(h, None)?;
    let mut joined = cfg.lock();
    // A rejoin brings the agents below it along: none of them may be connected still (the old
    // relay's connection is closed first; until then the rejoining agent retries).
    let below = if h.rejoin { &h.below[..] } else { &[] };
    if let Some(a) = std::iter::once(&h.agent_id).chain(below).find(|a| joined.contains_key(a)) {
        return Err(format!("agent {a} is already connected"));
    }
    for &a in std::iter::once(&h.agent_id).chain(below) {
        joined.insert(a, conn);
    }
    Ok(())
}

fn encoded(body: Body) -> Vec<u8> {
    let mut b = Vec::new();
    frame::encode_into(body, &mut b);
    b
}

// Long (about 95 lines): a connection's whole life (handshake, Hello, the join, then frames until
// it ends, and the losses it causes) in the order the protocol has it.
/// One connection from a direct child: its own agent plus every agent it relays for. Errors are
/// refusals before the child joined; after that, a broken connection loses its agents.
async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    permit: auth::Pass,
    cfg: &NetConfig,
    core: mpsc::Sender<Event>,
) -> Result<(), String> {
    frame::tune(&stream).map_err(|e| e.to_string())?;
    let hello = match auth::accept_first(&mut stream, &cfg.secret, permit).await.map_err(|e| e.to_string())? {
        auth::First::Hello(h) => h,
        auth::First::Attach(a) => return allocation(stream, a, cfg, core).await,
        auth::First::Client(c) => return super::clients::serve(stream, c, core).await,
    };
    let conn = cfg.next_connection.fetch_add(1, Ordering::Relaxed);
    if let Err(why) = admit(&hello, cfg, conn) {
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
    // An Ack of nothing new is a heartbeat: sent from here when the core thread sent nothing.
    let mut keepalive = Vec::new();
    let beat = ToAgent::Ack { seq: 0 };
    htc_engine::wire::down::frames(hello.agent_id, beat, |body| frame::encode_into(body, &mut keepalive));
    let tx = frame::spawn_writer_with_keepalive(wr, cfg.heartbeat, keepalive);
    let mut agents: HashSet<u32> = HashSet::new();
    // The agent at the other end; the others it relays for may rejoin around its loss.
    let direct = hello.agent_id;
    let mut pending = Some(hello);
    let why = loop {
        if let Some(h) = pending.take() {
            let agent = h.agent_id;
            agents.insert(agent);
            let _ = tx.send(encoded(Body::Welcome(proto::Welcome { job_id: cfg.job_id.clone(), agent_id: agent })));
            let hello = Hello::from(h);
            if let Came::Rejoin { below } = &hello.came {
                agents.extend(below);
            }
            let joined = Event::Joined(Input::from(hello), tx.clone());
            if core.send(joined).is_err() {
                // The run ended before this agent's join reached the core (a short run, a
                // resume with nothing left): it is told to go, not left to reconnect, refused
                // as still connected, until the leader's last wait kills it.
                let bye = ToAgent::Shutdown { stop: Stop::Finish, reason: "the run has ended".into() };
                htc_engine::wire::down::frames(agent, bye, |body| drop(tx.send(encoded(body))));
                let mut joined = cfg.lock();
                for a in agents.iter().filter(|a| joined.get(a) == Some(&conn)).copied().collect::<Vec<_>>() {
                    joined.remove(&a);
                }
                return Ok(());
            }
        }
        match read_frame(&mut rd, &mut buf).await {
            Ok(Body::Report(report)) if agents.contains(&report.agent) => {
                if !cfg.holds(report.agent, conn) {
                    // Given up: what it says over this connection is stale.
                    if report.agent == direct {
                        break "given up".to_string();
                    }
                    continue;
                }
                let input = Input::Report { agent: report.agent, report: report.into() };
                if core.send(Event::Core(input)).is_err() {
                    return Ok(());
                }
            }
            Ok(Body::Report(report)) => {
                tracing::warn!(agent = report.agent, "report for an agent not behind this connection dropped")
            }
            Ok(Body::Hello(h)) => match admit(&h, cfg, conn) {
                Ok(()) => pending = Some(h),
                Err(why) => {
                    tracing::warn!(job = %cfg.job_id, agent = h.agent_id, %why, "relayed agent refused");
                    let _ = tx.send(encoded(Body::Reject(proto::Reject { reason: why, agent_id: h.agent_id })));
                }
            },
            Ok(Body::Lost(l)) => {
                if agents.remove(&l.agent) && cfg.holds(l.agent, conn) {
                    cfg.lock().remove(&l.agent);
                    let _ = core.send(Event::Core(Input::Lost { agent: l.agent, why: l.reason }));
                }
            }
            Ok(_) => break "unexpected frame from agent".to_string(),
            Err(FrameError::Closed) => break "connection closed".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    // Held while the core hears of it, so a rejoin (admitted under this lock) comes after. An
    // agent given up, or joined again over another connection since, is not this one's to lose.
    let mut joined = cfg.lock();
    for agent in agents {
        if joined.get(&agent) != Some(&conn) {
            continue;
        }
        joined.remove(&agent);
        let input = if agent == direct { Input::Lost { agent, why: why.clone() } } else { Input::Detached { agent } };
        let _ = core.send(Event::Core(input));
    }
    Ok(())
}

/// A joining allocation's launcher: asks the core for its agents' ids and answers, then holds
/// the connection while the allocation lives; its close tells the core the allocation is gone.
async fn allocation(
    mut stream: TcpStream,
    a: proto::Attach,
    cfg: &NetConfig,
    core: mpsc::Sender<Event>,
) -> Result<(), String> {
    let first_agent = match admit_allocation(&a, cfg, &core).await {
        Ok(first) => first,
        Err(why) => {
            let reject = proto::Reject { reason: why.clone(), agent_id: 0 };
            let _ = frame::write_frame(&mut stream, Body::Reject(reject)).await;
            return Err(why);
        }
    };
    let attached = proto::Attached {
        first_agent,
        fanout: cfg.fanout,
        job_id: cfg.job_id.clone(),
        widest_task: cfg.widest_task,
        output: cfg.output.clone(),
        workdir: cfg.workdir.clone(),
    };
    frame::write_frame(&mut stream, Body::Attached(attached)).await.map_err(|e| e.to_string())?;
    tracing::info!(job = %cfg.job_id, allocation = %a.job_id, first_agent, agents = a.agents, "an allocation joined");
    // Nothing more is said on it: it ends with the allocation's launcher.
    let mut buf = Vec::new();
    while read_frame(&mut stream, &mut buf).await.is_ok() {}
    let _ = core.send(Event::AllocationGone(a.job_id));
    Ok(())
}

/// The checks of an Attach that are the network side's (protocol, cluster), then the core's
/// answer: the allocation's first agent id, or why it may not join.
async fn admit_allocation(a: &proto::Attach, cfg: &NetConfig, core: &mpsc::Sender<Event>) -> Result<u32, String> {
    if a.protocol != htc_engine::wire::PROTOCOL_VERSION {
        return Err(format!(
            "protocol {} not supported (the run speaks {})",
            a.protocol,
            htc_engine::wire::PROTOCOL_VERSION
        ));
    }
    if a.cluster != cfg.cluster {
        return Err(format!("the run is on cluster '{}', the joining job on '{}'", cfg.cluster, a.cluster));
    }
    let req = super::core::allocation::Attach {
        job: a.job_id.clone(),
        agents: a.agents,
        instance_size: a.instance_size.max(1),
        fanout: cfg.fanout,
        nodes: a.nodes,
        ends_us: (a.ends_us > 0).then_some(a.ends_us),
        keep_first: (a.keep_first > 0).then_some(a.keep_first),
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    core.send(Event::Attach(req, tx)).map_err(|_| "the run is ending".to_string())?;
    rx.await.unwrap_or_else(|_| Err("the run is ending".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(agent: u32) -> proto::Hello {
        proto::Hello { protocol: htc_engine::wire::PROTOCOL_VERSION, agent_id: agent, ..Default::default() }
    }

    #[test]
    fn an_agent_given_up_can_come_back_at_once_and_its_old_connection_speaks_for_it_no_more() {
        let cfg = NetConfig::new(b"secret".to_vec(), "job".into(), std::time::Duration::from_millis(250));
        admit(&hello(2), &cfg, 1).unwrap();
        assert!(cfg.holds(2, 1));
        // Still connected: a second Hello for it is refused.
        assert_eq!(admit(&hello(2), &cfg, 2).unwrap_err(), "agent 2 is already connected");
        // Given up while its old connection stays open (a cut link): it is admitted again.
        cfg.give_up(2);
        admit(&hello(2), &cfg, 3).unwrap();
        assert!(cfg.holds(2, 3) && !cfg.holds(2, 1), "only the new connection speaks for it");
    }
}
