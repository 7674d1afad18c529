//! A confirmed flow-table entry is never taken by another flow, and never forgotten before its
//! flow has been idle for its whole timeout (issue 38, item 13), through the real program and
//! maps (BPF_PROG_TEST_RUN). Each test fills a one-bucket flow table with four confirmed UDP
//! flows, lets what could cost them their entries happen while they are quiet, sends 2,000
//! spoofed datagram pairs into the bucket and reweights so that the table would move all four:
//! each must still reach its own backend. Needs root: `cargo test --test root_conntrack_confirmed`.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use common::packet::*;
use common::{backend_mac as mac, pool};
use lb::balancer::Balancer;
use lb::config::{BackendState, HashMode, Pool};
use lb::dataplane::types;
use lb::flowhash::flow_hash;
use lb::table;

const A: &str = include_str!("pools/conntrack.yaml");
const A_LIST: &str = "[10.99.0.11, 10.99.0.12, 10.99.0.13]";
const B_LIST: &str = "[10.99.0.11, 10.99.0.12, 10.99.0.13, 10.99.0.14, 10.99.0.15]";
const CONFIRMED: u16 = types::lb_flow_gen_bits::LB_FLOW_CONFIRMED.0 as u16;

/// The backend the table of `pool`'s UDP service gives (src, sport).
fn says(pool: &Pool, src: Ipv4Addr, sport: u16) -> IpAddr {
    let s = pool.service("dns").expect("dns");
    let h = flow_hash(HashMode::Flow, src.into(), s.vip, sport, s.port, 17);
    s.backends[table::build_service(s).owner((h % s.slots) as usize).expect("owner")].address
}

/// `n` flows from `base` that pool A's table sends to `on` (any backend: None) and pool B's
/// elsewhere: the reweight would move each of them.
fn moving(a: &Pool, b: &Pool, base: u32, on: Option<IpAddr>, n: usize) -> Vec<(Ipv4Addr, u16)> {
    let flows: Vec<_> = (0..100_000u32)
        .map(|i| (Ipv4Addr::from(base + i % 250), 10_000 + (i / 250) as u16))
        .filter(|&(s, p)| says(a, s, p) != says(b, s, p) && on.is_none_or(|x| says(a, s, p) == x))
        .take(n)
        .collect();
    assert_eq!(flows.len(), n);
    flows
}

fn udp(dp: &Balancer, src: Ipv4Addr, sport: u16) -> IpAddr {
    let (action, out) = dp.test_run(&ipv4_simple(src, v4("10.99.0.100"), L4::Udp { sport, dport: 53 })).expect("run");
    assert_eq!(action, XDP_TX);
    IpAddr::V4(Ipv4Addr::new(10, 99, 0, out[5]))
}

/// A plane of pool A whose flow table is one bucket of four slots, with the given timeouts.
fn plane(udp_timeout: Duration) -> (Balancer, Pool, Pool) {
    let a = pool(A);
    let mut dp = common::tracked_plane(&a, 4, true, mac);
    dp.set_conntrack_timeouts(Duration::from_secs(60), udp_timeout).expect("timeouts");
    (dp, a, pool(&A.replace(A_LIST, B_LIST)))
}

/// The entries of the flow table: (slot, entry).
fn entries(dp: &Balancer) -> Vec<(u32, types::lb_flow)> {
    dp.flow_table(false).expect("flow table")
}

/// Each flow's first two datagrams (the second makes its entry), then, `gap` later, a third,
/// which confirms it. Asserts that the bucket holds the four, confirmed.
fn confirm(dp: &Balancer, flows: &[(Ipv4Addr, u16)], gap: Duration) {
    for &(src, sport) in flows {
        udp(dp, src, sport);
        udp(dp, src, sport);
    }
    std::thread::sleep(gap);
    for &(src, sport) in flows {
        udp(dp, src, sport);
    }
    let e = entries(dp);
    assert!(e.len() == 4 && e.iter().all(|(_, f)| f.gen_flags & CONFIRMED != 0), "four confirmed entries: {e:?}");
}

/// 2,000 pairs of spoofed datagrams, each pair from a source never seen before: the second of
/// a pair asks for a slot of the one bucket.
fn pair_flood(dp: &Balancer) {
    for i in 0..2000u32 {
        let (src, sport) = (Ipv4Addr::from(0x0b00_0000 + i), 1024 + (i % 50_000) as u16);
        udp(dp, src, sport);
        udp(dp, src, sport);
    }
}

fn ct(dp: &Balancer, stat: types::lb_stat) -> u64 {
    dp.stat(stat).expect("stat")
}

/// After the flood and the reweight, each flow's backend as pool A's table gave it: asserts it,
/// and that the flood took no entry.
fn assert_kept(dp: &Balancer, a: &Pool, flows: &[(Ipv4Addr, u16)], what: &str) {
    let moved: Vec<_> = flows.iter().filter(|&&(s, p)| udp(dp, s, p) != says(a, s, p)).collect();
    assert!(moved.is_empty(), "{what}: {} of {} confirmed flows answered by another backend: {moved:?}", moved.len(), flows.len());
    assert_eq!(ct(dp, types::lb_stat::LB_CT_EVICTED), 0, "{what}: the pair flood took a confirmed entry");
}

/// The program writes an entry's time at most once a refresh interval, so it may lag the flow's
/// last datagram by almost that much: a flow quiet for less than its timeout must keep its entry
/// all the same. Before the fix its entry was judged expired (so the flood's first pair took it,
/// and the reweight moved the flow) once it had been idle for the timeout less that lag.
#[test]
fn root_a_quiet_flow_keeps_its_entry_until_idle_for_its_whole_timeout() {
    // 3 s: 179 ticks, refreshed at most every 44 (0.74 s). The flows' last datagram comes 0.65 s
    // after the one that confirmed them (too soon to be written), then they are quiet for 2.5 s
    // and the flood comes: idle less than the timeout, their entries' time 3.15 s old. A run on a
    // machine so slow that either premise fails is tried again.
    for attempt in 1..=3 {
        let (mut dp, a, b) = plane(Duration::from_secs(3));
        let flows = moving(&a, &b, 0xc000_0200, None, 4);
        confirm(&dp, &flows, Duration::from_millis(800));
        let written: Vec<u32> = entries(&dp).iter().map(|(_, f)| f.seen).collect();
        std::thread::sleep(Duration::from_millis(650));
        for &(src, sport) in &flows {
            udp(&dp, src, sport);
        }
        let last = Instant::now();
        let lagging = entries(&dp).iter().map(|(_, f)| f.seen).collect::<Vec<_>>() == written;
        std::thread::sleep(Duration::from_millis(2500));
        pair_flood(&dp);
        dp.apply(&b).expect("reweight");
        let idle = last.elapsed();
        if !lagging || idle >= Duration::from_millis(2900) {
            eprintln!("attempt {attempt}: the machine missed the timing (the last datagram written: {}, idle {idle:?}); again", !lagging);
            continue;
        }
        assert_kept(&dp, &a, &flows, &format!("idle {idle:?} of a 3 s timeout"));
        return;
    }
    panic!("three attempts missed the timing");
}

/// A backend that counts as down for a moment (a failed health check, its agent's `down`) and
/// comes back: its quiet flows' entries may serve again, as the sweep of stable slots already
/// assumes. Before the fix a promotion ranked them with the dead, first to go, so a pair flood
/// during the moment took all four, and the reweight moved the flows off the backend.
#[test]
fn root_a_pair_flood_does_not_take_the_entries_of_a_backend_down_for_a_moment() {
    let (mut dp, a, b) = plane(Duration::from_secs(60));
    let on = "10.99.0.12".parse().expect("ip");
    let flows = moving(&a, &b, 0xc000_0200, Some(on), 4);
    confirm(&dp, &flows, Duration::from_millis(1200));
    let mut down = a.clone();
    let dns = down.services.iter_mut().find(|s| s.name == "dns").expect("dns");
    dns.backends.iter_mut().find(|x| x.address == on).expect(".12").state = BackendState::Down;
    dp.apply(&down).expect("down");
    pair_flood(&dp);
    dp.apply(&a).expect("up again");
    dp.apply(&b).expect("reweight");
    assert_kept(&dp, &a, &flows, "after .12 was down for a moment");
}

/// A CPU held up between reading its clock and judging a bucket (a virtual CPU its host
/// preempted, an interrupt storm) meets entries written after its clock read, ahead of its `now`.
/// Before the fix an entry more than 4 ticks (67 ms) ahead read as written 2^32 ticks ago:
/// expired, so the flood took it. BPF_PROG_TEST_RUN cannot hold a program up in mid-run, so the
/// test moves the entries' time 40 ticks ahead instead, which is what such a CPU sees.
#[test]
fn root_a_cpu_held_up_does_not_take_an_entry_written_since_it_read_the_clock() {
    let (mut dp, a, b) = plane(Duration::from_secs(60));
    let flows = moving(&a, &b, 0xc000_0200, None, 4);
    confirm(&dp, &flows, Duration::from_millis(1200));
    for (slot, mut f) in entries(&dp) {
        f.seen = f.seen.wrapping_add(40);
        dp.write_flow_slot(slot, &f).expect("write");
    }
    pair_flood(&dp);
    dp.apply(&b).expect("reweight");
    assert_kept(&dp, &a, &flows, "entries 40 ticks ahead of the judging CPU's clock");
}
