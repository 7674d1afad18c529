//! Reload apply time on the real maps: one service, M = 65537, N = 1000 backends; remove one
//! backend, and change every weight. Prints milliseconds (validation, table build, plan and map
//! writes: everything a reload does after the debounce) and table entries written, next to the
//! slots whose owner actually changed. Prints figures; asserts only that the live tables end
//! up as the builder says. Needs root; `cargo bench --bench reload`.

use std::net::IpAddr;
use std::time::Instant;

use lb::config::parse_str;
use lb::balancer::Balancer;
use lb::dataplane::DEFAULT_TABLE_CAPACITY;
use lb::diff;

fn pool(n: usize, weight: impl Fn(usize) -> u32, skip: Option<usize>) -> String {
    let mut s = String::from("services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    slots: 65537\n    backends:\n");
    for i in (0..n).filter(|i| Some(*i) != skip) {
        s.push_str(&format!("      - {{address: 10.{}.{}.{}, weight: {}}}\n", 100 + i / 65536, (i / 256) % 256, i % 256, weight(i)));
    }
    s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let quick = !std::env::args().any(|a| a == "--bench");
    if !nix::unistd::geteuid().is_root() {
        println!("reload benchmark skipped: loading the XDP program needs root (CAP_BPF)");
        return Ok(());
    }
    let runs = if quick { 1 } else { 11 };
    let n = 1000;
    let base = pool(n, |_| 1, None);
    let maglev = |p: String| p.replace("slots: 65537", "slots: 65537\n    algorithm: maglev");
    let doubled = pool(n, |_| 2, None);
    let mixed = pool(n, |i| 1 + (i % 4) as u32, None);
    let removed = pool(n, |_| 1, Some(500));
    let cases = [
        ("ring: remove one backend", base.clone(), removed.clone()),
        ("ring: every weight 1 -> 2", base.clone(), doubled.clone()),
        ("ring: every weight 1 -> 1..4", base.clone(), mixed.clone()),
        ("maglev: remove one backend", maglev(base.clone()), maglev(removed)),
        ("maglev: every weight 1 -> 2", maglev(base.clone()), maglev(doubled)),
        ("maglev: every weight 1 -> 1..4", maglev(base.clone()), maglev(mixed)),
    ];
    println!("reload at M = 65537, N = {n} ({runs} runs, median). apply: table build + plan + map writes;");
    println!("total: also reading and validating the YAML (what a reload costs after the debounce)");
    println!(
        "{:<32} {:>9} {:>9} {:>14} {:>12}   target: apply <= 20 ms",
        "change", "apply ms", "total ms", "slots written", "slots moved"
    );
    let mac = |a: IpAddr| Some(match a { IpAddr::V4(v) => { let o = v.octets(); [2, 0, o[0], o[1], o[2], o[3]] } IpAddr::V6(_) => [2, 0, 0, 0, 0, 0] });
    for (what, before, after) in cases {
        let (a, b) = (parse_str("before.yaml", &before)?, parse_str("after.yaml", &after)?);
        let moved = diff::diff(&a, &b)[0].moved;
        let (mut apply, mut total) = (Vec::new(), Vec::new());
        let mut written = 0;
        for _ in 0..runs {
            let mut dp = Balancer::load(DEFAULT_TABLE_CAPACITY)?;
            dp.install(&a, [2, 0, 0, 0, 0, 1], &mac)?;
            let t = Instant::now();
            let parsed = parse_str("after.yaml", &after)?;
            let t_apply = Instant::now();
            let applied = dp.apply(&parsed)?;
            apply.push(t_apply.elapsed().as_secs_f64() * 1e3);
            total.push(t.elapsed().as_secs_f64() * 1e3);
            written = applied.slots_written;
            let want = lb::table::build_service(&parsed.services[0]);
            let ids = &dp.installed()[0];
            // The live table names the same backend wherever the builder does.
            for (slot, &o) in want.owners().iter().enumerate() {
                anyhow::ensure!(ids.owners[slot] == ids.backends[o as usize].id, "slot {slot} differs");
            }
        }
        println!("{:<32} {:>9.2} {:>9.2} {:>14} {:>12}", what, median(apply), median(total), written, moved);
    }
    scrape(&base, runs)
}

/// What a Prometheus scrape of `lb attach --metrics` costs at N = 1000 backends: every counter
/// read from the per-CPU maps and the whole text encoded (the flow-table count is cached
/// between scrapes and left out here).
fn scrape(text: &str, runs: usize) -> anyhow::Result<()> {
    use lb::metrics::{encode_plane, BackendModel, Model, ServiceModel};
    let pool = parse_str("pool.yaml", text)?;
    let mut dp = Balancer::load(DEFAULT_TABLE_CAPACITY)?;
    dp.install(&pool, [2, 0, 0, 0, 0, 1], &|_| Some([2, 0, 0, 0, 0, 2]))?;
    let live = &dp.installed()[0];
    let s = &pool.services[0];
    let model = Model {
        version: "bench".into(),
        commit: "bench".into(),
        bpf_layout: "bench".into(),
        interface: "eth0".into(),
        xdp_mode: "native".into(),
        program_id: 1,
        flow_capacity: 262144,
        services: vec![ServiceModel {
            name: s.name.clone(),
            vip: s.vip.to_string(),
            port: s.port,
            protocol: "tcp".into(),
            algorithm: "ring".into(),
            hash: "client-ip".into(),
            forward: "l2".into(),
            slots: s.slots,
            unstable_slots: 0,
            backends: live
                .backends
                .iter()
                .map(|b| BackendModel {
                    id: b.id,
                    identity: b.identity.clone(),
                    address: b.address.to_string(),
                    weight: b.weight,
                    effective_weight: b.weight as f64,
                    load: String::new(),
                    reported_capacity: None,
                    slots: 65,
                    healthy: true,
                    health: "healthy".into(),
                    // Checked, as a production pool is: its probe series are in the scrape.
                    probes: Some(lb::health::ProbeRecord::default()),
                    signals: None,
                    state: "active".into(),
                    mac_known: true,
                })
                .collect(),
        }],
    };
    #[derive(Debug)]
    struct Plane(lb::dataplane::CounterMaps, Model);
    impl prometheus_client::collector::Collector for Plane {
        fn encode(&self, mut e: prometheus_client::encoding::DescriptorEncoder) -> std::fmt::Result {
            let snap = self.0.snapshot(&self.1).map_err(|_| std::fmt::Error)?;
            encode_plane(&mut e, &self.1, &snap, None)
        }
    }
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(Plane(dp.counter_maps()?, model)));
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..runs.max(3) {
        let t = Instant::now();
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).map_err(|_| anyhow::anyhow!("encoding"))?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        bytes = out.len();
    }
    println!();
    println!("a /metrics scrape at N = {} backends: {:.2} ms (median of {}), {} bytes   target: < 50 ms", live.backends.len(), median(times), runs.max(3), bytes);
    Ok(())
}
