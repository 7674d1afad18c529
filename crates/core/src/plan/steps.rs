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
use super::{algorithm_param, identity_hash, service_key, BackendMeta, IndexEntry, Limits, LiveBackend, LiveService, Op, Plan, PlanError, Route, RouteKey, RouteSpec, State, Touched};
use super::Flags;
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
    /// Second-chance hops to write: (index, backend ids).
    pub(super) hops: Vec<(u32, [u32; 2])>,
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
            let hops = hop_ids(table, &backends);
            let (base, written) = self.table(s, old, &owners, &mut placed.slots, budget)?;
            hop_writes(old, base, &hops, &mut placed.hops);
            let live = live_service(s, base, owners, hops, backends);
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

    /// The table entries of every service, in one batch, then their hops in another: after
    /// every backend record they name, before any route that leads to a new range or turns
    /// second chance on.
    pub(super) fn write_slots(&mut self, slots: Vec<(u32, u32)>, hops: Vec<(u32, [u32; 2])>) {
        if !slots.is_empty() {
            self.ops.push(Op::Slots(slots));
        }
        if !hops.is_empty() {
            self.ops.push(Op::Hops(hops));
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

/// The backend ids of each slot's second-chance hops (0: none); empty without second chance.
fn hop_ids(table: &Table, backends: &[LiveBackend]) -> Vec<[u32; 2]> {
    let id = |o: u32| if o == EMPTY { 0 } else { backends[o as usize].id };
    table.hops().iter().map(|h| [id(h[0]), id(h[1])]).collect()
}

/// Which hop entries to write for a service whose table is at `base`: those that differ from
/// what the service had there, or all of them when its range is new or its hops were unknown or
/// absent (the range may hold another table's). Nothing without second chance: the program
/// reads no hops for the service then.
fn hop_writes(old: Option<&LiveService>, base: u32, hops: &[[u32; 2]], out: &mut Vec<(u32, [u32; 2])>) {
    let same_place = old.filter(|o| o.base == base && o.hops.len() == hops.len());
    for (i, h) in hops.iter().enumerate() {
        if same_place.is_none_or(|o| o.hops[i] != *h) {
            out.push((base + i as u32, *h));
        }
    }
}

/// The installed form of service `s` once its table is at `base` with `owners`.
fn live_service(s: &Service, base: u32, owners: Vec<u32>, hops: Vec<[u32; 2]>, backends: Vec<LiveBackend>) -> LiveService {
    LiveService {
        name: s.name.clone(),
        endpoint: s.endpoint(),
        key: service_key(s),
        spec: RouteSpec::of(s),
        slots: s.slots,
        base,
        owners,
        backends,
        quic_digest: super::quic_digest(s),
        hops,
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
                || o.spec != new.spec
                || o.slots != new.slots
                || o.quic_digest != new.quic_digest
                || o.hops != new.hops
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
        wanted.insert(s.key, route_to(s, s.key, s.spec));
        per_vip.entry((s.key.addr, s.key.proto)).or_default().push(s);
    }
    for ((addr, proto), services) in per_vip {
        let s = services[0];
        let routable = services.len() == 1 && s.spec.hash == HashMode::ClientIp;
        let key = RouteKey { addr, port: 0, proto };
        // Untracked, and no QUIC-LB: a fragment carries neither ports nor a connection ID.
        let hash = if routable { HashMode::ClientIp } else { HashMode::Flow };
        let spec = RouteSpec { hash, ..s.spec }.with(Flags::CONNTRACK, false).with(Flags::QUIC_LB, false);
        wanted.insert(key, route_to(s, key, spec));
    }
    wanted
}

/// A route under `key` to service `s`'s table, saying `spec`.
fn route_to(s: &LiveService, key: RouteKey, spec: RouteSpec) -> Route {
    let slots = if s.empty { 0 } else { s.slots };
    Route { key, base: s.base, slots, spec, table_len: s.slots }
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
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::{Duration, Instant};

    use super::super::testkit::{index_of, pool, run, A, LIMITS};
    use super::super::{identity_hash, plan, service_key, BackendMeta, IndexEntry, Limits, Op, PlanError, RouteKey, RouteSpec, State, Touched, QUARANTINE};
    use super::{change, hop_writes, index_groups, wanted_routes, Budget, Draft, Flags, LiveService};
    use crate::config::{BackendState, HashMode, Pool};
    use crate::table::{build_service, Table};

    /// The state after installing `text` at `t0`, and the pool.
    fn installed(text: &str, t0: Instant) -> (Pool, State) {
        let p = pool(text);
        let st = run(&State::default(), &p, t0).state;
        (p, st)
    }

    fn key_of(p: &Pool, name: &str) -> RouteKey {
        service_key(p.service(name).expect("service"))
    }

    #[test]
    fn the_capacity_check_counts_only_new_and_resized_tables() {
        let t0 = Instant::now();
        let (_, st) = installed(A, t0);
        // web grows, dns keeps its size, alt goes, x comes.
        let p = pool(
            &A.replace("port: 80, slots: 1009", "port: 80, slots: 2003")
                .replace("{name: alt, vip: 10.0.0.100, port: 60, slots: 1009, backends: [10.0.0.4]}", "{name: x, vip: 10.0.0.100, port: 61, slots: 97, backends: [10.0.0.4]}"),
        );
        let d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        assert_eq!(d.check_capacity(&p), Ok(Budget { needed: 2003 + 97, free_now: (1 << 20) - 3 * 1009 }));
        assert!(d.ops.is_empty(), "the check writes nothing");
    }

    #[test]
    fn the_backend_step_keeps_ids_writes_only_what_changed_and_gives_a_new_backend_a_reset_id() {
        let t0 = Instant::now();
        let (_, st) = installed("services:\n  - {name: w, vip: 10.0.0.1, port: 80, slots: 7, backends: [10.0.0.2, 10.0.0.3, 10.0.0.5, 10.0.0.6]}\n", t0);
        let mut p = pool("services:\n  - {name: w, vip: 10.0.0.1, port: 80, slots: 7, backends: [10.0.0.2, {address: 10.0.0.3, weight: 2}, {address: 10.0.0.5, state: drain}, 10.0.0.6, 10.0.0.4]}\n");
        p.services[0].backends[0].state = BackendState::Down;
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        let old = d.old_service("w");
        let got = d.backends(&p.services[0], old).expect("ids");
        assert_eq!(got.iter().map(|b| b.id).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5], "staying backends keep their ids; the new one gets the next");
        let key = key_of(&p, "w");
        let meta = |identity: &str, weight, state| BackendMeta { service: key, identity: identity_hash(identity), weight, state };
        let addr = |a: &str| a.parse().expect("address");
        assert_eq!(
            d.ops,
            vec![
                // Down: its meta says so, and its record says tracked flows leave it.
                Op::Meta { id: 1, meta: meta("10.0.0.2", 1, BackendState::Down), name: "10.0.0.2".into() },
                Op::Backend { id: 1, address: addr("10.0.0.2"), alive: false, in_pool: true },
                // A new weight or a drain: the meta only.
                Op::Meta { id: 2, meta: meta("10.0.0.3", 2, BackendState::Active), name: "10.0.0.3".into() },
                Op::Meta { id: 3, meta: meta("10.0.0.5", 1, BackendState::Drain), name: "10.0.0.5".into() },
                // 10.0.0.6 unchanged: nothing. The new one: counters, meta, then its record.
                Op::ResetCounters { id: 5 },
                Op::Meta { id: 5, meta: meta("10.0.0.4", 1, BackendState::Active), name: "10.0.0.4".into() },
                Op::Backend { id: 5, address: addr("10.0.0.4"), alive: true, in_pool: true },
            ]
        );
    }

    #[test]
    fn the_table_step_rewrites_changed_slots_in_place_and_moves_a_resized_table_to_a_fresh_range() {
        let t0 = Instant::now();
        let cap = LIMITS.capacity as u64;
        let (p, st) = installed("services:\n  - {name: w, vip: 10.0.0.1, port: 80, slots: 7, backends: [10.0.0.2, 10.0.0.3]}\n", t0);
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        let budget = d.check_capacity(&p).expect("fits");
        let old = d.old_service("w").expect("installed");
        let (base, was) = (old.base, old.owners.clone());
        // Same size: only the slot whose owner changes is written, in place.
        let mut owners = was.clone();
        owners[4] = if owners[4] == 1 { 2 } else { 1 };
        let mut slots = Vec::new();
        assert_eq!(d.table(&p.services[0], Some(old), &owners, &mut slots, budget), Ok((base, 1)));
        assert_eq!(slots, vec![(base + 4, owners[4])]);
        assert_eq!(d.st.free_slots(), (cap - 7, cap - 7), "no range taken or retired");
        // Another size: a fresh range written in full, and the old one in quarantine.
        let p11 = pool("services:\n  - {name: w, vip: 10.0.0.1, port: 80, slots: 11, backends: [10.0.0.2, 10.0.0.3]}\n");
        let owners = vec![1; 11];
        let mut slots = Vec::new();
        let (fresh, written) = d.table(&p11.services[0], Some(old), &owners, &mut slots, budget).expect("fits");
        assert_eq!((fresh, written), (7, 11), "the first free entry after the live range");
        assert_eq!(slots, (7..18).map(|i| (i, 1)).collect::<Vec<_>>());
        assert_eq!(d.st.free_slots(), (cap - 18, cap - 11), "the old range waits out the quarantine");
    }

    #[test]
    fn the_change_step_tells_added_changed_and_unchanged_services_apart() {
        let t0 = Instant::now();
        let (_, st) = installed(A, t0);
        let web = &st.services[0];
        assert_eq!(change(None, web, 0), Some("added"));
        assert_eq!(change(Some(web), web, 0), None);
        // A state rebuilt from the maps lists backends by id: the order does not count.
        let mut reordered = web.clone();
        reordered.backends.reverse();
        assert_eq!(change(Some(web), &reordered, 0), None);
        assert_eq!(change(Some(web), web, 1), Some("changed"), "a slot written");
        let variants: Vec<fn(&mut super::LiveService)> = vec![
            |s| s.key.port += 1,
            |s| s.spec.hash = HashMode::Flow,
            |s| s.slots += 1,
            |s| s.spec.flags.toggle(Flags::CONNTRACK),
            |s| s.spec.flags.toggle(Flags::SECOND_CHANCE),
            |s| s.spec.flags.toggle(Flags::QUIC_LB),
            |s| s.spec.forward = crate::config::Forward::Ipip,
            |s| s.spec.gue_port += 1,
            |s| s.algorithm = crate::config::Algorithm::Maglev,
            |s| s.algorithm_param += 1,
            |s| s.backends[0].weight += 1,
            |s| {
                s.backends.pop();
            },
        ];
        for (i, f) in variants.into_iter().enumerate() {
            let mut new = web.clone();
            f(&mut new);
            assert_eq!(change(Some(web), &new, 0), Some("changed"), "variant {i}");
        }
    }

    #[test]
    fn the_service_step_places_every_service_in_pool_order_and_reports_each_change() {
        let t0 = Instant::now();
        let (_, st) = installed(A, t0);
        // web loses 10.0.0.2 (id 2) and alt grows; dns stays.
        let p = pool(&A.replace("10.0.0.1, 10.0.0.2, 10.0.0.3", "10.0.0.1, 10.0.0.3").replace("port: 60, slots: 1009", "port: 60, slots: 2003"));
        let tables: Vec<Table> = p.services.iter().map(build_service).collect();
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        let budget = d.check_capacity(&p).expect("fits");
        let placed = d.place_services(&p, &tables, budget).expect("fits");
        assert_eq!(placed.kept, BTreeSet::from([1, 3, 4, 5, 6]));
        assert_eq!(d.st.services.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), vec!["web", "dns", "alt"]);
        let alt = &d.st.services[2];
        let web_written = placed.slots.len() - 2003;
        assert!(web_written > 0 && placed.slots.iter().all(|&(_, id)| id != 2), "no slot names the removed backend");
        assert!(placed.slots.ends_with(&(0..2003).map(|i| (alt.base + i, alt.owners[i as usize])).collect::<Vec<_>>()), "alt in full, after web");
        let summary: Vec<(&str, &str, u64)> = d.touched.iter().map(|t| (t.name.as_str(), t.change, t.slots_written)).collect();
        assert_eq!(summary, vec![("web", "changed", web_written as u64), ("alt", "changed", 2003)]);
        assert!(d.ops.is_empty(), "no new backend: no record to write");
    }

    #[test]
    fn the_retire_steps_report_removed_services_and_quarantine_their_ranges_and_ids() {
        let t0 = Instant::now();
        let (_, st) = installed(A, t0);
        let p = pool(&A.replace("  - {name: alt, vip: 10.0.0.100, port: 60, slots: 1009, backends: [10.0.0.4]}\n", ""));
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        let (free, later) = d.st.free_slots();
        d.retire_services(&p);
        assert_eq!(d.touched, vec![Touched { name: "alt".into(), change: "removed", notes: Vec::new(), slots_written: 0 }]);
        assert_eq!(d.st.free_slots(), (free, later + 1009), "alt's range waits out the quarantine");
        // web keeps 1 and 3, dns 4 and 5; 2 and alt's 6 go.
        d.retire_backends(&BTreeSet::from([1, 3, 4, 5]));
        let gone = |id, a: &str| Op::Backend { id, address: a.parse().expect("address"), alive: false, in_pool: false };
        assert_eq!(d.ops, vec![gone(2, "10.0.0.2"), gone(6, "10.0.0.4")]);
        assert_eq!(d.st.alloc_backend(&LIMITS), Ok(7), "a retired id is not given again at once");
    }

    #[test]
    fn the_slot_step_writes_one_batch_or_nothing() {
        let t0 = Instant::now();
        let (_, st) = installed(A, t0);
        let mut d = Draft::new(&st, &LIMITS, t0);
        d.write_slots(Vec::new(), Vec::new());
        assert!(d.ops.is_empty());
        d.write_slots(vec![(1, 2), (3, 4)], Vec::new());
        assert_eq!(d.ops, vec![Op::Slots(vec![(1, 2), (3, 4)])]);
        d.write_slots(Vec::new(), vec![(1, [3, 0])]);
        assert_eq!(d.ops[1], Op::Hops(vec![(1, [3, 0])]));
    }

    #[test]
    fn hops_are_written_whole_for_a_new_range_and_where_they_change_in_place() {
        let old = LiveService {
            name: "web".into(),
            endpoint: String::new(),
            key: RouteKey { addr: "10.0.0.1".parse().unwrap(), port: 80, proto: crate::config::Protocol::Tcp },
            spec: RouteSpec {
                hash: crate::config::HashMode::Flow,
                forward: crate::config::Forward::Gue,
                gue_port: 6080,
                flags: Flags::CONNTRACK | Flags::SECOND_CHANCE,
            },
            slots: 3,
            base: 100,
            owners: vec![1, 2, 1],
            backends: Vec::new(),
            empty: false,
            quic_digest: 0,
            hops: vec![[2, 0], [0, 0], [0, 3]],
            algorithm: crate::config::Algorithm::Maglev,
            algorithm_param: 0,
        };
        let new = [[2, 0], [1, 0], [0, 3]];
        let mut out = Vec::new();
        hop_writes(Some(&old), 100, &new, &mut out);
        assert_eq!(out, vec![(101, [1, 0])], "in place: only the slot whose hops changed");
        out.clear();
        hop_writes(Some(&old), 500, &new, &mut out);
        assert_eq!(out, vec![(500, [2, 0]), (501, [1, 0]), (502, [0, 3])], "a new range: all, zeros too");
        out.clear();
        let unknown = LiveService { hops: Vec::new(), ..old.clone() };
        hop_writes(Some(&unknown), 100, &new, &mut out);
        assert_eq!(out.len(), 3, "hops unknown (an adopted plane) or newly on: all");
        out.clear();
        hop_writes(Some(&old), 100, &[], &mut out);
        assert!(out.is_empty(), "second chance off: nothing, the program reads none");
    }

    #[test]
    fn the_wanted_routes_add_a_fragment_route_per_vip_and_protocol() {
        let t0 = Instant::now();
        let (p, st) = installed(A, t0);
        let wanted = wanted_routes(&st.services);
        let frag = |proto| RouteKey { addr: p.services[0].vip, port: 0, proto };
        let (tcp, udp) = (frag(crate::config::Protocol::Tcp), frag(crate::config::Protocol::Udp));
        assert_eq!(wanted.keys().copied().collect::<BTreeSet<_>>(), BTreeSet::from([key_of(&p, "web"), key_of(&p, "dns"), key_of(&p, "alt"), tcp, udp]));
        let web = &st.services[0];
        assert_eq!((wanted[&key_of(&p, "web")].base, wanted[&key_of(&p, "web")].slots, wanted[&key_of(&p, "web")].spec.hash), (web.base, 1009, HashMode::ClientIp));
        // Two services on tcp: fragments cannot follow the client, the route says flow; it
        // points at the first service's table.
        assert_eq!((wanted[&tcp].spec.hash, wanted[&tcp].base, wanted[&tcp].spec.conntrack()), (HashMode::Flow, web.base, false));
        // dns alone on udp, hashing by flow: flow too.
        assert_eq!(wanted[&udp].spec.hash, HashMode::Flow);
        // One service hashing by client address: its fragments follow the client.
        let (_, st) = installed(&A.replace("hash: flow, ", ""), t0);
        assert_eq!(wanted_routes(&st.services)[&udp].spec.hash, HashMode::ClientIp);
        // No backend with weight: the route says 0 slots, the range stays its length.
        let (p, st) = installed(&A.replace("[10.0.0.4]", "[{address: 10.0.0.4, weight: 0}]"), t0);
        let alt = wanted_routes(&st.services)[&key_of(&p, "alt")];
        assert_eq!((alt.slots, alt.table_len), (0, 1009));
    }

    #[test]
    fn the_route_step_keeps_the_ids_of_unchanged_routes_and_gives_changed_ones_new_ids() {
        let t0 = Instant::now();
        let (p, st) = installed(A, t0);
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        let mut wanted = wanted_routes(&st.services);
        d.routes(&wanted).expect("ids");
        assert!(d.ops.is_empty(), "nothing changed: nothing written");
        assert_eq!((&d.st.keys, &d.st.routes), (&st.keys, &st.routes));
        // web's route changes: a new id, written; the old one is not reused at once.
        let web = key_of(&p, "web");
        wanted.get_mut(&web).expect("web").spec.flags.remove(Flags::CONNTRACK);
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        d.routes(&wanted).expect("ids");
        let id = d.st.keys[&web];
        assert_ne!(id, st.keys[&web]);
        assert_eq!(d.ops, vec![Op::Route { id, route: wanted[&web] }]);
        assert_ne!(d.st.alloc_route(&LIMITS), Ok(st.keys[&web]), "the old id is in quarantine");
        // A key that goes frees its id only after the quarantine too.
        let mut fewer = wanted_routes(&st.services);
        fewer.remove(&key_of(&p, "alt"));
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        d.routes(&fewer).expect("ids");
        assert!(d.ops.is_empty());
        assert_ne!(d.st.alloc_route(&LIMITS), Ok(st.keys[&key_of(&p, "alt")]));
    }

    #[test]
    fn keys_that_share_an_index_entry_are_grouped_and_go_through_the_hash_map() {
        let t0 = Instant::now();
        let (p, st) = installed(A, t0);
        // port % 7: 80 -> 3, 53 and 60 -> 4, both fragment routes (port 0) -> 0.
        let groups = index_groups(&st.keys, &index_of);
        let sizes: BTreeMap<u32, usize> = groups.iter().map(|(i, g)| (*i, g.len())).collect();
        assert_eq!(sizes, BTreeMap::from([(0, 2), (3, 1), (4, 2)]));
        assert_eq!(groups[&3], vec![key_of(&p, "web")]);
        // The same groups again: every shared key is in the hash map already.
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        d.put_hashed(&groups);
        assert!(d.ops.is_empty());
        assert_eq!(d.st.hashed, st.hashed);
        // Everything on one entry: web joins the hash map, put before the index can send it there.
        let all = index_groups(&st.keys, &|_| 0);
        d.put_hashed(&all);
        let web = key_of(&p, "web");
        assert_eq!(d.ops, vec![Op::HashPut { key: web, route: st.routes[&st.keys[&web]] }]);
        assert_eq!(d.st.hashed.len(), 5);
    }

    #[test]
    fn the_index_step_writes_changed_and_unknown_entries_and_clears_unused_ones() {
        let t0 = Instant::now();
        let (p, st) = installed(A, t0);
        let groups = index_groups(&st.keys, &index_of);
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        d.switch_index(&groups);
        assert!(d.ops.is_empty(), "nothing changed");
        // Everything on entry 0 (shared already): 3 and 4 are cleared.
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        d.switch_index(&index_groups(&st.keys, &|_| 0));
        assert_eq!(d.ops, vec![Op::Index { index: 3, entry: None }, Op::Index { index: 4, entry: None }]);
        assert_eq!(d.st.index, BTreeMap::from([(0, IndexEntry::Shared)]));
        // After an interrupted change wrote entries 3 and 5, their content is unknown: 3 is
        // written again, and 5, which no key has, is cleared.
        let mut tainted = st.clone();
        tainted.taint(&[Op::Index { index: 3, entry: None }, Op::Index { index: 5, entry: Some(IndexEntry::Shared) }]);
        let mut d = Draft::new(&tainted, &LIMITS, t0 + Duration::from_secs(1));
        d.switch_index(&groups);
        assert_eq!(d.ops, vec![Op::Index { index: 3, entry: Some(IndexEntry::Route(st.keys[&key_of(&p, "web")])) }, Op::Index { index: 5, entry: None }]);
        assert!(d.st.dirty_index().is_empty(), "known again");
    }

    #[test]
    fn only_keys_that_no_longer_share_an_entry_leave_the_hash_map() {
        let t0 = Instant::now();
        let (p, st) = installed(A, t0);
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        d.delete_unhashed();
        assert!(d.ops.is_empty());
        let alt = key_of(&p, "alt");
        d.st.hashed.remove(&alt);
        d.delete_unhashed();
        assert_eq!(d.ops, vec![Op::HashDelete { key: alt }]);
    }

    #[test]
    fn names_are_forgotten_for_removed_keys_and_written_for_new_and_renamed_services() {
        let t0 = Instant::now();
        let (p, st) = installed(A, t0);
        let mut d = Draft::new(&st, &LIMITS, t0 + Duration::from_secs(1));
        d.name_services();
        assert!(d.ops.is_empty());
        // alt goes; dns is renamed (same key); a service moves to a new key.
        d.st.services.retain(|s| s.name != "alt");
        d.st.services[1].name = "dns2".into();
        d.st.services[0].key.port = 81;
        d.name_services();
        let web = key_of(&p, "web");
        assert_eq!(
            d.ops,
            vec![
                Op::ServiceName { key: web, name: None },
                Op::ServiceName { key: key_of(&p, "alt"), name: None },
                Op::ServiceName { key: RouteKey { port: 81, ..web }, name: Some("web".into()) },
                Op::ServiceName { key: key_of(&p, "dns"), name: Some("dns2".into()) },
            ]
        );
    }

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
