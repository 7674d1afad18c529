//! A reload soak: `lb attach` takes thousands of random pool files (services added and removed,
//! table sizes changed, backends churned, algorithms, hashing and tracking switched), with an
//! invalid file every few rounds, while a health-checked service's backends flap and a thread
//! runs packets through the live program without pause. After every applied reload the live
//! tables equal the builder's; after every refused file they still equal the last good pool's;
//! a service present in every file never drops a packet; backend ids and table ranges reach a
//! steady state instead of running out (the table array is small enough that a leak would
//! exhaust it); and lb's memory stays flat (RSS printed at the start, middle and end).
//!
//! Needs root. LB_SOAK_RELOADS sets the number of files (default 5000);
//! `scripts/soak-reloads.sh RELOADS` runs it by hand.

mod common;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::packet::*;
use common::rng::Rng;
use common::*;
use lb::config::parse_str;

const SECS: Duration = Duration::from_secs(20);

/// A random valid pool: `steady` (port 79) and `hc` (port 78, health-checked) always; services
/// on ports 80..=87 each present or not, with random backends, weights, algorithm, size, hashing
/// and tracking.
fn random_pool(r: &mut Rng) -> String {
    let mut t = String::from(
        "services:\n  - {name: steady, vip: 10.77.0.100, port: 79, slots: 1024, backends: [10.77.0.21, 10.77.0.22, 10.77.0.23]}\n  \
         - name: hc\n    vip: 10.77.0.100\n    port: 78\n    slots: 1024\n    backends: [10.77.0.11, 10.77.0.12]\n    \
         health_check: {kind: tcp, port: 8081, interval: 0.1, timeout: 0.05, rise: 1, fall: 1}\n",
    );
    for port in 80..=87u16 {
        if r.below(3) == 0 {
            continue;
        }
        let mut backends = Vec::new();
        for n in 21..=39u32 {
            if r.below(3) != 0 {
                continue;
            }
            backends.push(match r.below(4) {
                0 => format!("{{address: 10.77.0.{n}, weight: {}}}", 1 + r.below(4)),
                1 => format!("{{address: 10.77.0.{n}, state: drain}}"),
                _ => format!("10.77.0.{n}"),
            });
        }
        let (algorithm, slots) = match r.below(3) {
            0 => ("ring", [256, 1024, 4096][r.below(3) as usize]),
            1 => ("maglev", [251, 1031, 4099][r.below(3) as usize]),
            _ => ("bounded", [512, 2048][r.below(2) as usize]),
        };
        let hash = if r.below(2) == 0 { "flow" } else { "client-ip" };
        let conntrack = if r.below(2) == 0 { "on" } else { "off" };
        let protocol = if r.below(5) == 0 { "udp" } else { "tcp" };
        t.push_str(&format!(
            "  - {{name: s{port}, vip: 10.77.0.100, port: {port}, protocol: {protocol}, algorithm: {algorithm}, slots: {slots}, \
             hash: {hash}, conntrack: {conntrack}, backends: [{}]}}\n",
            backends.join(", ")
        ));
    }
    t
}

/// Files lb must refuse, each for another reason.
fn invalid(r: &mut Rng, good: &str) -> String {
    match r.below(4) {
        0 => format!("{good}  - {{name: broken, vip: 10.77.0.100, port: 90, backends: [10.77.0.21]\n"),
        1 => good.replacen("port: 79,", "port: 79, colour: red,", 1),
        2 => format!("{good}  - {{name: p, vip: 10.77.0.100, port: 91, algorithm: maglev, slots: 1000, backends: [10.77.0.21]}}\n"),
        _ => format!("{good}  - {{name: steady, vip: 10.77.0.100, port: 92, backends: [10.77.0.21]}}\n"),
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|n| n.parse().ok()).unwrap_or(0)
}

/// Listeners on the health-checked backends' port, in the backend namespace, that come and go
/// every `period` until `stop`: the backends flap up and down.
fn flapping(ns: &str, addrs: Vec<Ipv4Addr>, period: Duration, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).expect("the backend namespace");
        nix::sched::setns(f.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let mut flaps = 0;
        while !stop.load(Ordering::Relaxed) {
            let up: Vec<TcpListener> = addrs.iter().filter_map(|a| TcpListener::bind(SocketAddr::from((*a, 8081))).ok()).collect();
            std::thread::sleep(period);
            drop(up);
            std::thread::sleep(period);
            flaps += 1;
        }
        flaps
    })
}

#[test]
fn root_thousands_of_reloads_under_traffic_and_health_flaps_leak_nothing() {
    let reloads: u64 = std::env::var("LB_SOAK_RELOADS").ok().and_then(|s| s.parse().ok()).unwrap_or(5000);
    let p = pair();
    static_backends(&p);
    p.be.ip(&["addr", "add", "10.77.0.12/24", "dev", "lbv1"]);
    let dir = temp_dir();
    let mut r = Rng(0x5eed_1234_abcd_0001);
    let mut text = random_pool(&mut r);
    let config = write_config(&dir, "pool.yaml", &text);
    // A table array of 2^17 slots: the pools need at most about 35,000 at once, and twice that
    // during a change, so leaked ranges would exhaust it within a few dozen reloads.
    let mut lb = Running::start(
        &p.lb,
        &["attach", "lbv0", "--config", config.to_str().expect("utf-8"), "--reload-delay", "0.001", "--xdp-mode", "generic", "--table-capacity", "131072"],
    );
    let line = lb.wait_for("attached to lbv0", SECS);
    let prog = Running::prog_id(&line);
    lb.wait_for("serving", SECS);
    let pid = lb.child.id();
    let stop = Arc::new(AtomicBool::new(false));
    let flaps = flapping(&p.be.name, vec![Ipv4Addr::new(10, 77, 0, 11), Ipv4Addr::new(10, 77, 0, 12)], Duration::from_millis(150), stop.clone());

    // Traffic, all the time: the steady service must always forward; nothing may abort.
    let sent = Arc::new(AtomicU64::new(0));
    let traffic = {
        let (stop, sent) = (stop.clone(), sent.clone());
        std::thread::spawn(move || -> Result<(), String> {
            let live = Live::new(prog);
            let mut k = 0u32;
            while !stop.load(Ordering::Relaxed) {
                k = k.wrapping_add(1);
                let src = Ipv4Addr::from(0xc000_0200 + (k % 200));
                let steady = ipv4_simple(src, v4("10.77.0.100"), L4::Tcp { sport: 1024 + (k % 5000) as u16, dport: 79, flags: 0x10 });
                let (action, _) = live.run(&steady);
                if action != 3 {
                    return Err(format!("a packet of the steady service got action {action} after {} packets", sent.load(Ordering::Relaxed)));
                }
                let port = 78 + (k % 10) as u16;
                let any = ipv4_simple(src, v4("10.77.0.100"), L4::Tcp { sport: 2000 + (k % 3000) as u16, dport: port, flags: 0x02 });
                let (action, _) = live.run(&any);
                if !(1..=3).contains(&action) {
                    return Err(format!("port {port}: action {action}"));
                }
                sent.fetch_add(2, Ordering::Relaxed);
            }
            Ok(())
        })
    };

    let mut good = parse_str("pool.yaml", &text).expect("valid");
    let (mut applied, mut refused) = (0u64, 0u64);
    let mut rss = Vec::new();
    let mut seen_ids: BTreeSet<u32> = BTreeSet::new();
    let started = Instant::now();
    let live = Live::new(prog);
    for round in 0..reloads {
        let bad = round % 7 == 6;
        let next = if bad {
            invalid(&mut r, &text)
        } else {
            let mut t = random_pool(&mut r);
            while t == text {
                t = random_pool(&mut r);
            }
            t
        };
        let tmp = dir.join("pool.yaml.tmp");
        std::fs::write(&tmp, &next).expect("write");
        std::fs::rename(&tmp, &config).expect("rename");
        let line = reload_outcome(&mut lb);
        assert_eq!(line.contains("refused"), bad, "round {round}: {line}\n{next}");
        if bad {
            refused += 1;
        } else {
            applied += 1;
            text = next;
            good = parse_str("pool.yaml", &text).expect("valid");
        }
        // The tables serve the last good pool exactly (hc's follow its health; not compared).
        if let Err(e) = serves_live(&live, &good, &static_backend_mac, &["hc"]) {
            let log = lb.seen.iter().rev().take(12).rev().cloned().collect::<Vec<_>>().join("\n");
            panic!("round {round} ({}): {e}\nfile:\n{text}\nlb's last lines:\n{log}", if bad { "after a refused file" } else { "after a reload" });
        }
        if round == 100 || round == reloads / 2 || round == reloads - 1 {
            rss.push((round, rss_kib(pid)));
        }
        if round % 100 == 0 {
            seen_ids.extend(backend_ids(&live));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let flapped = flaps.join().expect("flapper");
    traffic.join().expect("traffic thread").unwrap_or_else(|e| panic!("{e}"));
    let health_lines = lb.seen.iter().filter(|l| l.contains("health:")).count();
    let max_id = seen_ids.iter().max().copied().unwrap_or(0);
    println!(
        "reload soak: {reloads} files in {:.0} s ({applied} applied, {refused} refused), {} packets of traffic, {flapped} flaps \
         ({health_lines} health lines logged); highest backend id ever used {max_id}; RSS (KiB) {:?}",
        started.elapsed().as_secs_f64(),
        sent.load(Ordering::Relaxed),
        rss
    );
    assert!(health_lines > 10, "the health-checked backends flapped ({health_lines} health lines)");
    // 21 distinct backends appear in the files; ids are quarantined before reuse, so a steady
    // state stays within a small multiple of that.
    assert!(max_id < 2048, "backend ids keep growing: {max_id}");
    let (mid, end) = (rss[rss.len() - 2].1, rss[rss.len() - 1].1);
    assert!(end <= mid + 4096, "lb's RSS grew from {mid} KiB to {end} KiB over the second half");
    lb.signal(nix::sys::signal::Signal::SIGTERM);
    lb.wait_exit(SECS);
}

/// The next line saying how a reload of the file ended (health changes log "applied" too).
fn reload_outcome(lb: &mut Running) -> String {
    let deadline = Instant::now() + SECS;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lb.stderr.recv_timeout(left) {
            Ok(line) => {
                lb.seen.push(line.clone());
                if line.contains("yaml applied in") || line.contains("reload refused") {
                    return line;
                }
            }
            Err(_) => panic!("no reload outcome within {SECS:?}; saw:\n{}", lb.seen.join("\n")),
        }
    }
}

/// The backend ids given to a backend of the pool (LB_BACKEND_IN_POOL in their record).
fn backend_ids(live: &Live) -> Vec<u32> {
    live.values("backends").iter().enumerate().filter(|(_, v)| v.get(6).is_some_and(|f| f & 4 != 0)).map(|(i, _)| i as u32).collect()
}
