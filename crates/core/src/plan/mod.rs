//! What to write into the data plane's maps to go from what is installed to a new pool, and in
//! which order, so that no packet ever meets a half-applied change. Kernel-free: the data plane
//! module executes the [`Op`]s this computes, one map write each, in order.
//!
//! The rules the order follows (each is checked by the tests, which replay every plan's ops on a
//! model of the maps):
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
//!
//! The rooms: this file holds the types the data plane shares (keys, routes, ops, limits) and
//! [`plan`], a short sequence of named steps; `steps` holds the steps, each deciding one part of
//! the change over the one [`State`] being built; `state` holds [`State`] itself, its allocators
//! and quarantine, [`State::taint`] and [`State::rebuild`]; `notes` puts a changed service into
//! the reload log's words. The tests of each part sit in its file; the model of the maps they
//! replay ops on, which checks the rules above on every write, is shared from `testkit`.

use std::fmt;
use std::net::IpAddr;
use std::time::Instant;

use crate::config::{Pool, Protocol, Service};
use crate::table::Table;

mod notes;
mod spec;
mod state;
mod steps;
#[cfg(test)]
mod testkit;

pub use spec::{Flags, RouteSpec};
pub use state::{LiveBackend, LiveMaps, LiveService, State, QUARANTINE};

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
    /// The service's settings as the program acts on them (a fragment route's own: flow or
    /// client-ip, untracked).
    pub spec: RouteSpec,
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
    /// Write the second-chance hops of table-array entries (index, the two backend ids, 0 for
    /// none), in one batch, with the slots.
    Hops(Vec<(u32, [u32; 2])>),
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

#[derive(Debug)]
pub struct Plan {
    pub ops: Vec<Op>,
    pub state: State,
    /// Services that changed, in pool order then removed ones.
    pub touched: Vec<Touched>,
}

impl Plan {
    /// Table entries written in all (their hops not counted).
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

/// The builder's parameter of a service, for change detection.
fn algorithm_param(s: &Service) -> u32 {
    match s.algorithm {
        crate::config::Algorithm::Ring => s.vnodes_per_weight,
        crate::config::Algorithm::Bounded => s.load_bound,
        crate::config::Algorithm::Maglev => 0,
    }
}

/// A fingerprint of a service's QUIC-LB configuration (parameters, key and every backend's
/// server ID; 0 without quic_lb), so that the reload log says when it changed without showing
/// the key.
fn quic_digest(s: &Service) -> u64 {
    let Some(q) = &s.quic_lb else { return 0 };
    let mut text = format!("{} {} {} {:?}", q.rotation, q.server_id_len, q.nonce_len, q.key);
    for b in &s.backends {
        text.push_str(&format!(" {}={:?}", b.identity(), b.server_id));
    }
    xxhash_rust::xxh64::xxh64(text.as_bytes(), 0) | 1
}

pub fn service_key(s: &Service) -> RouteKey {
    RouteKey { addr: s.vip, port: s.port, proto: s.protocol }
}

/// Computes the ops that take the maps from `state` to `pool`, whose tables are `tables` (one
/// per service, in order, as `table::build_service` builds them). `index_of` is the data
/// plane's vip_index function. Each step is one decision (see `steps`); their order is the
/// order of the writes that the rules above fix.
pub fn plan(
    state: &State,
    pool: &Pool,
    tables: &[Table],
    limits: &Limits,
    index_of: &dyn Fn(&RouteKey) -> u32,
    now: Instant,
) -> Result<Plan, PlanError> {
    let mut draft = steps::Draft::new(state, limits, now);
    let budget = draft.check_capacity(pool)?;
    // Backend records, then the table slots that name them.
    let placed = draft.place_services(pool, tables, budget)?;
    draft.retire_services(pool);
    draft.retire_backends(&placed.kept);
    draft.write_slots(placed.slots, placed.hops);
    // Routes, then what leads to them: the hash map, then the index.
    let wanted = steps::wanted_routes(&draft.st.services);
    draft.routes(&wanted)?;
    let groups = steps::index_groups(&draft.st.keys, index_of);
    draft.put_hashed(&groups);
    draft.switch_index(&groups);
    // What nothing leads to any more, and the names for lb status.
    draft.delete_unhashed();
    draft.name_services();
    Ok(draft.finish())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::testkit::{expected, pool, run, Maps, A};
    use super::{service_key, Op, State, Touched};

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
                        assert_eq!(r.spec.hash, s.hash);
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
    fn the_steps_write_in_the_order_the_rules_need() {
        // A change of every kind: a backend removed, one added, one down, a service resized,
        // one moved to another port, one removed, one added; a first plan too.
        let t0 = Instant::now();
        let p1 = pool(A);
        let first = run(&State::default(), &p1, t0);
        let mut p2 = pool(
            &A.replace("10.0.0.1, 10.0.0.2, 10.0.0.3", "10.0.0.1, 10.0.0.3, 10.0.0.9")
                .replace("port: 53, protocol: udp, slots: 1009", "port: 54, protocol: udp, slots: 2003")
                .replace("{name: alt, vip: 10.0.0.100, port: 60, slots: 1009, backends: [10.0.0.4]}", "{name: new, vip: 10.0.0.101, port: 61, slots: 1009, backends: [10.0.0.5]}"),
        );
        p2.services[0].backends[0].state = crate::config::BackendState::Down;
        let second = run(&first.state, &p2, t0 + Duration::from_secs(1));
        // Backend records, slots, routes, hash map puts, index, hash map deletes, names.
        let phase = |op: &Op| match op {
            Op::ResetCounters { .. } | Op::Meta { .. } | Op::Backend { .. } => 0,
            Op::Slots(_) | Op::Hops(_) => 1,
            Op::Route { .. } => 2,
            Op::HashPut { .. } => 3,
            Op::Index { .. } => 4,
            Op::HashDelete { .. } => 5,
            Op::ServiceName { .. } => 6,
        };
        for plan in [&first, &second] {
            let phases: Vec<u8> = plan.ops.iter().map(phase).collect();
            assert!(phases.windows(2).all(|w| w[0] <= w[1]), "{phases:?}");
        }
        let phases: std::collections::BTreeSet<u8> = second.ops.iter().map(phase).collect();
        assert_eq!(phases.len(), 7, "the change writes every kind of op: {phases:?}");
        // Removed backends' records come after the new ones', in the same phase.
        let last_new = second.ops.iter().rposition(|op| matches!(op, Op::Backend { in_pool: true, .. })).expect("a new record");
        let first_gone = second.ops.iter().position(|op| matches!(op, Op::Backend { in_pool: false, .. })).expect("a removed record");
        assert!(last_new < first_gone);
    }
}
