//! Where each backend's frames go, and the MAC they go to.
//!
//! A backend forwarded at layer 2 is its own neighbour; an encapsulated one may sit behind a
//! router, and its frames go to the next hop the routing table names. The data plane holds a MAC
//! per neighbour, from the kernel's neighbour table: read at start (with a short wait for
//! answers), then followed through the change events the kernel sends, and re-read every few
//! seconds in case an event was lost. Routes are followed the same way, so that an encapsulated
//! backend whose next hop changes is sent to the new one.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signalfd::SignalFd;

use lb::config::{self, ConfigError, Pool};
use lb::dataplane::link::{self, mac_text, Interface};
use lb::dataplane::netlink::{self, Neighbour};

use crate::log::{log, os_text};
use lb::balancer::Balancer;

/// How long a reload waits for the MACs of backends it adds.
const RELOAD_RESOLVE: Duration = Duration::from_millis(100);

/// Where each backend's frames go, and every reason the pool cannot be served from `ifc`.
/// L2 direct server return sends a frame straight to a backend's MAC, so those backends must be
/// directly connected to the interface; an encapsulated backend may be anywhere the routing
/// table reaches through the interface, and its frames go to the next hop. A VIP held by another
/// interface arrives there, not here. Every problem is reported, each at its place in the file.
pub(super) fn next_hops(
    file: &Path,
    text: &str,
    pool: &Pool,
    ifc: &Interface,
    nl: &mut netlink::Socket,
    known_vips: &[IpAddr],
    announce: Option<&str>,
) -> (Vec<ConfigError>, HashMap<IpAddr, IpAddr>) {
    let mut problems = Vec::new();
    let mut via = HashMap::new();
    let ipv6_disabled = std::fs::read_to_string(format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", ifc.name))
        .map_or(true, |v| v.trim() == "1");
    for (si, s) in pool.services.iter().enumerate() {
        let vip_field = format!("services[{si}].vip");
        if s.vip.is_ipv6() && ipv6_disabled {
            problems.push(config::field_error(file, text, &vip_field, format!("{} is IPv6, but IPv6 is disabled on {}", s.vip, ifc.name)));
        }
        match link::owner_of(s.vip) {
            // A VIP held by the --announce device is this lb's own announcement.
            Some(owner) if owner != ifc.name && owner != "lo" && Some(owner.as_str()) != announce => problems.push(config::field_error(
                file,
                text,
                &vip_field,
                format!("{} is an address of {owner}, so its traffic arrives on {owner}, not on {}", s.vip, ifc.name),
            )),
            // With --announce every VIP goes on DEV and routers send its traffic here by BGP:
            // that a VIP is not (yet) an address of anything is the intended setup.
            None if !problems.is_empty() || known_vips.contains(&s.vip) || announce.is_some() => {}
            None => log(format!(
                "warning: vip {} (service {}) is not an address of {}: its traffic reaches lb only if a router sends it here \
                 (`ip addr add {} dev {}` makes this host answer ARP/ND for it)",
                s.vip, s.name, ifc.name, s.vip, ifc.name
            )),
            Some(_) => {}
        }
        let encap = s.forward.encapsulates();
        for (bi, b) in s.backends.iter().enumerate() {
            let field = format!("services[{si}].backends[{bi}].address");
            if b.address.is_ipv6() && ipv6_disabled && encap {
                problems.push(config::field_error(file, text, &field, format!("{} is IPv6, but IPv6 is disabled on {}", b.address, ifc.name)));
                continue;
            }
            match hop_of(b.address, encap, ifc, nl) {
                Ok(n) => {
                    via.insert(b.address, n);
                }
                Err(why) => problems.push(config::field_error(file, text, &field, why)),
            }
        }
    }
    (problems, via)
}

/// The neighbour a backend's frames go to, or why it cannot be served from `ifc`: itself when
/// it is on the link, the next hop for an encapsulated one behind a router.
fn hop_of(addr: IpAddr, encap: bool, ifc: &Interface, nl: &mut netlink::Socket) -> Result<IpAddr, String> {
    let name_of = |idx: u32| nix::net::if_::if_indextoname(idx).map_or(format!("ifindex {idx}"), |n| n.to_string_lossy().into_owned());
    match nl.route_get(addr) {
        Err(e) if encap => Err(format!("{} has no route from this host ({})", addr, os_text(&e))),
        Err(e) => Err(format!("{} has no route from this host ({}); it must be on {}'s link", addr, os_text(&e), ifc.name)),
        Ok(r) if r.kind == netlink::RTN_LOCAL => Err(format!(
            "{} is an address of this host; a backend must be another machine{}",
            addr,
            if encap { String::new() } else { format!(" on {}'s link", ifc.name) }
        )),
        Ok(r) if r.oif != Some(ifc.ifindex) && encap => Err(format!(
            "{} is reached through {}, not {}; lb sends encapsulated packets back out of the interface they came in on",
            addr,
            r.oif.map_or("no interface".to_string(), name_of),
            ifc.name
        )),
        Ok(r) if r.oif != Some(ifc.ifindex) => Err(format!(
            "{} is reached through {}, not {}; L2 direct server return needs every backend on {}'s link",
            addr,
            r.oif.map_or("no interface".to_string(), name_of),
            ifc.name,
            ifc.name
        )),
        Ok(r) => match r.gateway {
            Some(g) if encap => Ok(g),
            Some(g) => Err(format!(
                "{} is behind the router {g}, not on {}'s link; L2 direct server return sends frames straight to a \
                 backend's MAC (`forward: ipip` or `gue` reach backends behind routers)",
                addr, ifc.name
            )),
            None => Ok(addr),
        },
    }
}

/// Every neighbour the pool's frames go to (backends on the link, next hops of the others),
/// once each, in pool order.
pub(super) fn distinct_neighbours(pool: &Pool, via: &HashMap<IpAddr, IpAddr>) -> Vec<IpAddr> {
    let mut seen = HashSet::new();
    pool.services
        .iter()
        .flat_map(|s| &s.backends)
        .map(|b| via.get(&b.address).copied().unwrap_or(b.address))
        .filter(|a| seen.insert(*a))
        .collect()
}

/// Reads the neighbour table, primes every backend without a usable entry, and waits up to
/// `timeout` for the answers. None if a stop signal came first.
pub(super) fn resolve_initial(
    backends: &[IpAddr],
    ifc: &Interface,
    nl: &mut netlink::Socket,
    events: &mut netlink::Socket,
    signals: &SignalFd,
    timeout: Duration,
) -> Result<Option<HashMap<IpAddr, [u8; 6]>>> {
    let mut macs = HashMap::new();
    let wanted: HashSet<IpAddr> = backends.iter().copied().collect();
    let take = |n: &Neighbour, macs: &mut HashMap<IpAddr, [u8; 6]>| {
        if let (true, Some(m)) = (n.ifindex == ifc.ifindex && wanted.contains(&n.addr), n.mac) {
            macs.insert(n.addr, m);
        }
    };
    for n in nl.neighbours(ifc.ifindex).context("reading the neighbour table")? {
        take(&n, &mut macs);
    }
    let missing: Vec<IpAddr> = backends.iter().copied().filter(|a| !macs.contains_key(a)).collect();
    if missing.is_empty() {
        return Ok(Some(macs));
    }
    for a in &missing {
        netlink::prime(*a);
    }
    let deadline = Instant::now() + timeout;
    while backends.iter().any(|a| !macs.contains_key(a)) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut fds = [PollFd::new(events.as_fd(), PollFlags::POLLIN), PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e).context("waiting for neighbour resolution"),
        }
        if signals.read_signal().ok().flatten().is_some() {
            return Ok(None);
        }
        match events.drain_neighbour_events() {
            Ok(list) => list.iter().for_each(|n| take(n, &mut macs)),
            Err(_) => {
                // Lost events: read the table again.
                for n in nl.neighbours(ifc.ifindex)? {
                    take(&n, &mut macs);
                }
            }
        }
    }
    Ok(Some(macs))
}

/// The neighbours of a serving data plane, followed.
pub(super) struct Neighbours {
    /// The kernel's neighbour (and route) change events.
    events: netlink::Socket,
    /// The neighbours the pool's frames go to (backends on the link, next hops of the others).
    list: Vec<IpAddr>,
    /// Each backend address's neighbour.
    via: HashMap<IpAddr, IpAddr>,
    /// Backends whose resolution failed, or whose route went, and was reported.
    failing: HashSet<IpAddr>,
}

impl AsFd for Neighbours {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.events.as_fd()
    }
}

impl Neighbours {
    /// `events` is the subscription made before the first read of the table (so that no change
    /// falls between the two); `list` the neighbours of the pool being attached.
    pub(super) fn new(events: netlink::Socket, list: Vec<IpAddr>) -> Neighbours {
        Neighbours { events, list, via: HashMap::new(), failing: HashSet::new() }
    }

    /// The neighbour `addr`'s frames go to.
    pub(super) fn hop_of(&self, addr: IpAddr) -> IpAddr {
        self.via.get(&addr).copied().unwrap_or(addr)
    }

    /// Tells the data plane each backend's neighbour, and keeps the map.
    pub(super) fn set_via(&mut self, dp: &mut Balancer, via: HashMap<IpAddr, IpAddr>) -> Result<()> {
        for (&addr, &hop) in &via {
            dp.set_via(addr, hop)?;
        }
        self.via = via;
        Ok(())
    }

    /// An applied pool's neighbours replace the old ones.
    pub(super) fn set_list(&mut self, list: Vec<IpAddr>) {
        self.list = list;
    }

    /// Whether a route changed since the last call.
    pub(super) fn take_route_changes(&mut self) -> bool {
        self.events.take_route_changes()
    }

    /// Takes the neighbour changes the kernel sent; re-reads the table if some were lost.
    pub(super) fn on_events(&mut self, dp: &mut Balancer, ifc: &Interface, nl: &mut netlink::Socket) -> Result<()> {
        match self.events.drain_neighbour_events() {
            Ok(list) if list.is_empty() => {}
            Ok(list) => {
                let ours: HashSet<IpAddr> = self.list.iter().copied().collect();
                for n in list.iter().filter(|n| n.ifindex == ifc.ifindex && ours.contains(&n.addr)) {
                    apply_neighbour(dp, n, &mut self.failing)?;
                }
            }
            Err(e) => {
                log(format!("neighbour events were lost ({e}); re-reading the table"));
                self.refresh(dp, ifc, nl)?;
            }
        }
        Ok(())
    }

    /// Re-reads the neighbour table for every neighbour of the pool.
    pub(super) fn refresh(&mut self, dp: &mut Balancer, ifc: &Interface, nl: &mut netlink::Socket) -> Result<()> {
        refresh_neighbours(dp, ifc, nl, &self.list, &mut self.failing)
    }

    /// Follows the routing table: an encapsulated backend whose next hop changed is sent to the
    /// new one (whose MAC the neighbour refresh then resolves). A backend that lost its route
    /// keeps its last next hop, with a warning.
    pub(super) fn follow_routes(&mut self, dp: &mut Balancer, ifc: &Interface, nl: &mut netlink::Socket, pool: &Pool) -> Result<()> {
        let mut seen = HashSet::new();
        let encapsulated: Vec<IpAddr> = pool
            .services
            .iter()
            .filter(|s| s.forward.encapsulates())
            .flat_map(|s| &s.backends)
            .map(|b| b.address)
            .filter(|a| seen.insert(*a))
            .collect();
        for addr in encapsulated {
            let hop = match nl.route_get(addr) {
                Ok(r) if r.kind != netlink::RTN_LOCAL && r.oif == Some(ifc.ifindex) => {
                    self.failing.remove(&addr);
                    r.gateway.unwrap_or(addr)
                }
                Ok(_) | Err(_) => {
                    if self.failing.insert(addr) {
                        log(format!("backend {addr} has no route out of {} any more; keeping its last next hop", ifc.name));
                    }
                    continue;
                }
            };
            if dp.set_via(addr, hop)? {
                log(format!("backend {addr} is now reached via {hop}"));
                self.via.insert(addr, hop);
                if !self.list.contains(&hop) {
                    self.list.push(hop);
                }
            }
        }
        Ok(())
    }

    /// MACs for neighbours the data plane does not know yet: from the neighbour table, else
    /// primed and waited for briefly; still-unknown ones resolve later through events.
    pub(super) fn resolve_new(&mut self, dp: &mut Balancer, ifc: &Interface, nl: &mut netlink::Socket, wanted: &[IpAddr]) -> Result<()> {
        let missing: Vec<IpAddr> = wanted.iter().copied().filter(|a| dp.mac(*a).is_none()).collect();
        if missing.is_empty() {
            return Ok(());
        }
        self.list.extend(missing.iter().copied());
        refresh_neighbours(dp, ifc, nl, &missing, &mut self.failing)?;
        let deadline = Instant::now() + RELOAD_RESOLVE;
        while missing.iter().any(|a| dp.mac(*a).is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut fds = [PollFd::new(self.events.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX));
            self.on_events(dp, ifc, nl)?;
        }
        Ok(())
    }
}

/// A neighbour change for a backend address: take a new MAC; on loss, keep the last known one
/// (the backend most likely still has it) and ask the kernel to resolve again.
fn apply_neighbour(dp: &mut Balancer, n: &Neighbour, failing: &mut HashSet<IpAddr>) -> Result<()> {
    match n.mac {
        Some(mac) => {
            failing.remove(&n.addr);
            let before = dp.mac(n.addr);
            if dp.set_mac(n.addr, Some(mac))? {
                match before {
                    Some(old) => log(format!("backend {} moved from MAC {} to {}", n.addr, mac_text(&old), mac_text(&mac))),
                    None => log(format!("backend {} resolved to MAC {}", n.addr, mac_text(&mac))),
                }
            }
        }
        None if n.deleted => netlink::prime(n.addr),
        // Said once per failure, not on every retry.
        None if n.state == netlink::NUD_FAILED && !failing.insert(n.addr) => {}
        None if n.state == netlink::NUD_FAILED => match dp.mac(n.addr) {
            Some(_) => log(format!("backend {} does not answer ARP/ND (neighbour entry failed); keeping its last known MAC", n.addr)),
            None => log(format!("backend {} does not answer ARP/ND; its packets are dropped (no_mac) until it does", n.addr)),
        },
        None => {}
    }
    Ok(())
}

/// Re-reads the neighbour table: takes any MAC the events missed, and primes backends without a
/// usable entry or with a stale one (which the kernel then re-confirms).
fn refresh_neighbours(dp: &mut Balancer, ifc: &Interface, nl: &mut netlink::Socket, backends: &[IpAddr], failing: &mut HashSet<IpAddr>) -> Result<()> {
    let table: HashMap<IpAddr, Neighbour> =
        nl.neighbours(ifc.ifindex).context("reading the neighbour table")?.into_iter().map(|n| (n.addr, n)).collect();
    for &addr in backends {
        match table.get(&addr) {
            Some(n) if n.mac.is_some() => {
                apply_neighbour(dp, n, failing)?;
                if n.state == netlink::NUD_STALE {
                    netlink::prime(addr);
                }
            }
            _ => netlink::prime(addr),
        }
    }
    Ok(())
}
