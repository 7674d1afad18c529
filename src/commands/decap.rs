//! `lb decap IFACE`: the backend side of encapsulated forwarding, for hosts whose kernel has no
//! ipip, ip6tnl or fou driver. Attaches the decapsulation program through a BPF link (so any
//! death of the process detaches it), unwrapping only packets from the sources it was told to
//! trust (`--allow-from`, or explicitly `--allow-any`), keeps its set of this host's addresses
//! current (re-read every second: an address added to the host is decapsulated for within a
//! second), and prints its counters on request and at exit.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use lb::dataplane::decap::{host_addresses, Decap, DecapCounters, ANY_SOURCE};
use lb::dataplane::{link, netlink};

use crate::log::log;
use crate::xdp::{already_attached, attach_with_mode, check_privileges, ensure_present, ModeArg};

/// How often this host's addresses are re-read.
const ADDRESS_REFRESH: Duration = Duration::from_secs(1);

/// Second chance: how often the next hops found unresolved are looked at (a packet to one is
/// dropped until its MAC is known, and TCP sends it again after 200 ms at the soonest), how
/// often each is asked for again while it stays unresolved, and when it is forgotten, so that a
/// later packet to it starts a new wait (the program gives up waiting after 3 s).
const RESOLVE_POLL: Duration = Duration::from_millis(50);
const RESOLVE_AGAIN: Duration = Duration::from_secs(1);
const RESOLVE_FORGET: Duration = Duration::from_secs(10);
/// At most this many next hops are asked for per look (the map holds 256): 160 a second.
const RESOLVE_BURST: usize = 8;
/// Next hops logged one by one, at most; after that, one line says the rest are not.
const RESOLVE_LOGGED: usize = 64;
/// Where the kernel lists conntrack's BTF when conntrack is a module that is loaded.
const CONNTRACK_BTF: &str = "/sys/kernel/btf/nf_conntrack";

/// What lb decap keeps to have next hops resolved: netlink, when each hop was last asked for,
/// and the hops it has logged.
struct Resolver {
    nl: netlink::Socket,
    asked: HashMap<IpAddr, Instant>,
    logged: HashSet<IpAddr>,
}

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

/// `10.0.0.0/24`, `fd00::1/128`, `10.0.0.7`: a prefix of outer sources, as (network address,
/// length). Host bits set below the length are refused rather than cleared: `10.0.0.7/8` is
/// more likely a typo for a /32 than a wish to trust a /8.
fn source_prefix(s: &str) -> Result<(IpAddr, u8), String> {
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: IpAddr = a.trim().parse().map_err(|_| format!("`{a}` is not an IPv4 or IPv6 address"))?;
    let full: u8 = if addr.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => full,
        Some(l) => match l.trim().parse::<u8>() {
            Ok(n) if n <= full => n,
            _ => return Err(format!("`/{l}`: expected a prefix length from 0 to {full}")),
        },
    };
    let network = match addr {
        // A shift by the whole width (length 0) leaves no bits: checked_shl says None.
        IpAddr::V4(v4) => IpAddr::V4((u32::from(v4) & u32::MAX.checked_shl(32 - len as u32).unwrap_or(0)).into()),
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & u128::MAX.checked_shl(128 - len as u32).unwrap_or(0)).into()),
    };
    if network != addr {
        return Err(format!("{s} has bits set after the first {len}: did you mean {network}/{len} or {addr}/{full}?"));
    }
    Ok((addr, len))
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

/// The loopback's forwarding switches, which second chance needs on: the kernel's FIB helper
/// routes a packet only "from" a device with forwarding on, and the program asks as if the
/// packet came from the loopback (docs/fleet.md, "Second chance"). On there, they forward
/// nothing (no packet from outside arrives on the loopback); the interface stays a host's.
/// Each as its file and its sysctl name.
const LOOPBACK_FORWARDING: [(&str, &str); 2] = [
    ("/proc/sys/net/ipv4/conf/lo/forwarding", "net.ipv4.conf.lo.forwarding"),
    ("/proc/sys/net/ipv6/conf/lo/forwarding", "net.ipv6.conf.lo.forwarding"),
];

/// Turns the loopback's forwarding on where it is off, once, at start; returns the switches it
/// turned on. Never turned off again: it forwards nothing, another `lb decap` of this host may
/// rely on it, and a process killed with SIGKILL could not anyway. A family the host does not
/// have (IPv6 disabled: no such switch) is skipped.
fn loopback_forwarding_on() -> Result<Vec<&'static str>> {
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
fn loopback_forwarding_off() -> Vec<&'static str> {
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
fn resolve_next_hops(dp: &Decap, r: &mut Resolver, now: Instant) -> Result<()> {
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

/// The address family ("IPv4", "IPv6") more than half of whose addresses `prefixes` cover
/// together, if one is: a /0, 0.0.0.0/1 with 128.0.0.0/1, or any set whose union is that broad,
/// however it is cut up. (A list of second-chance hops that names half of the Internet names its
/// routers too.)
fn broad_family(prefixes: &[(IpAddr, u8)]) -> Option<&'static str> {
    for (family, bits, v6) in [("IPv4", 32u32, false), ("IPv6", 128u32, true)] {
        // Each prefix as its first and last address, in order of the first.
        let mut ranges: Vec<(u128, u128)> = prefixes
            .iter()
            .filter(|(addr, _)| addr.is_ipv6() == v6)
            .map(|&(addr, len)| {
                let base = match addr {
                    IpAddr::V4(a) => u128::from(u32::from(a)),
                    IpAddr::V6(a) => u128::from(a),
                };
                let host_bits = bits.saturating_sub(u32::from(len));
                let span = if host_bits >= 128 { u128::MAX } else { (1u128 << host_bits) - 1 };
                (base & !span, (base & !span) | span)
            })
            .collect();
        ranges.sort_unstable();
        // The addresses the union covers, each counted once (saturating: a /0 of IPv6 is 2^128).
        let mut covered = 0u128;
        let mut next = 0u128; // the first address not counted yet
        let mut done = false; // the last address counted
        for (first, end) in ranges {
            if done || end < next {
                continue;
            }
            let from = first.max(next);
            covered = covered.saturating_add((end - from).saturating_add(1));
            if end == u128::MAX {
                done = true;
            } else {
                next = end + 1;
            }
        }
        if covered > 1u128 << (bits - 1) {
            return Some(family);
        }
    }
    None
}

/// The allow-list `a` asks for, or the error that names the flags when it asks for none.
fn allowed(a: &Args) -> Result<Vec<(IpAddr, u8)>> {
    if let (true, Some(family)) = (a.second_chance, broad_family(&a.allow_from)) {
        bail!(
            "--second-chance sends packets on only to hosts of the allow-list, and the --allow-from prefixes together \
             name more than half of all {family} addresses: give --allow-from the load balancers' and the backends' prefixes"
        );
    }
    if a.allow_any && a.second_chance {
        bail!(
            "--second-chance sends packets on only to hosts of the allow-list, and --allow-any would make that every \
             host: give --allow-from PREFIX with the load balancers' and the backends' addresses"
        );
    }
    if a.allow_any {
        return Ok(ANY_SOURCE.to_vec());
    }
    if a.allow_from.is_empty() {
        bail!(
            "lb decap needs to know whom to trust: give --allow-from PREFIX (repeatable) with the load balancers' \
             encapsulation sources (their --encap-source, or their interface's address), or --allow-any to unwrap \
             packets from any source"
        );
    }
    Ok(a.allow_from.clone())
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
    let mut resolver = Resolver { nl: netlink::Socket::open().context("opening a netlink socket")?, asked: HashMap::new(), logged: HashSet::new() };
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
        assert_eq!(allowed(&a).expect("any"), ANY_SOURCE.to_vec());
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
