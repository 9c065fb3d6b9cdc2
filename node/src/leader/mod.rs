//! The leader (1st-level instance): owns the ledger, partitions the tasks, and serves the agents.
//! `core` is the scheduling state machine (no I/O), `driver` runs it against the ledger and the
//! agents' connections and carries out its `effect`s, `net` the sockets, `launch` how agents are started (`srun` under Slurm),
//! `grow` a run that grows itself.

pub mod clients;
pub mod driver;
pub mod grow;
pub mod launch;
pub mod net;
pub mod session;
pub mod srun;
pub mod srun_output;
pub use htc_engine::leader::{core, effect, plan};

use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::Context;
use htc_core::hflow::Params;
use htc_core::partition::{Group, Grouper, Plan};
use htc_core::task::State;
use htc_core::tree::Tree;

pub use self::core::Ending;
use self::core::{Core, Progress};
pub use self::driver::ProgressSink;
use self::driver::{DriverConfig, Event};
use htc_engine::liveness::Liveness;
use htc_store::ledger::Ledger;
use htc_store::load::TaskText;
use htc_store::rundir::RunDir;

pub struct LeaderConfig {
    pub run: RunDir,
    pub job_id: String,
    /// Where to listen: loopback for local runs, all interfaces under Slurm.
    pub bind: SocketAddr,
    /// The address agents are told to connect to when `bind` is a wildcard.
    pub advertise: Option<std::net::IpAddr>,
    pub commit_interval: Duration,
    /// Where progress is shown while the run goes (`status::sink`), if anywhere.
    pub progress: Option<Box<dyn ProgressSink>>,
    /// How tasks are split among the agents (`--partition`).
    pub partition: Plan,
    /// The site's calibration (instance start, dispatch, default runtime).
    pub params: Params,
    /// Cores of all agents together, as far as known before they join (eq. 10 uses it).
    pub cores: u64,
    /// The agents' tree and instances, as the launcher lays them out.
    pub layout: Arc<Tree>,
    /// Its fan-out, which the heads of allocations that join the run follow.
    pub fanout: u32,
    /// Heartbeats and the bound on silent agents (the site's `lost_after_s`).
    pub live: Liveness,
    /// Fail fast: start nothing more once this many tasks failed (`--max-fails`).
    pub max_fails: Option<u64>,
    /// Start no task whose runtime hint would not end by then (unix µs): the job's end.
    pub deadline_us: Option<u64>,
    /// How memory decides what starts (`--mem-policy`).
    pub mem_policy: htc_core::backfill::Policy,
    /// No instance takes from another's share (`--no-steal`, for measurements).
    pub no_steal: bool,
    /// Under Slurm, the leader's node name (`SLURMD_NODENAME`), when the run gives back the
    /// nodes of its own allocation that nothing is left for (`core::give_back`); `None`: it
    /// keeps them to the end.
    pub give_back_from: Option<String>,
    /// How long a node of an open run stands idle before it is given back (the site's
    /// `open_idle_give_back_s`).
    pub open_idle_give_back: Duration,
    /// A run that grows itself (`--htc-grow`): its policy and how it submits.
    pub grow: Option<grow::Growing>,
    /// This session took the run over with agents that kept their tasks (`Core::expecting_handover`).
    pub handover: Option<Handover>,
    /// Called once the leader's address is in the run directory, when clients can find the run:
    /// `htc run --open` prints the run's id then.
    pub published: Option<Box<dyn FnOnce() + Send>>,
}

/// A session that took the run over expects agents that kept their tasks: its own, and
/// `others` of the run's other joined jobs; it waits up to `wait` for them to say what they
/// hold before it hands anything out. `awaiting`: what the agents journaled of the attempts
/// that wait for their word (`continuation::awaited_starts`); those no agent brings back are
/// recorded interrupted once the wait is over.
#[derive(Debug, Clone)]
pub struct Handover {
    pub wait: Duration,
    pub others: usize,
    pub awaiting: Vec<htc_core::salvage::Told>,
}

pub struct Outcome {
    pub ending: Ending,
    pub progress: Progress,
}

/// Runs the leader until the run ends. `launch` starts the agents once the listener's address is
/// known and returns how many it started.
pub fn run(
    cfg: LeaderConfig,
    launch: impl FnOnce(SocketAddr, mpsc::Sender<Event>) -> anyhow::Result<launch::Agents>,
) -> anyhow::Result<Outcome> {
    let ledger = open_ledger(&cfg)?;
    let text = TaskText::open(&cfg.run.tasks()).context("mapping the run's task file")?;
    let secret = cfg.run.read_secret().context("reading the job secret")?;

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (listener, addr) = listen(&cfg, &rt)?;
    let (tx, rx) = mpsc::channel::<Event>();
    let mut agents = launch(addr, tx.clone()).context("starting the agents")?;
    // Only instance heads join the leader; each is one instance of the partition.
    let expected = cfg.layout.heads().len().min(agents.count);

    let core = configured_core(&ledger, &cfg, expected)?;
    // The network side's own heartbeat stands in only while the core thread is late with its
    // own (a long commit): a heartbeat after the core's would be sent as often as the acks.
    let heartbeat = Duration::from_micros(cfg.live.beat_every_us(expected) + cfg.live.heartbeat_us);
    let net_cfg = net_config(&ledger, &cfg, secret, heartbeat)?;
    let at = htc_store::rundir::LeaderAt { addr, job: cfg.job_id.clone(), cluster: net_cfg.cluster.clone() };
    let net_cfg = Arc::new(net_cfg);
    // From here allocations may join the run (`--join`), until the session ends.
    cfg.run.publish_leader(&at).context("publishing the leader's address in the run directory")?;
    if let Some(published) = cfg.published {
        published();
    }
    let run_dir = cfg.run.clone();
    let evict = net_cfg.clone();
    let driver_cfg = DriverConfig {
        commit_interval: cfg.commit_interval,
        progress: cfg.progress,
        live_dir: Some(cfg.run.path.clone()),
        given_up: Some(Box::new(move |agent| evict.give_up(agent))),
        signalled: std::env::var("SLURM_JOB_ID").ok().map(|job| ask_grace(job, tx.clone())),
        give_back: cfg.give_back_from.as_ref().map(|_| shrink_job(cfg.job_id.clone(), cfg.run.path.clone())),
        grow: cfg.grow.map(|mut g| {
            let tx = tx.clone();
            g.answer_to(move |a| {
                let _ = tx.send(Event::Grow(a));
            });
            g
        }),
        durable: true,
    };

    let result = std::thread::scope(|s| {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let core_thread = s.spawn(move || {
            let r = driver::run(core, &ledger, &text, &cfg.job_id, rx, driver_cfg);
            run_dir.unpublish_leader();
            // The journal already holds everything; a last snapshot makes reading it back quick.
            htc_store::replica::new_generation(&ledger);
            let _ = done_tx.send(());
            r
        });
        rt.block_on(async {
            let server = tokio::spawn(net::serve(listener, net_cfg, tx.clone()));
            let signals = tokio::spawn(forward_signals(tx.clone()));
            drop(tx);
            let _ = done_rx.await;
            // Give agents time to receive Shutdown, finish and close.
            let _ = tokio::task::spawn_blocking(move || agents.wait(Duration::from_secs(15))).await;
            server.abort();
            signals.abort();
        });
        core_thread.join().expect("leader core thread panicked")
    });
    let (ending, progress) = result?;
    Ok(Outcome { ending, progress })
}

/// The run's ledger, its journal attached when the run is replicated.
fn open_ledger(cfg: &LeaderConfig) -> anyhow::Result<Ledger> {
    let mut ledger = Ledger::open(&cfg.run.ledger(), false).context("opening the ledger")?;
    if cfg.run.replicated() {
        // This session's generation starts with the ledger as it is now (loaded, or resumed).
        let replica = htc_store::replica::Replica::of(&cfg.run.path);
        let journal = replica.begin(&ledger).context("writing the ledger's snapshot into the run directory")?;
        ledger.attach_journal(journal);
        replica.set_where(&cfg.run.ledger())?;
    }
    Ok(ledger)
}

/// The agents' listener on `rt`, and the address they are told to reach it at.
fn listen(cfg: &LeaderConfig, rt: &tokio::runtime::Runtime) -> anyhow::Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = crate::slurm::listen(cfg.bind).with_context(|| format!("listening on {}", cfg.bind))?;
    listener.set_nonblocking(true)?;
    let listener = {
        let _guard = rt.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let mut addr = listener.local_addr()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(cfg.advertise.unwrap_or(std::net::Ipv4Addr::LOCALHOST.into()));
    }
    Ok((listener, addr))
}

/// What the network side tells the agents that join: the job, the tree's fan-out, the widest
/// task, where the run works and how its output is kept.
fn net_config(
    ledger: &Ledger,
    cfg: &LeaderConfig,
    secret: Vec<u8>,
    heartbeat: Duration,
) -> anyhow::Result<net::NetConfig> {
    let mut net_cfg = net::NetConfig::new(secret, cfg.job_id.clone(), heartbeat);
    net_cfg.cluster = crate::slurm::cluster_name();
    net_cfg.fanout = cfg.fanout.max(1);
    net_cfg.widest_task = htc_store::load::widest_task(ledger)?;
    net_cfg.workdir = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default();
    net_cfg.output =
        ledger.read()?.meta("output")?.map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
    Ok(net_cfg)
}

/// The core for this session: planned for the `expected` instances, with the run's options.
fn configured_core(ledger: &Ledger, cfg: &LeaderConfig, expected: usize) -> anyhow::Result<Core<'static>> {
    let plan = Planned { plan: cfg.partition, instances: expected, cores: cfg.cores, params: cfg.params };
    let mut core = new_core(ledger, &plan, &cfg.job_id, htc_host::steady_us())?
        .with_layout(cfg.layout.clone())
        .with_liveness(cfg.live)
        .with_memory_policy(cfg.mem_policy);
    if cfg.no_steal {
        core = core.without_stealing();
    }
    if let Some(node) = &cfg.give_back_from {
        core =
            core.giving_back_nodes(node.clone()).open_idle_before_give_back(cfg.open_idle_give_back.as_micros() as u64);
    }
    if let Some(n) = cfg.max_fails {
        core = core.with_max_fails(n);
    }
    if let Some(end) = cfg.deadline_us {
        core = core.with_deadline(end);
    }
    if let Some(h) = &cfg.handover {
        core = core.expecting_handover(h.wait.as_micros() as u64, h.others, h.awaiting.clone());
    }
    if let Some(o) = htc_store::load::open_run(ledger)? {
        core = core.open(o.idle_exit_ms.map(|ms| ms * 1000));
    }
    Ok(core)
}

/// What the leader's core is built from besides the ledger.
#[derive(Debug, Clone)]
pub struct Planned {
    pub plan: Plan,
    /// Instances expected to join (their heads, or every agent when each is one).
    pub instances: usize,
    /// Their cores together.
    pub cores: u64,
    pub params: Params,
}

/// The scheduling core for the run in `ledger`: its partition, counts and horizon. Every driver
/// (a real run, and `htc simulate`) builds it here, so they all decide alike.
pub fn new_core(ledger: &Ledger, p: &Planned, job_id: &str, now_us: u64) -> anyhow::Result<Core<'static>> {
    let (total, counts, hinted, exclusive) = {
        let r = ledger.read()?;
        (r.meta_u64("total")?.unwrap_or(0), r.counts()?, r.meta_u64("hinted")?, r.meta_u64("exclusive")?)
    };
    let groups = if p.plan == Plan::Even { None } else { pending_groups(ledger).context("planning the partition")? };
    let partition = plan::partition(total, p.plan, p.instances.max(1), p.cores, p.params, groups);
    let mut core = Core::new(partition, job_id.to_string(), p.instances, counts, now_us);
    // Runs loaded before the count was kept: assume hints, the safe side for long tasks.
    if hinted.is_none_or(|n| n > 0) {
        core = core.with_horizon(self::core::HORIZON_MS);
    }
    if exclusive.is_some_and(|n| n > 0) {
        core = core.with_exclusive_tasks();
    }
    Ok(core)
}

/// The runtime groups of the tasks still to run (after a resume the plan splits what is left),
/// or `None` when the file has one group and nothing need be read.
fn pending_groups(ledger: &Ledger) -> Result<Option<Vec<Group>>, htc_store::ledger::LedgerError> {
    let read = ledger.read()?;
    if read.meta_u64("groups")? == Some(1) {
        return Ok(None);
    }
    let mut grouper = Grouper::default();
    read.for_each(|id, r| {
        if r.state() == State::Pending {
            grouper.add(id, r.shape().priority, r.shape().class, r.shape().runtime_ms);
        }
    })?;
    Ok(Some(grouper.finish()))
}

/// An agent of job `job` was signalled: Slurm signals a preempted job's steps, not its batch
/// script, so the leader hears of a preemption's grace from its agents. The ask (one controller
/// RPC) runs beside the loop; a grace found comes back as an input, none leaves the agents to stop.
fn ask_grace(job: String, tx: mpsc::Sender<Event>) -> Box<dyn Fn() + Send> {
    Box::new(move || {
        let (job, tx) = (job.clone(), tx.clone());
        std::thread::spawn(move || {
            if let Some(grace_us) = crate::slurm::grace_left(&job) {
                let _ = tx.send(Event::Core(self::core::Input::Grace { signal: libc::SIGTERM, grace_us }));
            }
        });
    })
}

/// Nodes the core gave back: the job is shrunk to the others, in a thread of its own (a
/// controller RPC or two, never in the core's loop), one shrink after another.
fn shrink_job(job: String, run_dir: std::path::PathBuf) -> Box<dyn Fn(Vec<String>) + Send> {
    let (tx, rx) = mpsc::channel::<Vec<String>>();
    std::thread::spawn(move || {
        while let Ok(mut nodes) = rx.recv() {
            // Only the latest word counts: it names every node given back so far.
            while let Ok(more) = rx.try_recv() {
                nodes = more;
            }
            if let Err(e) = crate::slurm::shrink_job(&job, &nodes, &run_dir) {
                tracing::warn!(job = %job, nodes = ?nodes, "could not give nodes back to Slurm: {e:#}");
            }
        }
    });
    Box::new(move |nodes| {
        let _ = tx.send(nodes);
    })
}

async fn forward_signals(tx: mpsc::Sender<Event>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) else {
        return;
    };
    let mut count = 0;
    loop {
        let sig = tokio::select! {
            _ = int.recv() => libc::SIGINT,
            _ = term.recv() => libc::SIGTERM,
        };
        count += 1;
        if count > 1 {
            eprintln!("htc: second signal, exiting now; resume with `htc run --resume`");
            std::process::exit(128 + sig);
        }
        // Under Slurm a SIGTERM may come with a grace (a preemption's GraceTime): Slurm says.
        let job = (sig == libc::SIGTERM).then(|| std::env::var("SLURM_JOB_ID").ok()).flatten();
        let grace = match job {
            Some(job) => tokio::task::spawn_blocking(move || crate::slurm::grace_left(&job)).await.ok().flatten(),
            None => None,
        };
        let input = match grace {
            Some(grace_us) => self::core::Input::Grace { signal: sig, grace_us },
            None => self::core::Input::Interrupt { signal: sig },
        };
        let _ = tx.send(Event::Core(input));
    }
}
