//! The one poll loop of `lb attach`: it waits on the signalfd, the neighbour events, the
//! probes' results, the load agents' answers and the pool file's watches, and on the timers (the data plane's clock, the
//! periodic re-check of the file, the neighbour refresh, the stats), and hands each to its room.
//! It decides nothing itself.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;

use super::reload::{Cause, Reloader};
use super::state::Daemon;
use super::stats::StatsPrinter;
use super::watch::{Debounce, Watcher};
use crate::xdp::ensure_present;

/// At most this long after the first event of a burst, a reload happens even if a writer still
/// has the file open.
const RELOAD_MAX_WAIT: Duration = Duration::from_secs(1);

/// How often the data plane's clock record is written and the interface's MAC checked (a
/// changed MAC is followed within this).
const CLOCK_TICK: Duration = Duration::from_millis(250);

/// How often unstable table slots are swept (crates/core/src/stable.rs): a slot that changed owner goes back
/// to lookup-free forwarding of its established flows within this, once no flow tracked
/// elsewhere hashes to it.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// How often the neighbour table is re-read and unresolved or stale backends re-primed, on top
/// of the change events the kernel sends.
const NEIGHBOUR_REFRESH: Duration = Duration::from_secs(5);

/// Serves until a stop signal; returns its name.
pub(super) fn serve(d: &mut Daemon, signals: &SignalFd, mut watcher: Option<Watcher>, mut reloader: Reloader) -> Result<String> {
    let started = Instant::now();
    d.publish();
    let mut debounce = Debounce::new(d.settings.reload_delay, RELOAD_MAX_WAIT);
    let mut next_refresh = started + NEIGHBOUR_REFRESH;
    let mut next_tick = started + CLOCK_TICK;
    let mut next_sweep = started + SWEEP_INTERVAL;
    let mut next_recheck = started + d.settings.recheck_interval;
    let mut stats = StatsPrinter::new(d.settings.stats_interval, started);
    loop {
        let now = Instant::now();
        let mut wake = next_refresh.min(next_recheck).min(next_tick).min(next_sweep);
        // The probes that are due are queued here, before the wait.
        let probes = d.health.schedule(now, &d.configured, &d.dp, &d.ifc);
        let health = d.health.map();
        let asks = d.agents.schedule(&d.configured, |k| health.get(k).is_some_and(|h| !h.healthy));
        for t in [stats.next(), debounce.due(), probes, asks].into_iter().flatten() {
            wake = wake.min(t);
        }
        wait(d, signals, watcher.as_ref(), wake.saturating_duration_since(now))?;

        while let Ok(Some(sig)) = signals.read_signal() {
            match Signal::try_from(sig.ssi_signo as i32) {
                Ok(Signal::SIGHUP) => reloader.reload(d, Cause::Sighup)?,
                Ok(s) => return Ok(s.as_str().to_string()),
                Err(_) => return Ok("a signal".to_string()),
            }
        }
        d.on_neighbour_events()?;
        // Answers first: an install that health causes uses every answer already read.
        d.on_agent_answers()?;
        d.on_probe_results()?;
        // A suspect made or cleared changes no table, but the metrics and the page say so.
        if d.health.take_suspects_changed() {
            d.publish();
        }
        if d.fleet.is_some() {
            // The store's news (pools, the nodes' views) after this node's own observations.
            super::reload::follow_store(d)?;
        }
        if let Some(w) = &mut watcher {
            let seen = w.read();
            if seen.lost {
                w.arm();
            }
            if seen.changed {
                debounce.event(Instant::now(), seen.writing);
            }
        }
        if debounce.fire(Instant::now()) {
            reloader.reload(d, Cause::FileChanged)?;
        }

        let now = Instant::now();
        if now >= next_tick {
            next_tick = now + CLOCK_TICK;
            d.dp.tick()?;
            d.follow_mac()?;
        }
        if now >= next_sweep {
            next_sweep = now + SWEEP_INTERVAL;
            // A sweep that fails leaves slots unstable, which costs lookups, never a flow.
            match d.dp.sweep() {
                Ok(0) => {}
                // The metrics' count of unstable slots follows.
                Ok(_) => d.publish(),
                Err(e) => crate::log::log(format!("lb: sweeping unstable slots: {e:#}")),
            }
        }
        if now >= next_recheck {
            next_recheck = now + d.settings.recheck_interval;
            let rearmed = watcher.as_mut().is_some_and(|w| w.arm());
            reloader.reload(d, if rearmed { Cause::WatchRearmed } else { Cause::Periodic })?;
        }
        if now >= next_refresh || d.neighbours.take_route_changes() {
            if now >= next_refresh {
                next_refresh = now + NEIGHBOUR_REFRESH;
                ensure_present(&d.ifc)?;
            }
            d.refresh()?;
        }
        if stats.due(now) {
            let mut snap = d.dp.snapshot()?;
            d.health.annotate(&d.configured, &mut snap);
            d.agents.annotate(&d.configured, &mut snap);
            stats.print(now, snap)?;
        }
    }
}

/// Waits at most `timeout` for any of the loop's descriptors.
fn wait(d: &Daemon, signals: &SignalFd, watcher: Option<&Watcher>, timeout: Duration) -> Result<()> {
    let mut fds = vec![
        PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        PollFd::new(d.neighbours.as_fd(), PollFlags::POLLIN),
        PollFd::new(d.health.as_fd(), PollFlags::POLLIN),
        PollFd::new(d.health.signals_fd(), PollFlags::POLLIN),
        PollFd::new(d.agents.as_fd(), PollFlags::POLLIN),
    ];
    if let Some(w) = watcher {
        fds.push(PollFd::new(w.as_fd(), PollFlags::POLLIN));
    }
    if let Some(f) = &d.fleet {
        fds.push(PollFd::new(f.as_fd(), PollFlags::POLLIN));
    }
    match poll(&mut fds, PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX)) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(e) => Err(e).context("waiting for events"),
    }
}
