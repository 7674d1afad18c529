//! `lb attach --config etcd://...`: what the node knows of its fleet's store. The store's keys
//! as last read (the pool, the pool it replaced, every live node's view), the revision reached,
//! whether the store answers, and the decisions the fleet shares (lb_core::fleet::decide),
//! made from the views at each revision, in order, so that every node makes them at the same
//! revision. The watch and the node's own view run on threads of src/store/; reload.rs applies
//! the pool, state.rs installs the decisions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;

use lb::fleet::decide::{down_by_majority, Key};
use lb::fleet::url::Entry;
use lb::fleet::view::{NodeView, Refusal};
use lb::config;
use lb::fleet::StoreUrl;

use crate::log::log;
use crate::store::feed::{Feed, News};
use crate::store::publish::{Publisher, LEASE_TTL};
use crate::store::{Client, Snapshot};

/// A pool read from the store, with the pool it replaced.
pub(super) struct Stored {
    /// The revision that wrote the pool.
    pub(super) revision: u64,
    pub(super) bytes: Vec<u8>,
    pub(super) previous: Option<Vec<u8>>,
}

/// What one piece of news changed.
pub(super) enum Seen {
    /// The store reached `revision`; `pool` is the stored pool when it, or the pool it replaced,
    /// changed since the last read.
    Revision { revision: u64, pool: Option<Stored> },
    /// The store stopped answering.
    Lost,
}

pub(super) struct Fleet {
    pub(super) url: StoreUrl,
    pub(super) node: String,
    feed: Feed,
    publisher: Publisher,
    pool: Option<(Vec<u8>, u64)>,
    previous: Option<Vec<u8>>,
    views: BTreeMap<String, NodeView>,
    /// The newest revision read.
    pub(super) revision: u64,
    /// The digest of the pool last read (applied or refused).
    read: u64,
    /// The revision of the pool being served, when it came from the store, and when.
    pub(super) pool_revision: u64,
    pub(super) applied_ms: u64,
    /// The revision the shared decisions were last made at, and what they are.
    pub(super) decided: u64,
    down: BTreeSet<Key>,
    /// The newest pool revision refused, and why.
    pub(super) refused: Option<Refusal>,
    /// Since when the store has not answered (and in Unix milliseconds, for lb status).
    lost: Option<(Instant, u64)>,
    /// Whether the node decided alone at the last look (for saying so once).
    was_alone: bool,
    last_view: String,
    last_status: String,
    /// Each installed service's table digest, as of the last install.
    pub(super) digests: BTreeMap<String, String>,
    /// News drained from the watch, not taken yet.
    queue: std::collections::VecDeque<News>,
    /// Where lb status reads this node's word on the store.
    status_file: Option<PathBuf>,
}

impl Drop for Fleet {
    /// The status file goes with the controller: a later one on the interface, perhaps of a
    /// file, must not show this one's store.
    fn drop(&mut self) {
        if let Some(p) = &self.status_file {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Where `lb attach --config etcd://...` keeps what `lb status` shows of the store, beside the
/// announce state (one file per interface and network namespace; gone at reboot).
pub(crate) fn status_path(iface: &str) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let netns = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
    PathBuf::from("/run/lb/fleet").join(format!("{iface}.net{netns}.json"))
}

impl Fleet {
    /// Follows `url` from `first`, the read the node started from (its pool is being applied).
    pub(super) fn start(url: StoreUrl, node: String, client: Client, first: &Snapshot) -> Result<Fleet> {
        let client = Arc::new(client);
        let feed = Feed::start(client.clone(), &url)?;
        let publisher = Publisher::start(client, url.node_key(&node))?;
        let mut f = Fleet {
            url,
            node,
            feed,
            publisher,
            pool: None,
            previous: None,
            views: BTreeMap::new(),
            revision: first.revision,
            read: 0,
            pool_revision: 0,
            applied_ms: 0,
            decided: first.revision,
            down: BTreeSet::new(),
            refused: None,
            lost: None,
            was_alone: false,
            last_view: String::new(),
            last_status: String::new(),
            digests: BTreeMap::new(),
            queue: Default::default(),
            status_file: None,
        };
        f.replace(first);
        if let Some(s) = f.stored() {
            f.read = config::pool_digest(&s.bytes, s.previous.as_deref());
            f.pool_revision = s.revision;
            f.applied_ms = lb::clock::unix_ms();
        }
        // Nothing is decided yet: the start served this node's own view (every backend up), and
        // the first revision read decides, installing the fleet's decision if it differs.
        Ok(f)
    }

    pub(super) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.feed)
    }

    /// The pool as last read, if the store holds one.
    pub(super) fn stored(&self) -> Option<Stored> {
        let (bytes, revision) = self.pool.clone()?;
        Some(Stored { revision, bytes, previous: self.previous.clone() })
    }

    /// Takes what the watch sent since the last call, for [`Fleet::next`]: once a turn of the
    /// loop, so that a store that never stops changing cannot keep the loop from its other work.
    pub(super) fn refill(&mut self) {
        self.queue.extend(self.feed.drain());
    }

    /// The next piece of news taken, applied to what the node knows; None when there is no
    /// more. One at a time, so that each revision's decisions are made with the views as
    /// they were at that revision.
    pub(super) fn next(&mut self) -> Option<Seen> {
        Some(match self.queue.pop_front()? {
            News::Lost(why) => {
                if self.lost.is_none() {
                    log(format!("store: {} does not answer ({why}); serving revision {} as applied, trying again", self.url, self.pool_revision));
                    self.lost = Some((Instant::now(), lb::clock::unix_ms()));
                }
                Seen::Lost
            }
            News::Snapshot(snap) => {
                if let Some((since, _)) = self.lost.take() {
                    log(format!(
                        "store: {} answers again after {:.1} s, at revision {}; catching up",
                        self.url,
                        since.elapsed().as_secs_f64(),
                        snap.revision
                    ));
                }
                self.replace(&snap);
                self.revision = snap.revision;
                self.seen(snap.revision)
            }
            News::Revision(revision, changes) => {
                for c in changes {
                    self.change(&c.key, c.value, c.revision, c.lease);
                }
                self.revision = revision;
                self.seen(revision)
            }
        })
    }

    /// What reaching `revision` means for the pool: it is read again when its bytes (or the
    /// pool they replaced) changed, or when this node refused an earlier revision of it (a
    /// reason of its own, such as a route, may be gone now).
    fn seen(&mut self, revision: u64) -> Seen {
        let Some((bytes, written)) = &self.pool else { return Seen::Revision { revision, pool: None } };
        let digest = config::pool_digest(bytes, self.previous.as_deref());
        let retry = self.refused.as_ref().is_some_and(|r| r.revision < *written);
        if digest != self.read || retry {
            self.read = digest;
            return Seen::Revision { revision, pool: self.stored() };
        }
        // The same bytes written again (a tool that puts what it has): still the pool served,
        // now at this revision.
        if self.refused.is_none() && self.pool_revision > 0 {
            self.pool_revision = self.pool_revision.max(*written);
        }
        Seen::Revision { revision, pool: None }
    }

    /// The range as a whole read holds it.
    fn replace(&mut self, snap: &Snapshot) {
        self.pool = None;
        self.previous = None;
        self.views.clear();
        for kv in &snap.kvs {
            self.change(&kv.key, Some(kv.value.clone()), kv.mod_revision, kv.lease);
        }
    }

    /// One key's new value (None: deleted), written at `revision` under `lease`; views count as
    /// NodeView::from_store says.
    fn change(&mut self, key: &str, value: Option<Vec<u8>>, revision: u64, lease: i64) {
        match self.url.classify(key) {
            Entry::Pool => self.pool = value.map(|v| (v, revision)),
            Entry::Previous => self.previous = value,
            Entry::Node(node) => match value.and_then(|v| NodeView::from_store(node, &v, lease)) {
                Some(v) => {
                    self.views.insert(node.to_string(), v);
                }
                None => {
                    self.views.remove(node);
                }
            },
            Entry::Other => {}
        }
    }

    /// The fleet's health decision at `revision`: the backends most live nodes see down, or,
    /// for a node that decides alone, `own`. Returns the backends that changed (left, came
    /// back) when the decision did.
    pub(super) fn decide(&mut self, revision: u64, own: BTreeSet<Key>) -> Option<(Vec<Key>, Vec<Key>)> {
        let down = if self.alone() { own } else { down_by_majority(self.views.values()) };
        if down == self.down {
            return None;
        }
        let left = down.difference(&self.down).cloned().collect();
        let back = self.down.difference(&down).cloned().collect();
        self.down = down;
        self.decided = revision;
        Some((left, back))
    }

    pub(super) fn down(&self) -> &BTreeSet<Key> {
        &self.down
    }

    /// How many live nodes see `key` down, of how many.
    pub(super) fn count_down(&self, key: &Key) -> (usize, usize) {
        (self.views.values().filter(|v| v.sees_down(&key.0, &key.1)).count(), self.views.len())
    }

    /// The live nodes' views (empty while the node decides alone).
    pub(super) fn views(&self) -> Vec<&NodeView> {
        if self.alone() {
            return Vec::new();
        }
        self.views.values().collect()
    }

    /// Whether the node decides alone: the store has not answered its watch, or taken its
    /// view, for longer than a view's lease (by then the other nodes have dropped this node's
    /// view: it is not one of theirs any more, nor they of its).
    pub(super) fn alone(&self) -> bool {
        let watch = self.lost.map(|(since, _)| since);
        let view = self.publisher.failing_since().map(|(since, _)| since);
        watch.into_iter().chain(view).min().is_some_and(|since| since.elapsed() > LEASE_TTL)
    }

    /// Whether the node began or stopped deciding alone since the last call.
    pub(super) fn alone_changed(&mut self) -> bool {
        let now = self.alone();
        let changed = now != self.was_alone;
        self.was_alone = now;
        if changed && now {
            log(format!(
                "store: unreachable for over {} s: this node decides alone (its own health checks and agents), keeping revision {} of the pool",
                LEASE_TTL.as_secs(),
                self.pool_revision
            ));
        }
        changed
    }

    /// Whether the store answers: its watch, and its writes of this node's view.
    pub(super) fn connected(&self) -> bool {
        self.lost.is_none() && self.publisher.failing_since().is_none()
    }

    /// Since when (Unix milliseconds) the store has not answered.
    pub(super) fn lost_since_ms(&self) -> Option<u64> {
        let view = self.publisher.failing_since().map(|(_, ms)| ms);
        self.lost.map(|(_, ms)| ms).into_iter().chain(view).min()
    }

    /// Writes what `lb status` shows of the store (status_path), when it changed.
    pub(super) fn write_status(&mut self, iface: &str, view: &NodeView) {
        let status = serde_json::json!({
            "store": self.url.to_string(),
            "node": self.node,
            "connected": self.connected(),
            "lost_since_ms": self.lost_since_ms(),
            "alone": view.alone,
            "revision": view.revision,
            "pool_revision": view.pool_revision,
            "store_revision": self.revision,
            "applied_ms": view.applied_ms,
            "refused": view.refused.as_ref().map(|r| serde_json::json!({"revision": r.revision, "reason": r.reason})),
        });
        let text = status.to_string();
        if text == self.last_status {
            return;
        }
        let path = status_path(iface);
        self.status_file = Some(path.clone());
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, &text)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            log(format!("store: cannot write {} for lb status: {}", path.display(), crate::log::os_text(&e)));
        }
        self.last_status = text;
    }

    /// Hands the node's view to the store when it changed.
    pub(super) fn publish(&mut self, view: NodeView) {
        let text = view.to_json();
        if text != self.last_view {
            self.publisher.publish(text.clone());
            self.last_view = text;
        }
    }
}
