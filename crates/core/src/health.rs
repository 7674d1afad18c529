//! Backend health: the rise/fall state machine, and what health does to a pool. Kernel-free:
//! `lb attach` runs the probes and feeds their results here.
//!
//! A backend starts healthy. A restart of lb (or a reload) must not take a service down for
//! `rise x interval` while probes warm up; a backend that really is down leaves after `fall`
//! failed probes, the first of which runs at once. An unhealthy backend counts as weight 0, so
//! by the table properties only its own slots move, and they come back when it recovers.
//! When every backend of a service is unhealthy, the service is served as if all were healthy
//! (fail open): all failing together more often means the checks cannot reach the backends than
//! that every backend died, and dropping every packet would turn a broken check into an outage.

use std::collections::HashMap;

use crate::config::{Pool, Service};

mod probes;
pub mod signals;
pub use probes::{Outcome, ProbeRecord, LATENCY_BUCKETS};

/// One backend's health, as rise/fall see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub healthy: bool,
    /// Consecutive results against the current state (successes while unhealthy, failures
    /// while healthy).
    streak: u32,
    /// Why the last probe failed, if it did.
    pub last_error: Option<String>,
    /// Every probe's outcome and latency, for the metrics and the status page; rise and fall
    /// never read it.
    pub probes: ProbeRecord,
}

impl Default for Health {
    fn default() -> Health {
        Health { healthy: true, streak: 0, last_error: None, probes: ProbeRecord::default() }
    }
}

/// A change of state, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Up { successes: u32 },
    Down { failures: u32, reason: String },
}

impl Health {
    /// Takes one probe result. Returns the transition when `rise` successes in a row make an
    /// unhealthy backend healthy, or `fall` failures in a row make a healthy one unhealthy.
    pub fn record(&mut self, result: Result<(), String>, rise: u32, fall: u32) -> Option<Transition> {
        match (self.healthy, result) {
            (true, Ok(())) => {
                self.streak = 0;
                self.last_error = None;
                None
            }
            (true, Err(e)) => {
                self.streak += 1;
                self.last_error = Some(e.clone());
                if self.streak >= fall {
                    self.healthy = false;
                    self.streak = 0;
                    return Some(Transition::Down { failures: fall, reason: e });
                }
                None
            }
            (false, Ok(())) => {
                self.streak += 1;
                if self.streak >= rise {
                    self.healthy = true;
                    self.streak = 0;
                    self.last_error = None;
                    return Some(Transition::Up { successes: rise });
                }
                None
            }
            (false, Err(e)) => {
                self.streak = 0;
                self.last_error = Some(e);
                None
            }
        }
    }

    /// `healthy`, or `down (reason)`, for logs and stats.
    pub fn describe(&self) -> String {
        match (self.healthy, &self.last_error) {
            (true, _) => "healthy".to_string(),
            (false, Some(e)) => format!("down ({e})"),
            (false, None) => "down".to_string(),
        }
    }
}

/// Health of every checked backend, keyed by (service name, backend identity).
pub type HealthMap = HashMap<(String, String), Health>;

/// The pool as served: unhealthy backends of checked services are `Down` (no slots, and tracked
/// flows leave them), except in a service where every serving backend is unhealthy (fail open). Returns the pool and the
/// names of the services that failed open.
pub fn effective(pool: &Pool, health: &HealthMap) -> (Pool, Vec<String>) {
    let mut out = pool.clone();
    let mut open = Vec::new();
    for s in &mut out.services {
        if s.health_check.is_none() {
            continue;
        }
        let down = |s: &Service, i: usize| {
            health.get(&(s.name.clone(), s.backends[i].identity())).is_some_and(|h| !h.healthy)
        };
        let live: Vec<usize> = (0..s.backends.len()).filter(|&i| s.backends[i].serving_weight() > 0).collect();
        if !live.is_empty() && live.iter().all(|&i| down(s, i)) {
            open.push(s.name.clone());
            continue;
        }
        // Draining backends too: their tracked flows must not go to a backend that fails.
        let gone: Vec<usize> = (0..s.backends.len()).filter(|&i| down(s, i)).collect();
        for i in gone {
            s.backends[i].state = crate::config::BackendState::Down;
        }
    }
    (out, open)
}

/// Keeps the health of backends that stay (same service and identity) and forgets the rest.
pub fn retain(health: &mut HealthMap, pool: &Pool) {
    health.retain(|(svc, id), _| {
        pool.service(svc).is_some_and(|s| s.health_check.is_some() && s.backends.iter().any(|b| b.identity() == *id))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_str;

    #[test]
    fn rise_and_fall_need_consecutive_results() {
        let mut h = Health::default();
        assert!(h.healthy, "backends start healthy");
        let fail = || Err("connection refused".to_string());
        assert_eq!(h.record(fail(), 2, 3), None);
        assert_eq!(h.record(fail(), 2, 3), None);
        assert_eq!(h.record(Ok(()), 2, 3), None, "a success resets the failures");
        assert_eq!(h.record(fail(), 2, 3), None);
        assert_eq!(h.record(fail(), 2, 3), None);
        assert_eq!(h.record(fail(), 2, 3), Some(Transition::Down { failures: 3, reason: "connection refused".into() }));
        assert!(!h.healthy);
        assert_eq!(h.describe(), "down (connection refused)");
        assert_eq!(h.record(Ok(()), 2, 3), None);
        assert_eq!(h.record(fail(), 2, 3), None, "a failure resets the successes");
        assert_eq!(h.record(Ok(()), 2, 3), None);
        assert_eq!(h.record(Ok(()), 2, 3), Some(Transition::Up { successes: 2 }));
        assert!(h.healthy && h.describe() == "healthy");
    }

    #[test]
    fn a_flapping_backend_never_changes_state_when_rise_and_fall_are_not_met() {
        let mut h = Health::default();
        let mut transitions = 0;
        for i in 0..100 {
            let r = if i % 2 == 0 { Err("timeout".to_string()) } else { Ok(()) };
            transitions += h.record(r, 2, 2).is_some() as u32;
        }
        assert_eq!(transitions, 0, "alternating results must not churn the table");
        // Two failures in a row do; then alternating again keeps it down.
        h.record(Err("timeout".into()), 2, 2);
        assert!(h.record(Err("timeout".into()), 2, 2).is_some());
        for i in 0..10 {
            let r = if i % 2 == 0 { Ok(()) } else { Err("timeout".to_string()) };
            assert!(h.record(r, 2, 2).is_none());
        }
        assert!(!h.healthy);
    }

    const POOL: &str = "services:
  - name: web
    vip: 10.0.0.1
    port: 80
    health_check: {kind: tcp}
    backends: [{address: 10.0.0.2, name: b1}, {address: 10.0.0.3, name: b2}, {address: 10.0.0.4, name: b3, weight: 0}]
  - name: raw
    vip: 10.0.0.1
    port: 81
    backends: [{address: 10.0.0.2, name: b1}]
";

    fn down(map: &mut HealthMap, svc: &str, id: &str) {
        let h = map.entry((svc.to_string(), id.to_string())).or_default();
        for _ in 0..3 {
            h.record(Err("refused".into()), 2, 3);
        }
    }

    #[test]
    fn unhealthy_backends_get_weight_zero_unless_all_are_down() {
        let pool = parse_str("p.yaml", POOL).expect("valid");
        let mut map = HealthMap::new();
        let (p, open) = effective(&pool, &map);
        assert_eq!((p, open.len()), (pool.clone(), 0), "all healthy: the pool as written");

        down(&mut map, "web", "b2");
        let (p, open) = effective(&pool, &map);
        assert_eq!(p.services[0].backends.iter().map(|b| b.serving_weight()).collect::<Vec<_>>(), vec![1, 0, 0]);
        assert_eq!(p.services[0].backends[1].state, crate::config::BackendState::Down);
        assert!(open.is_empty());

        // b3 has weight 0 anyway: with b1 and b2 down, every backend that has weight is down.
        down(&mut map, "web", "b1");
        let (p, open) = effective(&pool, &map);
        assert_eq!(open, vec!["web".to_string()]);
        assert_eq!(p.services[0].backends.iter().map(|b| b.serving_weight()).collect::<Vec<_>>(), vec![1, 1, 0], "fail open");

        // A draining backend that fails its checks is down as well: its tracked flows leave it.
        let drained = parse_str("p.yaml", &POOL.replace("{address: 10.0.0.3, name: b2}", "{address: 10.0.0.3, name: b2, state: drain}")).expect("valid");
        let mut map2 = HealthMap::new();
        down(&mut map2, "web", "b2");
        let (p, open) = effective(&drained, &map2);
        assert!(open.is_empty());
        assert_eq!(p.services[0].backends[1].state, crate::config::BackendState::Down);

        // A service without checks is never touched, even with an entry in the map.
        down(&mut map, "raw", "b1");
        assert_eq!(effective(&pool, &map).0.services[1], pool.services[1]);
    }

    #[test]
    fn a_reload_keeps_the_health_of_backends_that_stay() {
        let mut map = HealthMap::new();
        down(&mut map, "web", "b1");
        down(&mut map, "web", "b2");
        down(&mut map, "raw", "b1");
        for h in map.values_mut() {
            h.probes.add(Outcome::Refused, std::time::Duration::from_millis(1));
        }
        let next = parse_str("p.yaml", &POOL.replace("{address: 10.0.0.3, name: b2}, ", "")).expect("valid");
        retain(&mut map, &next);
        assert!(map.get(&("web".into(), "b1".into())).is_some_and(|h| !h.healthy), "b1 stays down");
        assert!(map.get(&("web".into(), "b1".into())).is_some_and(|h| h.probes.count(Outcome::Refused) == 1), "and keeps its probe counts");
        assert!(!map.contains_key(&("web".into(), "b2".into())), "b2 left the pool");
        assert!(!map.contains_key(&("raw".into(), "b1".into())), "raw has no checks");
    }
}
