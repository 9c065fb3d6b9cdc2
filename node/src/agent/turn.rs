//! One turn's effects, as this agent carries them out: frames up into the write buffer, down to
//! the children's connections, commands to the executors, reconnecting to the leader.

use std::collections::HashMap;

use tokio::sync::mpsc::UnboundedSender;

use super::clock::Clock;
use super::config::AgentConfig;
use super::connection::{await_leader, rejoin, Reconnected};
use super::spawners::Executors;
use crate::frame;
use htc_engine::agent::machine::Carrier;
use htc_engine::msg::{Down, Up};
use htc_engine::wire;
use htc_exec::executor::Command;

pub(super) struct Turn<'a> {
    pub(super) cfg: &'a AgentConfig,
    pub(super) secret: &'a [u8],
    pub(super) clock: &'a Clock,
    pub(super) rejoin_tx: &'a UnboundedSender<Reconnected>,
    pub(super) children: &'a HashMap<u32, UnboundedSender<Vec<u8>>>,
    pub(super) execs: &'a mut Executors,
    pub(super) out: &'a mut Vec<u8>,
    /// The parent connection failed a write: nothing more goes to it, or below through it.
    pub(super) parent_gone: bool,
    pub(super) close: bool,
    pub(super) revive: bool,
}

impl Carrier for Turn<'_> {
    fn up(&mut self, msg: Up) {
        if !self.parent_gone {
            frame::encode_into(wire::up::frame(msg), self.out);
        }
    }
    fn down(&mut self, child: u32, msg: Down) {
        if let Some(tx) = self.children.get(&child).filter(|_| !self.parent_gone) {
            let mut bytes = Vec::new();
            wire::down::frames(msg.agent, msg.msg, |body| frame::encode_into(body, &mut bytes));
            let _ = tx.send(bytes);
        }
    }
    fn exec(&mut self, command: Command) {
        let command = match command {
            // The executors keep the lease on the wall clock, as their deadlines are.
            Command::Lease(until) => Command::Lease(self.clock.wall(until)),
            c => c,
        };
        self.execs.send(command);
    }
    fn close_up(&mut self) {
        self.close |= !self.parent_gone;
    }
    // Even after a failed write (see `Driver::carry_out`): a Rejoin dropped there is never
    // asked again.
    fn rejoin(&mut self) {
        rejoin(self.cfg, self.secret, self.cfg.live.lease_us, self.rejoin_tx.clone());
    }
    fn revive(&mut self) {
        self.revive |= !self.parent_gone;
    }
    fn await_leader(&mut self) {
        let wait = self.cfg.await_leader.unwrap_or_default();
        await_leader(self.cfg, self.secret, wait, self.rejoin_tx.clone());
    }
}
