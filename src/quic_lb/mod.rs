//! QUIC-LB (draft-ietf-quic-load-balancers-21, "Generating Routable QUIC Connection IDs"): the
//! connection-ID format in which servers carry their server ID, so that a balancer can route a
//! QUIC connection by it through NAT rebinding and migration (docs/quic-lb.md). Kernel-free:
//! - `codec`: encoding and decoding IDs (plain, single-pass AES-128, four-pass Feistel), what
//!   the data plane's decoder (src/bpf/quic.h) is checked against;
//! - `ids`: server IDs as pool files write them, and derived from a backend's identity;
//! - `server`: what one server needs to issue routable IDs ([`ServerParams`]), as the text
//!   `lb quic-lb` prints and servers read;
//! - `generator` (cargo feature `quinn`): a connection-ID generator for quinn servers
//!   ([`RoutableIds`]).

mod codec;
#[cfg(feature = "quinn")]
mod generator;
mod ids;
mod server;

pub use codec::{decode_server_id, encode, Config, ConfigError, UNROUTABLE};
#[cfg(feature = "quinn")]
pub use generator::RoutableIds;
pub use ids::{derived_server_id, hex, parse_hex};
pub use server::ServerParams;
