//! A small frame builder for packet fixtures: Ethernet (optionally 802.1Q-tagged), IPv4 (with
//! options and fragment fields), IPv6 (with extension headers and fragments), TCP, UDP, ICMP
//! and ARP, with correct lengths and IPv4 header checksums.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// XDP actions (the kernel's enum xdp_action), as BPF_PROG_TEST_RUN returns them.
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;

pub const IFMAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x99];

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum L4 {
    Tcp { sport: u16, dport: u16, flags: u8 },
    Udp { sport: u16, dport: u16 },
    IcmpEcho,
}

impl L4 {
    pub fn proto(&self) -> u8 {
        match self {
            L4::Tcp { .. } => 6,
            L4::Udp { .. } => 17,
            L4::IcmpEcho => 1,
        }
    }

    pub fn syn(sport: u16, dport: u16) -> L4 {
        L4::Tcp { sport, dport, flags: 0x02 }
    }

    fn bytes(&self, payload: &[u8]) -> Vec<u8> {
        let mut h = match *self {
            L4::Tcp { sport, dport, flags } => {
                let mut t = vec![0u8; 20];
                t[0..2].copy_from_slice(&sport.to_be_bytes());
                t[2..4].copy_from_slice(&dport.to_be_bytes());
                t[4..8].copy_from_slice(&1u32.to_be_bytes());
                t[12] = 5 << 4;
                t[13] = flags;
                t[14..16].copy_from_slice(&64240u16.to_be_bytes());
                t
            }
            L4::Udp { sport, dport } => {
                let mut u = vec![0u8; 8];
                u[0..2].copy_from_slice(&sport.to_be_bytes());
                u[2..4].copy_from_slice(&dport.to_be_bytes());
                u[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
                u
            }
            L4::IcmpEcho => vec![8, 0, 0, 0, 0, 1, 0, 1],
        };
        h.extend_from_slice(payload);
        h
    }
}

/// What goes in the IPv4 header besides addresses.
#[derive(Clone, Debug, Default)]
pub struct V4Opts {
    /// Options bytes (padded to a multiple of 4 with End-of-Options).
    pub options: Vec<u8>,
    /// More-fragments flag.
    pub more_fragments: bool,
    /// Fragment offset in 8-byte units; non-zero means no L4 header in this fragment.
    pub frag_offset: u16,
    /// Don't-fragment flag.
    pub dont_fragment: bool,
    /// The identification (None: 0x1234).
    pub id: Option<u16>,
}

pub fn csum(bytes: &[u8]) -> u16 {
    let mut s: u32 = bytes.chunks(2).map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

fn ethernet(vlan: Option<u16>, ethertype: u16) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&IFMAC);
    f.extend_from_slice(&CLIENT_MAC);
    if let Some(id) = vlan {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&id.to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// An IPv4 frame. A non-first fragment (`frag_offset > 0`) carries `payload` only.
pub fn ipv4(vlan: Option<u16>, src: Ipv4Addr, dst: Ipv4Addr, l4: L4, opts: &V4Opts, payload: &[u8]) -> Vec<u8> {
    let mut options = opts.options.clone();
    options.resize(options.len().div_ceil(4) * 4, 0);
    assert!(options.len() <= 40);
    let body = if opts.frag_offset > 0 { payload.to_vec() } else { l4.bytes(payload) };
    let hlen = 20 + options.len();
    let mut ip = vec![0x40 | (hlen / 4) as u8, 0];
    ip.extend_from_slice(&((hlen + body.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&opts.id.unwrap_or(0x1234).to_be_bytes());
    let frag = (if opts.more_fragments { 0x2000 } else { 0 }) | (if opts.dont_fragment { 0x4000 } else { 0 }) | opts.frag_offset;
    ip.extend_from_slice(&frag.to_be_bytes());
    ip.extend_from_slice(&[64, l4.proto(), 0, 0]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(&options);
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut f = ethernet(vlan, 0x0800);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&body);
    f
}

pub fn ipv4_simple(src: Ipv4Addr, dst: Ipv4Addr, l4: L4) -> Vec<u8> {
    ipv4(None, src, dst, l4, &V4Opts::default(), b"payload!")
}

/// An IPv6 frame; `next_header` overrides the L4 protocol (to put an extension header id there).
pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, l4: L4, next_header: Option<u8>, payload: &[u8]) -> Vec<u8> {
    let body = l4.bytes(payload);
    let mut f = ethernet(None, 0x86DD);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(body.len() as u16).to_be_bytes());
    f.push(next_header.unwrap_or(if l4 == L4::IcmpEcho { 58 } else { l4.proto() }));
    f.push(64);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&body);
    f
}

/// An IPv6 extension header, for [`ipv6_ext`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ext {
    /// Hop-by-hop options: 8 bytes of padding.
    HopByHop,
    /// Destination options: (units + 1) * 8 bytes of padding.
    DestOpts { units: u8 },
    /// A routing header of type `kind` with one address (24 bytes).
    Routing { kind: u8, segments_left: u8 },
    /// A fragment header: offset in 8-byte units, the M flag, the identification.
    Fragment { offset: u16, more: bool, id: u32 },
    /// An authentication header (24 bytes).
    Ah,
}

impl Ext {
    pub fn id(&self) -> u8 {
        match self {
            Ext::HopByHop => 0,
            Ext::DestOpts { .. } => 60,
            Ext::Routing { .. } => 43,
            Ext::Fragment { .. } => 44,
            Ext::Ah => 51,
        }
    }

    fn bytes(&self, next: u8) -> Vec<u8> {
        match *self {
            Ext::HopByHop => vec![next, 0, 1, 4, 0, 0, 0, 0],
            Ext::DestOpts { units } => {
                let len = (units as usize + 1) * 8;
                let mut b = vec![next, units, 1, (len - 4) as u8];
                b.resize(len, 0);
                b
            }
            Ext::Routing { kind, segments_left } => {
                let mut b = vec![next, 2, kind, segments_left, 0, 0, 0, 0];
                b.extend_from_slice(&v6("2001:db8::feed").octets());
                b
            }
            Ext::Fragment { offset, more, id } => {
                let mut b = vec![next, 0];
                b.extend_from_slice(&(offset << 3 | more as u16).to_be_bytes());
                b.extend_from_slice(&id.to_be_bytes());
                b
            }
            Ext::Ah => {
                let mut b = vec![next, 4, 0, 0];
                b.resize(24, 0x5a);
                b
            }
        }
    }
}

/// An IPv6 frame with extension headers `exts` in order before `l4`. Behind a fragment header
/// with a non-zero offset (a later fragment), the frame carries `payload` only.
pub fn ipv6_ext(src: Ipv6Addr, dst: Ipv6Addr, exts: &[Ext], l4: L4, payload: &[u8]) -> Vec<u8> {
    let later = exts.iter().any(|e| matches!(e, Ext::Fragment { offset, .. } if *offset > 0));
    let upper = if l4 == L4::IcmpEcho { 58 } else { l4.proto() };
    let mut body = Vec::new();
    for (i, e) in exts.iter().enumerate() {
        body.extend_from_slice(&e.bytes(exts.get(i + 1).map_or(upper, |n| n.id())));
    }
    if later {
        body.extend_from_slice(payload);
    } else if l4 == L4::IcmpEcho {
        body.extend_from_slice(&[128, 0, 0, 0, 0, 1, 0, 1]);
        body.extend_from_slice(payload);
    } else {
        body.extend_from_slice(&l4.bytes(payload));
    }
    let mut f = ethernet(None, 0x86DD);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(body.len() as u16).to_be_bytes());
    f.push(exts.first().map_or(upper, |e| e.id()));
    f.push(64);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&body);
    f
}

/// `frame` with its 802.1Q tag set to VLAN id `vid` (one is inserted when it has none).
pub fn tagged(frame: &[u8], vid: u16) -> Vec<u8> {
    let mut f = frame.to_vec();
    if f[12..14] != [0x81, 0x00] {
        f.splice(12..12, [0x81, 0x00, 0, 0]);
    }
    f[14..16].copy_from_slice(&vid.to_be_bytes());
    f
}

/// `frame` addressed to `mac` instead of lb's interface.
pub fn to_mac(frame: &[u8], mac: [u8; 6]) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[0..6].copy_from_slice(&mac);
    f
}

/// An ARP request "who has `target`? tell `sender`".
pub fn arp_request(sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&0x0806u16.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&sender.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target.octets());
    f
}

pub fn v4(s: &str) -> Ipv4Addr {
    s.parse().expect("IPv4 literal")
}

pub fn v6(s: &str) -> Ipv6Addr {
    s.parse().expect("IPv6 literal")
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("IP literal")
}

/// The hop list's type for IPv6 hops (lb.h, enum lb_gue_hops_layout): "L6".
pub const HOPS_V6: u16 = 0x4c36;

/// The GUE header lb puts behind the UDP header: nothing (version 1) without hops, else
/// version 0 with Hlen covering the hop list's block and its hops (of the outer family).
pub fn gue_header(outer_v4: bool, inner_v4: bool, hops: &[IpAddr], next: u8) -> Vec<u8> {
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

/// The outer destination of a frame lb sent.
pub fn outer_dst(out: &[u8]) -> IpAddr {
    match u16::from_be_bytes([out[12], out[13]]) {
        0x0800 => IpAddr::V4(Ipv4Addr::new(out[30], out[31], out[32], out[33])),
        0x86DD => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&out[38..54]).expect("16"))),
        t => panic!("ethertype {t:#x}"),
    }
}
