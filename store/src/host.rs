//! Facts about this machine every layer asks: its name and the wall clock. Here, at the bottom,
//! so that the ledger's replica (which records the host it was made on) does not reach up into
//! the agent for them (that edge once tied 22 modules into one import cycle).

/// This node's host name ("?" if the system will not say).
pub fn hostname() -> String {
    match nix::unistd::gethostname() {
        Ok(name) => name.to_string_lossy().into_owned(),
        Err(_) => "?".into(),
    }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
pub fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}
