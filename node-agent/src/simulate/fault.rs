//! Faults at virtual times, and the connections they break: a node lost, an agent stopped,
//! and what each end of a closed connection then hears, as the node's drivers tell their
//! machines (`node/src/agent/mod.rs`, `relay.rs`, `node/src/leader/net.rs`).

use std::sync::atomic::Ordering::Relaxed;

use super::*;

/// A fault injected into a simulated run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// The agent's node dies at `at_us`: its connections close, its tasks are gone.
    Lose { agent: u32, at_us: u64 },
    /// The agent process is stopped (SIGSTOP) from `at_us` for `for_us`: it hears, says and
    /// starts nothing meanwhile, while its tasks run on; its connections stay open.
    Stop { agent: u32, at_us: u64, for_us: u64 },
    /// The link between the agent and its parent breaks at `at_us`: both ends see the
    /// connection close, and the agent reaches neither its parent nor the leader for `for_us`
    /// (its tries to reconnect fail until then). Its links to its children stay up.
    Cut { agent: u32, at_us: u64, for_us: u64 },
    /// The agent's node slows down at `at_us`: tasks that start on it from then on take
    /// `factor` times their runtime.
    Slow { agent: u32, at_us: u64, factor: f64 },
}

/// The forms a `--fault` takes.
const FORMS: &str =
    "lose:AGENT@SECONDS, stop:AGENT@SECONDS+SECONDS, cut:AGENT@SECONDS+SECONDS or slow:AGENT@SECONDS*FACTOR";

impl Fault {
    pub fn agent(&self) -> u32 {
        match *self {
            Fault::Lose { agent, .. }
            | Fault::Stop { agent, .. }
            | Fault::Cut { agent, .. }
            | Fault::Slow { agent, .. } => agent,
        }
    }

    pub fn at_us(&self) -> u64 {
        match *self {
            Fault::Lose { at_us, .. }
            | Fault::Stop { at_us, .. }
            | Fault::Cut { at_us, .. }
            | Fault::Slow { at_us, .. } => at_us,
        }
    }
}

impl std::str::FromStr for Fault {
    type Err = String;
    /// As `FORMS` has them; an error names the value and what was wrong with it.
    fn from_str(s: &str) -> Result<Fault, String> {
        let bad = |why: String| format!("`{s}`: {why}");
        let form = || bad(format!("expected {FORMS}"));
        let (kind, rest) = s.split_once(':').ok_or_else(form)?;
        let (agent, when) = rest.split_once('@').ok_or_else(form)?;
        let agent: u32 = agent.parse().map_err(|_| bad(format!("the agent `{agent}` is not a number (0, 1, ...)")))?;
        let secs = |x: &str| -> Result<u64, String> {
            let v: f64 = x.parse().map_err(|_| bad(format!("`{x}` is not a number of seconds")))?;
            (v.is_finite() && v >= 0.0)
                .then(|| (v * 1e6).round() as u64)
                .ok_or_else(|| bad(format!("`{x}` is not a number of seconds, 0 or more")))
        };
        let split = |sep: char, what: &str| {
            when.split_once(sep).ok_or_else(|| bad(format!("expected {kind}:AGENT@SECONDS{sep}{what}")))
        };
        match kind {
            "lose" => Ok(Fault::Lose { agent, at_us: secs(when)? }),
            "stop" => {
                let (at, dur) = split('+', "SECONDS")?;
                Ok(Fault::Stop { agent, at_us: secs(at)?, for_us: secs(dur)? })
            }
            "cut" => {
                let (at, dur) = split('+', "SECONDS")?;
                Ok(Fault::Cut { agent, at_us: secs(at)?, for_us: secs(dur)? })
            }
            "slow" => {
                let (at, factor) = split('*', "FACTOR")?;
                let positive = factor.parse::<f64>().ok().filter(|f| f.is_finite() && *f > 0.0);
                let factor = positive.ok_or_else(|| bad(format!("the factor `{factor}` is not a positive number")))?;
                Ok(Fault::Slow { agent, at_us: secs(at)?, factor })
            }
            _ => Err(form()),
        }
    }
}

impl std::fmt::Display for Fault {
    /// As it was given (`--fault`), in seconds.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |us: u64| us as f64 / 1e6;
        match *self {
            Fault::Lose { agent, at_us } => write!(f, "lose:{agent}@{}", s(at_us)),
            Fault::Stop { agent, at_us, for_us } => write!(f, "stop:{agent}@{}+{}", s(at_us), s(for_us)),
            Fault::Cut { agent, at_us, for_us } => write!(f, "cut:{agent}@{}+{}", s(at_us), s(for_us)),
            Fault::Slow { agent, at_us, factor } => write!(f, "slow:{agent}@{}*{factor}", s(at_us)),
        }
    }
}

/// Checks that every fault strikes one of the `n` agents.
pub(super) fn check(faults: &[Fault], n: u32) -> anyhow::Result<()> {
    match faults.iter().find(|f| f.agent() >= n) {
        Some(f) => anyhow::bail!("--fault {f}: there is no agent {} (the agents are 0 to {})", f.agent(), n - 1),
        None => Ok(()),
    }
}

/// How a connection ends: cleanly (a process that exits or drops it: what it sent still
/// arrives), or cut off (a dead node or a broken link: what was on the way is lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    Clean,
    Abrupt,
}

impl Fleet {
    /// The fault `f` strikes: what it finds on an agent it cuts off (lost, stopped or cut) is
    /// counted, if the agent is there to be hit.
    pub(super) fn fault(&mut self, w: &mut World, cfg: &SimConfig, f: Fault) {
        let a = f.agent();
        let x = &self.agents[a as usize];
        let hits = match f {
            // A cut needs a connection to cut.
            Fault::Cut { .. } => self.links[a as usize].open,
            Fault::Slow { .. } => false,
            Fault::Lose { .. } | Fault::Stop { .. } => true,
        };
        if hits && !x.dead && !x.exited && x.stopped_until.is_none() {
            self.running_at_faults += x.exec.running() as u64;
            self.queued_at_faults += x.exec.queued() as u64;
        }
        match f {
            Fault::Lose { .. } => self.lose(w, cfg, a),
            Fault::Stop { at_us, for_us, .. } => self.stop(w, a, at_us + for_us),
            Fault::Cut { at_us, for_us, .. } => self.cut(w, cfg, a, at_us + for_us),
            // What starts from now on (`Agent::slow`, read by its executor's runtime).
            Fault::Slow { factor, .. } => self.agents[a as usize].slow.store(factor.to_bits(), Relaxed),
        }
    }

    /// Agent `a`'s connection to its parent breaks, and it reaches no one above it until
    /// `until`: both ends hear the connection close; its machine decides what to do (a head
    /// below a relay rejoins the leader, others stop), and tries to reconnect fail until then.
    fn cut(&mut self, w: &mut World, cfg: &SimConfig, a: u32, until: u64) {
        if self.agents[a as usize].dead || !self.links[a as usize].open {
            return;
        }
        self.agents[a as usize].offline_until = until;
        let why = "connection closed (simulated cut link)";
        self.close_up(w, cfg, a, why, Close::Abrupt);
        w.at(w.now + cfg.latency_us, Ev::ToAgent(a, machine::Input::ParentEnded(why.to_string())));
    }

    /// Agent `a`'s node dies: its connections break, up and down.
    fn lose(&mut self, w: &mut World, cfg: &SimConfig, a: u32) {
        let x = &mut self.agents[a as usize];
        if x.dead {
            return;
        }
        x.dead = true;
        let why = "connection closed (simulated node loss)";
        self.close_up(w, cfg, a, why, Close::Abrupt);
        self.close_down(w, cfg, a, why, Close::Abrupt);
    }

    /// Agent `a` is stopped until `until`: its tasks run on and end; nothing new starts.
    fn stop(&mut self, w: &mut World, a: u32, until: u64) {
        let x = &mut self.agents[a as usize];
        if x.dead || x.stopped_until.is_some() {
            return;
        }
        x.stopped_until = Some(until);
        x.exec.set_frozen(true);
        w.at(until, Ev::Resume(a));
    }

    /// A stopped agent goes on: its executor first (its thread may well run before the agent
    /// reads anything; only its lease keeps it from starting a queue given away meanwhile),
    /// then what reached the agent meanwhile, in order.
    pub(super) fn resume(&mut self, w: &mut World, cfg: &SimConfig, a: u32) {
        let x = &mut self.agents[a as usize];
        if x.dead {
            return;
        }
        x.stopped_until = None;
        x.exec.set_frozen(false);
        let deferred = std::mem::take(&mut x.deferred);
        self.run_exec(w, cfg, a, Vec::new());
        for input in deferred {
            self.step(w, cfg, a, input);
        }
    }

    /// Agent `a`'s machine ended: its process exits, and its connections close cleanly.
    pub(super) fn exit(&mut self, w: &mut World, cfg: &SimConfig, a: u32) {
        self.agents[a as usize].exited = true;
        let why = "connection closed (the agent ended)";
        self.close_up(w, cfg, a, why, Close::Clean);
        self.close_down(w, cfg, a, why, Close::Clean);
    }

    /// Agent `a`'s connection to its parent closes: the parent hears it as its driver says it.
    /// The leader loses the agent and counts those it relayed for as cut off with it
    /// (`Detached`: they may rejoin); a relay or head hears the child's connection closed,
    /// with the agents that came through it, and tells the leader they are lost.
    pub(super) fn close_up(&mut self, w: &mut World, cfg: &SimConfig, a: u32, why: &str, how: Close) {
        let l = &mut self.links[a as usize];
        if !l.open {
            return;
        }
        l.open = false;
        if how == Close::Abrupt {
            l.gen += 1;
        }
        let (parent, below) = (l.parent, self.relayed_by(a));
        let at = w.now + cfg.latency_us;
        match parent {
            None => {
                w.at(at, Ev::ToLeader(Input::Lost { agent: a, why: why.to_string() }));
                for b in below {
                    w.at(at, Ev::ToLeader(Input::Detached { agent: b }));
                }
            }
            Some(p) => {
                let agents = std::iter::once(a).chain(below).collect();
                w.at(at, Ev::ToAgent(p, machine::Input::ChildClosed { child: a, agents, why: why.to_string() }));
            }
        }
    }

    /// The connections of agent `a`'s children close: each hears that its parent ended.
    fn close_down(&mut self, w: &mut World, cfg: &SimConfig, a: u32, why: &str, how: Close) {
        for c in 0..self.tree.len() {
            let l = &mut self.links[c as usize];
            if l.open && l.parent == Some(a) {
                l.open = false;
                if how == Close::Abrupt {
                    l.gen += 1;
                }
                w.at(w.now + cfg.latency_us, Ev::ToAgent(c, machine::Input::ParentEnded(why.to_string())));
            }
        }
    }

    /// The heads whose frames reach the leader through agent `a`'s connection: it relays their
    /// Hellos and reports, so its end is theirs as the leader sees it. (Members are known to
    /// their head alone.)
    fn relayed_by(&self, a: u32) -> Vec<u32> {
        let through = |mut x: u32| {
            for _ in 0..self.tree.len() {
                let l = self.links[x as usize];
                match l.parent {
                    Some(p) if l.open && p == a => return true,
                    Some(p) if l.open => x = p,
                    _ => return false,
                }
            }
            false
        };
        (0..self.tree.len()).filter(|&x| x != a && self.tree.head(x) == x && through(x)).collect()
    }
}
