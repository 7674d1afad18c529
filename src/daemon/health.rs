//! Health checks of `lb attach`: when each checked backend is probed, what its results make of
//! it (up after `rise` good probes, down after `fall` failed ones), and the pool the data plane
//! serves with that applied: a down backend's slots go to the others, and a service whose every
//! backend is down is served with all of them (fail open). The probes themselves run on the
//! prober's threads (probe.rs).

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Instant;

use anyhow::Result;

use lb::balancer::Balancer;
use lb::config::{Backend, HealthCheck, Pool, ProbeVia, Service};
use lb::health::{self, HealthMap, Outcome, ProbeRecord, Transition};
use lb::stats::Snapshot;
use lb_dataplane::link::Interface;
use lb_dataplane::probe_path::{self, ProbePath};
use std::net::IpAddr;

use super::describe::{backend_label, label_of};
use super::probe::{probe, Failure, Key, Prober, Target};
use super::signals::{self, Outliers};
use crate::log::log;

/// Where a probe of backend `b` of `s` through the VIP goes, or why it cannot be sent.
fn vip_target(path: &Option<Result<ProbePath, String>>, pool: &Pool, s: &Service, b: &Backend, dp: &Balancer, ifc: &Interface) -> Result<Target, Failure> {
    let fail = |why: String| Failure::new(Outcome::Error, format!("through the VIP: {why}"));
    let ifname = match path {
        Some(Ok(p)) => p.ifname().to_string(),
        Some(Err(e)) => return Err(fail(e.clone())),
        None => return Err(fail("no way out was set up".into())),
    };
    let identity = b.identity();
    let id = dp
        .installed()
        .iter()
        .find(|l| l.name == s.name)
        .and_then(|l| l.backends.iter().find(|lb| lb.identity == identity))
        .map(|lb| lb.id)
        .ok_or_else(|| fail("the backend is not installed yet".into()))?;
    // The data plane drops a probe to a backend whose MAC it does not know yet (at start, say):
    // such a probe is not sent, and says nothing of the backend.
    if dp.mac(dp.neighbour_of(b.address)).is_none() {
        return Err(Failure { local: true, ..fail("the backend's MAC is not resolved yet".into()) });
    }
    // The interface's own address, which the backend answers: not a VIP (one that the host
    // holds there), not link-local.
    let source = ifc
        .addresses
        .iter()
        .find(|a| a.is_ipv4() == s.vip.is_ipv4() && !pool.services.iter().any(|o| o.vip == **a) && !link_local(a))
        .copied()
        .ok_or_else(|| fail(format!("{} has no address of the VIP's family to send from", ifc.name)))?;
    Ok(Target::Vip { addr: SocketAddr::new(s.vip, s.port), source, mark: probe_path::mark(id), ifname })
}

fn link_local(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
    }
}

/// How long after a failure to set up the way through the VIP it is tried again.
const PATH_RETRY: std::time::Duration = std::time::Duration::from_secs(10);

/// Health probes running at once, at most.
const PROBE_WORKERS: usize = 16;

/// What a refused reload puts back: the checks' health and the signals' state.
pub(super) struct Kept {
    map: HealthMap,
    signals: super::signals::Kept,
}

pub(super) struct HealthChecks {
    map: HealthMap,
    prober: Prober<Result<(), Failure>>,
    /// When each checked backend is probed next.
    next_probe: HashMap<Key, Instant>,
    /// The earliest of those (None: nothing is checked); recomputed after every reload.
    probes_due: Option<Instant>,
    /// Services whose every backend is down, served as if all were up.
    failing_open: Vec<String>,
    /// Backends that came back up since the last [`HealthChecks::take_recovered`].
    recovered: Vec<Key>,
    /// The way out of probes through the VIP, set up when a check first asks for it (None:
    /// none has), or why it could not be.
    path: Option<Result<ProbePath, String>>,
    /// When setting it up last failed.
    path_failed_at: Option<Instant>,
    /// Signals from real traffic, and the backends they took out (signals.rs).
    signals: Outliers,
}

impl AsFd for HealthChecks {
    /// Readable when probe results arrived.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.prober.as_fd()
    }
}

impl HealthChecks {
    /// Every backend starts healthy, and every checked one is probed at once.
    pub(super) fn new() -> Result<HealthChecks> {
        Ok(HealthChecks {
            map: HealthMap::new(),
            prober: Prober::new(PROBE_WORKERS)?,
            next_probe: HashMap::new(),
            probes_due: Some(Instant::now()),
            failing_open: Vec::new(),
            recovered: Vec::new(),
            path: None,
            path_failed_at: None,
            signals: Outliers::new()?,
        })
    }

    pub(super) fn map(&self) -> &HealthMap {
        &self.map
    }

    /// Queues the probes that are due, scanning every checked backend only when one is (not on
    /// every wake-up of the loop); returns when the next one is.
    /// `dp` and `ifc`: where probes through the VIP leave, and the backends' ids they carry.
    /// Also reads the signals from real traffic when a second has passed.
    pub(super) fn schedule(&mut self, now: Instant, pool: &Pool, dp: &Balancer, ifc: &Interface) -> Option<Instant> {
        if self.probes_due.is_some_and(|due| now >= due) {
            self.open_path(pool, dp, ifc, false);
            self.probes_due = self.submit_due(now, pool, dp, ifc);
        }
        if !pool.services.iter().any(signals::watched) {
            return self.probes_due;
        }
        self.signals.read_due(now, pool, dp);
        // The way out is set up only once a suspect needs it.
        if self.signals.has_suspects() {
            self.open_path(pool, dp, ifc, true);
        }
        let path = &self.path;
        let next = self.signals.probe_due(now, pool, |s, b| vip_target(path, pool, s, b, dp, ifc));
        Some(self.probes_due.map_or(next, |d| d.min(next)))
    }

    /// Whether the signals made or cleared a suspect since the last call.
    pub(super) fn take_suspects_changed(&mut self) -> bool {
        self.signals.take_suspects_changed()
    }

    /// The signals' probes' descriptor: readable when their results arrived.
    pub(super) fn signals_fd(&self) -> BorrowedFd<'_> {
        self.signals.as_fd()
    }

    /// A backend's signals as last read, and whether they made it a suspect or took it out.
    pub(super) fn signals_of(&self, key: &Key) -> Option<lb::metrics::BackendSignals> {
        self.signals.of(key)
    }

    /// Sets up the way out of probes through the VIP the first time a check asks for it, or
    /// (`suspects`) the signals have a suspect to probe.
    fn open_path(&mut self, pool: &Pool, dp: &Balancer, ifc: &Interface, suspects: bool) {
        let wanted = suspects || pool.services.iter().any(|s| s.health_check.as_ref().is_some_and(|c| c.via == ProbeVia::Vip));
        // Once set up it stays; a failure is tried again after PATH_RETRY (the interface may
        // have been down, say).
        let retry = self.path_failed_at.is_some_and(|at| at.elapsed() >= PATH_RETRY);
        if !wanted || (self.path.is_some() && !retry) {
            return;
        }
        // accept_local only where a VIP is one of the host's own addresses: only then does IPv4
        // take the answers for martians.
        let local_vip = pool.services.iter().any(|s| lb_dataplane::link::owner_of(s.vip).is_some());
        let path = dp.open_probe_path(ifc.ifindex, &ifc.name, ifc.mac, local_vip).map_err(|e| format!("{e:#}"));
        self.path_failed_at = path.is_err().then(Instant::now);
        match &path {
            Ok(p) => {
                let rule = format!("fwmark 0x{:x}/0xffff0000 oif {} lookup {}", probe_path::mark(0), ifc.name, probe_path::table(ifc.ifindex));
                log(format!("health: probes through the VIP leave {} by its egress program and the rule `{rule}`", ifc.name));
                for m in &p.missing {
                    log(format!("health: {m}; probes of that family through the VIP fail"));
                }
                for w in &p.warnings {
                    log(format!("health: {w}"));
                }
            }
            Err(e) => log(format!("health: probes through the VIP cannot be sent ({e}); each of them fails until it can (tried again every {} s)", PATH_RETRY.as_secs())),
        }
        self.path = Some(path);
    }

    /// Where the probe of backend `b` of `s` goes, or why it cannot be sent.
    fn target(&self, pool: &Pool, s: &Service, b: &Backend, check: &HealthCheck, dp: &Balancer, ifc: &Interface) -> Result<Target, Failure> {
        if check.via == ProbeVia::Backend {
            return Ok(Target::Backend(SocketAddr::new(b.address, check.port)));
        }
        vip_target(&self.path, pool, s, b, dp, ifc)
    }

    /// Queues the probes that are due; returns when the next one is.
    fn submit_due(&mut self, now: Instant, pool: &Pool, dp: &Balancer, ifc: &Interface) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for s in &pool.services {
            let Some(check) = &s.health_check else { continue };
            for b in s.backends.iter().filter(|b| b.weight > 0) {
                let key = (s.name.clone(), b.identity());
                let due = *self.next_probe.entry(key.clone()).or_insert(now);
                let due = if due <= now {
                    match self.target(pool, s, b, check, dp, ifc) {
                        // Not sent yet (its MAC is being resolved): no result either way.
                        Err(f) if f.local => {}
                        target => {
                            let c = check.clone();
                            let _ = self.prober.submit(key.clone(), move || target.and_then(|t| probe(&t, &c)));
                        }
                    }
                    let again = now + check.interval;
                    self.next_probe.insert(key, again);
                    again
                } else {
                    due
                };
                next = Some(next.map_or(due, |n| n.min(due)));
            }
        }
        next
    }

    /// Takes the probe results that arrived (each backend's probe record, once a result is
    /// added to it, also goes to `seen`); true when a backend changed state, so that the pool
    /// is installed again.
    /// `shared`: the fleet decides (this node's checks are one view of several), which the log
    /// says instead of what the slots do.
    pub(super) fn results(&mut self, pool: &Pool, shared: bool, mut seen: impl FnMut(&Key, &ProbeRecord)) -> bool {
        let mut changed = self.signals.results(pool);
        for (key, result, took) in self.prober.drain() {
            let Some(s) = pool.service(&key.0) else { continue };
            let Some(check) = &s.health_check else { continue };
            // A backend a reload took out while its probe ran: an entry made for it now would
            // outlive the reload that forgot it.
            if !s.backends.iter().any(|b| b.identity() == key.1) {
                continue;
            }
            let h = self.map.entry(key.clone()).or_default();
            h.probes.add(result.as_ref().map_or_else(|f| f.outcome, |()| Outcome::Success), took);
            seen(&key, &h.probes);
            let label = label_of(pool, &key.0, &key.1);
            match h.record(result.map_err(String::from), check.rise, check.fall) {
                Some(Transition::Down { failures, reason }) => {
                    let then = if shared { "this node tells the fleet" } else { "its slots go to the others" };
                    log(format!("health: {} backend {label} is down after {failures} failed probes ({reason}); {then}", key.0));
                    changed = true;
                }
                Some(Transition::Up { successes }) => {
                    let then = if shared { "this node tells the fleet" } else { "its slots come back" };
                    log(format!("health: {} backend {label} is up after {successes} good probes; {then}", key.0));
                    self.recovered.push(key.clone());
                    changed = true;
                }
                None => {}
            }
        }
        changed
    }

    /// The backends that came back up since the last call (slow start begins for them).
    pub(super) fn take_recovered(&mut self) -> Vec<Key> {
        std::mem::take(&mut self.recovered)
    }

    /// The backends this node's own checks see down, and those its signals took out.
    pub(super) fn down_set(&self, pool: &Pool) -> BTreeSet<Key> {
        let mut down: BTreeSet<Key> = self.map.iter().filter(|(k, h)| !h.healthy && pool.service(&k.0).is_some_and(|s| s.health_check.is_some())).map(|(k, _)| k.clone()).collect();
        down.extend(self.signals.out());
        down
    }

    /// The pool with health applied, saying which services begin or stop failing open: this
    /// node's own checks, or the fleet's decision (`decided`: the backends it takes as down).
    pub(super) fn effective(&mut self, pool: &Pool, decided: Option<&BTreeSet<Key>>) -> Pool {
        let shared;
        let map = match decided {
            Some(down) => {
                let mut m = self.map.clone();
                for (k, h) in m.iter_mut() {
                    h.healthy = !down.contains(k);
                }
                for k in down {
                    m.entry(k.clone()).or_default().healthy = false;
                }
                shared = m;
                &shared
            }
            None => {
                // This node's own: its checks, and the backends its signals took out.
                let out = self.signals.out();
                if out.is_empty() {
                    &self.map
                } else {
                    let mut m = self.map.clone();
                    for k in out {
                        let h = m.entry(k).or_default();
                        h.healthy = false;
                        h.last_error.get_or_insert_with(|| "signals, and failing through the VIP".to_string());
                    }
                    shared = m;
                    &shared
                }
            }
        };
        let (effective, open) = health::effective(pool, map);
        for s in &open {
            if !self.failing_open.contains(s) {
                log(format!("health: every backend of {s} is down; serving {s} with all of them (fail open) until one is up"));
            }
        }
        for s in &self.failing_open {
            if !open.contains(s) && pool.service(s).is_some() {
                log(format!("health: {s} has a healthy backend again; unhealthy ones are left out again"));
            }
        }
        self.failing_open = open;
        effective
    }

    /// A new pool is being applied: the health of backends that stay is kept, new ones start
    /// healthy and are probed at once. Returns the health as it was, for [`HealthChecks::restore`]
    /// when the pool is refused.
    pub(super) fn renew(&mut self, pool: &Pool) -> Kept {
        let kept = Kept { map: self.map.clone(), signals: self.signals.keep() };
        health::retain(&mut self.map, pool);
        self.signals.renew(pool);
        self.probes_due = Some(Instant::now());
        self.next_probe.retain(|k, _| {
            pool.service(&k.0).is_some_and(|s| s.health_check.is_some() && s.backends.iter().any(|b| b.identity() == k.1))
        });
        kept
    }

    pub(super) fn restore(&mut self, kept: Kept) {
        self.map = kept.map;
        self.signals.restore(kept.signals);
    }

    /// A backend's state in words: its check's, or that its signals took it out.
    fn describe(&self, key: &Key) -> String {
        match self.map.get(key) {
            Some(h) if !h.healthy => h.describe(),
            _ if self.signals.is_out(key) => "down (signals, and failing through the VIP)".to_string(),
            h => h.map_or("healthy".to_string(), |h| h.describe()),
        }
    }

    /// `web: b1 10.0.0.1 healthy, b2 10.0.0.2 down (timeout)` for every checked service.
    pub(super) fn summary(&self, pool: &Pool) -> Vec<String> {
        let mut out = Vec::new();
        for s in pool.services.iter().filter(|s| s.health_check.is_some()) {
            let states: Vec<String> = s
                .backends
                .iter()
                .map(|b| {
                    format!("{} {}", backend_label(b), self.describe(&(s.name.clone(), b.identity())))
                })
                .collect();
            out.push(format!("{}: {}", s.name, states.join(", ")));
        }
        out
    }

    /// Writes each checked backend's health into a counter snapshot, for `--stats-interval`.
    pub(super) fn annotate(&self, pool: &Pool, snap: &mut Snapshot) {
        for s in snap.services.iter_mut() {
            if pool.service(&s.name).is_some_and(|c| c.health_check.is_some()) {
                for b in s.backends.iter_mut() {
                    b.health = Some(self.describe(&(s.name.clone(), b.label.clone())));
                }
            }
        }
    }
}
