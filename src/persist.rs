//! A data plane that outlives its controller (`lb attach --pin`), and the commands that work on
//! one from any process: `lb detach` and `lb status`.
//!
//! The pins live in `PIN_DIR/net<inode>/<ifname>` (src/dataplane/pin.rs). A controller holds an
//! exclusive lock on that directory while it runs, so two never control one interface; the
//! kernel drops the lock with the process, however it ends.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use lb::dataplane::link::Interface;
use lb::dataplane::{pin, PinnedMaps};

use crate::log::log;
use crate::plane::layout_hash;

/// A pinned data plane found for the interface, to be adopted.
pub struct Found {
    pub link: OwnedFd,
    pub link_id: u32,
    pub prog_id: u32,
    /// Its lb_meta says it has this build's layout.
    pub same_layout: bool,
    pub attached_ms: u64,
}

/// The pin directory of a controller, locked.
pub struct Pinning {
    pub dir: PathBuf,
    _lock: pin::Lock,
}

/// Prepares `--pin`: makes sure the root is bpffs, locks the interface's directory, and says
/// whether a data plane is there to adopt. A stale one (its interface gone) is removed; one
/// attached to another interface, one another controller holds, or one of an unknown format
/// is a clear error.
pub fn prepare(root: &Path, ifc: &Interface) -> Result<(Pinning, Option<Found>)> {
    pin::ensure_bpffs(root)?;
    let dir = pin::plane_dir(root, &ifc.name)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let Some(lock) = pin::try_lock(&dir)? else {
        let who = PinnedMaps::open(&dir).ok().and_then(|m| m.meta().ok().flatten()).map_or(String::new(), |m| {
            format!(" (pid {}, since {})", m.controller_pid, since_text(m.controller_since))
        });
        bail!("another lb{who} controls {}'s data plane at {}; stop it first", ifc.name, dir.display());
    };
    let pinning = Pinning { dir: dir.clone(), _lock: lock };
    if !pin::has_link(&dir) {
        // Leftovers of a controller that died before pinning its link: nothing to adopt.
        pin::clear(&dir)?;
        return Ok((pinning, None));
    }
    let link = pin::open_pinned(&dir.join(pin::LINK))?;
    let (link_id, prog_id, ifindex) = pin::link_info(&link)?;
    if ifindex == 0 || prog_id == 0 {
        log(format!("removing a stale pinned data plane at {} (its interface went away)", dir.display()));
        pin::clear(&dir)?;
        return Ok((pinning, None));
    }
    if ifindex != ifc.ifindex {
        let other = nix::net::if_::if_indextoname(ifindex).map_or(format!("ifindex {ifindex}"), |n| n.to_string_lossy().into_owned());
        bail!(
            "the data plane pinned at {} is attached to {other}, not {} (ifindex {}); remove it with \
             `lb detach {other}` or give another --pin-dir",
            dir.display(),
            ifc.name,
            ifc.ifindex
        );
    }
    let maps = PinnedMaps::open(&dir).with_context(|| format!("the pinned data plane at {} is incomplete", dir.display()))?;
    let Some(meta) = maps.meta()? else {
        bail!(
            "the data plane pinned at {} was made by a version of lb this one does not know (its lb_meta has another \
             format); remove it with `lb detach {}` (an outage) and attach anew",
            dir.display(),
            ifc.name
        );
    };
    let same_layout = meta.layout == layout_hash();
    Ok((pinning, Some(Found { link, link_id, prog_id, same_layout, attached_ms: meta.attached_ms })))
}

pub fn since_text(ms: u64) -> String {
    if ms == 0 {
        return "-".to_string();
    }
    let ago = pin::now_ms().saturating_sub(ms) / 1000;
    format!("{ago}s ago")
}

/// `lb detach IFACE`: removes a pinned data plane (link, program, pins).
pub fn detach(iface: &str, root: &Path) -> Result<ExitCode> {
    crate::xdp::check_privileges()?;
    let dir = pin::plane_dir(root, iface)?;
    if !pin::has_link(&dir) {
        eprintln!("lb: error: no pinned lb data plane for {iface} in {}", root.display());
        return Ok(ExitCode::FAILURE);
    }
    let Some(_lock) = pin::try_lock(&dir)? else {
        let pid = PinnedMaps::open(&dir).ok().and_then(|m| m.meta().ok().flatten()).map_or(0, |m| m.controller_pid);
        bail!("lb (pid {pid}) controls {iface}'s data plane; stop it (it leaves the data plane pinned), then detach");
    };
    let link = pin::open_pinned(&dir.join(pin::LINK))?;
    let (link_id, prog_id, ifindex) = pin::link_info(&link)?;
    // The VIPs go before the program: left local with nothing in front, they would be answered
    // with resets.
    let mut withdrawn = Vec::new();
    if let Ok(maps) = PinnedMaps::open(&dir) {
        if let (Some(dev), Ok(st)) = (maps.announce_ifindex()?, maps.status()) {
            let mut nl = lb::dataplane::netlink::Socket::open()?;
            let vips: std::collections::BTreeSet<std::net::IpAddr> = st.services.iter().map(|s| s.vip).collect();
            for v in vips {
                nl.addr_del(dev, v)?;
                withdrawn.push(v.to_string());
            }
        }
    }
    if ifindex != 0 {
        pin::link_detach(&link)?;
    }
    drop(link);
    let removed = pin::remove_all(&dir)?;
    let mut out = std::io::stdout().lock();
    if !withdrawn.is_empty() {
        writeln!(out, "withdrew the VIPs {}", withdrawn.join(" "))?;
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

/// `lb status IFACE`: what the pinned data plane holds and counts, from any process.
pub fn status(iface: &str, root: &Path, json: bool) -> Result<ExitCode> {
    crate::xdp::check_privileges()?;
    let dir = pin::plane_dir(root, iface)?;
    if !pin::has_link(&dir) {
        eprintln!("lb: error: no pinned lb data plane for {iface} in {}", root.display());
        return Ok(ExitCode::FAILURE);
    }
    let link = pin::open_pinned(&dir.join(pin::LINK))?;
    let (link_id, prog_id, ifindex) = pin::link_info(&link)?;
    let maps = PinnedMaps::open(&dir)?;
    let meta = maps.meta()?.context("the pinned lb_meta has a format this version does not know")?;
    // A controller runs while it holds the directory's lock.
    let running = pin::try_lock(&dir)?.is_none();
    let st = maps.status()?;
    let mut out = std::io::stdout().lock();
    if json {
        let v = serde_json::json!({
            "interface": iface,
            "ifindex": ifindex,
            "pin_dir": dir.display().to_string(),
            "program_id": prog_id,
            "link_id": link_id,
            "attached_ms": meta.attached_ms,
            "layout_matches": meta.layout == layout_hash(),
            "controller": if running { serde_json::json!({"pid": meta.controller_pid, "since_ms": meta.controller_since}) } else { serde_json::Value::Null },
            "status": st.json(),
        });
        serde_json::to_writer(&mut out, &v)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "{iface} (ifindex {ifindex}): XDP program {prog_id}, link {link_id}, pinned at {}, attached {}",
            dir.display(),
            since_text(meta.attached_ms)
        )?;
        if running {
            writeln!(out, "controller: lb pid {}, since {}", meta.controller_pid, since_text(meta.controller_since))?;
        } else {
            writeln!(out, "controller: none (forwarding with the tables it has; health checks and reloads wait for one)")?;
        }
        write!(out, "{}", st.text())?;
    }
    Ok(ExitCode::SUCCESS)
}
