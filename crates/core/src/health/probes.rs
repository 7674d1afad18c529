//! What a backend's health probes found: each probe's outcome counted, its latency in a
//! histogram, and the last one. The record lives in the backend's [`Health`](super::Health), so
//! a reload keeps it for a backend that stays and forgets it for one that leaves, exactly as it
//! does the backend's health; the metrics and the status page read it from there.

use std::time::Duration;

/// What one probe found. [`Outcome::as_str`] is the `outcome` label of `lb_backend_probes_total`:
/// dashboards and alerts select on it, so the names never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Connected and, for an HTTP check, answered with a status in the expected range.
    Success,
    /// No connection, or no answer, within the check's timeout.
    Timeout,
    /// The connection was refused: the host is there but nothing listens on the port.
    Refused,
    /// An HTTP answer whose status is outside the expected range.
    BadStatus,
    /// Anything else: a reset after connecting, an unreachable host or network, an answer that
    /// is not HTTP, the peer closing before the status line.
    Error,
}

impl Outcome {
    /// Every outcome, in the order they are exported.
    pub const ALL: [Outcome; 5] = [Outcome::Success, Outcome::Timeout, Outcome::Refused, Outcome::BadStatus, Outcome::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Timeout => "timeout",
            Outcome::Refused => "refused",
            Outcome::BadStatus => "bad_status",
            Outcome::Error => "error",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Upper bounds of the latency histogram's buckets, in seconds; a last bucket, +Inf, takes the
/// rest. From half a millisecond (a probe on the same rack) to 5 s (past any sane timeout).
pub const LATENCY_BUCKETS: [f64; 13] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

/// One backend's probes since it was first probed (or came into the pool).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeRecord {
    /// Probes by outcome, indexed as [`Outcome::ALL`].
    by_outcome: [u64; 5],
    /// Probes by latency, one count per bucket of [`LATENCY_BUCKETS`] and a last for +Inf (each
    /// bucket counts its own probes only, not those below it).
    by_latency: [u64; LATENCY_BUCKETS.len() + 1],
    /// The latencies added up.
    total: Duration,
    /// The last probe's outcome and latency.
    pub last: Option<(Outcome, Duration)>,
}

impl ProbeRecord {
    /// Counts one probe.
    pub fn add(&mut self, outcome: Outcome, took: Duration) {
        self.by_outcome[outcome.index()] += 1;
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS.iter().position(|&le| secs <= le).unwrap_or(LATENCY_BUCKETS.len());
        self.by_latency[bucket] += 1;
        self.total += took;
        self.last = Some((outcome, took));
    }

    /// Probes with `outcome`.
    pub fn count(&self, outcome: Outcome) -> u64 {
        self.by_outcome[outcome.index()]
    }

    /// Probes of every outcome.
    pub fn probes(&self) -> u64 {
        self.by_outcome.iter().sum()
    }

    /// The latencies added up.
    pub fn total(&self) -> Duration {
        self.total
    }

    /// Each bucket's upper bound in seconds (the last is infinity) with the probes in it alone.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        LATENCY_BUCKETS.iter().copied().chain([f64::INFINITY]).zip(self.by_latency).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_names_are_the_exported_labels() {
        let names: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(names, ["success", "timeout", "refused", "bad_status", "error"]);
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i, "ALL is in declaration order");
        }
    }

    #[test]
    fn a_probe_is_counted_once_by_outcome_and_once_by_latency() {
        let mut r = ProbeRecord::default();
        let ms = |m: f64| Duration::from_secs_f64(m / 1e3);
        r.add(Outcome::Success, ms(0.2));
        r.add(Outcome::Success, ms(1.0)); // on a bound: in that bucket (le)
        r.add(Outcome::Refused, ms(3.0));
        r.add(Outcome::Timeout, ms(300.0));
        r.add(Outcome::Timeout, ms(7000.0));
        assert_eq!((r.count(Outcome::Success), r.count(Outcome::Timeout), r.count(Outcome::Refused)), (2, 2, 1));
        assert_eq!((r.count(Outcome::BadStatus), r.count(Outcome::Error), r.probes()), (0, 0, 5));
        let b = r.buckets();
        assert_eq!(b.len(), 14);
        let count = |le: f64| b.iter().find(|x| x.0 == le).map_or(99, |x| x.1);
        assert_eq!([count(0.0005), count(0.001), count(0.005), count(0.5), count(f64::INFINITY)], [1, 1, 1, 1, 1]);
        assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), r.probes(), "every probe is in one bucket");
        assert_eq!(r.total(), ms(0.2) + ms(1.0) + ms(3.0) + ms(300.0) + ms(7000.0));
        assert_eq!(r.last, Some((Outcome::Timeout, ms(7000.0))));
    }
}
