//! `lb attach --announce DEV`: every VIP the data plane serves is a host address (/32, /128)
//! of DEV, which a routing daemon on the node (BIRD, FRR) exports by BGP, so that the routers in
//! front spread the VIPs' traffic over every node that serves them (ECMP).
//!
//! Order matters: VIPs are added only once the program is attached and serving them, and
//! withdrawn before it stops (once a VIP is a local address with no XDP program in front, this
//! host's kernel would answer its TCP packets with resets).
//!
//! Every address lb adds is marked as lb's (IFA_PROTO, `ip -d addr` shows `proto 76`), and
//! listed in a state file of the attached interface's ([`state_path`]), written (atomically)
//! before an address is added and after one is removed. At start, before anything is attached,
//! lb withdraws its leftovers: the addresses both marked and listed in that file. A VIP removed
//! while lb was stopped (`--pin`, `kill -9`, an upgrade) would otherwise stay on DEV and BGP keep
//! attracting its traffic. Both, because DEV is often shared: the mark alone means "some lb",
//! and another lb attached to another interface may announce on the same `lo`; the list alone
//! could name an address the operator has since added by hand. With a pinned data plane to
//! adopt, the leftovers the pool still has stay (that data plane serves them throughout);
//! without one, every leftover goes, since nothing serves the VIPs until the new program is
//! attached (the kernel would answer their TCP with resets), and they come back once it is.
//! A kernel older than 6.1 keeps no marks; there lb cannot tell its leftovers, withdraws none,
//! and says so once.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

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
    /// This instance's state file: what it announced, for the next run's withdrawal.
    state: PathBuf,
    /// Whether the kernel was seen to keep lb's mark on an address it added.
    marks_checked: bool,
}

/// Where the state files are: under /run, so they go at reboot with the addresses themselves.
const STATE_DIR: &str = "/run/lb/announce";

/// The state file of the lb attached to `attached`: one per interface, and the same name in
/// two network namespaces is two interfaces, so the namespace's inode is part of the name.
pub(crate) fn state_path(attached: &str) -> PathBuf {
    let netns = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
    PathBuf::from(STATE_DIR).join(format!("{attached}.net{netns}"))
}

/// What a state file says: the device and the addresses announced there. Unreadable or absent:
/// nothing (lb then withdraws nothing, which is what it did before it kept the file).
fn read_state(path: &std::path::Path) -> Option<(String, BTreeSet<IpAddr>)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut device = None;
    let mut addrs = BTreeSet::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        match line.strip_prefix("device ") {
            Some(d) => device = Some(d.trim().to_string()),
            None => addrs.extend(line.parse::<IpAddr>().ok()),
        }
    }
    Some((device?, addrs))
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
        Ok(Announcer { name: name.to_string(), ifindex, held: BTreeSet::new(), state: state_path(attached), marks_checked: false })
    }

    /// Withdraws what an earlier run of this instance announced (marked and listed in its state
    /// file), except, when `adopting` a pinned data plane that still serves them, the VIPs of
    /// `vips` (the pool about to be served), which it takes as held. Called before the pool is
    /// attached, so no address outlives its VIP. A delete that fails is a warning: the VIP stays
    /// announced, which is what happened before lb withdrew leftovers at all, and serving must
    /// not wait for it. Returns how many were withdrawn.
    pub(super) fn withdraw_leftovers(&mut self, nl: &mut netlink::Socket, vips: &BTreeSet<IpAddr>, adopting: bool) -> usize {
        let Some((device, listed)) = read_state(&self.state) else { return 0 };
        // The earlier run may have announced on another device; its leftovers are withdrawn there.
        let ifindex = if device == self.name { Some(self.ifindex) } else { nix::net::if_::if_nametoindex(device.as_str()).ok() };
        let Some(ifindex) = ifindex else { return 0 };
        let marked = match nl.addrs_marked(ifindex, netlink::ADDR_PROTO_LB) {
            Ok(m) => m,
            Err(e) => {
                log(format!("warning: could not read the addresses of {device} to withdraw an earlier run's VIPs: {e}"));
                return 0;
            }
        };
        let mut withdrawn = 0;
        for v in marked.into_iter().filter(|v| listed.contains(v)) {
            if adopting && ifindex == self.ifindex && vips.contains(&v) {
                self.held.insert(v);
                continue;
            }
            let why = if vips.contains(&v) { "nothing serves it until lb is attached" } else { "the pool no longer has it" };
            match nl.addr_del(ifindex, v) {
                Ok(()) => {
                    withdrawn += 1;
                    log(format!("withdraw: {v} from {device} (announced by an earlier run; {why})"));
                }
                Err(e) => log(format!("warning: could not withdraw {v} from {device} (announced by an earlier run; {why}): {e}")),
            }
        }
        self.save(&self.held.clone());
        withdrawn
    }

    /// Makes `vips` exactly the VIPs announced: adds the missing ones, removes the others. The
    /// state file lists an address before it is added and until it is removed, so a run killed
    /// at any point leaves no address of its own unlisted.
    pub(super) fn sync(&mut self, nl: &mut netlink::Socket, vips: &BTreeSet<IpAddr>) -> Result<()> {
        let adding: Vec<IpAddr> = vips.difference(&self.held).copied().collect();
        if !adding.is_empty() {
            self.save(&self.held.union(vips).copied().collect());
        }
        for v in &adding {
            nl.addr_add(self.ifindex, *v).with_context(|| format!("adding {v} to {}", self.name))?;
            self.held.insert(*v);
            log(format!("announce: {v} on {}", self.name));
        }
        if let Some(v) = adding.first() {
            self.check_marks(nl, *v);
        }
        let gone: Vec<IpAddr> = self.held.difference(vips).copied().collect();
        for v in &gone {
            nl.addr_del(self.ifindex, *v).with_context(|| format!("removing {v} from {}", self.name))?;
            self.held.remove(v);
            log(format!("withdraw: {v} from {}", self.name));
        }
        if !gone.is_empty() || !adding.is_empty() {
            self.save(&self.held.clone());
        }
        Ok(())
    }

    /// Once: whether the kernel kept the mark on `added` (Linux 6.1 and later do); without
    /// marks, lb cannot withdraw its leftovers at the next start, and says so.
    fn check_marks(&mut self, nl: &mut netlink::Socket, added: IpAddr) {
        if self.marks_checked {
            return;
        }
        self.marks_checked = true;
        if let Ok(marked) = nl.addrs_marked(self.ifindex, netlink::ADDR_PROTO_LB) {
            if !marked.contains(&added) {
                log(format!(
                    "warning: this kernel keeps no mark on the addresses lb adds to {} (IFA_PROTO, Linux 6.1 and later): \
                     a VIP removed while lb is stopped is not withdrawn at the next start; remove such a VIP by hand",
                    self.name
                ));
            }
        }
    }

    /// Writes the state file: this device and `addrs`, atomically (a new file renamed over the
    /// old). A failure is a warning: only the next start's withdrawal depends on it.
    fn save(&self, addrs: &BTreeSet<IpAddr>) {
        if addrs.is_empty() {
            // Nothing announced (an orderly stop): no file, nothing for the next start.
            let _ = std::fs::remove_file(&self.state);
            return;
        }
        let mut text = format!("# lb: the VIPs announced on {} by the lb attached to this file's interface\ndevice {}\n", self.name, self.name);
        for a in addrs {
            text.push_str(&format!("{a}\n"));
        }
        let mut tmp = self.state.clone().into_os_string();
        tmp.push(".new");
        let written = std::fs::create_dir_all(STATE_DIR)
            .and_then(|()| std::fs::File::create(&tmp))
            .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, &self.state));
        if let Err(e) = written {
            log(format!("warning: could not write {}: {e}; the next start cannot withdraw what this run announces", self.state.display()));
        }
    }

    /// Withdraws every VIP this process announced.
    pub(super) fn withdraw_all(&mut self, nl: &mut netlink::Socket) -> Result<()> {
        self.sync(nl, &BTreeSet::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_file_gives_its_device_and_addresses_and_a_broken_one_nothing() {
        let dir = std::env::temp_dir().join(format!("lb-announce-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("eth0");
        std::fs::write(&path, "# lb\ndevice lo\n10.0.0.1\nfd00::1\nnonsense\n\n").expect("write");
        let want: BTreeSet<IpAddr> = ["10.0.0.1".parse().expect("ip"), "fd00::1".parse().expect("ip")].into();
        assert_eq!(read_state(&path), Some(("lo".to_string(), want)));
        std::fs::write(&path, "10.0.0.1\n").expect("write");
        assert_eq!(read_state(&path), None, "no device: not lb's file");
        assert_eq!(read_state(&dir.join("absent")), None);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(state_path("eth0").starts_with(STATE_DIR));
    }
}
