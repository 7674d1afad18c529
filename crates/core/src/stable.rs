//! Stable slots: which destination-table slots a tracked packet may send by the table alone,
//! without its flow-table lookup.
//!
//! A flow-table entry only matters for a flow whose slot changed owner after the flow began: for
//! every other flow the table says what the entry says. So the controller marks each slot it
//! gives a new owner (or places in a new range, or rehashes) *unstable*, in the slot's word
//! itself (lb.h, enum lb_slot_bits), and the program looks up the flows of unstable slots as
//! before. This module is the sweep that makes a slot stable again: once no entry that names
//! another backend than the slot's owner can belong to a flow hashing to it. It is pure: the
//! data plane reads the entries (flow.h: each entry's record says which slot its flow hashes to,
//! written whenever the entry's `seen` is), the balancer applies the verdict.
//!
//! The rule, for an unstable slot `s` owned by `o`, over every entry that can still be used
//! (its backend's generation unchanged, not expired), in the half-open table and the flow table:
//! `s` stays unstable while some entry names a backend other than `o` and
//! - its record names `s`; or
//! - its record is unknown (never written: carried over an upgrade; or overwritten by another
//!   flow's, which the record's tag shows); or
//! - it was last written before `s`'s range was placed (plus a margin): then its record may name
//!   where its flow hashed in the range before, which says nothing about `s`.
//!
//! Why that is enough: every entry the program makes names the slot's owner at the time, except
//! a flow's promotion from its half-open record (which the sweep reads first, so a promotion
//! during a sweep is seen in one table or the other) and adoption by a second-chance hop, which
//! only happens on a slot whose hop differs from its owner; such slots are never made stable
//! ([`pinned`]). docs/data-plane.md ("Stable slots") says the same for operators.

use std::collections::{BTreeMap, HashMap, HashSet};

/// Ticks of the data plane's clock (2^24 ns, flow.h) an entry must have been written after its
/// slot's range was placed for its record to count: covers a packet that read the old route just
/// before the placement and wrote its record just after, and the two clocks' coarseness.
pub const PLACED_MARGIN: u32 = 4;

/// A flow-table entry that can still be used, as the sweep needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The backend id it names.
    pub backend: u32,
    /// When it was last written, in the data plane's ticks.
    pub seen: u32,
    /// The table slot its record names, if the record is this entry's.
    pub slot: Option<u32>,
}

/// An unstable slot as the sweep judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub index: u32,
    /// Its owner now.
    pub owner: u32,
    /// When its range was placed (or its service's hash changed), in ticks; None: long enough
    /// ago that no entry written before it can still be used.
    pub placed: Option<u32>,
}

/// What the entries say, summed up so that each slot is judged in constant time.
#[derive(Debug, Default)]
pub struct Evidence {
    /// Per recorded slot (only slots being judged), the backends its entries name.
    recorded: HashMap<u32, HashSet<u32>>,
    /// The backends named by entries whose record is unknown.
    unknown: HashSet<u32>,
    /// Per backend, the oldest `seen` among its entries, as an age in ticks at `now`.
    oldest: HashMap<u32, u32>,
    now: u32,
}

impl Evidence {
    /// Starts summing entries up at data-plane time `now`, for the slots `judged`.
    pub fn new(now: u32) -> Evidence {
        Evidence { now, ..Default::default() }
    }

    /// Adds one usable entry; `judged` says whether a slot is one being judged (the others'
    /// records are not kept).
    pub fn add(&mut self, e: Entry, judged: impl Fn(u32) -> bool) {
        match e.slot {
            Some(s) if judged(s) => {
                self.recorded.entry(s).or_default().insert(e.backend);
            }
            Some(_) => {}
            None => {
                self.unknown.insert(e.backend);
            }
        }
        let age = age(e.seen, self.now);
        let old = self.oldest.entry(e.backend).or_insert(0);
        *old = (*old).max(age);
    }

    /// Whether slot `s` may be marked stable.
    pub fn clear(&self, s: &Slot) -> bool {
        let other = |b: &u32| *b != s.owner;
        if self.recorded.get(&s.index).is_some_and(|bs| bs.iter().any(other)) {
            return false;
        }
        if self.unknown.iter().any(other) {
            return false;
        }
        match s.placed {
            None => true,
            Some(placed) => {
                // Held by any backend's oldest entry written before placed + margin.
                let before = |age: u32| (self.now.wrapping_sub(age).wrapping_sub(placed) as i32) < PLACED_MARGIN as i32;
                !self.oldest.iter().any(|(b, &age)| other(b) && before(age))
            }
        }
    }
}

/// The slots among `unstable` (index -> placed) that may be marked stable, given `entries` (every
/// usable entry, the half-open table's first) and each slot's owner (`owner_of`; None: a slot
/// no service holds, which has nothing to clear).
pub fn sweep(unstable: &BTreeMap<u32, Option<u32>>, entries: impl IntoIterator<Item = Entry>, now: u32, owner_of: impl Fn(u32) -> Option<u32>) -> Vec<Slot> {
    let mut ev = Evidence::new(now);
    for e in entries {
        ev.add(e, |s| unstable.contains_key(&s));
    }
    unstable
        .iter()
        .filter_map(|(&index, &placed)| owner_of(index).map(|owner| Slot { index, owner, placed }))
        .filter(|s| ev.clear(s))
        .collect()
}

/// Whether a second-chance slot must stay unstable whatever its entries say: its first hop (its
/// owner in the previous pool) is another backend, so a packet of a flow this node never saw
/// may be adopted to that backend (conntrack.h, adopt_hop()), which makes an entry naming it.
pub fn pinned(owner: u32, hops: Option<&[u32; 2]>) -> bool {
    hops.is_some_and(|h| h[0] != 0 && h[0] != owner)
}

/// Ticks of the data plane's clock (flow.h: CLOCK_MONOTONIC >> 24) for a duration in ms,
/// rounded up, as the program converts its timeouts.
pub fn ticks(ms: u64) -> u32 {
    ((ms * 1_000_000).div_ceil(1 << 24)).min(u32::MAX as u64) as u32
}

/// flow.h's LB_CT_REFRESH_TICKS: an entry's time is rewritten at most this often (or a quarter of
/// its timeout, if that is shorter).
pub const REFRESH_TICKS: u32 = 64;
/// flow.h's LB_CT_RESET_TICKS: what an RST leaves of an entry's life at most.
pub const RESET_TICKS: u32 = 240;

/// How many ticks after its last write an entry ends (0: never), for a flow timeout of `timeout`
/// ticks, once reset or not, as the program's ct_life() reckons it: the timeout and a refresh
/// interval (the entry's time may lag its flow's last packet by almost that much), or what an
/// RST leaves.
pub fn life(timeout: u32, reset: bool) -> u32 {
    if reset {
        return if timeout == 0 || timeout > RESET_TICKS { RESET_TICKS } else { timeout };
    }
    let every = match timeout / 4 {
        0 => REFRESH_TICKS,
        e => e.min(REFRESH_TICKS),
    };
    if timeout == 0 {
        0
    } else {
        timeout.saturating_add(every)
    }
}

/// Whether an entry last written at `seen` is still usable at `now` for a life of `timeout`
/// ticks ([`life`]; 0: never ends), as the program's usable() judges it, with a margin of two
/// ticks in its favour (the two clocks are read at different moments). An entry written after
/// `now`, up to [`AHEAD`] ticks (the sweep reads its clock once, then walks the tables while
/// packets go on writing them), is alive: taken for one written 2^32 ticks ago, such an entry
/// was dropped from the evidence, and its slot marked stable while its flow lived on another
/// backend (the hostile review of the CI failures found it).
pub fn alive(seen: u32, now: u32, timeout: u32) -> bool {
    timeout == 0 || age(seen, now) < timeout.saturating_add(2)
}

/// How many ticks before `now` an entry was last written at `seen`, as the program's ct_age()
/// reckons it, with the sweep's allowance: 0 for a `seen` up to [`AHEAD`] ticks ahead (written
/// during the walk, or by a CPU whose clock is a tick on).
pub fn age(seen: u32, now: u32) -> u32 {
    if seen.wrapping_sub(now) <= AHEAD {
        0
    } else {
        now.wrapping_sub(seen)
    }
}

/// How far ahead of the sweep's clock an entry's time may be and still be taken for one written
/// during the walk (about 69 s, far longer than a walk takes); anything further ahead is an entry
/// written about 2^32 ticks ago.
pub const AHEAD: u32 = 1 << 12;

#[cfg(test)]
mod tests {
    use super::*;

    fn unstable(slots: &[(u32, Option<u32>)]) -> BTreeMap<u32, Option<u32>> {
        slots.iter().copied().collect()
    }

    fn owners(i: u32) -> Option<u32> {
        // Slot i is owned by backend i % 3 + 1.
        Some(i % 3 + 1)
    }

    #[test]
    fn a_slot_with_no_entries_elsewhere_is_cleared() {
        let u = unstable(&[(0, None), (1, None)]);
        // Entries that name each slot's owner do not hold it.
        let e = [Entry { backend: 1, seen: 90, slot: Some(0) }, Entry { backend: 2, seen: 90, slot: Some(1) }];
        let cleared: Vec<u32> = sweep(&u, e, 100, owners).iter().map(|s| s.index).collect();
        assert_eq!(cleared, vec![0, 1]);
    }

    #[test]
    fn an_entry_naming_another_backend_holds_its_recorded_slot_only() {
        let u = unstable(&[(0, None), (1, None)]);
        let e = [Entry { backend: 3, seen: 90, slot: Some(0) }];
        let cleared: Vec<u32> = sweep(&u, e, 100, owners).iter().map(|s| s.index).collect();
        assert_eq!(cleared, vec![1]);
    }

    #[test]
    fn an_unknown_record_holds_every_slot_of_another_owner() {
        let u = unstable(&[(0, None), (1, None), (2, None)]);
        let e = [Entry { backend: 2, seen: 90, slot: None }];
        let cleared: Vec<u32> = sweep(&u, e, 100, owners).iter().map(|s| s.index).collect();
        assert_eq!(cleared, vec![1], "only the slot backend 2 owns");
    }

    #[test]
    fn a_record_older_than_the_range_does_not_count() {
        // Slot 0 placed at tick 50: an entry written at 40 recorded the range before.
        let u = unstable(&[(0, Some(50))]);
        let old = [Entry { backend: 3, seen: 40, slot: Some(7) }];
        assert!(sweep(&u, old, 100, owners).is_empty());
        // Written well after the placement, its record is trusted: it hashes to slot 7.
        let young = [Entry { backend: 3, seen: 50 + PLACED_MARGIN, slot: Some(7) }];
        assert_eq!(sweep(&u, young, 100, owners).len(), 1);
        // Within the margin it is not.
        let edge = [Entry { backend: 3, seen: 50 + PLACED_MARGIN - 1, slot: Some(7) }];
        assert!(sweep(&u, edge, 100, owners).is_empty());
        // An old entry of the slot's own owner never holds it.
        let own = [Entry { backend: 1, seen: 10, slot: None }];
        assert_eq!(sweep(&u, own, 100, owners).len(), 1);
    }

    #[test]
    fn the_clock_may_wrap() {
        let now = 5u32;
        let placed = u32::MAX - 20;
        let u = unstable(&[(0, Some(placed))]);
        let old = [Entry { backend: 3, seen: u32::MAX - 30, slot: Some(0) }];
        assert!(sweep(&u, old, now, owners).is_empty());
        let young = [Entry { backend: 3, seen: 2, slot: Some(9) }];
        assert_eq!(sweep(&u, young, now, owners).len(), 1);
    }

    #[test]
    fn a_slot_no_service_holds_is_left_alone() {
        let u = unstable(&[(0, None)]);
        assert!(sweep(&u, [], 100, |_| None).is_empty());
    }

    #[test]
    fn second_chance_slots_whose_hop_differs_stay() {
        assert!(pinned(1, Some(&[2, 0])));
        assert!(!pinned(1, Some(&[1, 3])));
        assert!(!pinned(1, Some(&[0, 3])));
        assert!(!pinned(1, None));
    }

    #[test]
    fn ticks_and_life_follow_the_program() {
        assert_eq!(ticks(0), 0);
        assert_eq!(ticks(1), 1);
        assert_eq!(ticks(3_600_000), 214_577);
        assert!(alive(100, 150, 0));
        assert!(alive(100, 150, 49));
        assert!(!alive(100, 152, 50));
        assert!(alive(u32::MAX, 3, 10));
        // Written by a packet after the sweep read its clock: a tick or a second ahead of it.
        assert!(alive(101, 100, 50));
        assert!(alive(160, 100, 50));
        assert!(alive(2, u32::MAX, 10));
        // Not an entry 2^32 ticks minus a few hours old.
        assert!(!alive(100 + AHEAD + 1, 100, 50));
        // A life is the timeout and a refresh interval (a quarter of a short timeout), or what
        // an RST leaves: 30 s of UDP, 1 h of TCP, a 2 s timeout, an RST on each, none.
        let udp = ticks(30_000);
        assert_eq!(life(udp, false), udp + 64);
        assert_eq!(life(214_577, false), 214_577 + 64);
        assert_eq!(life(ticks(2000), false), 120 + 30);
        assert_eq!(life(udp, true), 240);
        assert_eq!(life(ticks(2000), true), 120);
        assert_eq!(life(0, true), 240);
        assert_eq!(life(0, false), 0);
        assert_eq!(life(3, false), 3 + 64);
    }
}
