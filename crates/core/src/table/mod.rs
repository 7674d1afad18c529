//! Destination tables: a backend pool compiled into a fixed array of slots.
//!
//! The builders (ring, Maglev, bounded) are pure functions of (identities, weights, table size,
//! and for the ring the tokens per weight, for the bounded table its load bound). They never look at the order in which backends were listed, the
//! machine, or the time, so several load balancers given the same pool agree slot for slot.
//! The exact algorithms are written down in docs/table-spec.md; the code follows it.

pub mod bounded;
mod hops;
pub mod maglev;
pub mod ring;

pub use hops::with_hops;

use crate::config::{Algorithm, Service};

/// The value of a slot that no backend owns.
pub const EMPTY: u32 = u32::MAX;

/// What a table builder needs to know about one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member<'a> {
    /// The bytes that are hashed: a backend's name, or its canonical address text.
    pub identity: &'a str,
    /// 0 means the backend owns no slots.
    pub weight: u32,
}

/// A destination table: for every slot, the index (into the member list it was built from)
/// of the backend that owns it, or [`EMPTY`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub(crate) owners: Vec<u32>,
    /// Second chance (`second_chance: on`): for every slot, up to two other members that may
    /// hold a connection hashed to it ([`EMPTY`]: none); empty for other services. See
    /// [`with_hops`].
    pub(crate) hops: Vec<[u32; 2]>,
}

impl Table {
    pub fn from_owners(owners: Vec<u32>) -> Table {
        Table { owners, hops: Vec::new() }
    }

    /// The second-chance hops of every slot (empty when the service has none).
    pub fn hops(&self) -> &[[u32; 2]] {
        &self.hops
    }

    pub fn len(&self) -> usize {
        self.owners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// The member that owns `slot`, or None for an empty slot.
    pub fn owner(&self, slot: usize) -> Option<usize> {
        match self.owners[slot] {
            EMPTY => None,
            i => Some(i as usize),
        }
    }

    pub fn owners(&self) -> &[u32] {
        &self.owners
    }

    /// Slots owned by each of `members` members.
    pub fn counts(&self, members: usize) -> Vec<u64> {
        let mut counts = vec![0u64; members];
        for &o in &self.owners {
            if o != EMPTY {
                counts[o as usize] += 1;
            }
        }
        counts
    }
}

/// Builds a table with the given algorithm (a bounded table with the default load bound; see
/// [`bounded::build`] for another).
pub fn build(algorithm: Algorithm, slots: u32, vnodes_per_weight: u32, members: &[Member]) -> Table {
    match algorithm {
        Algorithm::Ring => ring::build(members, vnodes_per_weight, slots),
        Algorithm::Maglev => maglev::build(members, slots),
        Algorithm::Bounded => bounded::build(members, slots, bounded::DEFAULT_LOAD_BOUND),
    }
}

/// Builds the table of a validated service. Table indices refer to `service.backends`.
pub fn build_service(service: &Service) -> Table {
    let identities: Vec<String> = service.backends.iter().map(|b| b.identity()).collect();
    let members: Vec<Member> = service
        .backends
        .iter()
        .zip(&identities)
        .map(|(b, id)| Member { identity: id, weight: b.serving_weight() })
        .collect();
    build_members(service, &members)
}

/// A table of `members` with the service's builder and parameters.
pub(crate) fn build_members(service: &Service, members: &[Member]) -> Table {
    match service.algorithm {
        Algorithm::Bounded => bounded::build(members, service.slots, service.load_bound),
        a => build(a, service.slots, service.vnodes_per_weight, members),
    }
}

/// A table's fingerprint, to compare what several nodes serve: xxh64 (seed 0) of, for every
/// slot in order, the 8 little-endian bytes of `xxh64(owner identity, seed 0)` (0 for an empty
/// slot); for a second-chance service, followed by the same for each slot's two hops in order
/// (0 for none), so that nodes agree only when their hop lists do too. `lb table` prints it from
/// the builder, `lb status` from the live state (which keeps each backend's identity hash), so
/// two nodes, or a node and the file, agree exactly when their tables do.
pub fn digest_of_hashes(identity_hashes: impl Iterator<Item = u64>) -> u64 {
    let mut h = xxhash_rust::xxh64::Xxh64::new(0);
    for x in identity_hashes {
        h.update(&x.to_le_bytes());
    }
    h.digest()
}

/// [`digest_of_hashes`] of a built table whose members are `identities`.
pub fn digest(table: &Table, identities: &[String]) -> u64 {
    let hashes: Vec<u64> = identities.iter().map(|i| xxhash_rust::xxh64::xxh64(i.as_bytes(), 0)).collect();
    let of = |o: u32| if o == EMPTY { 0 } else { hashes[o as usize] };
    let hops = table.hops().iter().flat_map(|h| [of(h[0]), of(h[1])]);
    digest_of_hashes(table.owners().iter().map(|&o| of(o)).chain(hops))
}

/// Builds services' tables across successive pools, reusing each ring service's tokens from the
/// previous build (see [`ring::RingCache`]); the tables are exactly [`build_service`]'s.
#[derive(Default)]
pub struct Builder {
    rings: std::collections::HashMap<String, ring::RingCache>,
    /// Each second-chance service's runner-ups, with the key of what they were built from
    /// ([`hops::runner_ups`]): one table build per backend, not repeated while it holds.
    runner_ups: std::collections::HashMap<String, (u64, Vec<u32>)>,
}

impl Builder {
    pub fn build_service(&mut self, service: &Service) -> Table {
        if service.algorithm != Algorithm::Ring {
            self.rings.remove(&service.name);
            return build_service(service);
        }
        let identities: Vec<String> = service.backends.iter().map(|b| b.identity()).collect();
        let members: Vec<Member> =
            service.backends.iter().zip(&identities).map(|(b, id)| Member { identity: id, weight: b.serving_weight() }).collect();
        self.rings.entry(service.name.clone()).or_default().build(&members, service.vnodes_per_weight, service.slots)
    }

    /// [`with_hops`], with each service's runner-ups kept from build to build while nothing they
    /// depend on changes: the same hops, without rebuilding them on every reload and health
    /// change of another backend or service.
    pub fn with_hops(&mut self, service: &Service, table: Table, previous: Option<&Service>) -> Table {
        if !service.second_chance || table.is_empty() {
            self.runner_ups.remove(&service.name);
            return table;
        }
        let key = hops::runner_up_key(service);
        let fresh = match self.runner_ups.get(&service.name) {
            Some((k, r)) if *k == key && r.len() == table.len() => None,
            _ => Some(hops::runner_ups(service, &table)),
        };
        if let Some(r) = fresh {
            self.runner_ups.insert(service.name.clone(), (key, r));
        }
        let runner_ups = self.runner_ups.get(&service.name).map(|(_, r)| r.as_slice()).unwrap_or(&[]);
        hops::with_runner_ups(service, table, previous, runner_ups)
    }

    /// Forgets services not in `names`.
    pub fn retain(&mut self, names: &[&str]) {
        self.rings.retain(|n, _| names.contains(&n.as_str()));
        self.runner_ups.retain(|n, _| names.contains(&n.as_str()));
    }
}

/// Per-backend figures of a built table, as `lb table` prints them.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    pub slots: u64,
    /// slots / table size
    pub share: f64,
    /// weight / total weight (0 when every weight is 0)
    pub ideal: f64,
}

impl Share {
    /// Relative deviation from the ideal share, or None for a backend that should own nothing.
    pub fn deviation(&self) -> Option<f64> {
        (self.ideal > 0.0).then(|| self.share / self.ideal - 1.0)
    }
}

pub fn shares(service: &Service, table: &Table) -> Vec<Share> {
    let counts = table.counts(service.backends.len());
    let total_weight: u64 = service.backends.iter().map(|b| b.serving_weight() as u64).sum();
    service
        .backends
        .iter()
        .zip(counts)
        .map(|(b, slots)| Share {
            slots,
            share: if table.is_empty() { 0.0 } else { slots as f64 / table.len() as f64 },
            ideal: if total_weight == 0 { 0.0 } else { b.serving_weight() as f64 / total_weight as f64 },
        })
        .collect()
}
