//! `lb`: the kernel-free core of an XDP Layer-4 load balancer.
//!
//! Everything here is pure: the pool configuration ([`config`]), the table builders that compile
//! a backend pool into a fixed destination table ([`table`]), the comparison of two pools
//! ([`diff`]) and the text and JSON that the commands print ([`report`]). None of it needs root,
//! a kernel or libbpf, so every rule of the design can be tested anywhere.

pub mod config;
pub mod diff;
pub mod flowhash;
pub mod report;
pub mod table;
