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
//! so a counting sort on their top bits puts tokens into buckets of about one token each; the
//! buckets are then sorted on their own. The bucket start offsets double as an index: a slot
//! only has to scan its own bucket, and if every token there lies below it, the answer is the
//! first token of the next non-empty bucket. That makes the whole build O(tokens + slots).

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

    let (sorted, starts, shift) = bucket_sort(&tokens);
    drop(tokens);

    let mut owners = Vec::with_capacity(slots as usize);
    for i in 0..slots {
        let p = slot_position(i);
        let b = (p >> shift) as usize;
        let (lo, hi) = (starts[b] as usize, starts[b + 1] as usize);
        let idx = match sorted[lo..hi].iter().position(|t| t.pos >= p) {
            Some(k) => lo + k,
            // Every token of this bucket is below p: the next token clockwise is the first one of
            // a later bucket, which is where this bucket ends; past the last token, wrap to 0.
            None if hi < sorted.len() => hi,
            None => 0,
        };
        owners.push(by_identity[sorted[idx].rank as usize]);
    }
    Table::from_owners(owners)
}

/// Sorts tokens by (pos, rank, r). Returns the sorted tokens, the start offset of each bucket
/// (with one extra entry at the end) and the shift that maps a position to its bucket.
fn bucket_sort(tokens: &[Token]) -> (Vec<Token>, Vec<u32>, u32) {
    let bits = (usize::BITS - tokens.len().leading_zeros()).clamp(1, 22);
    let shift = 64 - bits;
    let buckets = 1usize << bits;

    let mut starts = vec![0u32; buckets + 1];
    for t in tokens {
        starts[(t.pos >> shift) as usize + 1] += 1;
    }
    for b in 0..buckets {
        starts[b + 1] += starts[b];
    }
    let mut next = starts.clone();
    let mut sorted = vec![Token { pos: 0, rank: 0, r: 0 }; tokens.len()];
    for t in tokens {
        let b = (t.pos >> shift) as usize;
        sorted[next[b] as usize] = *t;
        next[b] += 1;
    }
    for b in 0..buckets {
        let (lo, hi) = (starts[b] as usize, starts[b + 1] as usize);
        if hi - lo > 1 {
            sorted[lo..hi].sort_unstable();
        }
    }
    (sorted, starts, shift)
}
