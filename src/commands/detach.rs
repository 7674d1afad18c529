//! `lb detach IFACE`: a pinned data plane removed, its VIPs withdrawn first.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};

use lb::dataplane::{pin, PinnedMaps};

use super::pinned::{find_plane, kernel_keeps_address_marks};
use crate::xdp::check_privileges;

#[derive(clap::Args)]
pub struct Args {
    /// The interface the pinned program is attached to.
    #[arg(value_name = "IFACE")]
    iface: String,
    /// The bpffs directory `lb attach --pin` pinned under (its --pin-dir) [default:
    /// /sys/fs/bpf/lb, then lb.service's /sys/fs/bpf/lb-unit]
    #[arg(long, value_name = "DIR")]
    pin_dir: Option<PathBuf>,
}

/// `lb detach IFACE`: removes a pinned data plane (link, program, pins).
pub fn run(args: Args) -> Result<ExitCode> {
    let (iface, given) = (args.iface.as_str(), args.pin_dir.as_deref());
    check_privileges()?;
    let Some(dir) = find_plane(given, iface)? else {
        return Ok(ExitCode::FAILURE);
    };
    let Some(_lock) = pin::lock_patiently(&dir, pin::LOCK_PATIENCE)? else {
        let pid = PinnedMaps::open(&dir).ok().and_then(|m| m.meta().ok().flatten()).map_or(0, |m| m.controller_pid);
        bail!("lb (pid {pid}) controls {iface}'s data plane; stop it (it leaves the data plane pinned), then detach");
    };
    let link = pin::open_pinned(&dir.join(pin::LINK))?;
    let (link_id, prog_id, ifindex) = pin::link_info(&link)?;
    // The VIPs go before the program: left local with nothing in front, they would be answered
    // with resets.
    // Only the addresses lb marked as its own (IFA_PROTO, as it added them): an address the
    // operator holds on that device is theirs, even when it equals a VIP. A kernel before 6.1
    // keeps no marks: there every VIP is taken for lb's, as it always was.
    let (mut withdrawn, mut left) = (Vec::new(), Vec::new());
    if let Ok(maps) = PinnedMaps::open(&dir) {
        if let (Some(dev), Ok(st)) = (maps.announce_ifindex()?, lb::balancer::status(&maps)) {
            let mut nl = lb::dataplane::netlink::Socket::open()?;
            let marks = kernel_keeps_address_marks();
            let marked = if marks { nl.addrs_marked(dev, lb::dataplane::netlink::ADDR_PROTO_LB)? } else { Vec::new() };
            let vips: std::collections::BTreeSet<std::net::IpAddr> = st.services.iter().map(|s| s.vip).collect();
            for v in vips {
                if !marks || marked.contains(&v) {
                    nl.addr_del(dev, v)?;
                    withdrawn.push(v.to_string());
                } else {
                    left.push(v.to_string());
                }
            }
        }
    }
    // What it announced is withdrawn: the next lb on this interface has no leftovers.
    let _ = std::fs::remove_file(crate::daemon::announce_state_path(iface));
    if ifindex != 0 {
        pin::link_detach(&link)?;
    }
    drop(link);
    let removed = pin::remove_all(&dir)?;
    let mut out = std::io::stdout().lock();
    if !withdrawn.is_empty() {
        writeln!(out, "withdrew the VIPs {}", withdrawn.join(" "))?;
    }
    if !left.is_empty() {
        writeln!(
            out,
            "left the VIPs {}: not marked as lb's on the announce device (added by someone else, or by a kernel before 6.1, which keeps no marks)",
            left.join(" ")
        )?;
    }
    writeln!(
        out,
        "detached XDP program {prog_id} (link {link_id}) from {iface}; removed {} pins from {}: {}",
        removed.len(),
        dir.display(),
        removed.join(" ")
    )?;
    Ok(ExitCode::SUCCESS)
}
