//! Second chance on lb's side, through the real program (BPF_PROG_TEST_RUN): GUE version 0 hop
//! lists, byte for byte against what the table builder says each slot's hops are; a flow picked
//! up in mid-connection tracked to its slot's previous owner (and, without second chance, to the
//! table's backend) so that a later change does not move it. The backends' side is
//! root_second_chance_backend.rs. Expected frames are built here from the documented format, not
//! by the code under test. Needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN):
//! `cargo test --test root_second_chance`.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::packet::*;
use lb::balancer::Balancer;
use lb::config::{parse_str, BackendState, Pool, Service};
use lb::dataplane::types;
use lb::flowhash::flow_hash;
use lb::table::{self, Table, EMPTY};

const SRC4: &str = "10.99.0.2";
const SRC6: &str = "fd00::2";
const GUE_PORT: u16 = 6081;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const RST: u8 = 0x04;

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
