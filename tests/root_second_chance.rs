//! Second chance through the real programs (BPF_PROG_TEST_RUN): lb's GUE version 0 hop lists,
//! byte for byte against what the table builder says each slot's hops are; a flow picked up in
//! mid-connection tracked to its slot's previous owner (and, without second chance, to the
//! table's backend) so that a later change does not move it; and the backends' decapsulation
//! program, in a network namespace of its own with real sockets, keeping what it holds (a
//! connection, a SYN, a SYN cookie's ACK) and sending the rest on to the next hop through the
//! FIB. Expected frames are built here from the documented format, not by the code under test.
//! Needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN): `cargo test --test root_second_chance`.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::packet::*;
use lb::balancer::Balancer;
use lb::config::{parse_str, BackendState, Pool, Service};
use lb::dataplane::decap::{host_addresses, Decap, DecapCounters};
use lb::dataplane::types;
use lb::flowhash::flow_hash;
use lb::table::{self, Table, EMPTY};

const SRC4: &str = "10.99.0.2";
const SRC6: &str = "fd00::2";
const GUE_PORT: u16 = 6081;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const RST: u8 = 0x04;
/// The hop list's type for IPv6 hops (lb.h, enum lb_gue_hops_layout): "L6".
const HOPS_V6: u16 = 0x4c36;

/// Every backend's MAC: lb reaches each directly (no `set_via`), so this is the outer frame's
/// destination.
fn mac_of(a: IpAddr) -> [u8; 6] {
    match a {
        IpAddr::V4(a) => [0x02, 0xbb, 0, 0, 4, a.octets()[3]],
        IpAddr::V6(a) => [0x02, 0xbb, 0, 0, 6, a.octets()[15]],
    }
}

fn pool(text: &str) -> Pool {
    parse_str("pool.yaml", text).expect("fixture pool is valid")
}

/// `now` with `previous` as the pool its `previous:` file names (parse_str reads no files).
fn with_previous(mut now: Pool, previous: &Pool) -> Pool {
    let mut prev = previous.clone();
    prev.previous = None;
    now.previous = Some(Box::new(prev));
    now
}

/// A data plane with `pool` installed, encapsulating from 10.99.0.0/24 and fd00::2, tracking
/// with the flood guard on, and MACs known for every address in `addrs` (backends later pools
/// add included).
fn balancer(pool: &Pool, addrs: &[IpAddr]) -> Balancer {
    common::require_root();
    let mut dp = Balancer::load(1 << 20).expect("load");
    dp.set_conntrack_guard(true).expect("guard");
    dp.set_encap_sources(Some((v4(SRC4), 24)), Some((v6(SRC6), 128))).expect("sources");
    dp.set_mtu(1500).expect("mtu");
    dp.install(pool, IFMAC, &|a| Some(mac_of(a))).expect("install");
    for &a in addrs {
        dp.set_mac(a, Some(mac_of(a))).expect("mac");
    }
    dp
}

fn df() -> V4Opts {
    V4Opts { dont_fragment: true, ..Default::default() }
}

/// The outer IPv4 source lb picks from 10.99.0.0/24 for a flow hash (root_encap.rs explains).
fn outer_src4(hash: u32) -> Ipv4Addr {
    let base = u32::from_ne_bytes(v4(SRC4).octets());
    let vary = (u32::MAX >> 24).to_be();
    Ipv4Addr::from(((base & !vary) | (hash & vary)).to_ne_bytes())
}

/// The GUE header lb puts behind the UDP header: nothing (version 1) without hops, else
/// version 0 with Hlen covering the hop list's block and its hops (of the outer family).
fn gue_header(outer_v4: bool, inner_v4: bool, hops: &[IpAddr], next: u8) -> Vec<u8> {
    if hops.is_empty() {
        return Vec::new();
    }
    let each = if outer_v4 { 4 } else { 16 };
    let mut g = vec![((4 + each * hops.len()) / 4) as u8, if inner_v4 { 4 } else { 41 }, 0, 0];
    g.extend_from_slice(&(if outer_v4 { 0u16 } else { HOPS_V6 }).to_be_bytes());
    g.push(next);
    g.push(hops.len() as u8);
    for h in hops {
        match h {
            IpAddr::V4(a) => {
                assert!(outer_v4, "an IPv4 hop in an IPv6 outer header");
                g.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                assert!(!outer_v4, "an IPv6 hop in an IPv4 outer header");
                g.extend_from_slice(&a.octets());
            }
        }
    }
    g
}

/// The frame lb must send for the client frame `frame` (untagged, the inner IPv4 packet with
/// DF) to `backend`, GUE to GUE_PORT, with hop list `hops`.
fn expected(frame: &[u8], backend: IpAddr, hash: u32, hops: &[IpAddr]) -> Vec<u8> {
    let inner = &frame[14..];
    let (inner_v4, inner_len, tos) = if inner[0] >> 4 == 4 {
        (true, u16::from_be_bytes([inner[2], inner[3]]) as usize, inner[1])
    } else {
        (false, 40 + u16::from_be_bytes([inner[4], inner[5]]) as usize, (u16::from_be_bytes([inner[0], inner[1]]) >> 4) as u8)
    };
    let inner = &inner[..inner_len];
    let gue = gue_header(backend.is_ipv4(), inner_v4, hops, 0);
    let mut udp = Vec::new();
    udp.extend_from_slice(&(0xc000 | ((hash >> 16) & 0x3fff) as u16).to_be_bytes());
    udp.extend_from_slice(&GUE_PORT.to_be_bytes());
    udp.extend_from_slice(&((8 + gue.len() + inner_len) as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(&gue);
    let mut out = Vec::new();
    out.extend_from_slice(&mac_of(backend));
    out.extend_from_slice(&IFMAC);
    match backend {
        IpAddr::V4(b) => {
            out.extend_from_slice(&0x0800u16.to_be_bytes());
            let mut h = vec![0x45, tos];
            h.extend_from_slice(&((20 + udp.len() + inner_len) as u16).to_be_bytes());
            h.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
            h.extend_from_slice(&outer_src4(hash).octets());
            h.extend_from_slice(&b.octets());
            let c = csum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            out.extend_from_slice(&h);
        }
        IpAddr::V6(b) => {
            out.extend_from_slice(&0x86DDu16.to_be_bytes());
            out.extend_from_slice(&(0x6000_0000u32 | (tos as u32) << 20 | (hash & 0xfffff)).to_be_bytes());
            out.extend_from_slice(&((udp.len() + inner_len) as u16).to_be_bytes());
            out.extend_from_slice(&[17, 64]);
            out.extend_from_slice(&v6(SRC6).octets());
            out.extend_from_slice(&b.octets());
        }
    }
    out.extend_from_slice(&udp);
    out.extend_from_slice(inner);
    out
}

/// The outer destination of a frame lb sent.
fn outer_dst(out: &[u8]) -> IpAddr {
    match u16::from_be_bytes([out[12], out[13]]) {
        0x0800 => IpAddr::V4(Ipv4Addr::new(out[30], out[31], out[32], out[33])),
        0x86DD => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&out[38..54]).expect("16"))),
        t => panic!("ethertype {t:#x}"),
    }
}

/// A service's table with its hops (as lb computes them for the data plane) and its table in
/// the previous pool.
struct Tables<'a> {
    s: &'a Service,
    prev: Option<&'a Service>,
    now: Table,
    before: Option<Table>,
}

impl<'a> Tables<'a> {
    fn of(pool: &'a Pool, name: &str) -> Tables<'a> {
        let s = pool.service(name).expect("service");
        let prev = pool.previous_of(s);
        let now = table::with_hops(s, table::build_service(s), prev);
        Tables { s, prev, now, before: prev.map(table::build_service) }
    }

    fn slot(&self, src: IpAddr, sport: u16) -> usize {
        (flow_hash(self.s.hash, src, self.s.vip, sport, self.s.port, 6) % self.s.slots) as usize
    }

    fn hash(&self, src: IpAddr, sport: u16) -> u32 {
        flow_hash(self.s.hash, src, self.s.vip, sport, self.s.port, 6)
    }

    fn addr(&self, member: u32) -> IpAddr {
        self.s.backends[member as usize].address
    }

    /// The slot's owner now.
    fn owner(&self, slot: usize) -> IpAddr {
        self.addr(self.now.owners()[slot])
    }

    /// The slot's owner in the previous pool, when it had one.
    fn owner_before(&self, slot: usize) -> Option<IpAddr> {
        let (prev, before) = (self.prev?, self.before.as_ref()?);
        before.owner(slot).map(|o| prev.backends[o].address)
    }

    /// The slot's first hop (the previous owner), if any.
    fn hop0(&self, slot: usize) -> Option<IpAddr> {
        let h = self.now.hops()[slot][0];
        (h != EMPTY).then(|| self.addr(h))
    }

    /// The hop list a packet hashed to `slot` and sent to `dest` must carry, as the documented
    /// rule says from the table: the slot's owner, then its two hops, leaving out the
    /// destination, backends that are down, hops of the other family and repeats.
    fn hops_for(&self, slot: usize, dest: IpAddr) -> Vec<IpAddr> {
        let [h0, h1] = self.now.hops()[slot];
        let mut out: Vec<IpAddr> = Vec::new();
        for c in [self.now.owners()[slot], h0, h1] {
            if c == EMPTY {
                continue;
            }
            let b = &self.s.backends[c as usize];
            if b.address == dest || b.address.is_ipv4() != dest.is_ipv4() || b.state == BackendState::Down || out.contains(&b.address) {
                continue;
            }
            out.push(b.address);
        }
        out
    }
}

const NOW: &str = "\
services:
  - name: web4
    vip: 10.99.0.100
    port: 443
    hash: flow
    algorithm: maglev
    slots: 1009
    forward: gue
    gue_port: 6081
    second_chance: on
    backends: [{address: 10.1.0.21, name: g1}, {address: 10.1.0.22, name: g2}, {address: 10.1.0.23, name: g3}, {address: 10.1.0.24, name: g4}]
  - name: web6
    vip: 10.99.0.100
    port: 8443
    hash: flow
    algorithm: maglev
    slots: 1009
    forward: gue
    gue_port: 6081
    second_chance: on
    backends: [{address: 'fd01::21', name: s1}, {address: 'fd01::22', name: s2}, {address: 'fd01::23', name: s3}, {address: 'fd01::24', name: s4}]
  - name: mixed
    vip: 'fd00::100'
    port: 443
    hash: flow
    algorithm: maglev
    slots: 1009
    forward: gue
    gue_port: 6081
    second_chance: on
    backends: [{address: 10.1.0.31, name: m1}, {address: 10.1.0.32, name: m2}, {address: 'fd01::33', name: m3}, {address: 'fd01::34', name: m4}]
";

/// NOW before its fourth backends were added: their slots had other owners.
fn previous_of_now() -> Pool {
    pool(&NOW
        .replace(", {address: 10.1.0.24, name: g4}", "")
        .replace(", {address: 'fd01::24', name: s4}", "")
        .replace(", {address: 'fd01::34', name: m4}", ""))
}

#[test]
fn root_second_chance_packets_carry_the_previous_owner_as_a_hop() {
    let prev = previous_of_now();
    let now = with_previous(pool(NOW), &prev);
    let addrs: Vec<IpAddr> = now.services.iter().flat_map(|s| s.backends.iter().map(|b| b.address)).collect();
    let dp = balancer(&now, &addrs);
    // The same pool without second chance: the same tables, GUE version 1 throughout.
    let plain = with_previous(pool(&NOW.replace("second_chance: on", "second_chance: off")), &prev);
    let off = balancer(&plain, &addrs);

    for (name, v6_clients) in [("web4", false), ("web6", false), ("mixed", true)] {
        let t = Tables::of(&now, name);
        let (mut changed, mut kept, mut bare, mut v0) = (0, 0, 0, 0);
        for i in 0..400u32 {
            let sport = 20_000 + i as u16;
            let (src, frame) = if v6_clients {
                let src = Ipv6Addr::from(0x2001_0db8_0000_0000_0000_0000_0000_0000u128 + i as u128 * 7919);
                let vip = match t.s.vip {
                    IpAddr::V6(a) => a,
                    _ => unreachable!(),
                };
                (IpAddr::V6(src), ipv6(src, vip, L4::syn(sport, t.s.port), None, b"second chance"))
            } else {
                let src = Ipv4Addr::from(0xc000_0200 + i % 250 + (i / 250) * 256);
                let vip = match t.s.vip {
                    IpAddr::V4(a) => a,
                    _ => unreachable!(),
                };
                (IpAddr::V4(src), ipv4(None, src, vip, L4::syn(sport, t.s.port), &df(), b"second chance"))
            };
            let (slot, hash) = (t.slot(src, sport), t.hash(src, sport));
            let dest = t.owner(slot);
            let hops = t.hops_for(slot, dest);
            let what = format!("{name}: {src} port {sport} (slot {slot}, to {dest})");

            let (action, out) = dp.test_run(&frame).expect("run");
            assert_eq!(action, XDP_TX, "{what}");
            assert_eq!(outer_dst(&out), dest, "{what}: a SYN goes where the table says");
            assert_eq!(out, expected(&frame, dest, hash, &hops), "{what}: hop list {hops:?}");

            // The same facts read off the frame, field by field.
            let (l3, udp_at) = if dest.is_ipv4() { (14, 34) } else { (14, 54) };
            let each = if dest.is_ipv4() { 4 } else { 16 };
            let inner_len = frame.len() - 14;
            let extra = if hops.is_empty() { 0 } else { 8 + each * hops.len() };
            assert_eq!(u16::from_be_bytes([out[udp_at + 4], out[udp_at + 5]]) as usize, 8 + extra + inner_len, "{what}: UDP length");
            if dest.is_ipv4() {
                assert_eq!(u16::from_be_bytes([out[l3 + 2], out[l3 + 3]]) as usize, 20 + 8 + extra + inner_len, "{what}: IPv4 total length");
                assert_eq!(csum(&out[l3..l3 + 20]), 0, "{what}: outer IPv4 checksum");
            } else {
                assert_eq!(u16::from_be_bytes([out[l3 + 4], out[l3 + 5]]) as usize, 8 + extra + inner_len, "{what}: IPv6 payload length");
            }
            assert_eq!(out.len(), udp_at + 8 + extra + inner_len, "{what}: frame length");
            let g = &out[udp_at + 8..];
            if hops.is_empty() {
                bare += 1;
                assert_eq!(g[0] >> 6, 1, "{what}: no hops: GUE version 1");
                assert_eq!(&g[..inner_len], &frame[14..], "{what}: the inner packet right behind UDP");
            } else {
                v0 += 1;
                assert_eq!(g[0] >> 6, 0, "{what}: GUE version 0");
                assert_eq!(g[0] & 0x1f, ((4 + each * hops.len()) / 4) as u8, "{what}: Hlen");
                assert_eq!(g[1], if v6_clients { 41 } else { 4 }, "{what}: inner protocol");
                assert_eq!(&g[2..4], &[0, 0], "{what}: no GUE flags");
                assert_eq!(u16::from_be_bytes([g[4], g[5]]), if dest.is_ipv4() { 0 } else { HOPS_V6 }, "{what}: type");
                assert_eq!((g[6], g[7] as usize), (0, hops.len()), "{what}: next 0, count");
                assert_eq!(&g[extra..extra + inner_len], &frame[14..], "{what}: the inner packet behind the hops");
            }
            let before = t.owner_before(slot).expect("every slot had an owner");
            let prev_now = t.s.backends.iter().find(|b| b.address == before).map(|b| b.address);
            if before != dest {
                changed += 1;
                // The slot changed owner: the previous owner is the first hop (when it can
                // travel in this outer header).
                assert_eq!(t.hop0(slot), prev_now, "{what}: the table's first hop is the previous owner");
                if before.is_ipv4() == dest.is_ipv4() {
                    let got = if dest.is_ipv4() {
                        IpAddr::V4(Ipv4Addr::new(g[8], g[9], g[10], g[11]))
                    } else {
                        IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&g[8..24]).expect("16")))
                    };
                    assert_eq!(got, before, "{what}: hop[0] is the slot's previous owner");
                    assert!(g[7] >= 1, "{what}: count");
                } else {
                    assert!(!hops.contains(&before), "{what}: a previous owner of the other family is left out");
                }
            } else {
                kept += 1;
                assert_eq!(t.hop0(slot), None, "{what}: a slot that kept its owner has no previous owner to list");
            }

            // Without second chance: the same backend, GUE version 1, nothing else differs.
            let (action, out) = off.test_run(&frame).expect("run");
            assert_eq!(action, XDP_TX, "{what}: without second chance");
            assert_eq!(out, expected(&frame, dest, hash, &[]), "{what}: without second chance: GUE version 1");
        }
        println!("{name}: 400 flows, {changed} on slots that changed owner, {kept} on slots that did not; {v0} with hops, {bare} without");
        assert!(changed >= 40 && kept >= 40, "{name}: both kinds of slot exercised: {changed} changed, {kept} kept");
        if name == "mixed" {
            // Half the backends are of the other family than any one packet's outer header.
            assert!(v0 >= 50 && bare >= 50, "mixed: {v0} packets with hops, {bare} without (hops of the other family only)");
        } else {
            assert_eq!(v0, 400, "{name}: every slot has a runner-up or a previous owner");
        }
    }
}

/// A frame of a TCP segment with `flags` from `src`:`sport` to service `s`.
fn tcp_frame(s: &Service, src: Ipv4Addr, sport: u16, flags: u8) -> Vec<u8> {
    let vip = match s.vip {
        IpAddr::V4(a) => a,
        _ => panic!("IPv4 VIP"),
    };
    ipv4(None, src, vip, L4::Tcp { sport, dport: s.port, flags }, &df(), b"")
}

const ADOPT: &str = "\
services:
  - name: sc
    vip: 10.99.0.100
    port: 443
    hash: flow
    algorithm: maglev
    slots: 1009
    forward: gue
    gue_port: 6081
    second_chance: on
    backends: [{address: 10.1.0.41, name: c1}, {address: 10.1.0.42, name: c2}, {address: 10.1.0.43, name: c3}]
  - name: plain
    vip: 10.99.0.100
    port: 80
    hash: flow
    algorithm: maglev
    slots: 1009
    forward: gue
    gue_port: 6081
    backends: [{address: 10.1.0.51, name: p1}, {address: 10.1.0.52, name: p2}, {address: 10.1.0.53, name: p3}]
";

/// The first flow (src, sport) in a fixed sequence that satisfies `want`, none of `taken`.
fn find_flow(what: &str, taken: &[(Ipv4Addr, u16)], want: impl Fn(IpAddr, u16) -> bool) -> (Ipv4Addr, u16) {
    for i in 0..200_000u32 {
        let (src, sport) = (Ipv4Addr::from(0xc633_6400 + (i % 250)), 10_000 + (i / 250) as u16);
        if !taken.contains(&(src, sport)) && want(src.into(), sport) {
            return (src, sport);
        }
    }
    panic!("no flow {what}");
}

#[test]
fn root_a_flow_picked_up_in_mid_connection_is_tracked_to_its_previous_owner() {
    // A: three backends a service each; B adds a fourth (previous: A); C a fifth (previous: B).
    let a = pool(ADOPT);
    let b = with_previous(
        pool(&ADOPT
            .replace("{address: 10.1.0.43, name: c3}]", "{address: 10.1.0.43, name: c3}, {address: 10.1.0.44, name: c4}]")
            .replace("{address: 10.1.0.53, name: p3}]", "{address: 10.1.0.53, name: p3}, {address: 10.1.0.54, name: p4}]")),
        &a,
    );
    let c = with_previous(
        pool(&ADOPT
            .replace("{address: 10.1.0.43, name: c3}]", "{address: 10.1.0.43, name: c3}, {address: 10.1.0.44, name: c4}, {address: 10.1.0.45, name: c5}]")
            .replace("{address: 10.1.0.53, name: p3}]", "{address: 10.1.0.53, name: p3}, {address: 10.1.0.54, name: p4}, {address: 10.1.0.55, name: p5}]")),
        &b,
    );
    let addrs: Vec<IpAddr> = c.services.iter().flat_map(|s| s.backends.iter().map(|b| b.address)).collect();
    let (sa, sb, sc) = (Tables::of(&a, "sc"), Tables::of(&b, "sc"), Tables::of(&c, "sc"));
    let (pb, pc) = (Tables::of(&b, "plain"), Tables::of(&c, "plain"));
    let mut dp = balancer(&a, &addrs);
    let stat = |dp: &Balancer, s: types::lb_stat| dp.stat(s).expect("stat");
    let flows = |dp: &Balancer| dp.flow_count().expect("flows");

    // Sends one segment of service `t` and checks it went to `dest` carrying exactly the hop
    // list the tables give (none for a service without second chance).
    let send = |dp: &Balancer, t: &Tables, (src, sport): (Ipv4Addr, u16), flags: u8, dest: IpAddr, what: &str| {
        let f = tcp_frame(t.s, src, sport, flags);
        let slot = t.slot(src.into(), sport);
        let hops = if t.s.second_chance { t.hops_for(slot, dest) } else { Vec::new() };
        let (action, out) = dp.test_run(&f).expect("run");
        assert_eq!(action, XDP_TX, "{what}");
        assert_eq!(outer_dst(&out), dest, "{what}: sent to");
        assert_eq!(out, expected(&f, dest, t.hash(src.into(), sport), &hops), "{what}: the frame (hops {hops:?})");
        hops
    };

    // A flow tracked under A (its handshake), on a slot B moves: after B, it stays, and the
    // slot's owner in B leads its hop list (the flow entry sends it elsewhere).
    let tracked = find_flow("tracked, moved by B", &[], |s, p| sa.owner(sa.slot(s, p)) != sb.owner(sb.slot(s, p)));
    let t_slot = sa.slot(tracked.0.into(), tracked.1);
    let t_dest = sa.owner(t_slot);
    send(&dp, &sa, tracked, SYN, t_dest, "tracked flow's SYN under A");
    send(&dp, &sa, tracked, ACK, t_dest, "tracked flow's ACK under A");
    assert_eq!(flows(&dp), 1);
    dp.apply(&b).expect("apply B");
    let hops = send(&dp, &sb, tracked, ACK, t_dest, "tracked flow under B");
    assert_eq!(hops.first(), Some(&sb.owner(t_slot)), "the table's owner first: the flow entry sent the packet elsewhere");

    // An ACK of a flow this node never saw, on a slot B took from another backend: adopted,
    // sent to the slot's previous owner (hop[0]), the table's owner first in its hop list.
    let moved = |s: IpAddr, p: u16| {
        let slot = sb.slot(s, p);
        sb.owner_before(slot) != Some(sb.owner(slot))
    };
    let x = find_flow("adopted under B, moved again by C", &[tracked], |s, p| {
        let slot = sb.slot(s, p);
        let (o_a, o_b, o_c) = (sb.owner_before(slot).expect("owner"), sb.owner(slot), sc.owner(slot));
        o_a != o_b && o_c != o_b && o_c != o_a && sc.hop0(slot) == Some(o_b)
    });
    let x_slot = sb.slot(x.0.into(), x.1);
    let adopted = sb.owner_before(x_slot).expect("previous owner");
    assert_eq!(sb.hop0(x_slot), Some(adopted), "the table's first hop is the previous owner");
    let (pending, new) = (stat(&dp, types::lb_stat::LB_CT_PENDING), flows(&dp));
    let hops = send(&dp, &sb, x, ACK, adopted, "a mid-connection ACK on a moved slot");
    assert_eq!(hops.first(), Some(&sb.owner(x_slot)), "the table's owner leads the hop list");
    assert_eq!(stat(&dp, types::lb_stat::LB_CT_PENDING) - pending, 1, "adopted like a first packet: half-open");
    assert_eq!(flows(&dp), new, "not established by one packet (the flood guard holds)");
    send(&dp, &sb, x, ACK | 0x08, adopted, "its next packet");
    assert_eq!(flows(&dp), new + 1, "the next packet establishes it");

    // A SYN on a moved slot is a new connection: the table's owner, the previous one a hop.
    let syn = find_flow("new connection on a moved slot", &[tracked, x], moved);
    let s_slot = sb.slot(syn.0.into(), syn.1);
    let hops = send(&dp, &sb, syn, SYN, sb.owner(s_slot), "a SYN on a moved slot");
    assert_eq!(hops.first().copied(), sb.owner_before(s_slot), "the previous owner is hop[0]");

    // An RST with no entry is not adopted: the table's backend (not hop[0]), nothing recorded.
    let rst = find_flow("reset on a moved slot", &[tracked, x, syn], moved);
    let r_slot = sb.slot(rst.0.into(), rst.1);
    let (pending, new) = (stat(&dp, types::lb_stat::LB_CT_PENDING), flows(&dp));
    for flags in [RST, RST | ACK, RST] {
        send(&dp, &sb, rst, flags, sb.owner(r_slot), "an RST with no entry");
    }
    assert_eq!(stat(&dp, types::lb_stat::LB_CT_PENDING), pending, "an RST records nothing");
    assert_eq!(flows(&dp), new, "nor establishes anything");

    // The previous owner is adopted to only while lb can reach it (alive, its MAC known).
    let w = find_flow("adopted to a backend without a MAC", &[tracked, x, syn, rst], |s, p| {
        moved(s, p) && sb.owner_before(sb.slot(s, p)) != Some(adopted) && sb.owner_before(sb.slot(s, p)) != Some(t_dest)
    });
    let w_slot = sb.slot(w.0.into(), w.1);
    let gone = sb.owner_before(w_slot).expect("owner");
    dp.set_mac(gone, None).expect("forget");
    send(&dp, &sb, w, ACK, sb.owner(w_slot), "an ACK whose previous owner has no MAC: the table's backend");
    dp.set_mac(gone, Some(mac_of(gone))).expect("mac");

    // Without second chance: a mid-connection ACK is adopted to the table's backend.
    let p = find_flow("plain, moved by C", &[], |s, p| pb.owner(pb.slot(s, p)) != pc.owner(pc.slot(s, p)));
    let p_dest = pb.owner(pb.slot(p.0.into(), p.1));
    let new = flows(&dp);
    send(&dp, &pb, p, ACK, p_dest, "plain: a mid-connection ACK");
    assert_eq!(flows(&dp), new, "half-open");
    send(&dp, &pb, p, ACK, p_dest, "plain: its next packet");
    assert_eq!(flows(&dp), new + 1, "established");
    // ... and an RST is not.
    let pr = find_flow("plain reset, moved by C", &[p], |s, p| pb.owner(pb.slot(s, p)) != pc.owner(pc.slot(s, p)));
    let pr_dest = pb.owner(pb.slot(pr.0.into(), pr.1));
    for flags in [RST, RST] {
        send(&dp, &pb, pr, flags, pr_dest, "plain: an RST with no entry");
    }
    assert_eq!(flows(&dp), new + 1, "an RST establishes nothing");

    // C moves the adopted flows' slots again.
    dp.apply(&c).expect("apply C");
    assert_ne!(sc.owner(x_slot), adopted, "C's table sends the adopted flow's slot elsewhere");
    assert_ne!(sc.hop0(x_slot), Some(adopted), "and C's first hop is not the adopted backend either");
    let hops = send(&dp, &sc, x, ACK, adopted, "the adopted flow after C");
    assert_eq!(hops.first(), Some(&sc.owner(x_slot)), "C's table owner leads its hop list");
    assert!(hops.contains(&sb.owner(x_slot)), "and C's previous owner (B's) follows it");
    send(&dp, &sc, tracked, ACK, t_dest, "the flow tracked since A, after C");
    send(&dp, &pc, p, ACK, p_dest, "plain: the adopted flow keeps its backend after C (the second hole)");
    // Controls: an untracked flow on such a slot follows C's table, and so does the flow
    // whose RSTs were not adopted.
    let fresh = find_flow("plain, never seen, moved by C", &[p, pr], |s, q| pb.owner(pb.slot(s, q)) != pc.owner(pc.slot(s, q)));
    send(&dp, &pc, fresh, ACK, pc.owner(pc.slot(fresh.0.into(), fresh.1)), "plain: a flow never seen follows C");
    send(&dp, &pc, pr, ACK, pc.owner(pc.slot(pr.0.into(), pr.1)), "plain: the reset flow was never pinned: it follows C");
}

// ---------------------------------------------------------------------------------------------
// The backend side.

/// Addresses of the backend's namespace: lb's outer sources, this host (on veth0), the next
/// hop (another backend behind veth0, with a permanent neighbour entry), the VIPs and a local
/// client (on lo).
const LB4: &str = "10.96.0.2";
const LB6: &str = "fd96::2";
const HERE4: &str = "10.97.0.11";
const HERE6: &str = "fd97::11";
const HOP4: &str = "10.97.0.12";
const HOP6: &str = "fd97::12";
const HOP4B: &str = "10.97.0.13";
const NO_NEIGH4: &str = "10.97.0.99";
const OTHER_LINK4: &str = "10.94.0.2";
const VIP4: &str = "10.98.0.100";
const VIP6: &str = "fd98::100";
const CLIENT4: &str = "10.98.0.7";
const CLIENT6: &str = "fd98::7";
const VETH_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x11];
const NEIGH_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const PORT: u16 = 8080;
const COOKIE_PORT: u16 = 8081;
/// The UDP checksum the test frames carry: sent on, it must be zero.
const UDP_CSUM_IN: u16 = 0x5a5a;

/// A command run to completion within 10 s (in this thread's network namespace).
fn run(args: &[&str]) -> String {
    let out = std::process::Command::new("timeout").arg("10").args(args).output().expect("spawn");
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The links this test makes in its namespace, deleted when dropped (a failing test
/// included); the namespace itself goes when its thread ends.
struct Links;

impl Drop for Links {
    fn drop(&mut self) {
        for link in ["veth0", "veth2"] {
            let _ = std::process::Command::new("timeout").args(["10", "ip", "link", "del", link]).status();
        }
    }
}

/// An encapsulated frame from `src` to `dst` (same family), GUE to GUE_PORT carrying `inner`,
/// with hop list `hops` (version 0, `next`) or none (version 1), outer TTL or hop limit `ttl`.
fn gue_frame(src: IpAddr, dst: IpAddr, ttl: u8, hops: &[IpAddr], next: u8, inner: &[u8]) -> Vec<u8> {
    let gue = gue_header(src.is_ipv4(), inner[0] >> 4 == 4, hops, next);
    let mut udp = Vec::new();
    udp.extend_from_slice(&0xc123u16.to_be_bytes());
    udp.extend_from_slice(&GUE_PORT.to_be_bytes());
    udp.extend_from_slice(&((8 + gue.len() + inner.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&UDP_CSUM_IN.to_be_bytes());
    udp.extend_from_slice(&gue);
    udp.extend_from_slice(inner);
    let mut f = Vec::new();
    f.extend_from_slice(&VETH_MAC);
    f.extend_from_slice(&CLIENT_MAC);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&0x0800u16.to_be_bytes());
            let mut h = vec![0x45, 0];
            h.extend_from_slice(&((20 + udp.len()) as u16).to_be_bytes());
            h.extend_from_slice(&[0x43, 0x21, 0x40, 0, ttl, 17, 0, 0]);
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            let c = csum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&h);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&0x86DDu16.to_be_bytes());
            f.extend_from_slice(&0x6001_2345u32.to_be_bytes());
            f.extend_from_slice(&(udp.len() as u16).to_be_bytes());
            f.extend_from_slice(&[17, ttl]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        _ => panic!("outer addresses of two families"),
    }
    f.extend_from_slice(&udp);
    f
}

/// What the backend must send on for `input` (gue_frame with `hops`, index `next`): the outer
/// header from the address it came to on to hops[next], TTL less one, the index past it, the
/// UDP checksum zero, from veth0's MAC to the neighbour's; the rest unchanged.
fn sent_on(input: &[u8], hops: &[IpAddr], next: u8) -> Vec<u8> {
    let mut f = input.to_vec();
    f[0..6].copy_from_slice(&NEIGH_MAC);
    f[6..12].copy_from_slice(&VETH_MAC);
    let hop = hops[next as usize];
    let udp = if input[12..14] == [0x08, 0] {
        let here: [u8; 4] = f[30..34].try_into().expect("4");
        f[26..30].copy_from_slice(&here);
        match hop {
            IpAddr::V4(a) => f[30..34].copy_from_slice(&a.octets()),
            _ => panic!("family"),
        }
        f[22] -= 1;
        f[24..26].copy_from_slice(&[0, 0]);
        let c = csum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        34
    } else {
        let here: [u8; 16] = f[38..54].try_into().expect("16");
        f[22..38].copy_from_slice(&here);
        match hop {
            IpAddr::V6(a) => f[38..54].copy_from_slice(&a.octets()),
            _ => panic!("family"),
        }
        f[21] -= 1;
        54
    };
    f[udp + 6..udp + 8].copy_from_slice(&[0, 0]);
    f[udp + 8 + 6] = next + 1;
    f
}

/// What the stack must get for an encapsulated `input` carrying `inner`: the outer frame's
/// MACs, the inner family's ethertype, the inner packet.
fn decapsulated(input: &[u8], inner: &[u8]) -> Vec<u8> {
    let mut f = input[..12].to_vec();
    f.extend_from_slice(&(if inner[0] >> 4 == 4 { 0x0800u16 } else { 0x86DD }).to_be_bytes());
    f.extend_from_slice(inner);
    f
}

fn counters(de: &Decap) -> DecapCounters {
    de.counters().expect("counters")
}

/// The counters that moved between two readings, by name.
fn moved(a: &DecapCounters, b: &DecapCounters) -> Vec<(&'static str, u64)> {
    [
        ("decapsulated", b.decapsulated - a.decapsulated),
        ("passed", b.passed - a.passed),
        ("malformed", b.malformed - a.malformed),
        ("not_allowed", b.not_allowed - a.not_allowed),
        ("not_local", b.not_local - a.not_local),
        ("ce_not_ect", b.ce_not_ect - a.ce_not_ect),
        ("ecn_anomaly", b.ecn_anomaly - a.ecn_anomaly),
        ("hop_local", b.hop_local - a.hop_local),
        ("sent_on", b.sent_on - a.sent_on),
        ("exhausted", b.exhausted - a.exhausted),
        ("no_route", b.no_route - a.no_route),
        ("hop_refused", b.hop_refused - a.hop_refused),
    ]
    .into_iter()
    .filter(|m| m.1 != 0)
    .collect()
}

/// Runs `f` through `de`: it must end with `action` and frame `out` (None: not checked), moving
/// exactly the counters `which` by one each.
fn check(de: &Decap, what: &str, f: &[u8], action: u32, out: Option<&[u8]>, which: &[&'static str]) -> Vec<u8> {
    let before = counters(de);
    // As if from veth0 (its receive queue, its namespace): a packet sent back out of it is XDP_TX.
    let veth0 = lb::dataplane::link::interface("veth0").expect("veth0").ifindex;
    let (a, got) = de.test_run_on(f, veth0).expect("decap");
    let after = counters(de);
    assert_eq!(a, action, "{what}: action (counters moved: {:?})", moved(&before, &after));
    if let Some(want) = out {
        assert_eq!(got, want, "{what}: the frame");
    }
    let mut want: Vec<(&str, u64)> = which.iter().map(|w| (*w, 1)).collect();
    let mut got_moved = moved(&before, &after);
    want.sort();
    got_moved.sort();
    assert_eq!(got_moved, want, "{what}: counters moved");
    got
}

/// The inner IP packet of a client segment (IPv4 with DF, or IPv6) with `flags`.
fn segment(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => ipv4(None, s, d, L4::Tcp { sport, dport, flags }, &df(), b"data")[14..].to_vec(),
        (IpAddr::V6(s), IpAddr::V6(d)) => ipv6(s, d, L4::Tcp { sport, dport, flags }, None, b"data")[14..].to_vec(),
        _ => panic!("two families"),
    }
}

/// An ICMP error from a router to `vip` about the TCP segment `vip`:`vport` sent to
/// `client`:`cport` (IPv4: destination unreachable, fragmentation needed; IPv6: packet too big),
/// quoting its IP header and first 8 bytes, as the IP packet lb forwards to the backend.
fn icmp_error(vip: IpAddr, vport: u16, client: IpAddr, cport: u16) -> Vec<u8> {
    let quoted = segment(vip, client, vport, cport, ACK);
    let head = if vip.is_ipv4() { 20 } else { 40 };
    let mut icmp = if vip.is_ipv4() { vec![3, 4, 0, 0, 0, 0, 0x05, 0x00] } else { vec![2, 0, 0, 0, 0, 0, 0x05, 0x00] };
    icmp.extend_from_slice(&quoted[..head + 8]);
    match vip {
        IpAddr::V4(v) => {
            let c = csum(&icmp);
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 1, 0, 0, 198, 51, 100, 1];
            ip[2..4].copy_from_slice(&((20 + icmp.len()) as u16).to_be_bytes());
            ip.extend_from_slice(&v.octets());
            let c = csum(&ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            ip.extend_from_slice(&icmp);
            ip
        }
        IpAddr::V6(v) => {
            // The ICMPv6 checksum is left 0: neither lb nor lb decap reads it.
            let mut ip = vec![0x60, 0, 0, 0, 0, 0, 58, 64];
            ip[4..6].copy_from_slice(&(icmp.len() as u16).to_be_bytes());
            ip.extend_from_slice(&"2001:db8:ff::1".parse::<Ipv6Addr>().expect("address").octets());
            ip.extend_from_slice(&v.octets());
            ip.extend_from_slice(&icmp);
            ip
        }
    }
}

/// A TCP socket of `local`'s family bound to `local` (port 0) and connected to `to`.
fn connect_from(local: IpAddr, to: std::net::SocketAddr) -> std::net::TcpStream {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6};
    let fam = if local.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let fd = socket(fam, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).expect("socket");
    match (local, to) {
        (IpAddr::V4(l), std::net::SocketAddr::V4(t)) => {
            bind(fd.as_raw_fd(), &SockaddrIn::from(std::net::SocketAddrV4::new(l, 0))).expect("bind");
            connect(fd.as_raw_fd(), &SockaddrIn::from(t)).expect("connect");
        }
        (IpAddr::V6(l), std::net::SocketAddr::V6(t)) => {
            bind(fd.as_raw_fd(), &SockaddrIn6::from(std::net::SocketAddrV6::new(l, 0, 0, 0))).expect("bind");
            connect(fd.as_raw_fd(), &SockaddrIn6::from(t)).expect("connect");
        }
        _ => panic!("two families"),
    }
    std::net::TcpStream::from(fd)
}

/// Accepts one connection within 5 s.
fn accept(l: &std::net::TcpListener) -> std::net::TcpStream {
    l.set_nonblocking(true).expect("nonblocking");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).expect("blocking");
                return s;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Closes `s` with an RST (SO_LINGER 0): no socket, not even TIME_WAIT, is left for its tuple.
fn abort(s: std::net::TcpStream) {
    let l = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on an open socket with a linger struct of the size given.
    let rc = unsafe {
        libc::setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, &l as *const _ as *const libc::c_void, std::mem::size_of::<libc::linger>() as u32)
    };
    assert_eq!(rc, 0, "SO_LINGER");
    drop(s);
}

/// A packet socket on lo (ifindex 1) seeing every packet as its IP packet (SOCK_DGRAM).
fn capture_lo() -> OwnedFd {
    // SAFETY: plain socket calls with valid arguments; the fd is owned from here on.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, (libc::ETH_P_ALL as u16).to_be() as i32);
        assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(fd);
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = 1;
        let rc = libc::bind(fd.as_raw_fd(), &sll as *const _ as *const libc::sockaddr, std::mem::size_of::<libc::sockaddr_ll>() as u32);
        assert_eq!(rc, 0, "bind to lo: {}", std::io::Error::last_os_error());
        let tv = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv as *const _ as *const libc::c_void, std::mem::size_of::<libc::timeval>() as u32);
        fd
    }
}

/// The first packet `fd` sees within 5 s that `want` accepts.
fn captured(fd: &OwnedFd, want: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = vec![0u8; 65536];
    while Instant::now() < deadline {
        // SAFETY: recv into a buffer of the length given.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n > 0 && want(&buf[..n as usize]) {
            return buf[..n as usize].to_vec();
        }
    }
    panic!("no such packet on lo within 5 s");
}

/// The TCP header of an IP packet (no IPv6 extension headers) and its flags.
fn tcp_of(p: &[u8]) -> Option<(&[u8], u8)> {
    let (proto, at) = match p[0] >> 4 {
        4 => (p[9], (p[0] & 0xf) as usize * 4),
        6 => (p[6], 40),
        _ => return None,
    };
    (proto == 6 && p.len() >= at + 20).then(|| (&p[at..], p[at + 13]))
}

/// The handshake-completing ACK of a real connection from `client` to `vip`:COOKIE_PORT, whose
/// server side (answered with a SYN cookie: tcp_syncookies=2) is then aborted, so that no
/// socket but the listener's is left for its tuple.
fn cookie_ack(listener: &std::net::TcpListener, client: IpAddr, vip: IpAddr) -> Vec<u8> {
    let cap = capture_lo();
    let c = connect_from(client, std::net::SocketAddr::new(vip, COOKIE_PORT));
    let cport = c.local_addr().expect("local").port();
    let ack = captured(&cap, |p| match tcp_of(p) {
        Some((t, flags)) => u16::from_be_bytes([t[0], t[1]]) == cport && u16::from_be_bytes([t[2], t[3]]) == COOKIE_PORT && flags == ACK,
        None => false,
    });
    let server = accept(listener);
    abort(server);
    drop(c);
    ack
}

/// `p` (an IP packet with TCP) with its acknowledgement number plus one. A SYN cookie's low bits
/// carry the index of its MSS in a table of four; over lo (MSS 65483) the index is the last, so
/// one more is no cookie at all. (Over a path whose MSS gives a lower index, ack_seq + 1 would
/// still check out, as a cookie of the next larger MSS: that is the kernel's format.)
fn ack_plus_one(p: &[u8]) -> Vec<u8> {
    let mut p = p.to_vec();
    let at = if p[0] >> 4 == 4 { (p[0] & 0xf) as usize * 4 } else { 40 };
    let n = u32::from_be_bytes(p[at + 8..at + 12].try_into().expect("4")).wrapping_add(1);
    p[at + 8..at + 12].copy_from_slice(&n.to_be_bytes());
    p
}

/// The backend side, on this thread, in a network namespace of its own.
fn backend_side() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare a network namespace");
    let _links = Links;
    run(&["ip", "link", "set", "lo", "up"]);
    run(&["ip", "link", "add", "veth0", "address", "02:00:00:00:00:11", "type", "veth", "peer", "name", "veth1"]);
    run(&["ip", "addr", "add", &format!("{HERE4}/24"), "dev", "veth0"]);
    run(&["ip", "addr", "add", &format!("{HERE6}/64"), "dev", "veth0", "nodad"]);
    run(&["ip", "link", "set", "veth0", "up"]);
    // veth1 stays silent (no addresses, no IPv6 autoconfiguration): nothing but the test's own
    // runs reaches the program attached to veth0, whose counters the checks compare exactly.
    run(&["sysctl", "-qw", "net.ipv6.conf.veth1.disable_ipv6=1"]);
    run(&["ip", "link", "set", "veth1", "up"]);
    for a in [VIP4, CLIENT4] {
        run(&["ip", "addr", "add", &format!("{a}/32"), "dev", "lo"]);
    }
    for a in [VIP6, CLIENT6] {
        run(&["ip", "addr", "add", &format!("{a}/128"), "dev", "lo"]);
    }
    for h in [HOP4, HOP4B, HOP6] {
        run(&["ip", "neigh", "add", h, "lladdr", "02:00:00:00:00:02", "nud", "permanent", "dev", "veth0"]);
    }
    // Another interface, with a resolved neighbour: a hop whose route leaves by it.
    run(&["ip", "link", "add", "veth2", "type", "veth", "peer", "name", "veth3"]);
    run(&["ip", "addr", "add", "10.94.0.1/24", "dev", "veth2"]);
    run(&["ip", "link", "set", "veth2", "up"]);
    run(&["ip", "link", "set", "veth3", "up"]);
    run(&["ip", "neigh", "add", OTHER_LINK4, "lladdr", "02:00:00:00:00:03", "nud", "permanent", "dev", "veth2"]);

    let load = |second_chance: bool| {
        let mut de = Decap::load(GUE_PORT, second_chance).expect("load decap");
        // The load balancers, the backends (the hops) and a prefix with no route.
        let allow = [(ip("10.96.0.0"), 24), (ip(LB6), 128), (ip("10.97.0.0"), 24), (ip("fd97::"), 64), (ip("10.95.0.0"), 16), (ip("10.94.0.0"), 24)];
        de.allow_from(&allow).expect("allow");
        de.set_local(&host_addresses().expect("addresses")).expect("local");
        de
    };
    let de = load(true);
    // An XDP program on veth0 registers its receive queue, which a test run "arriving" there needs.
    let veth0 = lb::dataplane::link::interface("veth0").expect("veth0").ifindex;
    let _attached = lb::dataplane::link::attach(de.program_fd(), veth0, lb::dataplane::link::XdpMode::Native).expect("attach to veth0");

    let (lb4, here4, hop4, hop4b) = (ip(LB4), ip(HERE4), ip(HOP4), ip(HOP4B));
    let (lb6, here6, hop6) = (ip(LB6), ip(HERE6), ip(HOP6));
    let (vip4, vip6, client4, client6) = (ip(VIP4), ip(VIP6), ip(CLIENT4), ip(CLIENT6));
    let stranger4: IpAddr = ip("192.0.2.50");

    // Listeners and one established connection of each family.
    let l4 = std::net::TcpListener::bind((vip4, PORT)).expect("listen");
    let l6 = std::net::TcpListener::bind((vip6, PORT)).expect("listen");
    let c4 = connect_from(client4, (vip4, PORT).into());
    let c6 = connect_from(client6, (vip6, PORT).into());
    let s4 = accept(&l4);
    let s6 = accept(&l6);
    let (cport4, cport6) = (c4.local_addr().expect("local").port(), c6.local_addr().expect("local").port());

    // An ACK for no connection while the FIB helper refuses: it routes only "from" a device
    // with forwarding on (the program asks as from the loopback, which BPF_PROG_TEST_RUN's
    // packets also arrive on), and forwarding is off in a new namespace. Delivered here.
    let unknown4 = segment(stranger4, vip4, 40_000, PORT, ACK);
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &unknown4);
    check(&de, "IPv4, forwarding off", &f, XDP_PASS, Some(&decapsulated(&f, &unknown4)), &["no_route", "decapsulated"]);
    // What `lb decap --second-chance` turns on: the loopback's forwarding, not veth0's.
    run(&["sysctl", "-qw", "net.ipv4.conf.lo.forwarding=1", "net.ipv6.conf.lo.forwarding=1"]);
    assert_eq!(run(&["sysctl", "-n", "net.ipv4.conf.veth0.forwarding"]).trim(), "0", "the interface stays a host's");

    // (a) A SYN to the listener: a new connection, here.
    let syn = segment(stranger4, vip4, 40_001, PORT, SYN);
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &syn);
    check(&de, "a SYN", &f, XDP_PASS, Some(&decapsulated(&f, &syn)), &["hop_local", "decapsulated"]);

    // (b) An ACK of the established connection: here.
    for (what, lb, here, hop, inner) in [
        ("IPv4: an ACK of an established connection", lb4, here4, hop4, segment(client4, vip4, cport4, PORT, ACK)),
        ("IPv6: an ACK of an established connection", lb6, here6, hop6, segment(client6, vip6, cport6, PORT, ACK)),
    ] {
        let f = gue_frame(lb, here, 64, &[hop], 0, &inner);
        check(&de, what, &f, XDP_PASS, Some(&decapsulated(&f, &inner)), &["hop_local", "decapsulated"]);
    }

    // ICMP errors (path MTU discovery) about a connection go where the connection is: about one
    // of this host's, here; about one it does not have, on to the next hop, like its packets.
    for (what, lb, here, hop, vip, client, cport) in [
        ("IPv4: frag needed about a connection here", lb4, here4, hop4, vip4, client4, cport4),
        ("IPv6: too big about a connection here", lb6, here6, hop6, vip6, client6, cport6),
    ] {
        let inner = icmp_error(vip, PORT, client, cport);
        let f = gue_frame(lb, here, 64, &[hop], 0, &inner);
        check(&de, what, &f, XDP_PASS, Some(&decapsulated(&f, &inner)), &["hop_local", "decapsulated"]);
        let inner = icmp_error(vip, PORT, client, cport.wrapping_add(1));
        let f = gue_frame(lb, here, 64, &[hop], 0, &inner);
        check(&de, &format!("{what}: another client port"), &f, XDP_TX, Some(&sent_on(&f, &[hop], 0)), &["sent_on"]);
    }

    // (c) An ACK of a tuple this host has no socket for, to the listener's port: sent on,
    // exactly as the format says, through veth0 (not the device it came in on: a redirect).
    let unknown6 = segment(ip("2001:db8::50"), vip6, 40_000, PORT, ACK);
    let cases = [
        ("IPv4 in IPv4: an ACK of no connection", lb4, here4, vec![hop4], unknown4.clone()),
        ("IPv4 in IPv4, two hops", lb4, here4, vec![hop4, hop4b], unknown4.clone()),
        ("IPv6 in IPv6: an ACK of no connection", lb6, here6, vec![hop6], unknown6.clone()),
        ("IPv4 in IPv6: an ACK of no connection", lb6, here6, vec![hop6], unknown4.clone()),
    ];
    for (what, lb, here, hops, inner) in &cases {
        let f = gue_frame(*lb, *here, 64, hops, 0, inner);
        let out = check(&de, what, &f, XDP_TX, Some(&sent_on(&f, hops, 0)), &["sent_on"]);
        // The same, said field by field.
        if here.is_ipv4() {
            assert_eq!(&out[26..30], &f[30..34], "{what}: from the address it came to");
            assert_eq!(outer_dst(&out), hops[0], "{what}: to the hop");
            assert_eq!(out[22], 63, "{what}: TTL one less");
            assert_eq!(csum(&out[14..34]), 0, "{what}: IPv4 header checksum");
            assert_eq!((out[34 + 6], out[34 + 7]), (0, 0), "{what}: UDP checksum zero");
            assert_eq!((out[42 + 6], out[42 + 7] as usize), (1, hops.len()), "{what}: next 1, count");
            assert_eq!(&out[out.len() - inner.len()..], &inner[..], "{what}: the inner packet unchanged");
        } else {
            assert_eq!(&out[22..38], &f[38..54], "{what}: from the address it came to");
            assert_eq!(outer_dst(&out), hops[0], "{what}: to the hop");
            assert_eq!(out[21], 63, "{what}: hop limit one less");
            assert_eq!(out[62 + 6], 1, "{what}: next 1");
        }
        assert_eq!(&out[0..6], &NEIGH_MAC, "{what}: to the neighbour's MAC");
        assert_eq!(&out[6..12], &VETH_MAC, "{what}: from veth0's");
    }
    // The second hop of a list whose first was tried: on to it.
    let f = gue_frame(lb4, here4, 64, &[hop4, hop4b], 1, &unknown4);
    check(&de, "the second hop", &f, XDP_TX, Some(&sent_on(&f, &[hop4, hop4b], 1)), &["sent_on"]);
    // Control for (b): the established connection aborted, its ACK is sent on too.
    abort(s4);
    drop(c4);
    let inner = segment(client4, vip4, cport4, PORT, ACK);
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &inner);
    check(&de, "an ACK of a connection aborted here", &f, XDP_TX, Some(&sent_on(&f, &[hop4], 0)), &["sent_on"]);
    // ... and an ACK to a port nobody listens on.
    let inner = segment(stranger4, vip4, 40_002, 9, ACK);
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &inner);
    check(&de, "an ACK to a closed port", &f, XDP_TX, Some(&sent_on(&f, &[hop4], 0)), &["sent_on"]);

    // (d) The list used up, the next hop this host, the TTL at its end: delivered here.
    for (what, ttl, hops, next) in [
        ("next == count", 64u8, vec![hop4], 1u8),
        ("next == count, two hops", 64, vec![hop4, hop4b], 2),
        ("the next hop is this host", 64, vec![here4], 0),
        ("TTL 1", 1, vec![hop4], 0),
    ] {
        let f = gue_frame(lb4, here4, ttl, &hops, next, &unknown4);
        check(&de, what, &f, XDP_PASS, Some(&decapsulated(&f, &unknown4)), &["exhausted", "decapsulated"]);
    }
    // No route to the hop, no neighbour entry for it, or a route by another interface (which
    // XDP_TX cannot take): delivered here.
    for (what, hop) in [
        ("no route to the hop", ip("10.95.0.9")),
        ("no neighbour for the hop", ip(NO_NEIGH4)),
        ("a hop behind another interface", ip(OTHER_LINK4)),
    ] {
        let f = gue_frame(lb4, here4, 64, &[hop], 0, &unknown4);
        check(&de, what, &f, XDP_PASS, Some(&decapsulated(&f, &unknown4)), &["no_route", "decapsulated"]);
    }
    // A frame that came tagged would go back out with its tag, onto the VLAN it came from,
    // whatever the route said: delivered here.
    let f = tagged(&gue_frame(lb4, here4, 64, &[hop4], 0, &unknown4), 7);
    check(&de, "a frame with a VLAN tag", &f, XDP_PASS, None, &["no_route", "decapsulated"]);
    // A hop outside the allow-list: never sent to, whoever wrote the list (else any host allowed
    // to send GUE here could have this one send packets anywhere, from its address).
    for (what, hop) in [("a hop outside the allow-list", ip("203.0.113.9")), ("the same, IPv6", ip("2001:db8:99::9"))] {
        let (lb, here, inner) = if hop.is_ipv4() { (lb4, here4, &unknown4) } else { (lb6, here6, &unknown6) };
        let f = gue_frame(lb, here, 64, &[hop], 0, inner);
        check(&de, what, &f, XDP_PASS, Some(&decapsulated(&f, inner)), &["hop_refused", "decapsulated"]);
    }
    // An inner IPv4 fragment: whatever its bytes say, its ports are not there to look up.
    let mut frag = unknown4.clone();
    frag[6] |= 0x20; // more fragments
    let c = csum(&{
        let mut h = frag[..20].to_vec();
        h[10] = 0;
        h[11] = 0;
        h
    });
    frag[10..12].copy_from_slice(&c.to_be_bytes());
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &frag);
    check(&de, "an inner first fragment", &f, XDP_PASS, Some(&decapsulated(&f, &frag)), &["hop_local", "decapsulated"]);

    // (e) A hop list from a source outside the allow-list: dropped, never sent on.
    for (what, src, here, hop, inner) in [
        ("IPv4 from outside the allow-list", ip("10.96.1.2"), here4, hop4, &unknown4),
        ("IPv6 from outside the allow-list", ip("fd96::3"), here6, hop6, &unknown6),
    ] {
        let f = gue_frame(src, here, 64, &[hop], 0, inner);
        check(&de, what, &f, XDP_DROP, None, &["not_allowed"]);
    }

    // (f) Not TCP: nothing to look for, here.
    let udp = ipv4(None, v4("192.0.2.50"), v4(VIP4), L4::Udp { sport: 5353, dport: PORT }, &df(), b"udp")[14..].to_vec();
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &udp);
    check(&de, "a UDP inner packet", &f, XDP_PASS, Some(&decapsulated(&f, &udp)), &["hop_local", "decapsulated"]);

    // A block that is not a valid hop list (its count disagrees with Hlen; IPv6 hops in an
    // IPv4 outer header): plain GUE version 0, decapsulated without a second look.
    let mut f = gue_frame(lb4, here4, 64, &[hop4], 0, &unknown4);
    f[42 + 7] = 2;
    check(&de, "a count that disagrees with Hlen", &f, XDP_PASS, Some(&decapsulated(&f, &unknown4)), &["decapsulated"]);
    let mut f = gue_frame(lb4, here4, 64, &[hop4], 0, &unknown4);
    f[42 + 4..42 + 6].copy_from_slice(&HOPS_V6.to_be_bytes());
    check(&de, "an IPv6 list type in an IPv4 outer header", &f, XDP_PASS, Some(&decapsulated(&f, &unknown4)), &["decapsulated"]);
    // No hop list (GUE version 1): decapsulated as ever.
    let f = gue_frame(lb4, here4, 64, &[], 0, &unknown4);
    check(&de, "GUE version 1", &f, XDP_PASS, Some(&decapsulated(&f, &unknown4)), &["decapsulated"]);

    // (g) Control: the frames of (c) with second chance off: decapsulated here.
    let plain = load(false);
    for (what, lb, here, hops, inner) in &cases {
        let f = gue_frame(*lb, *here, 64, hops, 0, inner);
        check(&plain, &format!("second chance off: {what}"), &f, XDP_PASS, Some(&decapsulated(&f, inner)), &["decapsulated"]);
    }

    // (h) SYN cookies: the ACK that completes a handshake answered with a cookie finds only the
    // listener, yet is this host's; the same ACK with another acknowledgement number is not.
    run(&["sysctl", "-qw", "net.ipv4.tcp_syncookies=2"]);
    let lc4 = std::net::TcpListener::bind((vip4, COOKIE_PORT)).expect("listen");
    let lc6 = std::net::TcpListener::bind((vip6, COOKIE_PORT)).expect("listen");
    for (what, lb, here, hop, listener, client, vip) in [("IPv4", lb4, here4, hop4, &lc4, client4, vip4), ("IPv6", lb6, here6, hop6, &lc6, client6, vip6)] {
        let ack = cookie_ack(listener, client, vip);
        let f = gue_frame(lb, here, 64, &[hop], 0, &ack);
        check(&de, &format!("{what}: a SYN cookie's ACK"), &f, XDP_PASS, Some(&decapsulated(&f, &ack)), &["hop_local", "decapsulated"]);
        let wrong = ack_plus_one(&ack);
        let f = gue_frame(lb, here, 64, &[hop], 0, &wrong);
        check(&de, &format!("{what}: the ACK with ack_seq + 1"), &f, XDP_TX, Some(&sent_on(&f, &[hop], 0)), &["sent_on"]);
    }

    drop((s6, c6, l4, l6, lc4, lc6));
}

#[test]
fn root_decap_gives_a_second_chance_only_to_packets_without_a_connection() {
    common::require_root();
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(backend_side);
        let _ = tx.send(());
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        panic!("the backend side did not finish within 60 s");
    }
    if let Err(e) = worker.join() {
        std::panic::resume_unwind(e);
    }
    println!("backend side: {:?}", started.elapsed());
}
