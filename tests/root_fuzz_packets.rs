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
//! - the packet was counted exactly once: by `passed`, by `other_host`, by one drop reason, by
//!   `too_big`, or by a backend's forwarded count (checked in sums every few thousand packets);
//! - a frame addressed to another host's unicast MAC is passed unchanged, counted `other_host`;
//! - no TCP or UDP packet for a VIP and port with a service is ever passed to the host, in a
//!   frame to lb's MAC or a broadcast/multicast one, tagged or not, whatever extension headers
//!   or fragmentation it has (read by this file's own parser, not the program's);
//! - a later fragment of a datagram whose first fragment was sent to a backend goes to that same
//!   backend (the same MAC, and the same outer destination when encapsulated); the generator
//!   sends trains of fragments (first, then later ones, other packets in between) for this, and
//!   each train's later fragments must be sent; IPv6 trains may carry a destination-options
//!   header after the fragment header; any later fragment with a fresh record that is not sent
//!   must not have taken the fragment route (`unmatched`);
//! - a first fragment that disagrees with its datagram's fresh record (another port, protocol
//!   or backend: trains send such spoofs, same source and identification, to another service
//!   of the VIP) leaves the datagram's later fragments following nothing (`followed` unchanged);
//!   where this file knows a fresh first fragment of the datagram, a sent first fragment that
//!   agrees with it is recorded and one that disagrees deletes the record (`recorded`,
//!   `conflict`); where it does not (lb keeps records longer than it looks, and may hold one it
//!   cannot know of), lb's two counters say which of the two happened, and any sent first
//!   fragment does one of them. A failure prints the datagram's last fragments with what each
//!   did.
//! - `lb decap` (crates/dataplane/src/bpf/decap.bpf.c), fed lb's encapsulated output, the same with the outer
//!   source rewritten (inside and outside its allow-list) and mutations of both, never unwraps a
//!   packet whose outer source is outside its allow-list.
//!
//! Needs root. The suite runs a short fixed-seed run (FUZZ_PACKETS_SECONDS, default 40 s);
//! FUZZ_PACKETS=N runs exactly N packets whatever the time (10,000,000 for the issue 22 run);
//! `scripts/fuzz-packets.sh SECONDS [SEED]` runs longer.

mod common;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use common::packet::*;
use common::rng::Rng;
use lb::config::parse_str;
use lb::balancer::Balancer;
use lb::dataplane::decap::Decap;
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
            let vlan = r.chance(15).then(|| if r.chance(50) { 0 } else { r.below(4096) as u16 });
            let dport = if r.chance(3) { 0 } else { *r.pick(&PORTS) };
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
            let p = payload(r);
            let dport = if r.chance(3) { 0 } else { *r.pick(&PORTS) };
            let l = l4(r, proto, dport);
            if r.chance(35) {
                let exts: Vec<Ext> = (0..1 + r.below(6)).map(|_| ext(r)).collect();
                return ipv6_ext(client6(r), dst, &exts, l, &p);
            }
            ipv6(client6(r), dst, l, None, &p)
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

/// An IPv6 extension header of any kind lb meets.
fn ext(r: &mut Rng) -> Ext {
    match r.below(6) {
        0 => Ext::HopByHop,
        1 => Ext::DestOpts { units: r.below(4) as u8 },
        2 => Ext::Routing { kind: *r.pick(&[0u8, 2, 4]), segments_left: *r.pick(&[0u8, 0, 1]) },
        3 | 4 => Ext::Fragment { offset: if r.chance(50) { 0 } else { 1 + r.below(100) as u16 }, more: r.chance(60), id: r.below(4) as u32 },
        _ => Ext::Ah,
    }
}

/// The frame's L2 addressing and tags: mostly to lb's MAC, untagged; sometimes to another
/// host, broadcast or multicast, or behind one or two VLAN tags.
fn addressed(r: &mut Rng, f: Vec<u8>) -> Vec<u8> {
    let f = match r.below(100) {
        0..=4 => to_mac(&f, [0x02, 0, 0, 0, 0, 0x42 + r.below(2) as u8]),
        5..=6 => to_mac(&f, [0xff; 6]),
        7 => to_mac(&f, *r.pick(&[[0x01, 0, 0x5e, 0, 0, 1], [0x33, 0x33, 0, 0, 0, 1]])),
        _ => f,
    };
    if f.len() < 14 || f[12..14] == [0x81, 0x00] {
        return f;
    }
    match r.below(100) {
        0..=3 => tagged(&f, if r.chance(50) { 0 } else { r.below(4096) as u16 }),
        4 => {
            // 802.1ad in front of 802.1Q.
            let mut g = tagged(&f, r.below(4096) as u16);
            g.splice(12..12, [0x88, 0xa8, 0, r.below(4) as u8]);
            g
        }
        _ => f,
    }
}

/// A train of fragments of one datagram to a service (either family): the first fragment, then
/// 1 to 3 later ones, each with a small payload (none exceeds the MTU once encapsulated). IPv6
/// trains sometimes start the fragmentable part with a destination-options header, which every
/// fragment header then names. Sometimes also a spoof: a first fragment with the same source
/// and identification to another service of the VIP (same protocol, another port), sent right
/// after the real first; the datagram's later fragments must then never follow anything.
fn train(r: &mut Rng, id: u32) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    let later = 1 + r.below(3) as u16;
    let sport = 1024 + r.below(60000) as u16;
    let spoofed = r.chance(20);
    let l4_of = |dport: u16, proto: u8| if proto == 6 { L4::Tcp { sport, dport, flags: 0x10 } } else { L4::Udp { sport, dport } };
    if r.chance(50) {
        let services = [(80u16, 6u8), (81, 6), (8080, 6), (53, 17), (5353, 17), (82, 6), (84, 17), (90, 6)];
        let (dport, proto) = *r.pick(&services);
        let l = l4_of(dport, proto);
        let src = client4(r);
        let first = |l: L4| ipv4(None, src, v4("10.99.0.100"), l, &V4Opts { more_fragments: true, id: Some(id as u16), ..Default::default() }, b"first part");
        let mut out = vec![first(l)];
        for i in 0..later {
            let opts = V4Opts { frag_offset: 3 + i * 3, more_fragments: i + 1 < later, id: Some(id as u16), ..Default::default() };
            out.push(ipv4(None, src, v4("10.99.0.100"), l, &opts, b"later part of a datagram"));
        }
        let other: Vec<u16> = services.iter().filter(|(p, q)| *q == proto && *p != dport).map(|s| s.0).collect();
        let spoof = (spoofed && !other.is_empty()).then(|| first(l4_of(*r.pick(&other), proto)));
        (out, spoof)
    } else {
        let services = [(80u16, 6u8), (82, 6), (84, 17)];
        let (dport, proto) = *r.pick(&services);
        let l = l4_of(dport, proto);
        let src = client6(r);
        let head: Vec<Ext> = if r.chance(30) { vec![Ext::HopByHop] } else { Vec::new() };
        let tail: Vec<Ext> = if r.chance(30) { vec![Ext::DestOpts { units: r.below(2) as u8 }] } else { Vec::new() };
        let with = |e: Ext| head.iter().copied().chain([e]).chain(tail.iter().copied()).collect::<Vec<_>>();
        let first = |l: L4| ipv6_ext(src, v6("fd99::100"), &with(Ext::Fragment { offset: 0, more: true, id }), l, b"first part");
        let mut out = vec![first(l)];
        for i in 0..later {
            out.push(ipv6_ext(src, v6("fd99::100"), &with(Ext::Fragment { offset: 3 + i * 3, more: i + 1 < later, id }), l, b"later part of a datagram"));
        }
        let other: Vec<u16> = services.iter().filter(|(p, q)| *q == proto && *p != dport).map(|s| s.0).collect();
        let spoof = (spoofed && !other.is_empty()).then(|| first(l4_of(*r.pick(&other), proto)));
        (out, spoof)
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
    /// (VIP, port, protocol) of every service; (VIP, protocol) pairs with a service.
    services: HashSet<(IpAddr, u16, u8)>,
    protos: HashSet<(IpAddr, u8)>,
}

/// Whom a frame is addressed to.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Dest {
    Lb,
    OtherHost,
    Group,
}

fn be16(b: &[u8], at: usize) -> usize {
    u16::from_be_bytes([b[at], b[at + 1]]) as usize
}

/// The frame's addressee, and where its IP header starts with its ethertype (after at most two
/// VLAN tags, as 802.1ad and 802.1Q stack them).
fn l2_of(f: &[u8]) -> Option<(Dest, usize, usize)> {
    if f.len() < 14 {
        return None;
    }
    let dest = if f[0..6] == IFMAC { Dest::Lb } else if f[0] & 1 == 1 { Dest::Group } else { Dest::OtherHost };
    let (mut at, mut et) = (12, be16(f, 12));
    for _ in 0..2 {
        if (et == 0x8100 || et == 0x88a8) && f.len() >= at + 8 {
            at += 4;
            et = be16(f, at);
        }
    }
    Some((dest, at + 2, et))
}

/// IPv6 extension headers, by number.
fn is_ext6(nh: u8) -> bool {
    matches!(nh, 0 | 43 | 44 | 51 | 60 | 135 | 139 | 140)
}

/// A fragment's datagram (source, destination, identification, protocol as its fragment
/// header or IPv4 header says) and whether it is the first fragment (else a later one).
fn fragment_of(f: &[u8]) -> Option<(Vec<u8>, bool)> {
    let (_, l2, et) = l2_of(f)?;
    let ip = f.get(l2..)?;
    if et == 0x0800 && ip.len() >= 20 && ip[0] >> 4 == 4 {
        let (flags, off) = (ip[6] & 0x20 != 0, be16(ip, 6) & 0x1fff);
        if !flags && off == 0 {
            return None;
        }
        let mut key = ip[12..20].to_vec();
        key.extend_from_slice(&ip[4..6]);
        key.push(ip[9]);
        return Some((key, off == 0));
    }
    if et != 0x86dd || ip.len() < 40 || ip[0] >> 4 != 6 {
        return None;
    }
    let (mut at, mut nh) = (40, ip[6]);
    while is_ext6(nh) && ip.len() >= at + 8 {
        if nh == 44 {
            let off = be16(ip, at + 2);
            if off & 0xfff8 == 0 && off & 1 == 0 {
                return None;
            }
            let mut key = ip[8..40].to_vec();
            key.extend_from_slice(&ip[at + 4..at + 8]);
            key.push(ip[at]);
            return Some((key, off & 0xfff8 == 0));
        }
        let len = if nh == 51 { (ip[at + 1] as usize + 2) * 4 } else { (ip[at + 1] as usize + 1) * 8 };
        nh = ip[at];
        at += len;
    }
    None
}

/// Where a sent frame went: its destination MAC, and the outer destination address when lb
/// encapsulated it.
fn destination(input: &[u8], out: &[u8]) -> Vec<u8> {
    let mut d = out[0..6].to_vec();
    if out.len() != input.len() || out[12..] != input[12..] {
        if let Some((_, l2, et)) = l2_of(out) {
            match et {
                0x0800 => d.extend_from_slice(out.get(l2 + 16..l2 + 20).unwrap_or(&[])),
                0x86dd => d.extend_from_slice(out.get(l2 + 24..l2 + 40).unwrap_or(&[])),
                _ => {}
            }
        }
    }
    d
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
    /// A first fragment's (destination port, upper-layer protocol), read by this file's parser.
    fn port_of(&self, f: &[u8]) -> Option<(u16, u8)> {
        let (_, l2, et) = l2_of(f)?;
        let ip = f.get(l2..)?;
        let (mut at, mut nh) = match et {
            0x0800 if ip.len() >= 20 => ((ip[0] & 15) as usize * 4, ip[9]),
            0x86dd if ip.len() >= 40 => (40, ip[6]),
            _ => return None,
        };
        while et == 0x86dd && is_ext6(nh) && ip.len() >= at + 8 {
            let len = match nh {
                51 => (ip[at + 1] as usize + 2) * 4,
                44 => 8,
                _ => (ip[at + 1] as usize + 1) * 8,
            };
            nh = ip[at];
            at += len;
        }
        (ip.len() >= at + 4 && (nh == 6 || nh == 17)).then(|| (be16(ip, at + 2) as u16, nh))
    }

    /// Why handing `f` to the host would break lb's promise (a TCP or UDP packet for a VIP and
    /// port with a service, or one whose port cannot be read for an address with services), or
    /// None. Read by this file's own parser: the program's is what is being checked.
    fn must_not_pass(&self, f: &[u8]) -> Option<String> {
        let (dest, l2, et) = l2_of(f)?;
        if dest == Dest::OtherHost {
            return None;
        }
        let ip = f.get(l2..)?;
        if et == 0x0800 {
            if ip.len() < 20 || ip[0] >> 4 != 4 {
                return None;
            }
            let (ihl, tot, proto) = ((ip[0] & 15) as usize * 4, be16(ip, 2), ip[9]);
            if ihl < 20 || tot < ihl || tot > ip.len() || (proto != 6 && proto != 17) {
                return None;
            }
            let dst = IpAddr::from(<[u8; 4]>::try_from(&ip[16..20]).ok()?);
            if be16(ip, 6) & 0x1fff != 0 {
                return self.protos.contains(&(dst, proto)).then(|| format!("a later IPv4 fragment for {dst} proto {proto}"));
            }
            if tot < ihl + 4 {
                return None;
            }
            let port = be16(ip, ihl + 2) as u16;
            return self.services.contains(&(dst, port, proto)).then(|| format!("IPv4 for the service {dst}:{port}/{proto}"));
        }
        if et != 0x86dd || ip.len() < 40 || ip[0] >> 4 != 6 {
            return None;
        }
        let end = 40 + be16(ip, 4);
        let dst = IpAddr::from(<[u8; 16]>::try_from(&ip[24..40]).ok()?);
        if end > ip.len() || !(self.protos.contains(&(dst, 6)) || self.protos.contains(&(dst, 17))) {
            return None;
        }
        let (mut at, mut nh) = (40, ip[6]);
        loop {
            match nh {
                6 | 17 => {
                    if at + 4 > end {
                        return None;
                    }
                    let port = be16(ip, at + 2) as u16;
                    return self.services.contains(&(dst, port, nh)).then(|| format!("IPv6 for the service {dst}:{port}/{nh}"));
                }
                n if is_ext6(n) => {
                    if at + 8 > end {
                        return Some(format!("IPv6 for {dst} with extension headers past its end"));
                    }
                    let len = match n {
                        51 => (ip[at + 1] as usize + 2) * 4,
                        44 => 8,
                        _ => (ip[at + 1] as usize + 1) * 8,
                    };
                    let later = n == 44 && be16(ip, at + 2) & 0xfff8 != 0;
                    nh = ip[at];
                    at += len;
                    if later {
                        return (self.protos.contains(&(dst, nh)) || is_ext6(nh)).then(|| format!("a later IPv6 fragment for {dst} (next header {nh})"));
                    }
                }
                _ => return None,
            }
        }
    }

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

/// The outcome counters: passed, other_host, each drop reason, too_big.
fn outcomes(dp: &Balancer) -> [u64; 15] {
    use types::lb_stat as S;
    let ids = [
        S::LB_STAT_PASSED,
        S::LB_STAT_OTHER_HOST,
        S::LB_DROP_MALFORMED,
        S::LB_DROP_NO_BACKEND,
        S::LB_DROP_NO_MAC,
        S::LB_DROP_FRAGMENT,
        S::LB_DROP_NO_TABLE,
        S::LB_DROP_OVERSIZE,
        S::LB_DROP_ENCAP,
        S::LB_DROP_NOT_UNICAST,
        S::LB_DROP_VLAN,
        S::LB_DROP_EXT_HEADER,
        S::LB_DROP_TOO_BIG_LIMITED,
        S::LB_DROP_TOO_BIG_BELOW_MIN,
        S::LB_STAT_TOO_BIG,
    ];
    ids.map(|s| dp.stat(s).expect("stat"))
}

/// lb's encapsulation sources in this run, as `lb decap --allow-from` lists them.
fn decap_allowed(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(v) => v.octets()[0..3] == [10, 99, 0],
        IpAddr::V6(v) => v == v6("fd99::2"),
    }
}

/// The outer source of an IP frame.
fn outer_source(f: &[u8]) -> Option<IpAddr> {
    let (_, l2, et) = l2_of(f)?;
    match et {
        0x0800 => Some(IpAddr::from(<[u8; 4]>::try_from(f.get(l2 + 12..l2 + 16)?).ok()?)),
        0x86dd => Some(IpAddr::from(<[u8; 16]>::try_from(f.get(l2 + 8..l2 + 24)?).ok()?)),
        _ => None,
    }
}

/// `f` (an encapsulated frame) from another outer source: inside lb's prefix or anywhere.
fn respoof(r: &mut Rng, f: &[u8]) -> Vec<u8> {
    let mut f = f.to_vec();
    let Some((_, l2, et)) = l2_of(&f) else { return f };
    if et == 0x0800 && f.len() >= l2 + 20 {
        let src = if r.chance(30) { [10, 99, 0, r.below(256) as u8] } else { (r.next() as u32).to_be_bytes() };
        f[l2 + 12..l2 + 16].copy_from_slice(&src);
        f[l2 + 10..l2 + 12].copy_from_slice(&[0, 0]);
        let hl = ((f[l2] & 15) as usize * 4).clamp(20, f.len() - l2);
        let c = csum(&f[l2..l2 + hl]);
        f[l2 + 10..l2 + 12].copy_from_slice(&c.to_be_bytes());
    } else if et == 0x86dd && f.len() >= l2 + 40 {
        let src = if r.chance(30) { v6("fd99::2").octets() } else { (r.next() as u128 | (r.next() as u128) << 64).to_be_bytes() };
        f[l2 + 8..l2 + 24].copy_from_slice(&src);
    }
    f
}

/// Where a datagram's first fragment went ((destination, its (port, protocol))), and the
/// packet number and time it was sent.
type First = ((Vec<u8>, Option<(u16, u8)>), u64, Instant);

/// What one run checked besides every packet's action, output and count.
#[derive(Debug, Default)]
pub struct Checked {
    /// Later fragments sent where their datagram's first fragment went (trains and others).
    pub followed: u64,
    /// Later fragments with a fresh record not sent (refused, malformed), checked not to have
    /// taken the fragment route.
    pub unsent: u64,
    /// Later fragments of a datagram whose record a conflicting first fragment deleted,
    /// checked not to have followed anything.
    pub conflicts: u64,
    /// Packets for a service that the program must not pass (it did not).
    pub for_service: u64,
    /// Frames to another host's MAC, passed.
    pub other_host: u64,
    /// Frames given to lb decap, and those whose outer source was outside its allow-list.
    pub decap: u64,
    pub decap_outside: u64,
}

/// Runs the fuzzer for `secs` (or exactly `count` packets) from `seed`; returns (packets,
/// per-action counts, what else was checked).
pub fn run(seed: u64, secs: f64, count: Option<u64>) -> (u64, [u64; 5], Checked) {
    let pool = parse_str("fuzz.yaml", POOL).expect("the fuzz pool is valid");
    // One CPU: BPF_PROG_TEST_RUN runs the program on the caller's, and the fragment records'
    // LRU keeps free entries per CPU, so that on a machine of many CPUs a thread that wandered
    // would see records evicted long before the map is full.
    if let Ok(set) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        if let Some(cpu) = (0..nix::sched::CpuSet::count()).find(|&c| set.is_set(c).unwrap_or(false)) {
            let mut one = nix::sched::CpuSet::new();
            if one.set(cpu).is_ok() {
                let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one);
            }
        }
    }
    let mut dp = Balancer::load(1 << 20).expect("load");
    dp.set_encap_sources(Some(("10.99.0.2".parse().expect("addr"), 24)), Some(("fd99::2".parse().expect("addr"), 128))).expect("sources");
    dp.set_mtu(1500).expect("mtu");
    dp.install(&pool, IFMAC, &mac_of).expect("install");
    let proto = |s: &lb::config::Service| if s.protocol == lb::config::Protocol::Tcp { 6u8 } else { 17 };
    let oracle = Oracle {
        vips: VIPS.iter().map(|v| v.parse().expect("vip")).collect(),
        backend_macs: pool.services.iter().flat_map(|s| &s.backends).filter_map(|b| mac_of(b.address)).collect(),
        services: pool.services.iter().map(|s| (s.vip, s.port, proto(s))).collect(),
        protos: pool.services.iter().map(|s| (s.vip, proto(s))).collect(),
    };
    // lb decap as the pool's backends run it: their addresses and the VIPs are local, lb's
    // encapsulation sources are allowed; with second chance, so that mutated hop lists meet its
    // parser too (a test run arrives on the loopback, which no hop's route leaves by: nothing is
    // sent on, and the oracle's "passed or dropped" holds).
    let mut de = Decap::load(6080, true).expect("load decap");
    de.allow_from(&[(ip("10.99.0.0"), 24), (ip("fd99::2"), 128)]).expect("allow");
    let locals: Vec<IpAddr> = pool.services.iter().flat_map(|s| s.backends.iter().map(|b| b.address).chain([s.vip])).collect();
    de.set_local(&locals).expect("local");
    let mut r = Rng(seed);
    let start = Instant::now();
    let (mut packets, mut actions, mut checked) = (0u64, [0u64; 5], Checked::default());
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
    // Fragment trains: (due at packet, frame, a later fragment of a train).
    let mut trains: Vec<(u64, Vec<u8>, bool)> = Vec::new();
    let mut train_id = 0u32;
    // Where each datagram's first fragment went, and when.
    let mut firsts: HashMap<Vec<u8>, First> = HashMap::new();
    // Datagrams whose record a conflicting first fragment deleted.
    let mut conflicted: HashSet<Vec<u8>> = HashSet::new();
    // The last fragments of each datagram, for a failure's message.
    let mut history: HashMap<Vec<u8>, (u64, Vec<String>)> = HashMap::new();

    let done = |packets: u64| match count {
        Some(n) => packets >= n,
        None => packets % 1024 == 0 && start.elapsed().as_secs_f64() >= secs,
    };
    while !done(packets) {
        let due = trains.iter().position(|t| t.0 <= packets);
        let (input, in_train) = if let Some(i) = due {
            let (_, f, later) = trains.swap_remove(i);
            (f, later)
        } else if let Some(f) = truncations.pop() {
            (f, false)
        } else if r.chance(2) {
            train_id = train_id.wrapping_add(1);
            let (frames, spoof) = train(&mut r, 0x1_0000 | train_id);
            let mut frames = frames.into_iter();
            let first = frames.next().expect("a first fragment");
            let after = spoof.is_some() as u64;
            if let Some(f) = spoof {
                trains.push((packets + 1, f, false));
            }
            for (k, f) in frames.enumerate() {
                trains.push((packets + 1 + after + k as u64 + r.below(20), f, true));
            }
            (first, false)
        } else {
            let v = valid(&mut r);
            let v = addressed(&mut r, v);
            (mutate(&mut r, v), false)
        };
        // BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet header (so does a NIC).
        if input.len() < 14 {
            continue;
        }
        // A later fragment: the fragment table's events it causes are read around its run.
        let fragment = fragment_of(&input);
        let frag_events = |dp: &Balancer| {
            [types::lb_stat::LB_FRAG_FOLLOWED, types::lb_stat::LB_FRAG_UNMATCHED, types::lb_stat::LB_FRAG_RECORDED, types::lb_stat::LB_FRAG_CONFLICT]
                .map(|s| dp.stat(s).expect("stat"))
        };
        let frag_before = fragment.is_some().then(|| frag_events(&dp));
        let (action, out) = dp.test_run(&input).expect("BPF_PROG_TEST_RUN");
        let after = outcomes(&dp);
        let delta: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        let (passed, other, drops, too_big) = (delta[0], delta[1], delta[2..14].iter().sum::<u64>(), delta[14]);
        let what = || format!("seed {seed}, packet {packets}: {:02x?}", input);
        let dest = l2_of(&input).map(|l| l.0);
        if dest == Some(Dest::OtherHost) {
            assert_eq!((action, other), (XDP_PASS, 1), "a frame for another host ({})", what());
            checked.other_host += 1;
        }
        let for_service = oracle.must_not_pass(&input);
        match action {
            XDP_PASS => {
                assert_eq!(out, input, "XDP_PASS changed the packet ({})", what());
                assert_eq!((passed + other, drops, too_big), (1, 0, 0), "a passed packet counted {delta:?} ({})", what());
                if let Some(why) = for_service {
                    panic!("passed to the host: {why} ({})", what());
                }
            }
            XDP_DROP => assert_eq!((passed, other, drops, too_big), (0, 0, 1, 0), "a dropped packet counted {delta:?} ({})", what()),
            XDP_TX => {
                assert_eq!((passed, other, drops), (0, 0, 0), "a sent packet counted {delta:?} ({})", what());
                if let Some(why) = oracle.check_tx(&input, &out, too_big == 1) {
                    panic!("XDP_TX: {why} ({}; output {:02x?})", what(), out);
                }
                forwarded += (too_big == 0) as u64;
            }
            a => panic!("action {a} ({})", what()),
        }
        checked.for_service += for_service.is_some() as u64;
        // Later fragments follow the first. lb keeps a record 30 s (IPv4) or 60 s (IPv6); this
        // checks it for 20, and mirrors lb's rule for a first fragment that disagrees with a
        // fresh record (another port, protocol or backend): the record is deleted, and until a
        // first fragment records the datagram again its later fragments never follow.
        let [followed, unmatched, recorded, conflict] = frag_before.map(|b| {
            let a = frag_events(&dp);
            [a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3]]
        }).unwrap_or([0, 0, 0, 0]);
        if let Some((key, first)) = &fragment {
            let (last, h) = history.entry(key.clone()).or_default();
            *last = packets;
            h.push(format!(
                "#{packets} {} action {action} too_big {too_big} followed {followed} unmatched {unmatched} recorded {recorded} conflict {conflict} to {:02x?} {:02x?}",
                if *first { "first" } else { "later" },
                if action == XDP_TX { Some(destination(&input, &out)) } else { None },
                &input[..input.len().min(60)]
            ));
            if h.len() > 12 {
                h.remove(0);
            }
        }
        let story = fragment.as_ref().and_then(|(k, _)| history.get(k)).map(|h| h.1.join("\n")).unwrap_or_default();
        let what = || format!("{}; this datagram's last fragments:\n{story}", what());
        if let Some((key, first)) = fragment {
            if first {
                if action == XDP_TX && too_big == 0 {
                    let went = (destination(&input, &out), oracle.port_of(&input));
                    // What the oracle knows for sure: a fresh first fragment of this datagram
                    // (it may not know of one: lb keeps records longer than this looks, and a
                    // record it did not know of may have been replaced). Where it knows, lb must
                    // agree: re-point nothing, delete on a disagreement.
                    if let Some((agrees, _, _)) = firsts.get(&key).map(|e| (e.0 == went, packets - e.1, e.2.elapsed().as_secs())).filter(|e| e.1 < 2000 && e.2 < 20) {
                        assert_eq!(
                            (recorded, conflict),
                            if agrees { (1, 0) } else { (0, 1) },
                            "a first fragment {} a fresh record was {} ({})",
                            if agrees { "agreeing with" } else { "disagreeing with" },
                            if agrees { "not recorded" } else { "not taken as a conflict" },
                            what()
                        );
                    }
                    // Otherwise lb's counters say what it did with its own record; it can hold
                    // none where the oracle knows of no first fragment sent in the last 70 s,
                    // or knows that lb deleted the last record: there it must record.
                    if !firsts.contains_key(&key) || conflicted.contains(&key) {
                        assert_eq!((recorded, conflict), (1, 0), "a first fragment of a datagram lb holds no record of was not recorded ({})", what());
                    }
                    if conflict == 1 {
                        firsts.remove(&key);
                        conflicted.insert(key);
                    } else {
                        assert_eq!(recorded, 1, "a first fragment sent without a conflict was not recorded ({})", what());
                        conflicted.remove(&key);
                        firsts.insert(key, (went, packets, Instant::now()));
                    }
                }
            } else if conflicted.contains(&key) {
                assert_eq!(followed, 0, "a later fragment followed a datagram whose record a conflicting first fragment deleted ({}; output {:02x?})", what(), out);
                checked.conflicts += 1;
            } else if let Some(((to, _), at, when)) = firsts.get(&key).filter(|(_, _, w)| w.elapsed().as_secs() < 20) {
                // A too-big answer goes back to the client: the backend was chosen, not used.
                if (action == XDP_TX && too_big == 0) || in_train {
                    assert_eq!((action, too_big), (XDP_TX, 0), "a train's later fragment was not sent ({}; first fragment {:?} ago)", what(), when.elapsed());
                    assert_eq!(&destination(&input, &out), to, "a later fragment went elsewhere than its first ({}; output {:02x?})", what(), out);
                    checked.followed += 1;
                } else if dest != Some(Dest::OtherHost) && packets - at < 2000 {
                    // Not sent: refused (MAC, VLAN), malformed or behind headers lb refuses; never
                    // for want of a record that exists (fewer than 2,000 packets since the first
                    // fragment, so no LRU eviction of lb's 8,192 records either).
                    assert_eq!(unmatched, 0, "a later fragment with a fresh record took the fragment route ({}; action {action})", what());
                    checked.unsent += 1;
                }
            }
        }
        // lb decap never unwraps from outside its allow-list: lb's own output, respoofed, mutated.
        if action == XDP_TX && too_big == 0 && out.len() > input.len() {
            for _ in 0..2 {
                let f = if r.chance(50) { respoof(&mut r, &out) } else { out.clone() };
                let f = if r.chance(30) { mutate(&mut r, f) } else { f };
                if f.len() < 14 {
                    continue;
                }
                let (a, o) = de.test_run(&f).expect("decap test run");
                assert!(a == XDP_PASS || a == XDP_DROP, "decap action {a} ({})", what());
                let outside = outer_source(&f).is_some_and(|s| !decap_allowed(s));
                assert!(!(a == XDP_PASS && o != f && outside), "decap unwrapped from {:?}, outside its allow-list: {:02x?}", outer_source(&f), f);
                checked.decap += 1;
                checked.decap_outside += outside as u64;
            }
        }
        actions[action as usize] += 1;
        before = after;
        packets += 1;
        if packets % 4096 == 0 {
            assert_eq!(dp.forwarded().expect("forwarded") - forwarded0, forwarded, "backend counters after {packets} packets (seed {seed})");
            dp.tick().expect("tick");
            // Kept past lb's 60 s, so that a disagreement with a record lb may still hold is known.
            firsts.retain(|_, (_, _, w)| w.elapsed().as_secs() < 70);
            history.retain(|_, (last, _)| packets - *last < 4096);
        }
    }
    assert_eq!(dp.forwarded().expect("forwarded") - forwarded0, forwarded, "backend counters at the end (seed {seed})");
    (packets, actions, checked)
}

#[test]
fn root_fuzzed_packets_never_break_the_data_planes_promises() {
    common::require_root();
    let secs: f64 = std::env::var("FUZZ_PACKETS_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40.0);
    let seed: u64 = std::env::var("FUZZ_PACKETS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261130);
    let count: Option<u64> = std::env::var("FUZZ_PACKETS").ok().and_then(|s| s.parse().ok());
    let t = Instant::now();
    let (n, a, c) = run(seed, secs, count);
    println!(
        "fuzz_packets: {n} packets from seed {seed} in {:.0} s: {} passed, {} dropped, {} sent; every one checked; {} later fragments followed their first, {} unsent ones did not take the fragment route, {} of spoofed datagrams followed nothing, {} packets for a service not passed, {} frames for other hosts passed, {} frames through lb decap ({} from outside its allow-list, none unwrapped)",
        t.elapsed().as_secs_f64(),
        a[2],
        a[1],
        a[3],
        c.followed,
        c.unsent,
        c.conflicts,
        c.for_service,
        c.other_host,
        c.decap,
        c.decap_outside
    );
    assert!(a[1] > 0 && a[2] > 0 && a[3] > 0, "the generator reached every action: {a:?}");
    assert!(c.followed > 0 && c.conflicts > 0 && c.for_service > 0 && c.other_host > 0 && c.decap_outside > 0, "every invariant was exercised: {c:?}");
}

#[test]
fn the_oracle_rejects_what_the_data_plane_must_not_do() {
    // The checks above, shown to fail on outputs lb must never produce.
    let oracle = Oracle {
        vips: ["10.99.0.100".parse().expect("vip")].into(),
        backend_macs: [[0x02, 0xbb, 0, 0, 0, 11]].into(),
        services: [(ip("10.99.0.100"), 80, 6), (ip("fd99::100"), 80, 6)].into(),
        protos: [(ip("10.99.0.100"), 6), (ip("fd99::100"), 6)].into(),
    };
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
    // Passing: a packet for a service, in every disguise lb must see through, is caught.
    let syn = ipv4_simple(v4("192.0.2.7"), v4("10.99.0.100"), L4::syn(4000, 80));
    let syn6 = |exts: &[Ext]| ipv6_ext(v6("2001:db8::7"), v6("fd99::100"), exts, L4::syn(4000, 80), b"");
    for (what, f) in [
        ("plain", syn.clone()),
        ("broadcast", to_mac(&syn, [0xff; 6])),
        ("VLAN 42", tagged(&syn, 42)),
        ("a later IPv4 fragment", ipv4(None, v4("192.0.2.7"), v4("10.99.0.100"), L4::syn(4000, 80), &V4Opts { frag_offset: 2, ..Default::default() }, b"x")),
        ("IPv6 behind hop-by-hop and routing", syn6(&[Ext::HopByHop, Ext::Routing { kind: 0, segments_left: 1 }])),
        ("IPv6 behind AH", syn6(&[Ext::Ah])),
        ("a later IPv6 fragment", syn6(&[Ext::Fragment { offset: 1, more: false, id: 1 }])),
    ] {
        assert!(oracle.must_not_pass(&f).is_some(), "{what}");
    }
    for (what, f) in [
        ("another host's MAC", to_mac(&syn, [0x02, 0, 0, 0, 0, 0x42])),
        ("another port", ipv4_simple(v4("192.0.2.7"), v4("10.99.0.100"), L4::syn(4000, 81))),
        ("ICMPv6 behind hop-by-hop", ipv6_ext(v6("2001:db8::7"), v6("fd99::100"), &[Ext::HopByHop], L4::IcmpEcho, b"")),
        // What lb does not look inside (docs/data-plane.md): TCP or UDP carried by another
        // protocol passes to the host, by decision.
        ("GRE to the VIP", {
            let mut f = syn.clone();
            f[14 + 9] = 47;
            f
        }),
        ("ESP to the VIP over IPv6", ipv6(v6("2001:db8::7"), v6("fd99::100"), L4::syn(4000, 80), Some(50), b"")),
    ] {
        assert!(oracle.must_not_pass(&f).is_none(), "{what}");
    }
    // Fragments: the datagram's key is the same for its first and later fragments.
    let first = syn6(&[Ext::HopByHop, Ext::Fragment { offset: 0, more: true, id: 9 }]);
    let later = syn6(&[Ext::HopByHop, Ext::Fragment { offset: 5, more: false, id: 9 }]);
    let (k1, f1) = fragment_of(&first).expect("a fragment");
    let (k2, f2) = fragment_of(&later).expect("a fragment");
    assert!(f1 && !f2 && k1 == k2);
    assert!(fragment_of(&syn6(&[Ext::Fragment { offset: 0, more: false, id: 9 }])).is_none(), "an atomic fragment is no fragment");
    // With a header after the fragment header, the key names that header for both.
    let first = syn6(&[Ext::Fragment { offset: 0, more: true, id: 9 }, Ext::DestOpts { units: 0 }]);
    let later = syn6(&[Ext::Fragment { offset: 5, more: false, id: 9 }, Ext::DestOpts { units: 0 }]);
    assert_eq!(fragment_of(&first).map(|k| k.0), fragment_of(&later).map(|k| k.0));
    assert!(oracle.must_not_pass(&later).is_some(), "a later fragment behind which a header follows");
    assert_eq!(oracle.port_of(&first), Some((80, 6)));
}
