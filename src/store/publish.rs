//! A node's view in the store (lb_core::fleet::view), on a thread of its own: the view is put
//! under `KEY/nodes/NODE` bound to a lease of the node's, which the thread keeps alive; a new
//! view is put as soon as the loop hands it over. When the lease has expired (the store was
//! unreachable for longer than its TTL) a new one is granted and the view put again. At an
//! orderly stop the lease is revoked, so the node leaves the fleet's list at once; a node that
//! dies leaves it when its lease runs out.
//!
//! The thread also tells the loop since when it has failed to reach the store ([`Publisher::failing_since`]):
//! a node that can read the store but not write to it (a partition that lets the watch sleep, a
//! full database, a permission) drops out of the others' views all the same, and must know it.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::client::Client;
use crate::log::log;

/// A view's lease: how long after its node last reached the store the view goes.
pub const LEASE_TTL: Duration = Duration::from_secs(5);
/// How often the lease is kept alive (and a failed put tried again).
const KEEP_ALIVE: Duration = Duration::from_millis(1500);
/// How long a stop waits for the lease's revocation before leaving it to run out.
const STOP_WAIT: Duration = Duration::from_secs(1);

pub struct Publisher {
    views: Option<Sender<String>>,
    failing: Arc<Mutex<Option<(Instant, u64)>>>,
    done: Receiver<()>,
}

/// The thread's state between two turns.
struct Keeper {
    client: Arc<Client>,
    key: String,
    lease: i64,
    view: Option<String>,
    written: bool,
    next_keep: Instant,
}

impl Keeper {
    /// One turn: a lease if there is none, the view if it is not written, a keep-alive if due.
    fn turn(&mut self) -> Result<()> {
        let Some(view) = &self.view else {
            self.next_keep = Instant::now() + KEEP_ALIVE;
            return Ok(());
        };
        if self.lease == 0 {
            self.lease = self.client.grant(LEASE_TTL).context("granting the view's lease")?;
            self.written = false;
            self.next_keep = Instant::now() + KEEP_ALIVE;
        }
        if !self.written {
            self.client.put(&self.key, view.as_bytes(), self.lease).context("putting the view")?;
            self.written = true;
        }
        // Whatever was put: a put does not renew the lease.
        if Instant::now() >= self.next_keep {
            self.next_keep = Instant::now() + KEEP_ALIVE;
            if !self.client.keep_alive(self.lease).context("keeping the view's lease alive")? {
                // Expired while the store was away: its view is gone; a new lease, the view again.
                self.lease = 0;
                self.written = false;
                return self.turn();
            }
        }
        Ok(())
    }
}

impl Publisher {
    /// Starts keeping `key` (the node's view key) in the store.
    pub fn start(client: Arc<Client>, key: String) -> Result<Publisher> {
        let (tx, rx) = channel::<String>();
        let (done_tx, done) = channel::<()>();
        let failing = Arc::new(Mutex::new(None));
        let shared = failing.clone();
        std::thread::Builder::new()
            .name("lb-store-view".into())
            .spawn(move || {
                let mut k = Keeper { client, key, lease: 0, view: None, written: true, next_keep: Instant::now() + KEEP_ALIVE };
                let set_failing = |v: Option<(Instant, u64)>| {
                    if let Ok(mut f) = shared.lock() {
                        *f = v;
                    }
                };
                let mut failed = false;
                // When the store last took a call of this thread's: the lease runs from there.
                let mut last_ok = (Instant::now(), lb::clock::unix_ms());
                loop {
                    match rx.recv_timeout(k.next_keep.saturating_duration_since(Instant::now())) {
                        Ok(v) => {
                            // Only the newest view matters.
                            k.view = Some(rx.try_iter().last().unwrap_or(v));
                            k.written = false;
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                    match k.turn() {
                        Ok(()) => {
                            last_ok = (Instant::now(), lb::clock::unix_ms());
                            if std::mem::take(&mut failed) {
                                log(format!("store: this node's view is in the store again ({})", k.key));
                                set_failing(None);
                            }
                        }
                        Err(e) => {
                            if !failed {
                                log(format!("store: {e:#}; trying again every {:.1} s", KEEP_ALIVE.as_secs_f64()));
                                failed = true;
                                set_failing(Some(last_ok));
                            }
                            // A lease the store does not know (expired, revoked) is replaced.
                            if format!("{e:#}").contains("lease not found") {
                                (k.lease, k.written) = (0, false);
                            }
                            k.next_keep = Instant::now() + KEEP_ALIVE;
                        }
                    }
                }
                // A store that does not answer is not waited for at a stop: the lease runs out.
                if k.lease != 0 && !failed {
                    let _ = k.client.revoke(k.lease);
                }
                let _ = done_tx.send(());
            })
            .context("starting the store's view thread")?;
        Ok(Publisher { views: Some(tx), failing, done })
    }

    /// Hands over a new view (JSON).
    pub fn publish(&self, view: String) {
        if let Some(tx) = &self.views {
            let _ = tx.send(view);
        }
    }

    /// While the view fails to reach the store: since when (the last call the store took, as an
    /// instant and in Unix milliseconds); None while it is there.
    pub fn failing_since(&self) -> Option<(Instant, u64)> {
        self.failing.lock().ok().and_then(|f| *f)
    }
}

impl Drop for Publisher {
    /// Revokes the lease (the view goes at once), waiting at most STOP_WAIT: a stop must not
    /// wait on a store that is slow to answer (the lease then runs out by itself).
    fn drop(&mut self) {
        self.views.take();
        let _ = self.done.recv_timeout(STOP_WAIT);
    }
}
