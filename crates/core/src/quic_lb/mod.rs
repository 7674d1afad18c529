//! QUIC-LB (draft-ietf-quic-load-balancers-21, "Generating Routable QUIC Connection IDs"): the
//! connection-ID format in which servers carry their server ID, so that a balancer can route a
//! QUIC connection by it through NAT rebinding and migration (docs/quic-lb.md). Kernel-free:
//! - `codec`: encoding and decoding IDs (plain, single-pass AES-128, four-pass Feistel), what
//!   the data plane's decoder (crates/dataplane/src/bpf/quic.h) is checked against;
//! - `ids`: server IDs as pool files write them, and derived from a backend's identity;
//! - `server`: what one server needs to issue routable IDs ([`ServerParams`]), as the text
//!   `lb quic-lb` prints and servers read;
//! - `generator` (cargo feature `quinn`): a connection-ID generator for quinn servers
//!   (`RoutableIds`).

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

/// The draft's test vectors as (config rotation, server ID, nonce, key, connection ID), in hex:
/// appendix B.1 (its second row's fields zero-padded), B.2 (its fourth row under the rotation
/// its first octet says, 0), the worked example of section 5.4.2.4, and quiche's RunOutOfNonces
/// vector (docs/quic-lb.md, "Conformance"). The codec's tests and the data plane's
/// (tests/root_quic_lb.rs) both check them.
pub const DRAFT_VECTORS: &[(u8, &str, &str, Option<&str>, &str)] = &[
    (0, "c4605e", "4504cc4f", None, "07c4605e4504cc4f"),
    (1, "350d28b420", "03487d970b", None, "2a350d28b42003487d970b"),
    (0, "ed793a", "ee080dbf", Some("8f95f09245765f80256934e50c66207f"), "0720b1d07b359d3c"),
    (1, "ed793a51d49b8f5fab65", "ee080dbf48", Some("8f95f09245765f80256934e50c66207f"), "2fcc381bc74cb4fbad2823a3d1f8fed2"),
    (2, "ed793a51d49b8f5f", "ee080dbf48c0d1e5", Some("8f95f09245765f80256934e50c66207f"), "504dd2d05a7b0de9b2b9907afb5ecf8cc3"),
    (0, "ed793a51d49b8f5fab", "ee080dbf48c0d1e55d", Some("8f95f09245765f80256934e50c66207f"), "125779c9cc86beb3a3a4a3ca96fce4bfe0cdbc"),
    (0, "31441a", "9c69c275", Some("fdf726a9893ec05c0632d3956680baf0"), "0767947d29be054a"),
    (0, "ed793a", "edbeadde", Some("8f95f09245765f80256934e50c66207f"), "0760a75aea676ad6"),
];
