//! The relay side of an agent with children in the tree: accepts its direct children, checks
//! their Hellos here (so a stranger or a misplaced agent never reaches the leader), and hands
//! what they say, and what the agents below them say, to the agent's loop.

use std::collections::HashSet;

use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedSender;

use crate::auth::{self, RelayPlace};
use crate::frame::{self, read_frame, FrameError};
use htc_engine::msg::Up;
use htc_engine::wire::{self, proto, proto::frame::Body};

/// What a child connection tells the agent's loop.
pub enum Child {
    /// A direct child connected: its agent id and the sender for frames down to it.
    Open { child: u32, tx: UnboundedSender<Vec<u8>> },
    /// What a child (or an agent below it) says, to pass up.
    Up(Up),
    /// A direct child's connection ended; these agents (it and those below it) are gone.
    Closed { child: u32, agents: Vec<u32>, why: String },
}

/// Accepts children for as long as the agent lives.
pub fn listen(
    listener: std::net::TcpListener,
    place: RelayPlace,
    job_id: &str,
    secret: Vec<u8>,
    up: UnboundedSender<Child>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let door = auth::Door::new(job_id);
    tokio::spawn(async move {
        loop {
            // A place first: while every one is taken, connections wait in the listener's queue.
            let permit = door.pass().await;
            let (s, peer) = match listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    drop(permit);
                    door.accept_failed(&e).await;
                    continue;
                }
            };
            door.accepted();
            let (secret, door, up, place) = (secret.clone(), door.clone(), up.clone(), place.clone());
            tokio::spawn(async move {
                if let Err(e) = child_connection(s, permit, place, &secret, up).await {
                    door.refused(peer, &e);
                }
            });
        }
    });
    Ok(())
}

/// Serves one direct child: authenticates it and checks its Hello, then passes its frames up.
async fn child_connection(
    mut s: TcpStream,
    permit: auth::Pass,
    place: RelayPlace,
    secret: &[u8],
    up: UnboundedSender<Child>,
) -> Result<(), String> {
    frame::tune(&s).map_err(|e| e.to_string())?;
    let hello = auth::accept_hello(&mut s, secret, permit).await.map_err(|e| e.to_string())?;
    if let Err(why) = auth::check_hello(&hello, Some(&place)) {
        let reject = Body::Reject(proto::Reject { reason: why.clone(), agent_id: hello.agent_id });
        let _ = frame::write_frame(&mut s, reject).await;
        return Err(why);
    }
    let child = hello.agent_id;
    let mut buf = Vec::new();
    let (mut rd, wr) = s.into_split();
    let tx = frame::spawn_writer(wr);
    let _ = up.send(Child::Open { child, tx });
    let mut agents = HashSet::from([hello.agent_id]);
    let _ = up.send(Child::Up(Up::Hello(hello.into())));
    let why = loop {
        match read_frame(&mut rd, &mut buf).await.map(wire::up::up) {
            Ok(Some(said)) => {
                match &said {
                    Up::Hello(h) => {
                        agents.insert(h.agent);
                    }
                    Up::Lost { agent, .. } => {
                        agents.remove(agent);
                    }
                    Up::Report { .. } => {}
                }
                let _ = up.send(Child::Up(said));
            }
            Ok(None) => break "unexpected frame from agent".to_string(),
            Err(FrameError::Closed) => break "connection to its relay closed".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    let mut agents: Vec<u32> = agents.into_iter().collect();
    agents.sort_unstable();
    let _ = up.send(Child::Closed { child, agents, why });
    Ok(())
}
