//! Fuzzed packets through the live program (BPF_PROG_TEST_RUN), against a pool that uses every
//! feature: L2, IPIP and GUE forwarding, both families and mixed, flow and client-ip hashing,
//! tracking on and off, fragment routes, a service with no serving backend, a backend without a
//! MAC, an MTU that encapsulation can exceed. A seeded generator makes valid packets of every
//! kind the program handles (TCP, UDP, VLAN, IPv4 options, fragments, IPv6 extension headers,
//! ICMP and ICMPv6 errors quoting a service's flow, oversized packets, ARP, other protocols)
//! and mutates them (truncation, random bytes, bad lengths). Every packet is checked:
//! - the action is XDP_PASS, XDP_DROP or XDP_TX, nothing else;
//! - XDP_PASS: the output is the input, byte for byte;
//! - XDP_TX: the input was addressed to a VIP, and the output is the input with new MACs (L2),
//!   or the input's IP packet unchanged behind new outer headers (IPIP, GUE), or lb's own
//!   "too big" answer to the input's sender;
//! - the packet was counted exactly once: by `passed`, by one drop reason, by `too_big`, or
//!   by a backend's forwarded counter (checked in sums every few thousand packets).
//!
//! Needs root. The suite runs a short fixed-seed run (FUZZ_PACKETS_SECONDS, default 40 s);
//! `scripts/fuzz-packets.sh SECONDS [SEED]` runs longer.

mod common;

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use common::packet::*;
use common::rng::Rng;
use lb::config::parse_str;
use lb::balancer::Balancer;
use lb::dataplane::types;

const POOL: &str = include_str!("pools/fuzz-packets.yaml");

const VIPS: [&str; 3] = ["10.99.0.100", "fd99::100", "10.99.0.101"];
const PORTS: [u16; 9] = [80, 81, 8080, 53, 5353, 82, 84, 90, 443];

/// The MAC a backend (or next hop) is given; 10.99.0.15's stays unknown.
fn mac_of(a: IpAddr) -> Option<[u8; 6]> {
    let last = match a {
        IpAddr::V4(v) => v.octets()[3],
        IpAddr::V6(v) => v.octets()[15],
    };
    (a != IpAddr::from([10, 99, 0, 15])).then_some([0x02, 0xbb, 0, 0, (a.is_ipv6() as u8), last])
}


fn client4(r: &mut Rng) -> Ipv4Addr {
    Ipv4Addr::from(0xc000_0200 + r.below(256) as u32)
}

fn client6(r: &mut Rng) -> Ipv6Addr {
    Ipv6Addr::from(0x2001_0db8_0000_0000_0000_0000_0000_0000u128 + r.below(1 << 20) as u128)
}

fn l4(r: &mut Rng, proto: u8, dport: u16) -> L4 {
    let sport = 1024 + r.below(60000) as u16;
    match proto {
        6 => {
            let any = r.below(256) as u8;
            L4::Tcp { sport, dport, flags: *r.pick(&[0x02, 0x10, 0x18, 0x04, 0x14, 0x11, 0x12, any]) }
        }
        17 => L4::Udp { sport, dport },
        _ => L4::IcmpEcho,
    }
}

fn payload(r: &mut Rng) -> Vec<u8> {
    // Mostly small; some long enough that encapsulation exceeds the 1500-byte MTU.
    let n = if r.chance(15) { 1400 + r.below(200) } else { r.below(64) };
    (0..n).map(|i| i as u8).collect()
}

/// An ICMP (v4) destination-unreachable from a router to the VIP, quoting a packet the VIP sent.
fn icmp4_error(r: &mut Rng, vip: Ipv4Addr) -> Vec<u8> {
    let proto = *r.pick(&[6u8, 17]);
    let quoted_sport = *r.pick(&PORTS);
    let mut q = vec![0x45, 0, 0x05, 0xdc, 0, 1, 0x40, 0, 64, proto, 0, 0];
    q.extend_from_slice(&vip.octets());
    q.extend_from_slice(&client4(r).octets());
    q.extend_from_slice(&quoted_sport.to_be_bytes());
    q.extend_from_slice(&(1024 + r.below(60000) as u16).to_be_bytes());
    q.extend_from_slice(&[0, 0, 0, 1]);
    let mut icmp = vec![3, *r.pick(&[0u8, 1, 3, 4]), 0, 0, 0, 0, 0x05, 0x00];
    icmp.extend_from_slice(&q);
    let c = csum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0, 0, 64, 1, 0, 0, 203, 0, 113, 1];
    ip.extend_from_slice(&vip.octets());
    let len = (ip.len() + icmp.len()) as u16;
    ip[2..4].copy_from_slice(&len.to_be_bytes());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x99, 0x08, 0x00];
    f.extend_from_slice(&ip);
    f.extend_from_slice(&icmp);
    f
}

/// An ICMPv6 packet-too-big or destination-unreachable to the VIP about a packet it sent.
fn icmp6_error(r: &mut Rng, vip: Ipv6Addr) -> Vec<u8> {
    let proto = *r.pick(&[6u8, 17]);
    let mut q = vec![0x60, 0, 0, 0, 0x05, 0xc8, proto, 64];
    q.extend_from_slice(&vip.octets());
    q.extend_from_slice(&client6(r).octets());
    q.extend_from_slice(&r.pick(&PORTS).to_be_bytes());
    q.extend_from_slice(&(1024 + r.below(60000) as u16).to_be_bytes());
    q.extend_from_slice(&[0, 0, 0, 1]);
    let mut icmp = vec![*r.pick(&[1u8, 2]), 0, 0, 0, 0, 0, 0x05, 0x00];
    icmp.extend_from_slice(&q);
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x99, 0x86, 0xdd, 0x60, 0, 0, 0];
    f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    f.extend_from_slice(&[58, 64]);
    f.extend_from_slice(&Ipv6Addr::from(0x2001_0db8_ffff_0000_0000_0000_0000_0001u128).octets());
    f.extend_from_slice(&vip.octets());
    f.extend_from_slice(&icmp);
    f
}

/// A valid packet of one of the kinds the program handles.
fn valid(r: &mut Rng) -> Vec<u8> {
    let vip = *r.pick(&VIPS);
    match r.below(12) {
        0..=4 => {
            let dst = match vip.parse::<IpAddr>() {
                Ok(IpAddr::V4(a)) if !r.chance(10) => a,
                _ => Ipv4Addr::from(0x0a63_0000 + r.below(1 << 16) as u32),
            };
            let proto = *r.pick(&[6u8, 6, 17, 1, 47]);
            let mut opts = V4Opts { dont_fragment: r.chance(50), ..Default::default() };
            if r.chance(15) {
                opts.options = vec![1; r.below(40) as usize];
            }
            if r.chance(10) {
                opts.more_fragments = r.chance(50);
                opts.frag_offset = if r.chance(50) { 0 } else { 1 + r.below(100) as u16 };
                opts.more_fragments |= opts.frag_offset == 0;
            }
            let vlan = r.chance(15).then(|| r.below(4096) as u16);
            let dport = *r.pick(&PORTS);
            let p = payload(r);
            if proto == 47 {
                let mut f = ipv4(vlan, client4(r), dst, L4::Udp { sport: 1, dport: 2 }, &opts, &p);
                let l2 = if vlan.is_some() { 18 } else { 14 };
                f[l2 + 9] = 47;
                return f;
            }
            ipv4(vlan, client4(r), dst, l4(r, proto, dport), &opts, &p)
        }
        5..=7 => {
            let dst: Ipv6Addr = if r.chance(85) { "fd99::100".parse().unwrap_or(Ipv6Addr::LOCALHOST) } else { client6(r) };
            let proto = *r.pick(&[6u8, 6, 17, 58]);
            let next = if r.chance(10) { Some(*r.pick(&[0u8, 43, 44, 60])) } else { None };
            let p = payload(r);
            let dport = *r.pick(&PORTS);
            let l = l4(r, proto, dport);
            ipv6(client6(r), dst, l, next, &p)
        }
        8 => icmp4_error(r, "10.99.0.100".parse().unwrap_or(Ipv4Addr::LOCALHOST)),
        9 => icmp6_error(r, "fd99::100".parse().unwrap_or(Ipv6Addr::LOCALHOST)),
        10 => arp_request(client4(r), "10.99.0.100".parse().unwrap_or(Ipv4Addr::LOCALHOST)),
        _ => {
            let mut f = ipv4_simple(client4(r), "10.99.0.100".parse().unwrap_or(Ipv4Addr::LOCALHOST), l4(r, 6, 80));
            f[12..14].copy_from_slice(&(r.below(65536) as u16).to_be_bytes());
            f
        }
    }
}

/// Mutates a valid packet: truncation, random bytes, a bad length field, or nothing.
fn mutate(r: &mut Rng, mut f: Vec<u8>) -> Vec<u8> {
    match r.below(10) {
        0..=2 => f,
        3..=4 => {
            let n = r.below(f.len() as u64 + 1) as usize;
            f.truncate(n);
            f
        }
        5..=7 => {
            for _ in 0..1 + r.below(4) {
                let i = r.below(f.len().min(100) as u64) as usize;
                if i < f.len() {
                    f[i] = r.next() as u8;
                }
            }
            f
        }
        8 => {
            // A length field: IPv4 total length or IHL, IPv6 payload length, UDP length.
            let at = *r.pick(&[14usize + 2, 14, 18, 14 + 4, 14 + 20 + 4, 14 + 40 + 4]);
            if at + 1 < f.len() {
                f[at] = r.next() as u8;
                f[at + 1] = r.next() as u8;
            }
            f
        }
        _ => {
            // Padding or garbage after the packet.
            let n = 1 + r.below(40);
            f.extend((0..n).map(|_| r.next() as u8));
            f
        }
    }
}

/// What the program must have done with a packet, checked independently of its own parser.
struct Oracle {
    vips: HashSet<IpAddr>,
    backend_macs: HashSet<[u8; 6]>,
}

fn ip_at(f: &[u8], l2: usize) -> Option<(IpAddr, IpAddr, u8, usize)> {
    match f.get(l2)? >> 4 {
        4 if f.len() >= l2 + 20 => {
            let src = IpAddr::from(<[u8; 4]>::try_from(&f[l2 + 12..l2 + 16]).ok()?);
            let dst = IpAddr::from(<[u8; 4]>::try_from(&f[l2 + 16..l2 + 20]).ok()?);
            Some((src, dst, f[l2 + 9], u16::from_be_bytes([f[l2 + 2], f[l2 + 3]]) as usize))
        }
        6 if f.len() >= l2 + 40 => {
            let src = IpAddr::from(<[u8; 16]>::try_from(&f[l2 + 8..l2 + 24]).ok()?);
            let dst = IpAddr::from(<[u8; 16]>::try_from(&f[l2 + 24..l2 + 40]).ok()?);
            Some((src, dst, f[l2 + 6], 40 + u16::from_be_bytes([f[l2 + 4], f[l2 + 5]]) as usize))
        }
        _ => None,
    }
}

fn l2_len(f: &[u8]) -> usize {
    match f.get(12..14) {
        Some([0x81, 0x00]) | Some([0x88, 0xa8]) => 18,
        _ => 14,
    }
}

impl Oracle {
    /// Why an XDP_TX output is wrong, or None.
    fn check_tx(&self, input: &[u8], out: &[u8], too_big: bool) -> Option<String> {
        let l2 = l2_len(input);
        let Some((src, dst, _, l3len)) = ip_at(input, l2) else { return Some("sent a frame that is not IP".into()) };
        if !self.vips.contains(&dst) {
            return Some(format!("sent a packet addressed to {dst}, not a VIP"));
        }
        if out.get(6..12) != Some(&IFMAC[..]) {
            return Some("the output's source MAC is not the interface's".into());
        }
        if too_big {
            let ol2 = l2_len(out);
            let Some((osrc, odst, oproto, _)) = ip_at(out, ol2) else { return Some("a too-big answer that is not IP".into()) };
            return (osrc != dst || odst != src || (oproto != 1 && oproto != 58))
                .then(|| format!("a too-big answer from {osrc} to {odst} (proto {oproto}) for {src} -> {dst}"));
        }
        if out.len() == input.len() && out[12..] == input[12..] {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&out[0..6]);
            return (!self.backend_macs.contains(&mac)).then(|| format!("forwarded to {mac:02x?}, not a backend's MAC"));
        }
        // Encapsulated: new outer headers, then the input's IP packet, unchanged.
        let Some(inner) = input.get(l2..l2 + l3len) else { return Some(format!("sent a packet whose IP length {l3len} exceeds the frame")) };
        if out.len() < inner.len() + 14 + 20 || &out[out.len() - inner.len()..] != inner {
            return Some("the output is neither the input with new MACs nor the input's IP packet behind outer headers".into());
        }
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&out[0..6]);
        (!self.backend_macs.contains(&mac)).then(|| format!("encapsulated to {mac:02x?}, not a next hop's MAC"))
    }
}

/// The outcome counters: passed, each drop reason, too_big.
fn outcomes(dp: &Balancer) -> [u64; 9] {
    use types::lb_stat as S;
    let ids = [
        S::LB_STAT_PASSED,
        S::LB_DROP_MALFORMED,
        S::LB_DROP_NO_BACKEND,
        S::LB_DROP_NO_MAC,
        S::LB_DROP_FRAGMENT,
        S::LB_DROP_NO_TABLE,
        S::LB_DROP_OVERSIZE,
        S::LB_DROP_ENCAP,
        S::LB_STAT_TOO_BIG,
    ];
    ids.map(|s| dp.stat(s).expect("stat"))
}

/// Runs the fuzzer for `secs` from `seed`; returns (packets, per-action counts).
pub fn run(seed: u64, secs: f64, max_packets: u64) -> (u64, [u64; 5]) {
    let pool = parse_str("fuzz.yaml", POOL).expect("the fuzz pool is valid");
    let mut dp = Balancer::load(1 << 20).expect("load");
    dp.set_encap_sources(Some(("10.99.0.2".parse().expect("addr"), 24)), Some(("fd99::2".parse().expect("addr"), 128))).expect("sources");
    dp.set_mtu(1500).expect("mtu");
    dp.install(&pool, IFMAC, &mac_of).expect("install");
    let oracle = Oracle {
        vips: VIPS.iter().map(|v| v.parse().expect("vip")).collect(),
        backend_macs: pool.services.iter().flat_map(|s| &s.backends).filter_map(|b| mac_of(b.address)).collect(),
    };
    let mut r = Rng(seed);
    let start = Instant::now();
    let (mut packets, mut actions) = (0u64, [0u64; 5]);
    let mut before = outcomes(&dp);
    let (mut forwarded, forwarded0) = (0u64, dp.forwarded().expect("forwarded"));
    // Every truncation of a set of valid packets first, then random ones.
    let mut truncations: Vec<Vec<u8>> = Vec::new();
    for _ in 0..64 {
        let f = valid(&mut r);
        for n in 0..=f.len() {
            truncations.push(f[..n].to_vec());
        }
    }
    truncations.reverse();
    while packets < max_packets && (packets % 1024 != 0 || start.elapsed().as_secs_f64() < secs) {
        let input = truncations.pop().unwrap_or_else(|| {
            let v = valid(&mut r);
            mutate(&mut r, v)
        });
        // BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet header (so does a NIC).
        if input.len() < 14 {
            continue;
        }
        let (action, out) = dp.test_run(&input).expect("BPF_PROG_TEST_RUN");
        let after = outcomes(&dp);
        let delta: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        let (passed, drops, too_big) = (delta[0], delta[1..8].iter().sum::<u64>(), delta[8]);
        let what = || format!("seed {seed}, packet {packets}: {:02x?}", input);
        match action {
            XDP_PASS => {
                assert_eq!(out, input, "XDP_PASS changed the packet ({})", what());
                assert_eq!((passed, drops, too_big), (1, 0, 0), "a passed packet counted {delta:?} ({})", what());
            }
            XDP_DROP => assert_eq!((passed, drops, too_big), (0, 1, 0), "a dropped packet counted {delta:?} ({})", what()),
            XDP_TX => {
                assert_eq!((passed, drops), (0, 0), "a sent packet counted {delta:?} ({})", what());
                if let Some(why) = oracle.check_tx(&input, &out, too_big == 1) {
                    panic!("XDP_TX: {why} ({}; output {:02x?})", what(), out);
                }
                forwarded += (too_big == 0) as u64;
            }
            a => panic!("action {a} ({})", what()),
        }
        actions[action as usize] += 1;
        before = after;
        packets += 1;
        if packets % 4096 == 0 {
            assert_eq!(dp.forwarded().expect("forwarded") - forwarded0, forwarded, "backend counters after {packets} packets (seed {seed})");
            dp.tick().expect("tick");
        }
    }
    assert_eq!(dp.forwarded().expect("forwarded") - forwarded0, forwarded, "backend counters at the end (seed {seed})");
    (packets, actions)
}

#[test]
fn root_fuzzed_packets_never_break_the_data_planes_promises() {
    common::require_root();
    let secs: f64 = std::env::var("FUZZ_PACKETS_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40.0);
    let seed: u64 = std::env::var("FUZZ_PACKETS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261130);
    let max: u64 = std::env::var("FUZZ_PACKETS_MAX").ok().and_then(|s| s.parse().ok()).unwrap_or(u64::MAX);
    let t = Instant::now();
    let (n, a) = run(seed, secs, max);
    println!(
        "fuzz_packets: {n} packets from seed {seed} in {:.0} s: {} passed, {} dropped, {} sent; every one checked",
        t.elapsed().as_secs_f64(),
        a[2],
        a[1],
        a[3]
    );
    assert!(a[1] > 0 && a[2] > 0 && a[3] > 0, "the generator reached every action: {a:?}");
}

#[test]
fn the_oracle_rejects_what_the_data_plane_must_not_do() {
    // The checks above, shown to fail on outputs lb must never produce.
    let oracle = Oracle { vips: ["10.99.0.100".parse().expect("vip")].into(), backend_macs: [[0x02, 0xbb, 0, 0, 0, 11]].into() };
    let input = ipv4_simple(v4("192.0.2.7"), v4("10.99.0.100"), L4::Tcp { sport: 4000, dport: 80, flags: 0x10 });
    let mut good = input.clone();
    good[0..6].copy_from_slice(&[0x02, 0xbb, 0, 0, 0, 11]);
    good[6..12].copy_from_slice(&IFMAC);
    assert_eq!(oracle.check_tx(&input, &good, false), None);
    let mut ttl = good.clone();
    ttl[14 + 8] -= 1;
    assert!(oracle.check_tx(&input, &ttl, false).is_some(), "a changed inner byte");
    let mut mac = good.clone();
    mac[5] = 12;
    assert!(oracle.check_tx(&input, &mac, false).is_some(), "not a backend's MAC");
    let other = ipv4_simple(v4("192.0.2.7"), v4("10.99.0.200"), L4::Tcp { sport: 4000, dport: 80, flags: 0x10 });
    let mut sent = other.clone();
    sent[0..12].copy_from_slice(&good[0..12]);
    assert!(oracle.check_tx(&other, &sent, false).is_some(), "not addressed to a VIP");
    // Encapsulated: outer headers, then the input's IP packet; a changed inner byte is caught.
    let mut encap = good[0..14].to_vec();
    encap.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0, 0, 64, 4, 0, 0, 10, 99, 0, 2, 10, 1, 0, 11]);
    encap.extend_from_slice(&input[14..]);
    assert_eq!(oracle.check_tx(&input, &encap, false), None);
    let n = encap.len();
    encap[n - 1] ^= 1;
    assert!(oracle.check_tx(&input, &encap, false).is_some(), "a changed inner byte behind outer headers");
}
