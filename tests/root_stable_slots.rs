//! Stable slots through the real program and maps (BPF_PROG_TEST_RUN): an established TCP flow
//! on a slot that has not changed owner goes by the table without its flow-table lookup; a slot
//! that changed stays looked up while a flow tracked elsewhere can hash to it (changed once or
//! twice, drained, resized), then becomes cheap again; entries are still made, confirmed and kept
//! fresh by the sampled packets. The checks that would fail without the sweep's rule are run
//! with the rule switched off too. Needs root: `cargo test --test root_stable_slots`.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::packet::*;
use common::Bpffs;
use lb::balancer::Balancer;
use lb::config::{HashMode, Pool};
use lb::dataplane::types::lb_stat;
use lb::flowhash::flow_hash;
use lb::table;

use lb::dataplane::floor;

/// The id of the program behind `fd`.
fn prog_id_of(fd: std::os::fd::BorrowedFd<'_>) -> u32 {
    use std::os::fd::AsRawFd;
    let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of_val(&info) as u32;
    // SAFETY: info is a plain struct of the size given, and fd a live program descriptor.
    let r = unsafe { libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(fd.as_raw_fd(), &mut info, &mut len) };
    assert_eq!(r, 0, "reading the program's info");
    info.id
}

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const RST: u8 = 0x04;

const A: &str = include_str!("pools/conntrack.yaml");
const THREE: &str = "[10.99.0.11, 10.99.0.12, 10.99.0.13]";

use common::{backend_mac as mac, pool};

/// The conntrack pool with a fourth backend, 10.99.0.14: about a quarter of the slots change owner.
fn with_b4() -> Pool {
    pool(&A.replacen(THREE, "[10.99.0.11, 10.99.0.12, 10.99.0.13, 10.99.0.14]", 1))
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

/// A tracked plane of the conntrack pool, a moment after its tables were placed (flows begin
/// later than that in service; an entry written within PLACED_MARGIN of its range's placement
/// counts as older than it, crates/core/src/stable.rs).
fn setup() -> (Balancer, Pool) {
    let p = pool(A);
    let dp = common::tracked_plane(&p, lb::dataplane::DEFAULT_CONNTRACK_SIZE, true, mac);
    std::thread::sleep(Duration::from_millis(120));
    (dp, p)
}

fn hash(src: Ipv4Addr, sport: u16) -> u32 {
    flow_hash(HashMode::Flow, src.into(), ip("10.99.0.100"), sport, 80, 6)
}

/// The backend the table of `pool`'s web service gives (src, sport).
fn table_says(pool: &Pool, src: Ipv4Addr, sport: u16) -> IpAddr {
    let s = pool.service("web").expect("service");
    let t = table::build_service(s);
    s.backends[t.owner((hash(src, sport) % s.slots) as usize).expect("owner")].address
}

/// The table-array index of (src, sport)'s slot as installed now.
fn slot_of(dp: &Balancer, src: Ipv4Addr, sport: u16) -> u32 {
    let s = dp.installed().iter().find(|s| s.name == "web").expect("web");
    s.base + hash(src, sport) % s.slots
}

fn tcp(dp: &Balancer, src: Ipv4Addr, sport: u16, flags: u8) -> IpAddr {
    let (action, out) = dp.test_run(&ipv4_simple(src, v4("10.99.0.100"), L4::Tcp { sport, dport: 80, flags })).expect("run");
    assert_eq!(action, XDP_TX);
    IpAddr::V4(Ipv4Addr::new(10, 99, 0, out[5]))
}

fn ct(dp: &Balancer, stat: lb_stat) -> u64 {
    dp.stat(stat).expect("stat")
}

/// `n` flows (src, sport) whose backend differs between two pools' tables, from `skip` on.
fn moving(a: &Pool, b: &Pool, skip: usize, n: usize) -> Vec<(Ipv4Addr, u16)> {
    (0..200_000u32)
        .map(|i| (Ipv4Addr::from(0xc000_0200 + (i % 250)), 10_000 + (i / 250) as u16))
        .filter(|&(s, p)| table_says(a, s, p) != table_says(b, s, p))
        .skip(skip)
        .take(n)
        .collect()
}

/// `n` flows whose backend is the same in both pools, from `skip` on.
fn staying(a: &Pool, b: &Pool, skip: usize, n: usize) -> Vec<(Ipv4Addr, u16)> {
    (0..200_000u32)
        .map(|i| (Ipv4Addr::from(0xc600_0000 + (i % 250)), 20_000 + (i / 250) as u16))
        .filter(|&(s, p)| table_says(a, s, p) == table_says(b, s, p))
        .skip(skip)
        .take(n)
        .collect()
}

/// Handshake and a few packets: tracked (pending, then established at the ACK) while the slots
/// are unstable, as after an install. Then past the flows' young seconds, in which every packet
/// of a flow after its SYN takes the whole path (conntrack.h, ct_young).
fn establish(dp: &Balancer, flows: &[(Ipv4Addr, u16)]) {
    for &(s, p) in flows {
        tcp(dp, s, p, SYN);
        tcp(dp, s, p, ACK);
    }
    std::thread::sleep(YOUNG);
}

/// A flow's young time after its SYN (two refresh intervals of 64 ticks of 16.8 ms), and a margin.
const YOUNG: Duration = Duration::from_millis(2300);

/// Sweeps until nothing more becomes stable, once a slot marked last is old enough to be judged
/// (crates/core/src/stable.rs, PLACED_MARGIN: about 67 ms), as the daemon's sweep each second does.
fn settle(dp: &mut Balancer) {
    std::thread::sleep(Duration::from_millis(120));
    while dp.sweep().expect("sweep") > 0 {}
}

#[test]
fn root_a_stable_slot_sends_established_flows_without_a_lookup() {
    let (mut dp, a) = setup();
    let flows = staying(&a, &a, 0, 200);
    establish(&dp, &flows);
    assert!(dp.unstable_slots() > 0, "an install marks every slot it writes");
    settle(&mut dp);
    assert_eq!(dp.unstable_slots(), 0, "no flow is tracked elsewhere than its slot's owner");
    let (stable, hit, miss) = (ct(&dp, lb_stat::LB_CT_STABLE), ct(&dp, lb_stat::LB_CT_HIT), ct(&dp, lb_stat::LB_CT_MISS));
    for _ in 0..10 {
        for &(s, p) in &flows {
            assert_eq!(tcp(&dp, s, p, ACK), table_says(&a, s, p));
        }
    }
    let (stable, hit, miss) = (ct(&dp, lb_stat::LB_CT_STABLE) - stable, ct(&dp, lb_stat::LB_CT_HIT) - hit, ct(&dp, lb_stat::LB_CT_MISS) - miss);
    // One packet in 16 at random takes the whole path: 125 of 2,000 expected.
    assert_eq!(stable + hit, 2000, "every packet by the table or by its entry");
    assert_eq!(miss, 0, "every sampled packet found its entry");
    assert!(stable >= 1700 && hit >= 50, "{stable} sent by the table, {hit} looked up");
    // A SYN always takes the whole path: recorded half-open, as before.
    let pending = ct(&dp, lb_stat::LB_CT_PENDING);
    let fresh = staying(&a, &a, 500, 20);
    for &(s, p) in &fresh {
        tcp(&dp, s, p, SYN);
    }
    assert_eq!(ct(&dp, lb_stat::LB_CT_PENDING) - pending, 20);
}

/// A flow whose slot changed keeps its backend, and the slot stays unstable while the flow's
/// entry lives; with the sweep's rule off (every slot marked stable) the same flows follow the
/// new table and break.
#[test]
fn root_a_changed_slot_is_looked_up_while_a_flow_tracked_elsewhere_lives() {
    for rule in [true, false] {
        let (mut dp, a) = setup();
        let b = with_b4();
        let flows = moving(&a, &b, 0, 40);
        let others = staying(&a, &b, 0, 40);
        establish(&dp, &flows);
        establish(&dp, &others);
        settle(&mut dp);
        dp.apply(&b).expect("apply");
        let changed = dp.unstable_slots();
        assert!(changed > 0, "the slots that moved to the new backend are unstable");
        if rule {
            settle(&mut dp);
            for &(s, p) in &flows {
                assert!(dp.is_unstable(slot_of(&dp, s, p)), "{s}:{p}'s slot stays unstable");
            }
            let held: std::collections::HashSet<u32> = flows.iter().map(|&(s, p)| slot_of(&dp, s, p)).collect();
            assert_eq!(dp.unstable_slots(), held.len(), "the changed slots no moved flow hashes to became stable");
        } else {
            dp.mark_all_stable_unchecked();
        }
        let kept = flows.iter().filter(|&&(s, p)| (0..8).all(|_| tcp(&dp, s, p, ACK) == table_says(&a, s, p))).count();
        if rule {
            assert_eq!(kept, flows.len(), "every moved flow kept its backend");
        } else {
            assert!(kept < flows.len() / 4, "without the rule the moved flows follow the table ({kept} of {} kept)", flows.len());
        }
        for &(s, p) in &others {
            assert_eq!(tcp(&dp, s, p, ACK), table_says(&b, s, p));
        }
    }
}

/// A slot that changes owner twice (a backend added, then drained): flows from before each
/// change keep their backends (most of the first ones own their slot again), and the slot
/// stays unstable for the ones tracked elsewhere.
#[test]
fn root_a_slot_that_changes_twice_keeps_the_flows_of_both_owners() {
    let (mut dp, a) = setup();
    let b = with_b4();
    let first = moving(&a, &b, 0, 30);
    establish(&dp, &first);
    settle(&mut dp);
    dp.apply(&b).expect("apply");
    settle(&mut dp);
    // Flows that start on the same slots under b's owners.
    let slots: std::collections::HashSet<u32> = first.iter().map(|&(s, p)| slot_of(&dp, s, p)).collect();
    let second: Vec<(Ipv4Addr, u16)> = moving(&a, &b, 30, 5000).into_iter().filter(|&(s, p)| slots.contains(&slot_of(&dp, s, p))).take(20).collect();
    assert!(second.len() >= 5, "flows of b on the changed slots");
    establish(&dp, &second);
    // The new backend drained: its slots go back (most to the first flows' backends), and
    // it lives on for its flows.
    let c = pool(&A.replacen(THREE, "[10.99.0.11, 10.99.0.12, 10.99.0.13, {address: 10.99.0.14, state: drain}]", 1));
    dp.apply(&c).expect("apply");
    let back = first.iter().filter(|&&(s, p)| table_says(&c, s, p) == table_says(&a, s, p)).count();
    assert!(back * 2 > first.len(), "most of the first flows' slots have their first owner again ({back})");
    settle(&mut dp);
    for &(s, p) in &second {
        assert!(dp.is_unstable(slot_of(&dp, s, p)), "held by the flows tracked to b's owner");
    }
    for _ in 0..8 {
        for &(s, p) in &first {
            assert_eq!(tcp(&dp, s, p, ACK), table_says(&a, s, p), "the first flows");
        }
        for &(s, p) in &second {
            assert_eq!(tcp(&dp, s, p, ACK), table_says(&b, s, p), "the second flows");
        }
    }
}

/// Once the flows tracked elsewhere are gone (reset, then past the reset's life), the slot is
/// stable again and its packets go by the table without a lookup.
#[test]
fn root_a_slot_becomes_stable_again_once_its_moved_flows_are_gone() {
    let (mut dp, a) = setup();
    let b = with_b4();
    let flows = moving(&a, &b, 0, 20);
    establish(&dp, &flows);
    settle(&mut dp);
    dp.apply(&b).expect("apply");
    settle(&mut dp);
    let held = dp.unstable_slots();
    assert!(held > 0);
    for &(s, p) in &flows {
        assert_eq!(tcp(&dp, s, p, RST | ACK), table_says(&a, s, p));
    }
    settle(&mut dp);
    assert_eq!(dp.unstable_slots(), held, "an RST leaves the entry a few seconds");
    // LB_CT_RESET_TICKS: about 4 s.
    std::thread::sleep(Duration::from_millis(4400));
    settle(&mut dp);
    assert_eq!(dp.unstable_slots(), 0, "no flow tracked elsewhere is left");
    let stable = ct(&dp, lb_stat::LB_CT_STABLE);
    for &(s, p) in &flows {
        assert_eq!(tcp(&dp, s, p, SYN), table_says(&b, s, p), "a new connection on the same ports");
    }
    std::thread::sleep(YOUNG);
    for &(s, p) in &flows {
        for _ in 0..8 {
            assert_eq!(tcp(&dp, s, p, ACK), table_says(&b, s, p));
        }
    }
    assert!(ct(&dp, lb_stat::LB_CT_STABLE) - stable >= 100, "sent by the table again");
}

/// A drained backend's slots change owner: its tracked flows stay on it (their slots unstable),
/// and new flows go elsewhere.
#[test]
fn root_a_drained_backend_keeps_its_flows_across_stable_slots() {
    let (mut dp, a) = setup();
    let drained = pool(&A.replacen(THREE, "[10.99.0.11, {address: 10.99.0.12, state: drain}, 10.99.0.13]", 1));
    let flows = moving(&a, &drained, 0, 60);
    let (tracked, new) = flows.split_at(30);
    establish(&dp, tracked);
    settle(&mut dp);
    assert_eq!(dp.unstable_slots(), 0);
    dp.apply(&drained).expect("apply");
    settle(&mut dp);
    for _ in 0..8 {
        for &(s, p) in tracked {
            assert_eq!(tcp(&dp, s, p, ACK), ip("10.99.0.12"), "a draining backend keeps its flows");
        }
    }
    for &(s, p) in new {
        assert_eq!(tcp(&dp, s, p, SYN), table_says(&drained, s, p));
        assert_ne!(table_says(&drained, s, p), ip("10.99.0.12"));
    }
}

/// A table that changes size is placed in a new range, where every flow hashes to another
/// slot: an entry's record from the old range says nothing, so every slot stays unstable until
/// the entries are written again (a packet a refresh interval later) or expire. With the rule
/// off, flows whose new slot has another owner move.
#[test]
fn root_a_resized_table_is_looked_up_until_its_flows_are_seen_again() {
    let (mut dp, a) = setup();
    let b = pool(&A.replacen(THREE, &format!("{THREE}\n    slots: 1009"), 1));
    let flows = moving(&a, &b, 0, 30);
    let others = staying(&a, &b, 0, 30);
    establish(&dp, &flows);
    establish(&dp, &others);
    settle(&mut dp);
    dp.apply(&b).expect("apply");
    settle(&mut dp);
    let web = dp.installed().iter().find(|s| s.name == "web").expect("web").clone();
    assert_eq!(web.slots, 1009);
    let unstable = (web.base..web.base + web.slots).filter(|&i| dp.is_unstable(i)).count();
    assert_eq!(unstable, 1009, "entries from before the move hold every slot of the new range");
    // A refresh interval later, one packet each rewrites every entry and its record.
    std::thread::sleep(Duration::from_millis(1200));
    for &(s, p) in flows.iter().chain(&others) {
        assert_eq!(tcp(&dp, s, p, ACK), table_says(&a, s, p));
    }
    settle(&mut dp);
    for &(s, p) in &flows {
        assert!(dp.is_unstable(slot_of(&dp, s, p)), "held by its own flow");
    }
    let held: std::collections::HashSet<u32> = flows.iter().map(|&(s, p)| slot_of(&dp, s, p)).collect();
    assert_eq!(dp.unstable_slots(), held.len(), "the rest became stable");
    for _ in 0..8 {
        for &(s, p) in &flows {
            assert_eq!(tcp(&dp, s, p, ACK), table_says(&a, s, p), "moved flows keep their backends");
        }
    }
}

/// On a stable slot, the sampled packets do what every packet did: a flow's entry is made from
/// its half-open record, confirmed, and kept fresh, so it is there when the slot changes.
#[test]
fn root_sampled_packets_make_and_keep_entries_on_stable_slots() {
    let (mut dp, a) = setup();
    dp.set_conntrack_timeouts(Duration::from_secs(3), Duration::from_secs(30)).expect("timeouts");
    let b = with_b4();
    settle(&mut dp);
    assert_eq!(dp.unstable_slots(), 0);
    let flows = moving(&a, &b, 0, 20);
    let new = ct(&dp, lb_stat::LB_CT_NEW);
    // Handshakes on stable slots, then a steady trickle for longer than the timeout.
    for &(s, p) in &flows {
        tcp(&dp, s, p, SYN);
    }
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        for &(s, p) in &flows {
            for _ in 0..16 {
                assert_eq!(tcp(&dp, s, p, ACK), table_says(&a, s, p));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(ct(&dp, lb_stat::LB_CT_NEW) - new, 20, "each flow's entry made by a sampled packet");
    dp.apply(&b).expect("apply");
    settle(&mut dp);
    for &(s, p) in &flows {
        assert_eq!(tcp(&dp, s, p, ACK), table_says(&a, s, p), "alive past the 3 s timeout: kept fresh");
    }
}

/// A handshake during a SYN flood, on a stable slot: the flood's SYNs must not make the flow's
/// next packets skip the whole path (a SYN stamps its flow's cell of the recent SYNs, which other
/// SYNs only stamp again), or the flow is never promoted, its half-open record is pushed out by
/// the flood, and the next change of its slot moves it. CI's end-to-end SYN flood broke held
/// connections that way when the recent SYNs kept one flow's hash per cell (another SYN took
/// the cell).
#[test]
fn root_a_handshake_during_a_syn_flood_keeps_its_backend_across_a_change() {
    let p = pool(A);
    // A small flow table: its half-open table (4,096 records) is what the flood pushes out.
    let mut dp = common::tracked_plane(&p, 1 << 14, true, mac);
    std::thread::sleep(Duration::from_millis(120));
    let a = p;
    let b = with_b4();
    settle(&mut dp);
    assert_eq!(dp.unstable_slots(), 0);
    let flows = moving(&a, &b, 0, 40);
    for &(s, p) in &flows {
        tcp(&dp, s, p, SYN);
    }
    // 20,000 spoofed SYNs, each from another source and port, before the flows' ACKs.
    let pending = ct(&dp, lb_stat::LB_CT_PENDING);
    for i in 0..20_000u32 {
        tcp(&dp, Ipv4Addr::from(0xcb00_7100 + (i % 200)), 1024 + (i / 200) as u16, SYN);
    }
    assert_eq!(ct(&dp, lb_stat::LB_CT_PENDING) - pending, 20_000);
    // The handshake's ACK and a request; then the flows go on past their young seconds.
    for &(s, p) in &flows {
        tcp(&dp, s, p, ACK);
        tcp(&dp, s, p, ACK);
    }
    std::thread::sleep(YOUNG);
    for &(s, p) in &flows {
        for _ in 0..4 {
            assert_eq!(tcp(&dp, s, p, ACK), table_says(&a, s, p));
        }
    }
    dp.apply(&b).expect("apply");
    settle(&mut dp);
    let kept = flows.iter().filter(|&&(s, p)| (0..8).all(|_| tcp(&dp, s, p, ACK) == table_says(&a, s, p))).count();
    assert_eq!(kept, flows.len(), "flows whose handshake came during the flood keep their backends");
}

/// Review finding: two services that swap their VIPs keep their names and ranges, so no slot is
/// written; each range must still be marked unstable before its route changes, since other
/// flows hash into it now. Flows tracked before the swap keep their backends.
#[test]
fn root_services_that_swap_vips_keep_their_tracked_flows() {
    let two = "services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    hash: flow\n    backends: [10.99.0.11, 10.99.0.12]\n  - name: alt\n    vip: 10.99.0.101\n    port: 80\n    hash: flow\n    backends: [10.99.0.13, 10.99.0.14]\n";
    let swapped = two.replace("10.99.0.100", "VIP_A").replace("10.99.0.101", "10.99.0.100").replace("VIP_A", "10.99.0.101");
    let a = pool(two);
    let mut dp = common::tracked_plane(&a, lb::dataplane::DEFAULT_CONNTRACK_SIZE, true, mac);
    std::thread::sleep(Duration::from_millis(200));
    let flows: Vec<(Ipv4Addr, u16)> = (0..60u16).map(|i| (Ipv4Addr::new(198, 18, 0, 1 + (i % 50) as u8), 30_000 + i)).collect();
    let to = |dp: &Balancer, s: Ipv4Addr, p: u16, flags: u8| {
        let (action, out) = dp.test_run(&ipv4_simple(s, v4("10.99.0.101"), L4::Tcp { sport: p, dport: 80, flags })).expect("run");
        assert_eq!(action, XDP_TX);
        out[5]
    };
    let before: Vec<u8> = flows.iter().map(|&(s, p)| { to(&dp, s, p, SYN); to(&dp, s, p, ACK) }).collect();
    assert!(before.iter().all(|&b| b == 13 || b == 14), "alt's backends");
    settle(&mut dp);
    assert_eq!(dp.unstable_slots(), 0);
    dp.apply(&pool(&swapped)).expect("apply");
    assert!(dp.unstable_slots() > 0, "both ranges marked");
    settle(&mut dp);
    for _ in 0..8 {
        let now: Vec<u8> = flows.iter().map(|&(s, p)| to(&dp, s, p, ACK)).collect();
        assert_eq!(now, before, "tracked flows to 10.99.0.101 keep alt's backends after the swap");
    }
    // A new connection to 10.99.0.101 now goes to web's backends.
    assert!([11, 12].contains(&to(&dp, Ipv4Addr::new(198, 18, 1, 1), 40_000, SYN)));
}

/// Review finding: a hash-mode change keeps the range and writes no slot (the owners are the
/// same), but moves every flow to another slot: the range is marked before the route changes.
#[test]
fn root_a_hash_change_keeps_tracked_flows() {
    let (mut dp, a) = setup();
    let flows = staying(&a, &a, 0, 80);
    establish(&dp, &flows);
    settle(&mut dp);
    assert_eq!(dp.unstable_slots(), 0);
    let b = pool(&A.replacen("    hash: flow\n", "    hash: client-ip\n", 1));
    dp.apply(&b).expect("apply");
    settle(&mut dp);
    for _ in 0..8 {
        for &(s, p) in &flows {
            assert_eq!(tcp(&dp, s, p, ACK), table_says(&a, s, p), "{s}:{p} keeps its backend");
        }
    }
}

/// Review finding: an RST on a stable slot (spoofed, say) goes by the table and leaves the
/// entry alone; before, it set the entry's reset, which the flow's later packets (by the
/// table) never cleared, and the entry died with it: a later change then moved the flow.
#[test]
fn root_an_rst_on_a_stable_slot_does_not_end_the_entry() {
    let (mut dp, a) = setup();
    let b = with_b4();
    let flows = moving(&a, &b, 0, 40);
    establish(&dp, &flows);
    settle(&mut dp);
    assert_eq!(dp.unstable_slots(), 0);
    for &(s, p) in &flows {
        assert_eq!(tcp(&dp, s, p, RST | ACK), table_says(&a, s, p));
    }
    // Past an RST's life (about 4 s), the flows still sending now and then.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1500));
        for &(s, p) in &flows {
            tcp(&dp, s, p, ACK);
        }
    }
    dp.apply(&b).expect("apply");
    settle(&mut dp);
    for &(s, p) in &flows {
        assert_eq!(tcp(&dp, s, p, ACK), table_says(&a, s, p), "{s}:{p} kept its entry through the RST");
    }
}

/// An RST on a stable slot goes where the flow's entry says, like the flow's other tracked
/// packets (a young flow's FIN takes the whole path just before it): here every slot is marked
/// stable over entries that name the slots' old owners (the sweep's rule off), and each RST
/// still reaches the backend its flow's entry names, not the table's; sent by the table, a
/// closing RST once missed the backend that had the FIN, which then stalled the next connection
/// on the same ports (docs/data-plane.md).
#[test]
fn root_an_rst_on_a_stable_slot_follows_the_flows_entry() {
    let (mut dp, a) = setup();
    let b = with_b4();
    let flows = moving(&a, &b, 0, 30);
    establish(&dp, &flows);
    settle(&mut dp);
    dp.apply(&b).expect("apply");
    dp.mark_all_stable_unchecked();
    assert_eq!(dp.unstable_slots(), 0);
    let (stable, hit) = (ct(&dp, lb_stat::LB_CT_STABLE), ct(&dp, lb_stat::LB_CT_HIT));
    for &(s, p) in &flows {
        assert_eq!(tcp(&dp, s, p, RST | ACK), table_says(&a, s, p), "{s}:{p}'s RST follows its entry");
        assert_eq!(tcp(&dp, s, p, RST), table_says(&a, s, p), "{s}:{p}'s bare RST follows its entry");
    }
    assert_eq!(ct(&dp, lb_stat::LB_CT_STABLE), stable, "no RST is sent the stable way");
    assert_eq!(ct(&dp, lb_stat::LB_CT_HIT) - hit, 2 * flows.len() as u64, "each RST's lookup counted a hit");
}

/// Review finding: upgrading a plane whose program is from before stable slots must not write
/// marks into the table words while that program, which reads them as backend ids, is still
/// attached: until the switch the new program counts every slot unstable, and the balancer
/// marks them only once it is told the switch happened. Whether the running program knows the
/// marks is read from its BTF; a program without lb.h's lb_slot_bits stands in for the old one
/// here (the floor program of the benchmarks).
#[test]
fn root_an_upgrade_marks_the_words_only_after_the_switch() {
    let (mut dp, a) = setup();
    // Words as a version before stable slots wrote them: plain ids.
    dp.mark_all_stable_unchecked();
    let fs = Bpffs::new("lb-stable-test");
    dp.pin_maps(&fs.0, None).expect("pin");
    let mut floor_obj = std::mem::MaybeUninit::uninit();
    let floor = {
        use libbpf_rs::skel::{OpenSkel, SkelBuilder};
        floor::FloorSkelBuilder::default().open(&mut floor_obj).expect("open").load().expect("load")
    };
    let old_prog_id = {
        use std::os::fd::AsFd;
        prog_id_of(floor.progs.floor_xdp.as_fd())
    };
    // The new plane knows its own program's marks: the real program reads them.
    let reuse = lb::dataplane::Reuse { dir: fs.0.clone(), same_layout: true, old_prog_id: dp.program_id().expect("id") };
    let (known, _) = Balancer::load_with(1 << 20, lb::dataplane::DEFAULT_CONNTRACK_SIZE, Some(&reuse)).expect("load on the pins");
    assert!(!known.unmarked(), "a program with lb_slot_bits reads the marks");
    drop(known);
    let reuse = lb::dataplane::Reuse { dir: fs.0.clone(), same_layout: true, old_prog_id };
    let (mut next, _) = Balancer::load_with(1 << 20, lb::dataplane::DEFAULT_CONNTRACK_SIZE, Some(&reuse)).expect("load on the pins");
    assert!(next.unmarked());
    next.adopt(&a).expect("adopt");
    let b = with_b4();
    next.apply(&b).expect("apply");
    let web = next.installed().iter().find(|s| s.name == "web").expect("web").clone();
    let words = |dp: &Balancer| (web.base..web.base + web.slots).map(|i| dp.slot_word(i)).collect::<Vec<u32>>();
    assert!(words(&next).iter().all(|w| w & 0x8000_0000 == 0), "no mark while the old program may read the words");
    assert_eq!(next.unstable_slots() as u32, web.slots + a.services[1].slots, "every slot unstable, in the mirror");
    // The fast path is off: a packet of a flow never seen is adopted through the whole path.
    let (adopted, stable) = (ct(&next, lb_stat::LB_CT_ADOPTED), ct(&next, lb_stat::LB_CT_STABLE));
    tcp(&next, Ipv4Addr::new(198, 18, 2, 1), 50_000, ACK);
    assert_eq!((ct(&next, lb_stat::LB_CT_ADOPTED) - adopted, ct(&next, lb_stat::LB_CT_STABLE) - stable), (1, 0));
    next.switched().expect("switched");
    assert!(!next.unmarked());
    assert!(words(&next).iter().all(|w| w & 0x8000_0000 != 0), "marked once the new program runs");
}


/// Found with stable slots' upgrade flag: a .bss map reused from a pin is not what the
/// skeleton maps (libbpf maps only the maps it creates), so settings written there alone never
/// reached the program. A restarted controller's timeouts and guard now do; the sweep reads
/// the same values. (Without the write-through, the pinned map kept 3600 s and the guard on.)
#[test]
fn root_settings_of_a_restarted_controller_reach_a_reused_bss() {
    let (dp, _) = setup();
    let fs = Bpffs::new("lb-stable-bss");
    dp.pin_maps(&fs.0, None).expect("pin");
    let reuse = lb::dataplane::Reuse { dir: fs.0.clone(), same_layout: true, old_prog_id: dp.program_id().expect("id") };
    let (mut next, fresh) = Balancer::load_with(1 << 20, lb::dataplane::DEFAULT_CONNTRACK_SIZE, Some(&reuse)).expect("load on the pins");
    assert!(!fresh.contains(&"bss"), "the .bss is reused");
    next.set_conntrack_timeouts(Duration::from_secs(60), Duration::from_secs(5)).expect("timeouts");
    next.set_conntrack_guard(false).expect("guard");
    let pinned = {
        use libbpf_rs::MapCore;
        let m = libbpf_rs::MapHandle::from_pinned_path(fs.0.join("bss")).expect("bss");
        let v = m.lookup(&0u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY).expect("lookup").expect("value");
        lb::dataplane::value_of::<lb::dataplane::types::lb_config>(&v)
    };
    assert_eq!((pinned.ct_tcp_timeout_ms, pinned.ct_udp_timeout_ms, pinned.ct_guard), (60_000, 5_000, 0), "what the program reads");
    assert_eq!(next.conntrack_timeouts_ms(), (60_000, 5_000), "what the sweep reads");
}
