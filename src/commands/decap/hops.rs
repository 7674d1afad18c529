//! Second chance's needs on the host: the loopback's forwarding switches (which the kernel's FIB
//! helper asks for), and the next hops found on the link with no MAC known, which lb decap has
//! the kernel resolve.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use lb::dataplane::decap::Decap;
use lb::dataplane::netlink;

use crate::log::log;

/// Second chance: how often the next hops found unresolved are looked at (a packet to one is
/// dropped until its MAC is known, and TCP sends it again after 200 ms at the soonest), how
/// often each is asked for again while it stays unresolved, and when it is forgotten, so that a
/// later packet to it starts a new wait (the program gives up waiting after 3 s).
pub(super) const RESOLVE_POLL: Duration = Duration::from_millis(50);
pub(super) const RESOLVE_AGAIN: Duration = Duration::from_secs(1);
pub(super) const RESOLVE_FORGET: Duration = Duration::from_secs(10);
/// At most this many next hops are asked for per look (the map holds 256): 160 a second.
pub(super) const RESOLVE_BURST: usize = 8;
/// Next hops logged one by one, at most; after that, one line says the rest are not.
pub(super) const RESOLVE_LOGGED: usize = 64;
/// What lb decap keeps to have next hops resolved: netlink, when each hop was last asked for,
/// and the hops it has logged.
pub(super) struct Resolver {
    nl: netlink::Socket,
    asked: HashMap<IpAddr, Instant>,
    logged: HashSet<IpAddr>,
}

impl Resolver {
    pub(super) fn new() -> Result<Resolver> {
        Ok(Resolver { nl: netlink::Socket::open().context("opening a netlink socket")?, asked: HashMap::new(), logged: HashSet::new() })
    }
}

/// The loopback's forwarding switches, which second chance needs on: the kernel's FIB helper
/// routes a packet only "from" a device with forwarding on, and the program asks as if the
/// packet came from the loopback (docs/fleet.md, "Second chance"). On there, they forward
/// nothing (no packet from outside arrives on the loopback); the interface stays a host's.
/// Each as its file and its sysctl name.
pub(super) const LOOPBACK_FORWARDING: [(&str, &str); 2] = [
    ("/proc/sys/net/ipv4/conf/lo/forwarding", "net.ipv4.conf.lo.forwarding"),
    ("/proc/sys/net/ipv6/conf/lo/forwarding", "net.ipv6.conf.lo.forwarding"),
];

/// Turns the loopback's forwarding on where it is off, once, at start; returns the switches it
/// turned on. Never turned off again: it forwards nothing, another `lb decap` of this host may
/// rely on it, and a process killed with SIGKILL could not anyway. A family the host does not
/// have (IPv6 disabled: no such switch) is skipped.
pub(super) fn loopback_forwarding_on() -> Result<Vec<&'static str>> {
    let mut changed = Vec::new();
    for (path, name) in LOOPBACK_FORWARDING {
        let Ok(now) = std::fs::read_to_string(path) else { continue };
        if now.trim() != "1" {
            std::fs::write(path, "1").with_context(|| format!("turning on {name} (second chance routes hops from the loopback)"))?;
            changed.push(name);
        }
    }
    Ok(changed)
}

/// The loopback's forwarding switches that are off now (by their sysctl names).
pub(super) fn loopback_forwarding_off() -> Vec<&'static str> {
    LOOPBACK_FORWARDING
        .iter()
        .filter(|(path, _)| std::fs::read_to_string(path).is_ok_and(|now| now.trim() != "1"))
        .map(|&(_, name)| name)
        .collect()
}

/// Has the kernel resolve the next hops second chance found on the link with no MAC known (a
/// packet to each was dropped, and its sender will send it again): each is asked for at once
/// and again every second while it stays so, at most RESOLVE_BURST a look. A hop whose MAC is
/// known now is forgotten at once (a later loss of it starts a new wait), one never resolved
/// after RESOLVE_FORGET.
pub(super) fn resolve_next_hops(dp: &Decap, r: &mut Resolver, now: Instant) -> Result<()> {
    let hops = dp.unresolved()?;
    r.asked.retain(|a, _| hops.iter().any(|(h, _)| h == a));
    let mut neighbours: HashMap<u32, Vec<netlink::Neighbour>> = HashMap::new();
    let mut burst = 0;
    for (hop, age) in hops {
        // The neighbour the hop is reached through (itself, or its route's gateway).
        let resolved = r.nl.route_get(hop).ok().is_some_and(|route| {
            let Some(oif) = route.oif else { return false };
            let next = route.gateway.unwrap_or(hop);
            let known = neighbours.entry(oif).or_insert_with(|| r.nl.neighbours(oif).unwrap_or_default());
            known.iter().any(|n| n.addr == next && n.mac.is_some())
        });
        if resolved || age >= RESOLVE_FORGET {
            dp.forget_unresolved(hop)?;
            r.asked.remove(&hop);
            continue;
        }
        if burst < RESOLVE_BURST && r.asked.get(&hop).is_none_or(|t| now.duration_since(*t) >= RESOLVE_AGAIN) {
            if r.logged.len() < RESOLVE_LOGGED && r.logged.insert(hop) {
                log(format!("second chance: next hop {hop} has no known MAC: resolving it"));
                if r.logged.len() == RESOLVE_LOGGED {
                    log(format!("second chance: {RESOLVE_LOGGED} next hops logged; others resolved from now on are not"));
                }
            }
            netlink::prime(hop);
            r.asked.insert(hop, now);
            burst += 1;
        }
    }
    Ok(())
}
