//! What faults break in the simulated world: the connections a lost node, a stopped agent or a
//! cut link closes, and what each end of a closed connection then hears, as the node's drivers
//! tell their machines (`node/src/agent/mod.rs`, `relay.rs`, `node/src/leader/net.rs`).

use std::sync::atomic::Ordering::Relaxed;

use super::*;

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
