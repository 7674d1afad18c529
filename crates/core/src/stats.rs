//! Counter snapshots of a running load balancer and how `--stats-interval` prints them.
//! Kernel-free: the data plane fills a [`Snapshot`], this module only does arithmetic and text.

use std::fmt::Write;

/// Packets and bytes, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BackendCounters {
    /// The backend's name, or its address when it has none.
    pub label: String,
    pub address: std::net::IpAddr,
    pub weight: u32,
    /// Whether its MAC is resolved (packets to it are dropped as `no_mac` until it is).
    pub mac_known: bool,
    /// For a service with health checks: `healthy`, or `down (reason)`.
    pub health: Option<String>,
    /// For a load-aware service's adjusted backend: `served at 35%: agent 35%`.
    pub load: Option<String>,
    pub traffic: Traffic,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceCounters {
    pub name: String,
    /// `10.99.0.100:80/tcp`
    pub endpoint: String,
    pub traffic: Traffic,
    pub backends: Vec<BackendCounters>,
}

/// Everything the data plane counts, at one moment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    /// Packets sent to a backend.
    pub forwarded: u64,
    /// Packets handed to the kernel unchanged (not for a service).
    pub passed: u64,
    /// Dropped packets by reason, in the data plane's order.
    pub drops: Vec<(&'static str, u64)>,
    /// Connection tracking: hit, miss, new, stale.
    pub conntrack: Vec<(&'static str, u64)>,
    /// ICMP errors about a service's flows sent to the flow's backend (part of `forwarded`).
    pub icmp_forwarded: u64,
    /// Frames addressed to another host's MAC, handed to the kernel unchanged (not in `passed`).
    pub other_host: u64,
    /// The fragment table: recorded, followed, unmatched.
    pub fragments: Vec<(&'static str, u64)>,
    /// QUIC-LB services' packets: routed by connection ID, or fallen back by reason.
    pub quic: Vec<(&'static str, u64)>,
    /// Of those, the encrypted IDs the cipher decoded (not found among the IDs decoded before).
    pub quic_decoded: u64,
    pub services: Vec<ServiceCounters>,
}

impl Snapshot {
    pub fn dropped(&self) -> u64 {
        self.drops.iter().map(|d| d.1).sum()
    }
}

fn rate(now: u64, before: u64, seconds: f64) -> String {
    let d = now.saturating_sub(before) as f64;
    if seconds <= 0.0 {
        return "-".to_string();
    }
    let r = d / seconds;
    if r >= 1e6 {
        format!("{:.2}M/s", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1}k/s", r / 1e3)
    } else {
        format!("{r:.0}/s")
    }
}

/// The text printed every `--stats-interval`, `uptime` seconds after attach: totals since
/// attach, and packet rates over the last `seconds` against the `previous` snapshot (or since
/// attach when there is none).
pub fn text(now: &Snapshot, previous: Option<&Snapshot>, seconds: f64, uptime: f64) -> String {
    let empty = Snapshot::default();
    let prev = previous.unwrap_or(&empty);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "stats at {uptime:.1}s: forwarded {} ({}), passed {} ({}), dropped {} ({})",
        now.forwarded,
        rate(now.forwarded, prev.forwarded, seconds),
        now.passed,
        rate(now.passed, prev.passed, seconds),
        now.dropped(),
        rate(now.dropped(), prev.dropped(), seconds),
    );
    let _ = writeln!(out, "  drops: {}", counter_list(&now.drops));
    if !now.conntrack.is_empty() {
        let _ = writeln!(out, "  conntrack: {}", counter_list(&now.conntrack));
    }
    let _ = writeln!(out, "  icmp: forwarded={}", now.icmp_forwarded);
    if !now.fragments.is_empty() {
        let _ = writeln!(out, "  fragments: {}", counter_list(&now.fragments));
    }
    if now.quic.iter().any(|q| q.1 > 0) {
        let _ = writeln!(out, "  quic-lb: {}; decoded={}", counter_list(&now.quic), now.quic_decoded);
    }
    let _ = writeln!(out, "  other hosts: passed={}", now.other_host);
    for s in &now.services {
        let ps = prev.services.iter().find(|p| p.name == s.name);
        let before = ps.map_or(0, |p| p.traffic.packets);
        let _ = writeln!(
            out,
            "  service {} {}: packets {} ({}), bytes {}",
            s.name,
            s.endpoint,
            s.traffic.packets,
            rate(s.traffic.packets, before, seconds),
            s.traffic.bytes
        );
        for b in &s.backends {
            let before = ps
                .and_then(|p| p.backends.iter().find(|x| x.label == b.label))
                .map_or(0, |x| x.traffic.packets);
            let share = if s.traffic.packets > 0 { b.traffic.packets as f64 / s.traffic.packets as f64 * 100.0 } else { 0.0 };
            // An unnamed backend's label is its address: say it once.
            let who = if b.label == b.address.to_string() { b.label.clone() } else { format!("{} {}", b.label, b.address) };
            let _ = writeln!(
                out,
                "    backend {who} weight {}: packets {} ({}, {share:.1}%), bytes {}{}{}{}",
                b.weight,
                b.traffic.packets,
                rate(b.traffic.packets, before, seconds),
                b.traffic.bytes,
                b.health.as_ref().map_or(String::new(), |h| format!(" [{h}]")),
                b.load.as_ref().map_or(String::new(), |l| format!(" [{l}]")),
                if b.mac_known { "" } else { " [MAC unresolved]" }
            );
        }
    }
    out
}

/// What `lb status` shows of a (pinned) data plane, read from its maps.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlaneStatus {
    pub forwarded: u64,
    pub passed: u64,
    pub drops: Vec<(&'static str, u64)>,
    pub conntrack: Vec<(&'static str, u64)>,
    pub icmp_forwarded: u64,
    /// Frames addressed to another host's MAC, passed unchanged.
    pub other_host: u64,
    /// The fragment table: recorded, followed, unmatched.
    pub fragments: Vec<(&'static str, u64)>,
    /// QUIC-LB: routed, and the fallbacks by reason.
    pub quic: Vec<(&'static str, u64)>,
    /// Encrypted IDs the cipher decoded.
    pub quic_decoded: u64,
    /// Entries in the flow table, and its size.
    pub flows: u64,
    pub flow_capacity: u32,
    pub services: Vec<ServiceStatus>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceStatus {
    pub name: String,
    pub vip: std::net::IpAddr,
    pub endpoint: String,
    pub hash: &'static str,
    pub forward: &'static str,
    pub conntrack: bool,
    pub slots: u32,
    /// The live table's fingerprint (table::digest_of_hashes), as `lb table` prints it.
    pub digest: u64,
    pub traffic: Traffic,
    pub backends: Vec<BackendStatus>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BackendStatus {
    pub identity: String,
    pub address: std::net::IpAddr,
    pub weight: u32,
    /// active, drain or down, as last written.
    pub state: &'static str,
    pub mac_known: bool,
    /// Slots of the service's table it owns.
    pub slots: u32,
    pub traffic: Traffic,
}

impl PlaneStatus {
    pub fn json(&self) -> serde_json::Value {
        use serde_json::{json, Map, Value};
        let counters = |v: &[(&str, u64)]| Value::Object(v.iter().map(|(k, n)| (k.to_string(), json!(n))).collect::<Map<_, _>>());
        json!({
            "forwarded": self.forwarded,
            "passed": self.passed,
            "drops": counters(&self.drops),
            "conntrack": counters(&self.conntrack),
            "icmp_forwarded": self.icmp_forwarded,
            "other_host": self.other_host,
            "fragments": counters(&self.fragments),
            "quic_lb": counters(&self.quic),
            "quic_lb_decoded": self.quic_decoded,
            "flows": {"entries": self.flows, "capacity": self.flow_capacity},
            "services": self.services.iter().map(|s| json!({
                "name": s.name,
                "endpoint": s.endpoint,
                "hash": s.hash,
                "forward": s.forward,
                "conntrack": s.conntrack,
                "slots": s.slots,
                "digest": format!("{:016x}", s.digest),
                "packets": s.traffic.packets,
                "bytes": s.traffic.bytes,
                "backends": s.backends.iter().map(|b| json!({
                    "identity": b.identity,
                    "address": b.address.to_string(),
                    "weight": b.weight,
                    "state": b.state,
                    "mac_known": b.mac_known,
                    "slots": b.slots,
                    "packets": b.traffic.packets,
                    "bytes": b.traffic.bytes,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "forwarded {}, passed {}, dropped {}", self.forwarded, self.passed, self.drops.iter().map(|d| d.1).sum::<u64>());
        let _ = writeln!(out, "  drops: {}", counter_list(&self.drops));
        let _ = writeln!(out, "  conntrack: {}", counter_list(&self.conntrack));
        let _ = writeln!(out, "  icmp: forwarded={}", self.icmp_forwarded);
        let _ = writeln!(out, "  fragments: {}", counter_list(&self.fragments));
        let _ = writeln!(out, "  quic-lb: {}; decoded={}", counter_list(&self.quic), self.quic_decoded);
        let _ = writeln!(out, "  other hosts: passed={}", self.other_host);
        let _ = writeln!(out, "  flow table: {} of {} entries", self.flows, self.flow_capacity);
        for s in &self.services {
            let _ = writeln!(
                out,
                "service {} {}: {} slots (digest {:016x}), hash {}, forward {}, conntrack {}: packets {}, bytes {}",
                s.name,
                s.endpoint,
                s.slots,
                s.digest,
                s.hash,
                s.forward,
                if s.conntrack { "on" } else { "off" },
                s.traffic.packets,
                s.traffic.bytes
            );
            for b in &s.backends {
                let _ = writeln!(
                    out,
                    "  backend {} {} weight {} [{}{}]: {} slots, packets {}, bytes {}",
                    b.identity,
                    b.address,
                    b.weight,
                    b.state,
                    if b.mac_known { "" } else { ", MAC unresolved" },
                    b.slots,
                    b.traffic.packets,
                    b.traffic.bytes
                );
            }
        }
        out
    }
}

/// Named counters as `name=value` pairs separated by spaces, as every text report prints them.
pub fn counter_list(counters: &[(&str, u64)]) -> String {
    counters.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(fwd: u64, b1: u64, b2: u64) -> Snapshot {
        let be = |label: &str, packets: u64| BackendCounters {
            label: label.to_string(),
            address: if label == "b1" { "10.0.0.1" } else { "10.0.0.2" }.parse().unwrap(),
            weight: 1,
            mac_known: label == "b1",
            health: (label == "b2").then(|| "down (timeout)".to_string()),
            load: None,
            traffic: Traffic { packets, bytes: packets * 100 },
        };
        Snapshot {
            forwarded: fwd,
            passed: 7,
            drops: vec![("malformed", 2), ("no_mac", 3)],
            conntrack: vec![("hit", 9), ("miss", 1)],
            icmp_forwarded: 4,
            other_host: 0,
            fragments: Vec::new(),
            quic: Vec::new(),
            quic_decoded: 0,
            services: vec![ServiceCounters {
                name: "web".into(),
                endpoint: "10.0.0.100:80/tcp".into(),
                traffic: Traffic { packets: b1 + b2, bytes: (b1 + b2) * 100 },
                backends: vec![be("b1", b1), be("b2", b2)],
            }],
        }
    }

    #[test]
    fn an_unnamed_backend_is_named_by_its_address_once() {
        let mut s = snap(1, 1, 0);
        s.services[0].backends[0].label = "10.0.0.1".into();
        let t = text(&s, None, 1.0, 1.0);
        assert!(t.contains("    backend 10.0.0.1 weight 1: packets 1"), "{t}");
    }

    #[test]
    fn text_shows_totals_rates_shares_and_drop_reasons() {
        let before = snap(100, 60, 40);
        let now = snap(1100, 560, 540);
        let t = text(&now, Some(&before), 2.0, 12.0);
        assert!(t.starts_with("stats at 12.0s: forwarded 1100 (500/s), passed 7 (0/s), dropped 5 (0/s)\n"), "{t}");
        assert!(t.contains("  drops: malformed=2 no_mac=3\n  conntrack: hit=9 miss=1\n"), "{t}");
        assert!(t.contains("  service web 10.0.0.100:80/tcp: packets 1100 (500/s), bytes 110000\n"), "{t}");
        assert!(t.contains("    backend b1 10.0.0.1 weight 1: packets 560 (250/s, 50.9%), bytes 56000\n"), "{t}");
        assert!(t.contains("    backend b2 10.0.0.2 weight 1: packets 540 (250/s, 49.1%), bytes 54000 [down (timeout)] [MAC unresolved]\n"), "{t}");
    }
}
