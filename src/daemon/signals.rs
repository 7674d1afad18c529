//! Signals from real traffic in `lb attach` (docs/operating.md, "Signals from real traffic"):
//! once a second, each checked tracked TCP service's backends' counters are read from the data
//! plane and judged by lb::health::signals; an outlier becomes a suspect, probed through the VIP
//! at once and then every check interval (the check itself where it is `via: vip`; an HTTP
//! check on the service's own port, passing on any answer; else a TCP connect to the service's
//! port), on threads of its own, together with one of its peers that is
//! no suspect (the control). A suspect is out after `fall` failed probes in a row, and only while
//! the control passes (a way through the VIP that fails for everyone is the path's fault, not the
//! suspect's), and only while fewer than a third of its service's backends are out by this rule.
//! A probe that could not be sent (no way out, the host's own socket error) proves nothing and
//! counts for nothing. A suspect is back, and no longer one, after `rise` good probes in a row;
//! then it cannot be one again for a window's length.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use anyhow::Result;

use lb::balancer::Balancer;
use lb::config::{CheckKind, Pool, Service};
use lb::health::signals::{self, Signals, Window};

use super::describe::label_of;
use super::probe::{probe, Failure, Key, Prober, Target};
use crate::log::log;

/// How often the counters are read.
pub(super) const TICK: Duration = Duration::from_secs(1);
/// Probes through the VIP of suspects running at once, at most.
const WORKERS: usize = 4;

/// How long a suspect that passed is not one again, the first time; each time it stands out
/// again as soon as that is over and passes again, twice as long, up to [`MAX_HOLD`]. (A
/// backend whose clients' connections end without data, probed by a TCP connect that it
/// passes, would otherwise be a suspect again every few seconds.)
const HOLD: Duration = Duration::from_secs(5);
const MAX_HOLD: Duration = Duration::from_secs(300);

/// A suspect cleared: when, and for how long it is not one again.
#[derive(Debug, Clone, Copy)]
struct Dismissal {
    at: Instant,
    hold: Duration,
}

/// The hold of a suspect cleared now, after `previous` (its last, if it has not stopped standing
/// out since).
fn next_hold(previous: Option<&Dismissal>) -> Duration {
    previous.map_or(HOLD, |d| (d.hold * 2).min(MAX_HOLD))
}

/// A backend whose signals stood out.
#[derive(Debug, Clone)]
struct Suspect {
    next_probe: Instant,
    /// Good probes through the VIP in a row, and failed ones.
    successes: u32,
    failures: u32,
    /// Out by this rule.
    out: bool,
    /// What was said once: held in by the limit, or by a failing control; a probe not sent.
    said_held: bool,
    said_unsent: bool,
}

/// The control of a service's suspects: the last probe through the VIP of a peer that is no
/// suspect.
#[derive(Debug, Clone, Default)]
struct Control {
    passed: Option<bool>,
    said_failing: bool,
}

/// What a refused reload puts back.
pub(super) struct Kept {
    window: Window<Key>,
    suspects: HashMap<Key, Suspect>,
    dismissed: HashMap<Key, Dismissal>,
}

pub(super) struct Outliers {
    window: Window<Key>,
    prober: Prober<Result<(), Failure>>,
    suspects: HashMap<Key, Suspect>,
    controls: HashMap<String, Control>,
    /// Suspects cleared: not suspects again until their hold is over.
    dismissed: HashMap<Key, Dismissal>,
    next_tick: Instant,
    /// A suspect was made or cleared since [`Outliers::take_suspects_changed`] last said so.
    suspects_changed: bool,
}

impl AsFd for Outliers {
    /// Readable when probe results arrived.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.prober.as_fd()
    }
}

/// The prober's key of a service's control probe (a service name never holds a NUL).
fn control_key(service: &str, peer: &str) -> Key {
    (format!("{service}\0control"), peer.to_string())
}

/// Whether the rule watches service `s`.
pub(super) fn watched(s: &Service) -> bool {
    s.health_check.as_ref().is_some_and(|c| c.signals)
}

impl Outliers {
    pub(super) fn new() -> Result<Outliers> {
        Ok(Outliers {
            window: Window::default(),
            prober: Prober::new(WORKERS)?,
            suspects: HashMap::new(),
            controls: HashMap::new(),
            dismissed: HashMap::new(),
            next_tick: Instant::now() + TICK,
            suspects_changed: false,
        })
    }

    /// The backends out by this rule.
    pub(super) fn out(&self) -> BTreeSet<Key> {
        self.suspects.iter().filter(|(_, s)| s.out).map(|(k, _)| k.clone()).collect()
    }

    /// Whether a backend is out by this rule.
    pub(super) fn is_out(&self, key: &Key) -> bool {
        self.suspects.get(key).is_some_and(|x| x.out)
    }

    /// A backend's counters as last read, and whether it is a suspect, and out by this rule.
    pub(super) fn of(&self, key: &Key) -> Option<lb::metrics::BackendSignals> {
        self.window.latest(key).map(|counts| lb::metrics::BackendSignals { counts, suspect: self.suspects.contains_key(key), out: self.is_out(key) })
    }

    /// Reads the counters when a second has passed, and judges each watched service.
    pub(super) fn read_due(&mut self, now: Instant, pool: &Pool, dp: &Balancer) {
        if now >= self.next_tick {
            self.next_tick = now + TICK;
            self.read(pool, dp);
        }
    }

    pub(super) fn take_suspects_changed(&mut self) -> bool {
        std::mem::take(&mut self.suspects_changed)
    }

    pub(super) fn has_suspects(&self) -> bool {
        !self.suspects.is_empty()
    }

    /// Queues the probes through the VIP that are due, each suspect's and its service's control;
    /// `target` says where a backend's goes, or why it cannot be sent: then it is not probed,
    /// and stays (a probe that was never sent proves nothing). Returns when to come back.
    pub(super) fn probe_due(&mut self, now: Instant, pool: &Pool, target: impl Fn(&Service, &lb::config::Backend) -> Result<Target, Failure>) -> Instant {
        let mut next = self.next_tick;
        for s in pool.services.iter().filter(|s| watched(s)) {
            let Some(check) = &s.health_check else { continue };
            // A connection to the service, as clients make: the check itself where it goes
            // through the VIP already; else an HTTP check on the service's own port asks for
            // data, which a backend whose connections end without any fails, and passes on any
            // status line (its path or Host may mean nothing to the service's listener: an
            // answer is what it looks for); else a TCP connect to the service's port.
            let mut c = check.clone();
            if c.via != lb::config::ProbeVia::Vip {
                if c.kind != CheckKind::Tcp && c.port == s.port {
                    c.expect = (100, 599);
                } else {
                    c.kind = CheckKind::Tcp;
                }
                c.port = s.port;
                c.via = lb::config::ProbeVia::Vip;
            }
            let mut any_due = false;
            for b in &s.backends {
                let key = (s.name.clone(), b.identity());
                let Some(x) = self.suspects.get_mut(&key) else { continue };
                if x.next_probe <= now {
                    x.next_probe = now + check.interval;
                    any_due = true;
                    match target(s, b) {
                        Ok(t) => {
                            let c = c.clone();
                            if !self.prober.submit(key.clone(), move || probe(&t, &c)) {
                                x.next_probe = now;
                            }
                        }
                        Err(f) if !x.said_unsent => {
                            x.said_unsent = true;
                            log(format!("signals: {} backend {} cannot be probed through the VIP ({}): it stays", s.name, label_of(pool, &key.0, &key.1), f.reason));
                        }
                        Err(_) => {}
                    }
                }
                next = next.min(x.next_probe);
            }
            // The control: the first peer with weight that is no suspect.
            if any_due {
                let peer = s.backends.iter().find(|b| b.weight > 0 && !self.suspects.contains_key(&(s.name.clone(), b.identity())));
                if let Some(peer) = peer {
                    if let Ok(t) = target(s, peer) {
                        let c = c.clone();
                        self.prober.submit(control_key(&s.name, &peer.identity()), move || probe(&t, &c));
                    }
                } else {
                    self.controls.entry(s.name.clone()).or_default().passed = None;
                }
            }
        }
        next
    }

    /// One reading of every watched backend's counters, and the new suspects it makes.
    fn read(&mut self, pool: &Pool, dp: &Balancer) {
        for s in pool.services.iter().filter(|s| watched(s)) {
            let Some(live) = dp.installed().iter().find(|l| l.name == s.name) else { continue };
            let mut judged: Vec<(Key, Signals)> = Vec::new();
            for b in live.backends.iter().filter(|b| b.weight > 0) {
                let key = (s.name.clone(), b.identity.clone());
                if let Ok(now) = dp.signals(b.id) {
                    self.window.record(&key, now);
                }
                judged.push((key.clone(), self.window.growth(&key)));
            }
            let growth: Vec<Signals> = judged.iter().map(|j| j.1).collect();
            let outliers = signals::outliers(&growth);
            // A backend that no longer stands out once its hold is over starts afresh.
            for (i, (key, _)) in judged.iter().enumerate() {
                if !outliers.contains(&i) && self.dismissed.get(key).is_some_and(|d| d.at.elapsed() >= d.hold) {
                    self.dismissed.remove(key);
                }
            }
            for i in outliers {
                let best = signals::best_of_peers(&growth, i).map(|b| b.map_or("n/a".to_string(), |v| format!("{v:.2}")));
                let (key, g) = &judged[i];
                if self.suspects.contains_key(key) || self.dismissed.get(key).is_some_and(|d| d.at.elapsed() < d.hold) {
                    continue;
                }
                log(format!(
                    "signals: {} backend {} stands out: {} SYNs sent again, {} early resets and {} ends without data for {} connections ({} handshakes watched) in {} s (its peers' best: {} failed handshakes a connection, {} ends without data a handshake); probing it through the VIP",
                    s.name,
                    label_of(pool, &key.0, &key.1),
                    g.syn_again,
                    g.reset_early,
                    g.no_data,
                    g.syns,
                    g.handshakes,
                    signals::WINDOW,
                    &best[0],
                    &best[1]
                ));
                self.suspects_changed = true;
                self.suspects.insert(key.clone(), Suspect { next_probe: Instant::now(), successes: 0, failures: 0, out: false, said_held: false, said_unsent: false });
            }
        }
    }

    /// Takes the probe results that arrived; true when a backend went out or came back.
    pub(super) fn results(&mut self, pool: &Pool) -> bool {
        let mut changed = false;
        for (key, result, _) in self.prober.drain() {
            if let Some(service) = key.0.strip_suffix("\0control") {
                let c = self.controls.entry(service.to_string()).or_default();
                match &result {
                    Err(f) if !f.local => {
                        c.passed = Some(false);
                        if !c.said_failing {
                            c.said_failing = true;
                            log(format!(
                                "signals: {service}'s peer {} fails through the VIP too ({}): the way through the VIP is at fault, not its suspects; none goes out",
                                label_of(pool, service, &key.1),
                                f.reason
                            ));
                        }
                    }
                    Err(_) => {}
                    Ok(()) => {
                        c.passed = Some(true);
                        c.said_failing = false;
                    }
                }
                continue;
            }
            let Some(s) = pool.service(&key.0).filter(|s| watched(s)) else { continue };
            let Some(check) = &s.health_check else { continue };
            let weighted = s.backends.iter().filter(|b| b.weight > 0).count();
            let out_now = self.suspects.iter().filter(|(k, x)| k.0 == key.0 && x.out).count();
            let control = self.controls.get(&key.0).and_then(|c| c.passed);
            let label = label_of(pool, &key.0, &key.1);
            let Some(x) = self.suspects.get_mut(&key) else { continue };
            match result {
                // The host's own error: nothing was sent, nothing is proved.
                Err(f) if f.local => {
                    if !x.said_unsent {
                        x.said_unsent = true;
                        log(format!("signals: {} backend {label}: the probe through the VIP could not be sent ({}); it stays", key.0, f.reason));
                    }
                }
                Err(f) => {
                    x.successes = 0;
                    x.failures += 1;
                    if x.out || x.failures < check.fall {
                        continue;
                    }
                    if control == Some(true) && out_now < signals::max_out(weighted) {
                        x.out = true;
                        changed = true;
                        log(format!(
                            "signals: {} backend {label} fails through the VIP too ({}, {} in a row; its peer passes): out ({} of {weighted} out by this rule, at most a third)",
                            key.0,
                            f.reason,
                            x.failures,
                            out_now + 1
                        ));
                    } else if !x.said_held && control == Some(true) {
                        x.said_held = true;
                        log(format!(
                            "signals: {} backend {label} fails through the VIP too ({}), but {out_now} of {weighted} are out by this rule already (at most a third): it stays",
                            key.0, f.reason
                        ));
                    }
                }
                Ok(()) => {
                    x.failures = 0;
                    x.successes += 1;
                    if x.successes >= check.rise {
                        let was_out = x.out;
                        self.suspects.remove(&key);
                        self.suspects_changed = true;
                        let hold = next_hold(self.dismissed.get(&key));
                        self.dismissed.insert(key.clone(), Dismissal { at: Instant::now(), hold });
                        changed |= was_out;
                        let then = if was_out { "back" } else { "no longer a suspect" };
                        log(format!("signals: {} backend {label} passes {} probes through the VIP in a row: {then} (not a suspect again for {} s)", key.0, check.rise, hold.as_secs()));
                    }
                }
            }
        }
        changed
    }

    /// What [`Outliers::restore`] puts back when a new pool is refused.
    pub(super) fn keep(&self) -> Kept {
        Kept { window: self.window.clone(), suspects: self.suspects.clone(), dismissed: self.dismissed.clone() }
    }

    pub(super) fn restore(&mut self, kept: Kept) {
        self.window = kept.window;
        self.suspects = kept.suspects;
        self.dismissed = kept.dismissed;
    }

    /// A new pool: backends that stay keep their readings and suspicion; the others are forgotten.
    pub(super) fn renew(&mut self, pool: &Pool) {
        let stays = |k: &Key| pool.service(&k.0).is_some_and(|s| watched(s) && s.backends.iter().any(|b| b.identity() == k.1));
        self.window.retain(stays);
        self.suspects.retain(|k, _| stays(k));
        self.dismissed.retain(|k, _| stays(k));
        self.controls.retain(|s, _| pool.service(s).is_some());
        // A pool with fewer backends may allow fewer out: the last ones named come back.
        for s in pool.services.iter().filter(|s| watched(s)) {
            let allowed = signals::max_out(s.backends.iter().filter(|b| b.weight > 0).count());
            let mut out: Vec<Key> = s.backends.iter().map(|b| (s.name.clone(), b.identity())).filter(|k| self.suspects.get(k).is_some_and(|x| x.out)).collect();
            while out.len() > allowed {
                let Some(k) = out.pop() else { break };
                if let Some(x) = self.suspects.get_mut(&k) {
                    x.out = false;
                    x.said_held = true;
                    log(format!("signals: {} backend {} comes back: the new pool allows {allowed} out by this rule", k.0, k.1));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suspect_that_keeps_standing_out_and_passing_is_held_twice_as_long_each_time() {
        let mut last: Option<Dismissal> = None;
        let mut holds = Vec::new();
        for _ in 0..9 {
            let hold = next_hold(last.as_ref());
            holds.push(hold.as_secs());
            last = Some(Dismissal { at: Instant::now(), hold });
        }
        assert_eq!(holds, vec![5, 10, 20, 40, 80, 160, 300, 300, 300]);
    }
}
