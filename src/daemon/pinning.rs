//! `lb attach --pin`: a data plane that outlives its controller. At start, the interface's pin
//! directory is locked and a data plane found there is adopted (or upgraded) instead of a new
//! one attached; a new one is pinned once attached; at the end, the data plane is left
//! attached with its controller fields cleared.
//!
//! The pins live in `PIN_DIR/net<inode>/<ifname>` (crates/dataplane/src/pin.rs). A controller holds an
//! exclusive lock on that directory while it runs, so two never control one interface; the
//! kernel drops the lock with the process, however it ends. `lb status` and `lb detach`, which
//! any process runs, are in src/commands/pinned.rs.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use lb::config::Pool;
use lb::dataplane::link::{self, Interface};
use lb::dataplane::{pin, PinnedMaps};

use super::describe::describe_touched;
use crate::log::log;
use crate::log::since_text;
use lb::balancer::Balancer;
use lb::dataplane::{layout_hash, Reuse};

/// A pinned data plane found for the interface, to be adopted.
pub(super) struct Found {
    pub(super) link: OwnedFd,
    pub(super) link_id: u32,
    pub(super) prog_id: u32,
    /// Its lb_meta says it has this build's layout.
    pub(super) same_layout: bool,
    pub(super) attached_ms: u64,
}

/// The pin directory of a controller, locked.
pub(super) struct Pinning {
    pub(super) dir: PathBuf,
    _lock: pin::Lock,
}

/// Prepares `--pin`: makes sure the root is bpffs, locks the interface's directory, and says
/// whether a data plane is there to adopt. A stale one (its interface gone) is removed; one
/// attached to another interface, one another controller holds, or one of an unknown format
/// is a clear error.
pub(super) fn prepare(root: &Path, ifc: &Interface) -> Result<(Pinning, Option<Found>)> {
    pin::ensure_bpffs(root)?;
    let dir = pin::plane_dir(root, &ifc.name)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let Some(lock) = pin::lock_patiently(&dir, pin::LOCK_PATIENCE)? else {
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

/// Which of the found plane's maps a new load reuses.
pub(super) fn reuse(p: &Pinning, f: &Found) -> Reuse {
    Reuse { dir: p.dir.clone(), same_layout: f.same_layout, old_prog_id: f.prog_id }
}

/// What keeps the program on the interface while this process runs. Held, never read: without
/// --pin, dropping it is what detaches.
#[allow(dead_code)]
pub(super) enum Attachment {
    /// A link this process made (pinned too, with --pin).
    Link(link::XdpLink),
    /// An adopted pinned link.
    Pinned(OwnedFd),
}

impl Attachment {
    /// The mode the metrics report: the link's, or `adopted`.
    pub(super) fn mode(&self) -> &str {
        match self {
            Attachment::Link(l) => l.mode.as_str(),
            Attachment::Pinned(_) => "adopted",
        }
    }
}

/// Pins a data plane this process just attached: its maps, its link, and lb_meta naming this
/// process as its controller.
pub(super) fn pin_new(dp: &Balancer, p: &Pinning, xdp: &link::XdpLink, ifindex: u32, started_ms: u64) -> Result<()> {
    dp.pin_maps(&p.dir, None)?;
    pin::pin_fd(&xdp.as_fd(), &p.dir.join(pin::LINK))?;
    dp.write_meta(lb::clock::unix_ms(), Some((std::process::id(), started_ms)), ifindex)?;
    log(format!("pinned at {}: the data plane stays attached and forwarding when this process exits", p.dir.display()));
    Ok(())
}

/// Takes over a pinned data plane: rebuilds the state from its maps, applies the pool as a
/// reload (only what differs is written), carries the flow table over if its layout changed,
/// and replaces the program in the pinned link atomically.
#[allow(clippy::too_many_arguments)]
/// Adopts the pinned data plane and installs the pool `served` makes of it (given the plane as
/// read back: a restart goes on from the weights it serves).
pub(super) fn adopt(
    dp: &mut Balancer,
    pool: &Pool,
    served: impl FnOnce(&Balancer) -> Pool,
    ifc: &Interface,
    macs: &HashMap<IpAddr, [u8; 6]>,
    p: &Pinning,
    f: Found,
    fresh: &[&str],
    started_ms: u64,
) -> Result<Attachment> {
    let t0 = Instant::now();
    dp.adopt(pool).context("reading the pinned data plane's state")?;
    let pool = served(dp);
    let applied = dp.install(&pool, ifc.mac, &|a| macs.get(&a).copied()).context("applying the pool to the adopted maps")?;
    let switch = || pin::link_update(&f.link, &dp.program_fd());
    let carried = if fresh.contains(&"flows") {
        dp.carry_flows(&p.dir.join("flows"), f.prog_id, switch)?
    } else {
        switch()?;
        0
    };
    dp.switched()?;
    if !fresh.is_empty() {
        dp.pin_maps(&p.dir, Some(fresh))?;
    }
    dp.write_meta(f.attached_ms, Some((std::process::id(), started_ms)), ifc.ifindex)?;
    let new_prog = dp.program_id()?;
    log(format!(
        "adopted the data plane pinned at {} on {} (link {}): program {} -> {}{}; {} in {:.1} ms ({} ms after this process started)",
        p.dir.display(),
        ifc.name,
        f.link_id,
        f.prog_id,
        new_prog,
        if f.same_layout {
            String::new()
        } else {
            // Every map reused through BTF (the layout identity changed, the structs did not):
            // no "new maps for" with nothing after it.
            let new_maps = if fresh.is_empty() { "every map reused".to_string() } else { format!("new maps for {}", fresh.join(", ")) };
            format!(" (an upgrade: {new_maps}; {carried} tracked flows carried over)")
        },
        describe_touched(&applied.touched),
        t0.elapsed().as_secs_f64() * 1e3,
        lb::clock::unix_ms().saturating_sub(started_ms)
    ));
    Ok(Attachment::Pinned(f.link))
}

/// At the end, with --pin: the data plane stays, with no controller in its lb_meta and the
/// announce device recorded for `lb detach` (0: none). Returns what the last log line says.
pub(super) fn leave(dp: &Balancer, p: &Pinning, ifc: &Interface, announce_ifindex: u32) -> Result<String> {
    dp.write_meta(attached_ms_of(&p.dir), None, ifc.ifindex)?;
    dp.set_announce_ifindex(announce_ifindex)?;
    Ok(format!(
        "left the data plane on {} attached and pinned at {}; it forwards with its current tables, and health \
         checks and reloads wait for the next `lb attach --pin`",
        ifc.name,
        p.dir.display()
    ))
}

/// When the pinned data plane was first attached, as its lb_meta says.
fn attached_ms_of(dir: &Path) -> u64 {
    PinnedMaps::open(dir).ok().and_then(|m| m.meta().ok().flatten()).map_or(0, |m| m.attached_ms)
}
