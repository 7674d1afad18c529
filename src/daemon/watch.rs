//! Watching the pool file for `lb attach`'s hot reload: inotify on the file's directory (not on
//! the file), so that every way a file gets replaced is seen: a write in place, an editor's
//! write-to-temp-then-rename, delete and re-create, and a symlink swap (Kubernetes ConfigMaps
//! swap a `..data` symlink and never touch the file's own name). When the path is a symlink, the
//! directory of the file it resolves to is watched too. Watches that go away (the directory was
//! removed or replaced) are re-armed on every periodic re-check.
//!
//! Events only say "look again": the reload re-reads the file by path and compares contents.
//! [`Debounce`] turns a burst of events into one reload.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// What a watched directory's events are about.
#[derive(Debug, Clone)]
struct Watched {
    dir: PathBuf,
    /// The file name in that directory that matters.
    name: OsString,
}

pub(super) struct Watcher {
    inotify: Inotify,
    path: PathBuf,
    watches: HashMap<WatchDescriptor, Watched>,
}

/// What a batch of events amounts to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    /// Something happened that may have changed the file's content.
    pub(super) changed: bool,
    /// The file was modified and not closed yet: a writer is still at it.
    pub(super) writing: bool,
    /// A watch went away and must be re-armed.
    pub(super) lost: bool,
}

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

impl Watcher {
    pub(super) fn new(path: &Path) -> Result<Watcher> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).context("creating an inotify instance")?;
        let mut w = Watcher { inotify, path: path.to_path_buf(), watches: HashMap::new() };
        w.arm();
        if w.watches.is_empty() {
            anyhow::bail!("cannot watch the directory of {}", path.display());
        }
        Ok(w)
    }

    /// The directories to watch: the path's own, and its resolved target's when it is a link.
    fn wanted(&self) -> Vec<Watched> {
        let mut out = Vec::new();
        let split = |p: &Path| -> Option<Watched> {
            let name = p.file_name()?.to_os_string();
            let dir = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            Some(Watched { dir, name })
        };
        out.extend(split(&self.path));
        if let Ok(real) = std::fs::canonicalize(&self.path) {
            if let Some(t) = split(&real) {
                let same = out.iter().any(|w| std::fs::canonicalize(&w.dir).ok() == std::fs::canonicalize(&t.dir).ok() && w.name == t.name);
                if !same {
                    out.push(t);
                }
            }
        }
        out
    }

    /// Adds the watches that are missing (after a directory went away, or a symlink now points
    /// elsewhere) and drops those no longer wanted. Returns whether anything changed.
    pub(super) fn arm(&mut self) -> bool {
        let wanted = self.wanted();
        let mut changed = false;
        let stale: Vec<WatchDescriptor> = self
            .watches
            .iter()
            .filter(|(_, w)| !wanted.iter().any(|x| x.dir == w.dir && x.name == w.name))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in stale {
            let _ = self.inotify.rm_watch(wd);
            self.watches.remove(&wd);
            changed = true;
        }
        for w in wanted {
            if self.watches.values().any(|x| x.dir == w.dir && x.name == w.name) {
                continue;
            }
            // add_watch on a directory already watched returns its descriptor again.
            if let Ok(wd) = self.inotify.add_watch(&w.dir, mask()) {
                self.watches.insert(wd, w);
                changed = true;
            }
        }
        changed
    }

    /// Reads every pending event without blocking.
    pub(super) fn read(&mut self) -> Seen {
        let mut seen = Seen::default();
        loop {
            let events = match self.inotify.read_events() {
                Ok(e) => e,
                Err(Errno::EAGAIN) => return seen,
                Err(Errno::EINTR) => continue,
                Err(_) => {
                    seen.lost = true;
                    return seen;
                }
            };
            for e in events {
                if e.mask.intersects(AddWatchFlags::IN_IGNORED | AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF) {
                    self.watches.remove(&e.wd);
                    seen.lost = true;
                    seen.changed = true;
                    continue;
                }
                if e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    seen.changed = true;
                    continue;
                }
                let Some(w) = self.watches.get(&e.wd) else { continue };
                let Some(name) = &e.name else { continue };
                // The file itself, or Kubernetes' `..data` and `..2026_...` entries.
                let relevant = *name == w.name || name.to_string_lossy().starts_with("..");
                if !relevant {
                    continue;
                }
                seen.changed = true;
                if e.mask.contains(AddWatchFlags::IN_MODIFY) {
                    seen.writing = true;
                }
                if e.mask.intersects(AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_DELETE) {
                    seen.writing = false;
                }
            }
        }
    }
}

impl AsFd for Watcher {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }
}

/// Turns bursts of file events into one reload: it fires once events have been quiet for
/// `delay`, but waits for a writer that modified the file to close it, for at most `max_wait`
/// after the first event of the burst.
#[derive(Debug, Clone)]
pub(super) struct Debounce {
    pub(super) delay: Duration,
    pub(super) max_wait: Duration,
    first: Option<Instant>,
    last: Instant,
    writing: bool,
}

impl Debounce {
    pub(super) fn new(delay: Duration, max_wait: Duration) -> Debounce {
        Debounce { delay, max_wait, first: None, last: Instant::now(), writing: false }
    }

    pub(super) fn event(&mut self, now: Instant, writing: bool) {
        self.first.get_or_insert(now);
        self.last = now;
        self.writing = writing;
    }

    /// When the pending reload is due, if one is pending.
    pub(super) fn due(&self) -> Option<Instant> {
        let first = self.first?;
        let quiet = self.last + self.delay;
        Some(if self.writing { first + self.max_wait } else { quiet })
    }

    /// Whether the reload is due at `now`; if so, the burst is over.
    pub(super) fn fire(&mut self, now: Instant) -> bool {
        match self.due() {
            Some(t) if now >= t => {
                self.first = None;
                self.writing = false;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_burst_fires_once_after_it_has_been_quiet() {
        let t0 = Instant::now();
        let mut d = Debounce::new(50 * MS, 1000 * MS);
        assert!(!d.fire(t0));
        for i in 0..10 {
            d.event(t0 + i * 10 * MS, false);
        }
        assert_eq!(d.due(), Some(t0 + 140 * MS));
        assert!(!d.fire(t0 + 139 * MS));
        assert!(d.fire(t0 + 140 * MS));
        assert!(!d.fire(t0 + 500 * MS), "once per burst");
    }

    #[test]
    fn an_open_writer_is_waited_for_but_not_forever() {
        let t0 = Instant::now();
        let mut d = Debounce::new(50 * MS, 1000 * MS);
        d.event(t0, true);
        assert!(!d.fire(t0 + 60 * MS), "a modification without close: still being written");
        d.event(t0 + 100 * MS, false);
        assert!(d.fire(t0 + 150 * MS), "closed: due after the quiet delay");
        d.event(t0 + 2000 * MS, true);
        assert!(!d.fire(t0 + 2999 * MS));
        assert!(d.fire(t0 + 3000 * MS), "a writer that never closes is not waited for past max_wait");
    }

    #[test]
    fn the_watcher_sees_each_way_of_replacing_a_file() {
        let dir = std::env::temp_dir().join(format!("lb-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("..v1")).unwrap();
        std::fs::create_dir_all(dir.join("..v2")).unwrap();
        std::fs::write(dir.join("..v1/pool.yaml"), "a").unwrap();
        std::fs::write(dir.join("..v2/pool.yaml"), "b").unwrap();
        std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/pool.yaml", dir.join("k8s.yaml")).unwrap();
        std::fs::write(dir.join("plain.yaml"), "x").unwrap();

        let mut plain = Watcher::new(&dir.join("plain.yaml")).unwrap();
        let mut k8s = Watcher::new(&dir.join("k8s.yaml")).unwrap();
        let quiet = |w: &mut Watcher| assert!(!w.read().changed);
        quiet(&mut plain);
        quiet(&mut k8s);

        std::fs::write(dir.join("other.txt"), "unrelated").unwrap();
        quiet(&mut plain);

        std::fs::write(dir.join("plain.yaml"), "in place").unwrap();
        assert!(plain.read().changed, "in place");
        std::fs::write(dir.join(".plain.yaml.tmp"), "renamed").unwrap();
        std::fs::rename(dir.join(".plain.yaml.tmp"), dir.join("plain.yaml")).unwrap();
        assert!(plain.read().changed, "rename over");
        std::fs::remove_file(dir.join("plain.yaml")).unwrap();
        assert!(plain.read().changed, "delete");
        std::fs::write(dir.join("plain.yaml"), "again").unwrap();
        assert!(plain.read().changed, "re-create");

        // Kubernetes: a new ..data link renamed over the old one.
        std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        assert!(k8s.read().changed, "symlink swap");
        assert_eq!(std::fs::read_to_string(dir.join("k8s.yaml")).unwrap(), "b");
        // The resolved target's directory changed: re-arming follows it.
        assert!(k8s.arm());
        std::fs::write(dir.join("..v2/pool.yaml"), "b2").unwrap();
        assert!(k8s.read().changed, "a write to the link's target");

        // The directory itself goes away and comes back.
        let sub = dir.join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join("p.yaml"), "1").unwrap();
        let mut w = Watcher::new(&sub.join("p.yaml")).unwrap();
        std::fs::remove_dir_all(&sub).unwrap();
        assert!(w.read().lost);
        std::fs::create_dir_all(&sub).unwrap();
        assert!(w.arm(), "re-armed on the new directory");
        std::fs::write(sub.join("p.yaml"), "2").unwrap();
        assert!(w.read().changed);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
