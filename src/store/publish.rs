//! A node's view in the store (lb_core::fleet::view), on a thread of its own: the view is put
//! under `KEY/nodes/NODE` bound to a lease of the node's, which the thread keeps alive; a new
//! view is put as soon as the loop hands it over. When the lease has expired (the store was
//! unreachable for longer than its TTL) a new one is granted and the view put again. At an
//! orderly stop the lease is revoked, so the node leaves the fleet's list at once; a node that
//! dies leaves it when its lease runs out.

use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::client::Client;
use crate::log::log;

/// A view's lease: how long after its node last reached the store the view goes.
pub const LEASE_TTL: Duration = Duration::from_secs(5);
/// How often the lease is kept alive (and a failed put tried again).
const KEEP_ALIVE: Duration = Duration::from_millis(1500);

pub struct Publisher {
    views: Option<Sender<String>>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Starts keeping `key` (the node's view key) in the store.
    pub fn start(client: Arc<Client>, key: String) -> Result<Publisher> {
        let (tx, rx) = channel::<String>();
        let thread = std::thread::Builder::new()
            .name("lb-store-view".into())
            .spawn(move || {
                let mut lease = 0i64;
                let mut view: Option<String> = None;
                let mut written = true;
                let mut failing: Option<String> = None;
                let mut next_keep = Instant::now() + KEEP_ALIVE;
                loop {
                    match rx.recv_timeout(next_keep.saturating_duration_since(Instant::now())) {
                        Ok(v) => {
                            // Only the newest view matters.
                            view = Some(rx.try_iter().last().unwrap_or(v));
                            written = false;
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                    let Some(v) = &view else { continue };
                    let step = (|| -> Result<()> {
                        if lease == 0 {
                            lease = client.grant(LEASE_TTL).context("granting the view's lease")?;
                            written = false;
                        }
                        if !written {
                            client.put(&key, v.as_bytes(), lease).context("putting the view")?;
                            written = true;
                        } else if Instant::now() >= next_keep && !client.keep_alive(lease).context("keeping the view's lease alive")? {
                            // Expired while the store was away: its view is gone; a new lease and
                            // the view again.
                            lease = 0;
                            written = false;
                        }
                        Ok(())
                    })();
                    if Instant::now() >= next_keep {
                        next_keep = Instant::now() + KEEP_ALIVE;
                    }
                    match step {
                        Ok(()) => {
                            if failing.take().is_some() {
                                log(format!("store: this node's view is in the store again ({key})"));
                            }
                        }
                        Err(e) => {
                            if failing.is_none() {
                                log(format!("store: {e:#}; trying again every {:.1} s", KEEP_ALIVE.as_secs_f64()));
                            }
                            failing = Some(format!("{e:#}"));
                            // A lease the store refuses (unknown to it) is replaced.
                            if format!("{e:#}").contains("lease not found") {
                                lease = 0;
                            }
                            next_keep = Instant::now() + KEEP_ALIVE;
                        }
                    }
                }
                // A store that does not answer is not waited for at a stop: the lease runs out.
                if lease != 0 && failing.is_none() {
                    let _ = client.revoke(lease);
                }
            })
            .context("starting the store's view thread")?;
        Ok(Publisher { views: Some(tx), thread: Some(thread) })
    }

    /// Hands over a new view (JSON).
    pub fn publish(&self, view: String) {
        if let Some(tx) = &self.views {
            let _ = tx.send(view);
        }
    }
}

impl Drop for Publisher {
    /// Revokes the lease (the view goes at once), within the client's timeout.
    fn drop(&mut self) {
        self.views.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
