//! The one wall clock of lb: milliseconds since the Unix epoch. Load intervals are cut from it
//! (every node and agent shares it, unlike a process's monotonic clock), and the times a pinned
//! plane keeps (attached, controller since) are written and read in it.

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
