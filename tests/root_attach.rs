//! `lb attach` against real interfaces in network namespaces this test creates: attach, logs,
//! MAC resolution, counters, clean detach, and every refusal leaving nothing attached.
//! Needs root: run with `cargo test --test root_attach`.

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

const POOL: &str = include_str!("pools/attach.yaml");

const SECS: Duration = Duration::from_secs(15);

fn start(p: &Pair, config: &std::path::Path, extra: &[&str]) -> (Running, String) {
    let mut args = vec!["attach", "lbv0", "--config", config.to_str().expect("utf-8 path"), "--resolve-timeout", "1"];
    args.extend_from_slice(extra);
    let mut lb = Running::start(&p.lb, &args);
    let attached = lb.wait_for("attached to lbv0", SECS);
    lb.wait_for("serving", SECS);
    (lb, attached)
}

#[test]
fn root_attach_logs_resolves_and_detaches_cleanly_on_sigterm_and_sigint() {
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let p = pair();
        let dir = temp_dir();
        let cfg = write_config(&dir, "pool.yaml", POOL);
        let (mut lb, attached) = start(&p, &cfg, &[]);
        assert!(attached.contains("in native mode"), "{attached}");
        assert!(p.lb.has_xdp("lbv0"), "a program is attached while lb runs");
        // The backend answered ARP, and its MAC went into the log and the backends map.
        let be_mac = p.be.mac("lbv1");
        let line = lb.seen.iter().find(|l| l.contains("backend b1 10.77.0.11")).cloned().unwrap_or_default();
        assert!(line.contains(&format!("MAC {be_mac}")), "{line} vs {be_mac}");
        assert!(lb.seen.iter().any(|l| l.contains("service web: 10.77.0.100:80/tcp")), "{:?}", lb.seen);
        assert!(lb.seen.iter().any(|l| l.contains("service dns: 10.77.0.100:53/udp")), "{:?}", lb.seen);
        let mac_bytes: Vec<u8> = be_mac.split(':').map(|h| u8::from_str_radix(h, 16).expect("hex")).collect();
        let backends = Live::new(Running::prog_id(&attached)).values("backends");
        assert!(backends.iter().any(|v| v[..6] == mac_bytes[..] && v[6] & 1 == 1), "backend record with the resolved MAC");

        lb.signal(sig);
        let status = lb.wait_exit(SECS);
        assert_eq!(status.code(), Some(0), "{sig}: {:?}", lb.seen);
        assert!(lb.seen.iter().any(|l| l.contains(&format!("{}: detached from lbv0", sig.as_str()))), "{:?}", lb.seen);
        assert!(!p.lb.has_xdp("lbv0"), "{sig} leaves the interface clean");
    }
}

#[test]
fn root_attach_kill_9_leaves_no_program_behind() {
    let p = pair();
    let dir = temp_dir();
    let cfg = write_config(&dir, "pool.yaml", POOL);
    let (mut lb, _) = start(&p, &cfg, &[]);
    assert!(p.lb.has_xdp("lbv0"));
    lb.signal(Signal::SIGKILL);
    lb.wait_exit(SECS);
    // The link's last descriptor closed with the process; the kernel detaches asynchronously
    // but promptly.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while p.lb.has_xdp("lbv0") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!p.lb.has_xdp("lbv0"), "no stale program after kill -9");
}

#[test]
fn root_attach_never_replaces_another_program() {
    let p = pair();
    let dir = temp_dir();
    let cfg = write_config(&dir, "pool.yaml", POOL);
    let (mut first, attached) = start(&p, &cfg, &[]);
    let id = Running::prog_id(&attached);
    let out = lb_run(&p.lb, &["attach", "lbv0", "--config", cfg.to_str().expect("utf-8"), "--xdp-mode", "generic"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("lbv0 already has an XDP program attached (program id {id}, native mode)")), "{err}");
    assert!(err.contains("never replaces"), "{err}");
    // The first one is untouched and still serving.
    let still = p.lb.ip(&["-d", "link", "show", "dev", "lbv0"]);
    assert!(still.contains(&format!("id {id}")), "{still}");
    first.signal(Signal::SIGTERM);
    assert_eq!(first.wait_exit(SECS).code(), Some(0));
}

/// Runs `lb attach` expecting a refusal: exit 1, `needle` in stderr, and no program attached.
fn refused(p: &Pair, dev: &str, args: &[&str], needle: &str) -> String {
    let mut full = vec!["attach", dev];
    full.extend_from_slice(args);
    let out = lb_run(&p.lb, &full);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{full:?}: {err}");
    assert!(err.contains(needle), "{full:?}: expected {needle:?} in:\n{err}");
    assert!(!err.contains("attached to"), "{err}");
    assert!(!p.lb.has_xdp("lbv0"), "{full:?} left a program attached");
    err
}

#[test]
fn root_attach_refusals_are_clear_and_leave_nothing_attached() {
    let p = pair();
    let dir = temp_dir();
    let good = write_config(&dir, "pool.yaml", POOL);
    let good = good.to_str().expect("utf-8");

    refused(&p, "nosuch0", &["--config", good], "no such interface `nosuch0` (this network namespace has: lo, lbv0)");
    refused(&p, "lo", &["--config", good], "`lo` is not an Ethernet interface");

    // A config error is reported before any syscall, with file, line and field.
    let bad = write_config(&dir, "bad.yaml", &POOL.replace("port: 80", "port: 80000"));
    refused(&p, "lbv0", &["--config", bad.to_str().expect("utf-8")], "bad.yaml:4:11: services[0].port:");
    refused(&p, "lbv0", &["--config", &format!("{}/missing.yaml", dir.display())], "missing.yaml: no such file");
    refused(&p, "lbv0", &["--config", good, "--table-capacity", "100000"], "tables need 131074 slots in all, more than --table-capacity 100000");

    // Backends that L2 DSR cannot reach: off-link, behind a router, this host itself.
    p.lb.ip(&["route", "add", "10.99.9.0/24", "via", "10.77.0.11"]);
    let offlink = POOL
        .replace("{address: 10.77.0.11, name: b1}\n  - name: dns", "{address: 10.55.0.7, name: far}\n  - name: dns")
        .replace("      - {address: 10.77.0.11, name: b1}\n", "      - {address: 10.77.0.11, name: b1}\n      - {address: 10.99.9.9, name: routed}\n      - {address: 10.77.0.1, name: self}\n");
    let cfg = write_config(&dir, "offlink.yaml", &offlink);
    let err = refused(&p, "lbv0", &["--config", cfg.to_str().expect("utf-8")], "lbv0 cannot serve this pool; nothing was attached");
    assert!(err.contains("offlink.yaml:6:19: services[0].backends[0].address: 10.55.0.7 has no route from this host"), "{err}");
    assert!(err.contains("services[1].backends[1].address: 10.99.9.9 is behind the router 10.77.0.11"), "{err}");
    assert!(err.contains("services[1].backends[2].address: 10.77.0.1 is an address of this host"), "{err}");

    // A VIP held by another interface arrives there, not here.
    p.lb.ip(&["link", "add", "lbx0", "type", "veth", "peer", "name", "lbx1"]);
    p.lb.ip(&["addr", "add", "10.78.0.100/32", "dev", "lbx0"]);
    let other_vip = write_config(&dir, "vip.yaml", &POOL.replacen("vip: 10.77.0.100", "vip: 10.78.0.100", 1));
    refused(&p, "lbv0", &["--config", other_vip.to_str().expect("utf-8")], "services[0].vip: 10.78.0.100 is an address of lbx0");

    // Native mode where the driver has none: a bridge.
    p.lb.ip(&["link", "add", "lbbr0", "type", "bridge"]);
    p.lb.ip(&["link", "set", "lbbr0", "up"]);
    p.lb.ip(&["addr", "add", "10.79.0.1/24", "dev", "lbbr0"]);
    let br = write_config(&dir, "br.yaml", "services:\n  - name: w\n    vip: 10.79.0.100\n    port: 80\n    backends: [10.79.0.11]\n");
    let br = br.to_str().expect("utf-8");
    let out = lb_run(&p.lb, &["attach", "lbbr0", "--config", br, "--xdp-mode", "native", "--resolve-timeout", "0.1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("attaching the XDP program to lbbr0 in native mode: operation not supported"), "{err}");
    assert!(!p.lb.has_xdp("lbbr0"));

    // Not root: no CAP_BPF / CAP_NET_ADMIN.
    let out = p
        .lb
        .cmd("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", LB, "attach", "lbv0", "--config", good])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("lb attach needs root, or the capabilities CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN"), "{err}");
    assert!(!p.lb.has_xdp("lbv0"));

    // CAP_BPF and CAP_NET_ADMIN alone are not enough: the verifier wants CAP_PERFMON too, and
    // lb says so before trying; with all three, an unprivileged user attaches.
    let caps = |set: &str| {
        p.lb.cmd("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", &format!("--inh-caps=-all,{set}"), &format!("--ambient-caps=-all,{set}")])
            .args([LB, "attach", "lbv0", "--config", good, "--xdp-mode", "generic"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("setpriv")
    };
    let out = caps("+bpf,+net_admin").wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("(missing: CAP_PERFMON)"), "{err}");
    let mut child = caps("+bpf,+net_admin,+perfmon");
    let mut attached = false;
    for _ in 0..100 {
        if p.lb.has_xdp("lbv0") {
            attached = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(attached, "lb did not attach with CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN");
}

#[test]
fn root_attach_auto_mode_falls_back_to_generic_with_a_warning() {
    let p = pair();
    p.lb.ip(&["link", "add", "lbbr0", "type", "bridge"]);
    p.lb.ip(&["link", "set", "lbbr0", "up"]);
    p.lb.ip(&["addr", "add", "10.79.0.1/24", "dev", "lbbr0"]);
    let dir = temp_dir();
    let cfg = write_config(&dir, "br.yaml", "services:\n  - name: w\n    vip: 10.79.0.100\n    port: 80\n    backends: [10.79.0.11]\n");
    let mut lb = Running::start(&p.lb, &["attach", "lbbr0", "--config", cfg.to_str().expect("utf-8"), "--resolve-timeout", "0.1"]);
    lb.wait_for("warning: native XDP is not available on lbbr0 (operation not supported); falling back to generic mode", SECS);
    let attached = lb.wait_for("attached to lbbr0", SECS);
    assert!(attached.contains("in generic mode"), "{attached}");
    lb.wait_for("serving", SECS);
    assert!(lb.seen.iter().any(|l| l.contains("warning: vip 10.79.0.100 (service w) is not an address of lbbr0")), "{:?}", lb.seen);
    assert!(lb.seen.iter().any(|l| l.contains("backend 10.79.0.11 weight 1: 65537 slots (100.00%), MAC unresolved")), "{:?}", lb.seen);
    assert!(p.lb.has_xdp("lbbr0"));
    lb.signal(Signal::SIGTERM);
    assert_eq!(lb.wait_exit(SECS).code(), Some(0));
    assert!(!p.lb.has_xdp("lbbr0"));
}

#[test]
fn root_attach_follows_neighbour_changes_and_prints_stats() {
    let p = pair();
    let dir = temp_dir();
    let cfg = write_config(&dir, "pool.yaml", POOL);
    let (mut lb, attached) = start(&p, &cfg, &["--stats-interval", "0.3"]);
    let id = Running::prog_id(&attached);

    // Traffic from the backend's side to the UDP service: counted per service and backend.
    // (It is sent back out towards lbv1 and dropped there: no XDP program on the peer.)
    for _ in 0..5 {
        let st = p.be.cmd("bash").args(["-c", "echo hello > /dev/udp/10.77.0.100/53"]).status().expect("bash");
        assert!(st.success());
    }
    let deadline = std::time::Instant::now() + SECS;
    let mut forwarded = 0;
    while forwarded < 5 && std::time::Instant::now() < deadline {
        let line = lb.wait_stdout(": forwarded", SECS);
        forwarded = line.split_whitespace().nth(4).and_then(|n| n.parse().ok()).unwrap_or(0);
    }
    assert!(forwarded >= 5, "forwarded {forwarded}");
    let svc = lb.wait_stdout("service dns 10.77.0.100:53/udp: packets", SECS);
    assert!(svc.contains("packets 5 ") || svc.contains("packets 6 "), "{svc}");
    let be = lb.wait_stdout("backend b1 10.77.0.11 weight 1: packets", SECS);
    assert!(!be.contains("MAC unresolved"), "{be}");
    lb.wait_stdout("drops: malformed=0 no_backend=0 no_mac=0 fragment=0 no_table=0", SECS);

    // The kernel learns a new MAC for the backend: lb follows, in the log and in the map.
    p.lb.ip(&["neigh", "replace", "10.77.0.11", "lladdr", "02:42:00:00:00:42", "dev", "lbv0", "nud", "reachable"]);
    lb.wait_for("backend 10.77.0.11 moved from MAC", SECS);
    let backends = Live::new(id).values("backends");
    assert!(backends.iter().any(|v| v[..6] == [0x02, 0x42, 0, 0, 0, 0x42]), "new MAC in the backends map");

    lb.signal(Signal::SIGTERM);
    assert_eq!(lb.wait_exit(SECS).code(), Some(0));
}

/// Reads stats lines until one says at least `want` packets were forwarded; returns the count.
fn forwarded_reaches(lb: &mut Running, want: u64) -> u64 {
    let deadline = std::time::Instant::now() + SECS;
    let mut forwarded = 0;
    while forwarded < want && std::time::Instant::now() < deadline {
        let line = lb.wait_stdout(": forwarded", SECS);
        forwarded = line.split_whitespace().nth(4).and_then(|n| n.parse().ok()).unwrap_or(0);
    }
    forwarded
}

/// The interface's MAC changes while lb runs (`ip link set DEV address`, as a bond's
/// fail_over_mac does): lb follows it, and traffic to the VIP, now sent to the new MAC, is still
/// balanced. Before, the program kept the MAC read at attach: every frame counted as
/// `other_host` and went to the host, which answered the VIP's connections itself.
#[test]
fn root_attach_follows_a_change_of_the_interfaces_mac() {
    let p = pair();
    let dir = temp_dir();
    let cfg = write_config(&dir, "pool.yaml", POOL);
    let (mut lb, _) = start(&p, &cfg, &["--stats-interval", "0.3"]);
    let send = |n: usize| {
        for _ in 0..n {
            let st = p.be.cmd("bash").args(["-c", "echo hello > /dev/udp/10.77.0.100/53"]).status().expect("bash");
            assert!(st.success());
        }
    };
    send(3);
    let before = forwarded_reaches(&mut lb, 3);
    assert!(before >= 3, "forwarded {before} before the change");

    let old = p.lb.mac("lbv0");
    p.lb.ip(&["link", "set", "lbv0", "address", "02:77:00:00:00:77"]);
    // The backend's side learns the new MAC (its cached entry names the old one).
    p.be.ip(&["neigh", "flush", "dev", "lbv1"]);
    // lb checks the MAC four times a second.
    std::thread::sleep(Duration::from_secs(1));
    send(5);
    let after = forwarded_reaches(&mut lb, before + 5);
    assert!(after >= before + 5, "after the MAC change: forwarded {after}, {before} before");
    let changed = lb.wait_for("lbv0's MAC changed", SECS);
    assert!(changed.contains(&format!("from {old} to 02:77:00:00:00:77")), "{changed}");

    lb.signal(Signal::SIGTERM);
    assert_eq!(lb.wait_exit(SECS).code(), Some(0));
}

#[test]
fn root_attach_warns_of_a_vip_no_interface_holds_only_without_announce() {
    let p = pair();
    p.lb.ip(&["link", "add", "vips0", "type", "ifb"]);
    let dir = temp_dir();
    let cfg = write_config(&dir, "far.yaml", "services:\n  - name: far\n    vip: 10.77.0.200\n    port: 80\n    backends: [10.77.0.11]\n");
    let warning = "warning: vip 10.77.0.200 (service far) is not an address of lbv0";
    for announce in [false, true] {
        let extra: &[&str] = if announce { &["--xdp-mode", "generic", "--announce", "vips0"] } else { &["--xdp-mode", "generic"] };
        let (mut lb, _) = start(&p, &cfg, extra);
        lb.signal(Signal::SIGTERM);
        assert_eq!(lb.wait_exit(SECS).code(), Some(0));
        let warned = lb.seen.iter().any(|l| l.contains(warning));
        assert_eq!(warned, !announce, "--announce {announce}: {:?}", lb.seen);
    }
}

/// Runs `f` on a thread inside `ns`'s network namespace: the sockets it makes live there (and may
/// be used from any thread afterwards).
fn in_netns<T: Send + 'static>(ns: &Netns, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{}", ns.name);
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("the namespace's file");
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("namespace thread")
}

/// `GET path` on a connection of its own, everything within `within`: the status line and the
/// body's length, or what went wrong.
fn http_get(addr: std::net::SocketAddr, path: &str, within: Duration) -> Result<(String, usize), String> {
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + within;
    let mut s = std::net::TcpStream::connect_timeout(&addr, within).map_err(|e| format!("connect: {e}"))?;
    s.set_write_timeout(Some(within)).map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n").as_bytes()).map_err(|e| format!("send: {e}"))?;
    let mut got = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let left = deadline.checked_duration_since(std::time::Instant::now()).ok_or(format!("no full answer to {path} within {within:?} ({} bytes)", got.len()))?;
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("no full answer to {path} within {within:?} ({e}, {} bytes)", got.len())),
        }
    }
    let text = String::from_utf8_lossy(&got);
    let (head, body) = text.split_once("\r\n\r\n").ok_or(format!("no head in {text:?}"))?;
    Ok((head.lines().next().unwrap_or("").to_string(), body.len()))
}

/// A connection to `to` from the local address `from` (any 127/8 address on loopback).
fn connect_from(from: std::net::Ipv4Addr, to: std::net::SocketAddr) -> std::io::Result<std::net::TcpStream> {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrStorage};
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::from(std::net::SocketAddrV4::new(from, 0)))?;
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(to))?;
    Ok(std::net::TcpStream::from(fd))
}

#[test]
fn root_metrics_answer_while_a_client_never_reads_and_200_connections_idle() {
    // Also: 40 connections from one other address that ask for /metrics and never read.
    let p = pair();
    // Small socket buffers in this namespace: a /metrics answer of a few hundred kilobytes then
    // cannot be swallowed by the kernel for a client that never reads.
    let netns_sysctl = |kv: &str| sh(&["ip", "netns", "exec", &p.lb.name, "sysctl", "-qw", kv]);
    netns_sysctl("net.ipv4.tcp_rmem=4096 8192 65536");
    netns_sysctl("net.ipv4.tcp_wmem=4096 8192 65536");
    p.lb.ip(&["addr", "add", "10.78.0.1/16", "dev", "lbv0"]);
    let mut pool = String::from("services:\n  - name: big\n    vip: 10.77.0.100\n    port: 80\n    backends:\n");
    for n in 0..600u32 {
        pool.push_str(&format!("      - 10.78.{}.{}\n", 1 + n / 200, 1 + n % 200));
    }
    let dir = temp_dir();
    let cfg = write_config(&dir, "big.yaml", &pool);
    let addr: std::net::SocketAddr = "127.0.0.1:9465".parse().expect("addr");
    let (mut lb, _) = start(&p, &cfg, &["--xdp-mode", "generic", "--metrics", "127.0.0.1:9465"]);
    let pid = lb.child.id();
    let threads = || std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());

    // The serve loop publishes the pool's model soon after "serving"; then /metrics is large.
    let deadline = std::time::Instant::now() + SECS;
    let (status, size) = loop {
        let (status, size) = in_netns(&p.lb, move || http_get(addr, "/metrics", SECS)).expect("/metrics with nobody in the way");
        if size > 200_000 || std::time::Instant::now() > deadline {
            break (status, size);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.contains("200") && size > 200_000, "{status}, {size} bytes: too small to wedge a writer");
    std::thread::sleep(Duration::from_millis(200));
    let idle_threads = threads();

    // One connection that asks for /metrics and never reads, then 200 that never send a request
    // (lb serves 16 connections at once: the idle ones take every other thread and more).
    // Then 40 more from one other address (127.0.0.2) that ask and never read: more than lb's 16
    // threads, so before each address had a bound of its own they held every thread for the
    // whole write deadline.
    let (mut stuck, hogs, greedy) = in_netns(&p.lb, move || {
        use std::io::Write;
        let mut stuck = std::net::TcpStream::connect(addr).expect("connect");
        stuck.write_all(b"GET /metrics HTTP/1.1\r\nHost: lb\r\n\r\n").expect("send");
        std::thread::sleep(Duration::from_millis(100));
        let hogs: Vec<std::net::TcpStream> = (0..200).filter_map(|_| std::net::TcpStream::connect(addr).ok()).collect();
        let greedy: Vec<std::net::TcpStream> = (0..40)
            .filter_map(|_| {
                let mut s = connect_from(std::net::Ipv4Addr::new(127, 0, 0, 2), addr).ok()?;
                // Refused ones are closed by lb; the send may fail then, which is fine.
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: lb\r\n\r\n");
                Some(s)
            })
            .collect();
        (stuck, hogs, greedy)
    });
    assert_eq!((hogs.len(), greedy.len()), (200, 40));
    std::thread::sleep(Duration::from_secs(1));
    let started = std::time::Instant::now();

    // Others are still answered, promptly, and the idle connections did not each get a thread.
    let bound = Duration::from_secs(5);
    for path in ["/metrics", "/", "/metrics"] {
        let started = std::time::Instant::now();
        let answer = in_netns(&p.lb, move || http_get(addr, path, bound));
        let (status, _) = answer.unwrap_or_else(|e| panic!("{e} (lb has {} threads)", threads()));
        assert!(status.contains("200"), "{path}: {status}");
        assert!(started.elapsed() < bound, "{path} took {:?}", started.elapsed());
    }
    assert!(threads() <= idle_threads + 16, "lb runs {} threads for 201 connections ({idle_threads} without them)", threads());

    // The client that never read was not closed for the idle ones, but for taking less than
    // 32 KiB in a 1.5 s window (by 3 s): it got part of its answer (what the socket buffers
    // held), not all of it.
    assert!(started.elapsed() < Duration::from_secs(8), "the checks took {:?}", started.elapsed());
    std::thread::sleep(Duration::from_secs(3));
    let got = {
        use std::io::Read;
        let mut got = Vec::new();
        stuck.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let _ = stuck.read_to_end(&mut got);
        String::from_utf8_lossy(&got).into_owned()
    };
    let (head, body) = got.split_once("\r\n\r\n").unwrap_or((&got, ""));
    let length: usize = head.lines().find_map(|l| l.strip_prefix("Content-Length: ")).and_then(|n| n.trim().parse().ok()).unwrap_or(usize::MAX);
    assert!(head.starts_with("HTTP/1.1 200") && body.len() < length, "the client that never read got {} of {length} bytes: {}", body.len(), head.lines().next().unwrap_or(""));
    drop((hogs, greedy));

    lb.signal(Signal::SIGTERM);
    assert_eq!(lb.wait_exit(SECS).code(), Some(0));
}
