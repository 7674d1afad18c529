//! The fleet's shared state in a store (etcd), kernel-free: where each thing lives under the
//! pool's key ([`url`]), what every node publishes about itself ([`view`]), the rules that turn
//! the live nodes' views into one decision that every node computes alike ([`decide`]), and
//! what `lb fleet` prints ([`summary`]). The client that talks to etcd is the binary's
//! (src/store/); nothing here does I/O.
//!
//! Under a pool key `KEY` (docs/fleet.md, "The store"):
//!
//! - `KEY`: the pool, YAML as a pool file holds it (without `previous:`);
//! - `KEY/previous`: the pool it replaced, written by `lb push` in the same transaction;
//! - `KEY/nodes/NODE`: each node's view (JSON, [`view::NodeView`]), bound to a lease of the
//!   node's, so that a node that dies leaves the list when its lease runs out.

pub mod decide;
pub mod summary;
pub mod url;
pub mod view;

pub use url::StoreUrl;
pub use view::NodeView;

use crate::config::{self, ConfigError, Pool};

/// The pool `url`'s key held at `revision` (its bytes), validated with the pool it replaced (the
/// previous key's bytes, if any), errors named by the URL and the revision: how every reader of
/// a store reads a pool (`lb attach` at start and at each revision, `lb push`).
pub fn parse_pool(url: &StoreUrl, revision: u64, bytes: &[u8], previous: Option<&[u8]>) -> Result<Pool, ConfigError> {
    let (name, previous_name) = url.names_at(revision);
    config::parse_stored(&name, bytes, previous.map(|p| (previous_name.as_path(), p)))
}
