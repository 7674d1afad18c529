//! `lb attach --announce DEV`: every VIP the data plane serves is a host address (/32, /128)
//! of DEV, which a routing daemon on the node (BIRD, FRR) exports by BGP, so that the routers in
//! front spread the VIPs' traffic over every node that serves them (ECMP).
//!
//! Order matters: VIPs are added only once the program is attached and serving them, and
//! withdrawn before it stops (once a VIP is a local address with no XDP program in front, this
//! host's kernel would answer its TCP packets with resets).
//!
//! Every address lb adds is marked as lb's (IFA_PROTO, `ip -d addr` shows `proto 76`), and at
//! start, before anything is attached, lb withdraws the marked addresses that the pool no longer
//! has: a VIP removed while lb was stopped (`--pin`, `kill -9`, an upgrade) would otherwise stay
//! on DEV and BGP keep attracting its traffic. Only marked addresses: DEV is often shared
//! (`--announce lo`), and the operator's own addresses on it are not lb's to remove. A kernel
//! older than 6.1 keeps no marks; there lb cannot tell its leftovers and withdraws none.

use std::collections::BTreeSet;
use std::net::IpAddr;

use anyhow::{anyhow, bail, Context, Result};

use lb::config::Pool;
use lb::dataplane::netlink;

use crate::log::log;

/// The VIPs of a pool: what is announced while it is served.
pub(super) fn vips_of(pool: &Pool) -> BTreeSet<IpAddr> {
    pool.services.iter().map(|s| s.vip).collect()
}

pub(super) struct Announcer {
    pub(super) name: String,
    pub(super) ifindex: u32,
    /// The VIPs this process added to DEV.
    held: BTreeSet<IpAddr>,
}

impl Announcer {
    /// Finds DEV (or creates it as a dummy device, where the kernel has them); it must not be
    /// the interface the program is attached to.
    pub(super) fn open(nl: &mut netlink::Socket, name: &str, attached: &str) -> Result<Announcer> {
        if name == attached {
            bail!("--announce {name}: the VIPs go on another interface than the one lb attaches to (a dummy or ifb device)");
        }
        let ifindex = match nix::net::if_::if_nametoindex(name) {
            Ok(i) => i,
            Err(_) => {
                nl.link_add_dummy(name).map_err(|e| {
                    anyhow!(
                        "--announce {name}: no such interface, and this kernel cannot create a dummy device ({e}); \
                         give an existing interface that is not {attached} (an ifb device works: ip link add {name} type ifb)"
                    )
                })?;
                log(format!("created the dummy device {name} for the VIPs"));
                nix::net::if_::if_nametoindex(name).with_context(|| format!("finding {name} after creating it"))?
            }
        };
        nl.link_set_up(ifindex).with_context(|| format!("bringing {name} up"))?;
        Ok(Announcer { name: name.to_string(), ifindex, held: BTreeSet::new() })
    }

    /// Withdraws what an earlier run announced on DEV that `vips` (the pool about to be served)
    /// lacks, and takes the rest as held. Called before the pool is attached, so no address
    /// outlives its VIP. A delete that fails is a warning: the VIP stays announced, which is
    /// what happened before lb withdrew leftovers at all, and serving must not wait for it.
    pub(super) fn withdraw_leftovers(&mut self, nl: &mut netlink::Socket, vips: &BTreeSet<IpAddr>) {
        let marked = match nl.addrs_marked(self.ifindex, netlink::ADDR_PROTO_LB) {
            Ok(m) => m,
            Err(e) => {
                log(format!("warning: could not read the addresses of {} to withdraw an earlier run's VIPs: {e}", self.name));
                return;
            }
        };
        for v in marked {
            if vips.contains(&v) {
                self.held.insert(v);
                continue;
            }
            match nl.addr_del(self.ifindex, v) {
                Ok(()) => log(format!("withdraw: {v} from {} (announced by an earlier run; the pool no longer has it)", self.name)),
                Err(e) => log(format!("warning: could not withdraw {v} from {} (announced by an earlier run; the pool no longer has it): {e}", self.name)),
            }
        }
    }

    /// Makes `vips` exactly the VIPs announced: adds the missing ones, removes the others.
    pub(super) fn sync(&mut self, nl: &mut netlink::Socket, vips: &BTreeSet<IpAddr>) -> Result<()> {
        for v in vips.difference(&self.held.clone()) {
            nl.addr_add(self.ifindex, *v).with_context(|| format!("adding {v} to {}", self.name))?;
            self.held.insert(*v);
            log(format!("announce: {v} on {}", self.name));
        }
        let gone: Vec<IpAddr> = self.held.difference(vips).copied().collect();
        for v in gone {
            nl.addr_del(self.ifindex, v).with_context(|| format!("removing {v} from {}", self.name))?;
            self.held.remove(&v);
            log(format!("withdraw: {v} from {}", self.name));
        }
        Ok(())
    }

    /// Withdraws every VIP this process announced.
    pub(super) fn withdraw_all(&mut self, nl: &mut netlink::Socket) -> Result<()> {
        self.sync(nl, &BTreeSet::new())
    }
}
