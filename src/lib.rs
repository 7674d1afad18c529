//! `lb`: an XDP Layer-4 load balancer. This package is the `lb` binary and the balancer, on top
//! of two crates that are its layers (docs/architecture.md):
//!
//! - `lb-core` (crates/core), the kernel-free core: the pool model, the table builders, the
//!   planner, the flow hash, load arithmetic, QUIC-LB, counters and reports. It builds without
//!   clang, libbpf or root, and cannot name the data plane: it does not depend on it.
//! - `lb-dataplane` (crates/dataplane), the only code that talks to the kernel: the BPF
//!   programs and their maps. It uses the core's types as data.
//!
//! [`balancer`] joins the two: a loaded data plane and the controller's mirror of its maps. It
//! builds the tables, plans each change and hands the operations to the data plane to execute.
//! The core's modules and the data plane are re-exported under their old names (`lb::table`,
//! `lb::dataplane`, ...), so that the binary, the tests and the benchmarks name them one way.

pub mod balancer;

pub use lb_core::{clock, config, diff, fleet, flowhash, health, load, metrics, plan, quic_lb, report, stable, stats, table};
pub use lb_dataplane as dataplane;
