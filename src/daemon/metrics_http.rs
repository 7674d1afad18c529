//! `lb attach --metrics ADDR:PORT`: Prometheus metrics at `/metrics` and a status page at `/`,
//! served from threads of their own: one accepts, one per connection (at most
//! [`http::MAX_CONNECTIONS`], each with a deadline to send its request and one to take its answer:
//! see http.rs), one samples the counters for the page's rates. A scrape reads the per-CPU counters from the data plane's
//! maps at that moment (through descriptors of its own) and the model the serve loop publishes
//! after every change ([`Publisher`]); it never waits on the serve loop, and the packet path pays
//! nothing.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use lb::config::{BackendState, Pool, WEIGHT_STEPS};
use lb::load::{Adjustment, Key};
use lb::health::{HealthMap, Outcome, ProbeRecord};
use lb::metrics::{encode_plane, rates, status_page, BackendModel, BackendSignals, Model, ServiceModel};
use lb::stats::Snapshot;

use super::http::{self, Answer, Request};
use lb::balancer::Balancer;
use lb::dataplane::{flow_table_slots, CounterMaps};

/// How often the status page's traffic rates are sampled.
const SAMPLE: Duration = Duration::from_secs(2);
/// How often the flow table's entries are counted (a walk of the whole table).
const FLOW_COUNT_EVERY: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub(super) enum ReloadResult {
    Applied,
    Refused,
    Unchanged,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: ReloadResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    service: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentLabels {
    service: String,
    backend: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabel {
    service: String,
}

/// The serve loop's handle: what it reports as it goes.
#[derive(Clone)]
pub(super) struct Metrics {
    model: Arc<Mutex<Model>>,
    reloads: Family<ReloadLabels, Counter>,
    last_reload: Gauge<f64, std::sync::atomic::AtomicU64>,
    last_reload_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    reload_apply: Histogram,
    // The per-service probe metrics as they were before issue 27 (documented, so kept):
    // `success` or `failure`, and the latency. The per-backend ones are lb::metrics::probes.
    probes: Family<ProbeLabels, Counter>,
    probe_latency: Family<ServiceLabel, Histogram>,
    agent_answers: Family<AgentLabels, Counter>,
    /// With --config etcd://...: whether the store answers, and the revisions reached.
    store_up: Gauge,
    store_revision: Gauge,
    store_pool_revision: Gauge,
    store_lost: Counter,
    /// The label sets those three families hold (a family cannot list them), so that a service's
    /// or backend's series go when it leaves the pool.
    made: Arc<Mutex<Made>>,
}

#[derive(Default)]
struct Made {
    services: HashSet<String>,
    agents: HashSet<AgentLabels>,
}

impl Metrics {
    fn new(model: Model) -> Metrics {
        Metrics {
            model: Arc::new(Mutex::new(model)),
            reloads: Family::default(),
            last_reload: Gauge::default(),
            last_reload_seconds: Gauge::default(),
            reload_apply: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            probes: Family::default(),
            probe_latency: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0001, 4.0, 10))),
            agent_answers: Family::default(),
            store_up: Gauge::default(),
            store_revision: Gauge::default(),
            store_pool_revision: Gauge::default(),
            store_lost: Counter::default(),
            made: Arc::new(Mutex::new(Made::default())),
        }
    }

    fn publish(&self, model: Model) {
        self.prune(&model);
        if let Ok(mut m) = self.model.lock() {
            *m = model;
        }
    }

    /// Removes the series of the services and backends `model` no longer has.
    fn prune(&self, model: &Model) {
        let Ok(mut made) = self.made.lock() else { return };
        made.agents.retain(|l| {
            let kept = model.services.iter().any(|s| s.name == l.service && s.backends.iter().any(|b| b.identity == l.backend));
            if !kept {
                self.agent_answers.remove(l);
            }
            kept
        });
        made.services.retain(|service| {
            let kept = model.services.iter().any(|s| &s.name == service);
            if !kept {
                for outcome in ["success", "failure"] {
                    self.probes.remove(&ProbeLabels { service: service.clone(), outcome: outcome.to_string() });
                }
                self.probe_latency.remove(&ServiceLabel { service: service.clone() });
            }
            kept
        });
    }

    /// A reload's outcome; `apply` is how long applying took, for an applied one.
    fn reload(&self, result: ReloadResult, apply: Option<Duration>) {
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
        if let Some(d) = apply {
            let now = lb::clock::unix_ms() as f64 / 1e3;
            self.last_reload.set(now);
            self.last_reload_seconds.set(d.as_secs_f64());
            self.reload_apply.observe(d.as_secs_f64());
        }
    }

    /// A backend's probe record after its newest probe. Written into the published model in
    /// place: rebuilding the model for every probe result would cost a walk of every table.
    fn probe(&self, service: &str, backend: &str, record: &ProbeRecord) {
        if let Some((outcome, took)) = record.last {
            let outcome = if outcome == Outcome::Success { "success" } else { "failure" };
            self.probes.get_or_create(&ProbeLabels { service: service.to_string(), outcome: outcome.to_string() }).inc();
            self.probe_latency.get_or_create(&ServiceLabel { service: service.to_string() }).observe(took.as_secs_f64());
            if let Ok(mut made) = self.made.lock() {
                made.services.insert(service.to_string());
            }
        }
        let Ok(mut m) = self.model.lock() else { return };
        let b = m.services.iter_mut().filter(|s| s.name == service).flat_map(|s| s.backends.iter_mut()).find(|b| b.identity == backend);
        // A backend not in the model yet is in the next one published, record and all.
        if let Some(b) = b.filter(|b| b.probes.is_some()) {
            b.probes = Some(record.clone());
        }
    }

    fn agent(&self, service: &str, backend: &str, outcome: &str) {
        let labels = AgentLabels { service: service.to_string(), backend: backend.to_string(), outcome: outcome.to_string() };
        self.agent_answers.get_or_create(&labels).inc();
        if let Ok(mut made) = self.made.lock() {
            made.agents.insert(labels);
        }
    }
}

/// The data plane's part of a scrape, encoded by lb::metrics.
#[derive(Debug)]
struct Scrape {
    maps: CounterMaps,
    model: Arc<Mutex<Model>>,
    flows: Mutex<(Option<Instant>, Option<u64>)>,
}

impl Scrape {
    /// The model as last published, with each watched backend's signals read now (they grow
    /// with every connection: read at scrape time, like the traffic, not published each second).
    fn model(&self) -> Model {
        let mut m = self.model.lock().map(|m| m.clone()).unwrap_or_default();
        for b in m.services.iter_mut().flat_map(|s| s.backends.iter_mut()) {
            if let (Some(x), Ok(now)) = (b.signals.as_mut(), self.maps.signals(b.id)) {
                x.counts = now;
            }
        }
        m
    }

    fn flow_entries(&self) -> Option<u64> {
        let mut f = self.flows.lock().ok()?;
        if f.0.is_none_or(|t| t.elapsed() >= FLOW_COUNT_EVERY) {
            *f = (Some(Instant::now()), self.maps.flow_entries().ok());
        }
        f.1
    }
}

impl prometheus_client::collector::Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let model = self.model();
        let snap = self.maps.snapshot(&model).map_err(|_| std::fmt::Error)?;
        encode_plane(&mut encoder, &model, &snap, self.flow_entries())
    }
}

/// Binds `addr` (an error here happens before anything is attached) and serves from a thread.
pub(super) fn start(addr: SocketAddr, maps: CounterMaps, model: Model, store: bool) -> Result<Metrics> {
    let listener = TcpListener::bind(addr).map_err(|e| anyhow!("--metrics {addr}: {e}")).context("starting the metrics server")?;
    let m = Metrics::new(model);
    let model = m.model.clone();
    let mut registry = Registry::default();
    registry.register("lb_reloads", "Reloads of the pool file by result", m.reloads.clone());
    registry.register("lb_last_reload_timestamp_seconds", "When the last reload was applied (Unix time)", m.last_reload.clone());
    registry.register("lb_last_reload_duration_seconds", "How long applying the last reload took", m.last_reload_seconds.clone());
    registry.register("lb_reload_apply_seconds", "Time to apply a reload (tables built, planned, written)", m.reload_apply.clone());
    registry.register("lb_health_probes", "Health probes by service and outcome", m.probes.clone());
    registry.register("lb_health_probe_duration_seconds", "Health probe latency by service", m.probe_latency.clone());
    registry.register(
        "lb_agent_answers",
        "Load agents' answers by service, backend and outcome: ok, garbage (a line lb could not read), failed (no line), late (after the interval's weights were decided)",
        m.agent_answers.clone(),
    );
    if store {
        registry.register("lb_store_up", "1 while the fleet's store (--config etcd://...) answers, 0 while it does not", m.store_up.clone());
        registry.register("lb_store_revision", "The store revision this node's tables were last decided at", m.store_revision.clone());
        registry.register("lb_store_pool_revision", "The store revision that wrote the pool this node serves", m.store_pool_revision.clone());
        registry.register("lb_store_lost", "Times the store stopped answering", m.store_lost.clone());
    }
    let plane = Arc::new(Scrape { maps, model, flows: Mutex::new((None, None)) });
    registry.register_collector(Box::new(plane.clone()));
    let site = Arc::new(Site { registry: Mutex::new(registry), plane, samples: Mutex::new((None, None)) });
    let sampler = site.clone();
    std::thread::Builder::new()
        .name("lb-metrics-sample".to_string())
        .spawn(move || sampler.sample_forever())
        .context("starting the metrics thread")?;
    std::thread::Builder::new()
        .name("lb-metrics".to_string())
        .spawn(move || http::serve(listener, Arc::new(move |req: &Request| site.answer(req))))
        .context("starting the metrics thread")?;
    Ok(m)
}

/// A counter snapshot and when it was taken.
type Sample = Option<(Instant, Snapshot)>;

/// What every connection answers from.
struct Site {
    /// Behind a lock so that one scrape is encoded at a time: however many clients ask at once,
    /// reading the per-CPU maps costs at most one core.
    registry: Mutex<Registry>,
    plane: Arc<Scrape>,
    /// The last two samples: the status page's rates are over the interval between them.
    samples: Mutex<(Sample, Sample)>,
}

impl Site {
    fn sample_forever(&self) {
        loop {
            if let Ok(s) = self.plane.maps.snapshot(&self.plane.model()) {
                if let Ok(mut samples) = self.samples.lock() {
                    *samples = (samples.1.take(), Some((Instant::now(), s)));
                }
            }
            std::thread::sleep(SAMPLE);
        }
    }

    /// The answer to one request: status, content type, body.
    fn answer(&self, req: &Request) -> Answer {
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/metrics") => {
                let open = req.accept.contains("application/openmetrics-text");
                let mut body = String::new();
                let Ok(registry) = self.registry.lock() else {
                    return (500, "text/plain; charset=utf-8", "reading the counters failed\n".to_string());
                };
                let (encoded, ctype) = if open {
                    (prometheus_client::encoding::text::encode(&mut body, &registry), "application/openmetrics-text; version=1.0.0; charset=utf-8")
                } else {
                    (prometheus_client::encoding::prometheus_text::encode(&mut body, &registry), "text/plain; version=0.0.4; charset=utf-8")
                };
                match encoded {
                    Ok(()) => (200, ctype, body),
                    Err(_) => (500, "text/plain; charset=utf-8", "reading the counters failed\n".to_string()),
                }
            }
            ("GET", "/") => {
                let model = self.plane.model();
                let samples = self.samples.lock().map(|s| s.clone()).unwrap_or((None, None));
                let page = match (&samples.0, &samples.1) {
                    (Some((t0, a)), Some((t1, b))) => {
                        let secs = (*t1 - *t0).as_secs_f64();
                        status_page(&model, b, &rates(a, b, secs), secs)
                    }
                    (_, Some((_, b))) => status_page(&model, b, &[], 0.0),
                    _ => status_page(&model, &Snapshot::default(), &[], 0.0),
                };
                (200, "text/html; charset=utf-8", page)
            }
            _ => (404, "text/plain; charset=utf-8", "not found\n".to_string()),
        }
    }
}

/// What the serve loop tells the metrics thread, whether or not `--metrics` was given, with what
/// it needs to describe the data plane (fixed once it is attached).
pub(super) struct Publisher {
    metrics: Option<Metrics>,
    interface: String,
    xdp_mode: String,
    flow_capacity: u64,
}

impl Publisher {
    pub(super) fn new(metrics: Option<Metrics>, interface: &str, xdp_mode: &str, conntrack_size: u32) -> Publisher {
        Publisher {
            metrics,
            interface: interface.to_string(),
            xdp_mode: xdp_mode.to_string(),
            flow_capacity: flow_table_slots(conntrack_size) as u64,
        }
    }

    /// A reload's outcome; `apply` is how long applying took, for an applied one.
    pub(super) fn reload(&self, result: ReloadResult, apply: Option<Duration>) {
        if let Some(m) = &self.metrics {
            m.reload(result, apply);
        }
    }

    /// A backend's probe record after its newest probe.
    pub(super) fn probe(&self, service: &str, backend: &str, record: &ProbeRecord) {
        if let Some(m) = &self.metrics {
            m.probe(service, backend, record);
        }
    }

    /// The fleet store's state: whether it answers, the revision decided at, the pool's.
    pub(super) fn store(&self, up: bool, revision: u64, pool_revision: u64) {
        if let Some(m) = &self.metrics {
            if m.store_up.get() == 1 && !up {
                m.store_lost.inc();
            }
            m.store_up.set(up as i64);
            m.store_revision.set(revision as i64);
            m.store_pool_revision.set(pool_revision as i64);
        }
    }

    pub(super) fn agent(&self, service: &str, backend: &str, outcome: &str) {
        if let Some(m) = &self.metrics {
            m.agent(service, backend, outcome);
        }
    }

    /// Publishes what is configured and served.
    /// `signals`: a backend's signals from real traffic as last read, and whether they took it
    /// out (None: not watched).
    pub(super) fn publish(&self, dp: &Balancer, configured: &Pool, health: &HealthMap, signals: &dyn Fn(&Key) -> Option<BackendSignals>, load: &HashMap<Key, Adjustment>) {
        let Some(m) = &self.metrics else { return };
        m.publish(self.model(dp, configured, health, signals, load));
    }

    fn model(&self, dp: &Balancer, configured: &Pool, health: &HealthMap, signals: &dyn Fn(&Key) -> Option<BackendSignals>, load: &HashMap<Key, Adjustment>) -> Model {
        let mut services = Vec::new();
        for live in dp.installed() {
            let Some(conf) = configured.service(&live.name) else { continue };
            let mut owned: HashMap<u32, u64> = HashMap::new();
            for &o in &live.owners {
                *owned.entry(o).or_default() += 1;
            }
            let backends = live
                .backends
                .iter()
                .map(|b| {
                    let configured = conf.backends.iter().find(|c| c.identity() == b.identity);
                    let checked = conf.health_check.is_some();
                    let key = (live.name.clone(), b.identity.clone());
                    let h = health.get(&key);
                    let watched = conf.health_check.as_ref().is_some_and(|c| c.signals);
                    let sig = if watched { Some(signals(&key).unwrap_or_default()) } else { None };
                    let out = sig.is_some_and(|x| x.out);
                    let healthy = h.is_none_or(|h| h.healthy) && !out;
                    let adjusted = load.get(&key);
                    // Weights of load-aware services are written in steps (lb::load).
                    let steps = if conf.load_aware() { WEIGHT_STEPS } else { 1 };
                    BackendModel {
                        id: b.id,
                        identity: b.identity.clone(),
                        address: b.address.to_string(),
                        weight: configured.map_or(b.weight, |c| c.weight),
                        effective_weight: if live.empty { 0.0 } else { (b.weight * (b.state == BackendState::Active) as u32) as f64 / steps as f64 },
                        load: adjusted.map_or(String::new(), |a| a.why()),
                        reported_capacity: adjusted.and_then(|a| a.reported),
                        slots: owned.get(&b.id).copied().unwrap_or(0),
                        healthy,
                        health: if !checked {
                            "not checked".to_string()
                        } else if out && h.is_none_or(|h| h.healthy) {
                            "down (signals, and failing through the VIP)".to_string()
                        } else {
                            h.map_or("healthy".to_string(), |h| h.describe())
                        },
                        probes: checked.then(|| h.map(|h| h.probes.clone()).unwrap_or_default()),
                        signals: sig,
                        state: configured.map_or("active", |c| c.state.as_str()).to_string(),
                        mac_known: dp.mac(dp.neighbour_of(b.address)).is_some(),
                    }
                })
                .collect();
            services.push(ServiceModel {
                name: live.name.clone(),
                vip: conf.vip.to_string(),
                port: conf.port,
                protocol: conf.protocol.as_str().to_string(),
                algorithm: conf.algorithm.as_str().to_string(),
                hash: conf.hash.as_str().to_string(),
                forward: conf.forward.as_str().to_string(),
                slots: live.slots,
                unstable_slots: (live.base..live.base + live.slots).filter(|&i| dp.is_unstable(i)).count() as u32,
                backends,
            });
        }
        Model {
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: env!("LB_GIT_COMMIT").to_string(),
            bpf_layout: env!("LB_LAYOUT_HEX").to_string(),
            interface: self.interface.clone(),
            xdp_mode: self.xdp_mode.clone(),
            program_id: dp.program_id().unwrap_or(0),
            flow_capacity: self.flow_capacity,
            services,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb::metrics::{BackendModel, ServiceModel};

    fn backend(identity: &str) -> BackendModel {
        BackendModel {
            id: 0,
            identity: identity.to_string(),
            address: "10.0.0.1".to_string(),
            weight: 1,
            effective_weight: 1.0,
            load: String::new(),
            reported_capacity: None,
            slots: 0,
            healthy: true,
            health: "healthy".to_string(),
            probes: None,
            signals: None,
            state: "active".to_string(),
            mac_known: true,
        }
    }

    fn model(services: &[(&str, &[&str])]) -> Model {
        let services = services
            .iter()
            .map(|(name, backends)| ServiceModel {
                name: name.to_string(),
                vip: "10.0.0.100".to_string(),
                port: 80,
                protocol: "tcp".to_string(),
                algorithm: "ring".to_string(),
                hash: "flow".to_string(),
                forward: "l2".to_string(),
                slots: 64,
                unstable_slots: 0,
                backends: backends.iter().map(|b| backend(b)).collect(),
            })
            .collect();
        Model { services, ..Model::default() }
    }

    fn scrape(m: &Metrics) -> String {
        let mut r = Registry::default();
        r.register("lb_agent_answers", "", m.agent_answers.clone());
        r.register("lb_health_probes", "", m.probes.clone());
        r.register("lb_health_probe_duration_seconds", "", m.probe_latency.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        text
    }

    #[test]
    fn a_removed_backend_or_service_takes_its_series_with_it() {
        let m = Metrics::new(model(&[("web", &["b1", "b2"]), ("dns", &["d1"])]));
        m.agent("web", "b1", "ok");
        m.agent("web", "b2", "garbage");
        m.agent("web", "b2", "ok");
        let mut record = ProbeRecord::default();
        record.add(Outcome::Success, Duration::from_millis(2));
        m.probe("dns", "d1", &record);
        let before = scrape(&m);
        assert!(before.contains("backend=\"b2\",outcome=\"garbage\"") && before.contains("lb_health_probes_total{service=\"dns\""), "{before}");

        // b2 and the dns service leave the pool.
        m.publish(model(&[("web", &["b1"])]));
        let after = scrape(&m);
        assert!(!after.contains("\"b2\"") && !after.contains("\"dns\""), "{after}");
        assert!(after.contains("lb_agent_answers_total{service=\"web\",backend=\"b1\",outcome=\"ok\"} 1"), "{after}");

        // A backend that comes back starts its series anew.
        m.agent("web", "b2", "ok");
        assert!(scrape(&m).contains("backend=\"b2\",outcome=\"ok\"} 1"));
    }
}
