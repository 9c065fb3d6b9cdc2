//! What the leader's core asks of the world: messages to agents, and the word that it gave an
//! agent up. A driver carries them out through `Carrier` (the node's sockets, `htc simulate`'s
//! virtual network), as the agent's machine has its effects carried out (`agent::machine`), so
//! no driver guesses the core's intent from the frames it sends.

use crate::msg::{Stop, ToAgent};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// A message for one agent; each agent's go out in the order they come.
    ToAgent(u32, ToAgent),
    /// The core gave the agent up: the connection it had no longer holds its place, so that it
    /// can come back fresh at once (its old link may stay open: a cut network, a stopped
    /// process).
    GivenUp(u32),
    /// The answer to a client's request to add tasks (`Input::Add`): for the client once the
    /// turn's writes are committed, never before.
    Added { request: u64, answer: Result<Vec<u64>, String> },
    /// An agent was signalled (`Report::signalled`), the first this run: under Slurm the driver
    /// asks whether the job has a grace (a preemption's `GraceTime`) and says so
    /// (`Input::Grace`); it says nothing otherwise, and the signalled agents stop.
    Signalled,
    /// Nodes of the run's own allocation whose agents all left with nothing left for them
    /// (`core::give_back`): every one given back so far. Under Slurm the driver shrinks the job
    /// to the others.
    GiveBack { nodes: Vec<String> },
}

/// The core's effects of one or more inputs, in order.
pub type Effects = Vec<Effect>;

/// Where the leader's effects are carried out. `Effect::carry_out` is the one reading of them,
/// so a new effect is a compile error in every driver rather than a silent drop in one.
pub trait Carrier {
    fn to_agent(&mut self, agent: u32, msg: ToAgent);
    fn given_up(&mut self, agent: u32);
    fn added(&mut self, request: u64, answer: Result<Vec<u64>, String>);
    fn signalled(&mut self);
    fn give_back(&mut self, nodes: Vec<String>);
}

impl Effect {
    pub fn carry_out(self, to: &mut impl Carrier) {
        match self {
            Effect::ToAgent(agent, msg) => to.to_agent(agent, msg),
            Effect::GivenUp(agent) => to.given_up(agent),
            Effect::Added { request, answer } => to.added(request, answer),
            Effect::Signalled => to.signalled(),
            Effect::GiveBack { nodes } => to.give_back(nodes),
        }
    }

    /// A Shutdown for `agent` that `stop` says how to obey.
    pub fn stop(agent: u32, stop: Stop, reason: String) -> Effect {
        Effect::ToAgent(agent, ToAgent::Shutdown { stop, reason })
    }
}

/// Tells `agent` it was given up, and the carrier with it: the two go together, so that an agent
/// told to come back fresh is always free to.
pub fn give_up(out: &mut Effects, agent: u32, reason: String) {
    out.push(Effect::stop(agent, Stop::Revive, reason));
    out.push(Effect::GivenUp(agent));
}
