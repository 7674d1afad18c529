//! Connection tracking through the real program and maps (BPF_PROG_TEST_RUN): a tracked flow
//! keeps its backend when the table changes under it, a flow whose backend is gone re-hashes,
//! drain keeps tracked flows and sends new ones elsewhere, UDP entries age out, a SYN after a
//! client's RST is a new flow. (Against crafted packets: root_conntrack_trust.rs.) Needs root: `cargo test --test root_conntrack`.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::packet::*;
use lb::config::{BackendState, HashMode, Pool};
use lb::balancer::Balancer;
use lb::dataplane::types;
use lb::flowhash::flow_hash;
use lb::table;

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const RST: u8 = 0x04;

const A: &str = include_str!("pools/conntrack.yaml");

use common::{backend_mac as mac, pool};

fn setup() -> (Balancer, Pool) {
    setup_with(lb::dataplane::DEFAULT_CONNTRACK_SIZE, true)
}

/// [`setup`] with a flow table of `conntrack_size` slots and the guard on or off.
fn setup_with(conntrack_size: u32, guard: bool) -> (Balancer, Pool) {
    let p = pool(A);
    (common::tracked_plane(&p, conntrack_size, guard, mac), p)
}

/// The backend the table of `pool`'s service says (src, sport) goes to.
fn table_says(pool: &Pool, service: &str, src: Ipv4Addr, sport: u16) -> IpAddr {
    let s = pool.service(service).expect("service");
    let proto = if s.protocol == lb::config::Protocol::Tcp { 6 } else { 17 };
    let h = flow_hash(HashMode::Flow, src.into(), s.vip, sport, s.port, proto);
    let t = table::build_service(s);
    s.backends[t.owner((h % s.slots) as usize).expect("owner")].address
}

fn tcp(dp: &Balancer, src: Ipv4Addr, sport: u16, flags: u8) -> IpAddr {
    let (action, out) = dp.test_run(&ipv4_simple(src, v4("10.99.0.100"), L4::Tcp { sport, dport: 80, flags })).expect("run");
    assert_eq!(action, XDP_TX);
    IpAddr::V4(Ipv4Addr::new(10, 99, 0, out[5]))
}

fn udp(dp: &Balancer, src: Ipv4Addr, sport: u16) -> IpAddr {
    let (action, out) = dp.test_run(&ipv4_simple(src, v4("10.99.0.100"), L4::Udp { sport, dport: 53 })).expect("run");
    assert_eq!(action, XDP_TX);
    IpAddr::V4(Ipv4Addr::new(10, 99, 0, out[5]))
}

/// Flows (src, sport) whose backend differs between two pools' tables.
fn moving_flows(a: &Pool, b: &Pool, service: &str, n: usize) -> Vec<(Ipv4Addr, u16)> {
    let mut out = Vec::new();
    for i in 0..100_000u32 {
        let (src, sport) = (Ipv4Addr::from(0xc000_0200 + (i % 250)), 10_000 + (i / 250) as u16);
        if table_says(a, service, src, sport) != table_says(b, service, src, sport) {
            out.push((src, sport));
            if out.len() == n {
                break;
            }
        }
    }
    assert_eq!(out.len(), n, "enough flows move between the two pools");
    out
}

fn ct(dp: &Balancer, stat: types::lb_stat) -> u64 {
    dp.stat(stat).expect("stat")
}

#[test]
fn root_a_tracked_flow_keeps_its_backend_when_the_table_changes() {
    let (mut dp, a) = setup();
    // Two more backends and new weights: many slots move.
    let b = pool(&A.replacen("[10.99.0.11, 10.99.0.12, 10.99.0.13]", "[{address: 10.99.0.11, weight: 3}, 10.99.0.12, 10.99.0.13, 10.99.0.14, 10.99.0.15]", 1));
    let flows = moving_flows(&a, &b, "web", 50);
    for &(src, sport) in &flows {
        assert_eq!(tcp(&dp, src, sport, SYN), table_says(&a, "web", src, sport));
    }
    dp.apply(&b).expect("apply");
    let hits = ct(&dp, types::lb_stat::LB_CT_HIT);
    for &(src, sport) in &flows {
        assert_eq!(tcp(&dp, src, sport, ACK), table_says(&a, "web", src, sport), "{src}:{sport} kept its backend");
        assert_eq!(tcp(&dp, src, sport, SYN), table_says(&a, "web", src, sport), "a retransmitted SYN too");
    }
    assert_eq!(ct(&dp, types::lb_stat::LB_CT_HIT) - hits, 100);
    // A flow never seen follows the new table; so does an untracked mid-flow packet.
    let fresh = moving_flows(&a, &b, "web", 60)[55..].to_vec();
    for &(src, sport) in &fresh {
        assert_eq!(tcp(&dp, src, sport, ACK), table_says(&b, "web", src, sport), "no entry: the table decides");
        assert_eq!(tcp(&dp, src, sport, SYN), table_says(&b, "web", src, sport));
    }
    // With tracking off, the same tracked flows follow the table at once.
    let off = pool(&b_with_conntrack_off(&b));
    dp.apply(&off).expect("apply");
    for &(src, sport) in &flows {
        assert_eq!(tcp(&dp, src, sport, ACK), table_says(&off, "web", src, sport));
    }
}

fn b_with_conntrack_off(_: &Pool) -> String {
    A.replacen(
        "[10.99.0.11, 10.99.0.12, 10.99.0.13]",
        "[{address: 10.99.0.11, weight: 3}, 10.99.0.12, 10.99.0.13, 10.99.0.14, 10.99.0.15]\n    conntrack: off",
        1,
    )
}

#[test]
fn root_flows_of_a_removed_or_down_backend_re_hash() {
    let (mut dp, a) = setup();
    let b = pool(&A.replacen("[10.99.0.11, 10.99.0.12, 10.99.0.13]", "[10.99.0.11, 10.99.0.13]", 1));
    let flows = moving_flows(&a, &b, "web", 40);
    for &(src, sport) in &flows {
        assert_eq!(tcp(&dp, src, sport, SYN), "10.99.0.12".parse::<IpAddr>().expect("ip"), "only 12's flows move");
    }
    dp.apply(&b).expect("apply");
    let stale = ct(&dp, types::lb_stat::LB_CT_STALE);
    for &(src, sport) in &flows {
        assert_eq!(tcp(&dp, src, sport, ACK), table_says(&b, "web", src, sport), "re-hashed through the table");
        assert_eq!(tcp(&dp, src, sport, ACK), table_says(&b, "web", src, sport), "and tracked there");
    }
    assert_eq!(ct(&dp, types::lb_stat::LB_CT_STALE) - stale, 40, "each stale entry counted once, then remade");

    // A backend that fails its health checks: its tracked flows leave it too.
    let mut down = a.clone();
    down.services[0].backends[1].state = BackendState::Down;
    dp.apply(&a).expect("apply");
    // Flows the previous phase never tracked (an RST no longer forgets an entry at once).
    let again = moving_flows(&a, &b, "web", 80).split_off(40);
    for &(src, sport) in &again {
        assert_eq!(tcp(&dp, src, sport, SYN), "10.99.0.12".parse::<IpAddr>().expect("ip"));
    }
    dp.apply(&down).expect("apply");
    for &(src, sport) in &again {
        assert_ne!(tcp(&dp, src, sport, ACK), "10.99.0.12".parse::<IpAddr>().expect("ip"), "never through a stale entry");
    }
}

#[test]
fn root_drain_keeps_tracked_flows_and_sends_new_ones_elsewhere() {
    let (mut dp, a) = setup();
    let drained = pool(&A.replacen("[10.99.0.11, 10.99.0.12, 10.99.0.13]", "[10.99.0.11, {address: 10.99.0.12, state: drain}, 10.99.0.13]", 1));
    let flows = moving_flows(&a, &drained, "web", 80);
    let (tracked, new) = flows.split_at(40);
    for &(src, sport) in tracked {
        assert_eq!(tcp(&dp, src, sport, SYN), "10.99.0.12".parse::<IpAddr>().expect("ip"));
    }
    dp.apply(&drained).expect("apply");
    for &(src, sport) in tracked {
        assert_eq!(tcp(&dp, src, sport, ACK), "10.99.0.12".parse::<IpAddr>().expect("ip"), "a draining backend keeps its flows");
    }
    for &(src, sport) in new {
        let got = tcp(&dp, src, sport, SYN);
        assert_ne!(got, "10.99.0.12".parse::<IpAddr>().expect("ip"), "new flows avoid it");
        assert_eq!(got, table_says(&drained, "web", src, sport));
    }
}

#[test]
fn root_udp_entries_age_out_and_a_syn_right_after_a_reset_follows_the_flow() {
    let (mut dp, a) = setup();
    dp.set_conntrack_timeouts(Duration::from_secs(3600), Duration::from_secs(2)).expect("timeouts");
    let b = pool(&A.replace("[10.99.0.11, 10.99.0.12, 10.99.0.13]", "[10.99.0.11, 10.99.0.12, 10.99.0.13, 10.99.0.14, 10.99.0.15]"));
    let flows = moving_flows(&a, &b, "dns", 20);
    for &(src, sport) in &flows {
        assert_eq!(udp(&dp, src, sport), table_says(&a, "dns", src, sport));
    }
    let tcp_flows = moving_flows(&a, &b, "web", 20);
    for &(src, sport) in &tcp_flows {
        tcp(&dp, src, sport, SYN);
    }
    dp.apply(&b).expect("apply");
    for &(src, sport) in &flows {
        assert_eq!(udp(&dp, src, sport), table_says(&a, "dns", src, sport), "fresh entries hold");
    }
    // 2 s idle, the refresh interval an entry lives past its timeout (a quarter of it: 0.5 s) and
    // a margin, on the kernel's clock (which also runs while the pool is applied: a shorter
    // timeout let entries expire during a slow apply on a busy machine).
    std::thread::sleep(Duration::from_millis(2900));
    dp.tick().expect("tick");
    for &(src, sport) in &flows {
        assert_eq!(udp(&dp, src, sport), table_says(&b, "dns", src, sport), "idle past the timeout: re-hashed");
    }
    // TCP entries have an hour. A client's RST leaves its entry a few seconds more, and a SYN
    // on its ports within them still goes where the flow was: an RST and a SYN can both be
    // spoofed, and together they must not move a connection (that a SYN once the RST's life
    // is over starts a new flow: tests/root_conntrack_trust.rs).
    for &(src, sport) in &tcp_flows {
        assert_eq!(tcp(&dp, src, sport, RST | ACK), table_says(&a, "web", src, sport), "the RST goes where the flow was");
        assert_eq!(tcp(&dp, src, sport, SYN), table_says(&a, "web", src, sport), "so does a SYN right after it");
    }
}

/// A flow's handshake: the SYN, then the client's ACK (which makes the established entry).
fn handshake(dp: &Balancer, src: Ipv4Addr, sport: u16) -> IpAddr {
    let first = tcp(dp, src, sport, SYN);
    assert_eq!(
        tcp(dp, src, sport, ACK),
        first,
        "the ACK goes where the SYN went"
    );
    first
}

/// 200 established flows, then `syns` spoofed SYNs (never followed by an ACK) from as many
/// sources into a flow table of 4,096 entries, then a table change that moves every one of the
/// 200: how many still reach their own backend.
fn flood(guard: bool, syns: u32) -> (usize, Balancer) {
    let (mut dp, a) = setup_with(4096, guard);
    let b = pool(&A.replacen(
        "[10.99.0.11, 10.99.0.12, 10.99.0.13]",
        "[{address: 10.99.0.11, weight: 5}, 10.99.0.12, 10.99.0.13, 10.99.0.14]",
        1,
    ));
    let flows = moving_flows(&a, &b, "web", 200);
    for &(src, sport) in &flows {
        assert_eq!(
            handshake(&dp, src, sport),
            table_says(&a, "web", src, sport)
        );
    }
    assert_eq!(dp.flow_count().expect("count"), 200);
    for i in 0..syns {
        tcp(
            &dp,
            Ipv4Addr::from(0x0b00_0000 + i),
            1024 + (i % 50_000) as u16,
            SYN,
        );
    }
    dp.apply(&b).expect("apply");
    let kept = flows
        .iter()
        .filter(|&&(src, sport)| tcp(&dp, src, sport, ACK) == table_says(&a, "web", src, sport))
        .count();
    (kept, dp)
}

#[test]
fn root_a_syn_flood_does_not_evict_established_flows() {
    let (kept, dp) = flood(true, 40_000);
    assert_eq!(
        kept, 200,
        "every established flow kept its backend through the flood and the change"
    );
    assert_eq!(ct(&dp, types::lb_stat::LB_CT_EVICTED), 0);
    assert!(
        ct(&dp, types::lb_stat::LB_CT_PENDING) >= 40_000,
        "the flood's SYNs went to the half-open table"
    );
}

#[test]
fn root_without_the_guard_a_syn_flood_evicts_established_flows() {
    // The same flood with the guard off: what the guard prevents happens.
    let (kept, dp) = flood(false, 40_000);
    assert!(kept < 100, "{kept} of 200 flows survived 40,000 SYNs in 4,096 entries: most should have been forgotten");
    assert!(ct(&dp, types::lb_stat::LB_CT_EVICTED) > 10_000);
}

#[test]
fn root_the_flow_tag_is_the_keyed_hash_user_space_computes() {
    // User space places carried-over flows by the tag it computes: it must be the program's.
    let (dp, a) = setup();
    let s = a.service("web").expect("web");
    let src = Ipv4Addr::new(192, 0, 2, 9);
    let backend = handshake(&dp, src, 4321);
    let tag = lb::flowhash::flow_tag(dp.flow_key().expect("key"), src.into(), s.vip, 4321, 80, 6);
    let slots = dp.flow_slots().expect("slots");
    assert_eq!(slots.len(), 1);
    let (slot, got, id) = slots[0];
    assert_eq!(got, tag);
    let buckets = lb::dataplane::flow_table_slots(lb::dataplane::DEFAULT_CONNTRACK_SIZE) / 4;
    assert!(
        slot / 4 == lb::flowhash::tag_bucket(tag, buckets)
            || slot / 4 == lb::flowhash::tag_bucket2(tag, buckets),
        "in a bucket its tag names"
    );
    assert!(id != 0 && backend == table_says(&a, "web", src, 4321));
}

#[test]
fn root_a_udp_flow_is_established_at_its_second_datagram_and_survives_a_flood() {
    let (mut dp, a) = setup_with(4096, true);
    let b = pool(&A.replace("[10.99.0.11, 10.99.0.12, 10.99.0.13]", "[10.99.0.11, 10.99.0.12, 10.99.0.13, 10.99.0.14, 10.99.0.15]"));
    let flows = moving_flows(&a, &b, "dns", 50);
    for &(src, sport) in &flows {
        udp(&dp, src, sport);
    }
    assert_eq!(dp.flow_count().expect("count"), 0, "one datagram: only half-open");
    for &(src, sport) in &flows {
        udp(&dp, src, sport);
    }
    assert_eq!(dp.flow_count().expect("count"), 50, "the second datagram establishes the flow");
    // A flood of first datagrams from spoofed sources, then a change that moves all 50.
    for i in 0..40_000u32 {
        udp(&dp, Ipv4Addr::from(0x0b00_0000 + i), 1024 + (i % 50_000) as u16);
    }
    dp.apply(&b).expect("apply");
    for &(src, sport) in &flows {
        assert_eq!(udp(&dp, src, sport), table_says(&a, "dns", src, sport), "{src}:{sport} kept its backend through the flood");
    }
}

/// The id the data plane gave the backend at `addr` of `service`.
fn id_of(dp: &Balancer, service: &str, addr: IpAddr) -> u32 {
    let s = dp.installed().iter().find(|s| s.name == service).expect("service");
    s.backends.iter().find(|b| b.address == addr).expect("backend").id
}

/// The signals from real traffic (docs/operating.md): a flow's first SYN counts a connection
/// begun for its backend, the same SYN again (no SYN-ACK came) a SYN again, a client's RST as a
/// flow's second packet an early reset; the handshake's ACK, data and an established flow's RST
/// count nothing, and neither does UDP. With the guard off, a SYN again on an entry not yet
/// confirmed counts too.
#[test]
fn root_signals_count_first_syns_syns_again_and_resets_at_the_handshake_per_backend() {
    for guard in [true, false] {
        let (dp, _) = setup_with(lb::dataplane::DEFAULT_CONNTRACK_SIZE, guard);
        let src = v4("192.0.2.7");
        let total = |dp: &Balancer| -> lb::health::signals::Signals {
            let mut t = lb::health::signals::Signals::default();
            for a in ["10.99.0.11", "10.99.0.12", "10.99.0.13"] {
                let s = dp.signals(id_of(dp, "web", ip(a))).expect("signals");
                t.syns += s.syns;
                t.syn_again += s.syn_again;
                t.reset_early += s.reset_early;
            }
            t
        };
        // A connection that completes: one SYN begun, nothing else.
        let b = tcp(&dp, src, 1000, SYN);
        tcp(&dp, src, 1000, ACK);
        tcp(&dp, src, 1000, ACK | 0x08);
        tcp(&dp, src, 1000, RST);
        let one = dp.signals(id_of(&dp, "web", b)).expect("signals");
        assert_eq!((one.syns, one.syn_again, one.reset_early), (1, 0, 0), "guard {guard}: a whole connection");
        // A SYN sent twice more: two SYNs again, on its backend.
        let b = tcp(&dp, src, 1001, SYN);
        tcp(&dp, src, 1001, SYN);
        tcp(&dp, src, 1001, SYN);
        assert_eq!(dp.signals(id_of(&dp, "web", b)).expect("signals").syn_again, 2, "guard {guard}: its SYN sent again, on its backend");
        // UDP counts nothing.
        udp(&dp, src, 1002);
        udp(&dp, src, 1002);
        let t = total(&dp);
        assert_eq!((t.syns, t.syn_again), (2, 2), "guard {guard}: UDP adds nothing");
        if guard {
            // An RST as the second packet: the client aborted the handshake.
            let b = tcp(&dp, src, 1003, SYN);
            let before = dp.signals(id_of(&dp, "web", b)).expect("signals").reset_early;
            tcp(&dp, src, 1003, RST);
            assert_eq!(dp.signals(id_of(&dp, "web", b)).expect("signals").reset_early, before + 1, "an RST at the handshake");
            assert_eq!(total(&dp).reset_early, 1);
        }
    }
}

/// A TCP packet of (src, sport) to web with flags `flags` and acknowledgment number `ack`: the
/// backend it went to.
fn tcp_ack(dp: &Balancer, src: Ipv4Addr, sport: u16, flags: u8, ack: u32) -> IpAddr {
    let mut frame = ipv4_simple(src, v4("10.99.0.100"), L4::Tcp { sport, dport: 80, flags });
    // Ethernet (14) and IPv4 (20) headers, then the TCP header's acknowledgment number at 8.
    frame[42..46].copy_from_slice(&ack.to_be_bytes());
    let (action, out) = dp.test_run(&frame).expect("run");
    assert_eq!(action, XDP_TX);
    IpAddr::V4(Ipv4Addr::new(10, 99, 0, out[5]))
}

/// The third signal: a connection whose client ends it (FIN or RST, with ACK) acknowledging
/// nothing past the SYN-ACK, the same number as its handshake's ACK, counts no_data for the
/// backend it was promoted to, once however often the FIN comes. A connection that got data, an
/// RST without ACK, a FIN carrying another flow's number, and anything with the guard off (no
/// promotion tells the handshake's ACK) count nothing.
#[test]
fn root_signals_count_connections_that_end_without_data_once() {
    const FIN: u8 = 0x01;
    const PSH: u8 = 0x08;
    let no_data = |dp: &Balancer| -> u64 {
        let web = dp.installed().iter().find(|s| s.name == "web").expect("web");
        web.backends.iter().map(|b| dp.signals(b.id).expect("signals").no_data).sum()
    };
    let (dp, _) = setup_with(lb::dataplane::DEFAULT_CONNTRACK_SIZE, true);
    let src = v4("192.0.2.8");
    // The backend answered the handshake (its ISN + 1 = 0x1234_5679), then sent nothing.
    let first = tcp_ack(&dp, src, 2000, SYN, 0);
    tcp_ack(&dp, src, 2000, ACK, 0x1234_5679);
    tcp_ack(&dp, src, 2000, ACK | PSH, 0x1234_5679);
    assert_eq!(no_data(&dp), 0, "nothing before the client ends it");
    tcp_ack(&dp, src, 2000, FIN | ACK, 0x1234_5679);
    let one = dp.signals(id_of(&dp, "web", first)).expect("signals");
    assert_eq!((one.handshakes, one.no_data), (1, 1), "a FIN acknowledging only the SYN-ACK, on its backend");
    tcp_ack(&dp, src, 2000, FIN | ACK, 0x1234_5679);
    assert_eq!(no_data(&dp), 1, "a FIN sent again counts once");
    // A connection that got 500 bytes, then ended: nothing.
    tcp_ack(&dp, src, 2001, SYN, 0);
    tcp_ack(&dp, src, 2001, ACK, 0x0abc_0001);
    tcp_ack(&dp, src, 2001, FIN | ACK, 0x0abc_0001 + 500);
    assert_eq!(no_data(&dp), 1, "a connection that got data");
    // Another flow's FIN with this flow's number, on a tuple whose flow hash picks the same
    // cell (its low 18 bits are the same) but differs in its top 8 bits: nothing.
    tcp_ack(&dp, src, 2002, SYN, 0);
    tcp_ack(&dp, src, 2002, ACK, 0x5555_0001);
    let hash = |src: Ipv4Addr, sport: u16| flow_hash(HashMode::Flow, src.into(), ip("10.99.0.100"), sport, 80, 6);
    let mine = hash(src, 2002);
    let other = (0..4_000_000u32)
        .map(|i| (Ipv4Addr::from(0xc633_6400 + (i >> 16)), (i & 0xffff) as u16))
        .find(|&(s, p)| {
            let h = hash(s, p);
            (h ^ mine) & 0x3ffff == 0 && (h ^ mine) & 0xff00_0000 != 0
        })
        .expect("a tuple sharing the cell");
    tcp_ack(&dp, other.0, other.1, FIN | ACK, 0x5555_0001);
    assert_eq!(no_data(&dp), 1, "another flow's FIN, in the same cell");
    // An RST without ACK carries no acknowledgment: nothing; the client's RST with ACK counts.
    tcp_ack(&dp, src, 2002, RST, 0x5555_0001);
    assert_eq!(no_data(&dp), 1, "an RST without ACK");
    let b = tcp_ack(&dp, src, 2002, RST | ACK, 0x5555_0001);
    assert_eq!(dp.signals(id_of(&dp, "web", b)).expect("signals").no_data, 1 + u64::from(b == first), "an RST with ACK");
    assert_eq!(no_data(&dp), 2);
    // A FIN as the flow's second packet (the client closed before its handshake's ACK went
    // out, or it was lost) is not a handshake to watch: a FIN sent again counts nothing.
    tcp_ack(&dp, src, 2004, SYN, 0);
    tcp_ack(&dp, src, 2004, FIN | ACK, 0x4444_0001);
    tcp_ack(&dp, src, 2004, FIN | ACK, 0x4444_0001);
    assert_eq!(no_data(&dp), 2, "a FIN that made the flow's entry");
    // A backend's id given to another backend: a FIN of a flow the old one was sent counts
    // for neither (the cell holds the id's generation).
    tcp_ack(&dp, src, 2005, SYN, 0);
    let b = tcp_ack(&dp, src, 2005, ACK, 0x3333_0001);
    let old_id = id_of(&dp, "web", b);
    let others: Vec<&str> = ["10.99.0.11", "10.99.0.12", "10.99.0.13"].into_iter().filter(|a| ip(a) != b).collect();
    let mut dp = dp;
    dp.apply(&pool(&A.replace("[10.99.0.11, 10.99.0.12, 10.99.0.13]", &format!("[{}]", others.join(", "))))).expect("apply");
    // Past the removed id's quarantine (lb::plan), so that the next backend takes it.
    std::thread::sleep(lb::plan::QUARANTINE * 2);
    dp.apply(&pool(&A.replace("[10.99.0.11, 10.99.0.12, 10.99.0.13]", &format!("[{}, 10.99.0.14]", others.join(", "))))).expect("apply");
    assert!(dp.installed().iter().any(|s| s.backends.iter().any(|x| x.id == old_id && x.address == ip("10.99.0.14"))), "a new backend has the removed one's id");
    let before = no_data(&dp);
    tcp_ack(&dp, src, 2005, FIN | ACK, 0x3333_0001);
    assert_eq!(no_data(&dp), before, "a FIN of the id's earlier backend");
    assert_eq!(dp.signals(old_id).expect("signals").no_data, 0);
    // Without the guard, the handshake's ACK is not told from any other packet: nothing.
    let (dp, _) = setup_with(lb::dataplane::DEFAULT_CONNTRACK_SIZE, false);
    tcp_ack(&dp, src, 2000, SYN, 0);
    tcp_ack(&dp, src, 2000, ACK, 0x1234_5679);
    tcp_ack(&dp, src, 2000, FIN | ACK, 0x1234_5679);
    assert_eq!(no_data(&dp), 0, "guard off");
}

/// The same over IPv6 (its own parsing path calls the same check): a FIN acknowledging only the
/// SYN-ACK counts, one acknowledging a byte more does not.
#[test]
fn root_signals_count_ipv6_connections_that_end_without_data() {
    const FIN: u8 = 0x01;
    let p = pool("services:\n  - name: web6\n    vip: fd00::100\n    port: 80\n    hash: flow\n    backends: [fd00::11, fd00::12, fd00::13]\n");
    let dp = common::tracked_plane(&p, lb::dataplane::DEFAULT_CONNTRACK_SIZE, true, mac);
    let src: std::net::Ipv6Addr = "2001:db8::9".parse().expect("ip");
    let send = |sport: u16, flags: u8, ack: u32| {
        let mut frame = ipv6(src, "fd00::100".parse().expect("ip"), L4::Tcp { sport, dport: 80, flags }, None, &[]);
        // Ethernet (14) and IPv6 (40) headers, then the TCP header's acknowledgment number at 8.
        frame[62..66].copy_from_slice(&ack.to_be_bytes());
        let (action, _) = dp.test_run(&frame).expect("run");
        assert_eq!(action, XDP_TX);
    };
    let no_data = || -> u64 { dp.installed()[0].backends.iter().map(|b| dp.signals(b.id).expect("signals").no_data).sum() };
    send(3000, SYN, 0);
    send(3000, ACK, 0x7777_0001);
    send(3000, FIN | ACK, 0x7777_0001);
    assert_eq!(no_data(), 1, "a FIN acknowledging only the SYN-ACK");
    send(3001, SYN, 0);
    send(3001, ACK, 0x6666_0001);
    send(3001, FIN | ACK, 0x6666_0002);
    assert_eq!(no_data(), 1, "a FIN acknowledging the backend's byte");
}
