//! Fragments through the real program and maps (BPF_PROG_TEST_RUN): a datagram's later
//! fragments, which carry no ports, reach the backend its first fragment went to, for both
//! families, whoever chose that backend (the flow table or the destination table); without a
//! record the fragment route decides as before (issue 22, findings 6 and 7).
//! Needs root: `cargo test --test root_fragments`.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::packet::*;
use lb::balancer::Balancer;
use lb::config::{parse_str, Pool};
use lb::dataplane::types;
use lb::flowhash::flow_hash;
use lb::table;

const POOL: &str = include_str!("pools/packets.yaml");
const ACK: u8 = 0x10;

fn mac(addr: IpAddr) -> [u8; 6] {
    match addr {
        IpAddr::V4(a) => [0x02, 0xbb, 0, 0, 4, a.octets()[3]],
        IpAddr::V6(a) => [0x02, 0xbb, 0, 0, 6, a.octets()[15]],
    }
}

fn setup() -> (Balancer, Pool) {
    common::require_root();
    let pool = parse_str("pool.yaml", POOL).expect("fixture pool is valid");
    let mut dp = Balancer::load(lb::dataplane::DEFAULT_TABLE_CAPACITY).expect("load");
    dp.install(&pool, IFMAC, &|a| Some(mac(a))).expect("install");
    (dp, pool)
}

/// The backend the table of `pool`'s service gives a flow.
fn table_says(pool: &Pool, service: &str, src: IpAddr, sport: u16, proto: u8) -> IpAddr {
    let s = pool.service(service).expect("service");
    let h = flow_hash(s.hash, src, s.vip, sport, s.port, proto);
    let t = table::build_service(s);
    s.backends[t.owner((h % s.slots) as usize).expect("owner")].address
}

/// `pool` with backend `addr` draining: its table slots go to the others, its tracked flows stay.
fn drained(pool: &Pool, addr: IpAddr) -> Pool {
    let mut p = pool.clone();
    for s in &mut p.services {
        for b in &mut s.backends {
            if b.address == addr {
                b.state = lb::config::BackendState::Drain;
            }
        }
    }
    p
}

/// Where the program sent `frame`: the backend whose MAC it carries, or None when not sent.
fn sent_to(dp: &Balancer, pool: &Pool, frame: &[u8]) -> Option<IpAddr> {
    let (action, out) = dp.test_run(frame).expect("test_run");
    if action != XDP_TX {
        return None;
    }
    pool.services.iter().flat_map(|s| &s.backends).map(|b| b.address).find(|a| mac(*a)[..] == out[0..6])
}

fn v4_first(src: Ipv4Addr, dst: Ipv4Addr, l4: L4, id: u16) -> Vec<u8> {
    ipv4(None, src, dst, l4, &V4Opts { more_fragments: true, id: Some(id), ..Default::default() }, b"first part")
}

fn v4_later(src: Ipv4Addr, dst: Ipv4Addr, l4: L4, id: u16) -> Vec<u8> {
    ipv4(None, src, dst, l4, &V4Opts { frag_offset: 3, id: Some(id), ..Default::default() }, b"second part")
}

fn v6_first(src: Ipv6Addr, dst: Ipv6Addr, l4: L4, id: u32) -> Vec<u8> {
    ipv6_ext(src, dst, &[Ext::Fragment { offset: 0, more: true, id }], l4, b"first part")
}

fn v6_later(src: Ipv6Addr, dst: Ipv6Addr, l4: L4, id: u32) -> Vec<u8> {
    ipv6_ext(src, dst, &[Ext::Fragment { offset: 3, more: false, id }], l4, b"second part")
}

fn stat(dp: &Balancer, s: types::lb_stat) -> u64 {
    dp.stat(s).expect("stat")
}

/// The split the issue describes: a tracked flow keeps its backend while the table moves it
/// elsewhere (here a drain), so its first fragment goes to the flow's backend; before the fix
/// its later fragments followed the table (client-ip) or were dropped (flow hash, IPv4) or
/// passed to the host (IPv6), and every fragmented datagram was lost.
#[test]
fn root_later_fragments_follow_the_first_through_a_drain() {
    let (mut dp, pool) = setup();
    // (service, a client and port whose flow's backend, X, is drained next)
    let c4 = |i: u32| Ipv4Addr::from(0xc000_0200 + i);
    let sticky = (1..250).map(c4).find(|c| table_says(&pool, "sticky", (*c).into(), 0, 6) == ip("10.99.0.31")).expect("a client of c1");
    let web = (1..250).map(c4).find(|c| table_says(&pool, "web", (*c).into(), 40000, 6) == ip("10.99.0.11")).expect("a client of b1");
    let c6 = |i: u16| Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, i);
    let web6 = (1..250).map(c6).find(|c| table_says(&pool, "v6", (*c).into(), 40000, 6) == ip("fd00::11")).expect("a client of s1");
    let udp6 = (1..250).map(c6).find(|c| table_says(&pool, "v6sticky", (*c).into(), 0, 17) == ip("fd00::31")).expect("a client of e1");
    let l4t = |dport| L4::Tcp { sport: 40000, dport, flags: ACK };
    let l4u = L4::Udp { sport: 40000, dport: 443 };
    // Establish each flow (a SYN, then the guard tracks it from its second packet).
    for flags in [0x02, ACK] {
        let l4t = |dport| L4::Tcp { sport: 40000, dport, flags };
        assert_eq!(sent_to(&dp, &pool, &ipv4_simple(sticky, v4("10.99.0.150"), l4t(80))), Some(ip("10.99.0.31")));
        assert_eq!(sent_to(&dp, &pool, &ipv4_simple(web, v4("10.99.0.100"), l4t(80))), Some(ip("10.99.0.11")));
        assert_eq!(sent_to(&dp, &pool, &ipv6(web6, v6("fd00::100"), l4t(443), None, b"")), Some(ip("fd00::11")));
        assert_eq!(sent_to(&dp, &pool, &ipv6(udp6, v6("fd00::150"), l4u, None, b"")), Some(ip("fd00::31")));
    }
    let mut after = pool.clone();
    for a in ["10.99.0.31", "10.99.0.11", "fd00::11", "fd00::31"] {
        after = drained(&after, ip(a));
    }
    dp.apply(&after).expect("apply");
    assert_ne!(table_says(&after, "sticky", sticky.into(), 0, 6), ip("10.99.0.31"), "the table moved the client");
    let cases: Vec<(&str, Vec<u8>, Vec<u8>, IpAddr)> = vec![
        ("IPv4 TCP, client-ip, tracked", v4_first(sticky, v4("10.99.0.150"), l4t(80), 77), v4_later(sticky, v4("10.99.0.150"), l4t(80), 77), ip("10.99.0.31")),
        ("IPv4 TCP, flow hash, tracked", v4_first(web, v4("10.99.0.100"), l4t(80), 78), v4_later(web, v4("10.99.0.100"), l4t(80), 78), ip("10.99.0.11")),
        ("IPv6 TCP, flow hash, tracked", v6_first(web6, v6("fd00::100"), l4t(443), 79), v6_later(web6, v6("fd00::100"), l4t(443), 79), ip("fd00::11")),
        ("IPv6 UDP, client-ip, tracked", v6_first(udp6, v6("fd00::150"), l4u, 80), v6_later(udp6, v6("fd00::150"), l4u, 80), ip("fd00::31")),
    ];
    let mut wrong = Vec::new();
    for (what, first, later, flow_backend) in cases {
        let followed = stat(&dp, types::lb_stat::LB_FRAG_FOLLOWED);
        let to = sent_to(&dp, &after, &first);
        // The record outlives one fragment: a datagram has many.
        let got = [sent_to(&dp, &after, &later), sent_to(&dp, &after, &later)];
        let counted = stat(&dp, types::lb_stat::LB_FRAG_FOLLOWED) - followed;
        if to != Some(flow_backend) || got != [to; 2] || counted != 2 {
            wrong.push(format!("{what}: the flow's backend {flow_backend}, first fragment to {to:?}, later ones to {got:?}, {counted} counted as followed"));
        }
    }
    assert!(wrong.is_empty(), "later fragments split from their first:\n{}", wrong.join("\n"));
}

/// Without a record (the later fragment overtook its first, or another node saw the first),
/// the fragment route decides as before: a client-ip service's table by the client's address,
/// and a flow-hash service drops, counted; both counted as unmatched. Untracked services record
/// too: a flow-hash service's fragmented datagrams are no longer lost.
#[test]
fn root_unmatched_fragments_take_the_fragment_route() {
    let (dp, pool) = setup();
    let client = v4("192.0.2.7");
    let l4 = L4::Tcp { sport: 40000, dport: 80, flags: ACK };
    let unmatched = stat(&dp, types::lb_stat::LB_FRAG_UNMATCHED);
    let dropped = stat(&dp, types::lb_stat::LB_DROP_FRAGMENT);
    assert_eq!(sent_to(&dp, &pool, &v4_later(client, v4("10.99.0.150"), l4, 500)), Some(table_says(&pool, "sticky", client.into(), 0, 6)));
    assert_eq!(sent_to(&dp, &pool, &v4_later(client, v4("10.99.0.100"), l4, 501)), None);
    assert_eq!(sent_to(&dp, &pool, &v6_later(v6("2001:db8::7"), v6("fd00::100"), L4::Tcp { sport: 1, dport: 443, flags: ACK }, 502)), None);
    assert_eq!(stat(&dp, types::lb_stat::LB_FRAG_UNMATCHED) - unmatched, 3);
    assert_eq!(stat(&dp, types::lb_stat::LB_DROP_FRAGMENT) - dropped, 2);
    // A different identification, source or protocol is another datagram.
    assert_eq!(sent_to(&dp, &pool, &v4_first(client, v4("10.99.0.100"), l4, 600)), Some(table_says(&pool, "web", client.into(), 40000, 6)));
    assert_eq!(sent_to(&dp, &pool, &v4_later(client, v4("10.99.0.100"), l4, 601)), None);
    assert_eq!(sent_to(&dp, &pool, &v4_later(v4("192.0.2.8"), v4("10.99.0.100"), l4, 600)), None);
    assert_eq!(sent_to(&dp, &pool, &v4_later(client, v4("10.99.0.100"), l4, 600)), Some(table_says(&pool, "web", client.into(), 40000, 6)));
}

/// An IPv6 datagram whose fragmentable part starts with an extension header (destination
/// options): every fragment header names it (60), not TCP or UDP. The later fragments carry
/// it as their key's protocol, as the first does, and follow the first. Before, the later
/// fragment's "next header 60" made lb drop it as an unparsed extension header (`ext_header`),
/// and the first fragment's record was keyed by its upper-layer protocol (17), which no later
/// fragment carries.
#[test]
fn root_ipv6_later_fragments_with_a_header_after_the_fragment_header_follow_the_first() {
    let (dp, pool) = setup();
    let mut wrong = Vec::new();
    for (n, (vip, l4)) in [(v6("fd00::150"), L4::Udp { sport: 40001, dport: 443 }), (v6("fd00::100"), L4::Tcp { sport: 40002, dport: 443, flags: ACK })].into_iter().enumerate() {
        let src = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0x77, n as u16);
        let id = 900 + n as u32;
        let first = ipv6_ext(src, vip, &[Ext::Fragment { offset: 0, more: true, id }, Ext::DestOpts { units: 0 }], l4, b"first part");
        let later = ipv6_ext(src, vip, &[Ext::Fragment { offset: 3, more: false, id }, Ext::DestOpts { units: 0 }], l4, b"second part");
        let followed = stat(&dp, types::lb_stat::LB_FRAG_FOLLOWED);
        let to = sent_to(&dp, &pool, &first);
        let (action, _) = dp.test_run(&later).expect("test_run");
        let got = sent_to(&dp, &pool, &later);
        let counted = stat(&dp, types::lb_stat::LB_FRAG_FOLLOWED) - followed;
        if to.is_none() || got != to || counted != 2 {
            wrong.push(format!("{vip} {l4:?}: first fragment to {to:?}, later one action {action} to {got:?}, {counted} counted as followed (of 2)"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A second IPv6 fragment chain of legal length: hop-by-hop, destination options, routing
/// (type 4, no segments left), fragment, destination options. Five headers; lb walked four.
#[test]
fn root_the_longest_legal_ipv6_header_chain_is_balanced() {
    let (dp, pool) = setup();
    let src = v6("2001:db8::5:5");
    let l4 = L4::Udp { sport: 40005, dport: 443 };
    let chain = [Ext::HopByHop, Ext::DestOpts { units: 1 }, Ext::Routing { kind: 4, segments_left: 0 }, Ext::Fragment { offset: 0, more: true, id: 55 }, Ext::DestOpts { units: 0 }];
    let first = ipv6_ext(src, v6("fd00::150"), &chain, l4, b"first part");
    let ext_header = stat(&dp, types::lb_stat::LB_DROP_EXT_HEADER);
    let (action, _) = dp.test_run(&first).expect("test_run");
    assert_eq!(sent_to(&dp, &pool, &first), Some(table_says(&pool, "v6sticky", src.into(), 0, 17)), "action {action}, ext_header drops +{}", stat(&dp, types::lb_stat::LB_DROP_EXT_HEADER) - ext_header);
}

/// A spoofed first fragment with a victim's source and identification, to another service
/// of the same VIP, must not re-point the victim's datagram: the record is deleted (counted
/// `conflict`) and the victim's later fragments take the fragment route, never the other
/// service's backend. Before, the spoof overwrote the record and the victim's later fragments
/// followed it to the other service's backend.
#[test]
fn root_a_spoofed_first_fragment_cannot_re_point_a_datagram_to_another_service() {
    common::require_root();
    let client = v4("192.0.2.77");
    let victim = L4::Tcp { sport: 40000, dport: 80, flags: ACK };
    // Two TCP services of one VIP, with their own backends.
    let two = parse_str("two.yaml", "services:\n  - {name: a, vip: 10.99.0.100, port: 80, hash: flow, backends: [10.99.0.11]}\n  - {name: b, vip: 10.99.0.100, port: 8080, hash: flow, backends: [10.99.0.21]}\n").expect("pool");
    let mut dp2 = Balancer::load(lb::dataplane::DEFAULT_TABLE_CAPACITY).expect("load");
    dp2.install(&two, IFMAC, &|a| Some(mac(a))).expect("install");
    let to_a = sent_to(&dp2, &two, &v4_first(client, v4("10.99.0.100"), victim, 4243));
    assert_eq!(to_a, Some(ip("10.99.0.11")));
    let conflict = stat(&dp2, types::lb_stat::LB_FRAG_CONFLICT);
    let spoofed = sent_to(&dp2, &two, &v4_first(client, v4("10.99.0.100"), L4::Tcp { sport: 40000, dport: 8080, flags: ACK }, 4243));
    assert_eq!(spoofed, Some(ip("10.99.0.21")), "the spoofed first fragment itself is balanced as any packet");
    let later = sent_to(&dp2, &two, &v4_later(client, v4("10.99.0.100"), victim, 4243));
    assert_ne!(later, Some(ip("10.99.0.21")), "the victim's later fragment followed the spoofed first fragment to the other service's backend");
    assert_eq!(later, None, "without a record a flow-hash service's later fragments are dropped");
    assert_eq!(stat(&dp2, types::lb_stat::LB_FRAG_CONFLICT) - conflict, 1, "the conflict is counted");
    // A retransmitted first fragment that agrees refreshes the record; the next datagram with
    // the identification is recorded afresh.
    assert_eq!(sent_to(&dp2, &two, &v4_first(client, v4("10.99.0.100"), victim, 4244)), Some(ip("10.99.0.11")));
    assert_eq!(sent_to(&dp2, &two, &v4_first(client, v4("10.99.0.100"), victim, 4244)), Some(ip("10.99.0.11")));
    assert_eq!(sent_to(&dp2, &two, &v4_later(client, v4("10.99.0.100"), victim, 4244)), Some(ip("10.99.0.11")));
}

/// A first fragment answered "too big" (its encapsulation exceeds the MTU) went to no backend:
/// nothing is recorded. Before, the record was written before encapsulation and counted.
#[test]
fn root_a_first_fragment_answered_too_big_is_not_recorded() {
    common::require_root();
    let pool = parse_str("ipip.yaml", "services:\n  - {name: t, vip: 10.99.0.100, port: 82, hash: flow, forward: ipip, backends: [10.99.0.11]}\n").expect("pool");
    let mut dp = Balancer::load(lb::dataplane::DEFAULT_TABLE_CAPACITY).expect("load");
    dp.set_encap_sources(Some((v4("10.99.0.2"), 32)), None).expect("sources");
    dp.set_mtu(1500).expect("mtu");
    dp.install(&pool, IFMAC, &|a| Some(mac(a))).expect("install");
    let big = vec![7u8; 1470];
    let first = ipv4(None, v4("192.0.2.9"), v4("10.99.0.100"), L4::Tcp { sport: 40000, dport: 82, flags: ACK }, &V4Opts { more_fragments: true, dont_fragment: false, id: Some(31), ..Default::default() }, &big);
    let recorded = stat(&dp, types::lb_stat::LB_FRAG_RECORDED);
    let too_big = stat(&dp, types::lb_stat::LB_STAT_TOO_BIG) + stat(&dp, types::lb_stat::LB_DROP_OVERSIZE);
    let (action, _) = dp.test_run(&first).expect("test_run");
    assert_eq!(stat(&dp, types::lb_stat::LB_STAT_TOO_BIG) + stat(&dp, types::lb_stat::LB_DROP_OVERSIZE) - too_big, 1, "action {action}: the first fragment is too big once encapsulated");
    assert_eq!(stat(&dp, types::lb_stat::LB_FRAG_RECORDED) - recorded, 0, "a first fragment that went to no backend was recorded");
    let small = v4_first(v4("192.0.2.9"), v4("10.99.0.100"), L4::Tcp { sport: 40000, dport: 82, flags: ACK }, 32);
    assert_eq!(dp.test_run(&small).expect("test_run").0, XDP_TX);
    assert_eq!(stat(&dp, types::lb_stat::LB_FRAG_RECORDED) - recorded, 1, "one that went is");
}
