//! Packet fixtures through the real XDP program and real maps, with BPF_PROG_TEST_RUN, in the
//! style of Katran's tests: a description, an input frame, the expected action and the expected
//! output frame. Expected backends come from the kernel-free core (table + flow hash), so every
//! forwarded fixture also checks that the C and Rust flow hashes agree.
//! Needs root (CAP_BPF): run with `cargo test --test root_packets`.

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use common::packet::*;
use lb::config::{parse_str, Pool};
use lb::balancer::Balancer;
use lb::dataplane::types;
use lb::flowhash::flow_hash;
use lb::table;

const POOL: &str = include_str!("pools/packets.yaml");

fn backend_mac(addr: IpAddr) -> Option<[u8; 6]> {
    match addr {
        IpAddr::V4(a) => Some([0x02, 0xbb, 0, 0, 4, a.octets()[3]]),
        IpAddr::V6(a) => Some([0x02, 0xbb, 0, 0, 6, a.octets()[15]]),
    }
}

fn setup_with(mac_of: &dyn Fn(IpAddr) -> Option<[u8; 6]>) -> (Balancer, Pool) {
    common::require_root();
    let pool = parse_str("pool.yaml", POOL).expect("fixture pool is valid");
    let mut dp = Balancer::load(lb::dataplane::DEFAULT_TABLE_CAPACITY).expect("load");
    dp.install(&pool, IFMAC, mac_of).expect("install");
    (dp, pool)
}

fn setup() -> (Balancer, Pool) {
    setup_with(&backend_mac)
}

/// The backend the kernel-free core says a packet reaches.
fn predict(pool: &Pool, service: &str, src: IpAddr, sport: u16, proto: u8) -> IpAddr {
    let s = pool.service(service).expect("service");
    let h = flow_hash(s.hash, src, s.vip, sport, s.port, proto);
    let t = table::build_service(s);
    s.backends[t.owner((h % s.slots) as usize).expect("slot has an owner")].address
}

/// `frame` as the program should send it to `backend`: only the Ethernet addresses change.
fn forwarded(frame: &[u8], backend: IpAddr) -> Vec<u8> {
    let mut out = frame.to_vec();
    out[0..6].copy_from_slice(&backend_mac(backend).expect("mac"));
    out[6..12].copy_from_slice(&IFMAC);
    out
}

struct Fixture {
    description: &'static str,
    input: Vec<u8>,
    action: u32,
    output: Vec<u8>,
    /// The counter this packet must add one to.
    counter: Counter,
}

#[derive(Debug, Clone, Copy)]
enum Counter {
    /// The per-backend traffic counters (their sum).
    Forwarded,
    Stat(types::lb_stat),
}

fn counter(dp: &Balancer, c: Counter) -> u64 {
    match c {
        Counter::Forwarded => dp.forwarded().expect("forwarded"),
        Counter::Stat(s) => dp.stat(s).expect("stat"),
    }
}

fn tx(description: &'static str, input: Vec<u8>, backend: IpAddr) -> Fixture {
    let output = forwarded(&input, backend);
    Fixture { description, input, action: XDP_TX, output, counter: Counter::Forwarded }
}

fn pass(description: &'static str, input: Vec<u8>) -> Fixture {
    Fixture { description, output: input.clone(), input, action: XDP_PASS, counter: Counter::Stat(types::lb_stat::LB_STAT_PASSED) }
}

fn drop(description: &'static str, input: Vec<u8>, counter: types::lb_stat) -> Fixture {
    Fixture { description, output: input.clone(), input, action: XDP_DROP, counter: Counter::Stat(counter) }
}

/// Runs every fixture, then fails listing each one that went wrong (not only the first).
fn run_fixtures(dp: &Balancer, fixtures: &[Fixture]) {
    let mut wrong = Vec::new();
    for f in fixtures {
        let before = counter(dp, f.counter);
        let (action, out) = dp.test_run(&f.input).expect("test_run");
        let counted = counter(dp, f.counter) - before;
        if action != f.action {
            wrong.push(format!("{}: action {action}, expected {}", f.description, f.action));
        } else if out != f.output {
            wrong.push(format!("{}: output frame {out:02x?}, expected {:02x?}", f.description, f.output));
        } else if counted != 1 {
            wrong.push(format!("{}: counted {counted} times as {:?}", f.description, f.counter));
        }
    }
    assert!(wrong.is_empty(), "{} of {} fixtures wrong:\n{}", wrong.len(), fixtures.len(), wrong.join("\n"));
}

#[test]
fn root_fixtures_forward_pass_and_drop_as_specified() {
    let (dp, pool) = setup();
    let client = v4("192.0.2.7");
    let vip = v4("10.99.0.100");
    let c = IpAddr::V4(client);
    let frag_first = V4Opts { more_fragments: true, ..Default::default() };
    let frag_next = V4Opts { frag_offset: 3, ..Default::default() };
    let v6client = v6("2001:db8::7");
    let fixtures = vec![
        tx("IPv4 TCP SYN to the web VIP goes to the table's backend", ipv4_simple(client, vip, L4::syn(40000, 80)), predict(&pool, "web", c, 40000, 6)),
        tx("IPv4 UDP to the dns VIP goes to the table's backend", ipv4_simple(client, vip, L4::Udp { sport: 5353, dport: 53 }), predict(&pool, "dns", c, 5353, 17)),
        tx(
            "IPv6 TCP SYN to the v6 VIP goes to the table's backend",
            ipv6(v6client, v6("fd00::100"), L4::syn(40001, 443), None, b"hello"),
            predict(&pool, "v6", IpAddr::V6(v6client), 40001, 6),
        ),
        tx(
            "IPv4 with 4 bytes of options is parsed past them",
            ipv4(None, client, vip, L4::syn(40002, 80), &V4Opts { options: vec![1, 1, 1, 0], ..Default::default() }, b"x"),
            predict(&pool, "web", c, 40002, 6),
        ),
        tx(
            "IPv4 with the maximum 40 bytes of options",
            ipv4(None, client, vip, L4::syn(40003, 80), &V4Opts { options: vec![1; 40], ..Default::default() }, b"x"),
            predict(&pool, "web", c, 40003, 6),
        ),
        tx(
            "priority-tagged (VLAN 0) IPv4 TCP: on the untagged segment, forwarded with its tag kept",
            ipv4(Some(0), client, vip, L4::syn(40004, 80), &V4Opts::default(), b"tagged"),
            predict(&pool, "web", c, 40004, 6),
        ),
        tx(
            "a first fragment (ports present) under flow hash goes by its 5-tuple",
            ipv4(None, client, vip, L4::syn(40005, 80), &frag_first, b"first part"),
            predict(&pool, "web", c, 40005, 6),
        ),
        tx(
            "a later fragment under flow hash follows its first fragment's record",
            ipv4(None, client, vip, L4::syn(40005, 80), &frag_next, b"second part"),
            predict(&pool, "web", c, 40005, 6),
        ),
        drop(
            "a later fragment under flow hash without a first fragment: no ports, dropped, counted",
            ipv4(None, client, vip, L4::syn(40005, 80), &V4Opts { id: Some(7), ..frag_next.clone() }, b"second part"),
            types::lb_stat::LB_DROP_FRAGMENT,
        ),
        tx(
            "a first fragment under client-ip goes to the client's backend",
            ipv4(None, client, v4("10.99.0.150"), L4::syn(40006, 80), &frag_first, b"first part"),
            predict(&pool, "sticky", c, 0, 6),
        ),
        tx(
            "a non-first fragment under client-ip follows its client to the same backend",
            ipv4(None, client, v4("10.99.0.150"), L4::syn(40006, 80), &frag_next, b"second part"),
            predict(&pool, "sticky", c, 0, 6),
        ),
        drop(
            "a service whose table is empty drops, counted as no backend",
            ipv4_simple(client, v4("10.99.0.200"), L4::syn(40007, 80)),
            types::lb_stat::LB_DROP_NO_BACKEND,
        ),
        tx(
            "IPv6 UDP to a client-ip service goes to the client's backend",
            ipv6(v6client, v6("fd00::150"), L4::Udp { sport: 999, dport: 443 }, None, b"quic?"),
            predict(&pool, "v6sticky", IpAddr::V6(v6client), 0, 17),
        ),
        pass("the VIP on a port without a service passes unchanged", ipv4_simple(client, vip, L4::syn(40008, 81))),
        pass("UDP to a TCP service's port passes unchanged", ipv4_simple(client, vip, L4::Udp { sport: 1, dport: 80 })),
        pass("another address passes unchanged", ipv4_simple(client, v4("10.99.0.101"), L4::syn(40009, 80))),
        pass("ARP for the VIP passes unchanged", arp_request(client, vip)),
        pass("ICMP echo to the VIP passes unchanged", ipv4_simple(client, vip, L4::IcmpEcho)),
        pass("ICMPv6 echo to the v6 VIP passes unchanged", ipv6(v6client, v6("fd00::100"), L4::IcmpEcho, None, b"ping")),
        pass("the v6 VIP on another port passes unchanged", ipv6(v6client, v6("fd00::100"), L4::syn(1, 444), None, b"")),
        pass(
            "IPv6 with extension headers to an address without services passes unchanged",
            ipv6_ext(v6client, v6("fd00::101"), &[Ext::HopByHop], L4::syn(1, 443), b""),
        ),
        pass("an 802.1Q-tagged ARP passes unchanged", {
            let mut f = arp_request(client, vip);
            f.splice(12..12, [0x81, 0x00, 0x00, 0x2a]);
            f
        }),
        drop(
            "IPv4 with a header length below 20 bytes is malformed",
            {
                let mut f = ipv4_simple(client, vip, L4::syn(1, 80));
                f[14] = 0x44;
                f
            },
            types::lb_stat::LB_DROP_MALFORMED,
        ),
        drop(
            "IPv4 whose total length exceeds the frame is malformed",
            {
                let mut f = ipv4_simple(client, vip, L4::syn(1, 80));
                f[16..18].copy_from_slice(&1500u16.to_be_bytes());
                f
            },
            types::lb_stat::LB_DROP_MALFORMED,
        ),
        drop(
            "TCP with a data offset below 5 words is malformed",
            {
                let mut f = ipv4_simple(client, vip, L4::syn(1, 80));
                f[14 + 20 + 12] = 4 << 4;
                f
            },
            types::lb_stat::LB_DROP_MALFORMED,
        ),
    ];
    run_fixtures(&dp, &fixtures);
}

#[test]
fn root_every_truncation_is_never_forwarded_and_counted_as_malformed() {
    let (dp, _) = setup();
    let client = v4("192.0.2.7");
    let frames = [
        ("IPv4 TCP", ipv4_simple(client, v4("10.99.0.100"), L4::syn(1234, 80))),
        ("IPv4 UDP", ipv4_simple(client, v4("10.99.0.100"), L4::Udp { sport: 1234, dport: 53 })),
        ("IPv6 TCP", ipv6(v6("2001:db8::1"), v6("fd00::100"), L4::syn(1234, 443), None, b"payload")),
        (
            "tagged IPv4 with options",
            ipv4(Some(0), client, v4("10.99.0.100"), L4::syn(1, 80), &V4Opts { options: vec![1; 8], ..Default::default() }, b"p"),
        ),
    ];
    for (what, frame) in frames {
        let (action, _) = dp.test_run(&frame).expect("test_run");
        assert_eq!(action, XDP_TX, "{what}: the whole frame is forwarded");
        let before = dp.stat(types::lb_stat::LB_DROP_MALFORMED).expect("stat");
        let mut ran = 0;
        for len in 0..frame.len() {
            match dp.test_run(&frame[..len]) {
                Ok((action, _)) => {
                    assert_eq!(action, XDP_DROP, "{what}: length {len} of {}", frame.len());
                    ran += 1;
                }
                // The kernel refuses XDP test frames shorter than an Ethernet header, so those
                // never reach the program at all.
                Err(_) => assert!(len < 14, "{what}: length {len} refused"),
            }
        }
        let after = dp.stat(types::lb_stat::LB_DROP_MALFORMED).expect("stat");
        assert_eq!(after - before, ran, "{what}: every truncation counted as malformed");
        assert_eq!(ran, (frame.len() - 14) as u64);
    }
}

/// A deterministic stream of flows (the tests' one seeded generator).
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut r = common::rng::Rng(seed);
    move || r.next()
}

#[test]
fn root_100k_random_flows_follow_the_table_and_its_shares() {
    let (dp, pool) = setup();
    let web = pool.service("web").expect("web");
    let t = table::build_service(web);
    let shares = table::shares(web, &t);
    let mac_to_backend: HashMap<[u8; 6], usize> =
        web.backends.iter().enumerate().map(|(i, b)| (backend_mac(b.address).expect("mac"), i)).collect();
    let mut next = rng(7);
    let n = 100_000u64;
    let mut counts = vec![0u64; web.backends.len()];
    for _ in 0..n {
        let r = next();
        let src = Ipv4Addr::from((r >> 32) as u32 | 0x0100_0000);
        let sport = (r as u16).max(1);
        let frame = ipv4_simple(src, v4("10.99.0.100"), L4::syn(sport, 80));
        let (action, out) = dp.test_run(&frame).expect("test_run");
        assert_eq!(action, XDP_TX);
        let mac: [u8; 6] = out[0..6].try_into().expect("6 bytes");
        let got = mac_to_backend[&mac];
        // Per flow: exactly the backend the kernel-free core predicts.
        let h = flow_hash(web.hash, src.into(), web.vip, sport, web.port, 6);
        assert_eq!(Some(got), t.owner((h % web.slots) as usize), "{src}:{sport}");
        counts[got] += 1;
    }
    // In aggregate: each backend's count within 5 standard deviations of its table share.
    for (i, (count, share)) in counts.iter().zip(&shares).enumerate() {
        let expect = share.share * n as f64;
        let sigma = (n as f64 * share.share * (1.0 - share.share)).sqrt();
        assert!(
            (*count as f64 - expect).abs() < 5.0 * sigma,
            "backend {i}: {count} flows, expected {expect:.0} ± {:.0} (share {:.4})",
            5.0 * sigma,
            share.share
        );
    }
    // The per-backend counters agree with what was observed.
    let snap = dp.snapshot().expect("snapshot");
    let sweb = snap.services.iter().find(|s| s.name == "web").expect("web counters");
    assert_eq!(sweb.traffic.packets, n);
    for (b, count) in sweb.backends.iter().zip(&counts) {
        assert_eq!(b.traffic.packets, *count, "counter of {}", b.label);
    }
}

#[test]
fn root_client_ip_sends_every_source_port_of_a_client_to_one_backend() {
    let (dp, pool) = setup();
    let mut seen_backends = std::collections::HashSet::new();
    for client in 1..=64u8 {
        let src = Ipv4Addr::new(198, 51, 100, client);
        let want = forwarded(&[0u8; 12], predict(&pool, "sticky", src.into(), 0, 6));
        let mut macs = std::collections::HashSet::new();
        for sport in (1..=65535u16).step_by(257) {
            for l4 in [L4::syn(sport, 80), L4::Tcp { sport, dport: 80, flags: 0x10 }] {
                let (action, out) = dp.test_run(&ipv4_simple(src, v4("10.99.0.150"), l4)).expect("test_run");
                assert_eq!(action, XDP_TX);
                macs.insert(out[0..6].to_vec());
            }
        }
        assert_eq!(macs.len(), 1, "client {src}: every source port on one backend");
        assert!(macs.contains(&want[0..6]), "client {src}: the predicted backend");
        seen_backends.extend(macs);
    }
    assert!(seen_backends.len() > 1, "different clients do spread over backends");
}

#[test]
fn root_unresolved_backend_mac_drops_its_packets_counted() {
    let missing = IpAddr::V4(v4("10.99.0.12"));
    let (dp, pool) = setup_with(&|a| if a == missing { None } else { backend_mac(a) });
    let mut dropped = 0;
    let mut sent = 0;
    for sport in 1000..1400u16 {
        let src = v4("192.0.2.9");
        let frame = ipv4_simple(src, v4("10.99.0.100"), L4::syn(sport, 80));
        let backend = predict(&pool, "web", src.into(), sport, 6);
        let f = if backend == missing {
            dropped += 1;
            drop("unresolved MAC", frame, types::lb_stat::LB_DROP_NO_MAC)
        } else {
            sent += 1;
            tx("resolved MAC", frame, backend)
        };
        run_fixtures(&dp, &[f]);
    }
    assert!(dropped > 0 && sent > 0, "both paths exercised: {dropped} dropped, {sent} sent");
}

#[test]
fn root_keys_that_share_an_index_entry_are_told_apart() {
    use lb::config::Protocol;
    use lb::dataplane::vip_index_of;
    common::require_root();
    // VIPs (port 80/tcp) whose keys land on the same vip_index entry.
    let mut by_index: HashMap<u32, Vec<Ipv4Addr>> = HashMap::new();
    let mut found = None;
    for i in 1..=(1u32 << 20) {
        let vip = Ipv4Addr::from(0x0a00_0000 | i);
        let vips = by_index.entry(vip_index_of(vip.into(), 80, Protocol::Tcp)).or_default();
        vips.push(vip);
        if vips.len() == 3 {
            found = Some((vips[0], vips[1], vips[2]));
            break;
        }
    }
    let (a, b, stranger) = found.expect("three VIPs share an entry");
    // And an address that shares the entry of a service that has it alone.
    let lone = v4("10.250.0.1");
    let lone_index = vip_index_of(lone.into(), 80, Protocol::Tcp);
    let lone_stranger = (1..=(1u32 << 20))
        .map(|i| Ipv4Addr::from(0x0b00_0000 | i))
        .find(|v| vip_index_of((*v).into(), 80, Protocol::Tcp) == lone_index)
        .expect("an address shares the lone entry");
    // The same address, another protocol and port, on the same entry: only the rest of the key
    // tells them apart.
    let same_address = (1..=65535u16)
        .find(|&p| vip_index_of(lone.into(), p, Protocol::Udp) == lone_index)
        .expect("a UDP port of the lone VIP shares its entry");
    let text = format!(
        "services:
  - {{name: a, vip: {a}, port: 80, backends: [{{address: 10.99.1.11}}]}}
  - {{name: b, vip: {b}, port: 80, backends: [{{address: 10.99.1.12}}]}}
  - {{name: lone, vip: {lone}, port: 80, backends: [{{address: 10.99.1.13}}]}}
"
    );
    let pool = parse_str("shared.yaml", &text).expect("valid");
    let mut dp = Balancer::load(lb::dataplane::DEFAULT_TABLE_CAPACITY).expect("load");
    dp.install(&pool, IFMAC, &backend_mac).expect("install");
    let client = v4("192.0.2.7");
    let fixtures = vec![
        tx("first of two services sharing an entry", ipv4_simple(client, a, L4::syn(1000, 80)), ip("10.99.1.11")),
        tx("second of two services sharing an entry", ipv4_simple(client, b, L4::syn(1000, 80)), ip("10.99.1.12")),
        pass("an address that shares their entry but has no service", ipv4_simple(client, stranger, L4::syn(1000, 80))),
        tx("a service alone on its entry", ipv4_simple(client, lone, L4::syn(1000, 80)), ip("10.99.1.13")),
        pass("an address on a lone service's entry, without a service", ipv4_simple(client, lone_stranger, L4::syn(1000, 80))),
        pass(
            "the lone VIP over UDP on a port that shares its entry",
            ipv4_simple(client, lone, L4::Udp { sport: 1000, dport: same_address }),
        ),
    ];
    run_fixtures(&dp, &fixtures);
}

/// The backend MAC each of `flows` reaches through the program.
fn macs_of(dp: &Balancer, vip: Ipv4Addr, port: u16, flows: &[(Ipv4Addr, u16)]) -> Vec<Option<[u8; 6]>> {
    flows
        .iter()
        .map(|&(src, sport)| {
            let (action, out) = dp.test_run(&ipv4_simple(src, vip, L4::syn(sport, port))).expect("test_run");
            (action == XDP_TX).then(|| out[0..6].try_into().expect("6 bytes"))
        })
        .collect()
}

#[test]
fn root_apply_switches_live_tables_to_each_new_pool() {
    common::require_root();
    // Connection tracking off: this test follows the tables themselves.
    let base = "services:
  - name: web
    vip: 10.99.0.100
    port: 80
    hash: flow
    conntrack: off
    backends: [10.99.0.11, 10.99.0.12, 10.99.0.13]
  - name: alt
    vip: 10.99.0.100
    port: 8080
    hash: flow
    conntrack: off
    backends: [10.99.0.21]
";
    let pools = [
        base.to_string(),
        base.replace("[10.99.0.11, 10.99.0.12, 10.99.0.13]", "[10.99.0.11, 10.99.0.13]"),
        base.replace("[10.99.0.11, 10.99.0.12, 10.99.0.13]", "[10.99.0.11, 10.99.0.12, 10.99.0.13, 10.99.0.14]"),
        base.replace("    port: 80\n    hash: flow\n", "    port: 80\n    hash: flow\n    slots: 4099\n    algorithm: maglev\n"),
        base.replace("  - name: alt\n    vip: 10.99.0.100\n    port: 8080\n    hash: flow\n    conntrack: off\n    backends: [10.99.0.21]\n", ""),
        base.replace("port: 8080", "port: 9090"),
        base.to_string(),
    ];
    let mut dp = Balancer::load(1 << 20).expect("load");
    let mut next = rng(11);
    let flows: Vec<(Ipv4Addr, u16)> = (0..3000).map(|_| {
        let r = next();
        (Ipv4Addr::from((r >> 32) as u32 | 0x0100_0000), (r as u16).max(1))
    }).collect();
    let mut previous: Option<Vec<Option<[u8; 6]>>> = None;
    for (i, text) in pools.iter().enumerate() {
        let pool = parse_str("p.yaml", text).expect("valid");
        if i == 0 {
            dp.install(&pool, IFMAC, &backend_mac).expect("install");
        } else {
            // As lb attach does: MACs of new addresses are learned before the change.
            for b in pool.services.iter().flat_map(|s| &s.backends) {
                dp.set_mac(b.address, backend_mac(b.address)).expect("set_mac");
            }
            dp.apply(&pool).expect("apply");
        }
        let web = pool.service("web").expect("web");
        let t = table::build_service(web);
        let got = macs_of(&dp, v4("10.99.0.100"), 80, &flows);
        for (&(src, sport), mac) in flows.iter().zip(&got) {
            let h = flow_hash(web.hash, src.into(), web.vip, sport, 80, 6);
            let want = web.backends[t.owner((h % web.slots) as usize).expect("owner")].address;
            assert_eq!(*mac, backend_mac(want), "pool {i}: {src}:{sport}");
        }
        for (port, present) in [(8080u16, text.contains("8080")), (9090, text.contains("9090"))] {
            let got = macs_of(&dp, v4("10.99.0.100"), port, &flows[..20]);
            assert!(got.iter().all(|m| m.is_some() == present), "pool {i}: port {port} routed = {present}");
        }
        // Removing a backend from a ring moves only that backend's flows.
        if let (1, Some(before)) = (i, &previous) {
            let gone = backend_mac(ip("10.99.0.12"));
            let moved = before.iter().zip(&got).filter(|(a, b)| a != b).count();
            assert!(moved > 0);
            for (a, b) in before.iter().zip(&got) {
                assert!(a == b || *a == gone, "a flow moved off a backend that stayed");
            }
        }
        previous = Some(got);
    }
}

/// Finding 15 of issue 22: lb balances only frames sent to its own MAC. A frame for another
/// host (promiscuous mode, a bridge member) passes unchanged, counted apart; a broadcast or
/// multicast frame is never balanced: dropped when it is for a service, passed otherwise.
#[test]
fn root_frames_not_unicast_to_lb_are_never_balanced() {
    let (dp, pool) = setup();
    let client = v4("192.0.2.7");
    let vip = v4("10.99.0.100");
    let syn = ipv4_simple(client, vip, L4::syn(40100, 80));
    let fixtures = vec![
        tx("the same frame to lb's MAC is forwarded", syn.clone(), predict(&pool, "web", client.into(), 40100, 6)),
        Fixture {
            description: "to another host's MAC: passed unchanged, counted as other_host",
            input: to_mac(&syn, [0x02, 0, 0, 0, 0, 0x42]),
            action: XDP_PASS,
            output: to_mac(&syn, [0x02, 0, 0, 0, 0, 0x42]),
            counter: Counter::Stat(types::lb_stat::LB_STAT_OTHER_HOST),
        },
        drop("broadcast, for a service: dropped", to_mac(&syn, [0xff; 6]), types::lb_stat::LB_DROP_NOT_UNICAST),
        drop("IPv4 multicast MAC, for a service: dropped", to_mac(&syn, [0x01, 0, 0x5e, 0, 0, 1]), types::lb_stat::LB_DROP_NOT_UNICAST),
        drop(
            "IPv6 multicast MAC, for a service: dropped",
            to_mac(&ipv6(v6("2001:db8::7"), v6("fd00::100"), L4::syn(1, 443), None, b""), [0x33, 0x33, 0, 0, 0, 1]),
            types::lb_stat::LB_DROP_NOT_UNICAST,
        ),
        pass("broadcast, not for a service: passed", to_mac(&ipv4_simple(client, vip, L4::syn(40100, 81)), [0xff; 6])),
        pass("broadcast ARP for the VIP: passed", arp_request(client, vip)),
    ];
    run_fixtures(&dp, &fixtures);
}

/// Finding 14d of issue 22: lb serves the untagged segment of its interface. Untagged and
/// priority-tagged (VLAN 0) frames are balanced; a frame tagged with another VLAN is passed when
/// it is not for a service (Linux gives it to that VLAN's device) and dropped, counted, when it
/// is: lb's neighbours are resolved on the untagged interface, so forwarding it would send the
/// client's packet into a VLAN the backend may not be on, or out of its own.
#[test]
fn root_vlan_tagged_frames_for_a_service_are_refused() {
    let (dp, pool) = setup();
    let client = v4("192.0.2.7");
    let vip = v4("10.99.0.100");
    let syn = ipv4_simple(client, vip, L4::syn(40200, 80));
    let fixtures = vec![
        tx("priority tag (VLAN 0): balanced, tag kept", tagged(&syn, 0), predict(&pool, "web", client.into(), 40200, 6)),
        tx("priority tag with a PCP: balanced, tag kept", tagged(&syn, 0xa000), predict(&pool, "web", client.into(), 40200, 6)),
        drop("VLAN 42, for a service: dropped", tagged(&syn, 42), types::lb_stat::LB_DROP_VLAN),
        drop(
            "VLAN 42, IPv6 for a service: dropped",
            tagged(&ipv6(v6("2001:db8::7"), v6("fd00::100"), L4::syn(1, 443), None, b""), 42),
            types::lb_stat::LB_DROP_VLAN,
        ),
        pass("VLAN 42, not for a service: passed", tagged(&ipv4_simple(client, v4("10.99.0.101"), L4::syn(1, 80)), 42)),
        pass("VLAN 42, ARP: passed", tagged(&arp_request(client, vip), 42)),
    ];
    run_fixtures(&dp, &fixtures);
}

/// Findings 8 and 14a of issue 22: port 0 is only ever the fragment route's; the ports are read
/// inside the IP datagram, never from the Ethernet padding behind it.
#[test]
fn root_port_zero_and_padding_never_reach_a_service() {
    let (dp, _) = setup();
    let client = v4("192.0.2.7");
    // A UDP datagram of 20 bytes (no UDP header at all), in a frame padded to 60 bytes whose
    // padding holds a UDP header to the dns service.
    // An IPv4 frame (20-byte header) whose datagram says it is `len` bytes, its checksum mended,
    // cut after `keep` of its bytes and padded with `pad` to the 60-byte Ethernet minimum.
    let shortened = |mut f: Vec<u8>, len: u16, keep: usize, pad: u8| {
        f.truncate(14 + keep);
        f[16..18].copy_from_slice(&len.to_be_bytes());
        f[24..26].copy_from_slice(&[0, 0]);
        let c = csum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f.resize(60, pad);
        f
    };
    let short = shortened(ipv4_simple(client, v4("10.99.0.100"), L4::Udp { sport: 5353, dport: 53 }), 20, 28, 0);
    // And a TCP datagram that ends 4 bytes into its header.
    let cut = shortened(ipv4_simple(client, v4("10.99.0.100"), L4::syn(40300, 80)), 24, 24, 0x50);
    let fixtures = vec![
        pass("TCP to port 0 of a client-ip VIP (it has a fragment route): passed", ipv4_simple(client, v4("10.99.0.150"), L4::syn(40301, 0))),
        pass("UDP to port 0 of a VIP: passed", ipv4_simple(client, v4("10.99.0.100"), L4::Udp { sport: 1, dport: 0 })),
        pass("IPv6 UDP to port 0 of a client-ip VIP: passed", ipv6(v6("2001:db8::7"), v6("fd00::150"), L4::Udp { sport: 1, dport: 0 }, None, b"")),
        drop("UDP ports only in the Ethernet padding: malformed", short, types::lb_stat::LB_DROP_MALFORMED),
        drop("a TCP header cut by the datagram's end, padding after it: malformed", cut, types::lb_stat::LB_DROP_MALFORMED),
    ];
    run_fixtures(&dp, &fixtures);
}

/// Finding 7 of issue 22: IPv6 extension headers are walked (hop-by-hop, destination options,
/// routing, fragment; at most 6), and a packet for a VIP with services whose port lb cannot read
/// or must not balance is dropped, counted, never passed to the host.
#[test]
fn root_ipv6_extension_headers_are_parsed_or_refused() {
    let (dp, pool) = setup();
    let c6 = v6("2001:db8::7");
    let vip = v6("fd00::100");
    let web6 = |sport| predict(&pool, "v6", IpAddr::V6(c6), sport, 6);
    let dst = |units| Ext::DestOpts { units };
    let fixtures = vec![
        tx("hop-by-hop, then TCP: balanced", ipv6_ext(c6, vip, &[Ext::HopByHop], L4::syn(41000, 443), b"x"), web6(41000)),
        tx(
            "hop-by-hop, destination options (24 bytes), routing type 2 with no segments left: balanced",
            ipv6_ext(c6, vip, &[Ext::HopByHop, dst(2), Ext::Routing { kind: 2, segments_left: 0 }], L4::syn(41001, 443), b"x"),
            web6(41001),
        ),
        tx(
            "four extension headers: balanced",
            ipv6_ext(c6, vip, &[Ext::HopByHop, dst(0), dst(1), dst(0)], L4::syn(41002, 443), b"x"),
            web6(41002),
        ),
        tx(
            "an atomic fragment (offset 0, no M): an ordinary packet",
            ipv6_ext(c6, vip, &[Ext::Fragment { offset: 0, more: false, id: 9 }], L4::syn(41003, 443), b"x"),
            web6(41003),
        ),
        drop(
            "seven extension headers (more than lb walks), to a VIP with services: dropped",
            ipv6_ext(c6, vip, &[Ext::HopByHop, dst(0), dst(0), dst(0), dst(0), dst(0), dst(0)], L4::syn(41004, 443), b"x"),
            types::lb_stat::LB_DROP_EXT_HEADER,
        ),
        drop(
            "routing header type 0: refused",
            ipv6_ext(c6, vip, &[Ext::Routing { kind: 0, segments_left: 0 }], L4::syn(41005, 443), b"x"),
            types::lb_stat::LB_DROP_EXT_HEADER,
        ),
        drop(
            "routing header with segments left (the VIP is not the final destination): refused",
            ipv6_ext(c6, vip, &[Ext::Routing { kind: 4, segments_left: 1 }], L4::syn(41006, 443), b"x"),
            types::lb_stat::LB_DROP_EXT_HEADER,
        ),
        drop("AH, to a VIP with services: dropped", ipv6_ext(c6, vip, &[Ext::Ah], L4::syn(41007, 443), b"x"), types::lb_stat::LB_DROP_EXT_HEADER),
        drop(
            "hop-by-hop after another header: refused",
            ipv6_ext(c6, vip, &[dst(0), Ext::HopByHop], L4::syn(41008, 443), b"x"),
            types::lb_stat::LB_DROP_EXT_HEADER,
        ),
        pass("extension headers to the VIP on a port without a service: passed", ipv6_ext(c6, vip, &[Ext::HopByHop], L4::syn(41009, 444), b"x")),
        pass("AH to an address without services: passed", ipv6_ext(c6, v6("fd00::101"), &[Ext::Ah], L4::syn(41010, 443), b"x")),
        pass("ICMPv6 echo behind hop-by-hop: passed", ipv6_ext(c6, vip, &[Ext::HopByHop], L4::IcmpEcho, b"ping")),
        drop(
            "a destination-options header longer than the packet: malformed",
            {
                let mut f = ipv6_ext(c6, vip, &[dst(0)], L4::syn(41011, 443), b"");
                f[14 + 40 + 1] = 9;
                f
            },
            types::lb_stat::LB_DROP_MALFORMED,
        ),
    ];
    run_fixtures(&dp, &fixtures);
}
