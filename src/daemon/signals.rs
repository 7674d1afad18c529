//! Signals from real traffic in `lb attach` (docs/operating.md, "Signals from real traffic"):
//! once a second, each checked tracked TCP service's backends' counters are read from the data
//! plane and judged by lb::health::signals; an outlier becomes a suspect, probed through the VIP
//! at once and then every check interval, on threads of its own (so that a regular probe in
//! flight never holds it up). A suspect whose probe through the VIP fails is out, unless a third
//! of its service's backends are out by this rule already; it is back, and no longer a suspect,
//! after `rise` good probes in a row.

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use anyhow::Result;

use lb::balancer::Balancer;
use lb::config::{Pool, Service};
use lb::health::signals::{self, Signals, Window};

use super::describe::label_of;
use super::probe::{probe, Failure, Key, Prober, Target};
use crate::log::log;

/// How often the counters are read.
pub(super) const TICK: Duration = Duration::from_secs(1);
/// Probes through the VIP of suspects running at once, at most.
const WORKERS: usize = 4;

/// A backend whose signals stood out.
#[derive(Debug, Clone)]
struct Suspect {
    next_probe: Instant,
    /// Good probes through the VIP in a row.
    successes: u32,
    /// Out by this rule (its probe through the VIP failed, and the limit allowed it).
    out: bool,
    /// Held in by the limit: said once.
    held: bool,
}

pub(super) struct Outliers {
    window: Window<Key>,
    prober: Prober<Result<(), Failure>>,
    suspects: HashMap<Key, Suspect>,
    next_tick: Instant,
}

impl AsFd for Outliers {
    /// Readable when probe results arrived.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.prober.as_fd()
    }
}

/// Whether the rule watches service `s`.
pub(super) fn watched(s: &Service) -> bool {
    s.health_check.as_ref().is_some_and(|c| c.signals)
}

impl Outliers {
    pub(super) fn new() -> Result<Outliers> {
        Ok(Outliers { window: Window::default(), prober: Prober::new(WORKERS)?, suspects: HashMap::new(), next_tick: Instant::now() + TICK })
    }

    /// The backends out by this rule.
    pub(super) fn out(&self) -> BTreeSet<Key> {
        self.suspects.iter().filter(|(_, s)| s.out).map(|(k, _)| k.clone()).collect()
    }

    /// A backend's counters as last read, and whether it is out by this rule.
    pub(super) fn of(&self, key: &Key) -> Option<(Signals, bool)> {
        self.window.latest(key).map(|s| (s, self.suspects.get(key).is_some_and(|x| x.out)))
    }

    /// Reads the counters when a second has passed and judges each watched service; true when it
    /// did (the metrics have news).
    pub(super) fn read_due(&mut self, now: Instant, pool: &Pool, dp: &Balancer) -> bool {
        if now < self.next_tick {
            return false;
        }
        self.next_tick = now + TICK;
        self.read(pool, dp);
        true
    }

    pub(super) fn has_suspects(&self) -> bool {
        !self.suspects.is_empty()
    }

    /// Queues the probes through the VIP that are due; `target` says where a backend's goes, or
    /// why it cannot be sent: then it is not probed, and stays (a probe that was never sent
    /// proves nothing). Returns when to come back.
    pub(super) fn probe_due(&mut self, now: Instant, pool: &Pool, target: impl Fn(&Service, &lb::config::Backend) -> Result<Target, Failure>) -> Instant {
        let mut next = self.next_tick;
        for s in pool.services.iter().filter(|s| watched(s)) {
            let Some(check) = &s.health_check else { continue };
            for b in &s.backends {
                let key = (s.name.clone(), b.identity());
                let Some(x) = self.suspects.get_mut(&key) else { continue };
                if x.next_probe <= now {
                    x.next_probe = now + check.interval;
                    match target(s, b) {
                        Ok(t) => {
                            let c = check.clone();
                            if !self.prober.submit(key.clone(), move || probe(&t, &c)) {
                                x.next_probe = now;
                            }
                        }
                        Err(f) if !x.held => {
                            x.held = true;
                            log(format!("signals: {} backend {} cannot be probed through the VIP ({}): it stays", s.name, label_of(pool, &key.0, &key.1), f.reason));
                        }
                        Err(_) => {}
                    }
                }
                next = next.min(x.next_probe);
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
            let best = growth.iter().filter(|g| g.syns >= signals::MIN_SYNS).map(|g| g.bad_share()).fold(f64::INFINITY, f64::min);
            for i in signals::outliers(&growth) {
                let (key, g) = &judged[i];
                if self.suspects.contains_key(key) {
                    continue;
                }
                log(format!(
                    "signals: {} backend {} stands out: {} SYNs sent again and {} early resets for {} connections in {} s (its peers' best: {:.2} a connection); probing it through the VIP",
                    s.name,
                    label_of(pool, &key.0, &key.1),
                    g.syn_again,
                    g.reset_early,
                    g.syns,
                    signals::WINDOW,
                    if best.is_finite() { best } else { 0.0 }
                ));
                self.suspects.insert(key.clone(), Suspect { next_probe: Instant::now(), successes: 0, out: false, held: false });
            }
        }
    }

    /// Takes the probe results that arrived; true when a backend went out or came back.
    pub(super) fn results(&mut self, pool: &Pool) -> bool {
        let mut changed = false;
        for (key, result, _) in self.prober.drain() {
            let Some(s) = pool.service(&key.0).filter(|s| watched(s)) else { continue };
            let Some(check) = &s.health_check else { continue };
            let weighted = s.backends.iter().filter(|b| b.weight > 0).count();
            let out_now = self.suspects.iter().filter(|(k, x)| k.0 == key.0 && x.out).count();
            let label = label_of(pool, &key.0, &key.1);
            let Some(x) = self.suspects.get_mut(&key) else { continue };
            match result {
                Err(f) if !x.out => {
                    x.successes = 0;
                    if out_now < signals::max_out(weighted) {
                        x.out = true;
                        changed = true;
                        log(format!(
                            "signals: {} backend {label} fails through the VIP too ({}): out ({} of {weighted} out by this rule, at most a third)",
                            key.0,
                            f.reason,
                            out_now + 1
                        ));
                    } else if !x.held {
                        x.held = true;
                        log(format!(
                            "signals: {} backend {label} fails through the VIP too ({}), but {out_now} of {weighted} are out by this rule already (at most a third): it stays",
                            key.0, f.reason
                        ));
                    }
                }
                Err(_) => x.successes = 0,
                Ok(()) => {
                    x.successes += 1;
                    if x.successes >= check.rise {
                        let was_out = x.out;
                        self.suspects.remove(&key);
                        changed |= was_out;
                        let then = if was_out { "back" } else { "no longer a suspect" };
                        log(format!("signals: {} backend {label} passes {} probes through the VIP in a row: {then}", key.0, check.rise));
                    }
                }
            }
        }
        changed
    }

    /// A new pool: backends that stay keep their readings and suspicion; the others are forgotten.
    pub(super) fn renew(&mut self, pool: &Pool) {
        let stays = |k: &Key| pool.service(&k.0).is_some_and(|s| watched(s) && s.backends.iter().any(|b| b.identity() == k.1));
        self.window.retain(stays);
        self.suspects.retain(|k, _| stays(k));
    }
}
