//! What is installed ([`State`]): a mirror of what the data plane's maps hold, and the
//! allocators of table ranges, route ids and backend ids. An id or range that nothing leads to
//! any more is retired into a quarantine before it is reused, so that a packet still in flight
//! on the old state never meets a rewritten one. A state is either the last plan's, marked
//! unknown where a change stopped part-way ([`State::taint`]), or rebuilt from a pinned data
//! plane's maps ([`State::rebuild`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::{algorithm_param, identity_hash, quic_digest, service_key, BackendMeta, IndexEntry, Limits, Op, PlanError, Route, RouteKey, RouteSpec};
use crate::config::{Pool, Service};

/// How long a retired route id, backend id or table range waits before it is reused. Packets run
/// the program in microseconds; this is thousands of times that.
pub const QUARANTINE: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, PartialEq)]
pub struct LiveBackend {
    pub id: u32,
    pub identity: String,
    pub address: IpAddr,
    pub weight: u32,
    pub state: crate::config::BackendState,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LiveService {
    pub name: String,
    pub endpoint: String,
    pub key: RouteKey,
    /// Its settings as its route carries them.
    pub spec: RouteSpec,
    pub slots: u32,
    pub base: u32,
    /// The table as written: backend id per slot (0 = empty).
    pub owners: Vec<u32>,
    /// Its backends, in pool order.
    pub backends: Vec<LiveBackend>,
    /// True when no backend has weight: the route says 0 slots.
    pub empty: bool,
    /// Its QUIC-LB configuration's fingerprint (0: none), for the reload log.
    pub quic_digest: u64,
    /// Its second-chance hops as written: per slot, two backend ids (0 = none); empty when the
    /// service has none, or when they are unknown (a state rebuilt from the maps: the next plan
    /// writes them all).
    pub hops: Vec<[u32; 2]>,
    /// The table builder and its parameter (ring: vnodes per weight; bounded: load bound).
    pub algorithm: crate::config::Algorithm,
    pub algorithm_param: u32,
}

impl LiveService {
    /// The table's fingerprint as `lb status` computes it from the maps and `lb table` from a
    /// pool: each slot's owner and second-chance hops, by identity.
    pub fn digest(&self) -> u64 {
        let hash_of: std::collections::HashMap<u32, u64> = self.backends.iter().map(|b| (b.id, identity_hash(&b.identity))).collect();
        let of = |o: &u32| hash_of.get(o).copied().unwrap_or(0);
        crate::table::digest_of_hashes(self.owners.iter().map(of).chain(self.hops.iter().flat_map(|h| [of(&h[0]), of(&h[1])])))
    }
}

/// What is installed: a mirror of the maps' contents, plus the allocators.
#[derive(Debug, Clone, Default)]
pub struct State {
    pub services: Vec<LiveService>,
    /// Route id of each live key.
    pub keys: BTreeMap<RouteKey, u32>,
    pub routes: BTreeMap<u32, Route>,
    /// Non-empty vip_index entries.
    pub index: BTreeMap<u32, IndexEntry>,
    /// Keys in the services hash map.
    pub hashed: BTreeSet<RouteKey>,
    next_route: u32,
    next_backend: u32,
    /// Free table ranges (base, len), and retired ids and ranges with when they retired.
    free_ranges: Vec<(u32, u32)>,
    retired_ranges: Vec<(Instant, u32, u32)>,
    free_routes: Vec<u32>,
    retired_routes: Vec<(Instant, u32)>,
    free_backends: Vec<u32>,
    retired_backends: Vec<(Instant, u32)>,
    /// Index entries whose content is unknown (see [`State::taint`]).
    dirty_index: BTreeSet<u32>,
    initialized: bool,
}

impl State {
    /// After a change that stopped part-way: the maps may hold any mix of before and after for
    /// what `done` touched. Makes the next plan rewrite every table slot, and every index entry
    /// and hash key those writes touched.
    pub fn taint(&mut self, done: &[Op]) {
        for s in &mut self.services {
            s.owners.iter_mut().for_each(|o| *o = u32::MAX);
            // Unknown too: the next plan writes them all.
            s.hops.clear();
        }
        for op in done {
            match op {
                Op::Index { index, .. } => {
                    self.index.remove(index);
                    self.dirty_index.insert(*index);
                }
                Op::HashPut { key, .. } => {
                    self.hashed.insert(*key);
                    self.keys.remove(key);
                }
                _ => {}
            }
        }
    }

    /// Readies a copy of the installed state for a plan made at `now`: a state that never had
    /// one gets the whole table array as one free range, and every id and range whose
    /// quarantine is over becomes free.
    pub(super) fn begin(&mut self, limits: &Limits, now: Instant) {
        if !self.initialized {
            self.free_ranges = vec![(0, limits.capacity)];
            self.initialized = true;
        }
        self.release(now);
    }

    fn release(&mut self, now: Instant) {
        let (ready, wait): (Vec<_>, Vec<_>) = self.retired_ranges.drain(..).partition(|r| now >= r.0 + QUARANTINE);
        self.retired_ranges = wait;
        for (_, base, len) in ready {
            self.free_ranges.push((base, len));
        }
        coalesce(&mut self.free_ranges);
        let (ready, wait): (Vec<_>, Vec<_>) = self.retired_routes.drain(..).partition(|r| now >= r.0 + QUARANTINE);
        self.retired_routes = wait;
        self.free_routes.extend(ready.into_iter().map(|r| r.1));
        let (ready, wait): (Vec<_>, Vec<_>) = self.retired_backends.drain(..).partition(|r| now >= r.0 + QUARANTINE);
        self.retired_backends = wait;
        self.free_backends.extend(ready.into_iter().map(|r| r.1));
    }

    pub(super) fn alloc_range(&mut self, len: u32) -> Option<u32> {
        // Best fit keeps large holes for large tables.
        let (i, _) = self.free_ranges.iter().enumerate().filter(|(_, r)| r.1 >= len).min_by_key(|(_, r)| r.1)?;
        let (base, have) = self.free_ranges[i];
        if have == len {
            self.free_ranges.remove(i);
        } else {
            self.free_ranges[i] = (base + len, have - len);
        }
        Some(base)
    }

    pub(super) fn alloc_route(&mut self, limits: &Limits) -> Result<u32, PlanError> {
        if let Some(id) = self.free_routes.pop() {
            return Ok(id);
        }
        if self.next_route >= limits.max_route_id {
            return Err(PlanError::TooManyRoutes { max: limits.max_route_id });
        }
        self.next_route += 1;
        Ok(self.next_route)
    }

    pub(super) fn alloc_backend(&mut self, limits: &Limits) -> Result<u32, PlanError> {
        if let Some(id) = self.free_backends.pop() {
            return Ok(id);
        }
        if self.next_backend >= limits.max_backend_id {
            return Err(PlanError::TooManyBackends { max: limits.max_backend_id });
        }
        self.next_backend += 1;
        Ok(self.next_backend)
    }

    /// Table entries free now, and free once the quarantine ends.
    pub(super) fn free_slots(&self) -> (u64, u64) {
        let now: u64 = self.free_ranges.iter().map(|r| r.1 as u64).sum();
        let later: u64 = self.retired_ranges.iter().map(|r| r.2 as u64).sum();
        (now, now + later)
    }

    /// When the last table range in quarantine comes back (None: none is in quarantine).
    pub(super) fn quarantine_ends(&self) -> Option<Instant> {
        self.retired_ranges.iter().map(|r| r.0 + QUARANTINE).max()
    }

    /// Table range (base, len) is no longer led to as of `now`: free once the quarantine ends.
    pub(super) fn retire_range(&mut self, now: Instant, base: u32, len: u32) {
        self.retired_ranges.push((now, base, len));
    }

    /// Route `id` is no longer led to as of `now`: free once the quarantine ends.
    pub(super) fn retire_route(&mut self, now: Instant, id: u32) {
        self.retired_routes.push((now, id));
    }

    /// Backend `id` is no longer in the pool as of `now`: free once the quarantine ends.
    pub(super) fn retire_backend(&mut self, now: Instant, id: u32) {
        self.retired_backends.push((now, id));
    }

    /// Index entries whose content is unknown since an interrupted change: the next plan
    /// writes them whatever the mirror says.
    pub(super) fn dirty_index(&self) -> &BTreeSet<u32> {
        &self.dirty_index
    }

    /// The index entries are all known again (the plan being made writes every dirty one).
    pub(super) fn clear_dirty_index(&mut self) {
        self.dirty_index.clear();
    }
}

fn coalesce(ranges: &mut Vec<(u32, u32)>) {
    ranges.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
    for &(b, l) in ranges.iter() {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == b => last.1 += l,
            _ => out.push((b, l)),
        }
    }
    *ranges = out;
}

/// What a pinned data plane's maps hold, as read back by a controller that adopts it: the input
/// of [`State::rebuild`]. Kernel-free, so the rebuilding is tested without root.
#[derive(Debug, Clone, Default)]
pub struct LiveMaps {
    /// Non-empty vip_index entries: (index, entry).
    pub index: Vec<(u32, IndexEntry)>,
    /// Entries of the routes array that hold a route: (id, route).
    pub routes: Vec<(u32, Route)>,
    /// The services hash map.
    pub hashed: Vec<Route>,
    /// Backend ids whose record says they belong to the pool: (id, address, alive, meta).
    pub backends: Vec<(u32, IpAddr, bool, BackendMeta)>,
}

impl State {
    /// The state a data plane's maps are in, rebuilt from the maps themselves (no side file that
    /// could disagree with them), named after `pool` where it can be: a service takes the name
    /// of the pool's service with its key, a backend the identity of the pool's backend whose
    /// identity hashes the same. Anything the maps hold that nothing reaches (a change that was
    /// interrupted) counts as free. `slot_at(i)` reads entry i of the table array. Returns the
    /// state and the ids that claim to be in the pool but are not adopted (two ids claiming one
    /// backend after an interrupted change): the caller retires them.
    pub fn rebuild(
        live: &LiveMaps,
        pool: &Pool,
        limits: &Limits,
        index_of: &dyn Fn(&RouteKey) -> u32,
        slot_at: &dyn Fn(u32) -> u32,
    ) -> (State, Vec<(u32, IpAddr)>) {
        let mut st = State { initialized: true, ..State::default() };
        let reached = st.reach(live, index_of);
        let retire = st.adopt_services(live, &reached, pool, slot_at);
        st.free_the_rest(live, limits);
        (st, retire)
    }

    /// Rebuild, step 1: what the index reaches, each key's route (and its id, where one holds
    /// it). Only what a packet can reach counts: a route or index entry left over from an
    /// interrupted change is not part of the state. Fills the index, the hashed keys, and the
    /// keys and routes that an id holds.
    fn reach(&mut self, live: &LiveMaps, index_of: &dyn Fn(&RouteKey) -> u32) -> BTreeMap<RouteKey, (Option<u32>, Route)> {
        let routes: BTreeMap<u32, Route> = live.routes.iter().copied().collect();
        let mut reached: BTreeMap<RouteKey, (Option<u32>, Route)> = BTreeMap::new();
        for &(idx, entry) in &live.index {
            match entry {
                IndexEntry::Route(id) => {
                    if let Some(r) = routes.get(&id).filter(|r| index_of(&r.key) == idx) {
                        reached.insert(r.key, (Some(id), *r));
                        self.index.insert(idx, entry);
                    }
                }
                IndexEntry::Shared => {
                    self.index.insert(idx, entry);
                    for r in live.hashed.iter().filter(|r| index_of(&r.key) == idx) {
                        let id = routes.iter().find(|(_, v)| *v == r).map(|(id, _)| *id);
                        reached.insert(r.key, (id, *r));
                    }
                }
            }
        }
        self.hashed = live.hashed.iter().map(|r| r.key).collect();
        for (key, (id, route)) in &reached {
            if let Some(id) = id {
                self.keys.insert(*key, *id);
                self.routes.insert(*id, *route);
            }
        }
        reached
    }

    /// Rebuild, step 2: a service for every reached key (fragment routes aside), with its
    /// table as the table array holds it and the backends that claim it. Returns the ids to
    /// retire: claims of a second id for one backend, and of services nothing reaches.
    fn adopt_services(
        &mut self,
        live: &LiveMaps,
        reached: &BTreeMap<RouteKey, (Option<u32>, Route)>,
        pool: &Pool,
        slot_at: &dyn Fn(u32) -> u32,
    ) -> Vec<(u32, IpAddr)> {
        let mut by_service: BTreeMap<RouteKey, Vec<(u32, IpAddr, bool, BackendMeta)>> = BTreeMap::new();
        for b in &live.backends {
            by_service.entry(b.3.service).or_default().push(*b);
        }
        let mut retire = Vec::new();
        for (key, (_, route)) in reached.iter().filter(|(k, _)| k.port != 0) {
            let owners: Vec<u32> = (0..route.table_len).map(|i| slot_at(route.base + i)).collect();
            let configured = pool.services.iter().find(|s| service_key(s) == *key);
            let claims = by_service.remove(key).unwrap_or_default();
            let backends = adopt_backends(claims, &owners, configured, &mut retire);
            let name = configured.map_or_else(|| format!("({})", endpoint_of(key)), |s| s.name.clone());
            self.services.push(LiveService {
                name,
                endpoint: endpoint_of(key),
                key: *key,
                spec: route.spec,
                slots: route.table_len,
                base: route.base,
                owners,
                backends,
                empty: route.slots == 0,
                // The maps keep no copy of the key: the file's is taken, as for the algorithm.
                quic_digest: configured.map_or(0, quic_digest),
                hops: Vec::new(),
                // The maps do not say which builder made a table: the file's is taken, so an
                // adoption reports no builder change (the tables themselves are compared).
                algorithm: configured.map_or(crate::config::Algorithm::Ring, |s| s.algorithm),
                algorithm_param: configured.map_or(0, algorithm_param),
            });
        }
        // Backends of services nothing reaches any more: retired.
        retire.extend(by_service.into_values().flatten().map(|b| (b.0, b.1)));
        retire
    }

    /// Rebuild, step 3: the allocators. Everything the adopted services do not use is free at
    /// once: what nothing reaches, no packet can be reading.
    fn free_the_rest(&mut self, live: &LiveMaps, limits: &Limits) {
        let used_routes: BTreeSet<u32> = self.keys.values().copied().collect();
        self.next_route = used_routes.iter().max().copied().unwrap_or(0).min(limits.max_route_id);
        self.free_routes = (1..=self.next_route).filter(|id| !used_routes.contains(id)).collect();
        let used_backends: BTreeSet<u32> = self.services.iter().flat_map(|s| &s.backends).map(|b| b.id).collect();
        let highest = live.backends.iter().map(|b| b.0).chain(used_backends.iter().copied()).max().unwrap_or(0);
        self.next_backend = highest.min(limits.max_backend_id);
        self.free_backends = (1..=self.next_backend).filter(|id| !used_backends.contains(id)).rev().collect();
        let mut used_ranges: Vec<(u32, u32)> = self.services.iter().map(|s| (s.base, s.slots)).collect();
        used_ranges.sort_unstable();
        let mut at = 0u32;
        for (base, len) in used_ranges {
            if base > at {
                self.free_ranges.push((at, base - at));
            }
            at = at.max(base.saturating_add(len));
        }
        if at < limits.capacity {
            self.free_ranges.push((at, limits.capacity - at));
        }
    }
}

/// The backends of one adopted service, from the ids whose meta claims it: one id per identity,
/// the one owning the most slots of `owners` (the others go to `retire`), named after the
/// configured service's backend with that identity hash where there is one.
fn adopt_backends(
    mut claims: Vec<(u32, IpAddr, bool, BackendMeta)>,
    owners: &[u32],
    configured: Option<&Service>,
    retire: &mut Vec<(u32, IpAddr)>,
) -> Vec<LiveBackend> {
    let mut slots_of: HashMap<u32, usize> = HashMap::new();
    for &o in owners {
        *slots_of.entry(o).or_default() += 1;
    }
    claims.sort_by_key(|c| (std::cmp::Reverse(slots_of.get(&c.0).copied().unwrap_or(0)), c.0));
    let mut seen = HashSet::new();
    let mut backends = Vec::new();
    for (id, address, _alive, meta) in claims {
        if !seen.insert(meta.identity) {
            retire.push((id, address));
            continue;
        }
        let identity = configured
            .and_then(|s| s.backends.iter().map(|b| b.identity()).find(|i| identity_hash(i) == meta.identity))
            .unwrap_or_else(|| format!("#{:016x}", meta.identity));
        backends.push(LiveBackend { id, identity, address, weight: meta.weight, state: meta.state });
    }
    // Ids were given in pool order.
    backends.sort_by_key(|b| b.id);
    backends
}

fn endpoint_of(k: &RouteKey) -> String {
    match k.addr {
        IpAddr::V4(a) => format!("{a}:{}/{}", k.port, k.proto.as_str()),
        IpAddr::V6(a) => format!("[{a}]:{}/{}", k.port, k.proto.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use std::collections::BTreeMap;

    use super::super::testkit::{adopt_after, expected, index_of, pool, run, Maps, A, LIMITS};
    use super::super::{identity_hash, plan, service_key, BackendMeta, IndexEntry, Limits, Op, PlanError, Route, QUARANTINE};
    use super::{adopt_backends, LiveMaps, State};
    use crate::config::BackendState;
    use crate::table::{build_service, Table};

    #[test]
    fn a_first_plan_has_the_whole_table_array_and_retired_ranges_come_back_merged_after_the_quarantine() {
        let t0 = Instant::now();
        let limits = Limits { capacity: 100, ..LIMITS };
        let mut st = State::default();
        st.begin(&limits, t0);
        assert_eq!(st.free_slots(), (100, 100));
        assert_eq!((st.alloc_range(10), st.alloc_range(20), st.alloc_range(70)), (Some(0), Some(10), Some(30)));
        assert_eq!(st.alloc_range(1), None);
        st.retire_range(t0, 10, 20);
        st.retire_range(t0 + Duration::from_millis(1), 0, 10);
        assert_eq!(st.free_slots(), (0, 30));
        assert_eq!(st.quarantine_ends(), Some(t0 + Duration::from_millis(1) + QUARANTINE));
        st.begin(&limits, t0 + QUARANTINE);
        assert_eq!(st.free_slots(), (20, 30), "the first range is back, the second still waits");
        st.begin(&limits, t0 + Duration::from_millis(1) + QUARANTINE);
        assert_eq!((st.free_slots(), st.quarantine_ends()), ((30, 30), None));
        assert_eq!(st.alloc_range(30), Some(0), "the two ranges merged into one piece");
    }

    #[test]
    fn route_and_backend_ids_stop_at_the_limits_and_come_back_after_the_quarantine() {
        let t0 = Instant::now();
        let limits = Limits { capacity: 100, max_backend_id: 2, max_route_id: 1 };
        let mut st = State::default();
        st.begin(&limits, t0);
        assert_eq!(st.alloc_route(&limits), Ok(1));
        assert_eq!(st.alloc_route(&limits), Err(PlanError::TooManyRoutes { max: 1 }));
        assert_eq!((st.alloc_backend(&limits), st.alloc_backend(&limits)), (Ok(1), Ok(2)));
        assert_eq!(st.alloc_backend(&limits), Err(PlanError::TooManyBackends { max: 2 }));
        st.retire_route(t0, 1);
        st.retire_backend(t0, 2);
        st.begin(&limits, t0 + QUARANTINE - Duration::from_millis(1));
        assert!(st.alloc_route(&limits).is_err() && st.alloc_backend(&limits).is_err(), "still in quarantine");
        st.begin(&limits, t0 + QUARANTINE);
        assert_eq!((st.alloc_route(&limits), st.alloc_backend(&limits)), (Ok(1), Ok(2)));
    }

    #[test]
    fn a_tainted_state_makes_the_next_plan_rewrite_every_slot_and_what_the_interrupted_change_touched() {
        let t0 = Instant::now();
        let p = pool(A);
        let first = run(&State::default(), &p, t0);
        let mut maps = Maps::default();
        maps.apply(&first.ops);
        let dns = service_key(&p.services[1]);
        let mut st = first.state.clone();
        st.taint(&[Op::Index { index: 3, entry: None }, Op::HashPut { key: dns, route: first.state.routes[&first.state.keys[&dns]] }]);
        assert!(!st.index.contains_key(&3) && st.dirty_index().contains(&3) && !st.keys.contains_key(&dns));
        let again = run(&st, &p, t0 + Duration::from_secs(1));
        assert_eq!(again.slots_written(), 3 * 1009, "every slot is rewritten");
        assert!(again.ops.iter().any(|op| matches!(op, Op::Index { index: 3, entry: Some(_) })), "the touched entry is rewritten");
        assert!(again.ops.iter().any(|op| matches!(op, Op::HashPut { key, .. } if *key == dns)), "the touched key gets its route again");
        maps.apply(&again.ops);
        for s in &p.services {
            assert_eq!(maps.table(&service_key(s)), expected(&p, &s.name), "{}", s.name);
        }
    }

    #[test]
    fn a_rebuild_reaches_only_what_the_index_leads_to() {
        let t0 = Instant::now();
        let p = pool(A);
        let first = run(&State::default(), &p, t0);
        let mut maps = Maps::default();
        maps.apply(&first.ops);
        // Left over by an interrupted change: a route nothing leads to, and an index entry
        // naming a route whose key has another index.
        let web = first.state.routes[&first.state.keys[&service_key(&p.services[0])]];
        maps.routes.insert(99, Route { base: 5000, ..web });
        maps.routes.insert(98, web);
        maps.index.insert(6, IndexEntry::Route(98));
        let mut st = State::default();
        let reached = st.reach(&maps.live(), &index_of);
        assert_eq!(reached.keys().collect::<Vec<_>>(), first.state.keys.keys().collect::<Vec<_>>());
        assert_eq!((&st.keys, &st.routes, &st.hashed), (&first.state.keys, &first.state.routes, &first.state.hashed));
        assert_eq!(st.index, first.state.index);
    }

    #[test]
    fn a_rebuild_adopts_one_id_per_backend_the_one_owning_most_slots() {
        let p = pool("services:\n  - {name: w, vip: 10.0.0.1, port: 80, slots: 7, backends: [10.0.0.2]}\n");
        let key = service_key(&p.services[0]);
        let claim = |id, addr: &str, identity: &str| {
            (id, addr.parse().expect("address"), true, BackendMeta { service: key, identity: identity_hash(identity), weight: 1, state: BackendState::Active })
        };
        let claims = vec![claim(1, "10.0.0.2", "10.0.0.2"), claim(7, "10.0.0.2", "10.0.0.2"), claim(3, "10.0.0.3", "gone")];
        let mut retire = Vec::new();
        let got = adopt_backends(claims, &[7, 7, 1, 3, 0, 0, 0], Some(&p.services[0]), &mut retire);
        let got: Vec<(u32, &str)> = got.iter().map(|b| (b.id, b.identity.as_str())).collect();
        let unknown = format!("#{:016x}", identity_hash("gone"));
        assert_eq!(got, vec![(3, unknown.as_str()), (7, "10.0.0.2")], "by id; named from the file where it can be");
        assert_eq!(retire, vec![(1, "10.0.0.2".parse().expect("address"))]);
    }

    #[test]
    fn a_rebuild_frees_every_range_and_id_nothing_uses() {
        let mut services = run(&State::default(), &pool("services:\n  - {name: w, vip: 10.0.0.1, port: 80, slots: 7, backends: [10.0.0.2, 10.0.0.3]}\n"), Instant::now()).state.services;
        services[0].backends[0].id = 2;
        services[0].backends[1].id = 5;
        services.push(services[0].clone());
        services[0].base = 30;
        services[1].base = 10;
        services[1].backends.clear();
        services[1].key.port = 81;
        let keys = BTreeMap::from([(services[0].key, 1), (services[1].key, 3)]);
        let mut st = State { services, keys, ..State::default() };
        let stray = (6, "10.0.0.9".parse().expect("address"), true, BackendMeta { service: st.services[0].key, identity: 0, weight: 1, state: BackendState::Active });
        let live = LiveMaps { backends: vec![stray], ..LiveMaps::default() };
        st.free_the_rest(&live, &Limits { capacity: 100, ..LIMITS });
        assert_eq!(st.free_ranges, vec![(0, 10), (17, 13), (37, 63)]);
        assert_eq!((st.next_route, st.free_routes.clone()), (3, vec![2]));
        assert_eq!((st.next_backend, st.free_backends.clone()), (6, vec![6, 4, 3, 1]));
    }

    #[test]
    fn a_state_rebuilt_from_the_maps_repairs_any_interrupted_change_and_writes_only_what_differs() {
        let t0 = Instant::now();
        let p1 = pool(A);
        let first = run(&State::default(), &p1, t0);
        let mut maps = Maps::default();
        maps.apply(&first.ops);
        // A change of every kind: a backend removed, one added, a service resized, one removed,
        // one added.
        let p2 = pool(
            &A.replace("10.0.0.1, 10.0.0.2, 10.0.0.3", "10.0.0.1, 10.0.0.3, 10.0.0.9")
                .replace("port: 53, protocol: udp, slots: 1009", "port: 53, protocol: udp, slots: 2003")
                .replace("{name: alt, vip: 10.0.0.100, port: 60, slots: 1009, backends: [10.0.0.4]}", "{name: new, vip: 10.0.0.101, port: 61, slots: 1009, backends: [10.0.0.5]}"),
        );
        let second = run(&first.state, &p2, t0 + Duration::from_secs(1));
        for cut in 0..=second.ops.len() {
            let (m, third) = adopt_after(&maps, &second.ops[..cut], &p2, t0 + Duration::from_secs(2));
            for s in &p2.services {
                assert_eq!(m.table(&service_key(s)), expected(&p2, &s.name), "cut {cut}: {}", s.name);
            }
            for s in &p1.services {
                if p2.services.iter().all(|n| service_key(n) != service_key(s)) {
                    assert!(m.lookup(&service_key(s)).is_none(), "cut {cut}: removed service {} still reachable", s.name);
                }
            }
            if cut == second.ops.len() {
                // Nothing left to do: the maps already are the file.
                assert_eq!(third.slots_written(), 0, "an adoption after a finished change writes no slot");
                assert!(third.touched.is_empty(), "{:?}", third.touched);
            }
            if cut == 0 {
                // Adopting the old maps with the new file writes exactly what the change writes.
                assert_eq!(third.slots_written(), second.slots_written());
            }
        }
        // The names come from the file; backends keep their ids.
        let mut m = maps.clone();
        m.apply(&second.ops);
        let (st, _) = State::rebuild(&m.live(), &p2, &LIMITS, &index_of, &|i| m.slots.get(&i).copied().unwrap_or(0));
        let web = st.services.iter().find(|s| s.name == "web").expect("web named");
        let ids: Vec<(String, u32)> = web.backends.iter().map(|b| (b.identity.clone(), b.id)).collect();
        let want: Vec<(String, u32)> =
            second.state.services.iter().find(|s| s.name == "web").expect("web").backends.iter().map(|b| (b.identity.clone(), b.id)).collect();
        let mut ids_sorted = ids.clone();
        ids_sorted.sort();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        assert_eq!(ids_sorted, want_sorted);
    }

    #[test]
    fn an_empty_service_given_backends_is_repaired_after_an_interruption_anywhere() {
        let t0 = Instant::now();
        let a = "services:\n  - {name: web, vip: 10.0.0.100, port: 80, slots: 1009, backends: []}\n  - {name: dns, vip: 10.0.0.100, port: 53, protocol: udp, slots: 1009, backends: [10.0.0.1]}\n";
        let b = "services:\n  - {name: web, vip: 10.0.0.100, port: 80, slots: 1009, backends: [10.0.0.1, 10.0.0.2]}\n  - {name: dns, vip: 10.0.0.100, port: 53, protocol: udp, slots: 1009, backends: []}\n";
        let (p1, p2) = (pool(a), pool(b));
        let first = run(&State::default(), &p1, t0);
        let mut maps = Maps::default();
        maps.apply(&first.ops);
        let second = run(&first.state, &p2, t0 + Duration::from_secs(1));
        for cut in 0..=second.ops.len() {
            let (m, _) = adopt_after(&maps, &second.ops[..cut], &p2, t0 + Duration::from_secs(2));
            for s in &p2.services {
                let got = m.lookup(&service_key(s)).expect("route");
                let want_slots = if s.backends.is_empty() { 0 } else { s.slots };
                assert_eq!(got.slots, want_slots, "cut {cut}: {}'s route", s.name);
                if want_slots > 0 {
                    assert_eq!(m.table(&service_key(s)), expected(&p2, &s.name), "cut {cut}: {}", s.name);
                }
            }
        }
    }

    #[test]
    fn enough_free_entries_in_pieces_wait_for_the_quarantine_to_merge_them() {
        // Found by the reload soak: a change whose new range fits the free entries in all but
        // not any one free piece was refused, though a quarantined neighbour would merge them.
        let limits = Limits { capacity: 2000, ..LIMITS };
        let t0 = Instant::now();
        let go = |state: &State, services: &[(&str, u32)], now: Instant| {
            let mut text = String::from("services:\n");
            for (i, (name, slots)) in services.iter().enumerate() {
                text.push_str(&format!("  - {{name: {name}, vip: 10.0.0.1, port: {}, slots: {slots}, backends: [10.0.0.2]}}\n", 80 + i));
            }
            let p = pool(&text);
            let tables: Vec<Table> = p.services.iter().map(build_service).collect();
            plan(state, &p, &tables, &limits, &index_of, now)
        };
        let a = go(&State::default(), &[("x", 600), ("y", 600)], t0).expect("fits");
        let b = go(&a.state, &[("y", 600)], t0).expect("a removal");
        // x's range [0, 600) is back; z takes 500 of it: free are [500, 600) and [1200, 2000).
        let c = go(&b.state, &[("y", 600), ("z", 500)], t0 + QUARANTINE).expect("fits");
        // y goes (its range [600, 1200) quarantined); then w needs 850: 900 are free, in two
        // pieces, and the quarantined range between them will merge them.
        let d = go(&c.state, &[("z", 500)], t0 + QUARANTINE).expect("a removal");
        let err = go(&d.state, &[("z", 500), ("w", 850)], t0 + QUARANTINE).expect_err("not in one piece");
        assert_eq!(err, PlanError::CapacityAt { until: t0 + QUARANTINE * 2 });
        let d = go(&d.state, &[("z", 500), ("w", 850)], t0 + QUARANTINE * 2).expect("merged");
        assert!(d.state.services.iter().any(|s| s.name == "w" && s.base == 500));
    }

    #[test]
    fn ids_of_removed_backends_come_back_only_after_the_quarantine_with_counters_reset() {
        let t0 = Instant::now();
        let one = pool("services:\n  - {name: w, vip: 10.0.0.1, port: 80, slots: 7, backends: [10.0.0.2, 10.0.0.3]}\n");
        let other = pool("services:\n  - {name: w, vip: 10.0.0.1, port: 80, slots: 7, backends: [10.0.0.2, 10.0.0.4]}\n");
        let a = run(&State::default(), &one, t0);
        let b = run(&a.state, &other, t0 + Duration::from_millis(1));
        let id_of = |st: &State, addr: &str| st.services[0].backends.iter().find(|x| x.address.to_string() == addr).map(|x| x.id);
        assert_ne!(id_of(&b.state, "10.0.0.4"), id_of(&a.state, "10.0.0.3"), "not reused at once");
        let c = run(&b.state, &one, t0 + Duration::from_secs(1));
        let reused = id_of(&c.state, "10.0.0.3").expect("id");
        assert!(c.ops.contains(&Op::ResetCounters { id: reused }));
        assert_eq!(id_of(&c.state, "10.0.0.2"), id_of(&a.state, "10.0.0.2"), "a staying backend keeps its id");
    }
}
