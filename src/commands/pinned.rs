//! Finding a pinned data plane (`lb attach --pin`) from any process, with or without its
//! controller running, for `lb status` and `lb detach`.
//!
//! The pins live in `PIN_DIR/net<inode>/<ifname>` (crates/dataplane/src/pin.rs). A controller holds an
//! exclusive lock on that directory while it runs (src/daemon/pinning.rs), so two never control
//! one interface; the kernel drops the lock with the process, however it ends. Those commands
//! are not part of `lb attach`, so they live beside it rather than in src/daemon/.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use lb::dataplane::pin;

/// Whether the running kernel keeps the protocol mark (IFA_PROTO) lb puts on the addresses it
/// adds: Linux 6.1 and later. Unknown counts as yes: a mark then missing means the address is
/// not lb's, and it stays.
pub(super) fn kernel_keeps_address_marks() -> bool {
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
pub(super) fn find_plane(given: Option<&Path>, iface: &str) -> Result<Option<PathBuf>> {
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
pub(super) fn controller_holds(dir: &Path, pid: u32) -> bool {
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
