//! Hot reload of a running `lb attach`, in network namespaces this test creates: every way of
//! replacing the file, refusals that change nothing, bursts, SIGHUP. After each change the live
//! program is checked from outside: its maps (the table it uses for each service equals what
//! `lb table` builds for the new file) and BPF_PROG_TEST_RUN with many flows.
//! Needs root: run with `cargo test --test root_reload`. The pools turn connection tracking off:
//! these tests follow the tables themselves (root_conntrack tests tracking).

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::{Duration, Instant};

use common::packet::*;
use common::*;
use lb::config::{parse_str, Pool, Protocol};
use lb::flowhash::flow_hash;
use lb::table;
use nix::sys::signal::Signal;

const SECS: Duration = Duration::from_secs(15);

/// Backends 10.77.0.21..=29 get static neighbour entries with MAC 02:00:00:00:00:NN, so each
/// is told apart by the MAC the program writes.
fn mac(addr: IpAddr) -> [u8; 6] {
    match addr {
        // The neighbour entries spell the decimal NN as hex digits: 10.77.0.21 -> ...:21.
        IpAddr::V4(a) => [2, 0, 0, 0, 0, u8::from_str_radix(&a.octets()[3].to_string(), 16).unwrap_or(0)],
        IpAddr::V6(_) => [0; 6],
    }
}

struct Env {
    p: Pair,
    dir: TempDir,
    lb: Running,
    live: Live,
}

fn setup(layout: impl FnOnce(&Path) -> std::path::PathBuf, extra: &[&str]) -> Env {
    let p = pair();
    for n in 21..=29 {
        p.lb.ip(&["neigh", "replace", &format!("10.77.0.{n}"), "lladdr", &format!("02:00:00:00:00:{n}"), "dev", "lbv0", "nud", "permanent"]);
    }
    let dir = temp_dir();
    let config = layout(&dir);
    let mut args = vec!["attach", "lbv0", "--config", config.to_str().expect("utf-8"), "--table-capacity", "1000000"];
    if !extra.contains(&"--reload-delay") {
        args.extend_from_slice(&["--reload-delay", "0.02"]);
    }
    args.extend_from_slice(extra);
    let mut lb = Running::start(&p.lb, &args);
    let attached = lb.wait_for("attached to lbv0", SECS);
    lb.wait_for("serving", SECS);
    let live = Live::new(Running::prog_id(&attached));
    Env { p, dir, lb, live }
}

/// The usual layout: pool.yaml, a plain file holding V0.
fn plain_file(dir: &Path) -> std::path::PathBuf {
    std::fs::write(dir.join("pool.yaml"), V0).expect("write");
    dir.join("pool.yaml")
}

fn svc_of(s: &lb::config::Service) -> (IpAddr, u16, Protocol) {
    (s.vip, s.port, s.protocol)
}

/// Whether the live program serves exactly `pool`: each service's table, slot by slot, and
/// 300 flows per service through the program; `gone` endpoints must pass.
fn serves(live: &Live, pool: &Pool, gone: &[(IpAddr, u16, Protocol)]) -> Result<(), String> {
    for s in &pool.services {
        let (vip, port, proto) = svc_of(s);
        let t = table::build_service(s);
        let want: Vec<Option<[u8; 6]>> =
            t.owners().iter().map(|&o| (o != table::EMPTY).then(|| mac(s.backends[o as usize].address))).collect();
        match live.table(vip, port, proto) {
            Some(got) if got == want => {}
            Some(got) => return Err(format!("{}: live table differs ({} slots vs {})", s.name, got.len(), want.len())),
            None => return Err(format!("{}: no route", s.name)),
        }
        let IpAddr::V4(vip4) = vip else { continue };
        for i in 0..300u32 {
            let src = Ipv4Addr::from(0x0a01_0000 + i * 7919);
            let sport = 1024 + (i as u16) * 13;
            let l4 = match proto {
                Protocol::Tcp => L4::syn(sport, port),
                Protocol::Udp => L4::Udp { sport, dport: port },
            };
            let (action, out) = live.run(&ipv4_simple(src, vip4, l4));
            let h = flow_hash(s.hash, src.into(), vip, sport, port, if proto == Protocol::Tcp { 6 } else { 17 });
            let want_mac = want[(h % s.slots) as usize];
            if action != 3 || out[0..6] != want_mac.unwrap_or([0; 6]) {
                return Err(format!("{}: flow {src}:{sport} got action {action}, MAC {:?}, want {want_mac:?}", s.name, &out[0..6]));
            }
        }
    }
    for &(vip, port, proto) in gone {
        if live.route(vip, port, proto).is_some() {
            return Err(format!("{vip}:{port} is still routed"));
        }
        if let IpAddr::V4(vip4) = vip {
            let (action, _) = live.run(&ipv4_simple(v4("192.0.2.1"), vip4, L4::syn(5555, port)));
            if action != 2 {
                return Err(format!("{vip}:{port} does not pass (action {action})"));
            }
        }
    }
    Ok(())
}

/// Waits until the live program serves `text`'s pool.
fn converges(env: &Env, text: &str, gone: &[(IpAddr, u16, Protocol)]) {
    let pool = parse_str("expected.yaml", text).expect("valid");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match serves(&env.live, &pool, gone) {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("never converged: {e}\nlog so far:\n{}", env.lb.seen.join("\n")),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

const V0: &str = include_str!("pools/reload-v0.yaml");

fn pool_v1() -> String {
    V0.replace("[10.77.0.21, 10.77.0.22, 10.77.0.23]", "[10.77.0.21, 10.77.0.23]")
}
fn pool_v2() -> String {
    V0.replace(
        "    port: 80\n    conntrack: off\n    backends: [10.77.0.21, 10.77.0.22, 10.77.0.23]",
        "    port: 80\n    conntrack: off\n    slots: 4099\n    backends: [10.77.0.21, 10.77.0.22, 10.77.0.23, 10.77.0.26]",
    )
}
const V3: &str = include_str!("pools/reload-v3.yaml");
fn pool_v4() -> String {
    V0.replace(
        "[10.77.0.21, 10.77.0.22, 10.77.0.23]",
        "[10.77.0.21, {address: 10.77.0.22, weight: 2}, 10.77.0.23, 10.77.0.26, {address: 10.77.0.27, weight: 3}, 10.77.0.29]",
    )
}

fn rename_over(path: &Path, text: &str) {
    let tmp = path.with_file_name(".pool.yaml.tmp");
    std::fs::write(&tmp, text).expect("write temp");
    std::fs::rename(&tmp, path).expect("rename");
}

#[test]
fn root_reload_follows_every_way_of_replacing_the_file() {
    // Kubernetes' layout: pool.yaml -> ..data/pool.yaml, ..data -> ..v0.
    let env = setup(
        |dir| {
            std::fs::create_dir_all(dir.join("..v0")).expect("dir");
            std::fs::write(dir.join("..v0/pool.yaml"), V0).expect("write");
            std::os::unix::fs::symlink("..v0", dir.join("..data")).expect("link");
            std::os::unix::fs::symlink("..data/pool.yaml", dir.join("pool.yaml")).expect("link");
            dir.join("pool.yaml")
        },
        &[],
    );
    let mut env = env;
    let path = env.dir.join("pool.yaml");
    converges(&env, V0, &[]);

    // 1. Symlink swap: a new ..data link renamed over the old one.
    std::fs::create_dir_all(env.dir.join("..v1")).expect("dir");
    std::fs::write(env.dir.join("..v1/pool.yaml"), pool_v1()).expect("write");
    std::os::unix::fs::symlink("..v1", env.dir.join("..data_tmp")).expect("link");
    std::fs::rename(env.dir.join("..data_tmp"), env.dir.join("..data")).expect("swap");
    let line = env.lb.wait_for("web changed", SECS);
    assert!(line.contains("web changed (10.77.0.22 removed; "), "{line}");
    converges(&env, &pool_v1(), &[]);

    // 2. In place, through the link (the write lands in ..v1/pool.yaml).
    std::fs::write(&path, pool_v2()).expect("write in place");
    env.lb.wait_for("web changed (slots 65537 -> 4099; 10.77.0.22 added; 10.77.0.26 added; 4099 slots written)", SECS);
    converges(&env, &pool_v2(), &[]);

    // 3. An editor's write-to-temp-then-rename (replaces the link with a file).
    rename_over(&path, V3);
    let line = env.lb.wait_for("api added", SECS);
    assert!(line.contains("dns removed"), "{line}");
    converges(&env, V3, &[("10.77.0.100".parse().expect("ip"), 53, Protocol::Udp)]);

    // 4. Delete, then create again.
    std::fs::remove_file(&path).expect("delete");
    env.lb.wait_for("no such file; the current tables keep serving", SECS);
    converges(&env, V3, &[]);
    std::fs::write(&path, pool_v4()).expect("re-create");
    env.lb.wait_for("dns added", SECS);
    converges(&env, &pool_v4(), &[("10.77.0.100".parse().expect("ip"), 443, Protocol::Tcp)]);

    // Every reload said how long it took.
    assert!(env.lb.seen.iter().filter(|l| l.contains("applied in")).count() >= 4, "{:?}", env.lb.seen);
    env.lb.signal(Signal::SIGTERM);
    assert_eq!(env.lb.wait_exit(SECS).code(), Some(0));
}

#[test]
fn root_reload_refuses_bad_files_and_keeps_serving_byte_for_byte() {
    let mut env = setup(
        plain_file,
        &[],
    );
    let path = env.dir.join("pool.yaml");
    converges(&env, V0, &[]);
    let vip: IpAddr = "10.77.0.100".parse().expect("ip");
    let snapshot = |live: &Live| (live.route(vip, 80, Protocol::Tcp), live.table(vip, 80, Protocol::Tcp), live.route(vip, 53, Protocol::Udp), live.table(vip, 53, Protocol::Udp));
    let before = snapshot(&env.live);

    let bad = [
        ("services:\n  - name: web\n    vip: [\n", "pool.yaml:4:1: invalid YAML"),
        (&*V0.replace("port: 53", "port: 80").replace("    protocol: udp\n", ""), "pool.yaml:8:10: services[1].vip: 10.77.0.100:80/tcp is already served by services[0]"),
        ("", "pool.yaml: the file is empty"),
        (&*V0.replace("10.77.0.23]", "10.77.0.23, 10.55.0.1]"), "pool.yaml:6:52: services[0].backends[3].address: 10.55.0.1 has no route from this host"),
        (&*V0.replace("slots: 4099", "slots: 4100"), "pool.yaml:13:12: services[1].slots: maglev needs a prime table size, and 4100 is not prime"),
    ];
    for (text, needle) in bad {
        rename_over(&path, text);
        let line = env.lb.wait_for("reload refused", SECS);
        assert!(line.contains("the current tables keep serving"), "{line}");
        if !line.contains(needle) {
            env.lb.wait_for(needle, SECS);
        }
        assert_eq!(snapshot(&env.live), before, "a refused file changed the live tables");
        converges(&env, V0, &[]);
    }
    // Half a file, as a slow writer leaves it: refused, or (if it happens to be valid) never
    // the last word: the finished file wins.
    std::fs::write(&path, &V0[..V0.len() / 2]).expect("half");
    std::thread::sleep(Duration::from_millis(100));
    std::fs::write(&path, pool_v1()).expect("whole");
    converges(&env, &pool_v1(), &[]);
}

#[test]
fn root_reload_after_100_rapid_writes_serves_the_last_file() {
    let mut env = setup(
        plain_file,
        &[],
    );
    let path = env.dir.join("pool.yaml");
    let backends = ["10.77.0.21", "10.77.0.22", "10.77.0.23", "10.77.0.24", "10.77.0.25", "10.77.0.26", "10.77.0.27"];
    let mut last = String::new();
    for i in 0..100usize {
        let n = 1 + i % backends.len();
        let list: Vec<String> = backends[..n].iter().enumerate().map(|(j, b)| format!("{{address: {b}, weight: {}}}", 1 + (i + j) % 3)).collect();
        last = V0.replace("[10.77.0.21, 10.77.0.22, 10.77.0.23]", &format!("[{}]", list.join(", ")));
        if i % 2 == 0 {
            rename_over(&path, &last);
        } else {
            std::fs::write(&path, &last).expect("write");
        }
    }
    converges(&env, &last, &[]);
    // The burst was debounced into far fewer reloads than writes.
    std::thread::sleep(Duration::from_millis(300));
    while let Ok(l) = env.lb.stderr.recv_timeout(Duration::from_millis(100)) {
        env.lb.seen.push(l);
    }
    let reloads = env.lb.seen.iter().filter(|l| l.contains("reload (")).count();
    assert!((1..100).contains(&reloads), "{reloads} reloads for 100 writes");
}

#[test]
fn root_reload_on_sighup_and_adding_and_removing_services() {
    // File events are effectively off (an hour of debounce): only SIGHUP reloads here.
    let mut env = setup(
        plain_file,
        &["--reload-delay", "3600", "--recheck-interval", "3600"],
    );
    let path = env.dir.join("pool.yaml");
    converges(&env, V0, &[]);
    rename_over(&path, V3);
    std::thread::sleep(Duration::from_millis(300));
    converges(&env, V0, &[]);
    env.lb.signal(Signal::SIGHUP);
    let line = env.lb.wait_for("reload (SIGHUP)", SECS);
    assert!(line.contains("api added") && line.contains("dns removed"), "{line}");
    // The removed service's traffic passes to the host again; the added one balances.
    converges(&env, V3, &[("10.77.0.100".parse().expect("ip"), 53, Protocol::Udp)]);
    env.lb.signal(Signal::SIGHUP);
    env.lb.wait_for("is unchanged", SECS);
    env.lb.signal(Signal::SIGTERM);
    assert_eq!(env.lb.wait_exit(SECS).code(), Some(0));
    let _ = &env.p;
}

#[test]
fn root_reload_switches_services_to_and_between_bounded_tables() {
    let env = setup(plain_file, &[]);
    converges(&env, V0, &[]);
    // ring -> bounded and maglev -> bounded (a size no prime needs), then a new bound, then a
    // backend removed: each time the live tables are the builder's.
    let steps = [
        V0.replace("    port: 80\n", "    port: 80\n    algorithm: bounded\n")
            .replace("    algorithm: maglev\n", "    algorithm: bounded\n    load_bound: 1.05\n")
            .replace("slots: 4099", "slots: 4096"),
        V0.replace("    port: 80\n", "    port: 80\n    algorithm: bounded\n    load_bound: 1.000\n")
            .replace("    algorithm: maglev\n", "    algorithm: bounded\n    load_bound: 1.05\n")
            .replace("slots: 4099", "slots: 4096"),
        V0.replace("    port: 80\n", "    port: 80\n    algorithm: bounded\n    load_bound: 1.000\n")
            .replace("    algorithm: maglev\n", "    algorithm: bounded\n    load_bound: 1.05\n")
            .replace("slots: 4099", "slots: 4096")
            .replace("[10.77.0.21, 10.77.0.22, 10.77.0.23]", "[10.77.0.21, 10.77.0.23]"),
    ];
    for text in &steps {
        rename_over(&env.dir.join("pool.yaml"), text);
        converges(&env, text, &[]);
    }
}
