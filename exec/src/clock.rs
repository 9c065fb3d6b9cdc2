//! The wall clock the executors stamp starts, ends and leases with. Their own, like the store's
//! (`htc_store::host::now_us`), so that the executors need nothing of the store.

/// Microseconds since the Unix epoch (0 if the clock is before it).
pub fn now_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}
