//! Load-aware weights: what backends' agents report, slow start, and the weights lb serves with
//! them, so that every node that reads the same reports builds the same table. Kernel-free:
//! `lb attach` asks the agents (src/daemon/agents.rs) and feeds the answers here.
//!
//! Agreement is the constraint that shapes everything here. Two nodes ask the same agents at
//! slightly different moments and may have started at different times, so nothing may depend on
//! a node's own history beyond a bounded number of wall-clock epochs: an epoch is
//! `floor(unix time / interval)`; each node asks each agent once per epoch, [`POLL_AT`] into it,
//! and decides the epoch's weights [`DECIDE_AT`] into it from the reports of at most the last
//! [`HISTORY`] epochs. A backend's effective capacity is a pure function of those (weigh.rs:
//! a median of five epochs against flapping, a band of [`BAND`] points of hysteresis, at most
//! [`MAX_CHANGE`] points an epoch), so two nodes that read the same reports hold the same
//! weights and build the same table.
//!
//! - An epoch with no usable report (no answer, or garbage) carries the last good one, however
//!   old: an agent that stops answering leaves the weight as it was. No good report ever is full
//!   capacity. A node that starts while an agent is silent disagrees until it answers again.
//! - `drain` and `down` take effect after [`RUN`] intervals in a row of them and end after as
//!   many of another state: a drained backend keeps its tracked connections and gets no new
//!   ones; a down one loses both, as a failed health check. A flapping agent changes nothing.
//! - Slow start ramps a backend's share over the window from the [`RAMP_ALIGN`] mark after it
//!   joined the pool, came back from a failed health check, or its agent's `down` ended; the ramp
//!   is quantized to [`RAMP_STEP`] points, so nodes that saw the change within one mark agree.
//! - A restart that adopts a pinned plane seeds each backend with the capacity the plane serves
//!   it at ([`Loads::seed`]).
//!
//! Weights of such services are written to the tables in points: 1/[`WEIGHT_STEPS`] of the
//! configured weight. A backend at 35% of weight 2 is written as 70 of 200.

mod report;
mod weigh;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

pub use report::{parse, Report, State};
pub use weigh::{combined, effective_capacity, held_state, slow_start_share, table_weight, BAND, BLOCK, HISTORY, MAX_CHANGE, PERSIST, RAMP_STEP, RUN, STEP, WINDOW};

use crate::config::{BackendState, Pool, Service, WEIGHT_STEPS};

/// (service name, backend identity)
pub type Key = (String, String);

/// How far into its epoch each agent is asked.
pub const POLL_AT: f64 = 0.3;
/// How far into its epoch the epoch's weights are decided; a report that comes later is not used.
pub const DECIDE_AT: f64 = 0.9;

/// The length of a service's epochs: its agent's interval, or a second for slow start alone.
pub fn epoch_length(s: &Service) -> Duration {
    s.agent.as_ref().map_or(Duration::from_secs(1), |a| a.interval)
}

fn millis(len: Duration) -> u64 {
    (len.as_millis() as u64).max(1)
}

/// The wall clock load intervals are cut from (every node and agent shares it): lb's one clock.
pub use crate::clock::unix_ms;

/// The epoch `unix_ms` falls in.
pub fn epoch_at(unix_ms: u64, len: Duration) -> u64 {
    unix_ms / millis(len)
}

/// Unix milliseconds of the point `fraction` into `epoch`.
pub fn point_in(epoch: u64, fraction: f64, len: Duration) -> u64 {
    epoch * millis(len) + (millis(len) as f64 * fraction) as u64
}

/// Ramps begin on a boundary of this much wall-clock time, so that nodes that see a backend
/// join within it ramp alike.
pub const RAMP_ALIGN: Duration = Duration::from_secs(5);

/// The epoch a ramp that begins in `epoch` starts from: the next RAMP_ALIGN boundary.
fn ramp_start(epoch: u64, len: Duration) -> u64 {
    let every = (millis(RAMP_ALIGN).div_ceil(millis(len))).max(1);
    epoch.div_ceil(every) * every
}

/// The newest epoch whose weights are decided at `unix_ms`.
pub fn decided_epoch(unix_ms: u64, len: Duration) -> u64 {
    unix_ms.saturating_sub((millis(len) as f64 * DECIDE_AT) as u64) / millis(len)
}

/// What lb knows of one backend's load.
#[derive(Debug, Clone, Default)]
pub struct BackendLoad {
    /// Each recent epoch's report; None: no usable answer that epoch.
    reports: BTreeMap<u64, Option<Report>>,
    /// The newest good report of the epochs dropped from `reports`.
    carried: Option<Report>,
    /// The epoch its slow start began in.
    ramp_from: Option<u64>,
}

impl BackendLoad {
    /// The state its agent holds in `epoch`: drain or down after RUN intervals in a row of it,
    /// over the last HISTORY intervals (weigh.rs).
    fn state_at(&self, epoch: u64) -> State {
        let first = epoch.saturating_sub(HISTORY as u64 - 1);
        let state_of = |r: &Report| r.state.unwrap_or(State::Ready);
        let states: Vec<Option<State>> = (first..=epoch).map(|e| self.reports.get(&e).copied().flatten().as_ref().map(state_of)).collect();
        held_state(&states)
    }

    /// The newest epoch at or before `epoch`, within the history, in which the state its agent
    /// held stopped being down.
    fn back_from_down(&self, epoch: u64) -> Option<u64> {
        let first = epoch.saturating_sub(HISTORY as u64 - 1).max(1);
        (first..=epoch).rev().find(|&e| self.state_at(e - 1) == State::Down && self.state_at(e) != State::Down)
    }
}

/// Why a backend is served with other than its configured weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjustment {
    /// The share of its configured weight it is served with, in percent.
    pub percent: u32,
    /// The effective capacity from its agent's reports (None: no agent).
    pub capacity: Option<u32>,
    /// Its slow-start share, while it ramps.
    pub ramp: Option<u32>,
    /// `drain` or `down` from its agent.
    pub state: Option<State>,
    /// Its agent's newest good report's capacity, as reported.
    pub reported: Option<u32>,
}

impl Adjustment {
    /// `agent 35%, slow start 40%`, or `agent says drain` (which says it all); empty when
    /// nothing differs.
    pub fn why(&self) -> String {
        let mut parts = Vec::new();
        match self.state {
            Some(State::Drain) => return "agent says drain".to_string(),
            Some(State::Down) => return "agent says down".to_string(),
            _ => {}
        }
        if let Some(c) = self.capacity.filter(|&c| c < 100) {
            parts.push(format!("agent {c}%"));
        }
        if let Some(r) = self.ramp {
            parts.push(format!("slow start {r}%"));
        }
        parts.join(", ")
    }
}

/// The pool as served with load applied: the pool, each adjusted backend's adjustment, and the
/// services that failed open (load would have left them no backend).
pub struct Served {
    pub pool: Pool,
    pub adjustments: HashMap<Key, Adjustment>,
    pub failing_open: Vec<String>,
}

/// `pool` as lb serves it before any agent answers and with nothing ramping: the weights of
/// load-aware services in points. What `lb table` and `lb diff` build, so that their tables and
/// digests are the live ones at full capacity.
pub fn at_full_capacity(pool: &Pool) -> Pool {
    Loads::new().apply(pool, 0).pool
}

/// Every load-aware backend's reports and ramp.
#[derive(Debug, Clone, Default)]
pub struct Loads {
    backends: HashMap<Key, BackendLoad>,
}

impl Loads {
    pub fn new() -> Loads {
        Loads::default()
    }

    /// Takes the report of `epoch` (None: no usable answer) for a backend of a service whose
    /// intervals are `len` long. When the state its agent held ends being down in this epoch,
    /// the backend's slow start begins.
    pub fn record(&mut self, key: &Key, epoch: u64, len: Duration, report: Option<Report>) {
        let b = self.backends.entry(key.clone()).or_default();
        b.reports.insert(epoch, report);
        // Found from the history (not from this answer alone), so that an answer this node
        // missed cannot make it miss the ramp: every answer recorded looks again.
        if let Some(back) = b.back_from_down(epoch) {
            let from = ramp_start(back, len);
            b.ramp_from = Some(b.ramp_from.map_or(from, |f| f.max(from)));
        }
        // Keep the window, the epoch before it, and a few epochs of slack for reports that
        // arrive ahead of the decision.
        let oldest = epoch.saturating_sub(HISTORY as u64 + 4);
        while let Some((&e, _)) = b.reports.first_key_value() {
            if e >= oldest {
                break;
            }
            if let Some((_, Some(r))) = b.reports.pop_first() {
                b.carried = Some(r);
            }
        }
    }

    /// A backend joined the pool or came back from a failed health check in `epoch` (of `len`):
    /// its slow start begins at the next RAMP_ALIGN boundary.
    pub fn joined(&mut self, key: &Key, epoch: u64, len: Duration) {
        self.backends.entry(key.clone()).or_default().ramp_from = Some(ramp_start(epoch, len));
    }

    /// Seeds a backend that has no reports yet with the capacity it is served at now (read back
    /// from a pinned data plane at a restart), so that a restarted node goes on from the weights
    /// the fleet serves instead of from full capacity.
    pub fn seed(&mut self, key: &Key, capacity: u32) {
        let b = self.backends.entry(key.clone()).or_default();
        if b.reports.is_empty() && b.carried.is_none() {
            b.carried = Some(Report { state: None, capacity: Some(capacity.min(100) as u8) });
        }
    }

    /// The pool that replaces `old` (None at start: nothing ramps): backends of slow-start
    /// services that begin to serve in it start their ramp in the epoch of `unix_ms`; backends
    /// and services that left are forgotten.
    pub fn renew(&mut self, old: Option<&Pool>, new: &Pool, unix_ms: u64) {
        self.backends.retain(|(svc, id), _| {
            new.service(svc).is_some_and(|s| s.load_aware() && s.backends.iter().any(|b| b.identity() == *id))
        });
        let Some(old) = old else { return };
        for s in new.services.iter().filter(|s| s.slow_start.is_some()) {
            let len = epoch_length(s);
            let epoch = epoch_at(unix_ms, len);
            for b in s.backends.iter().filter(|b| b.serving_weight() > 0) {
                let before = old.service(&s.name).and_then(|o| o.backends.iter().find(|x| x.identity() == b.identity()));
                if before.is_none_or(|x| x.serving_weight() == 0) {
                    self.joined(&(s.name.clone(), b.identity()), epoch, len);
                }
            }
        }
    }

    /// The pool served at `unix_ms`: `pool` (with health applied) with each load-aware service's
    /// weights scaled by the decided epoch's capacities and ramps.
    pub fn apply(&self, pool: &Pool, unix_ms: u64) -> Served {
        let mut out = pool.clone();
        let mut adjustments = HashMap::new();
        let mut failing_open = Vec::new();
        for s in out.services.iter_mut().filter(|s| s.load_aware()) {
            let decided = decided_epoch(unix_ms, epoch_length(s));
            let mut adjusted = Vec::new();
            for (i, b) in s.backends.iter().enumerate() {
                let key = (s.name.clone(), b.identity());
                if b.state != BackendState::Active {
                    continue;
                }
                let a = self.adjustment(s, &key, decided);
                if a.why().is_empty() && a.reported.is_none() {
                    continue;
                }
                adjusted.push((i, a));
            }
            let serving_before = s.backends.iter().any(|b| b.serving_weight() > 0);
            let configured: Vec<u32> = s.backends.iter().map(|b| b.weight).collect();
            for b in s.backends.iter_mut() {
                b.weight *= WEIGHT_STEPS;
            }
            // Served with the capacities and states; failing that (no backend left to take new
            // connections), with the states alone; failing that, as configured (fail open).
            let trial = |capacities: bool| {
                let mut t = s.backends.clone();
                for (i, a) in &adjusted {
                    let b = &mut t[*i];
                    match a.state {
                        // At its configured weight, which its tracked flows' runner-ups use.
                        Some(State::Drain) => b.state = BackendState::Drain,
                        Some(State::Down) => b.state = BackendState::Down,
                        _ if capacities => b.weight = table_weight(configured[*i], a.percent),
                        _ => {}
                    }
                }
                t
            };
            let serves = |t: &[crate::config::Backend]| t.iter().any(|b| b.serving_weight() > 0);
            let full = trial(true);
            // What failing open drops, it drops from the adjustments too: they say how each
            // backend is served.
            let unscale = |a: &mut Adjustment| {
                a.percent = 100;
                a.capacity = None;
                a.ramp = None;
            };
            if !serving_before || serves(&full) {
                s.backends = full;
            } else {
                failing_open.push(s.name.clone());
                let states_only = trial(false);
                if serves(&states_only) {
                    s.backends = states_only;
                    adjusted.iter_mut().for_each(|(_, a)| unscale(a));
                } else {
                    adjusted.iter_mut().for_each(|(_, a)| {
                        unscale(a);
                        a.state = None;
                    });
                }
            }
            for (i, a) in adjusted {
                adjustments.insert((s.name.clone(), s.backends[i].identity()), a);
            }
        }
        // The previous pool (second chance's hop lists) is built as it was served: in points.
        out.previous = pool.previous.as_deref().map(|p| Box::new(at_full_capacity(p)));
        Served { pool: out, adjustments, failing_open }
    }

    fn adjustment(&self, s: &Service, key: &Key, decided: u64) -> Adjustment {
        let load = self.backends.get(key);
        let mut a = Adjustment { percent: 100, capacity: None, ramp: None, state: None, reported: None };
        if let (Some(_), Some(l)) = (&s.agent, load) {
            // The last HISTORY epochs, oldest first, each epoch's capacity (a state alone:
            // ready is full capacity, drain and down carry the last capacity); the newest good
            // report from before them leads.
            let capacity = |r: &Report| match (r.state, r.capacity) {
                (Some(State::Drain | State::Down), _) => None,
                (_, c) => Some(c.unwrap_or(100)),
            };
            let first = decided.saturating_sub(HISTORY as u64 - 1);
            let before = l.reports.range(..first).rev().find_map(|(_, r)| *r).or(l.carried);
            let mut window: Vec<Option<u8>> = vec![before.as_ref().and_then(capacity)];
            window.extend((first..=decided).map(|e| l.reports.get(&e).copied().flatten().as_ref().and_then(capacity)));
            let newest = l.reports.range(..=decided).rev().find_map(|(_, r)| *r).or(l.carried);
            if newest.is_some() {
                a.capacity = Some(effective_capacity(&window, decided));
                a.state = Some(l.state_at(decided)).filter(|s| *s != State::Ready);
                a.reported = newest.map(|r| r.capacity.map_or(100, u32::from));
            }
        }
        if let (Some(ss), Some(from)) = (&s.slow_start, load.and_then(|l| l.ramp_from)) {
            let len = epoch_length(s);
            let window = (ss.window.as_secs_f64() / len.as_secs_f64()).ceil() as u32;
            // A ramp that begins further ahead than its alignment allows is a clock that went
            // back: no ramp.
            let plausible = from <= ramp_start(decided + 1, len);
            let elapsed = decided.saturating_sub(from).min(u32::MAX as u64) as u32;
            if plausible && elapsed < window {
                a.ramp = Some(slow_start_share(elapsed, window, ss.min_percent, ss.aggression));
            }
        }
        a.percent = combined(a.capacity.unwrap_or(100), a.ramp.unwrap_or(100));
        a
    }
}

#[cfg(test)]
mod tests;
