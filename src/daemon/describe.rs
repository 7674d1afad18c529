//! Phrases that several of the daemon's log lines share: a backend's label (start-up summary,
//! health changes) and what a change wrote (reloads, health changes, adoption).

use lb::config::{Backend, Pool};
use lb::plan::Touched;

/// `b1 10.0.0.1` for a named backend, `10.0.0.1` otherwise.
pub(super) fn backend_label(b: &Backend) -> String {
    match &b.name {
        Some(n) => format!("{n} {}", b.address),
        None => b.address.to_string(),
    }
}

/// `b1 10.0.0.1` for a named backend, `10.0.0.1` otherwise; by identity.
pub(super) fn label_of(pool: &Pool, service: &str, identity: &str) -> String {
    pool.service(service)
        .and_then(|s| s.backends.iter().find(|b| b.identity() == identity))
        .map_or(identity.to_string(), backend_label)
}

/// `web changed (b2 removed; 16827 slots written), dns added (65537 slots written)`.
pub(super) fn describe_touched(touched: &[Touched]) -> String {
    if touched.is_empty() {
        return "no service changed".to_string();
    }
    let what: Vec<String> = touched
        .iter()
        .map(|t| {
            let mut parts = t.notes.clone();
            parts.push(format!("{} slots written", t.slots_written));
            format!("{} {} ({})", t.name, t.change, parts.join("; "))
        })
        .collect();
    what.join(", ")
}
