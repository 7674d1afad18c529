//! What to write into the data plane's maps to go from what is installed to a new pool, and in
//! which order, so that no packet ever meets a half-applied change. Kernel-free: the data plane
//! module executes the [`Op`]s this computes, one map write each, in order.
//!
//! The rules the order follows (each is checked by the tests below):
//! - a backend record is written before any table slot names its id;
//! - a route (an entry of the `routes` array) is written before anything leads to it, and never
//!   rewritten while anything does: a changed route gets a new id;
//! - a table that keeps its place and size is rewritten in place, only the slots whose backend
//!   changes, in one batch: each slot write is whole, so every packet meets an old or a new
//!   owner, never an unwritten one. A table that changes size is written in full to a free
//!   range first, and its new route switches to it: never a mix of two slot counts;
//! - the index entries that make routes reachable are switched last; a key leaves the services
//!   hash map only after no index entry sends packets there;
//! - ids and table ranges that nothing leads to any more are reused only after a quarantine, so
//!   a packet still in flight on the old state never meets a rewritten one.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::config::{Forward, HashMode, Pool, Protocol, Service};
use crate::table::{Table, EMPTY};

/// How long a retired route id, backend id or table range waits before it is reused. Packets run
/// the program in microseconds; this is thousands of times that.
pub const QUARANTINE: Duration = Duration::from_millis(200);

/// A service key as the data plane looks it up. Port 0 is the fragment route of (addr, proto).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteKey {
    pub addr: IpAddr,
    pub port: u16,
    pub proto: Protocol,
}

/// An entry of the routes array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub key: RouteKey,
    /// Where the table starts in the table array.
    pub base: u32,
    /// Table size; 0 when the service has no backend with weight (its packets are dropped).
    pub slots: u32,
    pub hash: HashMode,
    /// Connection tracking on.
    pub conntrack: bool,
    /// How packets reach the backends, and the GUE port.
    pub forward: Forward,
    pub gue_port: u16,
    /// The length of the table's range in the table array (`slots` may be 0: an empty table).
    pub table_len: u32,
}

/// What a vip_index entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexEntry {
    /// The one route whose key has this index.
    Route(u32),
    /// Several keys have this index: look in the services hash map.
    Shared,
}

/// One map write.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Write backend `id`'s record for `address` (its MAC as currently known). `alive`: tracked
    /// flows may still use it (false once it is removed or down). `in_pool`: the id belongs to a
    /// backend of the pool (false once it is retired).
    Backend { id: u32, address: IpAddr, alive: bool, in_pool: bool },
    /// Write whose backend `id` is (read back by a controller that adopts a pinned data plane),
    /// before its record; `name` is its identity.
    Meta { id: u32, meta: BackendMeta, name: String },
    /// Record (or, with None, forget) the name of the service at `key`, for `lb status`.
    ServiceName { key: RouteKey, name: Option<String> },
    /// Backend `id` is given to a new backend: zero its traffic counters and bump its generation,
    /// so that flows tracked to the id's previous owner no longer count.
    ResetCounters { id: u32 },
    /// Write table-array entries (index, backend id), in one batch.
    Slots(Vec<(u32, u32)>),
    /// Write route `id` of the routes array.
    Route { id: u32, route: Route },
    /// Put `route` under `key` in the services hash map.
    HashPut { key: RouteKey, route: Route },
    /// Remove `key` from the services hash map.
    HashDelete { key: RouteKey },
    /// Set vip_index entry `index` (None: no route).
    Index { index: u32, entry: Option<IndexEntry> },
}

/// Whose a backend id is: its service, the hash of its identity, its weight and state. Kept in
/// the data plane's backend_meta map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendMeta {
    pub service: RouteKey,
    pub identity: u64,
    pub weight: u32,
    pub state: crate::config::BackendState,
}

/// The hash of a backend identity that backend_meta keeps.
pub fn identity_hash(identity: &str) -> u64 {
    xxhash_rust::xxh64::xxh64(identity.as_bytes(), 0)
}

/// Limits of the loaded program's maps.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Entries of the table array.
    pub capacity: u32,
    /// Highest usable backend id (ids start at 1).
    pub max_backend_id: u32,
    /// Highest usable route id (ids start at 1).
    pub max_route_id: u32,
}

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
    pub hash: HashMode,
    pub slots: u32,
    pub base: u32,
    /// The table as written: backend id per slot (0 = empty).
    pub owners: Vec<u32>,
    /// Its backends, in pool order.
    pub backends: Vec<LiveBackend>,
    /// True when no backend has weight: the route says 0 slots.
    pub empty: bool,
    pub conntrack: bool,
    pub forward: Forward,
    pub gue_port: u16,
    /// The table builder and its parameter (ring: vnodes per weight; bounded: load bound).
    pub algorithm: crate::config::Algorithm,
    pub algorithm_param: u32,
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

/// What one service's change amounts to, for the reload log.
#[derive(Debug, Clone, PartialEq)]
pub struct Touched {
    pub name: String,
    pub change: &'static str,
    /// What changed in a changed service: `b2 removed`, `b1 weight 1 -> 3`, `slots 4099 -> 65537`.
    pub notes: Vec<String>,
    /// Table entries written for it.
    pub slots_written: u64,
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// What differs between two versions of a service, in words.
fn notes(old: &LiveService, new: &LiveService) -> Vec<String> {
    let mut out = Vec::new();
    let endpoint = |s: &LiveService| s.endpoint.clone();
    if old.key != new.key {
        out.push(format!("endpoint {} -> {}", endpoint(old), endpoint(new)));
    }
    if old.hash != new.hash {
        out.push(format!("hash {} -> {}", old.hash.as_str(), new.hash.as_str()));
    }
    if old.slots != new.slots {
        out.push(format!("slots {} -> {}", old.slots, new.slots));
    }
    if old.conntrack != new.conntrack {
        out.push(format!("conntrack {} -> {}", on_off(old.conntrack), on_off(new.conntrack)));
    }
    if old.forward != new.forward {
        out.push(format!("forward {} -> {}", old.forward.as_str(), new.forward.as_str()));
    }
    if old.algorithm != new.algorithm {
        out.push(format!("{} -> {}", old.algorithm.as_str(), new.algorithm.as_str()));
    } else if old.algorithm_param != new.algorithm_param {
        match new.algorithm {
            crate::config::Algorithm::Ring => out.push(format!("vnodes_per_weight {} -> {}", old.algorithm_param, new.algorithm_param)),
            crate::config::Algorithm::Bounded => out.push(format!(
                "load_bound {}.{:03} -> {}.{:03}",
                old.algorithm_param / 1000,
                old.algorithm_param % 1000,
                new.algorithm_param / 1000,
                new.algorithm_param % 1000
            )),
            crate::config::Algorithm::Maglev => {}
        }
    }
    if old.forward == Forward::Gue && new.forward == Forward::Gue && old.gue_port != new.gue_port {
        out.push(format!("gue_port {} -> {}", old.gue_port, new.gue_port));
    }
    let before: HashMap<&str, &LiveBackend> = old.backends.iter().map(|b| (b.identity.as_str(), b)).collect();
    let after: HashSet<&str> = new.backends.iter().map(|b| b.identity.as_str()).collect();
    for b in &new.backends {
        match before.get(b.identity.as_str()) {
            None => out.push(format!("{} added", b.identity)),
            Some(o) if o.weight != b.weight => out.push(format!("{} weight {} -> {}", b.identity, o.weight, b.weight)),
            Some(o) if o.state != b.state => out.push(format!("{} {} -> {}", b.identity, o.state.as_str(), b.state.as_str())),
            Some(o) if o.address != b.address => out.push(format!("{} address {} -> {}", b.identity, o.address, b.address)),
            Some(_) => {}
        }
    }
    for o in &old.backends {
        if !after.contains(o.identity.as_str()) {
            out.push(format!("{} removed", o.identity));
        }
    }
    out
}

#[derive(Debug)]
pub struct Plan {
    pub ops: Vec<Op>,
    pub state: State,
    /// Services that changed, in pool order then removed ones.
    pub touched: Vec<Touched>,
}

impl Plan {
    /// Table entries written in all.
    pub fn slots_written(&self) -> u64 {
        self.ops.iter().map(|op| if let Op::Slots(s) = op { s.len() as u64 } else { 0 }).sum()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum PlanError {
    /// Not enough free table entries, now or once the quarantine ends.
    Capacity { needed: u64, free: u64, capacity: u32 },
    /// Not enough free table entries until `until`, when retired ranges come back.
    CapacityAt { until: Instant },
    TooManyBackends { max: u32 },
    TooManyRoutes { max: u32 },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            PlanError::Capacity { needed, free, capacity } => write!(
                f,
                "the new tables need {needed} more slots of the table array but {free} of {capacity} are free; raise --table-capacity"
            ),
            PlanError::CapacityAt { .. } => write!(f, "table ranges retired a moment ago are still in quarantine"),
            PlanError::TooManyBackends { max } => write!(f, "more than {max} backend ids would be in use"),
            PlanError::TooManyRoutes { max } => write!(f, "more than {max} routes would be in use"),
        }
    }
}

impl std::error::Error for PlanError {}

impl State {
    /// After a change that stopped part-way: the maps may hold any mix of before and after for
    /// what `done` touched. Makes the next plan rewrite every table slot, and every index entry
    /// and hash key those writes touched.
    pub fn taint(&mut self, done: &[Op]) {
        for s in &mut self.services {
            s.owners.iter_mut().for_each(|o| *o = u32::MAX);
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

    fn alloc_range(&mut self, len: u32) -> Option<u32> {
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

    fn alloc_route(&mut self, limits: &Limits) -> Result<u32, PlanError> {
        if let Some(id) = self.free_routes.pop() {
            return Ok(id);
        }
        if self.next_route >= limits.max_route_id {
            return Err(PlanError::TooManyRoutes { max: limits.max_route_id });
        }
        self.next_route += 1;
        Ok(self.next_route)
    }

    fn alloc_backend(&mut self, limits: &Limits) -> Result<u32, PlanError> {
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
    fn free_slots(&self) -> (u64, u64) {
        let now: u64 = self.free_ranges.iter().map(|r| r.1 as u64).sum();
        let later: u64 = self.retired_ranges.iter().map(|r| r.2 as u64).sum();
        (now, now + later)
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
        let routes: BTreeMap<u32, Route> = live.routes.iter().copied().collect();
        let mut st = State { initialized: true, ..State::default() };
        // 1. What the index reaches: each key's route (and its id, where one holds it).
        let mut reached: BTreeMap<RouteKey, (Option<u32>, Route)> = BTreeMap::new();
        for &(idx, entry) in &live.index {
            match entry {
                IndexEntry::Route(id) => {
                    if let Some(r) = routes.get(&id).filter(|r| index_of(&r.key) == idx) {
                        reached.insert(r.key, (Some(id), *r));
                        st.index.insert(idx, entry);
                    }
                }
                IndexEntry::Shared => {
                    st.index.insert(idx, entry);
                    for r in live.hashed.iter().filter(|r| index_of(&r.key) == idx) {
                        let id = routes.iter().find(|(_, v)| *v == r).map(|(id, _)| *id);
                        reached.insert(r.key, (id, *r));
                    }
                }
            }
        }
        st.hashed = live.hashed.iter().map(|r| r.key).collect();
        for (key, (id, route)) in &reached {
            if let Some(id) = id {
                st.keys.insert(*key, *id);
                st.routes.insert(*id, *route);
            }
        }
        // 2. Backends by service; one id per identity (the one owning the most slots).
        let mut by_service: BTreeMap<RouteKey, Vec<(u32, IpAddr, bool, BackendMeta)>> = BTreeMap::new();
        for b in &live.backends {
            by_service.entry(b.3.service).or_default().push(*b);
        }
        let mut retire = Vec::new();
        let mut used_ranges: Vec<(u32, u32)> = Vec::new();
        for (key, (_, route)) in reached.iter().filter(|(k, _)| k.port != 0) {
            let owners: Vec<u32> = (0..route.table_len).map(|i| slot_at(route.base + i)).collect();
            used_ranges.push((route.base, route.table_len));
            let configured = pool.services.iter().find(|s| service_key(s) == *key);
            let mut claims = by_service.remove(key).unwrap_or_default();
            let mut slots_of: HashMap<u32, usize> = HashMap::new();
            for &o in &owners {
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
            let name = configured.map_or_else(|| format!("({})", endpoint_of(key)), |s| s.name.clone());
            st.services.push(LiveService {
                name,
                endpoint: endpoint_of(key),
                key: *key,
                hash: route.hash,
                slots: route.table_len,
                base: route.base,
                owners,
                backends,
                empty: route.slots == 0,
                conntrack: route.conntrack,
                forward: route.forward,
                gue_port: route.gue_port,
                // The maps do not say which builder made a table: the file's is taken, so an
                // adoption reports no builder change (the tables themselves are compared).
                algorithm: configured.map_or(crate::config::Algorithm::Ring, |s| s.algorithm),
                algorithm_param: configured.map_or(0, algorithm_param),
            });
        }
        // Backends of services nothing reaches any more: retired.
        retire.extend(by_service.into_values().flatten().map(|b| (b.0, b.1)));
        // 3. The allocators: everything not in use is free.
        let used_routes: BTreeSet<u32> = st.keys.values().copied().collect();
        st.next_route = used_routes.iter().max().copied().unwrap_or(0).min(limits.max_route_id);
        st.free_routes = (1..=st.next_route).filter(|id| !used_routes.contains(id)).collect();
        let used_backends: BTreeSet<u32> = st.services.iter().flat_map(|s| &s.backends).map(|b| b.id).collect();
        let highest = live.backends.iter().map(|b| b.0).chain(used_backends.iter().copied()).max().unwrap_or(0);
        st.next_backend = highest.min(limits.max_backend_id);
        st.free_backends = (1..=st.next_backend).filter(|id| !used_backends.contains(id)).rev().collect();
        used_ranges.sort_unstable();
        let mut at = 0u32;
        for (base, len) in used_ranges {
            if base > at {
                st.free_ranges.push((at, base - at));
            }
            at = at.max(base.saturating_add(len));
        }
        if at < limits.capacity {
            st.free_ranges.push((at, limits.capacity - at));
        }
        (st, retire)
    }
}

fn endpoint_of(k: &RouteKey) -> String {
    match k.addr {
        IpAddr::V4(a) => format!("{a}:{}/{}", k.port, k.proto.as_str()),
        IpAddr::V6(a) => format!("[{a}]:{}/{}", k.port, k.proto.as_str()),
    }
}

/// Whether two versions of a service have the same backends (in any order: a state rebuilt
/// from the maps lists them by id, a planned one in pool order).
fn same_backends(a: &[LiveBackend], b: &[LiveBackend]) -> bool {
    let by_identity: HashMap<&str, &LiveBackend> = a.iter().map(|x| (x.identity.as_str(), x)).collect();
    a.len() == b.len() && b.iter().all(|x| by_identity.get(x.identity.as_str()).is_some_and(|y| *y == x))
}

/// The builder's parameter of a service, for change detection.
fn algorithm_param(s: &Service) -> u32 {
    match s.algorithm {
        crate::config::Algorithm::Ring => s.vnodes_per_weight,
        crate::config::Algorithm::Bounded => s.load_bound,
        crate::config::Algorithm::Maglev => 0,
    }
}

pub fn service_key(s: &Service) -> RouteKey {
    RouteKey { addr: s.vip, port: s.port, proto: s.protocol }
}

/// Computes the ops that take the maps from `state` to `pool`, whose tables are `tables` (one
/// per service, in order, as `table::build_service` builds them). `index_of` is the data
/// plane's vip_index function.
pub fn plan(
    state: &State,
    pool: &Pool,
    tables: &[Table],
    limits: &Limits,
    index_of: &dyn Fn(&RouteKey) -> u32,
    now: Instant,
) -> Result<Plan, PlanError> {
    let mut st = state.clone();
    if !st.initialized {
        st.free_ranges = vec![(0, limits.capacity)];
        st.initialized = true;
    }
    st.release(now);
    let mut ops = Vec::new();
    let mut touched = Vec::new();
    let old_services: BTreeMap<&str, &LiveService> = state.services.iter().map(|s| (s.name.as_str(), s)).collect();

    // Capacity first, so that a refusal changes nothing: every new range must fit.
    let needed: u64 = pool
        .services
        .iter()
        .filter(|s| old_services.get(s.name.as_str()).is_none_or(|o| o.slots != s.slots))
        .map(|s| s.slots as u64)
        .sum();
    let (free_now, free_later) = st.free_slots();
    if needed > free_now {
        if needed <= free_later {
            let until = st.retired_ranges.iter().map(|r| r.0 + QUARANTINE).max().unwrap_or(now);
            return Err(PlanError::CapacityAt { until });
        }
        return Err(PlanError::Capacity { needed, free: free_later, capacity: limits.capacity });
    }

    // 1. Backends: keep the id of every (service, identity) that stays; new ones get an id, a
    //    record and zeroed counters before any slot can name them.
    let mut new_services = Vec::with_capacity(pool.services.len());
    let mut slot_ops: Vec<(u32, u32)> = Vec::new();
    let mut kept_ids: BTreeSet<u32> = BTreeSet::new();
    for (s, table) in pool.services.iter().zip(tables) {
        let old = old_services.get(s.name.as_str()).copied();
        let old_by_identity: HashMap<&str, &LiveBackend> =
            old.map(|o| o.backends.iter().map(|b| (b.identity.as_str(), b)).collect()).unwrap_or_default();
        let mut backends = Vec::with_capacity(s.backends.len());
        for b in &s.backends {
            let identity = b.identity();
            let prev = old_by_identity.get(identity.as_str()).copied();
            let alive = b.state != crate::config::BackendState::Down;
            let meta = BackendMeta { service: service_key(s), identity: identity_hash(&identity), weight: b.weight, state: b.state };
            let id = match prev {
                Some(p) => {
                    if p.weight != b.weight || p.state != b.state || p.address != b.address {
                        ops.push(Op::Meta { id: p.id, meta, name: identity.clone() });
                    }
                    if p.address != b.address || (p.state != crate::config::BackendState::Down) != alive {
                        ops.push(Op::Backend { id: p.id, address: b.address, alive, in_pool: true });
                    }
                    p.id
                }
                None => {
                    let id = st.alloc_backend(limits)?;
                    // The generation first: flows tracked to the id's previous owner must not
                    // count once the record says alive.
                    ops.push(Op::ResetCounters { id });
                    ops.push(Op::Meta { id, meta, name: identity.clone() });
                    ops.push(Op::Backend { id, address: b.address, alive, in_pool: true });
                    id
                }
            };
            kept_ids.insert(id);
            backends.push(LiveBackend { id, identity, address: b.address, weight: b.weight, state: b.state });
        }
        let owners: Vec<u32> =
            table.owners().iter().map(|&o| if o == EMPTY { 0 } else { backends[o as usize].id }).collect();

        // 2. Tables: in place when the size stays, else a fresh range, written in full.
        let (base, written) = match old {
            Some(o) if o.slots == s.slots => {
                let before = slot_ops.len();
                for (i, (&was, &now_id)) in o.owners.iter().zip(&owners).enumerate() {
                    if was != now_id {
                        slot_ops.push((o.base + i as u32, now_id));
                    }
                }
                (o.base, slot_ops.len() - before)
            }
            _ => {
                // Enough entries are free in all, but not in one piece: ranges in quarantine
                // coalesce with their neighbours when they come back, so wait for them if any.
                let base = match st.alloc_range(s.slots) {
                    Some(b) => b,
                    None => match st.retired_ranges.iter().map(|r| r.0 + QUARANTINE).max() {
                        Some(until) => return Err(PlanError::CapacityAt { until }),
                        None => return Err(PlanError::Capacity { needed, free: free_now, capacity: limits.capacity }),
                    },
                };
                slot_ops.extend(owners.iter().enumerate().map(|(i, &id)| (base + i as u32, id)));
                if let Some(o) = old {
                    st.retired_ranges.push((now, o.base, o.slots));
                }
                (base, s.slots as usize)
            }
        };
        let live = LiveService {
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
        };
        let change = match old {
            None => Some("added"),
            Some(o)
                if o.key != live.key
                    || o.hash != live.hash
                    || o.slots != live.slots
                    || o.conntrack != live.conntrack
                    || o.forward != live.forward
                    || o.gue_port != live.gue_port
                    || o.algorithm != live.algorithm
                    || o.algorithm_param != live.algorithm_param
                    || written > 0
                    || !same_backends(&o.backends, &live.backends) =>
            {
                Some("changed")
            }
            Some(_) => None,
        };
        if let Some(change) = change {
            let notes = old.map_or_else(Vec::new, |o| notes(o, &live));
            touched.push(Touched { name: s.name.clone(), change, notes, slots_written: written as u64 });
        }
        new_services.push(live);
    }
    for o in &state.services {
        if pool.service(&o.name).is_none() {
            touched.push(Touched { name: o.name.clone(), change: "removed", notes: Vec::new(), slots_written: 0 });
            st.retired_ranges.push((now, o.base, o.slots));
        }
    }
    for b in state.services.iter().flat_map(|s| &s.backends) {
        if !kept_ids.contains(&b.id) {
            // Flows tracked to a removed backend re-hash from now on.
            ops.push(Op::Backend { id: b.id, address: b.address, alive: false, in_pool: false });
            st.retired_backends.push((now, b.id));
        }
    }
    if !slot_ops.is_empty() {
        ops.push(Op::Slots(slot_ops));
    }

    // 3. Routes: every key the new pool needs, with its value; an unchanged value keeps its id.
    let mut wanted: BTreeMap<RouteKey, Route> = BTreeMap::new();
    let mut per_vip: BTreeMap<(IpAddr, Protocol), Vec<&LiveService>> = BTreeMap::new();
    for s in &new_services {
        let slots = if s.empty { 0 } else { s.slots };
        wanted.insert(
            s.key,
            Route {
                key: s.key,
                base: s.base,
                slots,
                hash: s.hash,
                conntrack: s.conntrack,
                forward: s.forward,
                gue_port: s.gue_port,
                table_len: s.slots,
            },
        );
        per_vip.entry((s.key.addr, s.key.proto)).or_default().push(s);
    }
    // Non-first IPv4 fragments carry no ports: they can follow their client's address when
    // exactly one service on (vip, protocol) hashes by client address; otherwise the route
    // says "flow" and the program drops them, counted.
    for ((addr, proto), services) in per_vip {
        let s = services[0];
        let routable = services.len() == 1 && s.hash == HashMode::ClientIp;
        let key = RouteKey { addr, port: 0, proto };
        let slots = if s.empty { 0 } else { s.slots };
        wanted.insert(
            key,
            Route {
                key,
                base: s.base,
                slots,
                hash: if routable { HashMode::ClientIp } else { HashMode::Flow },
                conntrack: false,
                forward: s.forward,
                gue_port: s.gue_port,
                table_len: s.slots,
            },
        );
    }
    let mut keys: BTreeMap<RouteKey, u32> = BTreeMap::new();
    let mut routes: BTreeMap<u32, Route> = BTreeMap::new();
    for (key, route) in &wanted {
        let id = match state.keys.get(key) {
            Some(&id) if state.routes.get(&id) == Some(route) => id,
            _ => {
                let id = st.alloc_route(limits)?;
                ops.push(Op::Route { id, route: *route });
                id
            }
        };
        keys.insert(*key, id);
        routes.insert(id, *route);
    }
    for (key, id) in &state.keys {
        if keys.get(key) != Some(id) {
            st.retired_routes.push((now, *id));
        }
    }

    // 4. The services hash map holds every key that shares an index entry: put new and changed
    //    ones before the index can send packets there.
    let mut groups: BTreeMap<u32, Vec<RouteKey>> = BTreeMap::new();
    for key in keys.keys() {
        groups.entry(index_of(key)).or_default().push(*key);
    }
    let mut hashed = BTreeSet::new();
    for group in groups.values().filter(|g| g.len() > 1) {
        for key in group {
            hashed.insert(*key);
            let id = keys[key];
            let unchanged = state.hashed.contains(key) && state.keys.get(key) == Some(&id);
            if !unchanged {
                ops.push(Op::HashPut { key: *key, route: routes[&id] });
            }
        }
    }

    // 5. The index entries, last: each switches its packets to the new state at once.
    let mut index: BTreeMap<u32, IndexEntry> = BTreeMap::new();
    for (idx, group) in &groups {
        index.insert(*idx, if group.len() > 1 { IndexEntry::Shared } else { IndexEntry::Route(keys[&group[0]]) });
    }
    for (idx, entry) in &index {
        if state.index.get(idx) != Some(entry) || state.dirty_index.contains(idx) {
            ops.push(Op::Index { index: *idx, entry: Some(*entry) });
        }
    }
    for idx in state.index.keys().chain(&state.dirty_index) {
        if !index.contains_key(idx) {
            ops.push(Op::Index { index: *idx, entry: None });
        }
    }
    st.dirty_index.clear();

    // 6. Keys no index entry sends to the hash map any more.
    for key in &state.hashed {
        if !hashed.contains(key) {
            ops.push(Op::HashDelete { key: *key });
        }
    }

    // 7. Names, for lb status (the data plane never reads them).
    let new_keys: HashSet<RouteKey> = new_services.iter().map(|s| s.key).collect();
    for o in &state.services {
        if !new_keys.contains(&o.key) {
            ops.push(Op::ServiceName { key: o.key, name: None });
        }
    }
    for s in &new_services {
        if old_services.get(s.name.as_str()).is_none_or(|o| o.key != s.key || o.name != s.name) {
            ops.push(Op::ServiceName { key: s.key, name: Some(s.name.clone()) });
        }
    }

    st.services = new_services;
    st.keys = keys;
    st.routes = routes;
    st.index = index;
    st.hashed = hashed;
    Ok(Plan { ops, state: st, touched })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_str;
    use crate::table::build_service;
    use std::collections::HashMap;

    const LIMITS: Limits = Limits { capacity: 1 << 20, max_backend_id: 65535, max_route_id: 2048 };

    /// A crude index function with many collisions, to exercise shared entries.
    fn index_of(k: &RouteKey) -> u32 {
        (k.port as u32) % 7
    }

    fn pool(text: &str) -> Pool {
        parse_str("p.yaml", text).expect("valid pool")
    }

    fn run(state: &State, p: &Pool, now: Instant) -> Plan {
        let tables: Vec<Table> = p.services.iter().map(build_service).collect();
        plan(state, p, &tables, &LIMITS, &index_of, now).expect("plan")
    }

    /// Replays ops on a model of the maps, checking every ordering rule as it goes; returns the
    /// maps after.
    #[derive(Default, Clone)]
    struct Maps {
        backends: HashMap<u32, IpAddr>,
        /// Per backend id: (alive, in the pool), and its meta.
        flags: HashMap<u32, (bool, bool)>,
        meta: HashMap<u32, BackendMeta>,
        slots: HashMap<u32, u32>,
        routes: HashMap<u32, Route>,
        hash: HashMap<RouteKey, Route>,
        index: HashMap<u32, IndexEntry>,
    }

    impl Maps {
        fn apply(&mut self, ops: &[Op]) {
            for op in ops {
                match op {
                    Op::Backend { id, address, alive, in_pool } => {
                        assert!(!*in_pool || self.meta.contains_key(id), "backend {id} in the pool before its meta");
                        self.backends.insert(*id, *address);
                        self.flags.insert(*id, (*alive, *in_pool));
                    }
                    Op::Meta { id, meta, .. } => {
                        self.meta.insert(*id, *meta);
                    }
                    Op::ResetCounters { .. } | Op::ServiceName { .. } => {}
                    Op::Slots(entries) => {
                        for (i, id) in entries {
                            assert!(*id == 0 || self.backends.contains_key(id), "slot {i} names backend {id} before its record");
                            self.slots.insert(*i, *id);
                        }
                    }
                    Op::Route { id, route } => {
                        assert!(
                            !self.index.values().any(|e| *e == IndexEntry::Route(*id)),
                            "route {id} rewritten while an index entry leads to it"
                        );
                        self.routes.insert(*id, *route);
                    }
                    Op::HashPut { key, route } => {
                        self.hash.insert(*key, *route);
                    }
                    // Whether live keys stay reachable is checked by lookups after each plan.
                    Op::HashDelete { key } => {
                        self.hash.remove(key);
                    }
                    Op::Index { index, entry } => {
                        match entry {
                            Some(IndexEntry::Route(id)) => {
                                let r = self.routes.get(id).expect("index to a written route");
                                for s in 0..r.slots {
                                    let b = self.slots.get(&(r.base + s)).copied().unwrap_or(0);
                                    assert!(b == 0 || self.backends.contains_key(&b));
                                }
                            }
                            Some(IndexEntry::Shared) => {}
                            None => {}
                        }
                        match entry {
                            Some(e) => self.index.insert(*index, *e),
                            None => self.index.remove(index),
                        };
                    }
                }
            }
        }

        /// The route a packet with `key` finds.
        fn lookup(&self, key: &RouteKey) -> Option<Route> {
            match self.index.get(&index_of(key))? {
                IndexEntry::Shared => self.hash.get(key).copied(),
                IndexEntry::Route(id) => self.routes.get(id).filter(|r| r.key == *key).copied(),
            }
        }

        /// What a controller adopting these maps reads back.
        fn live(&self) -> LiveMaps {
            LiveMaps {
                index: self.index.iter().map(|(i, e)| (*i, *e)).collect(),
                routes: self.routes.iter().map(|(i, r)| (*i, *r)).collect(),
                hashed: self.hash.values().copied().collect(),
                backends: self
                    .flags
                    .iter()
                    .filter(|(_, f)| f.1)
                    .map(|(id, f)| (*id, self.backends[id], f.0, self.meta[id]))
                    .collect(),
            }
        }

        /// The addresses a service's table sends each slot to.
        fn table(&self, key: &RouteKey) -> Vec<Option<IpAddr>> {
            let r = self.lookup(key).expect("route");
            (0..r.slots).map(|s| self.slots.get(&(r.base + s)).and_then(|id| self.backends.get(id)).copied()).collect()
        }
    }

    fn expected(p: &Pool, name: &str) -> Vec<Option<IpAddr>> {
        let s = p.service(name).expect("service");
        let t = build_service(s);
        t.owners().iter().map(|&o| (o != EMPTY).then(|| s.backends[o as usize].address)).collect()
    }

    const A: &str = "services:
  - {name: web, vip: 10.0.0.100, port: 80, slots: 1009, backends: [10.0.0.1, 10.0.0.2, 10.0.0.3]}
  - {name: dns, vip: 10.0.0.100, port: 53, protocol: udp, slots: 1009, hash: flow, backends: [10.0.0.1, 10.0.0.2]}
  - {name: alt, vip: 10.0.0.100, port: 60, slots: 1009, backends: [10.0.0.4]}
";

    /// The controller died after writing `done` of a change to `maps`; a new one adopts them
    /// with the file `p`: rebuilds the state from the maps, retires ids that claim to be in the
    /// pool but nothing reaches (as Dataplane::adopt does), and applies `p`. Returns the maps
    /// after, and the adoption's plan.
    fn adopt_after(maps: &Maps, done: &[Op], p: &Pool, now: Instant) -> (Maps, Plan) {
        let mut m = maps.clone();
        m.apply(done);
        let (st, retire) = State::rebuild(&m.live(), p, &LIMITS, &index_of, &|i| m.slots.get(&i).copied().unwrap_or(0));
        let retired: Vec<Op> = retire.iter().map(|&(id, address)| Op::Backend { id, address, alive: false, in_pool: false }).collect();
        m.apply(&retired);
        let plan = run(&st, p, now);
        m.apply(&plan.ops);
        (m, plan)
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
    fn the_reload_notes_name_every_kind_of_change() {
        let t0 = Instant::now();
        let p1 = pool(A);
        let first = run(&State::default(), &p1, t0);
        let p2 = pool(
            &A.replace("{name: web, vip: 10.0.0.100, port: 80, slots: 1009,", "{name: web, vip: 10.0.0.100, port: 80, slots: 1009, algorithm: maglev, hash: flow, conntrack: off, forward: ipip,")
                .replace("{name: alt, vip: 10.0.0.100, port: 60, slots: 1009,", "{name: alt, vip: 10.0.0.100, port: 60, slots: 2003, vnodes_per_weight: 10,"),
        );
        let second = run(&first.state, &p2, t0 + Duration::from_secs(1));
        let web = second.touched.iter().find(|t| t.name == "web").expect("web touched");
        for note in ["ring -> maglev", "hash client-ip -> flow", "conntrack on -> off", "forward l2 -> ipip"] {
            assert!(web.notes.iter().any(|n| n == note), "{note} missing from {:?}", web.notes);
        }
        let alt = second.touched.iter().find(|t| t.name == "alt").expect("alt touched");
        for note in ["slots 1009 -> 2003", "vnodes_per_weight 150 -> 10"] {
            assert!(alt.notes.iter().any(|n| n == note), "{note} missing from {:?}", alt.notes);
        }
    }

    #[test]
    fn a_first_plan_installs_every_service_as_the_table_builder_says() {
        let p = pool(A);
        let plan = run(&State::default(), &p, Instant::now());
        let mut maps = Maps::default();
        maps.apply(&plan.ops);
        for s in &p.services {
            assert_eq!(maps.table(&service_key(s)), expected(&p, &s.name), "{}", s.name);
        }
        assert_eq!(plan.touched.iter().filter(|t| t.change == "added").count(), 3);
        // Port 53 and 60 share an entry under index_of: they go through the hash map.
        assert!(plan.state.hashed.contains(&service_key(&p.services[1])));
        assert!(plan.state.hashed.contains(&service_key(&p.services[2])));
    }

    #[test]
    fn removing_a_backend_rewrites_only_its_slots_in_place() {
        let t0 = Instant::now();
        let p1 = pool(A);
        let first = run(&State::default(), &p1, t0);
        let mut maps = Maps::default();
        maps.apply(&first.ops);
        let p2 = pool(&A.replace("10.0.0.1, 10.0.0.2, 10.0.0.3", "10.0.0.1, 10.0.0.3"));
        let second = run(&first.state, &p2, t0 + Duration::from_secs(1));
        let web_slots_of_b2 = expected(&p1, "web").iter().filter(|a| **a == Some("10.0.0.2".parse().unwrap())).count();
        assert_eq!(second.slots_written(), web_slots_of_b2 as u64, "only the removed backend's slots are written");
        assert_eq!(
            second.touched,
            vec![Touched {
                name: "web".into(),
                change: "changed",
                notes: vec!["10.0.0.2 removed".into()],
                slots_written: web_slots_of_b2 as u64
            }]
        );
        // No route, index or hash op: the table changed in place under the same route; and the
        // removed backend's record says it is gone, so flows tracked to it re-hash.
        assert!(
            second.ops.iter().all(|op| matches!(op, Op::Slots(_) | Op::Backend { alive: false, .. })),
            "{:?}",
            second.ops.iter().take(3).collect::<Vec<_>>()
        );
        assert!(second.ops.contains(&Op::Backend { id: 2, address: "10.0.0.2".parse().unwrap(), alive: false, in_pool: false }), "{:?}", second.ops.iter().take(3).collect::<Vec<_>>());
        maps.apply(&second.ops);
        assert_eq!(maps.table(&service_key(&p2.services[0])), expected(&p2, "web"));
        // The same pool again: nothing to do.
        let third = run(&second.state, &p2, t0 + Duration::from_secs(2));
        assert!(third.ops.is_empty() && third.touched.is_empty());
    }

    #[test]
    fn every_kind_of_change_ends_with_the_new_tables_and_keeps_the_order_rules() {
        let variants = [
            A.to_string(),
            A.replace("slots: 1009, backends: [10.0.0.1, 10.0.0.2, 10.0.0.3]", "slots: 2003, backends: [10.0.0.1, 10.0.0.2, 10.0.0.3]"),
            A.replace("port: 80,", "port: 81,"),
            A.replace("hash: flow, ", ""),
            A.replace("  - {name: alt, vip: 10.0.0.100, port: 60, slots: 1009, backends: [10.0.0.4]}\n", ""),
            A.replace("[10.0.0.4]", "[{address: 10.0.0.4, weight: 0}]"),
            A.replace("[10.0.0.1, 10.0.0.2]", "[{address: 10.0.0.1, weight: 3}, {address: 10.0.0.2, weight: 1}, 10.0.0.9]"),
            A.replace("vip: 10.0.0.100, port: 60", "vip: 10.0.0.200, port: 60"),
            "services: []\n".to_string(),
            A.replace("name: web, vip: 10.0.0.100, port: 80", "name: web, vip: 10.0.0.100, port: 80, algorithm: maglev"),
        ];
        let mut state = State::default();
        let mut maps = Maps::default();
        let mut now = Instant::now();
        // Every variant after every other one.
        for (i, a) in variants.iter().enumerate() {
            for b in variants.iter().skip(i + 1).chain([a]) {
                for text in [a, b] {
                    now += Duration::from_millis(50);
                    let p = pool(text);
                    let plan = run(&state, &p, now);
                    maps.apply(&plan.ops);
                    for s in &p.services {
                        let r = maps.lookup(&service_key(s)).expect("route");
                        assert_eq!(r.hash, s.hash);
                        if s.backends.iter().any(|b| b.weight > 0) {
                            assert_eq!(maps.table(&service_key(s)), expected(&p, &s.name), "{} after switching to:\n{text}", s.name);
                        } else {
                            assert_eq!(r.slots, 0, "an empty service drops");
                        }
                    }
                    // Keys of removed services are gone.
                    for old in &state.services {
                        if !p.services.iter().any(|s| service_key(s) == old.key) {
                            assert!(maps.lookup(&old.key).is_none(), "{:?} still routed", old.key);
                        }
                    }
                    state = plan.state;
                }
            }
        }
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
