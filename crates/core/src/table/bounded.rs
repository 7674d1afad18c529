//! The bounded-load table (`algorithm: bounded`): Maglev's balance with a fraction of its
//! disruption. A stable matching between slots and backends, with a cap on each backend's slots.
//!
//! Spec (docs/table-spec.md):
//! - members with weight > 0; for each, `h = xxh64(identity, 0)` and a phase
//!   `P = mix64(h ^ PHI) >> 11` (53 bits), where mix64 is SplitMix64's finalizer;
//! - cap `c = ceil(load_bound * M * w / W)`, in integers with load_bound in thousandths;
//! - member b makes events j = 0, 1, 2, ... at times `(j * 2^53 + P) / w`; event j hits slot
//!   `high64(mix64(h + (j + 1) * G) * M)`; events are taken in increasing time (compared exactly,
//!   by cross-multiplying in u128; ties by h, then identity bytes);
//! - an event of a member that holds fewer than c slots claims its slot if the slot is empty;
//!   otherwise nothing happens; stop when every slot is taken.
//!
//! The result is the unique stable matching in which every slot prefers earlier events and every
//! member its earlier events: it depends only on the set of (identity, weight) pairs. A member's
//! events hit slots uniformly, so a member that keeps its identity and weight keeps most of its
//! slots when others change, and no member holds more than its cap: that is the balance bound.
//!
//! Memory is O(M + N): a heap of each member's next event and the table. The work is one heap
//! step per event; the number of events is bounded by the coupon collector's M ln M in the worst
//! case (one member left to fill the last empty slots), which the benchmark measures.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use xxhash_rust::xxh64::xxh64;

use super::{Member, Table, EMPTY};

// The `load_bound` limits belong to the file format, so config owns them and the table takes
// them from there (config sits below table). Re-exported so `table::bounded::DEFAULT_LOAD_BOUND`
// and its neighbours keep their paths.
pub use crate::config::{DEFAULT_LOAD_BOUND, MAX_LOAD_BOUND, MIN_LOAD_BOUND};

const G: u64 = 0x9e37_79b9_7f4a_7c15;
const PHI: u64 = 0x243f_6a88_85a3_08d3;

/// SplitMix64's finalizer.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The slot that event `j` of the member with identity hash `h` hits, in a table of `m` slots.
pub fn event_slot(h: u64, j: u64, m: u64) -> u64 {
    let r = mix64(h.wrapping_add((j + 1).wrapping_mul(G)));
    ((r as u128 * m as u128) >> 64) as u64
}

/// The phase of a member's events (53 bits).
pub fn phase(h: u64) -> u64 {
    mix64(h ^ PHI) >> 11
}

/// A member's cap: ceil(load_bound/1000 * M * w / W).
pub fn cap(load_bound: u32, m: u64, w: u64, total: u64) -> u64 {
    let num = load_bound as u128 * m as u128 * w as u128;
    let den = 1000u128 * total as u128;
    num.div_ceil(den) as u64
}

/// A member's next event: its time is `num / w`.
#[derive(Clone, Copy)]
struct Event {
    num: u128,
    w: u64,
    /// The member's place in the order (h, identity bytes): breaks ties of time.
    rank: u32,
    j: u64,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed, so that the standard max-heap yields the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        let a = self.num * other.w as u128;
        let b = other.num * self.w as u128;
        b.cmp(&a).then(other.rank.cmp(&self.rank))
    }
}

struct Ranked<'a> {
    member: u32,
    h: u64,
    identity: &'a str,
    weight: u64,
}

/// Above this total weight the in-round event list (one entry per unit of weight) would take too
/// much memory; the heap walks the same events in the same order with one entry per backend.
const ROUND_LIST_MAX: u64 = 1 << 22;

/// Builds the table; `load_bound` in thousandths.
pub fn build(members: &[Member], slots: u32, load_bound: u32) -> Table {
    let m = slots as u64;
    let mut owners = vec![EMPTY; slots as usize];
    let mut ranked: Vec<Ranked> = members
        .iter()
        .enumerate()
        .filter(|(_, b)| b.weight > 0)
        .map(|(i, b)| Ranked { member: i as u32, h: xxh64(b.identity.as_bytes(), 0), identity: b.identity, weight: b.weight as u64 })
        .collect();
    if ranked.is_empty() || m == 0 {
        return Table::from_owners(owners);
    }
    ranked.sort_by(|a, b| a.h.cmp(&b.h).then_with(|| a.identity.as_bytes().cmp(b.identity.as_bytes())));
    let total: u64 = ranked.iter().map(|r| r.weight).sum();
    let caps: Vec<u64> = ranked.iter().map(|r| cap(load_bound.max(MIN_LOAD_BOUND), m, r.weight, total)).collect();
    let phases: Vec<u64> = ranked.iter().map(|r| phase(r.h)).collect();
    let mut fill = Fill { owners: &mut owners, held: vec![0; ranked.len()], filled: 0, m };
    if total <= ROUND_LIST_MAX {
        by_rounds(&ranked, &caps, &phases, &mut fill);
    } else {
        by_heap(&ranked, &caps, &phases, &mut fill);
    }
    Table::from_owners(owners)
}

/// The table being filled.
struct Fill<'a> {
    owners: &'a mut [u32],
    held: Vec<u64>,
    filled: u64,
    m: u64,
}

impl Fill<'_> {
    /// Event j of the backend at `rank`: claims its slot if empty. Returns true when the table is full.
    fn event(&mut self, ranked: &[Ranked], rank: usize, j: u64) -> bool {
        let slot = event_slot(ranked[rank].h, j, self.m) as usize;
        if self.owners[slot] == EMPTY {
            self.owners[slot] = ranked[rank].member;
            self.held[rank] += 1;
            self.filled += 1;
        }
        self.filled == self.m
    }
}

/// Events in time order by rounds: in each unit of time (2^53), a backend of weight w has exactly
/// w events, j = k*w + i (i < w) in round k, at the same in-round offsets (i * 2^53 + P) / w
/// every round. So the offsets of every backend are sorted once (exactly, with the spec's
/// tie-breaks), and each round walks that list; backends at their cap drop out of it.
fn by_rounds(ranked: &[Ranked], caps: &[u64], phases: &[u64], fill: &mut Fill) {
    let mut list: Vec<(u32, u32)> =
        ranked.iter().enumerate().flat_map(|(rank, r)| (0..r.weight as u32).map(move |i| (rank as u32, i))).collect();
    let num = |&(rank, i): &(u32, u32)| ((i as u128) << 53) + phases[rank as usize] as u128;
    list.sort_by(|a, b| {
        let (wa, wb) = (ranked[a.0 as usize].weight as u128, ranked[b.0 as usize].weight as u128);
        (num(a) * wb).cmp(&(num(b) * wa)).then(a.0.cmp(&b.0))
    });
    let mut round = 0u64;
    loop {
        let mut capped = false;
        for &(rank, i) in &list {
            let rank = rank as usize;
            if fill.held[rank] >= caps[rank] {
                continue;
            }
            if fill.event(ranked, rank, round * ranked[rank].weight + i as u64) {
                return;
            }
            capped |= fill.held[rank] >= caps[rank];
        }
        if capped {
            list.retain(|&(rank, _)| fill.held[rank as usize] < caps[rank as usize]);
        }
        round += 1;
    }
}

/// The same events in the same order through a heap of each backend's next event.
fn by_heap(ranked: &[Ranked], caps: &[u64], phases: &[u64], fill: &mut Fill) {
    let mut heap: BinaryHeap<Event> = ranked
        .iter()
        .enumerate()
        .map(|(rank, r)| Event { num: phases[rank] as u128, w: r.weight, rank: rank as u32, j: 0 })
        .collect();
    while let Some(e) = heap.pop() {
        let rank = e.rank as usize;
        if fill.event(ranked, rank, e.j) {
            return;
        }
        // A backend at its cap has nothing more to claim: its events leave the heap.
        if fill.held[rank] < caps[rank] {
            let j = e.j + 1;
            heap.push(Event { num: ((j as u128) << 53) + phases[rank] as u128, w: e.w, rank: e.rank, j });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_the_ceiling_of_the_bound_times_the_fair_share() {
        assert_eq!(cap(1000, 65537, 1, 1000), 66); // 65.537 -> 66
        assert_eq!(cap(1020, 65537, 1, 1000), 67); // 66.84774 -> 67
        assert_eq!(cap(1000, 100, 1, 4), 25); // exact: no rounding up
        assert_eq!(cap(2000, 7, 3, 3), 14);
    }

    #[test]
    fn mix64_is_splitmix64s_finalizer() {
        // SplitMix64's first output for seed 0 is mix64(0 + G).
        assert_eq!(mix64(G), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn rounds_and_heap_take_the_events_in_the_same_order() {
        let ids: Vec<String> = (0..23).map(|i| format!("m{i}")).collect();
        for weights in [vec![1u32; 23], (0..23).map(|i| 1 + (i * 7 % 5) as u32).collect::<Vec<_>>()] {
            let members: Vec<Member> = ids.iter().zip(&weights).map(|(id, &w)| Member { identity: id, weight: w }).collect();
            let mut ranked: Vec<Ranked> = members
                .iter()
                .enumerate()
                .map(|(i, b)| Ranked { member: i as u32, h: xxh64(b.identity.as_bytes(), 0), identity: b.identity, weight: b.weight as u64 })
                .collect();
            ranked.sort_by(|a, b| a.h.cmp(&b.h).then_with(|| a.identity.as_bytes().cmp(b.identity.as_bytes())));
            let total: u64 = ranked.iter().map(|r| r.weight).sum();
            let caps: Vec<u64> = ranked.iter().map(|r| cap(1010, 2003, r.weight, total)).collect();
            let phases: Vec<u64> = ranked.iter().map(|r| phase(r.h)).collect();
            let (mut a, mut b) = (vec![EMPTY; 2003], vec![EMPTY; 2003]);
            by_rounds(&ranked, &caps, &phases, &mut Fill { owners: &mut a, held: vec![0; 23], filled: 0, m: 2003 });
            by_heap(&ranked, &caps, &phases, &mut Fill { owners: &mut b, held: vec![0; 23], filled: 0, m: 2003 });
            assert_eq!(a, b);
        }
    }

    #[test]
    fn every_slot_is_filled_and_no_member_passes_its_cap() {
        let ids: Vec<String> = (0..37).map(|i| format!("b{i}")).collect();
        let members: Vec<Member> = ids.iter().enumerate().map(|(i, id)| Member { identity: id, weight: 1 + (i % 4) as u32 }).collect();
        for bound in [1000, 1020, 1100, 2000] {
            let t = build(&members, 4099, bound);
            let counts = t.counts(members.len());
            let total: u64 = members.iter().map(|m| m.weight as u64).sum();
            assert_eq!(counts.iter().sum::<u64>(), 4099);
            for (c, mb) in counts.iter().zip(&members) {
                assert!(*c <= cap(bound, 4099, mb.weight as u64, total), "bound {bound}");
            }
        }
    }
}
