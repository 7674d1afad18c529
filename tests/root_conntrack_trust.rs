//! Connection tracking against someone who crafts packets on purpose (issue 22), through the real
//! program and maps (BPF_PROG_TEST_RUN): a flow-table tag cannot be forged from the documented
//! hash; spoofed SYN+ACK (and UDP) pairs cannot evict confirmed flows; two CPUs writing the same
//! bucket never leave one flow's tag with another's backend; the clock runs without a
//! controller; an RST shortens an entry's life instead of ending it, and a new SYN on a
//! confirmed entry picks afresh. Needs root: `cargo test --test root_conntrack_trust`.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use common::packet::*;
use common::Bpffs;
use lb::balancer::Balancer;
use lb::config::{HashMode, Pool};
use lb::dataplane::types;
use lb::flowhash::{flow_hash, hash_bytes64, hash_input};
use lb::table;

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const RST: u8 = 0x04;

const A: &str = include_str!("pools/conntrack.yaml");
const B_LIST: &str = "[10.99.0.11, 10.99.0.12, 10.99.0.13, 10.99.0.14, 10.99.0.15]";
const A_LIST: &str = "[10.99.0.11, 10.99.0.12, 10.99.0.13]";

use common::{backend_mac as mac, pool};

fn setup_pool(text: &str, conntrack_size: u32, guard: bool) -> (Balancer, Pool) {
    let p = pool(text);
    (common::tracked_plane(&p, conntrack_size, guard, mac), p)
}

/// For each service of `pool`, a function (src, sport) -> the backend its table says.
struct Tables(Vec<(String, lb::config::Service, table::Table)>);

impl Tables {
    fn of(pool: &Pool) -> Tables {
        Tables(pool.services.iter().map(|s| (s.name.clone(), s.clone(), table::build_service(s))).collect())
    }

    fn says(&self, service: &str, src: IpAddr, sport: u16) -> IpAddr {
        let (_, s, t) = self.0.iter().find(|x| x.0 == service).expect("service");
        let proto = if s.protocol == lb::config::Protocol::Tcp { 6 } else { 17 };
        let h = flow_hash(HashMode::Flow, src, s.vip, sport, s.port, proto);
        s.backends[t.owner((h % s.slots) as usize).expect("owner")].address
    }
}

/// Flows (src, sport) of `service` whose backend differs between two pools' tables.
fn moving(a: &Tables, b: &Tables, service: &str, base: u32, n: usize) -> Vec<(Ipv4Addr, u16)> {
    let mut out = Vec::new();
    for i in 0..100_000u32 {
        let (src, sport) = (Ipv4Addr::from(base + (i % 250)), 10_000 + (i / 250) as u16);
        if a.says(service, src.into(), sport) != b.says(service, src.into(), sport) {
            out.push((src, sport));
            if out.len() == n {
                break;
            }
        }
    }
    assert_eq!(out.len(), n);
    out
}

fn backend_of(out: &[u8]) -> IpAddr {
    if out[4] == 6 {
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, out[5] as u16))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 99, 0, out[5]))
    }
}

fn tcp(dp: &Balancer, src: Ipv4Addr, sport: u16, flags: u8) -> IpAddr {
    let (action, out) = dp.test_run(&ipv4_simple(src, v4("10.99.0.100"), L4::Tcp { sport, dport: 80, flags })).expect("run");
    assert_eq!(action, XDP_TX);
    backend_of(&out)
}

fn udp(dp: &Balancer, src: Ipv4Addr, sport: u16) -> IpAddr {
    let (action, out) = dp.test_run(&ipv4_simple(src, v4("10.99.0.100"), L4::Udp { sport, dport: 53 })).expect("run");
    assert_eq!(action, XDP_TX);
    backend_of(&out)
}

fn ct(dp: &Balancer, stat: types::lb_stat) -> u64 {
    dp.stat(stat).expect("stat")
}

const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// K's inverse modulo 2^64 (Newton's iteration; K is odd).
fn k_inverse() -> u64 {
    let mut inv = K;
    for _ in 0..6 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(K.wrapping_mul(inv)));
    }
    assert_eq!(inv.wrapping_mul(K), 1);
    inv
}

/// The documented hash's lanes of a 40-byte IPv6 flow input.
fn lanes(bytes: &[u8]) -> [u64; 5] {
    let mut l = [0u64; 5];
    for (i, c) in bytes.chunks(8).enumerate() {
        l[i] = u64::from_le_bytes(c.try_into().expect("lane"));
    }
    l
}

/// The attack of issue 22, finding 2: a source address that gives a flow from it to
/// `dst:dport` (source port `sport`) the same 64-bit documented hash as the victim's flow. The
/// lanes are xor-then-multiply by an odd constant, so they can be undone from the end.
fn forge_source(victim: &[u8], dst: Ipv6Addr, sport: u16, dport: u16) -> Ipv6Addr {
    let kinv = k_inverse();
    let v = lanes(victim);
    let mut state = lb::flowhash::SEED ^ 40u64.wrapping_mul(K);
    for x in v {
        state = (state ^ x).wrapping_mul(K);
    }
    let mine = lanes(&hash_input(HashMode::Flow, "2001:db8:bad::".parse().expect("ip"), dst.into(), sport, dport, 6));
    let mut s = state; // after lane 4
    for i in (2..5).rev() {
        s = s.wrapping_mul(kinv) ^ mine[i];
    }
    // s is the state after lane 1: choose lane 0, solve lane 1.
    let s0 = (lb::flowhash::SEED ^ 40u64.wrapping_mul(K) ^ mine[0]).wrapping_mul(K);
    let l1 = s.wrapping_mul(kinv) ^ s0;
    let mut src = [0u8; 16];
    src[..8].copy_from_slice(&mine[0].to_le_bytes());
    src[8..].copy_from_slice(&l1.to_le_bytes());
    Ipv6Addr::from(src)
}

const SIX: &str = "services:
  - name: victim
    vip: fd00::100
    port: 80
    hash: flow
    backends: [fd00::11, fd00::12]
  - name: other
    vip: fd00::200
    port: 80
    hash: flow
    backends: [fd00::21]
";

fn tcp6(dp: &Balancer, src: Ipv6Addr, dst: &str, sport: u16, flags: u8) -> IpAddr {
    let (action, out) = dp.test_run(&ipv6(src, v6(dst), L4::Tcp { sport, dport: 80, flags }, None, &[])).expect("run");
    assert_eq!(action, XDP_TX);
    backend_of(&out)
}

#[test]
fn root_a_flow_tag_cannot_be_forged_from_the_documented_hash() {
    let (dp, _) = setup_pool(SIX, lb::dataplane::DEFAULT_CONNTRACK_SIZE, true);
    let client: Ipv6Addr = "2001:db8::7".parse().expect("ip");
    let victim_input = hash_input(HashMode::Flow, client.into(), ip("fd00::100"), 40000, 80, 6);
    // The attacker plants entries for the victim's next ports: a SYN and an ACK each, from a
    // source solved so that its flow to the other service has the victim's documented hash.
    let forged = forge_source(&victim_input, v6("fd00::200"), 1234, 80);
    assert_eq!(
        hash_bytes64(&hash_input(HashMode::Flow, forged.into(), ip("fd00::200"), 1234, 80, 6)),
        hash_bytes64(&victim_input),
        "the forged flow has the victim's 64-bit flow hash"
    );
    assert_eq!(tcp6(&dp, forged, "fd00::200", 1234, SYN), ip("fd00::21"));
    assert_eq!(tcp6(&dp, forged, "fd00::200", 1234, ACK), ip("fd00::21"));
    // The victim's connection: to its own service's backends, never to the other's.
    for flags in [SYN, ACK, ACK] {
        let got = tcp6(&dp, client, "fd00::100", 40000, flags);
        assert!(got == ip("fd00::11") || got == ip("fd00::12"), "the victim's packet went to {got}, a backend of another service");
    }
    // The tag is the keyed one, which user space computes from the data plane's key.
    let key = dp.flow_key().expect("key");
    assert_ne!(key, [0, 0], "a key was made");
    let tags: Vec<u64> = dp.flow_slots().expect("slots").iter().map(|s| s.1).collect();
    assert!(tags.contains(&lb::flowhash::flow_tag(key, client.into(), ip("fd00::100"), 40000, 80, 6)));
    assert!(tags.contains(&lb::flowhash::flow_tag(key, forged.into(), ip("fd00::200"), 1234, 80, 6)));
    // Another data plane, another key.
    let (other, _) = setup_pool(SIX, 4096, true);
    assert_ne!(other.flow_key().expect("key"), key);
}

/// Entries of the flow table, by tag: (backend id, gen bits).
fn entries(dp: &Balancer) -> Vec<(u64, u16, u16)> {
    dp.flow_table(false).expect("table").iter().map(|(_, f)| (f.tag, f.backend, f.gen_flags)).collect()
}

/// Four flows fill a one-bucket flow table and are confirmed (a packet a refresh interval after
/// the entry was made); then `pairs` spoofed pairs, each a first packet and a next packet of a
/// fresh flow (`first` then ACK: a SYN, or an ACK, which a node takes for a flow picked up in
/// mid-connection; or two UDP datagrams), all in the same bucket; then a change that moves all
/// four: how many kept their backend.
fn pair_flood(udp_flows: bool, pairs: u32, first: u8) -> (usize, Balancer) {
    // 4 slots: one bucket, which every flow's two choices name.
    let (mut dp, a) = setup_pool(A, 4, true);
    // Long timeouts: nothing here may expire, however long a loaded machine stalls.
    dp.set_conntrack_timeouts(Duration::from_secs(60), Duration::from_secs(60)).expect("timeouts");
    let b = pool(&A.replace(A_LIST, B_LIST));
    let (ta, tb) = (Tables::of(&a), Tables::of(&b));
    let service = if udp_flows { "dns" } else { "web" };
    let send = |dp: &Balancer, src: Ipv4Addr, sport: u16, flags: u8| if udp_flows { udp(dp, src, sport) } else { tcp(dp, src, sport, flags) };
    let flows = moving(&ta, &tb, service, 0xc000_0200, 4);
    for &(src, sport) in &flows {
        assert_eq!(send(&dp, src, sport, SYN), ta.says(service, src.into(), sport));
        send(&dp, src, sport, ACK);
    }
    assert_eq!(dp.flow_count().expect("count"), 4);
    // The refresh interval (64 ticks of 16.8 ms).
    std::thread::sleep(Duration::from_millis(1200));
    for &(src, sport) in &flows {
        send(&dp, src, sport, ACK);
    }
    let confirmed = types::lb_flow_gen_bits::LB_FLOW_CONFIRMED.0 as u16;
    assert!(entries(&dp).iter().all(|e| e.2 & confirmed != 0), "all four confirmed: {:?}", entries(&dp));
    for i in 0..pairs {
        let (src, sport) = (Ipv4Addr::from(0x0b00_0000 + i), 1024 + (i % 50_000) as u16);
        send(&dp, src, sport, first);
        send(&dp, src, sport, ACK);
    }
    dp.apply(&b).expect("apply");
    let kept = flows.iter().filter(|&&(src, sport)| send(&dp, src, sport, ACK) == ta.says(service, src.into(), sport)).count();
    (kept, dp)
}

#[test]
fn root_spoofed_syn_ack_pairs_do_not_evict_confirmed_flows() {
    let (kept, dp) = pair_flood(false, 2000, SYN);
    assert_eq!(kept, 4, "every confirmed flow kept its backend through 2,000 spoofed SYN+ACK pairs in its bucket and a change");
    assert_eq!(ct(&dp, types::lb_stat::LB_CT_EVICTED), 0);
    assert!(ct(&dp, types::lb_stat::LB_CT_NO_ROOM) >= 2000, "each pair's ACK found no room");
}

#[test]
fn root_spoofed_ack_pairs_do_not_evict_confirmed_flows() {
    // A node tracks a flow it picks up in mid-connection (issue 23): a spoofed ACK makes a
    // half-open record, as a SYN does, and a second one an unconfirmed entry, never in a
    // confirmed flow's slot.
    let (kept, dp) = pair_flood(false, 2000, ACK);
    assert_eq!(kept, 4, "every confirmed flow kept its backend through 2,000 spoofed ACK pairs in its bucket and a change");
    assert_eq!(ct(&dp, types::lb_stat::LB_CT_EVICTED), 0);
    assert!(ct(&dp, types::lb_stat::LB_CT_ADOPTED) >= 2000, "each pair's first ACK was taken for a flow in mid-connection");
    assert!(ct(&dp, types::lb_stat::LB_CT_NO_ROOM) >= 2000, "each pair's second ACK found no room");
}

#[test]
fn root_spoofed_udp_pairs_do_not_evict_confirmed_flows() {
    let (kept, dp) = pair_flood(true, 2000, SYN);
    assert_eq!(kept, 4, "every confirmed UDP flow kept its backend through 2,000 spoofed datagram pairs and a change");
    assert_eq!(ct(&dp, types::lb_stat::LB_CT_EVICTED), 0);
}

#[test]
fn root_an_unconfirmed_or_expired_entry_makes_room_for_a_promotion() {
    // The other side of the rule: a bucket of flows that never showed more than their handshake
    // is no obstacle to a real one.
    let (dp, _) = setup_pool(A, 4, true);
    for i in 0..4u32 {
        tcp(&dp, Ipv4Addr::from(0x0b00_0000 + i), 2000, SYN);
        tcp(&dp, Ipv4Addr::from(0x0b00_0000 + i), 2000, ACK);
    }
    let before = ct(&dp, types::lb_stat::LB_CT_EVICTED);
    tcp(&dp, v4("192.0.2.1"), 3000, SYN);
    tcp(&dp, v4("192.0.2.1"), 3000, ACK);
    assert_eq!(ct(&dp, types::lb_stat::LB_CT_EVICTED) - before, 1, "an unconfirmed entry gave way");
    assert_eq!(ct(&dp, types::lb_stat::LB_CT_NO_ROOM), 0);
}

/// Runs an XDP program by fd `repeat` times on `frame` in one BPF_PROG_TEST_RUN, on the calling
/// thread's CPU, with no syscall between the runs: the last run's action.
fn run_fd(fd: i32, frame: &[u8], repeat: u32) -> u32 {
    use libbpf_rs::libbpf_sys as sys;
    let mut opts = sys::bpf_test_run_opts {
        sz: std::mem::size_of::<sys::bpf_test_run_opts>() as _,
        data_in: frame.as_ptr().cast(),
        data_size_in: frame.len() as u32,
        repeat: repeat as _,
        ..Default::default()
    };
    // SAFETY: the input buffer outlives the call and its size is as given (no output buffer);
    // fd is a loaded program that the caller keeps open.
    let rc = unsafe { sys::bpf_prog_test_run_opts(fd, &mut opts) };
    assert_eq!(rc, 0, "BPF_PROG_TEST_RUN");
    opts.retval
}

/// Two CPUs this process may run on (its affinity set, as a CI runner or taskset leaves it).
fn two_cpus() -> Option<[usize; 2]> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok()?;
    let mut cpus = (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false));
    Some([cpus.next()?, cpus.next()?])
}

/// Issue 22, finding 4: two CPUs that write one slot at once never leave one flow's tag with
/// the other's backend. One bucket, the guard off, and three of its four slots held busy (as by
/// a CPU that never finishes), so one slot is left. Each CPU sends one flow's SYN in a tight
/// loop inside the kernel (BPF_PROG_TEST_RUN's repeat): its flow is in the slot, and the SYN
/// follows it, until the other CPU's flow has taken the slot; then it takes it back. So the two
/// write the same slot over and over, as fast as the program runs, and follow what they find.
/// The first CPU's flow belongs to .11 and the second's to .12: a packet counted at the other
/// CPU's backend followed a torn entry. With the slot written by plain stores (no claim), this
/// test fails within seconds on this 2-CPU VM (see the note).
#[test]
fn root_two_cpus_writing_one_slot_never_tear_an_entry() {
    use std::os::fd::AsRawFd;
    let Some(cpus) = two_cpus() else {
        eprintln!("skipped: needs two CPUs");
        return;
    };
    let (mut dp, a) = setup_pool(A, 4, false);
    // BPF_PROG_TEST_RUN's repeats run on one buffer, which the first run rewrites: with every
    // backend at lb's own MAC the rewritten frame is still addressed to lb, not another host.
    for b in 11..=13u8 {
        dp.set_mac(IpAddr::V4(Ipv4Addr::new(10, 99, 0, b)), Some(IFMAC)).expect("mac");
    }
    let busy = types::lb_flow_table_layout::LB_FLOW_BUSY.0 as u64;
    for slot in 1..4 {
        #[allow(clippy::needless_update)]
        let f = types::lb_flow { tag: busy, backend: 0, gen_flags: 0, seen: 0, ..Default::default() };
        dp.write_flow_slot(slot, &f).expect("write");
    }
    let t = Tables::of(&a);
    let flow_to = |backend: &str, base: u32| -> (Ipv4Addr, u16) {
        (0..10_000u32)
            .map(|i| (Ipv4Addr::from(base + i), 7000u16))
            .find(|&(src, sport)| t.says("web", src.into(), sport) == ip(backend))
            .expect("a flow of that backend")
    };
    let flows = [flow_to("10.99.0.11", 0x0a01_0000), flow_to("10.99.0.12", 0x0a02_0000)];
    let fd = dp.program_fd().as_raw_fd();
    let rounds: u32 = std::env::var("LB_RACE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    const REPEAT: u32 = 1_000;
    let start = std::sync::Arc::new(std::sync::Barrier::new(2));
    let workers: Vec<_> = flows
        .iter()
        .zip(cpus)
        .map(|(&(src, sport), cpu)| {
            let frame = ipv4_simple(src, v4("10.99.0.100"), L4::Tcp { sport, dport: 80, flags: SYN });
            let start = start.clone();
            std::thread::spawn(move || {
                let mut set = nix::sched::CpuSet::new();
                set.set(cpu).expect("cpu");
                nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("affinity");
                start.wait();
                for _ in 0..rounds {
                    assert_eq!(run_fd(fd, &frame, REPEAT), XDP_TX);
                }
                rounds as u64 * REPEAT as u64
            })
        })
        .collect();
    let sent: Vec<u64> = workers.into_iter().map(|w| w.join().expect("worker")).collect();
    let snap = dp.snapshot().expect("snapshot");
    let web = snap.services.iter().find(|s| s.name == "web").expect("web");
    let got = |addr: &str| web.backends.iter().find(|b| b.address == ip(addr)).map_or(0, |b| b.traffic.packets);
    let (evicted, hits) = (ct(&dp, types::lb_stat::LB_CT_EVICTED), ct(&dp, types::lb_stat::LB_CT_HIT));
    println!("{} packets per CPU: the slot changed flows {evicted} times; {hits} packets followed it", sent[0]);
    assert_eq!(
        (got("10.99.0.11"), got("10.99.0.12"), got("10.99.0.13")),
        (sent[0], sent[1], 0),
        "packets per backend: a flow's packet followed an entry holding its tag and another flow's backend"
    );
    assert!(evicted >= 10_000, "the two CPUs took the slot from each other only {evicted} times: too few to test anything");
    // A torn entry shows only in a packet that follows one: many must have (without following,
    // none would). How many depends on how the two CPUs' runs interleave, which the scheduler
    // decides: 26% to 85% in the runs that set this check, 5.7% to 30% in seven runs on
    // 2026-12-02 (9.5% in a clean-clone CI run, which the old bar of 10% failed). A
    // hundred thousand chances to meet a torn entry is far more than the claim-less writes
    // needed to tear one within seconds.
    assert!(hits >= 100_000, "only {hits} packets followed the slot: too few to see a torn entry");
}

#[test]
fn root_a_slot_another_cpu_is_writing_is_neither_read_nor_taken() {
    // What a CPU sees of a slot another CPU has claimed and is writing, set up directly: all
    // four slots of a one-bucket table claimed (tag LB_FLOW_BUSY) with another flow's backend
    // in their word. A new flow's first packet (guard off: it would take a slot) must not
    // write any of them, and no packet may follow one.
    let (dp, a) = setup_pool(A, 4, false);
    let t = Tables::of(&a);
    let busy = types::lb_flow_table_layout::LB_FLOW_BUSY.0 as u64;
    let web = dp.installed().iter().find(|s| s.name == "web").expect("web");
    let (src, sport) = (1..1000u32)
        .map(|i| (Ipv4Addr::from(0x0a03_0000 + i), 7000u16))
        .find(|&(src, sport)| t.says("web", src.into(), sport) == ip("10.99.0.11"))
        .expect("a flow of .11");
    let other = web.backends.iter().find(|b| b.address == ip("10.99.0.13")).expect(".13").id;
    for slot in 0..4 {
        // The rest: the field the upgrade test's build adds (cargo feature layout-test).
        #[allow(clippy::needless_update)]
        let f = types::lb_flow { tag: busy, backend: other as u16, gen_flags: 0, seen: 0, ..Default::default() };
        dp.write_flow_slot(slot, &f).expect("write");
    }
    assert_eq!(tcp(&dp, src, sport, SYN), ip("10.99.0.11"));
    assert_eq!(tcp(&dp, src, sport, ACK), ip("10.99.0.11"));
    let now: Vec<u64> = dp.flow_table(false).expect("table").iter().map(|e| e.1.tag).collect();
    assert!(now.is_empty(), "the program took a slot another CPU was writing: {now:x?}");
}

#[test]
fn root_the_clock_runs_without_a_controller() {
    // A data plane no controller ticks (as between a controller's exit and its successor's
    // adoption): its UDP flows keep sending, and keep their entries, past the UDP timeout.
    let (mut dp, a) = setup_pool(A, lb::dataplane::DEFAULT_CONNTRACK_SIZE, true);
    dp.set_conntrack_timeouts(Duration::from_secs(3600), Duration::from_millis(300)).expect("timeouts");
    let b = pool(&A.replace(A_LIST, B_LIST));
    let (ta, tb) = (Tables::of(&a), Tables::of(&b));
    let flows = moving(&ta, &tb, "dns", 0xc000_0200, 20);
    for &(src, sport) in &flows {
        udp(&dp, src, sport);
        udp(&dp, src, sport);
    }
    dp.apply(&b).expect("apply");
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_millis(1200) {
        for &(src, sport) in &flows {
            assert_eq!(udp(&dp, src, sport), ta.says("dns", src.into(), sport), "{src}:{sport} kept its backend while no controller ran");
        }
        std::thread::sleep(Duration::from_millis(60));
    }
    // A controller adopts the plane and writes its clock.
    dp.tick().expect("tick");
    for &(src, sport) in &flows {
        assert_eq!(udp(&dp, src, sport), ta.says("dns", src.into(), sport), "{src}:{sport} kept its backend after the adoption");
    }
    // And flows that stop sending still age out with no controller.
    std::thread::sleep(Duration::from_millis(450));
    for &(src, sport) in &flows {
        assert_eq!(udp(&dp, src, sport), tb.says("dns", src.into(), sport), "idle past the timeout: re-hashed");
    }
}

#[test]
fn root_a_reset_shortens_an_entry_and_a_later_packet_restores_it() {
    let (mut dp, a) = setup_pool(A, lb::dataplane::DEFAULT_CONNTRACK_SIZE, true);
    let b = pool(&A.replace(A_LIST, B_LIST));
    let (ta, tb) = (Tables::of(&a), Tables::of(&b));
    let flows = moving(&ta, &tb, "web", 0xc000_0200, 40);
    let (spoofed, real) = flows.split_at(20);
    for &(src, sport) in &flows {
        tcp(&dp, src, sport, SYN);
        tcp(&dp, src, sport, ACK);
    }
    // A blind RST spray over all of them; then the table changes.
    for &(src, sport) in &flows {
        assert_eq!(tcp(&dp, src, sport, RST), ta.says("web", src.into(), sport), "the RST goes where the flow was");
    }
    dp.apply(&b).expect("apply");
    // The spoofed half: the connections go on, and their next packets keep (and restore) them.
    for &(src, sport) in spoofed {
        assert_eq!(tcp(&dp, src, sport, ACK), ta.says("web", src.into(), sport), "a spoofed RST did not untrack {src}:{sport}");
    }
    // The real half: the clients are gone; the entries run out within a few seconds.
    std::thread::sleep(Duration::from_millis(4400));
    for &(src, sport) in spoofed {
        assert_eq!(tcp(&dp, src, sport, ACK), ta.says("web", src.into(), sport), "a restored entry has its whole timeout");
    }
    for &(src, sport) in real {
        assert_eq!(tcp(&dp, src, sport, ACK), tb.says("web", src.into(), sport), "a reset entry ran out: the table decides");
    }
}

#[test]
fn root_a_spoofed_syn_does_not_move_a_live_connection() {
    // Long timeouts: nothing expires here, however long a loaded machine stalls.
    let (mut dp, a) = setup_pool(A, lb::dataplane::DEFAULT_CONNTRACK_SIZE, true);
    dp.set_conntrack_timeouts(Duration::from_secs(60), Duration::from_secs(60)).expect("timeouts");
    let drained = pool(&A.replacen(A_LIST, "[10.99.0.11, {address: 10.99.0.12, state: drain}, 10.99.0.13]", 1));
    let (ta, td) = (Tables::of(&a), Tables::of(&drained));
    let flows = moving(&ta, &td, "web", 0xc000_0200, 20);
    for &(src, sport) in &flows {
        assert_eq!(tcp(&dp, src, sport, SYN), ip("10.99.0.12"));
        tcp(&dp, src, sport, ACK);
        // A SYN sent again during the handshake follows the entry.
        assert_eq!(tcp(&dp, src, sport, SYN), ip("10.99.0.12"));
    }
    std::thread::sleep(Duration::from_millis(1200));
    for &(src, sport) in &flows {
        tcp(&dp, src, sport, ACK); // confirms
    }
    dp.apply(&drained).expect("apply");
    for &(src, sport) in &flows {
        // A blind SYN on the live connection's ports: the backend answers it with a challenge
        // ACK; the connection stays where it is.
        assert_eq!(tcp(&dp, src, sport, SYN), ip("10.99.0.12"), "a spoofed SYN moved the live connection {src}:{sport}");
        assert_eq!(tcp(&dp, src, sport, ACK), ip("10.99.0.12"), "the draining backend keeps the connection");
    }
    // An RST (the client's, or spoofed) leaves the entry a few seconds; once they are over,
    // a SYN is a new connection and leaves the draining backend.
    let (reset, _) = flows.split_at(10);
    for &(src, sport) in reset {
        tcp(&dp, src, sport, RST);
        assert_eq!(tcp(&dp, src, sport, SYN), ip("10.99.0.12"), "within the reset's life a SYN still follows");
    }
    std::thread::sleep(Duration::from_millis(4400));
    for &(src, sport) in reset {
        let fresh = tcp(&dp, src, sport, SYN);
        assert_eq!(fresh, td.says("web", src.into(), sport), "a new connection on {src}:{sport} after the RST leaves the draining backend");
        assert_eq!(tcp(&dp, src, sport, ACK), fresh, "and is tracked where it went");
    }
}

#[test]
fn root_a_syn_on_an_idle_entry_picks_afresh_so_drain_finishes() {
    // An 8 s timeout: a SYN on an entry silent for half of it (4 s) is a new connection. A
    // stall only makes the entry more idle (or expired): either way the SYN picks afresh.
    let (mut dp, a) = setup_pool(A, lb::dataplane::DEFAULT_CONNTRACK_SIZE, true);
    dp.set_conntrack_timeouts(Duration::from_secs(8), Duration::from_secs(8)).expect("timeouts");
    let drained = pool(&A.replacen(A_LIST, "[10.99.0.11, {address: 10.99.0.12, state: drain}, 10.99.0.13]", 1));
    let (ta, td) = (Tables::of(&a), Tables::of(&drained));
    let flows = moving(&ta, &td, "web", 0xc000_0200, 20);
    for &(src, sport) in &flows {
        assert_eq!(tcp(&dp, src, sport, SYN), ip("10.99.0.12"));
        tcp(&dp, src, sport, ACK);
    }
    dp.apply(&drained).expect("apply");
    std::thread::sleep(Duration::from_millis(4300));
    for &(src, sport) in &flows {
        let fresh = tcp(&dp, src, sport, SYN);
        assert_eq!(fresh, td.says("web", src.into(), sport), "a new connection on {src}:{sport} leaves the draining backend");
        assert_eq!(tcp(&dp, src, sport, ACK), fresh, "and is tracked where it went");
    }
}

#[test]
fn root_a_pair_flood_evicts_its_own_young_entries_before_a_quiet_real_flow() {
    // One bucket: a real connection that showed its handshake and a request within a second,
    // then went quiet (unconfirmed), and three more; then a pair flood. The flood's own
    // entries, seen last, give way to its next pairs; the quiet flows are never taken. Also
    // with an RST and another ACK after each pair, back to back: an RST must not let the next
    // packet confirm an entry before its time (confirmed, the flood's entries would stay and
    // take the quiet flows' slots).
    for shape in [&[SYN, ACK][..], &[SYN, ACK, RST, ACK][..], &[ACK, ACK][..], &[ACK, ACK, RST, ACK][..]] {
        let (mut dp, a) = setup_pool(A, 4, true);
        dp.set_conntrack_timeouts(Duration::from_secs(60), Duration::from_secs(60)).expect("timeouts");
        let b = pool(&A.replace(A_LIST, B_LIST));
        let (ta, tb) = (Tables::of(&a), Tables::of(&b));
        let quiet = moving(&ta, &tb, "web", 0xc000_0200, 3);
        for &(src, sport) in &quiet {
            tcp(&dp, src, sport, SYN);
            tcp(&dp, src, sport, ACK);
        }
        std::thread::sleep(Duration::from_millis(100));
        for i in 0..2000u32 {
            let (src, sport) = (Ipv4Addr::from(0x0b00_0000 + i), 1024 + (i % 50_000) as u16);
            for &flags in shape {
                tcp(&dp, src, sport, flags);
            }
        }
        dp.apply(&b).expect("apply");
        for &(src, sport) in &quiet {
            assert_eq!(tcp(&dp, src, sport, ACK), ta.says("web", src.into(), sport), "flood {shape:?}: the quiet flow {src}:{sport} lost its entry");
        }
    }
}

/// A tracked data plane of pool A pinned on its own bpffs, with `n` established flows that pool
/// B's table would move: what the adoption and upgrade tests start from.
struct Pinned {
    dp: Balancer,
    fs: Bpffs,
    a: Pool,
    b: Pool,
    ta: Tables,
    flows: Vec<(Ipv4Addr, u16)>,
}

fn pinned_with_flows(n: usize) -> Pinned {
    let (dp, a) = setup_pool(A, lb::dataplane::DEFAULT_CONNTRACK_SIZE, true);
    let fs = Bpffs::new("lb-flow-key-test");
    dp.pin_maps(&fs.0, None).expect("pin");
    let b = pool(&A.replace(A_LIST, B_LIST));
    let (ta, tb) = (Tables::of(&a), Tables::of(&b));
    let flows = moving(&ta, &tb, "web", 0xc000_0200, n);
    for &(src, sport) in &flows {
        tcp(&dp, src, sport, SYN);
        tcp(&dp, src, sport, ACK);
    }
    Pinned { dp, fs, a, b, ta, flows }
}

impl Pinned {
    /// A second controller's plane, loaded on the pins as adoption does: it and the maps it made
    /// fresh.
    fn load_next(&self) -> (Balancer, Vec<&'static str>) {
        let reuse = lb::dataplane::Reuse { dir: self.fs.0.clone(), same_layout: true, old_prog_id: self.dp.program_id().expect("id") };
        Balancer::load_with(1 << 20, lb::dataplane::DEFAULT_CONNTRACK_SIZE, Some(&reuse)).expect("load on the pins")
    }

    /// `next` adopts pool A, then pool B is applied: every flow must still go where A sent it.
    fn adopt_and_move(&self, next: &mut Balancer, what: &str) {
        next.adopt(&self.a).expect("adopt");
        for a in 11..=16u8 {
            let addr = IpAddr::V4(Ipv4Addr::new(10, 99, 0, a));
            next.set_mac(addr, Some(mac(addr))).expect("mac");
        }
        next.apply(&self.b).expect("apply");
        for &(src, sport) in &self.flows {
            assert_eq!(tcp(next, src, sport, ACK), self.ta.says("web", src.into(), sport), "{src}:{sport} {what}");
        }
    }
}

#[test]
fn root_the_flow_key_survives_adoption_and_so_do_the_entries() {
    let p = pinned_with_flows(10);
    let (mut next, fresh) = p.load_next();
    assert!(fresh.is_empty(), "every map reused: {fresh:?}");
    assert_eq!(next.flow_key().expect("key"), p.dp.flow_key().expect("key"), "the key was read back, not remade");
    p.adopt_and_move(&mut next, "is tracked by the new program");
}

/// Issue 22, review E: a pinned data plane whose flow_key pin is gone (a version before keyed
/// tags, or a pin removed by hand) is not reused for its flow tables: their tags were made
/// under a key no later packet hashes with, so reused they would only hold slots. The new plane
/// starts them empty, with a new key, and carries nothing over from them.
#[test]
fn root_flow_tables_made_under_a_lost_key_are_not_reused() {
    let p = pinned_with_flows(10);
    assert_eq!(p.dp.flow_table(false).expect("flows").len(), p.flows.len());
    std::fs::remove_file(p.fs.0.join("flow_key")).expect("remove the key's pin");
    let (next, fresh) = p.load_next();
    for name in ["flow_key", "flows", "flow_pending"] {
        assert!(fresh.contains(&name), "{name} is made fresh: {fresh:?}");
    }
    let (old_key, old_prog) = (p.dp.flow_key().expect("key"), p.dp.program_id().expect("id"));
    assert_ne!(next.flow_key().expect("key"), old_key);
    assert!(next.flow_table(false).expect("flows").is_empty(), "no entry under the lost key");
    let carried = next.carry_flows(&p.fs.0.join("flows"), old_prog, || Ok(())).expect("carry");
    assert_eq!(carried, 0, "entries under another key are not carried");
    assert!(next.flow_table(false).expect("flows").is_empty());

    // A key pinned beside the table, but not this plane's own: nothing is carried either.
    let fs2 = Bpffs::new("lb-flow-key-test");
    p.dp.pin_maps(&fs2.0, None).expect("pin");
    let (other, _) = Balancer::load_with(1 << 20, lb::dataplane::DEFAULT_CONNTRACK_SIZE, None).expect("load");
    assert_ne!(other.flow_key().expect("key"), old_key);
    let carried = other.carry_flows(&fs2.0.join("flows"), old_prog, || Ok(())).expect("carry");
    assert_eq!(carried, 0, "entries under another plane's key are not carried");
    assert!(other.flow_table(false).expect("flows").is_empty());
}

/// The carry of an upgrade copies a pinned flow table's entries into the new plane's, slot by
/// slot with the program's own claim (it runs once more after the new program is live), and
/// the carried flows keep their backends when the table changes.
#[test]
fn root_carried_flows_keep_their_backends() {
    let p = pinned_with_flows(40);
    // The old flow table stays pinned under another name; the new plane makes its own, as an
    // upgrade to another layout does, and keeps the key.
    // (A bpffs pin can be neither renamed nor named with a dot.)
    let mut old = libbpf_rs::MapHandle::from_pinned_path(p.fs.0.join("flows")).expect("pinned flows");
    old.pin(p.fs.0.join("flows_old")).expect("pin again");
    std::fs::remove_file(p.fs.0.join("flows")).expect("unpin");
    let (mut next, fresh) = p.load_next();
    assert_eq!(fresh, vec!["flows"]);
    assert!(next.flow_table(false).expect("flows").is_empty());
    let mut switched = false;
    let carried = next
        .carry_flows(&p.fs.0.join("flows_old"), p.dp.program_id().expect("id"), || {
            switched = true;
            Ok(())
        })
        .expect("carry");
    assert!(switched);
    assert_eq!(carried, p.flows.len() as u64, "each flow carried once (the second pass finds them there)");
    p.adopt_and_move(&mut next, "kept its backend");
}
