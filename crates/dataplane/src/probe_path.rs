//! The way out for health probes through the data path (`health_check: {via: vip}`,
//! docs/operating.md). A probe is an ordinary TCP connection of the host's own stack to the
//! service's VIP and port, from a socket bound to the attached interface and marked
//! [`mark`]`(backend id)`. Three things make it leave as a client's packet of the service would:
//!
//! - a policy rule, per interface: marked packets bound to it look up a table of their own
//!   (`ip rule`: `pref 19522 fwmark 0x4c420000/0xffff0000 oif IF lookup TABLE`);
//! - in that table, a default route through a made-up neighbour on the interface (169.254.76.66
//!   and fe80::4c42, whose MAC is the interface's own, a permanent entry), so that the kernel
//!   sends at once rather than asking who has the VIP;
//! - the data plane's `lb_probe_out` on the interface's egress (TCX), which gives each marked
//!   packet the backend's MAC, or wraps it for the backend, as the service forwards
//!   (crates/dataplane/src/bpf/probe.h).
//!
//! The backend answers from the VIP to the host's own address, which the XDP program passes. All
//! three go when the [`ProbePath`] is dropped; a controller killed before that leaves the rule,
//! route and neighbour behind, which the next one replaces.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{BorrowedFd, OwnedFd};

use anyhow::{Context, Result};
use libbpf_rs::libbpf_sys;
use nix::errno::Errno;

use crate::netlink::{self, Socket};

/// The socket mark of a probe of backend `id` (lb.h, enum lb_probe_mark).
pub fn mark(id: u32) -> u32 {
    PROBE_MARK | (id & !PROBE_MARK_MASK)
}

const PROBE_MARK: u32 = crate::types::lb_probe_mark::LB_PROBE_MARK.0;
const PROBE_MARK_MASK: u32 = crate::types::lb_probe_mark::LB_PROBE_MARK_MASK.0;

/// The policy rule's priority: before the main table (32766), after the local one (0).
pub const RULE_PRIORITY: u32 = 19522;

/// The routing table of the probes bound to interface `ifindex`.
pub fn table(ifindex: u32) -> u32 {
    PROBE_MARK.wrapping_add(ifindex)
}

/// The made-up next hops of the probes' default routes.
pub const GATEWAY4: Ipv4Addr = Ipv4Addr::new(169, 254, 76, 66);
pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x4c42);

const RTM_NEWRULE: u16 = 32;
const RTM_DELRULE: u16 = 33;
const FRA_PRIORITY: u16 = 6;
const FRA_FWMARK: u16 = 10;
const FRA_TABLE: u16 = 15;
const FRA_FWMASK: u16 = 16;
const FRA_OIFNAME: u16 = 17;
const FR_ACT_TO_TBL: u8 = 1;
const RTA_TABLE: u16 = 15;
const RTPROT_STATIC: u8 = 4;
const RTNH_F_ONLINK: u32 = 4;
const RTN_UNICAST: u8 = 1;
const NUD_PERMANENT: u16 = 0x80;

/// The probes' way out of one interface; dropping it removes every piece. The data plane's
/// `probe_out` map must name the interface first ([`crate::Dataplane::open_probe_path`]).
pub struct ProbePath {
    _links: [OwnedFd; 2],
    /// The interface's accept_local as it was, put back on drop.
    accept_local: Option<String>,
    ifindex: u32,
    ifname: String,
    /// Families whose routing could not be set up (an interface without IPv6, say), and why:
    /// their probes fail, each saying so.
    pub missing: Vec<String>,
    /// What else could not be set up, and what it breaks.
    pub warnings: Vec<String>,
}

impl ProbePath {
    /// Attaches `prog` (the data plane's `lb_probe_out`) to the egress of interface `ifindex`
    /// (named `ifname`, MAC `mac`) and routes marked probes there, for both address families.
    /// `local_vip`: some VIP is one of the host's own addresses, whose answers IPv4 takes for
    /// martians unless the interface has `accept_local` (set here, and put back on drop).
    pub fn open(prog: BorrowedFd<'_>, ifindex: u32, ifname: &str, mac: [u8; 6], local_vip: bool) -> Result<ProbePath> {
        let lo = nix::net::if_::if_nametoindex("lo").context("looking up the loopback device")?;
        let links = [tcx_egress(prog, ifindex).with_context(|| format!("attaching the probes' egress program to {ifname} (TCX, Linux 6.6 or later)"))?, tcx_egress(prog, lo).context("attaching the probes' egress program to lo")?];
        let mut path = ProbePath { _links: links, accept_local: None, ifindex, ifname: ifname.to_string(), missing: Vec::new(), warnings: Vec::new() };
        // Answers come from the VIP, which is often one of the host's own addresses: without
        // accept_local, IPv4 drops them as martians.
        let knob = format!("/proc/sys/net/ipv4/conf/{ifname}/accept_local");
        match std::fs::read_to_string(&knob).map(|v| v.trim().to_string()) {
            _ if !local_vip => {}
            Ok(v) if v == "1" => {}
            Ok(v) => match std::fs::write(&knob, "1") {
                Ok(()) => path.accept_local = Some(v),
                Err(e) => path.warnings.push(format!("could not set {knob} to 1 ({e}): IPv4 answers from a VIP this host holds are dropped as martians")),
            },
            Err(e) => path.warnings.push(format!("could not read {knob} ({e})")),
        }
        let mut nl = Socket::open().context("opening a netlink socket")?;
        for gw in [IpAddr::V4(GATEWAY4), IpAddr::V6(GATEWAY6)] {
            if let Err(e) = path.install(&mut nl, gw, mac) {
                path.missing.push(format!("routing marked health probes out of {ifname} through {gw}: {e}"));
            }
        }
        anyhow::ensure!(path.missing.len() < 2, "{}", path.missing.join("; "));
        Ok(path)
    }

    /// The interface probes leave by.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    fn install(&self, nl: &mut Socket, gw: IpAddr, mac: [u8; 6]) -> io::Result<()> {
        let (family, gw_bytes) = netlink::family_bytes(gw);
        // struct ndmsg: family, pad, pad, ifindex, state, flags, type.
        let mut neigh = vec![family, 0, 0, 0];
        neigh.extend_from_slice(&(self.ifindex as i32).to_ne_bytes());
        neigh.extend_from_slice(&NUD_PERMANENT.to_ne_bytes());
        neigh.extend_from_slice(&[0, 0]);
        netlink::push_attr(&mut neigh, netlink::NDA_DST, &gw_bytes);
        netlink::push_attr(&mut neigh, netlink::NDA_LLADDR, &mac);
        let create = netlink::NLM_F_REQUEST | netlink::NLM_F_ACK | netlink::NLM_F_CREATE;
        nl.request(netlink::RTM_NEWNEIGH, create | netlink::NLM_F_REPLACE, &neigh, |_, _| {})?;
        nl.request(netlink::RTM_NEWROUTE, create | netlink::NLM_F_REPLACE, &self.route(family, &gw_bytes), |_, _| {})?;
        match nl.request(RTM_NEWRULE, create | netlink::NLM_F_EXCL, &self.rule(family), |_, _| {}) {
            Err(e) if e.raw_os_error() == Some(Errno::EEXIST as i32) => Ok(()),
            r => r,
        }
    }

    /// struct rtmsg and attributes of the table's default route through `gw`.
    fn route(&self, family: u8, gw: &[u8]) -> Vec<u8> {
        // family, dst_len, src_len, tos, table (in RTA_TABLE), protocol, scope (universe), type;
        // flags.
        let mut body = vec![family, 0, 0, 0, 0, RTPROT_STATIC, 0, RTN_UNICAST];
        body.extend_from_slice(&RTNH_F_ONLINK.to_ne_bytes());
        netlink::push_attr(&mut body, RTA_TABLE, &table(self.ifindex).to_ne_bytes());
        netlink::push_attr(&mut body, netlink::RTA_GATEWAY, gw);
        netlink::push_attr(&mut body, netlink::RTA_OIF, &self.ifindex.to_ne_bytes());
        body
    }

    /// struct fib_rule_hdr and attributes of the rule that sends marked probes to the table.
    fn rule(&self, family: u8) -> Vec<u8> {
        // family, dst_len, src_len, tos, table (in FRA_TABLE), res1, res2, action; flags.
        let mut body = vec![family, 0, 0, 0, 0, 0, 0, FR_ACT_TO_TBL, 0, 0, 0, 0];
        netlink::push_attr(&mut body, FRA_PRIORITY, &RULE_PRIORITY.to_ne_bytes());
        netlink::push_attr(&mut body, FRA_FWMARK, &PROBE_MARK.to_ne_bytes());
        netlink::push_attr(&mut body, FRA_FWMASK, &PROBE_MARK_MASK.to_ne_bytes());
        let mut name = self.ifname.as_bytes().to_vec();
        name.push(0);
        netlink::push_attr(&mut body, FRA_OIFNAME, &name);
        netlink::push_attr(&mut body, FRA_TABLE, &table(self.ifindex).to_ne_bytes());
        body
    }

    fn remove(&self, nl: &mut Socket, gw: IpAddr) {
        let (family, gw_bytes) = netlink::family_bytes(gw);
        let ack = netlink::NLM_F_REQUEST | netlink::NLM_F_ACK;
        let _ = nl.request(RTM_DELRULE, ack, &self.rule(family), |_, _| {});
        let _ = nl.request(netlink::RTM_DELROUTE, ack, &self.route(family, &gw_bytes), |_, _| {});
        let mut neigh = vec![family, 0, 0, 0];
        neigh.extend_from_slice(&(self.ifindex as i32).to_ne_bytes());
        neigh.extend_from_slice(&[0, 0, 0, 0]);
        netlink::push_attr(&mut neigh, netlink::NDA_DST, &gw_bytes);
        let _ = nl.request(netlink::RTM_DELNEIGH, ack, &neigh, |_, _| {});
    }
}

/// A TCX link of `prog` on the egress of `ifindex`, after whatever is there.
fn tcx_egress(prog: BorrowedFd<'_>, ifindex: u32) -> io::Result<OwnedFd> {
    crate::link::link_create(prog, ifindex, libbpf_sys::BPF_TCX_EGRESS, 0)
}

impl Drop for ProbePath {
    fn drop(&mut self) {
        if let Some(v) = &self.accept_local {
            let _ = std::fs::write(format!("/proc/sys/net/ipv4/conf/{}/accept_local", self.ifname), v);
        }
        if let Ok(mut nl) = Socket::open() {
            for gw in [IpAddr::V4(GATEWAY4), IpAddr::V6(GATEWAY6)] {
                self.remove(&mut nl, gw);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_carries_the_backend_id_under_lbs_own_upper_half() {
        assert_eq!(mark(7), 0x4c42_0007);
        assert_eq!(mark(0xffff), 0x4c42_ffff);
        // An id never spills into the upper half the rule matches.
        assert_eq!(mark(0x1_0005) & PROBE_MARK_MASK, PROBE_MARK);
    }
}
