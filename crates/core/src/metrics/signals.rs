//! The signals from real traffic in the metrics (crates/core/src/health/signals.rs), per
//! watched backend: `lb_backend_signals_total{service,backend,signal}` (`syns`, `syn_again`,
//! `reset_early`, `handshakes`, `no_data`, as the data plane counts them) and `lb_backend_signal_out{service,backend}`
//! (1 while the rule keeps it out), `lb_backend_signal_suspect{service,backend}` (1 while it is
//! a suspect, probed through the VIP, in or out); and the status page's words for them.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use super::{family, BackendModel, Model};

/// A watched backend's signals as last read, whether they made it a suspect, and whether they
/// keep it out (a backend out is a suspect too, until it passes through the VIP again).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendSignals {
    pub counts: crate::health::signals::Signals,
    pub suspect: bool,
    pub out: bool,
}

fn watched(model: &Model) -> impl Iterator<Item = (Vec<(&'static str, String)>, BackendSignals)> + '_ {
    model.services.iter().flat_map(|s| {
        s.backends.iter().filter_map(move |b| b.signals.map(|x| (vec![("service", s.name.clone()), ("backend", b.identity.clone())], x)))
    })
}

pub(super) fn encode(encoder: &mut DescriptorEncoder, model: &Model) -> fmt::Result {
    let counts = watched(model).flat_map(|(labels, x)| {
        [("syns", x.counts.syns), ("syn_again", x.counts.syn_again), ("reset_early", x.counts.reset_early), ("handshakes", x.counts.handshakes), ("no_data", x.counts.no_data)].into_iter().map(move |(name, n)| {
            let mut l = labels.clone();
            l.push(("signal", name.to_string()));
            (l, ConstCounter::new(n))
        })
    });
    family(
        encoder,
        "lb_backend_signals",
        "What tracked TCP clients betray of each watched backend: syns (connections begun), syn_again (a SYN sent again before the flow was confirmed: its SYN-ACK never came), reset_early (a client RST as a flow's second packet: it aborted the handshake), handshakes (handshakes completed whose end is watched), no_data (a client FIN or RST that acknowledged nothing past the SYN-ACK: the connection ended with no data from the backend)",
        MetricType::Counter,
        counts,
    )?;
    family(
        encoder,
        "lb_backend_signal_suspect",
        "1 while a backend's signals stand out from its service's others (or did, and it has not yet passed enough probes through the VIP since): it is probed through the VIP, and out only while lb_backend_signal_out says so",
        MetricType::Gauge,
        watched(model).map(|(l, x)| (l, ConstGauge::new(x.suspect as i64))),
    )?;
    family(
        encoder,
        "lb_backend_signal_out",
        "1 while a backend is out because its signals stood out from its service's others and its probe through the VIP failed",
        MetricType::Gauge,
        watched(model).map(|(l, x)| (l, ConstGauge::new(x.out as i64))),
    )
}

/// The status page's words: `12 SYNs again, 0 resets of 40 connections, 3 without data of 28
/// handshakes; out`
/// (or `; suspect` while probed through the VIP and in).
pub(super) fn words(b: &BackendModel) -> String {
    describe(b.signals)
}

fn describe(signals: Option<BackendSignals>) -> String {
    match signals {
        None => "not watched".to_string(),
        Some(x) => format!(
            "{} SYNs again, {} resets of {} connections, {} without data of {} handshakes{}",
            x.counts.syn_again,
            x.counts.reset_early,
            x.counts.syns,
            x.counts.no_data,
            x.counts.handshakes,
            if x.out {
                "; out"
            } else if x.suspect {
                "; suspect"
            } else {
                ""
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_says_suspect_while_probed_and_in_and_out_once_out() {
        let suspect = BackendSignals { suspect: true, ..BackendSignals::default() };
        assert_eq!(describe(Some(suspect)), "0 SYNs again, 0 resets of 0 connections, 0 without data of 0 handshakes; suspect");
        assert!(describe(Some(BackendSignals { out: true, ..suspect })).ends_with("; out"));
        assert!(describe(Some(BackendSignals::default())).ends_with("handshakes"));
        assert_eq!(describe(None), "not watched");
    }
}
