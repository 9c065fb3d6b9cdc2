//! Facts about this machine every layer asks: its name and the wall clock. Here, at the bottom,
//! so that the ledger's replica (which records the host it was made on) does not reach up into
//! the agent for them (that edge tied 22 modules into one import cycle: docs/dev/crate-split-plan.md).

/// This node's host name ("?" if the system will not say).
pub fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: gethostname writes at most b.len() bytes.
    let rc = unsafe { libc::gethostname(b.as_mut_ptr() as *mut libc::c_char, b.len()) };
    if rc != 0 {
        return "?".into();
    }
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..n]).into_owned()
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
pub fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}
