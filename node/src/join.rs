//! Joining a running run from another allocation (`sbatch --htc-join=RUN`, `htc run --join
//! RUN`): the run directory says where its leader listens (`RunDir::leader_at`), the run's
//! secret proves this allocation is the run owner's, and the leader answers with the ids its
//! agents take. The connection stays open while the allocation lives; its close tells the leader
//! the allocation is gone.

use std::net::SocketAddr;

use htc_engine::wire::proto::{self, frame::Body};
use htc_store::rundir::RunDir;

use crate::{auth, frame};

/// What this allocation asks for.
#[derive(Debug, Clone)]
pub struct Request {
    /// This allocation's Slurm job id, or a local name.
    pub job: String,
    pub agents: u32,
    pub instance_size: u32,
    pub nodes: u32,
    pub cores: u64,
    /// When this allocation must be gone (its time limit less the grace), unix µs.
    pub ends_us: Option<u64>,
    /// Its Slurm cluster's name ("" locally).
    pub cluster: String,
    /// Its agents outlived the run's previous leader and keep these ids (`Attach.keep_first`).
    pub keep_first: Option<u32>,
}

/// A place in the run: the leader's address and this allocation's first agent id. Dropping it
/// closes the connection, which tells the leader this allocation is gone.
pub struct Joined {
    pub leader: SocketAddr,
    pub first_agent: u32,
    pub fanout: u32,
    /// The run's own job id.
    pub run_job: String,
    /// The job of the leader that took it in (as its address file names it).
    pub leader_job: String,
    /// Cores of the run's widest task, and its output mode ("": the default).
    pub widest_task: u64,
    pub output: String,
    /// Where the run's tasks run ("": not said).
    pub workdir: String,
    link: std::net::TcpStream,
}

impl Joined {
    /// Makes the run's working directory this process's, so that the agents it starts run
    /// their tasks where the run's other agents do (a task's relative paths mean the same on
    /// every node). Nothing for a run that did not say where.
    pub fn enter_workdir(&self) -> std::io::Result<()> {
        if self.workdir.is_empty() {
            return Ok(());
        }
        std::env::set_current_dir(&self.workdir)
    }

    /// Says on the returned channel when the leader's end of the link closes: the leader is gone
    /// (its job ended), or the run is over.
    pub fn leader_gone(&self) -> std::io::Result<std::sync::mpsc::Receiver<()>> {
        let mut link = self.link.try_clone()?;
        // The link came from tokio, non-blocking; this thread is its only reader.
        link.set_nonblocking(false)?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while matches!(std::io::Read::read(&mut link, &mut buf), Ok(n) if n > 0) {}
            let _ = tx.send(());
        });
        Ok(rx)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("{run}: not a run this user can read ({source})")]
    Unreadable { run: String, source: std::io::Error },
    #[error("{run}: the run is not running (no leader listens: it ended, or has not started)")]
    NotRunning { run: String },
    #[error("{run}: the run is on cluster '{theirs}', this job on '{ours}'")]
    OtherCluster { run: String, theirs: String, ours: String },
    #[error("{run}: its leader at {addr} does not answer ({source}); the run may have ended")]
    NoAnswer { run: String, addr: SocketAddr, source: std::io::Error },
    #[error("{run}: the leader at {addr} did not accept this run's secret ({why})")]
    Secret { run: String, addr: SocketAddr, why: String },
    #[error("{run}: the leader refused: {why}")]
    Refused { run: String, why: String },
}

/// Finds the run's leader and asks it for a place for `req`'s agents.
pub fn attach(run: &RunDir, req: &Request) -> Result<Joined, JoinError> {
    let name = run.path.display().to_string();
    let unreadable = |source| JoinError::Unreadable { run: name.clone(), source };
    let at = run.leader_at().map_err(unreadable)?.ok_or_else(|| JoinError::NotRunning { run: name.clone() })?;
    if at.cluster != req.cluster {
        return Err(JoinError::OtherCluster { run: name, theirs: at.cluster, ours: req.cluster.clone() });
    }
    let secret = run.read_secret().map_err(unreadable)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(unreadable)?;
    let (stream, attached) = rt.block_on(ask(at.addr, &secret, req, &name))?;
    let link = stream.into_std().map_err(unreadable)?;
    Ok(Joined {
        leader: at.addr,
        first_agent: attached.first_agent,
        fanout: attached.fanout.max(1),
        run_job: attached.job_id,
        leader_job: at.job,
        widest_task: attached.widest_task,
        output: attached.output,
        workdir: attached.workdir,
        link,
    })
}

async fn ask(
    addr: SocketAddr,
    secret: &[u8],
    req: &Request,
    run: &str,
) -> Result<(tokio::net::TcpStream, proto::Attached), JoinError> {
    let no_answer = |source| JoinError::NoAnswer { run: run.to_string(), addr, source };
    let mut s = tokio::time::timeout(auth::HANDSHAKE_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| no_answer(std::io::ErrorKind::TimedOut.into()))?
        .map_err(no_answer)?;
    auth::connect(&mut s, secret).await.map_err(|e| JoinError::Secret {
        run: run.to_string(),
        addr,
        why: e.to_string(),
    })?;
    let attach = proto::Attach {
        protocol: htc_engine::wire::PROTOCOL_VERSION,
        job_id: req.job.clone(),
        agents: req.agents,
        instance_size: req.instance_size,
        nodes: req.nodes,
        cores: req.cores,
        ends_us: req.ends_us.unwrap_or(0),
        cluster: req.cluster.clone(),
        keep_first: req.keep_first.unwrap_or(0),
    };
    frame::write_frame(&mut s, Body::Attach(attach))
        .await
        .map_err(|e| no_answer(std::io::Error::other(e.to_string())))?;
    let mut buf = Vec::new();
    let answer = tokio::time::timeout(auth::HANDSHAKE_TIMEOUT, frame::read_frame(&mut s, &mut buf))
        .await
        .map_err(|_| no_answer(std::io::ErrorKind::TimedOut.into()))?;
    match answer {
        Ok(Body::Attached(a)) => Ok((s, a)),
        Ok(Body::Reject(r)) => Err(JoinError::Refused { run: run.to_string(), why: r.reason }),
        Ok(_) => Err(JoinError::Refused { run: run.to_string(), why: "an unexpected answer".into() }),
        Err(e) => Err(no_answer(std::io::Error::other(e.to_string()))),
    }
}
