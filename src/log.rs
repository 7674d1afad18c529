//! What `lb` says on stderr while it runs, and how it words an OS error.
//!
//! Every room of the binary speaks; this module sits below all of them, so that none has to
//! import another room just to log (the daemon's announce and pinning rooms once imported
//! `lb attach`'s own module for this, while it imported both: a cycle).

/// One line on stderr: `lb: ` and the message.
pub(crate) fn log(msg: impl AsRef<str>) {
    eprintln!("lb: {}", msg.as_ref());
}

/// An OS error as people read it: "operation not supported", without "(os error 95)".
pub(crate) fn os_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or_default();
    let mut chars = text.chars();
    chars.next().map_or(String::new(), |c| c.to_lowercase().chain(chars).collect())
}

/// `12s ago`, or `-` for a time never set.
pub(crate) fn since_text(ms: u64) -> String {
    if ms == 0 {
        return "-".to_string();
    }
    let ago = lb::clock::unix_ms().saturating_sub(ms) / 1000;
    format!("{ago}s ago")
}
