//! Packet fixtures through the real XDP program and real maps, with BPF_PROG_TEST_RUN.
//! Needs root (CAP_BPF): run with `cargo test --test root_packets`.

use std::net::{IpAddr, Ipv4Addr};

use lb::dataplane::{types, Dataplane};
use lb::config::{parse_str, HashMode};
use lb::flowhash::flow_hash;
use lb::table;

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const IFMAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x99];

const POOL: &str = "services:
  - name: web
    vip: 10.99.0.100
    port: 80
    hash: flow
    backends:
      - {address: 10.99.0.11, name: b1}
      - {address: 10.99.0.12, name: b2}
      - {address: 10.99.0.13, name: b3, weight: 2}
";

fn backend_mac(addr: IpAddr) -> Option<[u8; 6]> {
    match addr {
        IpAddr::V4(a) => Some([0x02, 0xbb, 0, 0, 0, a.octets()[3]]),
        IpAddr::V6(a) => Some([0x02, 0xbb, 0, 0, 1, a.octets()[15]]),
    }
}

fn csum(bytes: &[u8]) -> u16 {
    let mut s: u32 = bytes.chunks(2).map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Ethernet + IPv4 + TCP SYN with 8 bytes of payload.
fn ipv4_tcp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&IFMAC);
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 6, 0, 0];
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let total = 20 + 20 + 8;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    let c = csum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x02;
    f.extend_from_slice(&tcp);
    f.extend_from_slice(b"payload!");
    f
}

fn setup() -> (Dataplane, lb::config::Pool) {
    assert!(nix::unistd::geteuid().is_root(), "root_packets tests need root (CAP_BPF)");
    let pool = parse_str("pool.yaml", POOL).unwrap();
    let mut dp = Dataplane::load().expect("load");
    dp.install(&pool, IFMAC, &backend_mac).expect("install");
    (dp, pool)
}

/// The backend the table says a flow goes to.
fn expected_backend(pool: &lb::config::Pool, src: Ipv4Addr, sport: u16) -> IpAddr {
    let s = &pool.services[0];
    let h = flow_hash(HashMode::Flow, src.into(), s.vip, sport, s.port, 6);
    let t = table::build_service(s);
    s.backends[t.owner((h % s.slots) as usize).unwrap()].address
}

#[test]
fn root_ipv4_tcp_syn_to_vip_goes_to_the_tables_backend() {
    let (dp, pool) = setup();
    for sport in [1000u16, 2000, 3000, 40000, 65535] {
        let src = Ipv4Addr::new(10, 99, 0, 1);
        let frame = ipv4_tcp(src, Ipv4Addr::new(10, 99, 0, 100), sport, 80);
        let (action, out) = dp.test_run(&frame).unwrap();
        assert_eq!(action, XDP_TX, "sport {sport}");
        let want = backend_mac(expected_backend(&pool, src, sport)).unwrap();
        assert_eq!(&out[0..6], &want, "sport {sport}: destination MAC");
        assert_eq!(&out[6..12], &IFMAC, "source MAC");
        assert_eq!(&out[12..], &frame[12..], "only the Ethernet addresses change");
    }
}

#[test]
fn root_other_port_and_other_address_pass_unchanged() {
    let (dp, _) = setup();
    for frame in [
        ipv4_tcp(Ipv4Addr::new(10, 99, 0, 1), Ipv4Addr::new(10, 99, 0, 100), 1234, 81),
        ipv4_tcp(Ipv4Addr::new(10, 99, 0, 1), Ipv4Addr::new(10, 99, 0, 101), 1234, 80),
    ] {
        let (action, out) = dp.test_run(&frame).unwrap();
        assert_eq!(action, XDP_PASS);
        assert_eq!(out, frame);
    }
}

#[test]
fn root_every_truncation_is_never_forwarded_and_counted() {
    let (dp, _) = setup();
    let frame = ipv4_tcp(Ipv4Addr::new(10, 99, 0, 1), Ipv4Addr::new(10, 99, 0, 100), 1234, 80);
    let before = dp.stat(types::lb_stat::LB_DROP_MALFORMED).unwrap();
    // BPF_PROG_TEST_RUN refuses XDP frames shorter than an Ethernet header, so start at 14.
    for len in 14..frame.len() {
        let (action, _) = dp.test_run(&frame[..len]).unwrap();
        assert_eq!(action, XDP_DROP, "length {len}");
    }
    let after = dp.stat(types::lb_stat::LB_DROP_MALFORMED).unwrap();
    assert_eq!(after - before, (frame.len() - 14) as u64);
}
