//! The consistent hash ring compiled into a fixed table (seed 000).
//!
//! Spec (README.md, "Table spec"):
//! - a member with weight w contributes `w * vnodes_per_weight` tokens; token r sits at
//!   `xxh64(identity_utf8 ++ u32_le(r), seed 0)`;
//! - tokens are ordered by (position, identity bytes, r), so even colliding positions have one
//!   order on every machine;
//! - slot i sits at `xxh64(u32_le(i), seed 0)` and belongs to the first token whose position is
//!   >= the slot's, wrapping to the first token.
//!
//! How it is computed (the result is exactly the spec's): positions are uniform 64-bit hashes,
//! so one scatter pass on their top bits splits the tokens into small even buckets that are then
//! sorted on their own. Slot positions depend only on the table size and are sorted once per
//! size. With both in ring order, a single forward walk assigns every slot: O(tokens + slots)
//! after the per-bucket sorts, and every array is read front to back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use xxhash_rust::xxh64::xxh64;

use super::{Member, Table, EMPTY};

/// One virtual node. `rank` is the member's position in identity order, so comparing ranks
/// compares identities.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Token {
    pos: u64,
    rank: u32,
    r: u32,
}

/// Position of token `r` of a member: `xxh64(identity ++ u32_le(r), 0)`.
pub fn token_position(identity: &str, r: u32) -> u64 {
    let mut buf = Vec::with_capacity(identity.len() + 4);
    buf.extend_from_slice(identity.as_bytes());
    buf.extend_from_slice(&r.to_le_bytes());
    xxh64(&buf, 0)
}

/// Position of slot `i`: `xxh64(u32_le(i), 0)`.
pub fn slot_position(i: u32) -> u64 {
    xxh64(&i.to_le_bytes(), 0)
}

pub fn build(members: &[Member], vnodes_per_weight: u32, slots: u32) -> Table {
    // Members that own ring space, in identity order; rank -> member index.
    let mut by_identity: Vec<u32> = (0..members.len() as u32).filter(|&i| members[i as usize].weight > 0).collect();
    by_identity.sort_by(|&a, &b| members[a as usize].identity.as_bytes().cmp(members[b as usize].identity.as_bytes()));

    let total: usize = by_identity
        .iter()
        .map(|&i| members[i as usize].weight as usize * vnodes_per_weight as usize)
        .sum();
    if total == 0 {
        return Table::from_owners(vec![EMPTY; slots as usize]);
    }

    let mut tokens: Vec<Token> = Vec::with_capacity(total);
    let mut buf = Vec::new();
    for (rank, &mi) in by_identity.iter().enumerate() {
        let m = &members[mi as usize];
        buf.clear();
        buf.extend_from_slice(m.identity.as_bytes());
        let at = buf.len();
        buf.extend_from_slice(&[0; 4]);
        for r in 0..m.weight * vnodes_per_weight {
            buf[at..].copy_from_slice(&r.to_le_bytes());
            tokens.push(Token { pos: xxh64(&buf, 0), rank: rank as u32, r });
        }
    }
    let sorted = sort_tokens(&tokens);
    drop(tokens);
    assign(&sorted, slots, &by_identity)
}

fn assign(sorted: &[Token], slots: u32, by_identity: &[u32]) -> Table {
    // Both sides are in ring order now, so one forward walk pairs every slot with the first
    // token at or after it.
    let mut owners = vec![EMPTY; slots as usize];
    let mut k = 0usize;
    for &(p, slot) in slots_in_ring_order(slots).iter() {
        while k < sorted.len() && sorted[k].pos < p {
            k += 1;
        }
        let t = if k < sorted.len() { sorted[k] } else { sorted[0] };
        owners[slot as usize] = by_identity[t.rank as usize];
    }
    Table::from_owners(owners)
}

/// Sorts tokens by (pos, rank, r): one scatter pass on the top bits of the position (uniform, so
/// the buckets come out even at a few dozen tokens each), then each bucket on its own, in cache.
fn sort_tokens(tokens: &[Token]) -> Vec<Token> {
    let bits = (usize::BITS - tokens.len().leading_zeros()).saturating_sub(5).clamp(1, 16);
    let shift = 64 - bits;
    let mut next = vec![0usize; (1 << bits) + 1];
    for t in tokens {
        next[(t.pos >> shift) as usize + 1] += 1;
    }
    for b in 1..next.len() {
        next[b] += next[b - 1];
    }
    let bounds = next.clone();
    let mut sorted = vec![Token { pos: 0, rank: 0, r: 0 }; tokens.len()];
    for t in tokens {
        let b = (t.pos >> shift) as usize;
        sorted[next[b]] = *t;
        next[b] += 1;
    }
    for w in bounds.windows(2) {
        sorted[w[0]..w[1]].sort_unstable();
    }
    sorted
}

/// Every slot's (position, index), sorted by position. A pure function of the table size, so it
/// is computed once per size and shared: services rarely use more than one or two sizes.
/// Slot (position, index) pairs in ring order.
type SlotOrder = Arc<[(u64, u32)]>;

fn slots_in_ring_order(slots: u32) -> SlotOrder {
    static CACHE: OnceLock<Mutex<HashMap<u32, SlotOrder>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    // A poisoned lock only means another thread panicked mid-insert; the map is still usable.
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(order) = map.get(&slots) {
        return order.clone();
    }
    let mut order: Vec<(u64, u32)> = (0..slots).map(|i| (slot_position(i), i)).collect();
    order.sort_unstable();
    let order: SlotOrder = order.into();
    if map.len() >= 8 {
        map.clear();
    }
    map.insert(slots, order.clone());
    order
}
