//! `lb attach --stats-interval SECS`: the counters on stdout every SECS seconds, with rates over
//! the interval since the previous print.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Result;

use lb::stats::{self, Snapshot};

pub(super) struct StatsPrinter {
    interval: Option<Duration>,
    started: Instant,
    next: Option<Instant>,
    /// The last snapshot printed, and when.
    last: Option<(Instant, Snapshot)>,
}

impl StatsPrinter {
    pub(super) fn new(interval: Option<Duration>, started: Instant) -> StatsPrinter {
        StatsPrinter { interval, started, next: interval.map(|i| started + i), last: None }
    }

    /// When the next print is due (None: never).
    pub(super) fn next(&self) -> Option<Instant> {
        self.next
    }

    /// Whether a print is due at `now`; if so, the one after it is scheduled.
    pub(super) fn due(&mut self, now: Instant) -> bool {
        match (self.interval, self.next) {
            (Some(interval), Some(due)) if now >= due => {
                self.next = Some(due + interval);
                true
            }
            _ => false,
        }
    }

    /// Prints `snap`, taken at `now`.
    pub(super) fn print(&mut self, now: Instant, snap: Snapshot) -> Result<()> {
        let seconds = self.last.as_ref().map_or(now - self.started, |(t, _)| now - *t).as_secs_f64();
        let uptime = (now - self.started).as_secs_f64();
        let mut out = std::io::stdout().lock();
        write!(out, "{}", stats::text(&snap, self.last.as_ref().map(|(_, s)| s), seconds, uptime))?;
        out.flush()?;
        self.last = Some((now, snap));
        Ok(())
    }
}
