//! Signals from real traffic: what a tracked TCP service's clients betray of a backend that does
//! not answer, and the rule that compares each backend with its service's others. Kernel-free:
//! the data plane counts (crates/dataplane/src/bpf/conntrack_map.h, backend_signals), `lb
//! attach` reads the counters once a second and feeds them here.
//!
//! The rule (docs/operating.md, "Signals from real traffic"): over the last [`WINDOW`] readings,
//! a backend has two *bad shares*: its failed handshakes (SYNs sent again plus its clients' early
//! resets) per connection begun, and its ends without data per handshake watched. A share is
//! judged with at least [`MIN_SYNS`] of its denominator in the window; a backend is an outlier
//! when either share is at least [`MIN_BAD`] and more than [`FACTOR`] times the lowest of the
//! same share among its service's other backends (those with enough to judge it) plus
//! [`MARGIN`]: it is compared with the best of its peers, so
//! that several bad backends do not hide each other, and each share with its own kind, so that
//! what every backend has of one (clients that close unread) does not hide the other. Loss on the clients'
//! side raises every backend's share alike and so makes no outlier; a backend alone, or one whose
//! peers have too few connections to compare with, is never one. An outlier is only a suspect:
//! the controller probes it through the VIP at once, and takes it out only when that fails too,
//! never more than [`max_out`] of a service's backends.

use std::collections::{HashMap, VecDeque};

/// A backend's counters as the data plane keeps them (cumulative), or their growth over a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signals {
    /// Connections begun: a flow's first SYN sent to the backend.
    pub syns: u64,
    /// A SYN sent again on a flow not yet confirmed: its SYN-ACK never came.
    pub syn_again: u64,
    /// A client RST as a flow's second packet: it aborted the handshake.
    pub reset_early: u64,
    /// Handshakes completed whose end is watched (the flow's second packet made its entry and
    /// noted what it acknowledged): what `no_data` is a share of.
    pub handshakes: u64,
    /// A client FIN or RST that acknowledges nothing past the SYN-ACK: the connection ended
    /// with no data from the backend.
    pub no_data: u64,
}

/// The kinds of bad share, each judged on its own: failed handshakes, ends without data.
pub const KINDS: usize = 2;

impl Signals {
    /// Bad share `kind`, where there is enough to judge it: failed handshakes (SYNs again and
    /// early resets) per connection begun, with at least [`MIN_SYNS`] begun; ends without data
    /// per handshake watched, with at least [`MIN_SYNS`] watched (a backend that completes no
    /// handshake ends none without data, and is judged by its failed handshakes alone).
    pub fn bad_share(&self, kind: usize) -> Option<f64> {
        let (bad, of) = if kind == 0 { (self.syn_again + self.reset_early, self.syns) } else { (self.no_data, self.handshakes) };
        (of >= MIN_SYNS).then(|| bad as f64 / of as f64)
    }

    fn since(&self, earlier: &Signals) -> Signals {
        Signals {
            syns: self.syns.saturating_sub(earlier.syns),
            syn_again: self.syn_again.saturating_sub(earlier.syn_again),
            reset_early: self.reset_early.saturating_sub(earlier.reset_early),
            handshakes: self.handshakes.saturating_sub(earlier.handshakes),
            no_data: self.no_data.saturating_sub(earlier.no_data),
        }
    }

    /// Whether any counter went down since `earlier`: the counters were reset (the backend's id
    /// given to another backend, a restart).
    fn went_back(&self, earlier: &Signals) -> bool {
        self.syns < earlier.syns || self.syn_again < earlier.syn_again || self.reset_early < earlier.reset_early || self.handshakes < earlier.handshakes || self.no_data < earlier.no_data
    }
}

/// Readings in the window: the rule looks at the growth over the last this many (one a second).
pub const WINDOW: usize = 5;
/// Connections a backend must have begun in the window for its failed-handshake share to count
/// (handshakes watched, for its share of ends without data).
pub const MIN_SYNS: u64 = 30;
/// The bad share below which no backend is an outlier, whatever its peers.
pub const MIN_BAD: f64 = 0.5;
/// How many times the best of its peers' bad shares an outlier's exceeds ...
pub const FACTOR: f64 = 3.0;
/// ... plus this.
pub const MARGIN: f64 = 0.25;

/// At most this many of a service's `n` backends are out by this rule at once: a third.
pub fn max_out(n: usize) -> usize {
    n / 3
}

/// Each backend's recent readings, keyed by whatever names a backend (service, identity).
#[derive(Debug, Clone)]
pub struct Window<K> {
    readings: HashMap<K, VecDeque<Signals>>,
}

impl<K> Default for Window<K> {
    fn default() -> Self {
        Window { readings: HashMap::new() }
    }
}

impl<K: std::hash::Hash + Eq + Clone> Window<K> {
    /// Records a backend's cumulative counters as read now; a reading lower than the last starts
    /// its window again.
    pub fn record(&mut self, key: &K, now: Signals) {
        let q = self.readings.entry(key.clone()).or_default();
        if q.back().is_some_and(|last| now.went_back(last)) {
            q.clear();
        }
        q.push_back(now);
        while q.len() > WINDOW + 1 {
            q.pop_front();
        }
    }

    /// The growth over the window (nothing until two readings).
    pub fn growth(&self, key: &K) -> Signals {
        match self.readings.get(key) {
            Some(q) if q.len() >= 2 => q.back().copied().unwrap_or_default().since(q.front().unwrap_or(&Signals::default())),
            _ => Signals::default(),
        }
    }

    /// The latest reading (cumulative), for the metrics.
    pub fn latest(&self, key: &K) -> Option<Signals> {
        self.readings.get(key).and_then(|q| q.back().copied())
    }

    /// Forgets the backends `keep` says no.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.readings.retain(|k, _| keep(k));
    }
}

/// The outliers among one service's backends, given each one's growth over the window: their
/// indices in `backends`.
pub fn outliers(backends: &[Signals]) -> Vec<usize> {
    (0..backends.len())
        .filter(|&i| {
            let best = best_of_peers(backends, i);
            (0..KINDS).any(|k| match (backends[i].bad_share(k), best[k]) {
                (Some(mine), Some(best)) => mine >= MIN_BAD && mine > FACTOR * best + MARGIN,
                _ => false,
            })
        })
        .collect()
}

/// The lowest of each kind of bad share among the backends other than `i` that have enough to
/// judge it (None: none has).
pub fn best_of_peers(backends: &[Signals], i: usize) -> [Option<f64>; KINDS] {
    std::array::from_fn(|k| (0..backends.len()).filter(|&j| j != i).filter_map(|j| backends[j].bad_share(k)).min_by(|a, b| a.total_cmp(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(syns: u64, again: u64, resets: u64) -> Signals {
        Signals { syns, syn_again: again, reset_early: resets, ..Signals::default() }
    }

    #[test]
    fn a_backend_that_never_answers_stands_out_from_its_peers() {
        // b2's clients send every SYN twice or more; the others' never.
        assert_eq!(outliers(&[s(100, 0, 0), s(100, 180, 0), s(200, 1, 0)]), vec![1]);
        // Early resets count as much.
        assert_eq!(outliers(&[s(100, 0, 0), s(100, 0, 60), s(200, 1, 0)]), vec![1]);
    }

    #[test]
    fn connections_that_end_without_data_count_as_much() {
        let quiet = |handshakes, no_data| Signals { syns: handshakes, handshakes, no_data, ..Signals::default() };
        // b2 answers the handshake, then nothing: its clients give up.
        assert_eq!(outliers(&[quiet(100, 2), quiet(100, 70), quiet(200, 3)]), vec![1]);
        // Clients that close unread on every backend alike (a checker that only connects), even
        // more than half of them: none.
        assert!(outliers(&[quiet(100, 60), quiet(100, 65), quiet(200, 130)]).is_empty());
        // ... and they do not hide a backend whose SYN-ACKs never come: its failed handshakes
        // are compared with its peers' failed handshakes, not with their ends without data. (A
        // backend that completes no handshake ends none without data.)
        let peer = Signals { syns: 100, handshakes: 100, no_data: 60, ..Signals::default() };
        let lost = Signals { syns: 100, syn_again: 150, ..Signals::default() };
        assert_eq!(outliers(&[peer, lost, peer]), vec![1]);
        // Nor does a backend with a few failed handshakes hide its ends without data.
        let bad = Signals { syns: 100, syn_again: 10, handshakes: 90, no_data: 80, ..Signals::default() };
        let good = Signals { syns: 100, syn_again: 12, handshakes: 88, no_data: 5, ..Signals::default() };
        assert_eq!(outliers(&[good, bad, good]), vec![1]);
        // Ends without data are a share of the handshakes watched: few watched, not judged.
        assert!(outliers(&[quiet(100, 2), Signals { syns: 100, handshakes: 20, no_data: 20, ..Signals::default() }, quiet(100, 3)]).is_empty());
        // A counter of no_data that went back starts the window over, as the others do.
        let mut w = Window::default();
        w.record(&"b2", quiet(10, 5));
        w.record(&"b2", quiet(20, 3));
        assert_eq!(w.growth(&"b2"), Signals::default());
    }

    #[test]
    fn loss_on_the_clients_side_raises_every_share_and_makes_no_outlier() {
        // A quarter of every backend's SYN-ACKs lost on the way back: all alike.
        assert!(outliers(&[s(100, 27, 0), s(100, 24, 0), s(200, 49, 0)]).is_empty());
        // Even heavy loss, as long as all share it.
        assert!(outliers(&[s(100, 90, 5), s(100, 110, 3), s(200, 180, 10)]).is_empty());
    }

    #[test]
    fn too_few_connections_or_no_peer_to_compare_with_decide_nothing() {
        // b2 fails everything but began only 10 connections in the window.
        assert!(outliers(&[s(100, 0, 0), s(10, 30, 0), s(100, 0, 0)]).is_empty());
        // Alone, or its peers too quiet to judge.
        assert!(outliers(&[s(100, 200, 0)]).is_empty());
        assert!(outliers(&[s(5, 0, 0), s(100, 200, 0)]).is_empty());
        // A small share is no outlier, however far above a perfect peer.
        assert!(outliers(&[s(100, 0, 0), s(100, 15, 0), s(100, 0, 0)]).is_empty());
    }

    #[test]
    fn bad_backends_do_not_hide_each_other_and_the_limit_is_a_third() {
        // Two bad of three: each is compared with the good one, and both stand out (the
        // controller then takes out at most max_out(3) = 1).
        assert_eq!(outliers(&[s(100, 0, 0), s(100, 200, 0), s(100, 200, 0)]), vec![1, 2]);
        // All bad alike: no outlier (the service fails, not one backend).
        assert!(outliers(&[s(100, 200, 0), s(100, 200, 0), s(100, 210, 0)]).is_empty());
        assert_eq!((max_out(3), max_out(5), max_out(2), max_out(6)), (1, 1, 0, 2));
    }

    #[test]
    fn the_window_holds_the_last_readings_and_restarts_on_a_reset() {
        let mut w = Window::default();
        let k = ("web", "b2");
        assert_eq!(w.growth(&k), Signals::default(), "nothing before two readings");
        for i in 0..=WINDOW as u64 + 3 {
            w.record(&k, s(10 * i, 2 * i, 0));
        }
        assert_eq!(w.growth(&k), s(10 * WINDOW as u64, 2 * WINDOW as u64, 0), "the last {WINDOW} seconds' growth");
        w.record(&k, s(5, 0, 0));
        assert_eq!(w.growth(&k), Signals::default(), "a counter that went back starts over");
        w.record(&k, s(25, 3, 1));
        assert_eq!(w.growth(&k), s(20, 3, 1));
        assert_eq!(w.latest(&k), Some(s(25, 3, 1)));
        w.retain(|_| false);
        assert_eq!(w.latest(&k), None);
    }
}
