//! What a pool change would disrupt, computed before anyone applies it.
//!
//! For each service (matched by name) the old and new tables are built and compared slot by
//! slot, by backend identity. The "unavoidable minimum" is the share of traffic that has to move
//! whatever the algorithm, because backends' ideal shares changed: the sum, over backends, of
//! the share each one loses. Removing one of N equal backends has a minimum of 1/N; a good table
//! moves about that much, and only the removed backend's slots.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::{Pool, Service};
use crate::table::build_service;

/// When table sizes differ, slot i no longer means the same flows, so the comparison is made
/// over this many flow hashes spread evenly over the 32-bit hash space instead.
pub const SAMPLED_HASHES: u32 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Added,
    Removed,
    Changed,
    Unchanged,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Changed => "changed",
            Change::Unchanged => "unchanged",
        }
    }
}

/// Slots (or sampled flows) that went from one owner to another. `None` is an empty slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub from: Option<String>,
    pub to: Option<String>,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceDiff {
    pub name: String,
    pub change: Change,
    pub old_slots: Option<u32>,
    pub new_slots: Option<u32>,
    /// How many positions were compared: the table size, or [`SAMPLED_HASHES`] when sizes differ.
    pub compared: u64,
    /// Positions whose owner changed.
    pub moved: u64,
    /// True when the comparison is over sampled flow hashes because the table size changed.
    pub sampled: bool,
    /// The share of traffic that must move because ideal shares changed (0..=1).
    pub minimum: f64,
    /// from -> to counts, largest first.
    pub moves: Vec<Move>,
    /// Other changes worth knowing: algorithm, endpoint, hash mode, backend addresses.
    pub notes: Vec<String>,
}

impl ServiceDiff {
    pub fn moved_fraction(&self) -> f64 {
        if self.compared == 0 {
            0.0
        } else {
            self.moved as f64 / self.compared as f64
        }
    }
}

/// Compares every service of `old` and `new`: new services in file order, then removed ones.
pub fn diff(old: &Pool, new: &Pool) -> Vec<ServiceDiff> {
    let mut out = Vec::new();
    for n in &new.services {
        out.push(match old.service(&n.name) {
            Some(o) => diff_service(o, n),
            None => one_sided(n, Change::Added),
        });
    }
    for o in &old.services {
        if new.service(&o.name).is_none() {
            out.push(one_sided(o, Change::Removed));
        }
    }
    out
}

fn one_sided(s: &Service, change: Change) -> ServiceDiff {
    let (old_slots, new_slots) = match change {
        Change::Added => (None, Some(s.slots)),
        _ => (Some(s.slots), None),
    };
    ServiceDiff {
        name: s.name.clone(),
        change,
        old_slots,
        new_slots,
        compared: 0,
        moved: 0,
        sampled: false,
        minimum: 0.0,
        moves: Vec::new(),
        notes: vec![format!("{} {}", s.endpoint(), change.as_str())],
    }
}

fn identities(s: &Service) -> Vec<String> {
    s.backends.iter().map(|b| b.identity()).collect()
}

pub fn diff_service(old: &Service, new: &Service) -> ServiceDiff {
    let (old_table, new_table) = (build_service(old), build_service(new));
    let (old_ids, new_ids) = (identities(old), identities(new));

    // Keyed by owner index on each side; identities decide whether a position moved.
    let mut matrix: BTreeMap<(Option<usize>, Option<usize>), u64> = BTreeMap::new();
    let mut moved = 0u64;
    let sampled = old.slots != new.slots;
    let compared = if sampled { SAMPLED_HASHES as u64 } else { old.slots as u64 };
    let mut record = |a: Option<usize>, b: Option<usize>| {
        if a.map(|i| &old_ids[i]) != b.map(|i| &new_ids[i]) {
            moved += 1;
            *matrix.entry((a, b)).or_default() += 1;
        }
    };
    if sampled {
        let step = (1u64 << 32) / SAMPLED_HASHES as u64;
        for k in 0..SAMPLED_HASHES as u64 {
            let h = k * step + step / 2;
            record(old_table.owner((h % old.slots as u64) as usize), new_table.owner((h % new.slots as u64) as usize));
        }
    } else {
        for slot in 0..old.slots as usize {
            record(old_table.owner(slot), new_table.owner(slot));
        }
    }

    let mut moves: Vec<Move> = matrix
        .into_iter()
        .map(|((a, b), count)| Move { from: a.map(|i| old_ids[i].clone()), to: b.map(|i| new_ids[i].clone()), count })
        .collect();
    moves.sort_by(|x, y| y.count.cmp(&x.count).then_with(|| (&x.from, &x.to).cmp(&(&y.from, &y.to))));

    let notes = notes(old, new);
    let change = if old == new { Change::Unchanged } else { Change::Changed };
    ServiceDiff {
        name: new.name.clone(),
        change,
        old_slots: Some(old.slots),
        new_slots: Some(new.slots),
        compared,
        moved,
        sampled,
        minimum: minimum_movement(old, new),
        moves,
        notes,
    }
}

/// The share of traffic that must move: what every backend loses of its ideal share, summed.
pub fn minimum_movement(old: &Service, new: &Service) -> f64 {
    let ideal = |s: &Service| -> BTreeMap<String, f64> {
        let total: u64 = s.backends.iter().map(|b| b.serving_weight() as u64).sum();
        s.backends
            .iter()
            .map(|b| (b.identity(), if total == 0 { 0.0 } else { b.serving_weight() as f64 / total as f64 }))
            .collect()
    };
    let (before, after) = (ideal(old), ideal(new));
    if old.total_weight() == 0 {
        // Nothing was being served, so nothing established can be disrupted.
        return 0.0;
    }
    before
        .iter()
        .map(|(id, &share)| (share - after.get(id).copied().unwrap_or(0.0)).max(0.0))
        .sum()
}

fn notes(old: &Service, new: &Service) -> Vec<String> {
    let mut notes = Vec::new();
    if old.endpoint() != new.endpoint() {
        notes.push(format!("endpoint {} -> {}", old.endpoint(), new.endpoint()));
    }
    if old.algorithm != new.algorithm {
        notes.push(format!("algorithm {} -> {}", old.algorithm.as_str(), new.algorithm.as_str()));
    }
    if old.slots != new.slots {
        notes.push(format!(
            "slots {} -> {}: every flow's slot changes meaning, so moves are estimated over {SAMPLED_HASHES} flow hashes",
            old.slots, new.slots
        ));
    }
    if old.algorithm == new.algorithm && old.vnodes_per_weight != new.vnodes_per_weight {
        notes.push(format!("vnodes_per_weight {} -> {}", old.vnodes_per_weight, new.vnodes_per_weight));
    }
    if old.hash != new.hash {
        notes.push(format!(
            "hash {} -> {}: the data plane hashes different fields, so flows move whatever the table says",
            old.hash.as_str(),
            new.hash.as_str()
        ));
    }
    let old_by_id: BTreeMap<String, &crate::config::Backend> = old.backends.iter().map(|b| (b.identity(), b)).collect();
    let new_by_id: BTreeMap<String, &crate::config::Backend> = new.backends.iter().map(|b| (b.identity(), b)).collect();
    let all: BTreeSet<&String> = old_by_id.keys().chain(new_by_id.keys()).collect();
    for id in all {
        match (old_by_id.get(id), new_by_id.get(id)) {
            (Some(_), None) => notes.push(format!("backend {id} removed")),
            (None, Some(b)) => notes.push(format!("backend {id} added (weight {})", b.weight)),
            (Some(a), Some(b)) => {
                if a.weight != b.weight {
                    notes.push(format!("backend {id} weight {} -> {}", a.weight, b.weight));
                }
                if a.state != b.state {
                    notes.push(format!("backend {id} {} -> {}", a.state.as_str(), b.state.as_str()));
                }
                if a.address != b.address {
                    notes.push(format!("backend {id} address {} -> {}: its slots keep their owner but go to the new address", a.address, b.address));
                }
            }
            (None, None) => {}
        }
    }
    notes
}
