//! Encapsulated forwarding's two settings of the data plane: the outer source address per
//! family, and the interface's MTU (which an encapsulated frame may not exceed). Both are chosen
//! at start, the sources checked again at every reload (the pool decides which families need
//! one), the MTU followed on every refresh.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::Result;

use lb::config::Pool;
use lb::dataplane::link::Interface;

use crate::log::log;
use lb::balancer::Balancer;

/// Outer sources of encapsulated packets, per family, with how many leading bits stay fixed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct EncapSources {
    pub v4: Option<(Ipv4Addr, u8)>,
    pub v6: Option<(Ipv6Addr, u8)>,
}

/// The outer source of encapsulated packets for each family the pool's encapsulated backends
/// use: `--encap-source` (`given`) where given, else the interface's first address of that
/// family that is not a VIP (a backend drops an encapsulated packet whose outer source is one of
/// its own addresses, and every backend holds the VIPs) nor link-local. Errors name what is
/// missing.
pub(super) fn sources_for(given: &[(IpAddr, u8)], ifc: &Interface, pool: &Pool) -> Result<EncapSources, String> {
    let vips: HashSet<IpAddr> = pool.services.iter().map(|s| s.vip).collect();
    let mut out = EncapSources::default();
    for &(a, len) in given {
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
pub(super) fn interface_mtu(ifc: &Interface) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{}/mtu", ifc.name)).ok().and_then(|m| m.trim().parse().ok()).unwrap_or(1500)
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

/// What the data plane was last told.
pub(super) struct Encap {
    sources: EncapSources,
    mtu: u32,
}

impl Encap {
    /// Gives the data plane its first sources and MTU.
    pub(super) fn start(dp: &mut Balancer, sources: EncapSources, mtu: u32) -> Result<Encap> {
        dp.set_mtu(mtu)?;
        dp.set_encap_sources(sources.v4, sources.v6)?;
        Ok(Encap { sources, mtu })
    }

    /// `source 10.0.0.2; MTU 1500`, for the start-up log.
    pub(super) fn summary(&self) -> String {
        format!("{}; MTU {}", describe_sources(&self.sources), self.mtu)
    }

    /// Takes a reload's sources, when they differ.
    pub(super) fn update(&mut self, dp: &mut Balancer, sources: EncapSources) -> Result<()> {
        if sources != self.sources {
            dp.set_encap_sources(sources.v4, sources.v6)?;
            log(format!("encapsulated packets: {}", describe_sources(&sources)));
            self.sources = sources;
        }
        Ok(())
    }

    /// Re-reads the interface's MTU and follows a change.
    pub(super) fn refresh_mtu(&mut self, dp: &mut Balancer, ifc: &Interface) -> Result<()> {
        let mtu = interface_mtu(ifc);
        if mtu != self.mtu {
            dp.set_mtu(mtu)?;
            log(format!("{}'s MTU changed from {} to {mtu}", ifc.name, self.mtu));
            self.mtu = mtu;
        }
        Ok(())
    }
}
