//! `lb attach IFACE --config FILE`: validate, check the interface, resolve backend MACs, load,
//! fill the maps, attach through a BPF link, then serve in the foreground until SIGINT/SIGTERM.
//!
//! One thread and one poll loop over a signalfd, an inotify descriptor, a netlink socket and the
//! probes' wake-up pipe: no async runtime. Every check that can fail runs before the program is
//! attached, so an error leaves nothing behind; once attached, the link's descriptor is the only
//! thing holding the program on the interface, and it closes with the process however the
//! process ends.
//!
//! [`run`] is start-up, serving, shutdown. The rooms, each with the state it owns:
//!
//! - startup.rs: the checks, MAC resolution, load, attach or adopt ([`startup::start`]).
//! - serve.rs: the poll loop; it only dispatches to the rooms below.
//! - state.rs: the [`state::Daemon`] the loop serves with (data plane, interface, netlink, the
//!   pool as configured, and the rooms' state), and the moves that cross rooms.
//! - reload.rs: re-reading the pool file, validating it, handing it on.
//! - neighbours.rs: next hops and MACs, followed through netlink events and refreshes.
//! - encap.rs: outer source addresses and the MTU for encapsulated forwarding.
//! - health.rs, probe.rs: when to probe, the probes' threads, the pool with health applied.
//! - agents.rs: the load agents (asked on probe.rs's threads) and slow start: the pool with
//!   load applied, decided by lb::load.
//! - announce.rs: the VIPs as host addresses of the --announce device.
//! - pinning.rs: --pin: lock, adopt, pin, leave the data plane behind.
//! - metrics_http.rs: the --metrics thread and what the loop publishes to it; http.rs: the
//!   small HTTP/1 server it answers through (deadlines, a bound on connections).
//! - watch.rs: the pool file's inotify watches and the debounce.
//! - fleet.rs: with `--config etcd://...`, the fleet's store as last read (src/store/ follows it
//!   and publishes this node's view), and the decisions the fleet shares; reload.rs applies
//!   the pools it reads, state.rs installs the decisions.
//! - stats.rs: --stats-interval's counters on stdout.
//! - describe.rs: phrases several log lines share.
//!
//! Imports go one way: rooms import none of startup, serve, state or reload (nor each other,
//! but for describe.rs and probe.rs); state.rs imports rooms; reload.rs imports state.rs;
//! startup.rs imports state.rs and the rooms; serve.rs imports state.rs and reload.rs; this
//! module imports startup, serve, state, reload and pinning. The data plane
//! is driven through `lb::balancer::Balancer` everywhere; the few names it needs besides
//! (`Reuse`, `CounterMaps`, the defaults) come from `lb::dataplane` where they are used.

mod agents;
mod announce;
pub(crate) use announce::state_path as announce_state_path;
pub(crate) use fleet::status_path as fleet_status_path;
mod describe;
mod encap;
mod fleet;
mod health;
mod http;
mod metrics_http;
mod neighbours;
mod pinning;
mod probe;
mod signals;
mod reload;
mod serve;
mod startup;
mod state;
mod stats;
mod watch;

use std::process::ExitCode;

use anyhow::Result;

use lb::config::Pool;

use crate::log::log;
use crate::settings::Settings;
use pinning::{Attachment, Pinning};
use reload::Reloader;
use startup::Started;
use state::Daemon;

/// Serves `pool` (read from `content`, or from the store's `first` read) on the interface until
/// a stop signal.
pub fn run(settings: Settings, pool: Pool, content: &[u8], first: Option<crate::store::FirstRead>) -> Result<ExitCode> {
    let Some(Started { mut daemon, attachment, pinning, signals, watcher }) = startup::start(&settings, pool, content, first)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let result = match serve::serve(&mut daemon, &signals, watcher, Reloader::new(&settings.config, content)) {
        Ok(stop) => shutdown(&mut daemon, attachment, pinning.as_ref(), &stop),
        Err(e) => {
            drop(attachment);
            Err(e)
        }
    };
    // However it ended, the data plane's descriptors close before the pin lock goes, so that a
    // next `lb attach --pin` that takes the lock finds this process gone from the maps.
    drop(daemon);
    drop(pinning);
    result
}

/// After a stop signal: without --pin, the VIPs are withdrawn and the program detached; with
/// it, the data plane stays as it is, with no controller. Either way the last line sums up what
/// it counted.
fn shutdown(d: &mut Daemon, attachment: Attachment, pinning: Option<&Pinning>, stop: &str) -> Result<ExitCode> {
    if let (Some(a), None) = (d.announcer.as_mut(), &pinning) {
        // Withdrawn before the program goes: a VIP left local with nothing in front of it
        // would have this host answer its connections with resets.
        a.withdraw_all(&mut d.nl)?;
    }
    drop(attachment);
    let snap = d.dp.snapshot()?;
    let what = match &pinning {
        Some(p) => pinning::leave(&d.dp, p, &d.ifc, d.announcer.as_ref().map_or(0, |a| a.ifindex))?,
        None => format!("detached from {}", d.ifc.name),
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
