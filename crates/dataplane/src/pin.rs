//! Where a persistent data plane lives: a directory of bpffs with the XDP link and every map
//! pinned, one per network namespace and interface (`DIR/net<inode>/<ifname>`), so that the
//! program keeps forwarding after `lb attach --pin` exits, and a later controller can find it,
//! adopt it, upgrade it or remove it.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use libbpf_rs::libbpf_sys;

/// The default root of pins.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/lb";

/// statfs f_type of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// The file names of the pins in a data plane's directory: the link, then the maps.
pub const LINK: &str = "link";

/// Makes sure `root` is on a bpf filesystem: if it is not, and it is an empty directory (or
/// missing), mounts one there. A non-empty directory of another filesystem is refused: mounting
/// over it would hide its files.
pub fn ensure_bpffs(root: &Path) -> Result<()> {
    fs::create_dir_all(root).with_context(|| format!("creating the pin directory {}", root.display()))?;
    if is_bpffs(root)? {
        return Ok(());
    }
    let empty = fs::read_dir(root).with_context(|| format!("reading {}", root.display()))?.next().is_none();
    if !empty {
        bail!(
            "{} is not on a bpf filesystem and is not empty; give --pin-dir a directory of bpffs \
             (mount -t bpf bpf DIR), or an empty directory for lb to mount one on",
            root.display()
        );
    }
    nix::mount::mount(Some("bpf"), root, Some("bpf"), nix::mount::MsFlags::empty(), None::<&str>)
        .with_context(|| format!("mounting a bpf filesystem on {}", root.display()))?;
    Ok(())
}

fn is_bpffs(path: &Path) -> Result<bool> {
    let st = nix::sys::statfs::statfs(path).with_context(|| format!("statfs {}", path.display()))?;
    Ok(st.filesystem_type().0 as i64 == BPF_FS_MAGIC)
}

/// The directory of `ifname`'s data plane under `root` in this network namespace (not created).
pub fn plane_dir(root: &Path, ifname: &str) -> Result<PathBuf> {
    let ns = fs::metadata("/proc/self/ns/net").context("reading this process's network namespace")?.ino();
    Ok(root.join(format!("net{ns}")).join(ifname))
}

/// Whether `dir` holds a pinned link.
pub fn has_link(dir: &Path) -> bool {
    dir.join(LINK).exists()
}

/// Opens a pinned object (link or map) by path.
pub fn open_pinned(path: &Path) -> Result<OwnedFd> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).context("a path with a NUL byte")?;
    // SAFETY: a valid NUL-terminated path that outlives the call.
    let fd = unsafe { libbpf_sys::bpf_obj_get(c.as_ptr()) };
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(-fd)).with_context(|| format!("opening the pin {}", path.display()));
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Pins the object behind `fd` at `path`.
pub fn pin_fd(fd: &impl AsRawFd, path: &Path) -> Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).context("a path with a NUL byte")?;
    // SAFETY: a live descriptor and a valid NUL-terminated path.
    let rc = unsafe { libbpf_sys::bpf_obj_pin(fd.as_raw_fd(), c.as_ptr()) };
    if rc < 0 {
        return Err(io::Error::from_raw_os_error(-rc)).with_context(|| format!("pinning {}", path.display()));
    }
    Ok(())
}

/// What the kernel says of a link: (its program's id, the interface it is attached to; 0 once
/// the interface is gone or the link was detached).
pub fn link_info(link: &impl AsRawFd) -> Result<(u32, u32, u32)> {
    let mut info = libbpf_sys::bpf_link_info::default();
    let mut len = std::mem::size_of::<libbpf_sys::bpf_link_info>() as u32;
    // SAFETY: `info` is a writable bpf_link_info and `len` its size.
    let rc = unsafe { libbpf_sys::bpf_link_get_info_by_fd(link.as_raw_fd(), &mut info, &mut len) };
    if rc < 0 {
        return Err(io::Error::from_raw_os_error(-rc)).context("asking the kernel about the pinned link");
    }
    // SAFETY: for an XDP link the kernel fills the xdp member of the union.
    let ifindex = unsafe { info.__bindgen_anon_1.xdp.ifindex };
    Ok((info.id, info.prog_id, ifindex))
}

/// Replaces the program of `link` with `prog`, atomically: packets see the old program or the
/// new one, never none.
pub fn link_update(link: &impl AsRawFd, prog: &impl AsRawFd) -> Result<()> {
    // SAFETY: live descriptors; a null options pointer asks for no conditions.
    let rc = unsafe { libbpf_sys::bpf_link_update(link.as_raw_fd(), prog.as_raw_fd(), std::ptr::null()) };
    if rc < 0 {
        return Err(io::Error::from_raw_os_error(-rc)).context("replacing the program of the pinned link");
    }
    Ok(())
}

/// Detaches a link's program from its interface (the link object lives on until its last
/// reference goes).
pub fn link_detach(link: &impl AsRawFd) -> Result<()> {
    // SAFETY: a live link descriptor.
    let rc = unsafe { libbpf_sys::bpf_link_detach(link.as_raw_fd()) };
    if rc < 0 {
        return Err(io::Error::from_raw_os_error(-rc)).context("detaching the pinned link");
    }
    Ok(())
}

/// An exclusive lock on a data plane's directory, held by the controller while it runs: the
/// kernel drops it with the process however the process ends, so a stale pid never blocks a new
/// controller.
pub struct Lock(#[allow(dead_code)] OwnedFd);

/// Takes the lock on `dir`, or returns None when another process holds it.
pub fn try_lock(dir: &Path) -> Result<Option<Lock>> {
    let fd = nix::fcntl::open(dir, nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
        .with_context(|| format!("opening {}", dir.display()))?;
    // SAFETY: a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    #[allow(deprecated)] // Flock would own the descriptor; this keeps it in Lock.
    match nix::fcntl::flock(fd.as_raw_fd(), nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(()) => Ok(Some(Lock(fd))),
        Err(nix::errno::Errno::EWOULDBLOCK) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("locking {}", dir.display())),
    }
}

/// How long a controller (and `lb detach`) keeps trying the lock before it takes it as held by
/// another controller: `lb status` may hold it for an instant (where /proc/locks cannot show it
/// a running controller, see pinned.rs), and a controller that dies releases it at once, so a
/// lock still held after this is a controller's.
pub const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// [`try_lock`], tried again every few milliseconds until `patience` has passed.
pub fn lock_patiently(dir: &Path, patience: std::time::Duration) -> Result<Option<Lock>> {
    let until = std::time::Instant::now() + patience;
    loop {
        if let Some(lock) = try_lock(dir)? {
            return Ok(Some(lock));
        }
        if std::time::Instant::now() >= until {
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Removes every pin in `dir`, keeping the directory (and the lock a controller holds on it).
pub fn clear(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?.flatten() {
        fs::remove_file(e.path()).with_context(|| format!("removing the pin {}", e.path().display()))?;
    }
    Ok(())
}

/// Removes every pin in `dir` and the directory itself (and its namespace directory when that
/// is left empty). Returns the names removed.
pub fn remove_all(dir: &Path) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            fs::remove_file(e.path()).with_context(|| format!("removing the pin {}", e.path().display()))?;
            removed.push(name);
        }
    }
    let _ = fs::remove_dir(dir);
    if let Some(parent) = dir.parent() {
        let _ = fs::remove_dir(parent);
    }
    removed.sort();
    Ok(removed)
}
