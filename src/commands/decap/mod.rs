//! `lb decap IFACE`: the backend side of encapsulated forwarding, for hosts whose kernel has no
//! ipip, ip6tnl or fou driver. Attaches the decapsulation program through a BPF link (so any
//! death of the process detaches it), unwrapping only packets from the sources it was told to
//! trust (`--allow-from`, or explicitly `--allow-any`), keeps its set of this host's addresses
//! current (re-read every second: an address added to the host is decapsulated for within a
//! second), and prints its counters on request and at exit.

use std::io::Write;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use lb::dataplane::decap::{host_addresses, Decap, DecapCounters};
use lb::dataplane::link;

mod allow;
mod hops;

use allow::{allowed, broad_family, source_prefix};
use hops::{loopback_forwarding_off, loopback_forwarding_on, resolve_next_hops, Resolver, RESOLVE_POLL};

use crate::log::log;
use crate::xdp::{already_attached, attach_with_mode, check_privileges, ensure_present, ModeArg};

/// How often this host's addresses are re-read.
const ADDRESS_REFRESH: Duration = Duration::from_secs(1);

/// Where the kernel lists conntrack's BTF when conntrack is a module that is loaded.
const CONNTRACK_BTF: &str = "/sys/kernel/btf/nf_conntrack";

/// `lb decap`'s flags.
#[derive(clap::Args)]
pub struct Args {
    /// The interface encapsulated packets arrive on.
    #[arg(value_name = "IFACE")]
    iface: String,
    /// Unwrap only packets whose outer source lies in PREFIX (10.0.0.0/24, fd00::1/128; an
    /// address alone is a /32 or /128): the load balancers' encapsulation sources. Repeatable.
    /// One of --allow-from and --allow-any is required.
    #[arg(long, value_name = "PREFIX", value_parser = source_prefix)]
    allow_from: Vec<(IpAddr, u8)>,
    /// Unwrap packets from any outer source. Anyone who reaches this host can then hand it a
    /// packet with any source address; for isolated test setups.
    #[arg(long, conflicts_with = "allow_from")]
    allow_any: bool,
    /// The UDP port GUE packets are sent to (the services' `gue_port`).
    #[arg(long, value_name = "PORT", default_value_t = lb::config::DEFAULT_GUE_PORT,
          value_parser = clap::value_parser!(u16).range(1..))]
    gue_port: u16,
    /// Where the program runs: native (driver), generic (any interface, slower), or auto
    /// (native, falling back to generic with a warning).
    #[arg(long, value_enum, default_value = "auto", value_name = "MODE")]
    xdp_mode: ModeArg,
    /// Print the counters every SECS seconds.
    #[arg(long, value_name = "SECS", value_parser = super::values::seconds)]
    stats_interval: Option<Duration>,
    /// Give connections a second chance: a GUE packet with a hop list (a service with
    /// `second_chance: on`) that is not a SYN and finds no connection or SYN cookie of this
    /// host is sent on to the next backend of its list instead of being delivered here. The
    /// other backends must allow this host's address (--allow-from).
    #[arg(long)]
    second_chance: bool,
}

fn counters_text(c: &DecapCounters, second_chance: bool) -> String {
    let mut text = format!(
        "decapsulated {}, passed {}, malformed {}, not_allowed {}, not_local {}, ce_not_ect {}, ecn_anomaly {}",
        c.decapsulated, c.passed, c.malformed, c.not_allowed, c.not_local, c.ce_not_ect, c.ecn_anomaly
    );
    if second_chance {
        text += &format!(
            ", hop_local {}, sent_on {}, exhausted {}, no_route {}, hop_refused {}, unresolved {}",
            c.hop_local, c.sent_on, c.exhausted, c.no_route, c.hop_refused, c.unresolved
        );
    }
    text
}

pub fn run(a: Args) -> Result<ExitCode> {
    // The flags first: a bad command line attaches nothing and touches no kernel object.
    let allow = allowed(&a)?;
    let any = a.allow_any;
    let from = if any {
        "any source".to_string()
    } else {
        allow.iter().map(|(addr, len)| format!("{addr}/{len}")).collect::<Vec<_>>().join(", ")
    };
    let Args { iface, gue_port, xdp_mode: mode, stats_interval, second_chance, .. } = a;
    check_privileges()?;
    let ifc = link::interface(&iface)?;
    if let Some(a) = link::attached(ifc.ifindex).with_context(|| format!("querying {}'s XDP program", ifc.name))? {
        return Err(already_attached(&ifc, Some(a)));
    }
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGINT);
    mask.add(Signal::SIGTERM);
    mask.thread_block().context("blocking SIGINT and SIGTERM")?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).context("creating a signalfd")?;

    let mut dp = Decap::load(gue_port, second_chance)?;
    let forwarding = if second_chance { loopback_forwarding_on()? } else { Vec::new() };
    if second_chance && !dp.has_conntrack() {
        log(
            "second chance: this kernel's conntrack is not loaded (nf_conntrack), so connections this host REDIRECTs or DNATs \
             to another port have no socket second chance can find, and their packets are sent on: where the VIP's port is \
             rewritten, load it before lb decap (modprobe nf_conntrack)",
        );
    }
    if !forwarding.is_empty() {
        log(format!("second chance: turned on {} (the loopback forwards nothing; left on)", forwarding.join(" and ")));
    }
    dp.allow_from(&allow)?;
    let addrs = host_addresses()?;
    if addrs.is_empty() {
        bail!("this host has no addresses: nothing would ever be decapsulated");
    }
    dp.set_local(&addrs)?;
    let xdp = attach_with_mode(dp.program_fd(), &ifc, mode)?;
    if any {
        log("warning: --allow-any: packets from any source are unwrapped; anyone who reaches this host can send it packets with any source address");
    } else if let Some(family) = broad_family(&allow) {
        log(format!(
            "warning: the --allow-from prefixes cover more than half of all {family} addresses: nearly as with --allow-any, \
             almost anyone who reaches this host can send it packets"
        ));
    }
    log(format!(
        "decapsulating IPIP and GUE (port {gue_port}) from {from} for this host's {} addresses on {} in {} mode{}: XDP program id {}, link id {}",
        addrs.len(),
        ifc.name,
        xdp.mode.as_str(),
        if second_chance { ", with second chance" } else { "" },
        xdp.prog_id,
        xdp.link_id
    ));
    log("serving; Ctrl-C or SIGTERM detaches");

    let started = Instant::now();
    let mut next_refresh = started + ADDRESS_REFRESH;
    let mut next_stats = stats_interval.map(|i| started + i);
    let mut next_resolve = second_chance.then(|| started + RESOLVE_POLL);
    let mut resolver = Resolver::new()?;
    let mut seen = Seen::default();
    let stop = loop {
        let now = Instant::now();
        let wake = [next_stats, next_resolve].into_iter().flatten().fold(next_refresh, Instant::min);
        let mut fds = [PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::try_from(wake.saturating_duration_since(now)).unwrap_or(PollTimeout::MAX)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e).context("waiting for events"),
        }
        if let Ok(Some(sig)) = signals.read_signal() {
            break Signal::try_from(sig.ssi_signo as i32).map_or("a signal", |s| s.as_str()).to_string();
        }
        let now = Instant::now();
        if next_resolve.is_some_and(|t| now >= t) {
            next_resolve = Some(now + RESOLVE_POLL);
            resolve_next_hops(&dp, &mut resolver, now)?;
        }
        if now >= next_refresh {
            next_refresh = now + ADDRESS_REFRESH;
            look_again(&mut dp, &ifc, second_chance, &mut seen)?;
        }
        if let (Some(interval), Some(due)) = (stats_interval, next_stats) {
            if now >= due {
                next_stats = Some(due + interval);
                let mut out = std::io::stdout().lock();
                writeln!(out, "decap stats at {:.1}s: {}", (now - started).as_secs_f64(), counters_text(&dp.counters()?, second_chance))?;
                out.flush()?;
            }
        }
    };
    drop(xdp);
    log(format!("{stop}: detached from {}; {}", ifc.name, counters_text(&dp.counters()?, second_chance)));
    Ok(ExitCode::SUCCESS)
}

/// What the periodic look at the host has seen so far, so that each change is said once.
#[derive(Default)]
struct Seen {
    /// conntrack's lookup is missing and its module has been loaded since.
    conntrack_came: bool,
    /// The loopback's forwarding switches someone turned off since the start, as last seen.
    forwarding_off: Vec<&'static str>,
}

/// Every ADDRESS_REFRESH: this host's addresses brought to the program, conntrack's late
/// arrival and the loopback's forwarding said when they change, and the interface still there.
fn look_again(dp: &mut Decap, ifc: &link::Interface, second_chance: bool, seen: &mut Seen) -> Result<()> {
    let addrs = host_addresses()?;
    if dp.set_local(&addrs)? {
        log(format!("this host's addresses changed: decapsulating for {} addresses", addrs.len()));
    }
    if second_chance && !dp.has_conntrack() && !seen.conntrack_came && std::path::Path::new(CONNTRACK_BTF).exists() {
        seen.conntrack_came = true;
        log(
            "second chance: the kernel's conntrack (nf_conntrack) was loaded after lb decap started, which sees it only \
             from its start: restart lb decap for connections this host REDIRECTs or DNATs to be kept here",
        );
    }
    // Someone turned the loopback's forwarding off (by hand, or with a global
    // `ip_forward=0`): that is theirs to decide, and lb decap leaves it off, but says
    // once what it costs, and once when it is back.
    if second_chance {
        let off = loopback_forwarding_off();
        for name in off.iter().filter(|n| !seen.forwarding_off.contains(n)) {
            log(format!(
                "second chance: {name} was turned off: until it is on again, every packet this host should send on \
                 to another backend is delivered here instead (counted no_route) and reset; `sysctl -w {name}=1` \
                 turns it back on (the loopback forwards nothing)"
            ));
        }
        for name in seen.forwarding_off.iter().filter(|n| !off.contains(n)) {
            log(format!("second chance: {name} is on again: packets are sent on"));
        }
        seen.forwarding_off = off;
    }
    ensure_present(ifc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(extra: &[&str]) -> Result<Args, clap::Error> {
        let mut argv = vec!["lb", "eth9"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|c| c.args)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn prefixes_are_networks_of_either_family() {
        assert_eq!(source_prefix("10.0.0.0/24"), Ok((ip("10.0.0.0"), 24)));
        assert_eq!(source_prefix("fd00::1/128"), Ok((ip("fd00::1"), 128)));
        assert_eq!(source_prefix("10.99.0.2"), Ok((ip("10.99.0.2"), 32)), "an address alone is a /32");
        assert_eq!(source_prefix("fd99::2"), Ok((ip("fd99::2"), 128)));
        assert_eq!(source_prefix("0.0.0.0/0"), Ok((ip("0.0.0.0"), 0)));
        assert_eq!(source_prefix("::/0"), Ok((ip("::"), 0)));
        assert_eq!(source_prefix("fd00:1::/33"), Ok((ip("fd00:1::"), 33)));
        assert_eq!(
            source_prefix("10.0.0.7/8"),
            Err("10.0.0.7/8 has bits set after the first 8: did you mean 10.0.0.0/8 or 10.0.0.7/32?".to_string())
        );
        assert!(source_prefix("fd00::1/64").is_err());
        assert!(source_prefix("10.0.0.0/33").is_err());
        assert!(source_prefix("fd00::/129").is_err());
        assert!(source_prefix("10.0.0/24").is_err());
        assert!(source_prefix("eth0").is_err());
    }

    #[test]
    fn one_of_allow_from_and_allow_any_is_required_and_not_both() {
        let a = args(&["--allow-from", "10.99.0.2", "--allow-from", "fd99::/64"]).expect("valid");
        assert_eq!(allowed(&a).expect("a list"), vec![(ip("10.99.0.2"), 32), (ip("fd99::"), 64)]);
        let a = args(&["--allow-any"]).expect("valid");
        assert_eq!(allowed(&a).expect("any"), lb::dataplane::decap::ANY_SOURCE.to_vec());
        let a = args(&[]).expect("clap accepts it; run refuses it");
        let e = allowed(&a).expect_err("neither flag");
        assert!(e.to_string().contains("--allow-from PREFIX") && e.to_string().contains("--allow-any"), "{e}");
        let e = args(&["--allow-any", "--allow-from", "10.0.0.0/8"]).err().expect("both");
        assert_eq!(e.kind(), clap::error::ErrorKind::ArgumentConflict);
        assert!(args(&["--allow-from", "10.0.0.1/8"]).is_err(), "host bits are refused when parsing");
    }

    #[test]
    fn second_chance_needs_an_allow_list() {
        let a = args(&["--allow-any", "--second-chance"]).expect("clap accepts it; run refuses it");
        let e = allowed(&a).expect_err("an open relay");
        assert!(e.to_string().contains("--second-chance") && e.to_string().contains("--allow-from"), "{e}");
        let a = args(&["--allow-from", "0.0.0.0/0", "--second-chance"]).expect("clap accepts it; run refuses it");
        assert!(allowed(&a).expect_err("every host").to_string().contains("half of all IPv4 addresses"));
        let a = args(&["--allow-from", "10.0.0.0/8", "--second-chance"]).expect("valid");
        assert_eq!(allowed(&a).expect("a list"), vec![(ip("10.0.0.0"), 8)]);
    }

    #[test]
    fn second_chance_judges_the_union_of_the_allow_list() {
        // More than half of a family's addresses, however the prefixes cut it: refused like a /0.
        for broad in [
            &["0.0.0.0/1", "128.0.0.0/1"][..],
            &["::/1", "8000::/1"],
            &["::/0"],
            &["128.0.0.0/2", "0.0.0.0/1", "192.0.0.0/2", "10.0.0.0/8"],
            &["0.0.0.0/1", "0.0.0.0/2", "128.0.0.0/1", "fd00::/8"],
            // Every unicast address but 248.0.0.0/5.
            &["0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/3", "224.0.0.0/4", "240.0.0.0/5"],
            &["0.0.0.0/1", "128.0.0.0/8"],
            &["::/1", "8000::/16"],
        ] {
            let mut flags = vec!["--second-chance"];
            for p in broad {
                flags.extend(["--allow-from", p]);
            }
            let e = allowed(&args(&flags).expect("clap accepts it")).expect_err("half a family");
            assert!(e.to_string().contains("more than half of all IPv"), "{broad:?}: {e}");
        }
        // Half or less (overlaps counted once), and the list is a list.
        for some in [
            &["0.0.0.0/1"][..],
            &["0.0.0.0/1", "10.0.0.0/8", "0.0.0.0/2"],
            &["0.0.0.1/32", "0.0.0.2/31", "0.0.0.4/30"],
            &["::/1", "0.0.0.0/1"],
            &["128.0.0.0/2", "64.0.0.0/2", "8000::/1"],
            &["10.0.0.0/8", "fd00::/8"],
        ] {
            let mut flags = vec!["--second-chance"];
            for p in some {
                flags.extend(["--allow-from", p]);
            }
            assert!(allowed(&args(&flags).expect("valid")).is_ok(), "{some:?} is half or less");
        }
        assert_eq!(broad_family(&[(ip("::"), 1), (ip("0.0.0.0"), 1), (ip("128.0.0.0"), 1)]), Some("IPv4"));
        assert_eq!(broad_family(&[(ip("::"), 0), (ip("::"), 0)]), Some("IPv6"));
        assert_eq!(broad_family(&[(ip("::"), 1)]), None);
    }
}
