//! What the plan's tests share: a pool parser, a crude index function, and a model of the data
//! plane's maps that replays ops and checks the ordering rules of the module doc on every write.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

use super::{plan, BackendMeta, IndexEntry, Limits, LiveMaps, Op, Plan, Route, RouteKey, State};
use crate::config::{parse_str, Pool};
use crate::table::{build_service, Table, EMPTY};

pub(super) const LIMITS: Limits = Limits { capacity: 1 << 20, max_backend_id: 65535, max_route_id: 2048 };

/// A crude index function with many collisions, to exercise shared entries.
pub(super) fn index_of(k: &RouteKey) -> u32 {
    (k.port as u32) % 7
}

pub(super) fn pool(text: &str) -> Pool {
    parse_str("p.yaml", text).expect("valid pool")
}

pub(super) fn run(state: &State, p: &Pool, now: Instant) -> Plan {
    let tables: Vec<Table> = p.services.iter().map(build_service).collect();
    plan(state, p, &tables, &LIMITS, &index_of, now).expect("plan")
}

/// Replays ops on a model of the maps, checking every ordering rule as it goes; returns the
/// maps after.
#[derive(Default, Clone)]
pub(super) struct Maps {
    pub(super) backends: HashMap<u32, IpAddr>,
    /// Per backend id: (alive, in the pool), and its meta.
    pub(super) flags: HashMap<u32, (bool, bool)>,
    pub(super) meta: HashMap<u32, BackendMeta>,
    pub(super) slots: HashMap<u32, u32>,
    pub(super) hops: HashMap<u32, [u32; 2]>,
    pub(super) routes: HashMap<u32, Route>,
    pub(super) hash: HashMap<RouteKey, Route>,
    pub(super) index: HashMap<u32, IndexEntry>,
}

impl Maps {
    pub(super) fn apply(&mut self, ops: &[Op]) {
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
                Op::Hops(entries) => {
                    for (i, ids) in entries {
                        for id in ids {
                            assert!(*id == 0 || self.backends.contains_key(id), "hop of {i} names backend {id} before its record");
                        }
                        self.hops.insert(*i, *ids);
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
    pub(super) fn lookup(&self, key: &RouteKey) -> Option<Route> {
        match self.index.get(&index_of(key))? {
            IndexEntry::Shared => self.hash.get(key).copied(),
            IndexEntry::Route(id) => self.routes.get(id).filter(|r| r.key == *key).copied(),
        }
    }

    /// What a controller adopting these maps reads back.
    pub(super) fn live(&self) -> LiveMaps {
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
    pub(super) fn table(&self, key: &RouteKey) -> Vec<Option<IpAddr>> {
        let r = self.lookup(key).expect("route");
        (0..r.slots).map(|s| self.slots.get(&(r.base + s)).and_then(|id| self.backends.get(id)).copied()).collect()
    }
}

pub(super) fn expected(p: &Pool, name: &str) -> Vec<Option<IpAddr>> {
    let s = p.service(name).expect("service");
    let t = build_service(s);
    t.owners().iter().map(|&o| (o != EMPTY).then(|| s.backends[o as usize].address)).collect()
}

pub(super) const A: &str = "services:
  - {name: web, vip: 10.0.0.100, port: 80, slots: 1009, backends: [10.0.0.1, 10.0.0.2, 10.0.0.3]}
  - {name: dns, vip: 10.0.0.100, port: 53, protocol: udp, slots: 1009, hash: flow, backends: [10.0.0.1, 10.0.0.2]}
  - {name: alt, vip: 10.0.0.100, port: 60, slots: 1009, backends: [10.0.0.4]}
";

/// The controller died after writing `done` of a change to `maps`; a new one adopts them
/// with the file `p`: rebuilds the state from the maps, retires ids that claim to be in the
/// pool but nothing reaches (as Balancer::adopt does), and applies `p`. Returns the maps
/// after, and the adoption's plan.
pub(super) fn adopt_after(maps: &Maps, done: &[Op], p: &Pool, now: Instant) -> (Maps, Plan) {
    let mut m = maps.clone();
    m.apply(done);
    let (st, retire) = State::rebuild(&m.live(), p, &LIMITS, &index_of, &|i| m.slots.get(&i).copied().unwrap_or(0));
    let retired: Vec<Op> = retire.iter().map(|&(id, address)| Op::Backend { id, address, alive: false, in_pool: false }).collect();
    m.apply(&retired);
    let plan = run(&st, p, now);
    m.apply(&plan.ops);
    (m, plan)
}
