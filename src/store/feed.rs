//! The watch on a pool's key range, on a thread of its own: it reads the whole range once, then
//! follows every change from the revision after it, and hands each to the serve loop in order
//! (a byte on a pipe wakes the loop's poll). When the store cannot be reached it says so once,
//! retries with back-off (0.1 s doubling to 5 s, on every member in turn) and, when it can again,
//! reads the whole range anew, so that the loop catches up to the newest revision.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use nix::fcntl::{fcntl, FcntlArg, OFlag};

use super::client::{Change, Client, Snapshot, WatchAnswer};
use lb::fleet::StoreUrl;

/// What the watch tells the loop, in the order it happened.
#[derive(Debug, Clone)]
pub enum News {
    /// The whole range at a revision: at start, and after each outage or compaction.
    Snapshot(Snapshot),
    /// One revision's changes.
    Revision(u64, Vec<Change>),
    /// The store stopped answering: why (once an outage).
    Lost(String),
}

/// The first retry's wait, and the longest.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

pub struct Feed {
    news: Receiver<News>,
    wake_read: OwnedFd,
}

impl AsFd for Feed {
    /// Readable when news arrived.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.wake_read.as_fd()
    }
}

impl Feed {
    /// Starts watching `url`'s range, from a whole read of it.
    pub fn start(client: Arc<Client>, url: &StoreUrl) -> Result<Feed> {
        let (wake_read, wake_write) = nix::unistd::pipe().context("creating the store watch's wake-up pipe")?;
        fcntl(wake_read.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        let (tx, news) = channel();
        let url = url.clone();
        std::thread::Builder::new()
            .name("lb-store-watch".into())
            .spawn(move || follow(&client, &url, &tx, &wake_write))
            .context("starting the store's watch")?;
        Ok(Feed { news, wake_read })
    }

    /// The news that arrived, oldest first.
    pub fn drain(&self) -> Vec<News> {
        let mut buf = [0u8; 256];
        while matches!(nix::unistd::read(self.wake_read.as_raw_fd(), &mut buf), Ok(n) if n > 0) {}
        self.news.try_iter().collect()
    }
}

/// The watch thread: until the loop is gone (its receiver dropped).
fn follow(client: &Client, url: &StoreUrl, tx: &Sender<News>, wake: &OwnedFd) {
    let send = |n: News| {
        let ok = tx.send(n).is_ok();
        let _ = nix::unistd::write(wake, &[1]);
        ok
    };
    let mut wait = BACKOFF.0;
    let mut lost = false;
    loop {
        // A whole read, on any member that answers: the store is lost only when none does.
        let snap = match client.range(&url.key, &url.range_end()) {
            Ok(snap) => snap,
            Err(e) => {
                if !lost && !send(News::Lost(format!("{e:#}"))) {
                    return;
                }
                lost = true;
                std::thread::sleep(wait);
                wait = (wait * 2).min(BACKOFF.1);
                continue;
            }
        };
        (lost, wait) = (false, BACKOFF.0);
        let mut revision = snap.revision;
        if !send(News::Snapshot(snap)) {
            return;
        }
        // Then every change, until the watch breaks (a member that died, a quiet WATCH_IDLE, a
        // compaction): the next whole read goes on from there, on another member if need be.
        match watch(client, url, &mut revision, &send) {
            Ok(()) => return,
            Err(_) => std::thread::sleep(BACKOFF.0),
        }
    }
}

/// Follows the range from `revision` + 1, sending each revision's changes; Ok when the loop is
/// gone, an error when the watch broke.
fn watch(client: &Client, url: &StoreUrl, revision: &mut u64, send: &impl Fn(News) -> bool) -> Result<()> {
    let mut watch = client.watch(&url.key, &url.range_end(), *revision + 1)?;
    loop {
        match watch.next()? {
            WatchAnswer::Created => {}
            WatchAnswer::Ended(why) => anyhow::bail!("the store ended the watch ({why})"),
            WatchAnswer::Events(events) => {
                // Grouped by revision, in order: a transaction's keys come together.
                for (rev, changes) in by_revision(events) {
                    *revision = (*revision).max(rev);
                    if !send(News::Revision(rev, changes)) {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// A watch answer's changes, one group per revision, in order: a transaction's keys come
/// together (the pool and the pool it replaced are one revision).
fn by_revision(events: Vec<Change>) -> Vec<(u64, Vec<Change>)> {
    let mut out: Vec<(u64, Vec<Change>)> = Vec::new();
    for e in events {
        match out.last_mut() {
            Some((rev, changes)) if *rev == e.revision => changes.push(e),
            _ => out.push((e.revision, vec![e])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(key: &str, revision: u64) -> Change {
        Change { key: key.to_string(), value: Some(Vec::new()), revision, lease: 0 }
    }

    #[test]
    fn a_watch_answer_is_cut_into_revisions_in_order() {
        let groups = by_revision(vec![change("/p", 7), change("/p/previous", 7), change("/p/nodes/a", 8), change("/p/nodes/b", 9)]);
        let shape: Vec<(u64, Vec<&str>)> = groups.iter().map(|(r, c)| (*r, c.iter().map(|c| c.key.as_str()).collect())).collect();
        assert_eq!(shape, vec![(7, vec!["/p", "/p/previous"]), (8, vec!["/p/nodes/a"]), (9, vec!["/p/nodes/b"])]);
        assert!(by_revision(Vec::new()).is_empty());
    }
}
