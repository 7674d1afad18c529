//! The fleet store's client: etcd v3 through its JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`,
//! `/v3/watch`, `/v3/lease/...`, which every etcd since 3.4 serves on its client port), over a
//! synchronous HTTP client (ureq). lb stays one poll loop: the watch runs on a thread of its own
//! ([`feed`]), and so do the node's lease and view ([`publish`]); neither ever blocks the loop.
//!
//! Why the gateway and not a gRPC client: etcd's Rust gRPC client needs an async runtime and a
//! protobuf and HTTP/2 stack (tokio, tonic, prost, hyper), about twice what lb builds today,
//! for the six calls lb makes; the gateway is etcd's documented JSON mapping of the same API,
//! with the same transactions, leases and watches. What lb keeps where is lb_core::fleet.

pub mod client;
pub mod feed;
pub mod publish;
mod tls;

pub use client::{Client, Pushed, Snapshot, TlsArgs};

/// How long one call to one member may take.
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The store's client and the first read of the pool's range, with which `lb attach --config
/// etcd://...` starts.
pub type FirstRead = (Client, Snapshot);
