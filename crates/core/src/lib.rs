//! `lb-core`: the kernel-free core of lb, the XDP Layer-4 load balancer.
//!
//! Everything here is pure: the pool configuration and its validation ([`config`]), the table
//! builders that compile a backend pool into a fixed destination table ([`table`]), the
//! comparison of two pools ([`diff`]), the reload planner ([`plan`]), the flow hash
//! ([`flowhash`]), the rule that makes a changed slot stable again ([`stable`]), health's
//! rise and fall ([`health`]), load-aware weights ([`load`]), the fleet's shared state and decisions ([`fleet`]), QUIC-LB's connection IDs
//! ([`quic_lb`]), the data plane's counters by name ([`counters`]) and their snapshots ([`stats`]), the metrics model ([`metrics`]) and the text and JSON
//! that the commands print ([`report`]). None of it needs root, a kernel, libbpf or clang, so
//! every rule of the design can be tested anywhere, and the crate has no way to reach the data
//! plane: it depends on neither `lb-dataplane` nor libbpf.
//!
//! # A QUIC server whose connection IDs lb routes
//!
//! With the `quinn` feature, [`quic_lb::RoutableIds`] is a quinn connection-ID generator that
//! issues QUIC-LB IDs for one server. Its parameters are what `lb quic-lb --backend NAME` prints
//! (the service's configuration, the server's ID and, for an encrypted ID, the key):
//!
//! ```ignore
//! // Cargo.toml: lb-core = { path = "…/crates/core", features = ["quinn"] }, quinn = "0.11"
//! use lb_core::quic_lb::{RoutableIds, ServerParams};
//!
//! // `lb quic-lb -c pool.yaml -b b1 > params.yaml` on the balancer, shipped with the server.
//! let params = ServerParams::parse(&std::fs::read_to_string("params.yaml")?)?;
//! let mut endpoint_config = quinn::EndpointConfig::default();
//! // A fresh generator (its own random counter start) for every connection quinn makes.
//! endpoint_config.cid_generator(RoutableIds::factory(params)?);
//! let endpoint = quinn::Endpoint::new(endpoint_config, Some(server_config), socket, runtime)?;
//! ```
//!
//! (Marked `ignore` only because it needs a TLS configuration and a runtime to run.)
//! `tools/quic-echo` is such a server, built on this crate alone.

pub mod clock;
pub mod config;
pub mod counters;
pub mod diff;
pub mod fleet;
pub mod flowhash;
pub mod health;
pub mod load;
pub mod metrics;
pub mod plan;
pub mod quic_lb;
pub mod report;
pub mod stable;
pub mod stats;
pub mod table;
