//! `lb decap IFACE`: the backend side of encapsulated forwarding, for hosts whose kernel has no
//! ipip, ip6tnl or fou driver. Attaches the decapsulation program through a BPF link (so any
//! death of the process detaches it), keeps its set of this host's addresses current (re-read
//! every second: an address added to the host is decapsulated for within a second), and prints
//! its counters on request and at exit.

use std::io::Write;
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use lb::dataplane::decap::{host_addresses, Decap, DecapCounters};
use lb::dataplane::link;

use crate::log::log;
use crate::xdp::{already_attached, attach_with_mode, check_privileges, ensure_present, ModeArg};

/// How often this host's addresses are re-read.
const ADDRESS_REFRESH: Duration = Duration::from_secs(1);

fn counters_text(c: &DecapCounters) -> String {
    format!("decapsulated {}, passed {}, malformed {}", c.decapsulated, c.passed, c.malformed)
}

pub fn run(iface: &str, gue_port: u16, mode: ModeArg, stats_interval: Option<Duration>) -> Result<ExitCode> {
    check_privileges()?;
    let ifc = link::interface(iface)?;
    if let Some(a) = link::attached(ifc.ifindex).with_context(|| format!("querying {}'s XDP program", ifc.name))? {
        return Err(already_attached(&ifc, Some(a)));
    }
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGINT);
    mask.add(Signal::SIGTERM);
    mask.thread_block().context("blocking SIGINT and SIGTERM")?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).context("creating a signalfd")?;

    let mut dp = Decap::load(gue_port)?;
    let addrs = host_addresses()?;
    if addrs.is_empty() {
        bail!("this host has no addresses: nothing would ever be decapsulated");
    }
    dp.set_local(&addrs)?;
    let xdp = attach_with_mode(dp.program_fd(), &ifc, mode)?;
    log(format!(
        "decapsulating IPIP and GUE (port {gue_port}) for this host's {} addresses on {} in {} mode: XDP program id {}, link id {}",
        addrs.len(),
        ifc.name,
        xdp.mode.as_str(),
        xdp.prog_id,
        xdp.link_id
    ));
    log("serving; Ctrl-C or SIGTERM detaches");

    let started = Instant::now();
    let mut next_refresh = started + ADDRESS_REFRESH;
    let mut next_stats = stats_interval.map(|i| started + i);
    let stop = loop {
        let now = Instant::now();
        let wake = next_stats.map_or(next_refresh, |t| t.min(next_refresh));
        let mut fds = [PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::try_from(wake.saturating_duration_since(now)).unwrap_or(PollTimeout::MAX)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e).context("waiting for events"),
        }
        if let Ok(Some(sig)) = signals.read_signal() {
            break Signal::try_from(sig.ssi_signo as i32).map_or("a signal", |s| s.as_str()).to_string();
        }
        let now = Instant::now();
        if now >= next_refresh {
            next_refresh = now + ADDRESS_REFRESH;
            let addrs = host_addresses()?;
            if dp.set_local(&addrs)? {
                log(format!("this host's addresses changed: decapsulating for {} addresses", addrs.len()));
            }
            ensure_present(&ifc)?;
        }
        if let (Some(interval), Some(due)) = (stats_interval, next_stats) {
            if now >= due {
                next_stats = Some(due + interval);
                let mut out = std::io::stdout().lock();
                writeln!(out, "decap stats at {:.1}s: {}", (now - started).as_secs_f64(), counters_text(&dp.counters()?))?;
                out.flush()?;
            }
        }
    };
    drop(xdp);
    log(format!("{stop}: detached from {}; {}", ifc.name, counters_text(&dp.counters()?)));
    Ok(ExitCode::SUCCESS)
}
