//! The health probes' metrics, per checked backend, from the records the model carries
//! (lb::health::ProbeRecord): `lb_backend_probes_total{service,backend,outcome}` and the latency
//! histogram `lb_backend_probe_duration_seconds{service,backend}`; and the status page's words
//! for a backend's last probe.

use std::fmt;
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

use super::{family, BackendModel, Model};
use crate::health::{Outcome, ProbeRecord};

/// A record's latencies as a histogram, encoded from the counts it holds.
#[derive(Debug)]
struct Latency<'a>(&'a ProbeRecord);

impl EncodeMetric for Latency<'_> {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        encoder.encode_histogram::<NoLabelSet>(self.0.total().as_secs_f64(), self.0.probes(), &self.0.buckets(), None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Every checked backend with its record, labelled `service` and `backend`.
fn checked(model: &Model) -> impl Iterator<Item = (Vec<(&'static str, String)>, &ProbeRecord)> {
    model.services.iter().flat_map(|s| {
        s.backends.iter().filter_map(move |b| b.probes.as_ref().map(|p| (vec![("service", s.name.clone()), ("backend", b.identity.clone())], p)))
    })
}

pub(super) fn encode(encoder: &mut DescriptorEncoder, model: &Model) -> fmt::Result {
    // Every outcome of every checked backend, zero included: a rate over a series that appears
    // only at its first failure misses that failure.
    let counts = checked(model).flat_map(|(labels, p)| {
        Outcome::ALL.into_iter().map(move |o| {
            let mut l = labels.clone();
            l.push(("outcome", o.as_str().to_string()));
            (l, ConstCounter::new(p.count(o)))
        })
    });
    family(
        encoder,
        "lb_backend_probes",
        "Health probes of each checked backend by outcome: success, timeout, refused (nothing listens), bad_status (an HTTP status outside the expected range), error (anything else)",
        MetricType::Counter,
        counts,
    )?;
    family(
        encoder,
        "lb_backend_probe_duration_seconds",
        "How long each checked backend's health probes took, whatever their outcome",
        MetricType::Histogram,
        checked(model).map(|(l, p)| (l, Latency(p))),
    )
}

/// `success, 1.2 ms` for a checked backend's last probe (two decimals below a millisecond:
/// a refusal on the next rack takes 0.04 ms); `not yet` before its first, and nothing for a
/// backend that is not checked.
pub(super) fn last_probe(b: &BackendModel) -> String {
    match b.probes.as_ref().map(|p| p.last) {
        None => String::new(),
        Some(None) => "not yet".to_string(),
        Some(Some((outcome, took))) if took < Duration::from_millis(1) => format!("{}, {:.2} ms", outcome.as_str(), took.as_secs_f64() * 1e3),
        Some(Some((outcome, took))) if took < Duration::from_secs(1) => format!("{}, {:.1} ms", outcome.as_str(), took.as_secs_f64() * 1e3),
        Some(Some((outcome, took))) => format!("{}, {:.2} s", outcome.as_str(), took.as_secs_f64()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{model, snap, text};
    use super::*;

    #[test]
    fn probes_are_counted_by_backend_and_outcome_with_a_latency_histogram() {
        let mut m = model();
        let b1 = m.services[0].backends[0].probes.as_mut().expect("b1 is checked");
        let ms = |v: f64| Duration::from_secs_f64(v / 1e3);
        for took in [0.3, 0.8, 2.0] {
            b1.add(Outcome::Success, ms(took));
        }
        b1.add(Outcome::Refused, ms(0.2));
        b1.add(Outcome::Timeout, ms(300.0));
        let t = text(&m, &snap(0, 0));
        let b1 = "service=\"web\",backend=\"b1\"";
        for line in [
            format!("lb_backend_probes_total{{{b1},outcome=\"success\"}} 3"),
            format!("lb_backend_probes_total{{{b1},outcome=\"refused\"}} 1"),
            format!("lb_backend_probes_total{{{b1},outcome=\"timeout\"}} 1"),
            format!("lb_backend_probes_total{{{b1},outcome=\"bad_status\"}} 0"),
            format!("lb_backend_probes_total{{{b1},outcome=\"error\"}} 0"),
            format!("lb_backend_probe_duration_seconds_count{{{b1}}} 5"),
            // Cumulative: 0.2 and 0.3 ms, then 0.8, then 2.0, then nothing until 300 ms.
            format!("lb_backend_probe_duration_seconds_bucket{{le=\"0.0005\",{b1}}} 2"),
            format!("lb_backend_probe_duration_seconds_bucket{{le=\"0.001\",{b1}}} 3"),
            format!("lb_backend_probe_duration_seconds_bucket{{le=\"0.0025\",{b1}}} 4"),
            format!("lb_backend_probe_duration_seconds_bucket{{le=\"0.25\",{b1}}} 4"),
            format!("lb_backend_probe_duration_seconds_bucket{{le=\"0.5\",{b1}}} 5"),
            format!("lb_backend_probe_duration_seconds_bucket{{le=\"5.0\",{b1}}} 5"),
            format!("lb_backend_probe_duration_seconds_bucket{{le=\"+Inf\",{b1}}} 5"),
            // b2's one probe timed out: the other outcomes are there, at zero.
            "lb_backend_probes_total{service=\"web\",backend=\"<b2 & \\\"x\\\">\",outcome=\"timeout\"} 1".to_string(),
            "lb_backend_probes_total{service=\"web\",backend=\"<b2 & \\\"x\\\">\",outcome=\"refused\"} 0".to_string(),
            "lb_backend_probe_duration_seconds_count{service=\"web\",backend=\"<b2 & \\\"x\\\">\"} 1".to_string(),
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
        assert!(t.contains("# TYPE lb_backend_probes counter"), "{t}");
        assert!(t.contains("# TYPE lb_backend_probe_duration_seconds histogram"), "{t}");
        let sum: f64 = t
            .lines()
            .find_map(|l| l.strip_prefix(&format!("lb_backend_probe_duration_seconds_sum{{{b1}}} ")))
            .and_then(|v| v.parse().ok())
            .expect("a sum for b1");
        assert!((sum - 0.3033).abs() < 1e-9, "{sum}");
        let b1_buckets = t.lines().filter(|l| l.starts_with("lb_backend_probe_duration_seconds_bucket{le=") && l.contains(&format!(",{b1}}}"))).count();
        assert_eq!(b1_buckets, 14, "13 bounds and +Inf");

        // A service without checks has none of them.
        m.services[0].backends.iter_mut().for_each(|b| b.probes = None);
        let t = text(&m, &snap(0, 0));
        assert!(!t.lines().any(|l| l.starts_with("lb_backend_probe")), "{t}");
    }

    #[test]
    fn the_last_probe_reads_as_outcome_and_latency() {
        let mut b = model().services[0].backends[0].clone();
        assert_eq!(last_probe(&b), "not yet");
        let p = b.probes.as_mut().expect("checked");
        p.add(Outcome::Success, Duration::from_micros(1234));
        assert_eq!(last_probe(&b), "success, 1.2 ms");
        b.probes.as_mut().expect("checked").add(Outcome::Refused, Duration::from_micros(43));
        assert_eq!(last_probe(&b), "refused, 0.04 ms");
        b.probes.as_mut().expect("checked").add(Outcome::Timeout, Duration::from_millis(2500));
        assert_eq!(last_probe(&b), "timeout, 2.50 s");
        b.probes = None;
        assert_eq!(last_probe(&b), "");
    }
}
