//! The agent was told to stop by a signal: its spawners start nothing more from their queues.
//! Set from the signal's handler itself, before the agent's loop hears of it. The signal that
//! stops an agent (`scancel`, Ctrl-C) reaches its tasks at the same moment; a spawner that saw
//! one of them end must not start the next queued task in its place, to be killed a moment
//! later and run again elsewhere.

use std::sync::atomic::{AtomicBool, Ordering};

static STOPPING: AtomicBool = AtomicBool::new(false);

/// Start nothing more. Async-signal-safe: an atomic store.
pub fn request() {
    STOPPING.store(true, Ordering::Relaxed);
}

/// Whether a stop was requested.
pub fn requested() -> bool {
    STOPPING.load(Ordering::Relaxed)
}
