//! The Maglev lookup table (seed 001), with weights.
//!
//! Spec (docs/table-spec.md):
//! - members with weight > 0, ordered by identity bytes;
//! - `offset = xxh64(identity, 0) % M`, `skip = xxh64(identity, 1) % (M - 1) + 1`; preference j
//!   of a member is `(offset + j * skip) % M`;
//! - fill in rounds: in each round every member, in order, adds its weight to a credit; when the
//!   credit reaches the largest weight W, it pays W and claims its next preferred slot that is
//!   still free; stop as soon as all M slots are filled. Every credit starts at floor(W / 2), so
//!   a member's claim count is its ideal count rounded rather than truncated: with credits
//!   starting at 0, 4:2:3:1 at M = 65537 misses its ideal shares by 1.2 slots, with W / 2 by 0.4.
//!
//! Memory is O(M + N): each member keeps only its next preference and its credit, never a
//! row of the N x M permutation matrix.

use xxhash_rust::xxh64::xxh64;

use super::{Member, Table, EMPTY};

struct Cursor {
    member: u32,
    weight: u64,
    credit: u64,
    /// The member's next preference, (offset + j * skip) % M.
    next: u64,
    skip: u64,
}

pub fn offset_and_skip(identity: &str, m: u64) -> (u64, u64) {
    let offset = xxh64(identity.as_bytes(), 0) % m;
    // M = 1 has no M - 1; its only slot is preference 0 of everyone.
    let skip = if m > 1 { xxh64(identity.as_bytes(), 1) % (m - 1) + 1 } else { 1 };
    (offset, skip)
}

pub fn build(members: &[Member], slots: u32) -> Table {
    let m = slots as u64;
    let mut owners = vec![EMPTY; slots as usize];

    let mut order: Vec<u32> = (0..members.len() as u32).filter(|&i| members[i as usize].weight > 0).collect();
    order.sort_by(|&a, &b| members[a as usize].identity.as_bytes().cmp(members[b as usize].identity.as_bytes()));
    if order.is_empty() || m == 0 {
        return Table::from_owners(owners);
    }

    let max_weight = order.iter().map(|&i| members[i as usize].weight as u64).max().unwrap_or(1);
    let mut cursors: Vec<Cursor> = order
        .iter()
        .map(|&i| {
            let (offset, skip) = offset_and_skip(members[i as usize].identity, m);
            Cursor { member: i, weight: members[i as usize].weight as u64, credit: max_weight / 2, next: offset, skip }
        })
        .collect();

    let mut filled = 0u64;
    // Every member claims at least once per `max_weight` rounds; that many rounds without a
    // new slot means no member can reach a free one (only possible for a non-prime M).
    let mut idle_rounds = 0u64;
    while idle_rounds <= max_weight {
        let before = filled;
        for c in cursors.iter_mut() {
            c.credit += c.weight;
            if c.credit < max_weight {
                continue;
            }
            c.credit -= max_weight;
            // With M prime, skip is coprime to M and the preferences visit every slot, so a free
            // one is found within M steps. The bound keeps a non-prime M (which validation
            // refuses) from looping forever.
            for _ in 0..m {
                let slot = c.next;
                c.next += c.skip;
                if c.next >= m {
                    c.next -= m;
                }
                if owners[slot as usize] == EMPTY {
                    owners[slot as usize] = c.member;
                    filled += 1;
                    break;
                }
            }
            if filled == m {
                return Table::from_owners(owners);
            }
        }
        idle_rounds = if filled == before { idle_rounds + 1 } else { 0 };
    }
    Table::from_owners(owners)
}
