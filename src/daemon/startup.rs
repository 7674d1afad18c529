//! `lb attach` up to serving: every check that can fail runs before anything is attached (the
//! privileges, the interface, the pin directory, every backend's next hop, the encapsulation
//! sources), so an error leaves nothing behind; then the backends' MACs are resolved, the
//! program loaded and configured, and attached (or a pinned data plane adopted), and the VIPs
//! announced once they are served.

use std::collections::HashMap;
use std::net::IpAddr;

use anyhow::{bail, Context, Result};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use lb::config::Pool;
use lb::dataplane::link::{self, mac_text, Interface};
use lb::dataplane::netlink;
use lb::{report, table};

use super::announce::{vips_of, Announcer};
use super::describe::backend_label;
use super::encap::{interface_mtu, sources_for, Encap, EncapSources};
use super::fleet::Fleet;
use super::agents::Agents;
use super::health::HealthChecks;
use super::metrics_http::{self, Metrics, Publisher};
use super::neighbours::{distinct_neighbours, next_hops, resolve_initial, Neighbours};
use super::pinning::{self, Attachment, Found, Pinning};
use super::state::Daemon;
use super::watch::Watcher;
use crate::log::log;
use lb::balancer::Balancer;
use crate::settings::Settings;
use crate::xdp::{already_attached, attach_with_mode, check_privileges};

/// A data plane attached and serving, and what the serve loop and the shutdown need besides.
pub(super) struct Started<'a> {
    pub(super) daemon: Daemon<'a>,
    /// Dropping it detaches (without --pin).
    pub(super) attachment: Attachment,
    pub(super) pinning: Option<Pinning>,
    pub(super) signals: SignalFd,
    pub(super) watcher: Option<Watcher>,
}

/// What the checks found, before anything was changed.
struct Checked {
    started_ms: u64,
    ifc: Interface,
    pinning: Option<Pinning>,
    found: Option<Found>,
    nl: netlink::Socket,
    via: HashMap<IpAddr, IpAddr>,
    sources: EncapSources,
    announcer: Option<Announcer>,
}

/// Starts serving `pool`; None when a stop signal came before anything was attached.
pub(super) fn start<'a>(settings: &'a Settings, pool: Pool, content: &[u8], first: Option<crate::store::FirstRead>) -> Result<Option<Started<'a>>> {
    let Checked { started_ms, ifc, pinning, found, mut nl, via, sources, mut announcer } = check(settings, &pool, content)?;
    // Before anything serves the new pool: a VIP it lacks must not stay announced, nor (with no
    // pinned data plane to adopt) any VIP before the program that serves it is attached.
    let withdrawn = announcer.as_mut().map_or(0, |a| a.withdraw_leftovers(&mut nl, &vips_of(&pool), found.is_some()));
    let signals = block_signals()?;
    // Subscribe before the first dump, so that no change falls between the two.
    let mut events = netlink::Socket::neighbour_events().context("subscribing to neighbour changes")?;
    let list = distinct_neighbours(&pool, &via);
    let Some(macs) = resolve_initial(&list, &ifc, &mut nl, &mut events, &signals, settings.resolve_timeout)? else {
        match withdrawn {
            0 => log("interrupted before attaching; nothing was changed"),
            n => log(format!("interrupted before attaching; nothing was changed but the {n} leftover VIPs withdrawn")),
        }
        return Ok(None);
    };
    // Watch before loading: a change made while we attach is seen.
    let watcher = watch(settings);
    let reuse = pinning.as_ref().zip(found.as_ref()).map(|(p, f)| pinning::reuse(p, f));
    let (mut dp, fresh) = Balancer::load_with(settings.table_capacity, settings.conntrack_size, reuse.as_ref())?;
    // Bound before anything is attached or changed (a reused plane's settings included): a bad
    // address or a port in use stops here.
    let metrics = start_metrics(settings, &dp)?;
    dp.set_conntrack_timeouts(settings.conntrack_timeouts.0, settings.conntrack_timeouts.1)?;
    dp.set_conntrack_guard(settings.conntrack_guard)?;
    dp.set_quic_decode_budget(settings.quic_decode_budget)?;
    let encap = Encap::start(&mut dp, sources, interface_mtu(&ifc))?;
    let mut neighbours = Neighbours::new(events, list);
    neighbours.set_via(&mut dp, via)?;
    // Load-aware services' weights are written in steps from the start, at full capacity
    // until their agents answer (lb::load).
    // A restart that adopts a pinned plane goes on from the weights it serves.
    let mut agents = Agents::new(&pool)?;
    let served = lb::load::at_full_capacity(&pool);
    let attachment = match (&pinning, found) {
        (Some(p), Some(f)) => {
            let seeded = |dp: &Balancer| {
                agents.seed(&pool, dp.installed());
                agents.apply(&pool, &pool)
            };
            pinning::adopt(&mut dp, &served, seeded, &ifc, &macs, p, f, &fresh, started_ms)?
        }
        _ => attach_new(settings, &mut dp, &served, &ifc, &macs, pinning.as_ref(), started_ms)?,
    };
    log_pool(&pool, &neighbours, &macs, &encap);
    // Announced only now: the program is attached and serving every VIP.
    if let Some(a) = announcer.as_mut() {
        a.sync(&mut nl, &vips_of(&pool))?;
        if pinning.is_some() {
            // For `lb detach`, which withdraws them, whoever runs it.
            dp.set_announce_ifindex(a.ifindex)?;
        }
    }
    // A status file a store-mode controller left behind (killed) is not this one's word.
    let _ = std::fs::remove_file(super::fleet::status_path(&ifc.name));
    let fleet = match (&settings.store, first) {
        (Some(st), Some((client, snap))) => Some(Fleet::start(st.url.clone(), st.node.clone(), client, &snap)?),
        _ => None,
    };
    let stop = if settings.pin.is_some() { "stops lb and leaves the data plane pinned (lb detach removes it)" } else { "detaches" };
    match &fleet {
        Some(f) => log(format!(
            "serving; following {} from revision {} (pool revision {}) as node {}; Ctrl-C or SIGTERM {stop}",
            f.url, f.revision, f.pool_revision, f.node
        )),
        None => log(format!("serving; watching {} for changes (SIGHUP reloads too); Ctrl-C or SIGTERM {stop}", settings.config.display())),
    }
    let metrics = Publisher::new(metrics, &ifc.name, attachment.mode(), settings.conntrack_size);
    let mut daemon = Daemon { settings, ifc, dp, nl, configured: pool, neighbours, encap, health: HealthChecks::new()?, agents, announcer, metrics, fleet };
    daemon.refresh_digests();
    daemon.publish_view();
    Ok(Some(Started { daemon, attachment, pinning, signals, watcher }))
}

/// Every check that can fail before anything is changed (but the --announce device, created
/// if missing).
fn check(settings: &Settings, pool: &Pool, content: &[u8]) -> Result<Checked> {
    let started_ms = lb::clock::unix_ms();
    check_privileges()?;
    let ifc = link::interface(&settings.iface)?;
    let (pinning, found) = match &settings.pin {
        Some(root) => {
            let (p, f) = pinning::prepare(root, &ifc)?;
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
    let (problems, via) = next_hops(&settings.config, &text, pool, &ifc, &mut nl, &[], settings.announce.as_deref());
    if !problems.is_empty() {
        let lines: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
        bail!("{} cannot serve this pool; nothing was attached:\n{}", ifc.name, lines.join("\n"));
    }
    let sources = sources_for(&settings.encap_sources, &ifc, pool).map_err(|e| anyhow::anyhow!("{e}; nothing was attached"))?;
    let announcer = match &settings.announce {
        Some(dev) => Some(Announcer::open(&mut nl, dev, &ifc.name)?),
        None => None,
    };
    if !ifc.up {
        log(format!("warning: {} is down; lb attaches anyway and serves once it is up", ifc.name));
    }
    Ok(Checked { started_ms, ifc, pinning, found, nl, via, sources, announcer })
}

/// Signals are read from a descriptor in the poll loop, so they are blocked first: a Ctrl-C
/// from here on is an orderly stop at the next loop turn.
fn block_signals() -> Result<SignalFd> {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGINT);
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGHUP);
    mask.thread_block().context("blocking SIGINT, SIGTERM and SIGHUP")?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).context("creating a signalfd")
}

/// The pool file's watcher; without one, reloads still happen on SIGHUP and the periodic check.
fn watch(settings: &Settings) -> Option<Watcher> {
    if settings.store.is_some() {
        // The store's watch follows the pool (src/store/feed.rs).
        return None;
    }
    match Watcher::new(&settings.config) {
        Ok(w) => Some(w),
        Err(e) => {
            log(format!("warning: {e:#}; reloads happen on SIGHUP and every {:?} only", settings.recheck_interval));
            None
        }
    }
}

/// `--metrics`: the server bound and started on the loaded plane's counter maps (None without
/// the flag).
fn start_metrics(settings: &Settings, dp: &Balancer) -> Result<Option<Metrics>> {
    match settings.metrics {
        Some(addr) => Ok(Some(metrics_http::start(addr, dp.counter_maps()?, lb::metrics::Model::default(), settings.store.is_some())?)),
        None => Ok(None),
    }
}

/// Fills the maps and attaches the program through a new link (pinned, with --pin).
fn attach_new(
    settings: &Settings,
    dp: &mut Balancer,
    pool: &Pool,
    ifc: &Interface,
    macs: &HashMap<IpAddr, [u8; 6]>,
    pinning: Option<&Pinning>,
    started_ms: u64,
) -> Result<Attachment> {
    dp.install(pool, ifc.mac, &|a| macs.get(&a).copied()).context("filling the BPF maps")?;
    let xdp = attach_with_mode(dp.program_fd(), ifc, settings.mode)?;
    log(format!(
        "attached to {} (ifindex {}, {}) in {} mode: XDP program id {}, link id {}",
        ifc.name,
        ifc.ifindex,
        mac_text(&ifc.mac),
        xdp.mode.as_str(),
        xdp.prog_id,
        xdp.link_id
    ));
    if let Some(p) = pinning {
        pinning::pin_new(dp, p, &xdp, ifc.ifindex, started_ms)?;
    }
    Ok(Attachment::Link(xdp))
}

/// One line per service and per backend: its share of the table and its MAC.
fn log_pool(pool: &Pool, neighbours: &Neighbours, macs: &HashMap<IpAddr, [u8; 6]>, encap: &Encap) {
    if pool.services.iter().any(|s| s.forward.encapsulates()) {
        log(format!("encapsulated packets: {}", encap.summary()));
    }
    for s in &pool.services {
        log(format!("service {}", report::service_summary(s)));
        let t = table::build_service(s);
        for (b, share) in s.backends.iter().zip(table::shares(s, &t)) {
            let hop = neighbours.hop_of(b.address);
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
}
