//! Everything `lb attach` was asked to do, as one validated value: src/commands/attach.rs makes it
//! from the flags and the pool, once; nothing downstream reads a flag again.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::xdp::ModeArg;

/// Everything `lb attach` was asked to do, validated.
pub struct Settings {
    pub iface: String,
    pub config: PathBuf,
    pub mode: ModeArg,
    pub stats_interval: Option<Duration>,
    /// Slots of the data plane's destination-table array.
    pub table_capacity: u32,
    /// Entries of the connection-tracking flow table.
    pub conntrack_size: u32,
    /// Idle timeouts of tracked (TCP, UDP) flows.
    pub conntrack_timeouts: (Duration, Duration),
    /// Track flows from their second packet (see `lb attach --conntrack-guard`).
    pub conntrack_guard: bool,
    /// Encrypted QUIC-LB IDs each CPU decodes a second at most (`--quic-decode-budget`; 0: no
    /// bound).
    pub quic_decode_budget: u32,
    /// How long to wait at start for backends' MACs before attaching anyway.
    pub resolve_timeout: Duration,
    /// Quiet time after the last file event before a reload.
    pub reload_delay: Duration,
    /// How often the file is re-read even without events (and lost watches re-armed).
    pub recheck_interval: Duration,
    /// `--encap-source`: the outer source of encapsulated packets, at most one per family, with
    /// how many leading bits stay fixed (the rest vary with the flow).
    pub encap_sources: Vec<(IpAddr, u8)>,
    /// `--pin`: the root of bpffs pins; the data plane outlives this process.
    pub pin: Option<PathBuf>,
    /// `--metrics`: where to serve /metrics and the status page.
    pub metrics: Option<SocketAddr>,
    /// `--announce`: the interface that holds the VIPs as host addresses, for BGP.
    pub announce: Option<String>,
    /// `--config etcd://...`: the fleet's store the pool comes from (`config` is then its URL).
    pub store: Option<StoreSettings>,
}

/// Where a fleet node's pool comes from, and the name it goes by there.
pub struct StoreSettings {
    pub url: lb::fleet::StoreUrl,
    /// `--node-name`: its view's key under the pool's.
    pub node: String,
}
