//! The reload notes: what differs between the installed and the new version of a service, in
//! the words the reload log prints after the service's name (`b2 removed`,
//! `b1 weight 1 -> 3`, `slots 4099 -> 65537`). Which services count as added, changed or
//! removed is decided by the plan's steps; this only puts a change into words.

use std::collections::{HashMap, HashSet};

use super::{Flags, LiveBackend, LiveService};
use crate::config::Forward;

/// What differs between two versions of a service, in words.
pub(super) fn notes(old: &LiveService, new: &LiveService) -> Vec<String> {
    let mut out = Vec::new();
    let endpoint = |s: &LiveService| s.endpoint.clone();
    if old.key != new.key {
        out.push(format!("endpoint {} -> {}", endpoint(old), endpoint(new)));
    }
    let (o, n) = (&old.spec, &new.spec);
    if o.hash != n.hash {
        out.push(format!("hash {} -> {}", o.hash.as_str(), n.hash.as_str()));
    }
    if old.slots != new.slots {
        out.push(format!("slots {} -> {}", old.slots, new.slots));
    }
    // conntrack where the log always had it; the other on/off settings after gue_port.
    out.extend(n.flag_notes(o, Flags::CONNTRACK));
    if o.forward != n.forward {
        out.push(format!("forward {} -> {}", o.forward.as_str(), n.forward.as_str()));
    }
    if old.algorithm != new.algorithm {
        out.push(format!("{} -> {}", old.algorithm.as_str(), new.algorithm.as_str()));
    } else if old.algorithm_param != new.algorithm_param {
        match new.algorithm {
            crate::config::Algorithm::Ring => out.push(format!("vnodes_per_weight {} -> {}", old.algorithm_param, new.algorithm_param)),
            crate::config::Algorithm::Bounded => out.push(format!(
                "load_bound {}.{:03} -> {}.{:03}",
                old.algorithm_param / 1000,
                old.algorithm_param % 1000,
                new.algorithm_param / 1000,
                new.algorithm_param % 1000
            )),
            crate::config::Algorithm::Maglev => {}
        }
    }
    if o.forward == Forward::Gue && n.forward == Forward::Gue && o.gue_port != n.gue_port {
        out.push(format!("gue_port {} -> {}", o.gue_port, n.gue_port));
    }
    out.extend(n.flag_notes(o, Flags::all().difference(Flags::CONNTRACK)));
    if o.quic_lb() == n.quic_lb() && old.quic_digest != new.quic_digest {
        out.push("quic_lb parameters, key or server IDs changed".to_string());
    }
    let before: HashMap<&str, &LiveBackend> = old.backends.iter().map(|b| (b.identity.as_str(), b)).collect();
    let after: HashSet<&str> = new.backends.iter().map(|b| b.identity.as_str()).collect();
    for b in &new.backends {
        match before.get(b.identity.as_str()) {
            None => out.push(format!("{} added", b.identity)),
            Some(o) if o.weight != b.weight => out.push(format!("{} weight {} -> {}", b.identity, o.weight, b.weight)),
            Some(o) if o.state != b.state => out.push(format!("{} {} -> {}", b.identity, o.state.as_str(), b.state.as_str())),
            Some(o) if o.address != b.address => out.push(format!("{} address {} -> {}", b.identity, o.address, b.address)),
            Some(_) => {}
        }
    }
    for o in &old.backends {
        if !after.contains(o.identity.as_str()) {
            out.push(format!("{} removed", o.identity));
        }
    }
    // Last: what follows from the rest, or from the previous pool alone.
    if o.second_chance() && n.second_chance() && old.hops.len() == new.hops.len() {
        let changed = old.hops.iter().zip(&new.hops).filter(|(a, b)| a != b).count();
        if changed > 0 {
            out.push(format!("hops of {changed} slots changed"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::testkit::{pool, run, A};
    use super::super::State;
    use super::notes;

    #[test]
    fn the_notes_name_each_backend_change_and_the_builder_parameters() {
        let t0 = Instant::now();
        let before = "services:\n  - {name: w, vip: 10.0.0.1, port: 80, slots: 7, algorithm: bounded, load_bound: 1.02, forward: gue, gue_port: 6080, backends: [10.0.0.1, 10.0.0.2, {address: 10.0.0.3, name: b3}, 10.0.0.4]}\n";
        let after = "services:\n  - {name: w, vip: 10.0.0.1, port: 81, slots: 7, algorithm: bounded, load_bound: 1.5, forward: gue, gue_port: 7000, backends: [{address: 10.0.0.1, state: drain}, {address: 10.0.0.2, weight: 3}, {address: 10.0.0.9, name: b3}, 10.0.0.5]}\n";
        let old = run(&State::default(), &pool(before), t0).state.services.remove(0);
        let new = run(&State::default(), &pool(after), t0).state.services.remove(0);
        assert_eq!(
            notes(&old, &new),
            vec![
                "endpoint 10.0.0.1:80/tcp -> 10.0.0.1:81/tcp",
                "load_bound 1.020 -> 1.500",
                "gue_port 6080 -> 7000",
                "10.0.0.1 active -> drain",
                "10.0.0.2 weight 1 -> 3",
                "b3 address 10.0.0.3 -> 10.0.0.9",
                "10.0.0.5 added",
                "10.0.0.4 removed",
            ]
        );
        assert!(notes(&old, &old).is_empty());
    }

    #[test]
    fn the_reload_notes_name_every_kind_of_change() {
        let t0 = Instant::now();
        let p1 = pool(A);
        let first = run(&State::default(), &p1, t0);
        let p2 = pool(
            &A.replace("{name: web, vip: 10.0.0.100, port: 80, slots: 1009,", "{name: web, vip: 10.0.0.100, port: 80, slots: 1009, algorithm: maglev, hash: flow, conntrack: off, forward: ipip,")
                .replace("{name: alt, vip: 10.0.0.100, port: 60, slots: 1009,", "{name: alt, vip: 10.0.0.100, port: 60, slots: 2003, vnodes_per_weight: 10,"),
        );
        let second = run(&first.state, &p2, t0 + Duration::from_secs(1));
        let web = second.touched.iter().find(|t| t.name == "web").expect("web touched");
        for note in ["ring -> maglev", "hash client-ip -> flow", "conntrack on -> off", "forward l2 -> ipip"] {
            assert!(web.notes.iter().any(|n| n == note), "{note} missing from {:?}", web.notes);
        }
        let alt = second.touched.iter().find(|t| t.name == "alt").expect("alt touched");
        for note in ["slots 1009 -> 2003", "vnodes_per_weight 150 -> 10"] {
            assert!(alt.notes.iter().any(|n| n == note), "{note} missing from {:?}", alt.notes);
        }
    }
}
