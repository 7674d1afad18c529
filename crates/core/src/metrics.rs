//! What `lb attach --metrics` exports, kernel-free: the model of what is configured and served
//! (filled by the serve loop), and its encoding in the Prometheus / OpenMetrics text formats
//! together with a counter [`Snapshot`] read from the data plane at scrape time. The HTTP thread
//! lives in the binary (src/daemon/metrics_http.rs); everything here is testable without root.

use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::counters::{self, Group};
use crate::health::ProbeRecord;
use crate::stats::Snapshot;

mod probes;
mod signals;
pub use signals::BackendSignals;

/// What is configured and served, as the serve loop last published it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Model {
    pub version: String,
    /// The commit lb was built from (build.rs), or `unknown`.
    pub commit: String,
    /// The BPF map layout, in hex, as `lb --version` prints it.
    pub bpf_layout: String,
    pub interface: String,
    pub xdp_mode: String,
    pub program_id: u32,
    pub flow_capacity: u64,
    pub services: Vec<ServiceModel>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceModel {
    pub name: String,
    pub vip: String,
    pub port: u16,
    pub protocol: String,
    pub algorithm: String,
    pub hash: String,
    pub forward: String,
    pub slots: u32,
    /// Slots marked unstable now (crates/core/src/stable.rs): their established flows are looked up.
    pub unstable_slots: u32,
    pub backends: Vec<BackendModel>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BackendModel {
    /// The data plane's id for it (its counters' index).
    pub id: u32,
    pub identity: String,
    pub address: String,
    /// As configured.
    pub weight: u32,
    /// As served: 0 when draining or down (unless the service fails open); scaled by the
    /// agent's reports and slow start where a service has them.
    pub effective_weight: f64,
    /// Why the effective weight is not the configured one by load (`agent 35%, slow start
    /// 40%`); empty when it is not adjusted.
    pub load: String,
    /// The capacity its agent last reported, in percent.
    pub reported_capacity: Option<u32>,
    /// Slots of the service's table it owns.
    pub slots: u64,
    pub healthy: bool,
    /// `healthy`, `down (timeout)`, or `not checked`.
    pub health: String,
    /// Its health probes (None when its service has no health check).
    pub probes: Option<ProbeRecord>,
    /// Its signals from real traffic (None when its service's are not watched).
    pub signals: Option<BackendSignals>,
    /// `active` or `drain`.
    pub state: String,
    pub mac_known: bool,
}

impl ServiceModel {
    fn labels(&self) -> Vec<(&'static str, String)> {
        vec![("service", self.name.clone()), ("vip", self.vip.clone())]
    }
}

fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    ty: MetricType,
    rows: impl IntoIterator<Item = (Vec<(&'static str, String)>, M)>,
) -> fmt::Result {
    let mut m = encoder.encode_descriptor(name, help, None, ty)?;
    for (labels, value) in rows {
        value.encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Encodes the data plane's metrics: `model` for what is configured, `snap` for the counters,
/// `flow_entries` for the flow table's fill when it was counted.
pub fn encode_plane(encoder: &mut DescriptorEncoder, model: &Model, snap: &Snapshot, flow_entries: Option<u64>) -> fmt::Result {
    family(
        encoder,
        "lb_build_info",
        "lb's version, commit and BPF map layout, the XDP mode, the interface and the program id (value 1)",
        MetricType::Gauge,
        [(
            vec![
                ("version", model.version.clone()),
                ("commit", model.commit.clone()),
                ("bpf_layout", model.bpf_layout.clone()),
                ("xdp_mode", model.xdp_mode.clone()),
                ("interface", model.interface.clone()),
                ("program_id", model.program_id.to_string()),
            ],
            ConstGauge::new(1i64),
        )],
    )?;
    let traffic = |s: &ServiceModel, b: &BackendModel| {
        snap.services
            .iter()
            .find(|x| x.name == s.name)
            .and_then(|x| x.backends.iter().find(|y| y.label == b.identity))
            .map(|y| y.traffic)
            .unwrap_or_default()
    };
    let per_backend = |f: &dyn Fn(&ServiceModel, &BackendModel) -> u64| -> Vec<(Vec<(&'static str, String)>, u64)> {
        model
            .services
            .iter()
            .flat_map(|s| {
                s.backends.iter().map(move |b| {
                    let mut l = s.labels();
                    l.push(("backend", b.identity.clone()));
                    (l, f(s, b))
                })
            })
            .collect()
    };
    let counters = |rows: Vec<(Vec<(&'static str, String)>, u64)>| rows.into_iter().map(|(l, v)| (l, ConstCounter::new(v)));
    let gauges = |rows: Vec<(Vec<(&'static str, String)>, u64)>| rows.into_iter().map(|(l, v)| (l, ConstGauge::new(v as i64)));
    family(encoder, "lb_forwarded_packets", "Packets forwarded to each backend", MetricType::Counter, counters(per_backend(&|s, b| traffic(s, b).packets)))?;
    family(encoder, "lb_forwarded_bytes", "Bytes forwarded to each backend (frames as received)", MetricType::Counter, counters(per_backend(&|s, b| traffic(s, b).bytes)))?;
    let drops = counters::of(Group::Drop).map(|c| (vec![("reason", c.name.to_string())], ConstCounter::new(snap.drops.iter().find(|d| d.0 == c.name).map_or(0, |d| d.1))));
    family(encoder, "lb_dropped_packets", "Packets for a service that were not forwarded, by reason (docs/data-plane.md)", MetricType::Counter, drops)?;
    family(encoder, "lb_passed_packets", "Packets not for a service, handed to the kernel unchanged", MetricType::Counter, [(Vec::new(), ConstCounter::new(snap.passed))])?;
    family(
        encoder,
        "lb_icmp_errors_forwarded",
        "ICMP errors about a service's flow sent on to the flow's backend",
        MetricType::Counter,
        [(Vec::new(), ConstCounter::new(snap.icmp_forwarded))],
    )?;
    family(
        encoder,
        "lb_other_host_packets",
        "Frames addressed to another host's MAC, handed to the kernel unchanged",
        MetricType::Counter,
        [(Vec::new(), ConstCounter::new(snap.other_host))],
    )?;
    let frag = snap.fragments.iter().map(|(e, v)| (vec![("event", e.to_string())], ConstCounter::new(*v)));
    family(encoder, "lb_fragment_lookups", "Fragments: recorded (a first fragment's backend), followed (a later one sent there), unmatched (the fragment route decided), conflict (a first fragment disagreed with the record: deleted)", MetricType::Counter, frag)?;
    encode_quic(encoder, snap)?;
    let ct = snap.conntrack.iter().map(|(e, v)| (vec![("event", e.to_string())], ConstCounter::new(*v)));
    family(encoder, "lb_flow_table_lookups", "Flow-table outcomes: hit, miss, new (entry made), stale (entry re-hashed)", MetricType::Counter, ct)?;
    family(encoder, "lb_flow_table_capacity", "Entries the flow table holds at most", MetricType::Gauge, [(Vec::new(), ConstGauge::new(model.flow_capacity as i64))])?;
    if let Some(n) = flow_entries {
        family(
            encoder,
            "lb_flow_table_entries",
            "Entries in the flow table, counted by walking it at most every 10 s",
            MetricType::Gauge,
            [(Vec::new(), ConstGauge::new(n as i64))],
        )?;
    }
    family(encoder, "lb_backend_weight", "Each backend's weight as configured", MetricType::Gauge, gauges(per_backend(&|_, b| b.weight as u64)))?;
    let effective = model.services.iter().flat_map(|s| {
        s.backends.iter().map(move |b| {
            let mut l = s.labels();
            l.push(("backend", b.identity.clone()));
            (l, ConstGauge::new(b.effective_weight))
        })
    });
    family(
        encoder,
        "lb_backend_effective_weight",
        "Each backend's weight as served (0 when draining or down; scaled by its agent's reports and slow start where the service has them)",
        MetricType::Gauge,
        effective,
    )?;
    let reported = model.services.iter().flat_map(|s| {
        s.backends.iter().filter_map(move |b| {
            let mut l = s.labels();
            l.push(("backend", b.identity.clone()));
            b.reported_capacity.map(|c| (l, ConstGauge::new(c as i64)))
        })
    });
    family(encoder, "lb_backend_reported_capacity", "The capacity each backend's load agent last reported, in percent", MetricType::Gauge, reported)?;
    family(encoder, "lb_backend_slots", "Slots of the service's destination table each backend owns", MetricType::Gauge, gauges(per_backend(&|_, b| b.slots)))?;
    family(encoder, "lb_backend_healthy", "1 when the backend passes its health checks (or is not checked)", MetricType::Gauge, gauges(per_backend(&|_, b| b.healthy as u64)))?;
    family(encoder, "lb_backend_draining", "1 when the backend's state is drain", MetricType::Gauge, gauges(per_backend(&|_, b| (b.state == "drain") as u64)))?;
    family(encoder, "lb_backend_mac_resolved", "1 when the MAC frames to the backend go to is resolved", MetricType::Gauge, gauges(per_backend(&|_, b| b.mac_known as u64)))?;
    probes::encode(encoder, model)?;
    signals::encode(encoder, model)?;
    let services = model.services.iter().map(|s| {
        let mut l = s.labels();
        l.extend([("port", s.port.to_string()), ("protocol", s.protocol.clone()), ("algorithm", s.algorithm.clone()), ("hash", s.hash.clone()), ("forward", s.forward.clone())]);
        (l, ConstGauge::new(s.slots as i64))
    });
    family(encoder, "lb_service_slots", "Each service's destination-table size, with its settings as labels", MetricType::Gauge, services)?;
    let unstable = model.services.iter().map(|s| (s.labels(), ConstGauge::new(s.unstable_slots as i64)));
    family(
        encoder,
        "lb_service_unstable_slots",
        "Slots of the service's table marked unstable since they changed owner: their established flows are looked up in the flow table until no flow tracked elsewhere hashes there",
        MetricType::Gauge,
        unstable,
    )
}

/// QUIC-LB's outcomes, and the IDs its cipher decoded.
fn encode_quic(encoder: &mut DescriptorEncoder, snap: &Snapshot) -> fmt::Result {
    let quic = snap.quic.iter().map(|(e, v)| (vec![("outcome", e.to_string())], ConstCounter::new(*v)));
    family(encoder, "lb_quic_lb_packets", "Packets of QUIC-LB services: routed (by the server ID in their connection ID), or by the flow table and the table for a reason: client_id (Initial, 0-RTT), unroutable (0b111), other_config, short, unknown_server, unusable (backend down), no_key, over_budget (an ID not kept decoded, past this CPU's budget of decodings)", MetricType::Counter, quic)?;
    family(
        encoder,
        "lb_quic_lb_decoded_ids",
        "Encrypted QUIC-LB connection IDs the cipher decoded (an ID decoded before is found among those kept, not decoded again)",
        MetricType::Counter,
        [(Vec::new(), ConstCounter::new(snap.quic_decoded))],
    )?;
    Ok(())
}

/// Escapes text for HTML (element content and quoted attribute values).
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Packets per second of each (service, backend) over an interval, from two snapshots.
pub fn rates(before: &Snapshot, after: &Snapshot, seconds: f64) -> Vec<(String, String, f64)> {
    let mut out = Vec::new();
    for s in &after.services {
        for b in &s.backends {
            let was = before
                .services
                .iter()
                .find(|x| x.name == s.name)
                .and_then(|x| x.backends.iter().find(|y| y.label == b.label))
                .map_or(0, |y| y.traffic.packets);
            let pps = if seconds > 0.0 { b.traffic.packets.saturating_sub(was) as f64 / seconds } else { 0.0 };
            out.push((s.name.clone(), b.label.clone(), pps));
        }
    }
    out
}

/// The status page: every service and its backends (health, the last probe's outcome and
/// latency, state, weight, the table share as a bar next to the observed traffic share over the
/// last interval, packets per second), and the drop reasons. One page, no external assets, refreshed every 3 s; every value from the config
/// is escaped.
pub fn status_page(model: &Model, snap: &Snapshot, rates: &[(String, String, f64)], interval: f64) -> String {
    let e = html_escape;
    let mut h = String::new();
    h.push_str("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"3\">");
    h.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>lb status</title><style>");
    h.push_str(
        "body{font:14px/1.4 system-ui,sans-serif;margin:1rem;color:#222;background:#fafafa}h1{font-size:1.3rem;margin:0 0 .3rem}\
         .meta{color:#666;margin-bottom:1rem}section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.7rem;margin-bottom:1rem}\
         h2{font-size:1.05rem;margin:0 0 .4rem}table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.25rem .4rem;border-bottom:1px solid #eee;white-space:nowrap}\
         td.bars{width:40%}.bar{height:.55rem;border-radius:2px;margin:1px 0}.table{background:#7aa7d8}.traffic{background:#e59c3b}\
         .up{color:#17803d;font-weight:600}.down{color:#b42318;font-weight:600}.drain{color:#8a6d00;font-weight:600}.wrap{overflow-x:auto}\
         .legend span{display:inline-block;width:.8rem;height:.55rem;margin:0 .2rem 0 .8rem}",
    );
    h.push_str("</style></head><body>");
    h.push_str(&format!(
        "<h1>lb on {}</h1><div class=\"meta\">{} mode, program {}, version {}; forwarded {}, passed {}, dropped {}; traffic shares over the last {:.0} s\
         <span class=\"legend\"><span class=\"table\"></span>table share<span class=\"traffic\"></span>traffic share</span></div>",
        e(&model.interface),
        e(&model.xdp_mode),
        model.program_id,
        e(&model.version),
        snap.forwarded,
        snap.passed,
        snap.dropped(),
        interval
    ));
    for s in &model.services {
        let total_pps: f64 = rates.iter().filter(|r| r.0 == s.name).map(|r| r.2).sum();
        h.push_str(&format!(
            "<section class=\"service\" data-service=\"{}\"><h2>{} <small>{}:{}/{} &middot; {} &middot; hash {} &middot; forward {} &middot; {} slots &middot; {:.0} pkt/s</small></h2>",
            e(&s.name),
            e(&s.name),
            e(&s.vip),
            s.port,
            e(&s.protocol),
            e(&s.algorithm),
            e(&s.hash),
            e(&s.forward),
            s.slots,
            total_pps
        ));
        h.push_str("<div class=\"wrap\"><table><tr><th>backend</th><th>address</th><th>health</th><th>last probe</th><th>signals</th><th>state</th><th>weight</th><th>shares</th><th>pkt/s</th></tr>");
        for b in &s.backends {
            let pps = rates.iter().find(|r| r.0 == s.name && r.1 == b.identity).map_or(0.0, |r| r.2);
            let table_share = if s.slots > 0 { b.slots as f64 / s.slots as f64 * 100.0 } else { 0.0 };
            let traffic_share = if total_pps > 0.0 { pps / total_pps * 100.0 } else { 0.0 };
            let health_class = if b.healthy { "up" } else { "down" };
            h.push_str(&format!(
                "<tr class=\"backend\" data-backend=\"{}\" data-health=\"{}\"><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td class=\"probe\">{}</td><td class=\"signals\">{}</td><td class=\"{}\">{}</td><td class=\"weight\">{} ({} served{})</td>\
                 <td class=\"bars\"><div class=\"bar table\" style=\"width:{:.1}%\" title=\"table {:.1}%\"></div><div class=\"bar traffic\" style=\"width:{:.1}%\" title=\"traffic {:.1}%\"></div>{:.1}% / {:.1}%</td><td>{:.0}</td></tr>",
                e(&b.identity),
                if b.healthy { "up" } else { "down" },
                e(&b.identity),
                e(&b.address),
                health_class,
                e(&b.health),
                e(&probes::last_probe(b)),
                e(&signals::words(b)),
                if b.state == "drain" { "drain" } else { "" },
                e(&b.state),
                b.weight,
                b.effective_weight,
                if b.load.is_empty() { String::new() } else { format!(": {}", e(&b.load)) },
                table_share,
                table_share,
                traffic_share,
                traffic_share,
                table_share,
                traffic_share,
                pps
            ));
        }
        h.push_str("</table></div></section>");
    }
    h.push_str("<section><h2>drops</h2><table class=\"drops\">");
    for c in counters::of(Group::Drop) {
        let n = snap.drops.iter().find(|d| d.0 == c.name).map_or(0, |d| d.1);
        h.push_str(&format!("<tr><td>{}</td><td>{n}</td><td>{}</td></tr>", c.name, e(c.help)));
    }
    h.push_str("</table></section></body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{BackendCounters, ServiceCounters, Traffic};

    pub(super) fn model() -> Model {
        Model {
            version: "0.1.0".into(),
            commit: "0123456789ab".into(),
            bpf_layout: "00000000deadbeef".into(),
            interface: "eth0".into(),
            xdp_mode: "native".into(),
            program_id: 42,
            flow_capacity: 262144,
            services: vec![ServiceModel {
                name: "web".into(),
                vip: "10.0.0.100".into(),
                port: 80,
                protocol: "tcp".into(),
                algorithm: "ring".into(),
                hash: "flow".into(),
                forward: "l2".into(),
                slots: 100,
                unstable_slots: 3,
                backends: vec![
                    BackendModel {
                        id: 1,
                        identity: "b1".into(),
                        address: "10.0.0.1".into(),
                        weight: 2,
                        effective_weight: 2.0,
                        load: String::new(),
                        reported_capacity: None,
                        slots: 60,
                        healthy: true,
                        health: "healthy".into(),
                        probes: Some(ProbeRecord::default()),
                        signals: None,
                        state: "active".into(),
                        mac_known: true,
                    },
                    BackendModel {
                        id: 2,
                        identity: "<b2 & \"x\">".into(),
                        address: "10.0.0.2".into(),
                        weight: 1,
                        effective_weight: 0.0,
                        load: "agent 35%".to_string(),
                        reported_capacity: Some(33),
                        slots: 40,
                        healthy: false,
                        health: "down (timeout)".into(),
                        probes: Some(timed_out()),
                        signals: Some(BackendSignals { counts: crate::health::signals::Signals { syns: 40, syn_again: 12, reset_early: 0, handshakes: 28, no_data: 3 }, suspect: true, out: true }),
                        state: "drain".into(),
                        mac_known: false,
                    },
                ],
            }],
        }
    }

    /// A record whose one probe timed out after 250 ms.
    fn timed_out() -> ProbeRecord {
        let mut p = ProbeRecord::default();
        p.add(crate::health::Outcome::Timeout, std::time::Duration::from_millis(250));
        p
    }

    pub(super) fn snap(p1: u64, p2: u64) -> Snapshot {
        let be = |label: &str, addr: &str, packets: u64| BackendCounters {
            label: label.into(),
            address: addr.parse().expect("address"),
            weight: 1,
            mac_known: true,
            health: None,
            load: None,
            traffic: Traffic { packets, bytes: packets * 100 },
        };
        Snapshot {
            forwarded: p1 + p2,
            passed: 7,
            drops: vec![("malformed", 3), ("no_mac", 5)],
            conntrack: vec![("hit", 9), ("miss", 1), ("new", 1), ("stale", 0)],
            icmp_forwarded: 2,
            other_host: 6,
            fragments: vec![("recorded", 4), ("followed", 3), ("unmatched", 1)],
            quic: vec![("routed", 5), ("client_id", 2)],
            quic_decoded: 3,
            services: vec![ServiceCounters {
                name: "web".into(),
                endpoint: "10.0.0.100:80/tcp".into(),
                traffic: Traffic { packets: p1 + p2, bytes: (p1 + p2) * 100 },
                backends: vec![be("b1", "10.0.0.1", p1), be("<b2 & \"x\">", "10.0.0.2", p2)],
            }],
        }
    }

    pub(super) fn text(m: &Model, s: &Snapshot) -> String {
        #[derive(Debug)]
        struct C(Model, Snapshot);
        impl prometheus_client::collector::Collector for C {
            fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
                encode_plane(&mut e, &self.0, &self.1, Some(11))
            }
        }
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register_collector(Box::new(C(m.clone(), s.clone())));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).expect("encode");
        out
    }

    #[test]
    fn metric_names_labels_and_values_come_from_the_snapshot() {
        let t = text(&model(), &snap(30, 12));
        for line in [
            "lb_build_info{version=\"0.1.0\",commit=\"0123456789ab\",bpf_layout=\"00000000deadbeef\",xdp_mode=\"native\",interface=\"eth0\",program_id=\"42\"} 1",
            "lb_forwarded_packets_total{service=\"web\",vip=\"10.0.0.100\",backend=\"b1\"} 30",
            "lb_forwarded_bytes_total{service=\"web\",vip=\"10.0.0.100\",backend=\"b1\"} 3000",
            "lb_forwarded_packets_total{service=\"web\",vip=\"10.0.0.100\",backend=\"<b2 & \\\"x\\\">\"} 12",
            "lb_dropped_packets_total{reason=\"malformed\"} 3",
            "lb_dropped_packets_total{reason=\"too_big\"} 0",
            "lb_passed_packets_total 7",
            "lb_icmp_errors_forwarded_total 2",
            "lb_other_host_packets_total 6",
            "lb_quic_lb_decoded_ids_total 3",
            "lb_fragment_lookups_total{event=\"followed\"} 3",
            "lb_flow_table_lookups_total{event=\"hit\"} 9",
            "lb_flow_table_entries 11",
            "lb_flow_table_capacity 262144",
            "lb_backend_weight{service=\"web\",vip=\"10.0.0.100\",backend=\"b1\"} 2",
            "lb_backend_effective_weight{service=\"web\",vip=\"10.0.0.100\",backend=\"<b2 & \\\"x\\\">\"} 0.0",
            "lb_backend_effective_weight{service=\"web\",vip=\"10.0.0.100\",backend=\"b1\"} 2.0",
            "lb_backend_reported_capacity{service=\"web\",vip=\"10.0.0.100\",backend=\"<b2 & \\\"x\\\">\"} 33",
            "lb_backend_slots{service=\"web\",vip=\"10.0.0.100\",backend=\"b1\"} 60",
            "lb_backend_healthy{service=\"web\",vip=\"10.0.0.100\",backend=\"<b2 & \\\"x\\\">\"} 0",
            "lb_backend_draining{service=\"web\",vip=\"10.0.0.100\",backend=\"<b2 & \\\"x\\\">\"} 1",
            "lb_backend_mac_resolved{service=\"web\",vip=\"10.0.0.100\",backend=\"b1\"} 1",
            "lb_service_slots{service=\"web\",vip=\"10.0.0.100\",port=\"80\",protocol=\"tcp\",algorithm=\"ring\",hash=\"flow\",forward=\"l2\"} 100",
            "lb_service_unstable_slots{service=\"web\",vip=\"10.0.0.100\"} 3",
            "lb_backend_signals_total{service=\"web\",backend=\"<b2 & \\\"x\\\">\",signal=\"syn_again\"} 12",
            "lb_backend_signals_total{service=\"web\",backend=\"<b2 & \\\"x\\\">\",signal=\"syns\"} 40",
            "lb_backend_signals_total{service=\"web\",backend=\"<b2 & \\\"x\\\">\",signal=\"no_data\"} 3",
            "lb_backend_signal_out{service=\"web\",backend=\"<b2 & \\\"x\\\">\"} 1",
            "lb_backend_signal_suspect{service=\"web\",backend=\"<b2 & \\\"x\\\">\"} 1",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
        assert!(t.contains("# TYPE lb_forwarded_packets counter"), "{t}");
    }

    #[test]
    fn the_status_page_shows_every_backend_escaped_with_its_shares() {
        let before = snap(0, 0);
        let after = snap(30, 10);
        let r = rates(&before, &after, 2.0);
        assert_eq!(r[0], ("web".to_string(), "b1".to_string(), 15.0));
        let page = status_page(&model(), &after, &r, 2.0);
        assert!(page.contains("data-backend=\"b1\" data-health=\"up\""), "{page}");
        assert!(page.contains("data-backend=\"&lt;b2 &amp; &quot;x&quot;&gt;\" data-health=\"down\""));
        assert!(!page.contains("<b2"), "unescaped name in the page");
        assert!(page.contains("60.0% / 75.0%"), "table 60%, traffic 30 of 40 packets");
        assert!(page.contains("<th>last probe</th>"), "{page}");
        assert!(page.contains("<td class=\"probe\">not yet</td>"), "b1 is checked, not probed yet: {page}");
        assert!(page.contains("<td class=\"probe\">timeout, 250.0 ms</td>"), "b2's one probe: {page}");
        assert!(page.contains("<td class=\"signals\">not watched</td>"), "b1's service watches no signals for it: {page}");
        assert!(page.contains("<td class=\"signals\">12 SYNs again, 0 resets of 40 connections, 3 without data of 28 handshakes; out</td>"), "b2's signals: {page}");
        // The metric with no watched backend stays out of b1's series.
        assert!(!text(&model(), &snap(30, 12)).contains("lb_backend_signal_out{service=\"web\",backend=\"b1\"}"));
        assert!(page.contains("http-equiv=\"refresh\""));
    }
}
