//! Second chance: which backends besides a slot's owner may hold a connection hashed to it, so
//! that a packet a node sends by its table (after an ECMP change moved the flow to it) can still
//! reach the backend that holds the connection: the backends' `lb decap --second-chance` send it
//! along this list. Computed from the files alone, so every node given the same files agrees
//! (docs/fleet.md, "Second chance", explains the choice against history kept on each node).

use super::{build_members, build_service, Member, Table, EMPTY};
use crate::config::{BackendState, Service};

/// Adds the second-chance hops to a service's table (nothing for a service without
/// `second_chance: on`). A slot's hops are the backends besides its owner that may hold a
/// connection hashed to it: first its owner in the table of `previous` (the service of the same
/// name in the pool file's `previous:` file, when it has the same number of slots), then its
/// runner-up, its owner in the table built without its current owner (for services of at most
/// [`MAX_RUNNER_UP_BACKENDS`] backends). A backend that is down
/// (or gone) is no hop: its connections are gone with it. Both are functions of the files alone,
/// so every node given the same files computes the same hops (docs/fleet.md, "Second chance").
pub fn with_hops(service: &Service, table: Table, previous: Option<&Service>) -> Table {
    if !service.second_chance || table.is_empty() {
        return table;
    }
    let runner_ups = runner_ups(service, &table);
    with_runner_ups(service, table, previous, &runner_ups)
}

/// [`with_hops`] with each slot's runner-up already known ([`runner_ups`]).
pub(super) fn with_runner_ups(service: &Service, table: Table, previous: Option<&Service>, runner_ups: &[u32]) -> Table {
    if !service.second_chance || table.is_empty() {
        return table;
    }
    let identities: Vec<String> = service.backends.iter().map(|b| b.identity()).collect();
    let usable = |i: usize| service.backends[i].state != BackendState::Down;
    let mut hops = vec![[EMPTY; 2]; table.len()];
    // The previous pool's slots hash the same flows only with the same table size and hash.
    if let Some(prev) = previous.filter(|p| p.slots == service.slots && p.hash == service.hash) {
        let index: std::collections::HashMap<String, usize> =
            identities.iter().enumerate().map(|(i, id)| (id.clone(), i)).collect();
        let prev_ids: Vec<String> = prev.backends.iter().map(|b| b.identity()).collect();
        let old = build_service(prev);
        for (slot, hop) in hops.iter_mut().enumerate() {
            let Some(o) = old.owner(slot) else { continue };
            if let Some(&i) = index.get(&prev_ids[o]) {
                if table.owners[slot] != i as u32 && usable(i) {
                    hop[0] = i as u32;
                }
            }
        }
    }
    for (slot, hop) in hops.iter_mut().enumerate() {
        let r = runner_ups.get(slot).copied().unwrap_or(EMPTY);
        if r != EMPTY && r != hop[0] && r != table.owners[slot] && usable(r as usize) {
            hop[1] = r;
        }
    }
    Table { hops, ..table }
}

/// Each slot's runner-up (a member index, or [`EMPTY`]): its owner in the table built without
/// its owner; none for a service of more than [`MAX_RUNNER_UP_BACKENDS`] backends.
pub fn runner_ups(service: &Service, table: &Table) -> Vec<u32> {
    let mut out = vec![EMPTY; table.len()];
    if service.backends.len() > MAX_RUNNER_UP_BACKENDS {
        return out;
    }
    let counts = table.counts(service.backends.len());
    for who in (0..service.backends.len()).filter(|&i| counts[i] > 0) {
        let without = without(service, who);
        for (slot, r) in out.iter_mut().enumerate() {
            if table.owners[slot] == who as u32 {
                *r = without.owners[slot];
            }
        }
    }
    out
}

/// What a service's runner-ups depend on: its builder and parameters, and each backend's
/// identity, weight and state (a drained backend owns no slots, which moves others' runner-ups
/// too; a down one is left out). A key of these, so that a reload that changes none of
/// them (a change elsewhere, or of the previous pool) builds them again for no service.
pub(super) fn runner_up_key(service: &Service) -> u64 {
    let mut h = xxhash_rust::xxh64::Xxh64::new(0);
    h.update(format!("{} {} {} {}", service.algorithm.as_str(), service.slots, service.vnodes_per_weight, service.load_bound).as_bytes());
    for b in &service.backends {
        h.update(format!("\0{}\0{}\0{}", b.identity(), b.weight, b.state.as_str()).as_bytes());
    }
    h.digest()
}

/// The most backends a service may have for its slots to list a runner-up: finding them costs
/// one table build per backend that owns slots (at 32 backends and 65,537 slots, 0.03 to 0.3 s
/// per reload here, depending on the builder; at 1,000, 3 to 10 s), so larger services list
/// previous owners only.
pub const MAX_RUNNER_UP_BACKENDS: usize = 32;

/// The table built without member `who` (its weight 0): where its slots would go. A drained
/// backend counts with its configured weight, since it still holds connections; a down one
/// does not.
fn without(service: &Service, who: usize) -> Table {
    let identities: Vec<String> = service.backends.iter().map(|b| b.identity()).collect();
    let weight = |b: &crate::config::Backend| if b.state == BackendState::Down { 0 } else { b.weight };
    let members: Vec<Member> = service
        .backends
        .iter()
        .zip(&identities)
        .enumerate()
        .map(|(j, (b, id))| Member { identity: id, weight: if j == who { 0 } else { weight(b) } })
        .collect();
    build_members(service, &members)
}

#[cfg(test)]
mod tests {
    use super::with_hops;
    use crate::config::{parse_str, BackendState, Pool, Service};
    use crate::table::{build_service, digest, Table, EMPTY};

    fn pool(backends: &str) -> Pool {
        let text = format!(
            "services:\n  - {{name: web, vip: 10.0.0.100, port: 80, algorithm: maglev, slots: 4099, forward: gue, second_chance: on, backends: {backends}}}\n"
        );
        parse_str("p.yaml", &text).expect("valid")
    }

    fn hops(now: &Service, before: Option<&Service>) -> Table {
        with_hops(now, build_service(now), before)
    }

    fn name(s: &Service, o: u32) -> Option<String> {
        (o != EMPTY).then(|| s.backends[o as usize].identity())
    }


    // Shorthand names are not addresses: the pool takes `{name, address}` mappings.
    fn backends(names: &[(&str, u32)]) -> String {
        let list: Vec<String> =
            names.iter().enumerate().map(|(i, (n, w))| format!("{{name: {n}, address: 10.1.0.{}, weight: {w}}}", i + 1)).collect();
        format!("[{}]", list.join(", "))
    }

    #[test]
    fn every_slot_that_changed_owner_lists_its_previous_owner_first() {

        let before = pool(&backends(&[("b1", 1), ("b2", 1), ("b3", 1)]));
        // b4 added and b1 reweighted at once: the case a deterministic rule alone gets wrong.
        let now = pool(&backends(&[("b1", 2), ("b2", 1), ("b3", 1), ("b4", 1)]));
        let (b, n) = (&before.services[0], &now.services[0]);
        let (old, t) = (build_service(b), hops(n, Some(b)));
        let mut changed = 0;
        for slot in 0..t.len() {
            let was = name(b, old.owners()[slot]);
            let is = name(n, t.owners()[slot]);
            let first = name(n, t.hops()[slot][0]);
            if was != is {
                changed += 1;
                assert_eq!(first, was, "slot {slot}: {was:?} -> {is:?}");
            } else {
                assert_eq!(first, None, "slot {slot} kept its owner: no previous owner to list");
            }
            assert_ne!(t.hops()[slot][1], t.owners()[slot], "a slot's own owner is never its hop");
        }
        assert!(changed > t.len() / 5, "the change moved {changed} slots");
    }

    #[test]
    fn without_a_previous_pool_an_added_backends_slots_list_their_old_owner_as_runner_up() {
        let before = pool(&backends(&[("b1", 1), ("b2", 1), ("b3", 1)]));
        let now = pool(&backends(&[("b1", 1), ("b2", 1), ("b3", 1), ("b4", 1)]));
        let (b, n) = (&before.services[0], &now.services[0]);
        let (old, t) = (build_service(b), hops(n, None));
        let mut moved = 0;
        for slot in 0..t.len() {
            assert_eq!(t.hops()[slot][0], EMPTY, "no previous file, no previous owner");
            if name(n, t.owners()[slot]).as_deref() == Some("b4") {
                moved += 1;
                assert_eq!(name(n, t.hops()[slot][1]), name(b, old.owners()[slot]), "slot {slot}");
            }
        }
        assert!(moved > 0);
    }

    #[test]
    fn a_down_backend_is_nobodys_hop_and_a_drained_one_still_is() {
        let before = pool(&backends(&[("b1", 1), ("b2", 1), ("b3", 1)]));
        let mut now = pool(&backends(&[("b1", 1), ("b2", 1), ("b3", 1)]));
        now.services[0].backends[1].state = BackendState::Drain;
        let (b, n) = (&before.services[0], &now.services[0]);
        let t = hops(n, Some(b));
        let old = build_service(b);
        let drained: Vec<usize> = (0..t.len()).filter(|&s| old.owners()[s] == 1).collect();
        assert!(!drained.is_empty());
        assert!(drained.iter().all(|&s| t.hops()[s][0] == 1), "a drained backend's old slots lead back to it");
        now.services[0].backends[1].state = BackendState::Down;
        let t = hops(&now.services[0], Some(b));
        assert!(t.hops().iter().all(|h| h[0] != 1 && h[1] != 1), "a down backend is never a hop");
    }

    #[test]
    fn the_digest_covers_the_hops_and_is_unchanged_without_second_chance() {
        let before = pool(&backends(&[("b1", 1), ("b2", 1), ("b3", 1)]));
        let now = pool(&backends(&[("b1", 1), ("b2", 1), ("b3", 1), ("b4", 1)]));
        let n = &now.services[0];
        let ids: Vec<String> = n.backends.iter().map(|b| b.identity()).collect();
        let with = digest(&hops(n, Some(&before.services[0])), &ids);
        let without_previous = digest(&hops(n, None), &ids);
        assert_ne!(with, without_previous, "nodes with different previous files must not agree");
        assert_eq!(with, digest(&hops(n, Some(&before.services[0])), &ids), "the same files, the same digest");
        let mut off = n.clone();
        off.second_chance = false;
        let plain = build_service(&off);
        assert!(hops(&off, Some(&before.services[0])).hops().is_empty());
        assert_eq!(digest(&with_hops(&off, plain.clone(), None), &ids), digest(&plain, &ids));
    }

    #[test]
    fn a_service_past_the_runner_up_limit_lists_previous_owners_only() {
        let names: Vec<String> = (0..=super::MAX_RUNNER_UP_BACKENDS).map(|i| format!("b{i}")).collect();
        let all: Vec<(&str, u32)> = names.iter().map(|n| (n.as_str(), 1)).collect();
        let before = pool(&backends(&all[1..]));
        let now = pool(&backends(&all));
        let t = hops(&now.services[0], Some(&before.services[0]));
        assert!(t.hops().iter().all(|h| h[1] == EMPTY), "no runner-up past the limit");
        assert!(t.hops().iter().any(|h| h[0] != EMPTY), "previous owners still listed");
        let small = pool(&backends(&all[1..]));
        let t = hops(&small.services[0], None);
        assert!(t.hops().iter().all(|h| h[1] != EMPTY), "at the limit every slot has a runner-up");
    }

    #[test]
    fn the_builder_keeps_runner_ups_only_while_what_they_depend_on_holds() {
        let before = pool(&backends(&[("b1", 1), ("b2", 1), ("b3", 1)]));
        let mut now = pool(&backends(&[("b1", 1), ("b2", 1), ("b3", 1), ("b4", 1)]));
        let mut builder = crate::table::Builder::default();
        let mut check = |now: &Pool, previous: Option<&Service>| {
            let s = &now.services[0];
            let t = builder.build_service(s);
            assert_eq!(builder.with_hops(s, t, previous), hops(s, previous), "the builder's hops are with_hops'");
        };
        check(&now, None);
        check(&now, Some(&before.services[0]));
        // Active to drain and back: the drained backend's slots go to others, whose runner-ups
        // it then is (a key that saw only "down" kept the old ones).
        now.services[0].backends[1].state = BackendState::Drain;
        check(&now, Some(&before.services[0]));
        now.services[0].backends[1].state = BackendState::Active;
        check(&now, Some(&before.services[0]));
        now.services[0].backends[3].state = BackendState::Down;
        check(&now, Some(&before.services[0]));
        now.services[0].backends[3].state = BackendState::Drain;
        check(&now, Some(&before.services[0]));
        now.services[0].backends[0].weight = 3;
        check(&now, None);
    }

    #[test]
    fn a_previous_pool_with_another_hash_lists_no_previous_owner() {
        let mut before = pool(&backends(&[("b1", 1), ("b2", 1), ("b3", 1)]));
        let now = pool(&backends(&[("b1", 1), ("b2", 1), ("b3", 1), ("b4", 1)]));
        assert!(hops(&now.services[0], Some(&before.services[0])).hops().iter().any(|h| h[0] != EMPTY));
        before.services[0].hash = crate::config::HashMode::Flow;
        let t = hops(&now.services[0], Some(&before.services[0]));
        assert!(t.hops().iter().all(|h| h[0] == EMPTY), "another hash sends other flows to each slot");
    }

    #[test]
    fn a_previous_pool_of_another_size_lists_no_previous_owner() {
        let before = parse_str(
            "p.yaml",
            "services:\n  - {name: web, vip: 10.0.0.100, port: 80, algorithm: maglev, slots: 1009, backends: [10.1.0.1]}\n",
        )
        .expect("valid");
        let now = pool(&backends(&[("b1", 1), ("b2", 1)]));
        let t = hops(&now.services[0], Some(&before.services[0]));
        assert!(t.hops().iter().all(|h| h[0] == EMPTY), "slots of another table size are other flows");
    }
}
