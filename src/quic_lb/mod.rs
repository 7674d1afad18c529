//! QUIC-LB (draft-ietf-quic-load-balancers-21, "Generating Routable QUIC Connection IDs"): the
//! connection-ID format in which servers carry their server ID, so that a balancer can route a
//! QUIC connection by it through NAT rebinding and migration. Kernel-free: the codec here is what
//! `lb quic-lb` and the connection-ID generator for servers use, and what the data plane's
//! decoder is checked against.
//!
//! Work in progress (issue 26): the codec and the draft's test vectors, a server's parameters as
//! text ([`ServerParams`]) and, with the `quinn` feature, a connection-ID generator for quinn
//! servers ([`RoutableIds`]); no pool keys or data plane yet.

mod codec;
#[cfg(feature = "quinn")]
mod generator;
mod server;

pub use codec::{decode_server_id, encode, Config, ConfigError, UNROUTABLE};
#[cfg(feature = "quinn")]
pub use generator::RoutableIds;
pub use server::ServerParams;
