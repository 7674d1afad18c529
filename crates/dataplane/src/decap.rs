//! The backends' decapsulation program (crates/dataplane/src/bpf/decap.bpf.c), for `lb decap`: loads it, writes
//! the prefixes encapsulated packets may come from, keeps its map of this host's addresses in
//! step with the interfaces, and reads its counters.

use std::collections::HashSet;
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::os::fd::AsFd;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use super::encode::{addr_of, addr_words, bytes_of, value_of};

#[allow(clippy::all, dead_code, non_camel_case_types, non_snake_case, non_upper_case_globals)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/decap.skel.rs"));
}

use skel::{DecapSkel, DecapSkelBuilder};

/// What the program counted, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecapCounters {
    /// Encapsulated packets for this host, unwrapped and passed on.
    pub decapsulated: u64,
    /// Everything else, passed unchanged.
    pub passed: u64,
    /// Encapsulated packets for this host that were cut short or inconsistent: dropped.
    pub malformed: u64,
    /// Encapsulated packets for this host from an outer source outside the allow-list: dropped.
    pub not_allowed: u64,
    /// Encapsulated packets from an allowed source whose inner destination is not an address
    /// of this host: dropped.
    pub not_local: u64,
    /// Encapsulated packets whose outer header was marked CE (congestion) while the inner
    /// packet's sender does not do ECN: dropped, as RFC 6040 says.
    pub ce_not_ect: u64,
    /// Decapsulated packets (counted there too) whose ECN fields were a combination RFC 6040
    /// says no compliant path produces: an ECT outer over a Not-ECT inner, or ECT(1) over CE.
    pub ecn_anomaly: u64,
    /// Second chance: packets with a hop list kept here (a SYN, not TCP, a connection or SYN
    /// cookie of this host, an ICMP error about a connection of this host); decapsulated, and
    /// counted there too.
    pub hop_local: u64,
    /// Second chance: packets for no connection of this host, sent on to the next hop.
    pub sent_on: u64,
    /// Second chance: packets for no connection here whose list was used up (or led back
    /// here): decapsulated here all the same.
    pub exhausted: u64,
    /// Second chance: packets whose next hop had no route or neighbour, or whose route leaves
    /// by another interface: decapsulated here.
    pub no_route: u64,
    /// Second chance: packets whose next hop is outside the allow-list: decapsulated here.
    pub hop_refused: u64,
    /// Second chance: packets whose next hop is on the link with no MAC known yet: dropped
    /// (the sender sends them again) while the kernel resolves it, for at most 3 s.
    pub unresolved: u64,
}

/// Every address of either family: what `lb decap --allow-any` allows.
pub const ANY_SOURCE: [(IpAddr, u8); 2] = [(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0), (IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 0)];

pub struct Decap {
    skel: DecapSkel<'static>,
    /// The addresses in local_addrs now.
    local: HashSet<IpAddr>,
    /// Whether conntrack's XDP lookup resolved at load.
    has_conntrack: bool,
}

impl Decap {
    /// Opens and loads the program, decapsulating GUE sent to `gue_port`, with second chance
    /// (hop lists followed) or without. Nothing is attached.
    pub fn load(gue_port: u16, second_chance: bool) -> Result<Decap> {
        // One per process: leaking the small holder is simpler than a self-referential struct.
        let object = Box::leak(Box::new(MaybeUninit::uninit()));
        let open = DecapSkelBuilder::default().open(object).context("opening the decapsulation BPF object")?;
        let mut open = open;
        let rodata = open.maps.rodata_data.as_deref_mut().context("the program's .rodata is not mapped")?;
        rodata.gue_port = gue_port.to_be();
        rodata.second_chance = second_chance as u8;
        let skel = open.load().context("loading the decapsulation program (is this root, with CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN?)")?;
        let mut decap = Decap { skel, local: HashSet::new(), has_conntrack: false };
        let hz = decap.measure_hz()?;
        let bss = decap.skel.maps.bss_data.as_deref_mut().context("the decapsulation program's .bss is not memory-mapped")?;
        bss.jiffies_hz = hz;
        Ok(decap)
    }

    /// One reading of the kernel's clocks by the program lb_decap_clock: (jiffies, monotonic
    /// nanoseconds); notes whether conntrack's lookup resolved.
    fn clock_reading(&mut self) -> Result<(u64, u64)> {
        super::test_run_once(&self.skel.progs.lb_decap_clock, &[0u8; 64])?;
        let bss = self.skel.maps.bss_data.as_deref().context("the decapsulation program's .bss is not memory-mapped")?;
        // SAFETY: the fields are plain integers in the program's memory-mapped .bss, which the
        // kernel wrote during the test run; volatile reads keep the compiler from assuming they
        // did not change.
        let (jiffies, ns, ct) =
            unsafe { (std::ptr::read_volatile(&bss.clock_jiffies), std::ptr::read_volatile(&bss.clock_ns), std::ptr::read_volatile(&bss.has_conntrack)) };
        self.has_conntrack = ct != 0;
        Ok((jiffies, ns))
    }

    /// The kernel's clock rate, jiffies a second: two readings 100 ms apart, rounded to the
    /// nearest rate Linux is built with (100, 250, 300, 1000). Second chance reads the kernel's
    /// SYN-cookie bookkeeping, which counts in jiffies; the kernel's configuration, which says
    /// the rate, is not readable on every host.
    fn measure_hz(&mut self) -> Result<u32> {
        let (j0, t0) = self.clock_reading()?;
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (j1, t1) = self.clock_reading()?;
        let measured = j1.saturating_sub(j0) as f64 * 1e9 / t1.saturating_sub(t0).max(1) as f64;
        let nearest = [100u32, 250, 300, 1000].into_iter().min_by(|a, b| (f64::from(*a) - measured).abs().total_cmp(&(f64::from(*b) - measured).abs()));
        Ok(nearest.unwrap_or(1000))
    }

    /// The kernel's jiffies now, and the rate measured at load (jiffies a second).
    pub fn jiffies(&mut self) -> Result<(u64, u32)> {
        let (jiffies, _) = self.clock_reading()?;
        Ok((jiffies, self.skel.maps.bss_data.as_deref().map_or(0, |b| b.jiffies_hz)))
    }

    /// Whether second chance can ask the kernel's conntrack (its XDP lookup resolved when the
    /// program was loaded): without it, a backend that REDIRECTs or DNATs the VIP's port has
    /// no socket second chance can find for its connections.
    pub fn has_conntrack(&self) -> bool {
        self.has_conntrack
    }

    pub fn program_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.skel.progs.lb_decap.as_fd()
    }

    /// Allows encapsulated packets whose outer source lies in one of `prefixes` (address, prefix
    /// length); packets from any other source are dropped. Call before attaching: until then
    /// nothing is allowed.
    pub fn allow_from(&mut self, prefixes: &[(IpAddr, u8)]) -> Result<()> {
        for &(a, len) in prefixes {
            let full = if a.is_ipv4() { 32 } else { 128 };
            if len > full {
                bail!("{a}/{len}: a prefix length is at most {full}");
            }
            let (addr, family) = addr_words(a);
            // The family word is always part of the prefix (see lb.h, struct lb_decap_src).
            let key = skel::types::lb_decap_src { prefixlen: 32 + len as u32, family, addr, ..Default::default() };
            self.skel.maps.allow_from.update(bytes_of(&key), &[1], MapFlags::ANY).with_context(|| format!("allowing {a}/{len}"))?;
        }
        Ok(())
    }

    /// Makes `addrs` the set of addresses packets are decapsulated for, as outer and as inner
    /// destination (the addresses on the loopback device, where backends hold the VIPs, must be
    /// among them). Loopback addresses themselves (127.0.0.0/8, ::1), and any that are not
    /// unicast, are left out: a packet from the wire is never for them, and unwrapping one for
    /// 127.0.0.1 would reach services bound to the loopback on hosts that route it
    /// (`route_localnet`). Returns whether it changed.
    pub fn set_local(&mut self, addrs: &[IpAddr]) -> Result<bool> {
        let want: HashSet<IpAddr> =
            addrs.iter().copied().filter(|a| !(a.is_loopback() || a.is_unspecified() || a.is_multicast())).collect();
        if want == self.local {
            return Ok(false);
        }
        let key = |a: IpAddr| {
            let (addr, family) = addr_words(a);
            skel::types::lb_addr { addr, family, ..Default::default() }
        };
        for a in want.difference(&self.local) {
            self.skel.maps.local_addrs.update(bytes_of(&key(*a)), &[1], MapFlags::ANY)?;
        }
        for a in self.local.difference(&want) {
            let _ = self.skel.maps.local_addrs.delete(bytes_of(&key(*a)));
        }
        self.local = want;
        Ok(true)
    }

    pub fn counters(&self) -> Result<DecapCounters> {
        use skel::types::lb_decap_stat as S;
        let read = |s: S| -> Result<u64> {
            let per_cpu = self.skel.maps.decap_stats.lookup_percpu(&s.0.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
            Ok(per_cpu.iter().map(|v| value_of::<u64>(v)).sum())
        };
        Ok(DecapCounters {
            decapsulated: read(S::LB_DECAP_DONE)?,
            passed: read(S::LB_DECAP_PASSED)?,
            malformed: read(S::LB_DECAP_MALFORMED)?,
            not_allowed: read(S::LB_DECAP_NOT_ALLOWED)?,
            not_local: read(S::LB_DECAP_NOT_LOCAL)?,
            ce_not_ect: read(S::LB_DECAP_CE_NOT_ECT)?,
            ecn_anomaly: read(S::LB_DECAP_ECN_ANOMALY)?,
            hop_local: read(S::LB_DECAP_HOP_LOCAL)?,
            sent_on: read(S::LB_DECAP_HOP_SENT_ON)?,
            exhausted: read(S::LB_DECAP_HOP_EXHAUSTED)?,
            no_route: read(S::LB_DECAP_HOP_NO_ROUTE)?,
            hop_refused: read(S::LB_DECAP_HOP_REFUSED)?,
            unresolved: read(S::LB_DECAP_HOP_UNRESOLVED)?,
        })
    }

    /// The next hops second chance found on the link with no MAC known, each with how long
    /// ago it was first found so (by the kernel's monotonic clock, which is CLOCK_MONOTONIC).
    pub fn unresolved(&self) -> Result<Vec<(IpAddr, std::time::Duration)>> {
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).context("reading the monotonic clock")?;
        let now = std::time::Duration::from(now);
        let mut out = Vec::new();
        for key in self.skel.maps.unresolved.keys() {
            let Some(value) = self.skel.maps.unresolved.lookup(&key, MapFlags::ANY)? else { continue };
            let k: skel::types::lb_addr = value_of(&key);
            let since = std::time::Duration::from_nanos(value_of::<u64>(&value));
            if let Some(a) = addr_of(&k.addr, k.family) {
                out.push((a, now.saturating_sub(since)));
            }
        }
        Ok(out)
    }

    /// Forgets `addr` as an unresolved next hop: the next packet for it starts a new wait.
    pub fn forget_unresolved(&self, addr: IpAddr) -> Result<()> {
        let (words, family) = addr_words(addr);
        let key = skel::types::lb_addr { addr: words, family, ..Default::default() };
        match self.skel.maps.unresolved.delete(bytes_of(&key)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("forgetting the unresolved next hop {addr}")),
        }
    }

    /// Runs the program once on `frame` through BPF_PROG_TEST_RUN: (XDP action, output frame).
    pub fn test_run(&self, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
        super::test_run_once(&self.skel.progs.lb_decap, frame)
    }

    /// Runs the program once on `frame` as if it arrived on interface `ifindex` (which must have
    /// an XDP program attached, so that its receive queue is registered): (XDP action, output
    /// frame). The interface's network namespace is then the one socket and route lookups see,
    /// and a packet second chance sends back out of it returns XDP_TX.
    pub fn test_run_on(&self, frame: &[u8], ifindex: u32) -> Result<(u32, Vec<u8>)> {
        let mut ctx = xdp_md_in(frame.len(), ifindex);
        let mut out = vec![0u8; frame.len() + 256];
        let input = libbpf_rs::ProgramInput { data_in: Some(frame), data_out: Some(&mut out), context_in: Some(&mut ctx), ..Default::default() };
        let output = self.skel.progs.lb_decap.test_run(input).context("BPF_PROG_TEST_RUN")?;
        let len = output.data.as_ref().map_or(0, |d| d.len());
        let action = output.return_value;
        out.truncate(len);
        Ok((action, out))
    }

    /// [`Decap::test_run_on`], `repeat` times on one buffer: (last XDP action, mean time per run).
    pub fn test_run_on_repeat(&self, frame: &[u8], ifindex: u32, repeat: u32) -> Result<(u32, std::time::Duration)> {
        let mut ctx = xdp_md_in(frame.len(), ifindex);
        let input = libbpf_rs::ProgramInput { data_in: Some(frame), context_in: Some(&mut ctx), repeat, ..Default::default() };
        let output = self.skel.progs.lb_decap.test_run(input).context("BPF_PROG_TEST_RUN")?;
        Ok((output.return_value, output.duration))
    }

    /// Runs the program `repeat` times on `frame` in one BPF_PROG_TEST_RUN (one buffer: later
    /// runs see what earlier ones wrote): (last XDP action, mean time per run).
    pub fn test_run_repeat(&self, frame: &[u8], repeat: u32) -> Result<(u32, std::time::Duration)> {
        let input = libbpf_rs::ProgramInput { data_in: Some(frame), repeat, ..Default::default() };
        let output = self.skel.progs.lb_decap.test_run(input).context("BPF_PROG_TEST_RUN")?;
        Ok((output.return_value, output.duration))
    }
}

/// BPF_PROG_TEST_RUN's context for an XDP frame of `len` bytes arriving on `ifindex` (struct
/// xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex).
fn xdp_md_in(len: usize, ifindex: u32) -> Vec<u8> {
    [0u32, len as u32, 0, ifindex, 0, 0].iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// Every address of every interface in this network namespace (both families).
pub fn host_addresses() -> Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs().context("listing this host's addresses")? {
        let Some(a) = ifa.address else { continue };
        if let Some(v4) = a.as_sockaddr_in() {
            out.push(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = a.as_sockaddr_in6() {
            out.push(IpAddr::V6(v6.ip()));
        }
    }
    Ok(out)
}
