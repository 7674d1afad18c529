//! Hot reload: re-read the pool file by path, validate it whole (the YAML, then what this host
//! can serve), and hand it on: encapsulation sources, next hops and MACs first, then the pool
//! with health applied to the data plane, then the announced VIPs. Anything wrong is logged and
//! changes nothing: the tables being served stay.
//!
//! The serve loop owns the [`Reloader`] and says why it reloads (a file event, SIGHUP, the
//! periodic check); the same content twice is not applied again, nor its error logged again.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Instant;

use anyhow::Result;

use lb::config::{self, Pool};
use lb::dataplane::link;

use super::announce::vips_of;
use super::describe::describe_touched;
use super::encap::{sources_for, EncapSources};
use super::fleet::{Seen, Stored};
use lb::fleet::view::Refusal;
use super::metrics_http::ReloadResult;
use super::neighbours::{distinct_neighbours, next_hops};
use super::state::{Daemon, Install};
use crate::log::log;

/// Why the pool file is read again: a word of the reload log, and SIGHUP's own answer when the
/// file is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// A revision of the pool in the fleet's store.
    Store(u64),
    Sighup,
    FileChanged,
    WatchRearmed,
    Periodic,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Cause::Store(revision) => return write!(f, "store revision {revision}"),
            Cause::Sighup => "SIGHUP",
            Cause::FileChanged => "file changed",
            Cause::WatchRearmed => "watch re-armed",
            Cause::Periodic => "periodic check",
        })
    }
}

pub(super) struct Reloader {
    /// Digest of the file content last read (applied or refused): the same content again is
    /// not reloaded, nor its error logged again.
    content: u64,
    last_read_error: Option<String>,
}

/// The digest of what a pool file's bytes make lb serve: the bytes, and the previous pool file
/// they name (second chance's hops come from it), so that a change of either is a change.
fn content_digest(path: &std::path::Path, bytes: &[u8]) -> u64 {
    // A regular file only: reading a FIFO would block the controller.
    let previous = config::previous_file_of(path, bytes)
        .map(|previous| if std::fs::metadata(&previous).is_ok_and(|m| m.is_file()) { std::fs::read(previous).unwrap_or_default() } else { Vec::new() });
    config::pool_digest(bytes, previous.as_deref())
}

impl Reloader {
    /// `content` is what the running pool was read from, at `path`.
    pub(super) fn new(path: &std::path::Path, content: &[u8]) -> Reloader {
        Reloader { content: content_digest(path, content), last_read_error: None }
    }

    /// Re-reads the pool file by path and, when its content changed and is valid, applies it.
    pub(super) fn reload(&mut self, d: &mut Daemon, why: Cause) -> Result<()> {
        if let Some(f) = &d.fleet {
            // The store's watch follows the pool: there is no file to read.
            if why == Cause::Sighup {
                log(format!("reload (SIGHUP): the pool comes from {}; revision {} is applied", f.url, f.pool_revision));
            }
            return Ok(());
        }
        let started = Instant::now();
        let Some((pool, bytes)) = self.read(d, why) else { return Ok(()) };
        let Some((via, sources)) = check(d, why, &pool, &bytes) else { return Ok(()) };
        apply(d, why, pool, via, sources, started).map(|_| ())
    }

    /// The file's new content, parsed; None when it cannot be read, is unchanged or is invalid
    /// (each said once).
    fn read(&mut self, d: &Daemon, why: Cause) -> Option<(Pool, Vec<u8>)> {
        let path = &d.settings.config;
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                let msg = config::io_message(&e);
                if self.last_read_error.as_deref() != Some(&msg) {
                    log(format!("reload ({why}): {}: {msg}; the current tables keep serving", path.display()));
                    self.last_read_error = Some(msg);
                }
                return None;
            }
        };
        self.last_read_error = None;
        let digest = content_digest(path, &bytes);
        if digest == self.content {
            d.metrics.reload(ReloadResult::Unchanged, None);
            if why == Cause::Sighup {
                log(format!("reload (SIGHUP): {} is unchanged", path.display()));
            }
            return None;
        }
        self.content = digest;
        match config::parse_bytes(path, &bytes) {
            Ok(pool) => Some((pool, bytes)),
            Err(e) => {
                log(format!("reload refused ({why}): {e}; the current tables keep serving"));
                d.metrics.reload(ReloadResult::Refused, None);
                None
            }
        }
    }
}

/// What this host needs to serve the new pool (each backend's neighbour, the encapsulation
/// sources), or None when it cannot, with every reason logged.
fn check(d: &mut Daemon, why: Cause, pool: &Pool, bytes: &[u8]) -> Option<(HashMap<IpAddr, IpAddr>, EncapSources)> {
    let text = String::from_utf8_lossy(bytes);
    let serving: Vec<IpAddr> = d.configured.services.iter().map(|s| s.vip).collect();
    let (problems, via) = next_hops(&d.settings.config, &text, pool, &d.ifc, &mut d.nl, &serving, d.settings.announce.as_deref());
    if !problems.is_empty() {
        log(format!("reload refused ({why}): {} cannot serve the new pool; the current tables keep serving:", d.ifc.name));
        for p in problems {
            log(format!("  {p}"));
        }
        d.metrics.reload(ReloadResult::Refused, None);
        return None;
    }
    match link::interface(&d.ifc.name).map_err(|e| format!("{e:#}")).and_then(|ifc| sources_for(&d.settings.encap_sources, &ifc, pool)) {
        Ok(sources) => Some((via, sources)),
        Err(e) => {
            log(format!("reload refused ({why}): {e}; the current tables keep serving"));
            d.metrics.reload(ReloadResult::Refused, None);
            None
        }
    }
}

/// With --config etcd://...: takes the store's news in order. Each revision that changed the
/// pool (or the pool it replaced) is validated and applied as a file's reload is; a pool no
/// node could apply is refused, logged and named in this node's view, and the tables stay.
/// Then the fleet's decisions are made at that revision; last, this node's view is published.
pub(super) fn follow_store(d: &mut Daemon) -> Result<()> {
    // One revision at a time: its decisions, then its pool (installed with them), before the
    // next is read; only what arrived before this turn.
    if let Some(f) = d.fleet.as_mut() {
        f.refill();
    }
    while let Some(seen) = d.fleet.as_mut().and_then(|f| f.next()) {
        let Seen::Revision { revision, pool } = seen else { continue };
        d.decide(revision)?;
        if let Some(stored) = pool {
            from_store(d, stored)?;
        }
    }
    if let Some(f) = d.fleet.as_mut() {
        if f.alone_changed() {
            let revision = f.revision;
            d.decide(revision)?;
        }
    }
    d.publish_view();
    Ok(())
}

/// One stored pool, validated with the pool it replaced and applied.
fn from_store(d: &mut Daemon, stored: Stored) -> Result<()> {
    let started = Instant::now();
    let Some(f) = d.fleet.as_mut() else { return Ok(()) };
    let why = Cause::Store(stored.revision);
    let parsed = lb::fleet::parse_pool(&f.url, stored.revision, &stored.bytes, stored.previous.as_deref());
    let refuse = |d: &mut Daemon, reason: String| {
        if let Some(f) = d.fleet.as_mut() {
            f.refused = Some(Refusal { revision: stored.revision, reason });
        }
    };
    let pool = match parsed {
        Ok(pool) => pool,
        Err(e) => {
            log(format!("reload refused ({why}): {e}; the current tables keep serving"));
            d.metrics.reload(ReloadResult::Refused, None);
            refuse(d, e.to_string());
            return Ok(());
        }
    };
    let Some((via, sources)) = check(d, why, &pool, &stored.bytes) else {
        refuse(d, format!("{} cannot serve it (this node's log says why)", d.ifc.name));
        return Ok(());
    };
    if apply(d, why, pool, via, sources, started)? {
        if let Some(f) = d.fleet.as_mut() {
            f.pool_revision = stored.revision;
            f.applied_ms = lb::clock::unix_ms();
            f.refused = None;
        }
    } else {
        refuse(d, "the data plane refused it (this node's log says why)".to_string());
    }
    Ok(())
}

/// Hands a checked pool on. VIPs it drops are withdrawn before their services go, VIPs it adds
/// announced once they are served. If the data plane refuses it, the pool and health as they
/// were stay. Returns whether it was applied.
fn apply(d: &mut Daemon, why: Cause, pool: Pool, via: HashMap<IpAddr, IpAddr>, sources: EncapSources, started: Instant) -> Result<bool> {
    d.encap.update(&mut d.dp, sources)?;
    let wanted = distinct_neighbours(&pool, &via);
    d.neighbours.set_via(&mut d.dp, via)?;
    d.neighbours.resolve_new(&mut d.dp, &d.ifc, &mut d.nl, &wanted)?;
    let applying = Instant::now();
    let previous = std::mem::replace(&mut d.configured, pool.clone());
    let kept = d.health.renew(&pool);
    let loads = d.agents.renew(&previous, &pool);
    if let Some(a) = d.announcer.as_mut() {
        let keep: BTreeSet<IpAddr> = vips_of(&pool).intersection(&vips_of(&previous)).copied().collect();
        a.sync(&mut d.nl, &keep)?;
    }
    match d.install_effective(Install::Reload) {
        Ok(Some(touched)) => {
            if let Some(a) = d.announcer.as_mut() {
                a.sync(&mut d.nl, &vips_of(&pool))?;
            }
            let done = Instant::now();
            d.metrics.reload(ReloadResult::Applied, Some(done - applying));
            log(format!(
                "reload ({why}): {} applied in {:.1} ms ({:.1} ms since reading it): {}",
                d.settings.config.display(),
                (done - applying).as_secs_f64() * 1e3,
                (done - started).as_secs_f64() * 1e3,
                describe_touched(&touched)
            ));
            for line in d.health.summary(&d.configured) {
                log(format!("  health: {line}"));
            }
            d.neighbours.set_list(wanted);
            Ok(true)
        }
        Ok(None) => Ok(false),
        Err(e) => {
            d.configured = previous;
            d.health.restore(kept);
            d.agents.restore(loads);
            log(format!("reload refused ({why}): {e:#}; the current tables keep serving"));
            d.metrics.reload(ReloadResult::Refused, None);
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_change_of_the_previous_pool_alone_is_a_change() {
        let dir = std::env::temp_dir().join(format!("lb-reload-previous-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pool = dir.join("pool.yaml");
        let text = b"previous: old.yaml\nservices: []\n";
        std::fs::write(dir.join("old.yaml"), "services: []\n").unwrap();
        let before = super::content_digest(&pool, text);
        assert_eq!(before, super::content_digest(&pool, text), "the same files, the same digest");
        std::fs::write(dir.join("old.yaml"), "services:\n  - {name: web, vip: 10.0.0.1, port: 80, backends: []}\n").unwrap();
        assert_ne!(before, super::content_digest(&pool, text), "SIGHUP must apply a new previous pool");
        assert_eq!(super::content_digest(&pool, b"services: []\n"), xxhash_rust::xxh64::xxh64(b"services: []\n", 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
