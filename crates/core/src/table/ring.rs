//! The consistent hash ring compiled into a fixed table (seed 000).
//!
//! Spec (docs/table-spec.md):
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

    let sorted = sorted_tokens(members, &by_identity, vnodes_per_weight, total);
    assign(&sorted, slots, |t| by_identity[t.rank as usize])
}

/// Every token of `by_identity`'s members (ranks in that order), sorted by (pos, rank, r).
fn sorted_tokens(members: &[Member], by_identity: &[u32], vnodes_per_weight: u32, total: usize) -> Vec<Token> {
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
    sort_tokens(&tokens)
}

/// Pairs every slot with the first token at or after it: both sides are in ring order, so one
/// forward walk does it. `owner` maps a token to its member index.
fn assign<T: HasPos>(sorted: &[T], slots: u32, owner: impl Fn(&T) -> u32) -> Table {
    let mut owners = vec![EMPTY; slots as usize];
    if sorted.is_empty() {
        return Table::from_owners(owners);
    }
    let mut k = 0usize;
    for &(p, slot) in slots_in_ring_order(slots).iter() {
        while k < sorted.len() && sorted[k].pos() < p {
            k += 1;
        }
        let t = if k < sorted.len() { &sorted[k] } else { &sorted[0] };
        owners[slot as usize] = owner(t);
    }
    Table::from_owners(owners)
}

trait HasPos {
    fn pos(&self) -> u64;
}

impl HasPos for Token {
    fn pos(&self) -> u64 {
        self.pos
    }
}

impl HasPos for Cached {
    fn pos(&self) -> u64 {
        self.pos
    }
}

/// A token in a [`RingCache`]: `id` indexes the cache's own identity list, which, unlike a
/// rank, does not change when other members come and go.
#[derive(Clone, Copy)]
struct Cached {
    pos: u64,
    id: u32,
    r: u32,
}

/// Keeps a ring's tokens, in ring order, from one build to the next, so that a change of the
/// pool costs in proportion to the tokens it adds or removes: a removed backend's tokens are
/// filtered out, a new or heavier one's are hashed, sorted and merged in, and the slots are
/// assigned again in one walk. The result is exactly [`build`]'s; tests check it on random
/// sequences of changes.
#[derive(Default)]
pub struct RingCache {
    vnodes_per_weight: u32,
    names: Vec<String>,
    ids: HashMap<String, u32>,
    /// Tokens each identity has in `tokens`: weight x vnodes_per_weight.
    counts: Vec<u32>,
    tokens: Vec<Cached>,
}

impl RingCache {
    /// Orders two cached tokens as the spec does: position, then identity bytes, then r.
    fn cmp(&self, a: &Cached, b: &Cached) -> std::cmp::Ordering {
        a.pos
            .cmp(&b.pos)
            .then_with(|| self.names[a.id as usize].as_bytes().cmp(self.names[b.id as usize].as_bytes()))
            .then(a.r.cmp(&b.r))
    }

    pub fn build(&mut self, members: &[Member], vnodes_per_weight: u32, slots: u32) -> Table {
        if vnodes_per_weight != self.vnodes_per_weight {
            *self = RingCache { vnodes_per_weight, ..Default::default() };
        }
        // What each identity should have now.
        let mut want: HashMap<&str, (u32, u32)> = HashMap::with_capacity(members.len());
        for (i, m) in members.iter().enumerate() {
            if m.weight > 0 {
                want.insert(m.identity, (m.weight * vnodes_per_weight, i as u32));
            }
        }
        let total: usize = want.values().map(|w| w.0 as usize).sum();
        let mut changed = 0usize;
        for (id, name) in self.names.iter().enumerate() {
            let now = want.get(name.as_str()).map_or(0, |w| w.0);
            changed += self.counts[id].abs_diff(now) as usize;
        }
        for (name, w) in &want {
            if !self.ids.contains_key(*name) {
                changed += w.0 as usize;
            }
        }

        // Past this, hashing everything again costs no more than merging.
        if self.tokens.is_empty() || changed > total {
            self.rebuild(members, vnodes_per_weight, total);
        } else if changed > 0 {
            self.update(&want);
        }
        // Member index of each cached identity, for this build.
        let member_of: Vec<u32> = self.names.iter().map(|n| want.get(n.as_str()).map_or(EMPTY, |w| w.1)).collect();
        assign(&self.tokens, slots, |t| member_of[t.id as usize])
    }

    /// Starts over from the members: the plain build's tokens, with ranks turned into ids.
    fn rebuild(&mut self, members: &[Member], vnodes_per_weight: u32, total: usize) {
        let mut by_identity: Vec<u32> = (0..members.len() as u32).filter(|&i| members[i as usize].weight > 0).collect();
        by_identity.sort_by(|&a, &b| members[a as usize].identity.as_bytes().cmp(members[b as usize].identity.as_bytes()));
        let sorted = sorted_tokens(members, &by_identity, vnodes_per_weight, total);
        self.names = by_identity.iter().map(|&i| members[i as usize].identity.to_string()).collect();
        self.ids = self.names.iter().enumerate().map(|(i, n)| (n.clone(), i as u32)).collect();
        self.counts = by_identity.iter().map(|&i| members[i as usize].weight * vnodes_per_weight).collect();
        self.tokens = sorted.into_iter().map(|t| Cached { pos: t.pos, id: t.rank, r: t.r }).collect();
    }

    /// Filters out the tokens that went away, and merges in the new ones.
    fn update(&mut self, want: &HashMap<&str, (u32, u32)>) {
        let keep: Vec<u32> = self.names.iter().map(|n| want.get(n.as_str()).map_or(0, |w| w.0)).collect();
        self.tokens.retain(|t| t.r < keep[t.id as usize]);
        // New tokens, ranked by identity among the identities that gain some (the names are
        // visited in byte order), so that the bucket sort orders them as the spec does.
        let mut added: Vec<Token> = Vec::new();
        let mut rank_id: Vec<u32> = Vec::new();
        let mut buf = Vec::new();
        let mut names: Vec<&&str> = want.keys().collect();
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for name in names {
            let id = match self.ids.get(*name) {
                Some(&id) => id,
                None => {
                    let id = self.names.len() as u32;
                    self.names.push(name.to_string());
                    self.ids.insert(name.to_string(), id);
                    self.counts.push(0);
                    id
                }
            };
            let (now, _) = want[*name];
            let had = self.counts[id as usize].min(now);
            if now > had {
                let rank = rank_id.len() as u32;
                rank_id.push(id);
                buf.clear();
                buf.extend_from_slice(name.as_bytes());
                let at = buf.len();
                buf.extend_from_slice(&[0; 4]);
                for r in had..now {
                    buf[at..].copy_from_slice(&r.to_le_bytes());
                    added.push(Token { pos: xxh64(&buf, 0), rank, r });
                }
            }
        }
        for (id, c) in self.counts.iter_mut().enumerate() {
            *c = want.get(self.names[id].as_str()).map_or(0, |w| w.0);
        }
        let added: Vec<Cached> =
            sort_tokens(&added).into_iter().map(|t| Cached { pos: t.pos, id: rank_id[t.rank as usize], r: t.r }).collect();
        let old = std::mem::take(&mut self.tokens);
        let mut merged = Vec::with_capacity(old.len() + added.len());
        let (mut i, mut j) = (0, 0);
        while i < old.len() && j < added.len() {
            if self.cmp(&old[i], &added[j]) != std::cmp::Ordering::Greater {
                merged.push(old[i]);
                i += 1;
            } else {
                merged.push(added[j]);
                j += 1;
            }
        }
        merged.extend_from_slice(&old[i..]);
        merged.extend_from_slice(&added[j..]);
        self.tokens = merged;
    }
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
