//! `lb attach IFACE --config FILE`: validate, check the interface, resolve backend MACs, load,
//! fill the maps, attach through a BPF link, then serve in the foreground until SIGINT/SIGTERM.
//!
//! One thread and one poll loop over a signalfd and a netlink socket: no async runtime. Every
//! check that can fail runs before the program is attached, so an error leaves nothing behind;
//! once attached, the link's descriptor is the only thing holding the program on the interface,
//! and it closes with the process however the process ends.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use lb::config::{self, Pool};
use lb::dataplane::link::{self, mac_text, Interface};
use lb::dataplane::netlink::{self, Neighbour};
use lb::{report, stats, table};

use crate::log::{log, os_text};
use crate::plane::{flow_table_slots, Plane, Reuse};
use crate::settings::Settings;
use crate::probe::{Job, Prober};
use crate::xdp::{already_attached, attach_with_mode, check_privileges, ensure_present};
use crate::watch::{Debounce, Watcher};
use lb::health::{self, HealthMap, Transition};
use std::net::SocketAddr;

/// The VIPs of a pool.
fn vips_of(pool: &Pool) -> std::collections::BTreeSet<IpAddr> {
    pool.services.iter().map(|s| s.vip).collect()
}

/// Outer sources of encapsulated packets, per family.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct EncapSources {
    v4: Option<(std::net::Ipv4Addr, u8)>,
    v6: Option<(std::net::Ipv6Addr, u8)>,
}

/// The outer source of encapsulated packets for each family the pool's encapsulated backends
/// use: `--encap-source` where given, else the interface's first address of that family that
/// is not a VIP (a backend drops an encapsulated packet whose outer source is one of its own
/// addresses, and every backend holds the VIPs) nor link-local. Errors name what is missing.
fn encap_sources(plan: &Settings, ifc: &Interface, pool: &Pool) -> Result<EncapSources, String> {
    let vips: HashSet<IpAddr> = pool.services.iter().map(|s| s.vip).collect();
    let mut out = EncapSources::default();
    for &(a, len) in &plan.encap_sources {
        if vips.contains(&a) {
            return Err(format!(
                "--encap-source {a} is a VIP of the pool; backends hold every VIP and drop encapsulated packets from their own addresses"
            ));
        }
        match a {
            IpAddr::V4(v) => out.v4 = Some((v, len)),
            IpAddr::V6(v) => out.v6 = Some((v, len)),
        }
    }
    let needs = |v6: bool| {
        pool.services.iter().filter(|s| s.forward.encapsulates()).flat_map(|s| &s.backends).any(|b| b.address.is_ipv6() == v6)
    };
    let usable = |a: &&IpAddr| !vips.contains(a) && !a.is_loopback() && !matches!(a, IpAddr::V6(v) if (v.segments()[0] & 0xffc0) == 0xfe80);
    if out.v4.is_none() {
        out.v4 = ifc.addresses.iter().filter(usable).find_map(|a| match a {
            IpAddr::V4(v) => Some((*v, 32)),
            _ => None,
        });
        if out.v4.is_none() && needs(false) {
            return Err(format!(
                "encapsulated IPv4 backends need an IPv4 source address: {} has none but VIPs; add one or give --encap-source",
                ifc.name
            ));
        }
    }
    if out.v6.is_none() {
        out.v6 = ifc.addresses.iter().filter(usable).find_map(|a| match a {
            IpAddr::V6(v) => Some((*v, 128)),
            _ => None,
        });
        if out.v6.is_none() && needs(true) {
            return Err(format!(
                "encapsulated IPv6 backends need an IPv6 source address: {} has none but VIPs and link-local ones; add one or give --encap-source",
                ifc.name
            ));
        }
    }
    Ok(out)
}

/// The interface's MTU (what an encapsulated frame may not exceed).
fn interface_mtu(ifc: &Interface) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{}/mtu", ifc.name)).ok().and_then(|m| m.trim().parse().ok()).unwrap_or(1500)
}

/// At most this long after the first event of a burst, a reload happens even if a writer still
/// has the file open.
const RELOAD_MAX_WAIT: Duration = Duration::from_secs(1);

/// How often the data plane's clock (connection-tracking ages) is advanced.
const CLOCK_TICK: Duration = Duration::from_millis(250);

/// Health probes running at once, at most.
const PROBE_WORKERS: usize = 16;

/// How long a reload waits for the MACs of backends it adds.
const RELOAD_RESOLVE: Duration = Duration::from_millis(100);

/// How often the neighbour table is re-read and unresolved or stale backends re-primed, on top
/// of the change events the kernel sends.
const NEIGHBOUR_REFRESH: Duration = Duration::from_secs(5);

pub fn run(plan: Settings, pool: Pool, content: &[u8]) -> Result<ExitCode> {
    let started_ms = lb::dataplane::pin::now_ms();
    check_privileges()?;
    let ifc = link::interface(&plan.iface)?;
    let (pinning, found) = match &plan.pin {
        Some(root) => {
            let (p, f) = crate::persist::prepare(root, &ifc)?;
            (Some(p), f)
        }
        None => (None, None),
    };
    if let Some(a) = link::attached(ifc.ifindex).with_context(|| format!("querying {}'s XDP program", ifc.name))? {
        // A pinned data plane being adopted is attached, of course; anything else is not ours.
        if found.as_ref().is_none_or(|f| f.prog_id != a.prog_id) {
            return Err(already_attached(&ifc, Some(a)));
        }
    }
    let mut nl = netlink::Socket::open().context("opening a netlink socket")?;
    let text = String::from_utf8_lossy(content);
    let (problems, via) = next_hops(&plan.config, &text, &pool, &ifc, &mut nl, &[], plan.announce.as_deref());
    if !problems.is_empty() {
        let lines: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
        bail!("{} cannot serve this pool; nothing was attached:\n{}", ifc.name, lines.join("\n"));
    }
    let sources = encap_sources(&plan, &ifc, &pool).map_err(|e| anyhow::anyhow!("{e}; nothing was attached"))?;
    let mut announcer = match &plan.announce {
        Some(dev) => Some(crate::announce::Announcer::open(&mut nl, dev, &ifc.name)?),
        None => None,
    };
    if !ifc.up {
        log(format!("warning: {} is down; lb attaches anyway and serves once it is up", ifc.name));
    }

    // Signals are read from a descriptor in the poll loop, so block them first: a Ctrl-C from
    // here on is an orderly stop at the next loop turn.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGINT);
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGHUP);
    mask.thread_block().context("blocking SIGINT, SIGTERM and SIGHUP")?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).context("creating a signalfd")?;

    // Subscribe before the first dump, so that no change falls between the two.
    let mut events = netlink::Socket::neighbour_events().context("subscribing to neighbour changes")?;
    let backends = distinct_neighbours(&pool, &via);
    let Some(macs) = resolve_initial(&backends, &ifc, &mut nl, &mut events, &signals, plan.resolve_timeout)? else {
        log("interrupted before attaching; nothing was changed");
        return Ok(ExitCode::SUCCESS);
    };

    // Watch before loading: a change made while we attach is seen.
    let watcher = match Watcher::new(&plan.config) {
        Ok(w) => Some(w),
        Err(e) => {
            log(format!("warning: {e:#}; reloads happen on SIGHUP and every {:?} only", plan.recheck_interval));
            None
        }
    };

    let reuse = match (&pinning, &found) {
        (Some(p), Some(f)) => {
            Some(Reuse { dir: p.dir.clone(), same_layout: f.same_layout, old_prog_id: f.prog_id })
        }
        _ => None,
    };
    let (mut dp, fresh) = Plane::load_with(plan.table_capacity, plan.conntrack_size, reuse.as_ref())?;
    // Bound before anything is attached or changed: a bad address or a port in use stops here.
    let metrics = match plan.metrics {
        Some(addr) => Some(crate::serve_metrics::start(addr, dp.counter_maps()?, lb::metrics::Model::default())?),
        None => None,
    };
    dp.set_conntrack_timeouts(plan.conntrack_timeouts.0, plan.conntrack_timeouts.1)?;
    dp.set_conntrack_guard(plan.conntrack_guard)?;
    let mtu = interface_mtu(&ifc);
    dp.set_mtu(mtu)?;
    dp.set_encap_sources(sources.v4, sources.v6)?;
    for (&addr, &hop) in &via {
        dp.set_via(addr, hop)?;
    }
    let xdp = match (&pinning, found) {
        (Some(p), Some(f)) => adopt(&mut dp, &pool, &ifc, &macs, p, f, &fresh, started_ms)?,
        _ => {
            dp.install(&pool, ifc.mac, &|a| macs.get(&a).copied()).context("filling the BPF maps")?;
            let xdp = attach_with_mode(dp.program_fd(), &ifc, plan.mode)?;
            log(format!(
                "attached to {} (ifindex {}, {}) in {} mode: XDP program id {}, link id {}",
                ifc.name,
                ifc.ifindex,
                mac_text(&ifc.mac),
                xdp.mode.as_str(),
                xdp.prog_id,
                xdp.link_id
            ));
            if let Some(p) = &pinning {
                dp.pin_maps(&p.dir, None)?;
                lb::dataplane::pin::pin_fd(&xdp.as_fd(), &p.dir.join(lb::dataplane::pin::LINK))?;
                dp.write_meta(lb::dataplane::pin::now_ms(), Some((std::process::id(), started_ms)), ifc.ifindex)?;
                log(format!(
                    "pinned at {}: the data plane stays attached and forwarding when this process exits",
                    p.dir.display()
                ));
            }
            Attachment::Link(xdp)
        }
    };
    if pool.services.iter().any(|s| s.forward.encapsulates()) {
        log(format!("encapsulated packets: {}; MTU {mtu}", describe_sources(&sources)));
    }
    for s in &pool.services {
        log(format!("service {}", report::service_summary(s)));
        let t = table::build_service(s);
        for (b, share) in s.backends.iter().zip(table::shares(s, &t)) {
            let hop = via.get(&b.address).copied().unwrap_or(b.address);
            let mac = match (macs.get(&hop), hop == b.address) {
                (Some(m), true) => format!("MAC {}", mac_text(m)),
                (Some(m), false) => format!("via {hop}, MAC {}", mac_text(m)),
                (None, true) => "MAC unresolved: its packets are dropped (no_mac) until it answers ARP/ND".to_string(),
                (None, false) => format!("via {hop}, MAC unresolved: its packets are dropped (no_mac) until the router answers ARP/ND"),
            };
            log(format!(
                "  backend {} weight {}: {} slots ({:.2}%), {mac}",
                backend_label(b),
                b.weight,
                share.slots,
                share.share * 100.0
            ));
        }
    }
    // Announced only now: the program is attached and serving every VIP.
    if let Some(a) = announcer.as_mut() {
        a.sync(&mut nl, &vips_of(&pool))?;
        if pinning.is_some() {
            // For `lb detach`, which withdraws them, whoever runs it.
            dp.set_announce_ifindex(a.ifindex)?;
        }
    }
    log(format!(
        "serving; watching {} for changes (SIGHUP reloads too); Ctrl-C or SIGTERM {}",
        plan.config.display(),
        if plan.pin.is_some() { "stops lb and leaves the data plane pinned (lb detach removes it)" } else { "detaches" }
    ));

    let mut server = Server {
        plan: &plan,
        ifc: &ifc,
        dp: &mut dp,
        nl: &mut nl,
        events: &mut events,
        signals: &signals,
        watcher,
        debounce: Debounce::new(plan.reload_delay, RELOAD_MAX_WAIT),
        content: digest(content),
        backends,
        via,
        sources,
        mtu,
        vips: pool.services.iter().map(|s| s.vip).collect(),
        failing: HashSet::new(),
        last_read_error: None,
        configured: pool.clone(),
        health: HealthMap::new(),
        prober: Prober::new(PROBE_WORKERS)?,
        metrics,
        announcer,
        xdp_mode: match &xdp {
            Attachment::Link(l) => l.mode.as_str().to_string(),
            Attachment::Pinned(_) => "adopted".to_string(),
        },
        next_probe: HashMap::new(),
        probes_due: Some(Instant::now()),
        failing_open: Vec::new(),
    };
    let stop = server.serve()?;
    let mut announcer = server.announcer.take();
    if let (Some(a), None) = (announcer.as_mut(), &pinning) {
        // Withdrawn before the program goes: a VIP left local with nothing in front of it
        // would have this host answer its connections with resets.
        a.withdraw_all(&mut nl)?;
    }
    drop(xdp);
    let snap = dp.snapshot()?;
    let what = match &pinning {
        Some(p) => {
            dp.write_meta(attached_ms_of(&p.dir), None, ifc.ifindex)?;
            dp.set_announce_ifindex(announcer.as_ref().map_or(0, |a| a.ifindex))?;
            format!(
                "left the data plane on {} attached and pinned at {}; it forwards with its current tables, and health \
                 checks and reloads wait for the next `lb attach --pin`",
                ifc.name,
                p.dir.display()
            )
        }
        None => format!("detached from {}", ifc.name),
    };
    log(format!(
        "{stop}: {what}; forwarded {}, passed {}, dropped {} ({}); conntrack {}",
        snap.forwarded,
        snap.passed,
        snap.dropped(),
        lb::stats::counter_list(&snap.drops),
        lb::stats::counter_list(&snap.conntrack)
    ));
    Ok(ExitCode::SUCCESS)
}

/// What keeps the program on the interface while this process runs. Held, never read: without
/// --pin, dropping it is what detaches.
#[allow(dead_code)]
enum Attachment {
    /// A link this process made (pinned too, with --pin).
    Link(link::XdpLink),
    /// An adopted pinned link.
    Pinned(std::os::fd::OwnedFd),
}

/// When the pinned data plane was first attached, as its lb_meta says.
fn attached_ms_of(dir: &Path) -> u64 {
    lb::dataplane::PinnedMaps::open(dir).ok().and_then(|m| m.meta().ok().flatten()).map_or(0, |m| m.attached_ms)
}

/// Takes over a pinned data plane: rebuilds the state from its maps, applies the pool as a
/// reload (only what differs is written), carries the flow table over if its layout changed,
/// and replaces the program in the pinned link atomically.
#[allow(clippy::too_many_arguments)]
fn adopt(
    dp: &mut Plane,
    pool: &Pool,
    ifc: &Interface,
    macs: &HashMap<IpAddr, [u8; 6]>,
    p: &crate::persist::Pinning,
    f: crate::persist::Found,
    fresh: &[&str],
    started_ms: u64,
) -> Result<Attachment> {
    let t0 = Instant::now();
    dp.adopt(pool).context("reading the pinned data plane's state")?;
    let applied = dp.install(pool, ifc.mac, &|a| macs.get(&a).copied()).context("applying the pool to the adopted maps")?;
    let switch = || lb::dataplane::pin::link_update(&f.link, &dp.program_fd());
    let carried = if fresh.contains(&"flows") {
        dp.carry_flows(&p.dir.join("flows"), f.prog_id, switch)?
    } else {
        switch()?;
        0
    };
    if !fresh.is_empty() {
        dp.pin_maps(&p.dir, Some(fresh))?;
    }
    dp.write_meta(f.attached_ms, Some((std::process::id(), started_ms)), ifc.ifindex)?;
    let new_prog = dp.program_id()?;
    log(format!(
        "adopted the data plane pinned at {} on {} (link {}): program {} -> {}{}; {} in {:.1} ms ({} ms after this process started)",
        p.dir.display(),
        ifc.name,
        f.link_id,
        f.prog_id,
        new_prog,
        if f.same_layout {
            String::new()
        } else {
            format!(" (an upgrade: new maps for {}; {carried} tracked flows carried over)", fresh.join(", "))
        },
        describe_touched(&applied.touched),
        t0.elapsed().as_secs_f64() * 1e3,
        lb::dataplane::pin::now_ms().saturating_sub(started_ms)
    ));
    Ok(Attachment::Pinned(f.link))
}

/// `b1 10.0.0.1` for a named backend, `10.0.0.1` otherwise.
fn backend_label(b: &config::Backend) -> String {
    match &b.name {
        Some(n) => format!("{n} {}", b.address),
        None => b.address.to_string(),
    }
}

/// Where each backend's frames go, and every reason the pool cannot be served from `ifc`.
/// L2 direct server return sends a frame straight to a backend's MAC, so those backends must be
/// directly connected to the interface; an encapsulated backend may be anywhere the routing
/// table reaches through the interface, and its frames go to the next hop. A VIP held by another
/// interface arrives there, not here. Every problem is reported, each at its place in the file.
fn next_hops(
    file: &Path,
    text: &str,
    pool: &Pool,
    ifc: &Interface,
    nl: &mut netlink::Socket,
    known_vips: &[IpAddr],
    announce: Option<&str>,
) -> (Vec<config::ConfigError>, HashMap<IpAddr, IpAddr>) {
    let name_of = |idx: u32| nix::net::if_::if_indextoname(idx).map_or(format!("ifindex {idx}"), |n| n.to_string_lossy().into_owned());
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
            None if !problems.is_empty() || known_vips.contains(&s.vip) => {}
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
            let hop = match nl.route_get(b.address) {
                Err(e) if encap => Err(format!("{} has no route from this host ({})", b.address, os_text(&e))),
                Err(e) => Err(format!("{} has no route from this host ({}); it must be on {}'s link", b.address, os_text(&e), ifc.name)),
                Ok(r) if r.kind == netlink::RTN_LOCAL => Err(format!(
                    "{} is an address of this host; a backend must be another machine{}",
                    b.address,
                    if encap { String::new() } else { format!(" on {}'s link", ifc.name) }
                )),
                Ok(r) if r.oif != Some(ifc.ifindex) && encap => Err(format!(
                    "{} is reached through {}, not {}; lb sends encapsulated packets back out of the interface they came in on",
                    b.address,
                    r.oif.map_or("no interface".to_string(), name_of),
                    ifc.name
                )),
                Ok(r) if r.oif != Some(ifc.ifindex) => Err(format!(
                    "{} is reached through {}, not {}; L2 direct server return needs every backend on {}'s link",
                    b.address,
                    r.oif.map_or("no interface".to_string(), name_of),
                    ifc.name,
                    ifc.name
                )),
                Ok(r) => match r.gateway {
                    Some(g) if encap => Ok(g),
                    Some(g) => Err(format!(
                        "{} is behind the router {g}, not on {}'s link; L2 direct server return sends frames straight to a \
                         backend's MAC (`forward: ipip` or `gue` reach backends behind routers)",
                        b.address, ifc.name
                    )),
                    None => Ok(b.address),
                },
            };
            match hop {
                Ok(n) => {
                    via.insert(b.address, n);
                }
                Err(why) => problems.push(config::field_error(file, text, &field, why)),
            }
        }
    }
    (problems, via)
}

/// Every neighbour the pool's frames go to (backends on the link, next hops of the others),
/// once each, in pool order.
fn distinct_neighbours(pool: &Pool, via: &HashMap<IpAddr, IpAddr>) -> Vec<IpAddr> {
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
fn resolve_initial(
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

/// `source 10.0.0.2 (IPv4, fixed), 10.1.0.0/24 (IPv6, varies per flow)`.
fn describe_sources(s: &EncapSources) -> String {
    let one = |a: String, len: u8, full: u8| {
        if len >= full {
            format!("source {a}")
        } else {
            format!("source {a}/{len} (host bits vary per flow)")
        }
    };
    let mut parts = Vec::new();
    if let Some((a, len)) = s.v4 {
        parts.push(one(a.to_string(), len, 32));
    }
    if let Some((a, len)) = s.v6 {
        parts.push(one(a.to_string(), len, 128));
    }
    if parts.is_empty() {
        "no source address".to_string()
    } else {
        parts.join(", ")
    }
}

/// `web changed (b2 removed; 16827 slots written), dns added (65537 slots written)`.
fn describe_touched(touched: &[lb::plan::Touched]) -> String {
    if touched.is_empty() {
        return "no service changed".to_string();
    }
    let what: Vec<String> = touched
        .iter()
        .map(|t| {
            let mut parts = t.notes.clone();
            parts.push(format!("{} slots written", t.slots_written));
            format!("{} {} ({})", t.name, t.change, parts.join("; "))
        })
        .collect();
    what.join(", ")
}

fn digest(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(bytes, 0)
}

/// The foreground loop's state.
struct Server<'a> {
    plan: &'a Settings,
    ifc: &'a Interface,
    dp: &'a mut Plane,
    nl: &'a mut netlink::Socket,
    events: &'a mut netlink::Socket,
    signals: &'a SignalFd,
    watcher: Option<Watcher>,
    debounce: Debounce,
    /// Digest of the file content last read (applied or refused): the same content again is
    /// not reloaded, nor its error logged again.
    content: u64,
    /// The neighbours the pool's frames go to (backends on the link, next hops of the others).
    backends: Vec<IpAddr>,
    /// Each backend address's neighbour.
    via: HashMap<IpAddr, IpAddr>,
    sources: EncapSources,
    mtu: u32,
    vips: Vec<IpAddr>,
    /// Backends whose resolution failed and was reported.
    failing: HashSet<IpAddr>,
    last_read_error: Option<String>,
    /// The pool as the file says; what is installed is this with health applied.
    configured: Pool,
    health: HealthMap,
    prober: Prober,
    /// When each checked backend is probed next.
    next_probe: HashMap<(String, String), Instant>,
    /// The earliest of those (None: nothing is checked); recomputed after every reload.
    probes_due: Option<Instant>,
    /// Services whose every backend is down, served as if all were up.
    failing_open: Vec<String>,
    metrics: Option<crate::serve_metrics::Metrics>,
    announcer: Option<crate::announce::Announcer>,
    xdp_mode: String,
}

/// `b1 10.0.0.1` for a named backend, `10.0.0.1` otherwise; by identity.
fn label_of(pool: &Pool, service: &str, identity: &str) -> String {
    pool.service(service)
        .and_then(|s| s.backends.iter().find(|b| b.identity() == identity))
        .map_or(identity.to_string(), backend_label)
}

impl Server<'_> {
    /// Queues the probes that are due; returns when the next one is.
    fn schedule_probes(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for s in &self.configured.services {
            let Some(check) = &s.health_check else { continue };
            for b in s.backends.iter().filter(|b| b.weight > 0) {
                let key = (s.name.clone(), b.identity());
                let due = *self.next_probe.entry(key.clone()).or_insert(now);
                let due = if due <= now {
                    self.prober.submit(Job { key: key.clone(), addr: SocketAddr::new(b.address, check.port), check: check.clone() });
                    let again = now + check.interval;
                    self.next_probe.insert(key, again);
                    again
                } else {
                    due
                };
                next = Some(next.map_or(due, |n| n.min(due)));
            }
        }
        next
    }

    /// Takes the probe results that arrived; when a backend changes state, installs the pool
    /// with health applied.
    fn health_results(&mut self) -> Result<()> {
        let mut changed = false;
        for (key, result, took) in self.prober.drain() {
            if let Some(m) = &self.metrics {
                m.probe(&key.0, result.is_ok(), took);
            }
            let Some(check) = self.configured.service(&key.0).and_then(|s| s.health_check.clone()) else { continue };
            let h = self.health.entry(key.clone()).or_default();
            let label = label_of(&self.configured, &key.0, &key.1);
            match h.record(result, check.rise, check.fall) {
                Some(Transition::Down { failures, reason }) => {
                    log(format!(
                        "health: {} backend {label} is down after {failures} failed probes ({reason}); its slots go to the others",
                        key.0
                    ));
                    changed = true;
                }
                Some(Transition::Up { successes }) => {
                    log(format!("health: {} backend {label} is up after {successes} good probes; its slots come back", key.0));
                    changed = true;
                }
                None => {}
            }
        }
        if changed {
            self.install_effective("health")?;
        }
        Ok(())
    }

    /// Installs the configured pool with health applied, and says what that changed.
    fn install_effective(&mut self, why: &str) -> Result<Option<lb::dataplane::Applied>> {
        let (pool, open) = health::effective(&self.configured, &self.health);
        for s in &open {
            if !self.failing_open.contains(s) {
                log(format!("health: every backend of {s} is down; serving {s} with all of them (fail open) until one is up"));
            }
        }
        for s in &self.failing_open {
            if !open.contains(s) && self.configured.service(s).is_some() {
                log(format!("health: {s} has a healthy backend again; unhealthy ones are left out again"));
            }
        }
        self.failing_open = open;
        let applying = Instant::now();
        match self.dp.apply(&pool) {
            Ok(applied) => {
                self.publish();
                if why == "health" {
                    log(format!(
                        "health: applied in {:.1} ms: {}",
                        applying.elapsed().as_secs_f64() * 1e3,
                        describe_touched(&applied.touched)
                    ));
                }
                Ok(Some(applied))
            }
            Err(e) if why == "health" => {
                log(format!("health: could not apply ({e:#}); the current tables keep serving"));
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// `web: b1 10.0.0.1 healthy, b2 10.0.0.2 down (timeout)` for every checked service.
    fn health_summary(&self) -> Vec<String> {
        let mut out = Vec::new();
        for s in self.configured.services.iter().filter(|s| s.health_check.is_some()) {
            let states: Vec<String> = s
                .backends
                .iter()
                .map(|b| {
                    let h = self.health.get(&(s.name.clone(), b.identity())).map_or("healthy".to_string(), |h| h.describe());
                    format!("{} {h}", backend_label(b))
                })
                .collect();
            out.push(format!("{}: {}", s.name, states.join(", ")));
        }
        out
    }

    /// Serves until a stop signal; returns its name.
    fn serve(&mut self) -> Result<String> {
        let started = Instant::now();
        self.publish();
        let mut next_refresh = started + NEIGHBOUR_REFRESH;
        let mut next_tick = started + CLOCK_TICK;
        let mut next_recheck = started + self.plan.recheck_interval;
        let mut next_stats = self.plan.stats_interval.map(|i| started + i);
        let mut last_stats: Option<(Instant, stats::Snapshot)> = None;
        loop {
            let now = Instant::now();
            let mut wake = next_refresh.min(next_recheck).min(next_tick);
            if let Some(t) = next_stats {
                wake = wake.min(t);
            }
            if let Some(t) = self.debounce.due() {
                wake = wake.min(t);
            }
            // Scanning every checked backend only when a probe is due, not on every wake-up.
            if self.probes_due.is_some_and(|due| now >= due) {
                self.probes_due = self.schedule_probes(now);
            }
            if let Some(t) = self.probes_due {
                wake = wake.min(t);
            }
            let timeout = PollTimeout::try_from(wake.saturating_duration_since(now)).unwrap_or(PollTimeout::MAX);
            {
                let mut fds = vec![
                    PollFd::new(self.signals.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.events.as_fd(), PollFlags::POLLIN),
                ];
                fds.push(PollFd::new(self.prober.as_fd(), PollFlags::POLLIN));
                if let Some(w) = &self.watcher {
                    fds.push(PollFd::new(w.as_fd(), PollFlags::POLLIN));
                }
                match poll(&mut fds, timeout) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(e).context("waiting for events"),
                }
            }

            while let Ok(Some(sig)) = self.signals.read_signal() {
                match Signal::try_from(sig.ssi_signo as i32) {
                    Ok(Signal::SIGHUP) => self.reload("SIGHUP")?,
                    Ok(s) => return Ok(s.as_str().to_string()),
                    Err(_) => return Ok("a signal".to_string()),
                }
            }
            self.neighbour_events()?;
            self.health_results()?;
            if let Some(w) = &mut self.watcher {
                let seen = w.read();
                if seen.lost {
                    w.arm();
                }
                if seen.changed {
                    self.debounce.event(Instant::now(), seen.writing);
                }
            }
            if self.debounce.fire(Instant::now()) {
                self.reload("file changed")?;
            }

            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + CLOCK_TICK;
                self.dp.tick()?;
            }
            if now >= next_recheck {
                next_recheck = now + self.plan.recheck_interval;
                let rearmed = self.watcher.as_mut().is_some_and(|w| w.arm());
                self.reload(if rearmed { "watch re-armed" } else { "periodic check" })?;
            }
            if now >= next_refresh || self.events.take_route_changes() {
                if now >= next_refresh {
                    next_refresh = now + NEIGHBOUR_REFRESH;
                    ensure_present(self.ifc)?;
                }
                self.refresh_routes()?;
                refresh_neighbours(self.dp, self.ifc, self.nl, &self.backends, &mut self.failing)?;
                self.publish();
            }
            if let (Some(interval), Some(due)) = (self.plan.stats_interval, next_stats) {
                if now >= due {
                    next_stats = Some(due + interval);
                    let mut snap = self.dp.snapshot()?;
                    for s in snap.services.iter_mut() {
                        if self.configured.service(&s.name).is_some_and(|c| c.health_check.is_some()) {
                            for b in s.backends.iter_mut() {
                                let h = self.health.get(&(s.name.clone(), b.label.clone()));
                                b.health = Some(h.map_or("healthy".to_string(), |h| h.describe()));
                            }
                        }
                    }
                    let seconds = last_stats.as_ref().map_or(now - started, |(t, _)| now - *t).as_secs_f64();
                    let uptime = (now - started).as_secs_f64();
                    let mut out = std::io::stdout().lock();
                    write!(out, "{}", stats::text(&snap, last_stats.as_ref().map(|(_, s)| s), seconds, uptime))?;
                    out.flush()?;
                    last_stats = Some((now, snap));
                }
            }
        }
    }

    fn neighbour_events(&mut self) -> Result<()> {
        match self.events.drain_neighbour_events() {
            Ok(list) if list.is_empty() => {}
            Ok(list) => {
                let ours: HashSet<IpAddr> = self.backends.iter().copied().collect();
                for n in list.iter().filter(|n| n.ifindex == self.ifc.ifindex && ours.contains(&n.addr)) {
                    apply_neighbour(self.dp, n, &mut self.failing)?;
                }
            }
            Err(e) => {
                log(format!("neighbour events were lost ({e}); re-reading the table"));
                refresh_neighbours(self.dp, self.ifc, self.nl, &self.backends, &mut self.failing)?;
            }
        }
        Ok(())
    }

    /// Re-reads the pool file by path and, when its content changed and is valid, applies it.
    /// Anything wrong is logged and changes nothing: the tables being served stay.
    fn reload(&mut self, why: &str) -> Result<()> {
        let path = &self.plan.config;
        let started = Instant::now();
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                let msg = config::io_message(&e);
                if self.last_read_error.as_deref() != Some(&msg) {
                    log(format!("reload ({why}): {}: {msg}; the current tables keep serving", path.display()));
                    self.last_read_error = Some(msg);
                }
                return Ok(());
            }
        };
        self.last_read_error = None;
        let d = digest(&bytes);
        if d == self.content {
            self.count_reload(crate::serve_metrics::ReloadResult::Unchanged, None);
            if why == "SIGHUP" {
                log(format!("reload (SIGHUP): {} is unchanged", path.display()));
            }
            return Ok(());
        }
        self.content = d;
        let pool = match config::parse_bytes(path, &bytes) {
            Ok(p) => p,
            Err(e) => {
                log(format!("reload refused ({why}): {e}; the current tables keep serving"));
                self.count_reload(crate::serve_metrics::ReloadResult::Refused, None);
                return Ok(());
            }
        };
        let text = String::from_utf8_lossy(&bytes);
        let (problems, via) = next_hops(path, &text, &pool, self.ifc, self.nl, &self.vips, self.plan.announce.as_deref());
        if !problems.is_empty() {
            log(format!("reload refused ({why}): {} cannot serve the new pool; the current tables keep serving:", self.ifc.name));
            for p in problems {
                log(format!("  {p}"));
            }
            self.count_reload(crate::serve_metrics::ReloadResult::Refused, None);
            return Ok(());
        }
        let sources = match link::interface(&self.ifc.name)
            .map_err(|e| format!("{e:#}"))
            .and_then(|ifc| encap_sources(self.plan, &ifc, &pool))
        {
            Ok(s) => s,
            Err(e) => {
                log(format!("reload refused ({why}): {e}; the current tables keep serving"));
                self.count_reload(crate::serve_metrics::ReloadResult::Refused, None);
                return Ok(());
            }
        };
        if sources != self.sources {
            self.dp.set_encap_sources(sources.v4, sources.v6)?;
            log(format!("encapsulated packets: {}", describe_sources(&sources)));
            self.sources = sources;
        }
        for (&addr, &hop) in &via {
            self.dp.set_via(addr, hop)?;
        }
        self.via = via.clone();
        let backends = distinct_neighbours(&pool, &via);
        self.resolve_new(&backends)?;
        let applying = Instant::now();
        // Health of backends that stay is kept; new ones start healthy and are probed at once.
        let previous = std::mem::replace(&mut self.configured, pool.clone());
        let kept_health = self.health.clone();
        health::retain(&mut self.health, &pool);
        self.probes_due = Some(Instant::now());
        self.next_probe.retain(|k, _| {
            pool.service(&k.0).is_some_and(|s| s.health_check.is_some() && s.backends.iter().any(|b| b.identity() == k.1))
        });
        // VIPs the new pool drops are withdrawn before their services go.
        if let Some(a) = self.announcer.as_mut() {
            let keep: std::collections::BTreeSet<IpAddr> = vips_of(&pool).intersection(&self.vips.iter().copied().collect()).copied().collect();
            a.sync(self.nl, &keep)?;
        }
        match self.install_effective("reload") {
            Ok(Some(applied)) => {
                if let Some(a) = self.announcer.as_mut() {
                    a.sync(self.nl, &vips_of(&pool))?;
                }
                let done = Instant::now();
                self.count_reload(crate::serve_metrics::ReloadResult::Applied, Some(done - applying));
                log(format!(
                    "reload ({why}): {} applied in {:.1} ms ({:.1} ms since reading it): {}",
                    path.display(),
                    (done - applying).as_secs_f64() * 1e3,
                    (done - started).as_secs_f64() * 1e3,
                    describe_touched(&applied.touched)
                ));
                for line in self.health_summary() {
                    log(format!("  health: {line}"));
                }
                self.backends = backends;
                self.vips = pool.services.iter().map(|s| s.vip).collect();
            }
            Ok(None) => {}
            Err(e) => {
                self.configured = previous;
                self.health = kept_health;
                log(format!("reload refused ({why}): {e:#}; the current tables keep serving"));
                self.count_reload(crate::serve_metrics::ReloadResult::Refused, None);
            }
        }
        Ok(())
    }

    fn count_reload(&self, result: crate::serve_metrics::ReloadResult, apply: Option<Duration>) {
        if let Some(m) = &self.metrics {
            m.reload(result, apply);
        }
    }

    /// Publishes what is configured and served to the metrics thread.
    fn publish(&self) {
        let Some(m) = &self.metrics else { return };
        m.publish(self.model());
    }

    fn model(&self) -> lb::metrics::Model {
        use lb::metrics::{BackendModel, Model, ServiceModel};
        let mut services = Vec::new();
        for live in self.dp.installed() {
            let Some(conf) = self.configured.service(&live.name) else { continue };
            let mut owned: HashMap<u32, u64> = HashMap::new();
            for &o in &live.owners {
                *owned.entry(o).or_default() += 1;
            }
            let backends = live
                .backends
                .iter()
                .map(|b| {
                    let configured = conf.backends.iter().find(|c| c.identity() == b.identity);
                    let checked = conf.health_check.is_some();
                    let h = self.health.get(&(live.name.clone(), b.identity.clone()));
                    let healthy = h.is_none_or(|h| h.healthy);
                    BackendModel {
                        id: b.id,
                        identity: b.identity.clone(),
                        address: b.address.to_string(),
                        weight: configured.map_or(b.weight, |c| c.weight),
                        effective_weight: if live.empty { 0 } else { b.weight * (b.state == config::BackendState::Active) as u32 },
                        slots: owned.get(&b.id).copied().unwrap_or(0),
                        healthy,
                        health: if !checked { "not checked".to_string() } else { h.map_or("healthy".to_string(), |h| h.describe()) },
                        state: configured.map_or("active", |c| c.state.as_str()).to_string(),
                        mac_known: self.dp.mac(self.dp.neighbour_of(b.address)).is_some(),
                    }
                })
                .collect();
            services.push(ServiceModel {
                name: live.name.clone(),
                vip: conf.vip.to_string(),
                port: conf.port,
                protocol: conf.protocol.as_str().to_string(),
                algorithm: conf.algorithm.as_str().to_string(),
                hash: conf.hash.as_str().to_string(),
                forward: conf.forward.as_str().to_string(),
                slots: live.slots,
                backends,
            });
        }
        Model {
            version: env!("CARGO_PKG_VERSION").to_string(),
            interface: self.ifc.name.clone(),
            xdp_mode: self.xdp_mode.clone(),
            program_id: self.dp.program_id().unwrap_or(0),
            flow_capacity: flow_table_slots(self.plan.conntrack_size) as u64,
            services,
        }
    }

    /// Follows the routing table: an encapsulated backend whose next hop changed is sent to the
    /// new one (whose MAC the neighbour refresh then resolves); the interface's MTU is re-read.
    /// A backend that lost its route keeps its last next hop, with a warning.
    fn refresh_routes(&mut self) -> Result<()> {
        let mtu = interface_mtu(self.ifc);
        if mtu != self.mtu {
            self.dp.set_mtu(mtu)?;
            log(format!("{}'s MTU changed from {} to {mtu}", self.ifc.name, self.mtu));
            self.mtu = mtu;
        }
        let mut seen = HashSet::new();
        let encapsulated: Vec<IpAddr> = self
            .configured
            .services
            .iter()
            .filter(|s| s.forward.encapsulates())
            .flat_map(|s| &s.backends)
            .map(|b| b.address)
            .filter(|a| seen.insert(*a))
            .collect();
        for addr in encapsulated {
            let hop = match self.nl.route_get(addr) {
                Ok(r) if r.kind != netlink::RTN_LOCAL && r.oif == Some(self.ifc.ifindex) => {
                    self.failing.remove(&addr);
                    r.gateway.unwrap_or(addr)
                }
                Ok(_) | Err(_) => {
                    if self.failing.insert(addr) {
                        log(format!("backend {addr} has no route out of {} any more; keeping its last next hop", self.ifc.name));
                    }
                    continue;
                }
            };
            if self.dp.set_via(addr, hop)? {
                log(format!("backend {addr} is now reached via {hop}"));
                self.via.insert(addr, hop);
                if !self.backends.contains(&hop) {
                    self.backends.push(hop);
                }
            }
        }
        Ok(())
    }

    /// MACs for backend addresses the data plane does not know yet: from the neighbour table,
    /// else primed and waited for briefly; still-unknown ones resolve later through events.
    fn resolve_new(&mut self, backends: &[IpAddr]) -> Result<()> {
        let missing: Vec<IpAddr> = backends.iter().copied().filter(|a| self.dp.mac(*a).is_none()).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut all = self.backends.clone();
        all.extend(missing.iter().copied());
        self.backends = all;
        refresh_neighbours(self.dp, self.ifc, self.nl, &missing, &mut self.failing)?;
        let deadline = Instant::now() + RELOAD_RESOLVE;
        while missing.iter().any(|a| self.dp.mac(*a).is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut fds = [PollFd::new(self.events.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX));
            self.neighbour_events()?;
        }
        Ok(())
    }
}

/// A neighbour change for a backend address: take a new MAC; on loss, keep the last known one
/// (the backend most likely still has it) and ask the kernel to resolve again.
fn apply_neighbour(dp: &mut Plane, n: &Neighbour, failing: &mut HashSet<IpAddr>) -> Result<()> {
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
fn refresh_neighbours(
    dp: &mut Plane,
    ifc: &Interface,
    nl: &mut netlink::Socket,
    backends: &[IpAddr],
    failing: &mut HashSet<IpAddr>,
) -> Result<()> {
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
