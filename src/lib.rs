//! `lb`: an XDP Layer-4 load balancer.
//!
//! Almost everything here is pure: the pool configuration ([`config`]), the table builders that
//! compile a backend pool into a fixed destination table ([`table`]), the comparison of two pools
//! ([`diff`]), the reload planner ([`plan`]), the flow hash ([`flowhash`]), the rule that makes a changed slot stable again ([`stable`]), QUIC-LB's
//! connection IDs ([`quic_lb`]), counters ([`stats`]) and the text and JSON that the commands print
//! ([`report`]). None of it needs root, a kernel or libbpf, so every rule of the
//! design can be tested anywhere. The one exception is [`dataplane`], the only module that talks
//! to the kernel (BPF maps and programs, links, netlink); nothing in the pure modules uses it, and
//! it uses the pure modules' types only as data, never their builders or planner.
//!
//! [`balancer`] joins the two: a loaded data plane and the controller's mirror of its maps. It
//! builds the tables, plans each change and hands the operations to the data plane to execute,
//! so the imports run one way: balancer -> dataplane -> core types, and balancer -> core.

pub mod balancer;
pub mod config;
pub mod dataplane;
pub mod diff;
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
