//! The commands that work on a pinned data plane (`lb attach --pin`) from any process, with or
//! without its controller running: `lb status` and `lb detach`.
//!
//! The pins live in `PIN_DIR/net<inode>/<ifname>` (crates/dataplane/src/pin.rs). A controller holds an
//! exclusive lock on that directory while it runs (src/daemon/pinning.rs), so two never control
//! one interface; the kernel drops the lock with the process, however it ends. These commands
//! are not part of `lb attach`, so they live beside it rather than in src/daemon/; the daemon
//! borrows only [`since_text`] from here.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use lb::dataplane::{pin, PinnedMaps};

use crate::log::since_text;
use crate::plane::layout_hash;
use crate::xdp::check_privileges;

/// Whether the running kernel keeps the protocol mark (IFA_PROTO) lb puts on the addresses it
/// adds: Linux 6.1 and later. Unknown counts as yes: a mark then missing means the address is
/// not lb's, and it stays.
fn kernel_keeps_address_marks() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or(true, |r| release_keeps_marks(&r))
}

/// [`kernel_keeps_address_marks`] for a kernel release string ("6.18.0-1-amd64").
fn release_keeps_marks(release: &str) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => (major, minor) >= (6, 1),
        _ => true,
    }
}

/// Where lb.service pins (configs/systemd/lb.service): a directory of its own, so that what
/// it detaches when stopped is its own and never a plane someone pinned at the default.
pub const UNIT_PIN_DIR: &str = "/sys/fs/bpf/lb-unit";

/// The directory of IFACE's plane that `lb status` and `lb detach` read, under `--pin-dir` when
/// given; otherwise under the default, or under lb.service's when IFACE has a plane there and
/// none at the default. (The unit pinned at the default before it had a directory of its own:
/// a root shell's `lb status eth0` found its plane, and still does.) `None`: no plane for IFACE
/// in either, said on stderr.
fn find_plane(given: Option<&Path>, iface: &str) -> Result<Option<PathBuf>> {
    let roots: Vec<&Path> = match given {
        Some(root) => vec![root],
        None => vec![Path::new(pin::DEFAULT_PIN_DIR), Path::new(UNIT_PIN_DIR)],
    };
    for root in &roots {
        let dir = plane_dir(root, iface)?;
        if pin::has_link(&dir) {
            return Ok(Some(dir));
        }
    }
    let searched: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    eprintln!("lb: error: no pinned lb data plane for {iface} in {}", searched.join(" or "));
    Ok(None)
}

/// `lb detach IFACE`: removes a pinned data plane (link, program, pins).
pub fn detach(iface: &str, given: Option<&Path>) -> Result<ExitCode> {
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

/// `iface`'s plane directory under `root`, refused when it, its namespace directory or any pin
/// is a symbolic link. Whoever owns the pin directory (user lb, under the unit) could point one
/// at another program's pins, for root to read, detach and remove. The unit's processes are
/// gone when its stop-post runs lb detach as root, so nothing of theirs swaps a pin between the
/// check and the use.
fn plane_dir(root: &Path, iface: &str) -> Result<PathBuf> {
    let dir = pin::plane_dir(root, iface)?;
    let is_link = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
    let pins = std::fs::read_dir(&dir).into_iter().flatten().flatten().map(|e| e.path());
    let mut paths = [Some(dir.clone()), dir.parent().map(Path::to_path_buf)].into_iter().flatten().chain(pins);
    if let Some(p) = paths.find(|p| is_link(p)) {
        bail!("{} is a symbolic link; lb does not follow links among its pins", p.display());
    }
    Ok(dir)
}

/// Whether a controller holds `dir`'s lock.
///
/// A controller runs while it holds the directory's flock. The kernel lists every flock in
/// /proc/locks by device and inode, so status looks there first, without touching the lock. But
/// /proc/locks leaves out the locks whose holder is not in the reader's pid namespace (status run
/// in a container, or by `kubectl exec`, next to a controller outside it), so when the lock is
/// not listed, status tries it (non-blocking, released at once): that answer is definitive. A
/// controller starting in that instant does not fail for it: it tries its lock again for
/// [`pin::LOCK_PATIENCE`]. Where neither works, it falls back to whether the process the meta
/// names as the last controller is alive (wrong only if its pid was reused).
fn controller_holds(dir: &Path, pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    if let (Ok(md), Ok(locks)) = (std::fs::metadata(dir), std::fs::read_to_string("/proc/locks")) {
        let id = format!("{:02x}:{:02x}:{}", nix::sys::stat::major(md.dev()), nix::sys::stat::minor(md.dev()), md.ino());
        if flock_held(&locks, &id) {
            return true;
        }
    }
    match pin::try_lock(dir) {
        // Dropped here: released at once.
        Ok(Some(_lock)) => false,
        Ok(None) => true,
        Err(_) => pid != 0 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok(),
    }
}

/// Whether the /proc/locks text `locks` lists a granted flock on `id` (`MAJ:MIN:INODE`, as
/// /proc/locks writes them). Lines with `->` are waiters, not holders.
fn flock_held(locks: &str, id: &str) -> bool {
    locks.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&id)
    })
}

/// `lb status IFACE`: what the pinned data plane holds and counts, from any process.
pub fn status(iface: &str, given: Option<&Path>, json: bool) -> Result<ExitCode> {
    check_privileges()?;
    let Some(dir) = find_plane(given, iface)? else {
        return Ok(ExitCode::FAILURE);
    };
    let link = pin::open_pinned(&dir.join(pin::LINK))?;
    let (link_id, prog_id, ifindex) = pin::link_info(&link)?;
    let maps = PinnedMaps::open(&dir)?;
    let meta = maps.meta()?.context("the pinned lb_meta has a format this version does not know")?;
    let running = controller_holds(&dir, meta.controller_pid);
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

#[cfg(test)]
mod tests {
    use super::flock_held;

    #[test]
    fn a_granted_flock_is_found_by_device_and_inode_and_waiters_are_not() {
        let locks = "1: POSIX  ADVISORY  WRITE 812 00:19:1123 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4711 00:2d:31 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 4712 00:2d:77 0 EOF\n";
        assert!(flock_held(locks, "00:2d:31"));
        assert!(!flock_held(locks, "00:19:1123"), "a POSIX lock is not the controller's");
        assert!(!flock_held(locks, "00:2d:77"), "a waiter holds nothing");
        assert!(!flock_held(locks, "00:2d:3"));
    }

    #[test]
    fn address_marks_come_with_linux_6_1() {
        for (release, keeps) in [("6.18.0-1-amd64", true), ("6.1.0", true), ("6.0.19", false), ("5.15.0-91-generic", false), ("7.0", true), ("", true)] {
            assert_eq!(super::release_keeps_marks(release), keeps, "{release}");
        }
    }
}
