//! Properties of the destination tables (seed 000's "What to test", for both algorithms), checked
//! against straightforward reference implementations of the table spec (docs/table-spec.md). No root needed.

#[path = "common/rng.rs"]
mod rng;

use std::collections::HashSet;

use lb::config::Algorithm;
use lb::table::{self, maglev, ring, Member, Table};
use rng::Rng;
use xxhash_rust::xxh64::xxh64;

const M: u32 = 65537;
const ALGORITHMS: [Algorithm; 3] = [Algorithm::Ring, Algorithm::Maglev, Algorithm::Bounded];

fn ids(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("10.0.{}.{}", i / 250, i % 250 + 1)).collect()
}

fn members<'a>(ids: &'a [String], weights: &[u32]) -> Vec<Member<'a>> {
    ids.iter().zip(weights).map(|(id, &w)| Member { identity: id, weight: w }).collect()
}

fn build(alg: Algorithm, slots: u32, m: &[Member]) -> Table {
    table::build(alg, slots, 150, m)
}

/// The table as owner identities, which is what must agree across orders and machines.
fn by_identity<'a>(t: &Table, m: &[Member<'a>]) -> Vec<Option<&'a str>> {
    (0..t.len()).map(|i| t.owner(i).map(|o| m[o].identity)).collect()
}

fn count_of(t: &[Option<&str>], id: &str) -> usize {
    t.iter().filter(|o| **o == Some(id)).count()
}

// ---------------------------------------------------------------------------------------------
// Reference implementations: the spec, written as plainly as possible.

fn reference_ring(m: &[Member], vnodes: u32, slots: u32) -> Vec<Option<usize>> {
    let mut tokens: Vec<(u64, &[u8], u32, usize)> = Vec::new();
    for (i, mem) in m.iter().enumerate() {
        for r in 0..mem.weight * vnodes {
            let mut key = mem.identity.as_bytes().to_vec();
            key.extend_from_slice(&r.to_le_bytes());
            tokens.push((xxh64(&key, 0), mem.identity.as_bytes(), r, i));
        }
    }
    tokens.sort();
    (0..slots)
        .map(|s| {
            if tokens.is_empty() {
                return None;
            }
            let p = xxh64(&s.to_le_bytes(), 0);
            let k = tokens.partition_point(|t| t.0 < p);
            Some(tokens[if k == tokens.len() { 0 } else { k }].3)
        })
        .collect()
}

fn reference_maglev(m: &[Member], slots: u32) -> Vec<Option<usize>> {
    let big_m = slots as u64;
    let mut live: Vec<usize> = (0..m.len()).filter(|&i| m[i].weight > 0).collect();
    live.sort_by_key(|&i| m[i].identity.as_bytes());
    let mut table = vec![None; slots as usize];
    if live.is_empty() {
        return table;
    }
    let max_w = live.iter().map(|&i| m[i].weight as u64).max().unwrap();
    let mut j = vec![0u64; live.len()];
    let mut credit = vec![max_w / 2; live.len()];
    let mut filled = 0;
    loop {
        for (k, &i) in live.iter().enumerate() {
            credit[k] += m[i].weight as u64;
            if credit[k] < max_w {
                continue;
            }
            credit[k] -= max_w;
            let id = m[i].identity.as_bytes();
            let offset = xxh64(id, 0) % big_m;
            let skip = xxh64(id, 1) % (big_m - 1) + 1;
            loop {
                let c = ((offset + j[k] * skip) % big_m) as usize;
                j[k] += 1;
                if table[c].is_none() {
                    table[c] = Some(i);
                    filled += 1;
                    break;
                }
            }
            if filled == slots as usize {
                return table;
            }
        }
    }
}

fn owners(t: &Table) -> Vec<Option<usize>> {
    (0..t.len()).map(|i| t.owner(i)).collect()
}

#[test]
fn ring_matches_the_reference_spec_on_random_pools() {
    let mut rng = Rng(1);
    for case in 0..40 {
        let n = 1 + rng.below(12) as usize;
        let all = ids(n);
        let weights: Vec<u32> = (0..n).map(|_| rng.below(4) as u32).collect();
        let vnodes = 1 + rng.below(40) as u32;
        let slots = [1, 2, 7, 97, 1000, 4099][rng.below(6) as usize];
        let m = members(&all, &weights);
        let got = owners(&ring::build(&m, vnodes, slots));
        assert_eq!(got, reference_ring(&m, vnodes, slots), "case {case}: weights {weights:?} vnodes {vnodes} slots {slots}");
    }
}

#[test]
fn large_rings_built_on_two_threads_match_the_reference_spec() {
    // Over 65,536 tokens the builder splits the hashing over two threads; the split falls
    // inside the identity order, so ties and ranks must still come out as the spec says.
    let mut rng = Rng(9);
    for (n, vnodes, slots) in [(500usize, 150u32, 65537u32), (3, 30000, 4099), (1000, 70, 1000)] {
        let all = ids(n);
        let weights: Vec<u32> = (0..n).map(|_| 1 + rng.below(5) as u32).collect();
        let m = members(&all, &weights);
        let got = owners(&ring::build(&m, vnodes, slots));
        assert_eq!(got, reference_ring(&m, vnodes, slots), "n {n} vnodes {vnodes} slots {slots}");
    }
}

#[test]
fn a_ring_cache_builds_exactly_what_a_fresh_build_does_through_any_sequence_of_changes() {
    let mut rng = Rng(21);
    let all = ids(40);
    for (vnodes, slots) in [(50u32, 4099u32), (150, 65537), (7, 97)] {
        let mut cache = ring::RingCache::default();
        let mut weights: Vec<u32> = (0..all.len()).map(|i| u32::from(i < 10)).collect();
        for step in 0..60 {
            // One to three backends change: added, removed, reweighted; now and then a big change.
            let changes = if step % 17 == 16 { 30 } else { 1 + rng.below(3) as usize };
            for _ in 0..changes {
                let i = rng.below(all.len() as u64) as usize;
                weights[i] = rng.below(5) as u32;
            }
            // Members in a changing order: the cache must not care.
            let mut order: Vec<usize> = (0..all.len()).collect();
            order.rotate_left(step % all.len());
            let ordered_ids: Vec<String> = order.iter().map(|&i| all[i].clone()).collect();
            let ordered_w: Vec<u32> = order.iter().map(|&i| weights[i]).collect();
            let m = members(&ordered_ids, &ordered_w);
            let cached = owners(&cache.build(&m, vnodes, slots));
            assert_eq!(cached, owners(&ring::build(&m, vnodes, slots)), "vnodes {vnodes} slots {slots} step {step}");
        }
        // The vnodes setting changing starts over.
        let m = members(&all, &weights);
        assert_eq!(owners(&cache.build(&m, vnodes + 1, slots)), owners(&ring::build(&m, vnodes + 1, slots)));
    }
}

#[test]
fn maglev_matches_the_reference_spec_on_random_pools() {
    let mut rng = Rng(2);
    for case in 0..40 {
        let n = 1 + rng.below(12) as usize;
        let all = ids(n);
        let weights: Vec<u32> = (0..n).map(|_| rng.below(5) as u32).collect();
        let slots = [2, 3, 13, 101, 1009, 4099][rng.below(6) as usize];
        let m = members(&all, &weights);
        let got = owners(&maglev::build(&m, slots));
        assert_eq!(got, reference_maglev(&m, slots), "case {case}: weights {weights:?} slots {slots}");
    }
}

// ---------------------------------------------------------------------------------------------
// Seed 000, "What to test".

#[test]
fn determinism_same_pool_same_table() {
    let all = ids(20);
    let m = members(&all, &[1; 20]);
    for alg in ALGORITHMS {
        assert_eq!(build(alg, M, &m), build(alg, M, &m), "{alg:?}");
    }
}

#[test]
fn reordering_backends_does_not_change_the_table() {
    let all = ids(30);
    let weights: Vec<u32> = (0..30).map(|i| 1 + i % 4).collect();
    let m = members(&all, &weights);
    let mut shuffled = m.clone();
    let mut rng = Rng(3);
    for i in (1..shuffled.len()).rev() {
        shuffled.swap(i, rng.below(i as u64 + 1) as usize);
    }
    shuffled.reverse();
    for alg in ALGORITHMS {
        let a = build(alg, M, &m);
        let b = build(alg, M, &shuffled);
        assert_eq!(by_identity(&a, &m), by_identity(&b, &shuffled), "{alg:?}");
    }
}

#[test]
fn single_backend_owns_every_slot() {
    let all = ids(1);
    let m = members(&all, &[3]);
    for alg in ALGORITHMS {
        let t = build(alg, M, &m);
        assert!((0..t.len()).all(|i| t.owner(i) == Some(0)), "{alg:?}");
    }
}

#[test]
fn zero_weight_owns_nothing_and_changes_nothing() {
    let all = ids(5);
    let with_zero = members(&all, &[1, 1, 0, 1, 1]);
    let without: Vec<Member> = with_zero.iter().copied().filter(|m| m.weight > 0).collect();
    for alg in ALGORITHMS {
        let t = build(alg, M, &with_zero);
        assert_eq!(t.counts(5)[2], 0, "{alg:?}");
        assert_eq!(by_identity(&t, &with_zero), by_identity(&build(alg, M, &without), &without), "{alg:?}");
    }
}

#[test]
fn all_zero_weights_give_an_empty_table() {
    let all = ids(3);
    let m = members(&all, &[0, 0, 0]);
    for alg in ALGORITHMS {
        let t = build(alg, M, &m);
        assert_eq!(t.len(), M as usize);
        assert!((0..t.len()).all(|i| t.owner(i).is_none()), "{alg:?}");
    }
    assert!((0..97).all(|i| build(Algorithm::Ring, 97, &[]).owner(i).is_none()));
}

#[test]
fn proportional_weights_two_to_one() {
    let all = ids(2);
    let m = members(&all, &[2, 1]);
    for alg in ALGORITHMS {
        let c = build(alg, M, &m).counts(2);
        let ratio = c[0] as f64 / c[1] as f64;
        assert!((1.85..=2.15).contains(&ratio), "{alg:?}: {c:?} ratio {ratio}");
    }
}

#[test]
fn ring_weights_four_two_three_one_are_roughly_proportional() {
    let all = ids(4);
    let m = members(&all, &[4, 2, 3, 1]);
    let c = build(Algorithm::Ring, M, &m).counts(4);
    for (got, want) in c.iter().zip([0.4, 0.2, 0.3, 0.1]) {
        let share = *got as f64 / M as f64;
        assert!((share - want).abs() < 0.03, "{c:?}");
    }
}

#[test]
fn ring_removal_moves_only_the_removed_backends_slots() {
    for n in [2, 3, 4, 10, 50] {
        let all = ids(n);
        let before_m = members(&all, &vec![1; n]);
        let before = build(Algorithm::Ring, M, &before_m);
        for gone in [0, n / 2, n - 1] {
            let after_m: Vec<Member> = before_m.iter().copied().enumerate().filter(|(i, _)| *i != gone).map(|(_, m)| m).collect();
            let after = build(Algorithm::Ring, M, &after_m);
            let (a, b) = (by_identity(&before, &before_m), by_identity(&after, &after_m));
            for slot in 0..M as usize {
                if a[slot] != Some(all[gone].as_str()) {
                    assert_eq!(a[slot], b[slot], "n={n} removing {gone}: slot {slot} moved");
                }
            }
            assert_eq!(count_of(&b, &all[gone]), 0);
        }
    }
}

#[test]
fn ring_addition_only_moves_slots_to_the_new_backend() {
    for n in [1, 2, 3, 9, 40] {
        let all = ids(n + 1);
        let before_m = members(&all[..n], &vec![1; n]);
        let after_m = members(&all, &vec![1; n + 1]);
        let a = by_identity(&build(Algorithm::Ring, M, &before_m), &before_m);
        let b = by_identity(&build(Algorithm::Ring, M, &after_m), &after_m);
        let mut moved = 0;
        for slot in 0..M as usize {
            if a[slot] != b[slot] {
                assert_eq!(b[slot], Some(all[n].as_str()), "n={n}: slot {slot} moved sideways");
                moved += 1;
            }
        }
        let expected = M as f64 / (n + 1) as f64;
        assert!((moved as f64 - expected).abs() < expected * 0.35, "n={n}: {moved} moved, about {expected} expected");
    }
}

/// Maglev does not promise exact locality; the seed quotes a small amount of collateral movement.
/// Bound it: after removing one of N backends, at most 2% of the other backends' slots move.
#[test]
fn maglev_removal_mostly_keeps_other_backends_slots() {
    for n in [3, 10, 100] {
        let all = ids(n);
        let before_m = members(&all, &vec![1; n]);
        let before = by_identity(&build(Algorithm::Maglev, M, &before_m), &before_m);
        let after_m: Vec<Member> = before_m[1..].to_vec();
        let after = by_identity(&build(Algorithm::Maglev, M, &after_m), &after_m);
        let kept_elsewhere = (0..M as usize).filter(|&s| before[s] != Some(all[0].as_str())).count();
        let moved_elsewhere =
            (0..M as usize).filter(|&s| before[s] != Some(all[0].as_str()) && before[s] != after[s]).count();
        let frac = moved_elsewhere as f64 / kept_elsewhere as f64;
        assert!(frac < 0.02, "n={n}: {moved_elsewhere} of {kept_elsewhere} unrelated slots moved ({frac})");
    }
}

/// Adding one: the new backend takes its share, and old backends exchange under 2% of the table.
#[test]
fn maglev_addition_mostly_moves_slots_to_the_new_backend() {
    for n in [3, 10, 100] {
        let all = ids(n + 1);
        let before_m = members(&all[..n], &vec![1; n]);
        let after_m = members(&all, &vec![1; n + 1]);
        let a = by_identity(&build(Algorithm::Maglev, M, &before_m), &before_m);
        let b = by_identity(&build(Algorithm::Maglev, M, &after_m), &after_m);
        let moved: Vec<usize> = (0..M as usize).filter(|&s| a[s] != b[s]).collect();
        let to_new = moved.iter().filter(|&&s| b[s] == Some(all[n].as_str())).count();
        let sideways = moved.len() - to_new;
        let ideal = M as f64 / (n + 1) as f64;
        assert!((to_new as f64 - ideal).abs() <= 1.0, "n={n}: the new backend took {to_new} slots, ideal {ideal}");
        assert!((sideways as f64) < 0.02 * M as f64, "n={n}: {sideways} slots moved between old backends");
    }
}

#[test]
fn token_positions_are_deterministic_and_distinct() {
    assert_eq!(ring::token_position("10.0.0.1", 7), ring::token_position("10.0.0.1", 7));
    // The spec's encoding, spelled out: identity bytes then r as 4 little-endian bytes.
    assert_eq!(ring::token_position("b1", 1), xxh64(b"b1\x01\x00\x00\x00", 0));
    assert_ne!(ring::token_position("10.0.0.1", 0), ring::token_position("10.0.0.2", 0));
    assert_ne!(ring::token_position("10.0.0.1", 0), ring::token_position("10.0.0.1", 1));
    assert_eq!(ring::slot_position(5), xxh64(&5u32.to_le_bytes(), 0));
}

#[test]
fn token_distribution_has_no_collisions_or_clusters() {
    let all = ids(1000);
    let mut positions: Vec<u64> = Vec::new();
    for id in &all {
        for r in 0..150 {
            positions.push(ring::token_position(id, r));
        }
    }
    let distinct: HashSet<u64> = positions.iter().copied().collect();
    assert_eq!(distinct.len(), positions.len(), "token positions collide");

    // Uniformity: chi-square over 256 equal arcs. df = 255; 400 is far beyond p = 1e-6.
    let mut arcs = [0u64; 256];
    for p in &positions {
        arcs[(p >> 56) as usize] += 1;
    }
    let expect = positions.len() as f64 / 256.0;
    let chi2: f64 = arcs.iter().map(|&c| (c as f64 - expect).powi(2) / expect).sum();
    assert!(chi2 < 400.0, "chi-square {chi2}");

    // Clustering: for n uniform points the largest gap is about ln(n) mean gaps (~12 here).
    positions.sort_unstable();
    let mean = u64::MAX as f64 / positions.len() as f64;
    let max_gap = positions.windows(2).map(|w| w[1] - w[0]).max().unwrap() as f64;
    assert!(max_gap / mean < 25.0, "largest gap is {} mean gaps", max_gap / mean);
}

/// The seed's warning: similar addresses must not produce correlated rings (96/4 splits).
#[test]
fn similar_addresses_split_evenly() {
    for x in 1..60u32 {
        let pair = [format!("10.0.0.{x}"), format!("10.0.0.{}", x + 1)];
        let m = members(&pair, &[1, 1]);
        let c = build(Algorithm::Ring, 1000, &m).counts(2);
        let share = c[0] as f64 / 1000.0;
        assert!((0.38..=0.62).contains(&share), "{pair:?}: {c:?}");
    }
}

#[test]
fn maglev_equal_weights_are_within_one_slot() {
    for (n, slots) in [(1, 13), (5, 13), (2, M), (3, M), (7, M), (10, M), (100, M), (1000, M), (13, 13)] {
        let all = ids(n);
        let c = build(Algorithm::Maglev, slots, &members(&all, &vec![1; n])).counts(n);
        let (lo, hi) = (slots as u64 / n as u64, (slots as u64).div_ceil(n as u64));
        assert!(c.iter().all(|&k| k == lo || k == hi), "n={n} slots={slots}: {:?}", (c.iter().min(), c.iter().max()));
        assert_eq!(c.iter().sum::<u64>(), slots as u64);
    }
}

#[test]
fn maglev_weights_four_two_three_one_within_one_slot() {
    let all = ids(4);
    let c = build(Algorithm::Maglev, M, &members(&all, &[4, 2, 3, 1])).counts(4);
    for (got, share) in c.iter().zip([0.4, 0.2, 0.3, 0.1]) {
        let ideal = M as f64 * share;
        assert!((*got as f64 - ideal).abs() <= 1.0, "{c:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Golden tables: an accidental change of encoding (hash seed, byte order, tie-break, fill order)
// changes these checksums. If a change is intended, it breaks every deployed fleet's agreement,
// and the spec (docs/table-spec.md) must change with it.

fn checksum(t: &Table, m: &[Member]) -> u64 {
    let mut bytes = Vec::new();
    for o in by_identity(t, m) {
        bytes.extend_from_slice(o.unwrap_or("-").as_bytes());
        bytes.push(b'\n');
    }
    xxh64(&bytes, 0)
}

fn golden(alg: Algorithm, slots: u32, pool: &[(&str, u32)]) -> (u64, Vec<String>) {
    let m: Vec<Member> = pool.iter().map(|&(identity, weight)| Member { identity, weight }).collect();
    let t = build(alg, slots, &m);
    let first: Vec<String> = by_identity(&t, &m)[..6].iter().map(|o| o.unwrap_or("-").to_string()).collect();
    (checksum(&t, &m), first)
}

// ---------------------------------------------------------------------------------------------
// The bounded-load builder (docs/table-spec.md, bounded).

/// The spec, written plainly: at each step the member whose next event is earliest (compared by
/// cross-multiplication; ties by identity hash, then identity bytes), scanned linearly.
fn reference_bounded(m: &[Member], slots: u32, bound: u32) -> Vec<Option<usize>> {
    use lb::table::bounded::{cap, event_slot, phase};
    let live: Vec<usize> = (0..m.len()).filter(|&i| m[i].weight > 0).collect();
    let mut out = vec![None; slots as usize];
    if live.is_empty() {
        return out;
    }
    let total: u64 = live.iter().map(|&i| m[i].weight as u64).sum();
    let h: Vec<u64> = m.iter().map(|b| xxh64(b.identity.as_bytes(), 0)).collect();
    let mut j = vec![0u64; m.len()];
    let mut held = vec![0u64; m.len()];
    let mut filled = 0;
    while filled < slots {
        let mut best: Option<usize> = None;
        for &i in &live {
            if held[i] >= cap(bound, slots as u64, m[i].weight as u64, total) {
                continue;
            }
            let better = match best {
                None => true,
                Some(b) => {
                    let ti = ((j[i] as u128) << 53) + phase(h[i]) as u128;
                    let tb = ((j[b] as u128) << 53) + phase(h[b]) as u128;
                    let (x, y) = (ti * m[b].weight as u128, tb * m[i].weight as u128);
                    x < y || (x == y && (h[i], m[i].identity.as_bytes()) < (h[b], m[b].identity.as_bytes()))
                }
            };
            if better {
                best = Some(i);
            }
        }
        let b = best.expect("a member below its cap while slots are empty");
        let slot = event_slot(h[b], j[b], slots as u64) as usize;
        if out[slot].is_none() {
            out[slot] = Some(b);
            held[b] += 1;
            filled += 1;
        }
        j[b] += 1;
    }
    out
}

#[test]
fn bounded_matches_the_reference_spec_on_random_pools() {
    let mut r = Rng(0xb0b0_1234);
    for round in 0..40 {
        let n = 1 + r.below(24) as usize;
        let ids = ids(n);
        let weights: Vec<u32> = (0..n).map(|_| r.below(5) as u32).collect();
        let m = members(&ids, &weights);
        let slots = [1u32, 7, 97, 256, 1009, 2000][r.below(6) as usize];
        let bound = [1000u32, 1001, 1020, 1050, 1100, 1500, 2000][r.below(7) as usize];
        let t = lb::table::bounded::build(&m, slots, bound);
        assert_eq!(owners(&t), reference_bounded(&m, slots, bound), "round {round}: n={n} slots={slots} bound={bound}");
    }
}

#[test]
fn bounded_caps_hold_for_every_backend() {
    use lb::table::bounded::cap;
    for (n, weights) in [(10usize, vec![1u32; 10]), (100, vec![1; 100]), (40, [4u32, 2, 3, 1].repeat(10))] {
        let ids = ids(n);
        let m = members(&ids, &weights);
        let total: u64 = weights.iter().map(|&w| w as u64).sum();
        for bound in [1000, 1020, 1050, 1100] {
            let t = lb::table::bounded::build(&m, M, bound);
            let counts = t.counts(n);
            assert_eq!(counts.iter().sum::<u64>(), M as u64, "every slot is taken");
            for (i, c) in counts.iter().enumerate() {
                let c_max = cap(bound, M as u64, weights[i] as u64, total);
                assert!(*c <= c_max, "n={n} bound={bound}: backend {i} holds {c} > cap {c_max}");
                // balance: at most load_bound times the fair share, up to one slot
                let fair = M as f64 * weights[i] as f64 / total as f64;
                assert!(*c as f64 <= fair * bound as f64 / 1000.0 + 1.0);
            }
        }
    }
}

/// Slots that change owner when `removed` leaves, in units of its own slots.
fn disruption(alg_table: impl Fn(&[Member]) -> Table, ids: &[String], removed: usize) -> f64 {
    let before_m = members(ids, &vec![1; ids.len()]);
    let rest: Vec<String> = ids.iter().enumerate().filter(|(i, _)| *i != removed).map(|(_, s)| s.clone()).collect();
    let after_m = members(&rest, &vec![1; rest.len()]);
    let a = by_identity(&alg_table(&before_m), &before_m);
    let b = by_identity(&alg_table(&after_m), &after_m);
    let own = count_of(&a, &ids[removed]);
    let moved = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    moved as f64 / own as f64
}

#[test]
fn bounded_removal_and_addition_move_little_more_than_they_must() {
    // At N = 100 the measured figures are 1.32x (bound 1.00), 1.10x (1.02) and 1.00x (1.05); a
    // broken builder (one that reshuffles) moves tens of times more. Assert loose bounds.
    let ids = ids(100);
    for (bound, limit) in [(1000u32, 3.0f64), (1020, 3.0), (1050, 2.0)] {
        let mut worst: f64 = 0.0;
        for removed in [0usize, 17, 42, 99] {
            worst = worst.max(disruption(|m| lb::table::bounded::build(m, M, bound), &ids, removed));
        }
        assert!(worst <= limit, "bound {bound}: removal moved {worst:.2}x the removed backend's slots");
    }
    // Addition: a new backend takes slots; the others mostly keep theirs.
    let before = members(&ids[..99], &[1; 99]);
    let after = members(&ids, &[1; 100]);
    let a = by_identity(&lb::table::bounded::build(&before, M, 1020), &before);
    let b = by_identity(&lb::table::bounded::build(&after, M, 1020), &after);
    let gained = count_of(&b, &ids[99]);
    let moved = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    assert!((moved as f64) <= 3.0 * gained as f64, "addition moved {moved} slots for {gained} gained");
}

#[test]
fn golden_tables() {
    let web = [("b1", 1), ("b2", 1), ("b3", 2)];
    let dns = [("10.99.0.11", 1), ("10.99.0.12", 1), ("10.99.0.13", 1)];
    let weighted = [("10.0.0.2", 4), ("10.0.0.3", 2), ("10.0.0.4", 3), ("10.0.0.5", 1)];
    let v = |s: [&str; 6]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(golden(Algorithm::Ring, M, &web), (14454890949193320416, v(["b1", "b3", "b1", "b3", "b3", "b3"])));
    assert_eq!(
        golden(Algorithm::Maglev, M, &dns),
        (7049104653566331225, v(["10.99.0.13", "10.99.0.13", "10.99.0.12", "10.99.0.11", "10.99.0.13", "10.99.0.11"]))
    );
    assert_eq!(golden(Algorithm::Ring, 97, &weighted).0, 5527919377548606211);
    assert_eq!(golden(Algorithm::Maglev, 97, &weighted).0, 11490595461178162225);
    assert_eq!(golden(Algorithm::Bounded, M, &web).0, 3279024262242011042);
    assert_eq!(golden(Algorithm::Bounded, 97, &weighted).0, 11344224439093834345);
}
