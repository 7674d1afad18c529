//! QUIC-LB (draft-ietf-quic-load-balancers-21, "Generating Routable QUIC Connection IDs"): the
//! connection-ID format in which servers carry their server ID, so that a balancer can route a
//! QUIC connection by it through NAT rebinding and migration. Kernel-free: the codec here is what
//! `lb quic-lb` and the connection-ID generator for servers use, and what the data plane's
//! decoder is checked against.
//!
//! Work in progress (issue 26): the codec and the draft's test vectors, and a server's parameters
//! as text ([`ServerParams`]); no pool keys, data plane or generator yet.

mod codec;
mod server;

pub use codec::{decode_server_id, encode, Config, ConfigError, UNROUTABLE};
pub use server::ServerParams;
