//! The commands that work on a pinned data plane (`lb attach --pin`) from any process, with or
//! without its controller running: `lb status` and `lb detach`.
//!
//! The pins live in `PIN_DIR/net<inode>/<ifname>` (src/dataplane/pin.rs). A controller holds an
//! exclusive lock on that directory while it runs (src/daemon/pinning.rs), so two never control
//! one interface; the kernel drops the lock with the process, however it ends. These commands
//! are not part of `lb attach`, so they live beside it rather than in src/daemon/; the daemon
//! borrows only [`since_text`] from here.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use lb::dataplane::{pin, PinnedMaps};

use crate::plane::layout_hash;
use crate::xdp::check_privileges;

/// `12s ago`, or `-` for a time never set.
pub(crate) fn since_text(ms: u64) -> String {
    if ms == 0 {
        return "-".to_string();
    }
    let ago = pin::now_ms().saturating_sub(ms) / 1000;
    format!("{ago}s ago")
}

/// `lb detach IFACE`: removes a pinned data plane (link, program, pins).
pub fn detach(iface: &str, root: &Path) -> Result<ExitCode> {
    check_privileges()?;
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
        if let (Some(dev), Ok(st)) = (maps.announce_ifindex()?, lb::balancer::status(&maps)) {
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
    check_privileges()?;
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
    let st = lb::balancer::status(&maps)?;
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
