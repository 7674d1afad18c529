//! The steps of [`plan`](super::plan), one function each, in the order `plan` takes them. Each
//! step reads what is installed (`Draft::old`, never changed), decides part of the state that
//! will be (`Draft::st`), and appends its map writes to `Draft::ops`. The order of the steps is
//! the order of the writes, and the module doc's rules fix it: backend records, then table
//! slots, then routes, then hash map entries, then the index, then what nothing leads to any
//! more.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::Instant;

use super::notes::notes;
use super::{algorithm_param, identity_hash, service_key, BackendMeta, IndexEntry, Limits, LiveBackend, LiveService, Op, Plan, PlanError, Route, RouteKey, State, Touched};
use crate::config::{BackendState, HashMode, Pool, Protocol, Service};
use crate::table::{Table, EMPTY};

/// A plan being made: what is installed, the state that will be, and the writes between them.
pub(super) struct Draft<'a> {
    /// What is installed: every step compares with it, none changes it.
    pub(super) old: &'a State,
    /// The installed services by name: a service of the pool is the installed one of its name.
    old_by_name: BTreeMap<&'a str, &'a LiveService>,
    /// The state after the plan, as far as the steps so far have decided it.
    pub(super) st: State,
    pub(super) ops: Vec<Op>,
    pub(super) touched: Vec<Touched>,
    limits: &'a Limits,
    now: Instant,
}

/// What the capacity check counted, kept for the table step's own refusal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Budget {
    /// Entries the new and resized tables need.
    pub(super) needed: u64,
    /// Entries free now.
    pub(super) free_now: u64,
}

/// What the service step leaves for the steps after it.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Placed {
    /// Table-array entries to write: (index, backend id).
    pub(super) slots: Vec<(u32, u32)>,
    /// The installed backend ids the new pool keeps.
    pub(super) kept: BTreeSet<u32>,
}

impl<'a> Draft<'a> {
    /// Starts a plan from `old` at `now`: ids and ranges whose quarantine is over are free.
    pub(super) fn new(old: &'a State, limits: &'a Limits, now: Instant) -> Draft<'a> {
        let mut st = old.clone();
        st.begin(limits, now);
        let old_by_name = old.services.iter().map(|s| (s.name.as_str(), s)).collect();
        Draft { old, old_by_name, st, ops: Vec::new(), touched: Vec::new(), limits, now }
    }

    fn old_service(&self, name: &str) -> Option<&'a LiveService> {
        self.old_by_name.get(name).copied()
    }

    /// Whether the new tables fit, before anything is written, so that a refusal changes
    /// nothing. A new service, or one whose size changes, needs a fresh range (a resized table
    /// is written beside the old one, which stays live until its route switches); a table
    /// that keeps its size is rewritten in place and needs none. When enough entries come back
    /// from quarantine, the refusal says when, so that the caller can wait and retry.
    pub(super) fn check_capacity(&self, pool: &Pool) -> Result<Budget, PlanError> {
        let needed: u64 =
            pool.services.iter().filter(|s| self.old_service(&s.name).is_none_or(|o| o.slots != s.slots)).map(|s| s.slots as u64).sum();
        let (free_now, free_later) = self.st.free_slots();
        if needed > free_now {
            if needed <= free_later {
                let until = self.st.quarantine_ends().unwrap_or(self.now);
                return Err(PlanError::CapacityAt { until });
            }
            return Err(PlanError::Capacity { needed, free: free_later, capacity: self.limits.capacity });
        }
        Ok(Budget { needed, free_now })
    }

    /// Steps 1 and 2 for each service of the pool, in pool order: its backends' ids, then its
    /// table's place and the entries to write; records the service as added or changed (with
    /// its notes) when it is. One service at a time, so that a refusal names the first service
    /// that does not fit. The new services become the state's; the slots are returned, to be
    /// written in one batch after every backend record of every service.
    pub(super) fn place_services(&mut self, pool: &Pool, tables: &[Table], budget: Budget) -> Result<Placed, PlanError> {
        let mut services = Vec::with_capacity(pool.services.len());
        let mut placed = Placed::default();
        for (s, table) in pool.services.iter().zip(tables) {
            let old = self.old_service(&s.name);
            let backends = self.backends(s, old)?;
            placed.kept.extend(backends.iter().map(|b| b.id));
            let owners = owners(table, &backends);
            let (base, written) = self.table(s, old, &owners, &mut placed.slots, budget)?;
            let live = live_service(s, base, owners, backends);
            if let Some(change) = change(old, &live, written) {
                let notes = old.map_or_else(Vec::new, |o| notes(o, &live));
                self.touched.push(Touched { name: s.name.clone(), change, notes, slots_written: written as u64 });
            }
            services.push(live);
        }
        self.st.services = services;
        Ok(placed)
    }

    /// Step 1, one service: the id of each of its backends. A backend that stays (same service,
    /// same identity) keeps its id, so its slots and tracked flows stay; its meta and record
    /// are rewritten only where they changed. A new one gets a free id whose counters are reset
    /// first (flows tracked to the id's previous owner must not count once the record says
    /// alive), then its meta and record: all before any slot can name the id. Returns the
    /// backends in pool order.
    fn backends(&mut self, s: &Service, old: Option<&LiveService>) -> Result<Vec<LiveBackend>, PlanError> {
        let old_by_identity: HashMap<&str, &LiveBackend> =
            old.map(|o| o.backends.iter().map(|b| (b.identity.as_str(), b)).collect()).unwrap_or_default();
        let mut backends = Vec::with_capacity(s.backends.len());
        for b in &s.backends {
            let identity = b.identity();
            let prev = old_by_identity.get(identity.as_str()).copied();
            let alive = b.state != BackendState::Down;
            let meta = BackendMeta { service: service_key(s), identity: identity_hash(&identity), weight: b.weight, state: b.state };
            let id = match prev {
                Some(p) => {
                    if p.weight != b.weight || p.state != b.state || p.address != b.address {
                        self.ops.push(Op::Meta { id: p.id, meta, name: identity.clone() });
                    }
                    if p.address != b.address || (p.state != BackendState::Down) != alive {
                        self.ops.push(Op::Backend { id: p.id, address: b.address, alive, in_pool: true });
                    }
                    p.id
                }
                None => {
                    let id = self.st.alloc_backend(self.limits)?;
                    // The generation first: flows tracked to the id's previous owner must not
                    // count once the record says alive.
                    self.ops.push(Op::ResetCounters { id });
                    self.ops.push(Op::Meta { id, meta, name: identity.clone() });
                    self.ops.push(Op::Backend { id, address: b.address, alive, in_pool: true });
                    id
                }
            };
            backends.push(LiveBackend { id, identity, address: b.address, weight: b.weight, state: b.state });
        }
        Ok(backends)
    }

    /// Step 2, one service: where its table goes and which entries to write (appended to
    /// `slots`). A table that keeps its size stays in place and only the slots whose owner
    /// changes are written: each write is whole, so a packet meets the old owner or the new
    /// one. Any other table is written in full to a free range (best fit) that no route leads
    /// to yet, and the old range goes to quarantine: no packet ever meets two slot counts.
    /// Returns the base and the number of entries written.
    fn table(&mut self, s: &Service, old: Option<&LiveService>, owners: &[u32], slots: &mut Vec<(u32, u32)>, budget: Budget) -> Result<(u32, usize), PlanError> {
        match old {
            Some(o) if o.slots == s.slots => {
                let before = slots.len();
                for (i, (&was, &now_id)) in o.owners.iter().zip(owners).enumerate() {
                    if was != now_id {
                        slots.push((o.base + i as u32, now_id));
                    }
                }
                Ok((o.base, slots.len() - before))
            }
            _ => {
                // Enough entries are free in all, but not in one piece: ranges in quarantine
                // coalesce with their neighbours when they come back, so wait for them if any.
                let base = match self.st.alloc_range(s.slots) {
                    Some(b) => b,
                    None => match self.st.quarantine_ends() {
                        Some(until) => return Err(PlanError::CapacityAt { until }),
                        None => return Err(PlanError::Capacity { needed: budget.needed, free: budget.free_now, capacity: self.limits.capacity }),
                    },
                };
                slots.extend(owners.iter().enumerate().map(|(i, &id)| (base + i as u32, id)));
                if let Some(o) = old {
                    self.st.retire_range(self.now, o.base, o.slots);
                }
                Ok((base, s.slots as usize))
            }
        }
    }

    /// Which installed services the pool no longer has: each is reported removed and its table
    /// range goes to quarantine (packets in flight may still read it). Its keys leave the maps
    /// in the later steps, once nothing leads to them.
    pub(super) fn retire_services(&mut self, pool: &Pool) {
        let old = self.old;
        for o in &old.services {
            if pool.service(&o.name).is_none() {
                self.touched.push(Touched { name: o.name.clone(), change: "removed", notes: Vec::new(), slots_written: 0 });
                self.st.retire_range(self.now, o.base, o.slots);
            }
        }
    }

    /// Which installed backend ids the new pool does not keep: each record says it is gone
    /// (flows tracked to it re-hash from now on, and no slot written by this plan names it),
    /// and the id goes to quarantine.
    pub(super) fn retire_backends(&mut self, kept: &BTreeSet<u32>) {
        let old = self.old;
        for b in old.services.iter().flat_map(|s| &s.backends) {
            if !kept.contains(&b.id) {
                self.ops.push(Op::Backend { id: b.id, address: b.address, alive: false, in_pool: false });
                self.st.retire_backend(self.now, b.id);
            }
        }
    }

    /// The table entries of every service, in one batch: after every backend record they
    /// name, before any route that leads to a new range.
    pub(super) fn write_slots(&mut self, slots: Vec<(u32, u32)>) {
        if !slots.is_empty() {
            self.ops.push(Op::Slots(slots));
        }
    }

    /// Step 3: the route id of each wanted key. A key whose route is unchanged keeps its id and
    /// nothing is written; any other gets a free id, written now, before anything leads to it:
    /// a route is never rewritten while the index may lead to it. Ids no key keeps go to
    /// quarantine.
    pub(super) fn routes(&mut self, wanted: &BTreeMap<RouteKey, Route>) -> Result<(), PlanError> {
        let old = self.old;
        let mut keys: BTreeMap<RouteKey, u32> = BTreeMap::new();
        let mut routes: BTreeMap<u32, Route> = BTreeMap::new();
        for (key, route) in wanted {
            let id = match old.keys.get(key) {
                Some(&id) if old.routes.get(&id) == Some(route) => id,
                _ => {
                    let id = self.st.alloc_route(self.limits)?;
                    self.ops.push(Op::Route { id, route: *route });
                    id
                }
            };
            keys.insert(*key, id);
            routes.insert(id, *route);
        }
        for (key, id) in &old.keys {
            if keys.get(key) != Some(id) {
                self.st.retire_route(self.now, *id);
            }
        }
        self.st.keys = keys;
        self.st.routes = routes;
        Ok(())
    }

    /// Step 4: the keys the services hash map holds, every key that shares its index entry with
    /// another. New and changed ones are put now, before step 5 can send packets to the hash
    /// map for them; one already there under the same route id is not rewritten.
    pub(super) fn put_hashed(&mut self, groups: &BTreeMap<u32, Vec<RouteKey>>) {
        let old = self.old;
        let mut hashed = BTreeSet::new();
        for group in groups.values().filter(|g| g.len() > 1) {
            for key in group {
                hashed.insert(*key);
                let id = self.st.keys[key];
                let unchanged = old.hashed.contains(key) && old.keys.get(key) == Some(&id);
                if !unchanged {
                    self.ops.push(Op::HashPut { key: *key, route: self.st.routes[&id] });
                }
            }
        }
        self.st.hashed = hashed;
    }

    /// Step 5, last of the switches: each index entry, a route id where one key has the index,
    /// else "shared" (look in the hash map). Every entry that differs from the installed one,
    /// or whose content is unknown since an interrupted change, is written: each write moves
    /// its packets to the new state at once. Entries no key has any more are cleared.
    pub(super) fn switch_index(&mut self, groups: &BTreeMap<u32, Vec<RouteKey>>) {
        let old = self.old;
        let mut index: BTreeMap<u32, IndexEntry> = BTreeMap::new();
        for (idx, group) in groups {
            index.insert(*idx, if group.len() > 1 { IndexEntry::Shared } else { IndexEntry::Route(self.st.keys[&group[0]]) });
        }
        for (idx, entry) in &index {
            if old.index.get(idx) != Some(entry) || old.dirty_index().contains(idx) {
                self.ops.push(Op::Index { index: *idx, entry: Some(*entry) });
            }
        }
        for idx in old.index.keys().chain(old.dirty_index()) {
            if !index.contains_key(idx) {
                self.ops.push(Op::Index { index: *idx, entry: None });
            }
        }
        self.st.clear_dirty_index();
        self.st.index = index;
    }

    /// Step 6: the keys no index entry sends to the hash map any more leave it, only now that
    /// the index no longer leads there.
    pub(super) fn delete_unhashed(&mut self) {
        let old = self.old;
        for key in &old.hashed {
            if !self.st.hashed.contains(key) {
                self.ops.push(Op::HashDelete { key: *key });
            }
        }
    }

    /// Step 7: the names `lb status` shows (the data plane never reads them): forgotten for the
    /// keys no service has any more, written for new keys and renamed services.
    pub(super) fn name_services(&mut self) {
        let old = self.old;
        let new_keys: HashSet<RouteKey> = self.st.services.iter().map(|s| s.key).collect();
        for o in &old.services {
            if !new_keys.contains(&o.key) {
                self.ops.push(Op::ServiceName { key: o.key, name: None });
            }
        }
        for s in &self.st.services {
            if self.old_service(&s.name).is_none_or(|o| o.key != s.key || o.name != s.name) {
                self.ops.push(Op::ServiceName { key: s.key, name: Some(s.name.clone()) });
            }
        }
    }

    /// The plan: the writes in the order the steps made them, and the state after them.
    pub(super) fn finish(self) -> Plan {
        Plan { ops: self.ops, state: self.st, touched: self.touched }
    }
}

/// The backend id of each slot of `table` (0: empty), from the table's backend indices.
fn owners(table: &Table, backends: &[LiveBackend]) -> Vec<u32> {
    table.owners().iter().map(|&o| if o == EMPTY { 0 } else { backends[o as usize].id }).collect()
}

/// The installed form of service `s` once its table is at `base` with `owners`.
fn live_service(s: &Service, base: u32, owners: Vec<u32>, backends: Vec<LiveBackend>) -> LiveService {
    LiveService {
        name: s.name.clone(),
        endpoint: s.endpoint(),
        key: service_key(s),
        hash: s.hash,
        slots: s.slots,
        base,
        owners,
        backends,
        conntrack: s.conntrack,
        forward: s.forward,
        gue_port: s.gue_port,
        algorithm: s.algorithm,
        algorithm_param: algorithm_param(s),
        empty: !s.backends.iter().any(|b| b.serving_weight() > 0),
    }
}

/// Whether a service of the pool is added, changed or the same as installed (None), for the
/// reload log: changed when any setting differs, any slot was written, or its backends differ.
fn change(old: Option<&LiveService>, new: &LiveService, written: usize) -> Option<&'static str> {
    match old {
        None => Some("added"),
        Some(o)
            if o.key != new.key
                || o.hash != new.hash
                || o.slots != new.slots
                || o.conntrack != new.conntrack
                || o.forward != new.forward
                || o.gue_port != new.gue_port
                || o.algorithm != new.algorithm
                || o.algorithm_param != new.algorithm_param
                || written > 0
                || !same_backends(&o.backends, &new.backends) =>
        {
            Some("changed")
        }
        Some(_) => None,
    }
}

/// Whether two versions of a service have the same backends (in any order: a state rebuilt
/// from the maps lists them by id, a planned one in pool order).
fn same_backends(a: &[LiveBackend], b: &[LiveBackend]) -> bool {
    let by_identity: HashMap<&str, &LiveBackend> = a.iter().map(|x| (x.identity.as_str(), x)).collect();
    a.len() == b.len() && b.iter().all(|x| by_identity.get(x.identity.as_str()).is_some_and(|y| *y == x))
}

/// Step 3's input: the route every key of the new pool needs. Each service's key routes to its
/// table (0 slots when no backend has weight: its packets are dropped). Non-first IPv4
/// fragments carry no ports, so each (vip, protocol) also has a port-0 route: it can follow
/// the client's address when exactly one service there hashes by client address; otherwise it
/// says "flow" and the program drops those fragments, counted.
pub(super) fn wanted_routes(services: &[LiveService]) -> BTreeMap<RouteKey, Route> {
    let mut wanted: BTreeMap<RouteKey, Route> = BTreeMap::new();
    let mut per_vip: BTreeMap<(IpAddr, Protocol), Vec<&LiveService>> = BTreeMap::new();
    for s in services {
        wanted.insert(s.key, route_to(s, s.key, s.hash, s.conntrack));
        per_vip.entry((s.key.addr, s.key.proto)).or_default().push(s);
    }
    for ((addr, proto), services) in per_vip {
        let s = services[0];
        let routable = services.len() == 1 && s.hash == HashMode::ClientIp;
        let key = RouteKey { addr, port: 0, proto };
        wanted.insert(key, route_to(s, key, if routable { HashMode::ClientIp } else { HashMode::Flow }, false));
    }
    wanted
}

/// A route under `key` to service `s`'s table.
fn route_to(s: &LiveService, key: RouteKey, hash: HashMode, conntrack: bool) -> Route {
    let slots = if s.empty { 0 } else { s.slots };
    Route { key, base: s.base, slots, hash, conntrack, forward: s.forward, gue_port: s.gue_port, table_len: s.slots }
}

/// Steps 4 and 5's input: the keys of each index entry, by the data plane's `index_of`. A group
/// of one is reached through the routes array, a larger one through the hash map.
pub(super) fn index_groups(keys: &BTreeMap<RouteKey, u32>, index_of: &dyn Fn(&RouteKey) -> u32) -> BTreeMap<u32, Vec<RouteKey>> {
    let mut groups: BTreeMap<u32, Vec<RouteKey>> = BTreeMap::new();
    for key in keys.keys() {
        groups.entry(index_of(key)).or_default().push(*key);
    }
    groups
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::testkit::{index_of, pool, LIMITS};
    use super::super::{plan, Limits, PlanError, State, QUARANTINE};
    use crate::table::{build_service, Table};

    #[test]
    fn capacity_is_checked_before_anything_and_quarantine_is_waited_for() {
        let limits = Limits { capacity: 3000, ..LIMITS };
        let t0 = Instant::now();
        let go = |state: &State, text: &str, now: Instant| {
            let p = pool(text);
            let tables: Vec<Table> = p.services.iter().map(build_service).collect();
            plan(state, &p, &tables, &limits, &index_of, now)
        };
        let small = "services:\n  - {name: w, vip: 10.0.0.1, port: 80, slots: 1009, backends: [10.0.0.2]}\n";
        let big = "services:\n  - {name: w, vip: 10.0.0.1, port: 80, slots: 2003, backends: [10.0.0.2]}\n";
        let first = go(&State::default(), small, t0).expect("fits");
        // Growing to 2003 needs a fresh range while the old one is live: 1009 + 2003 > 3000.
        let err = go(&first.state, big, t0).expect_err("does not fit");
        assert_eq!(err, PlanError::Capacity { needed: 2003, free: 1991, capacity: 3000 });
        // Without the service, its range waits out the quarantine before it can be reused.
        let gone = go(&first.state, "services: []\n", t0).expect("removal needs nothing");
        let err = go(&gone.state, big, t0).expect_err("quarantined");
        assert_eq!(err, PlanError::CapacityAt { until: t0 + QUARANTINE });
        let back = go(&gone.state, big, t0 + QUARANTINE).expect("released and merged");
        assert_eq!(back.state.services[0].base, 0);
    }
}
