//! Second chance on the backends' side (`lb decap --second-chance`): the decapsulation program
//! through BPF_PROG_TEST_RUN, in a network namespace of its own with real sockets, keeping what
//! this host holds (a connection by its socket's state, a SYN, the ACK of one of its own SYN
//! cookies, a connection its conntrack follows behind a REDIRECT) and sending the rest on to the
//! next hop through the FIB; a next hop whose MAC is not known yet waited for. Expected frames
//! are built here from the documented format (docs/encapsulation.md), not by the code under test.
//! Needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN) and nft:
//! `cargo test --test root_second_chance_backend`.

mod common;

use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::packet::*;
use lb::dataplane::decap::{host_addresses, Decap, DecapCounters};

const GUE_PORT: u16 = 6081;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const FIN: u8 = 0x01;
const PSH: u8 = 0x08;

fn df() -> V4Opts {
    V4Opts { dont_fragment: true, ..Default::default() }
}

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
/// A port the namespace REDIRECTs (nft, output hook) to NAT_TO, as kube-proxy or a sidecar
/// proxy does.
const NAT_PORT: u16 = 8082;
const NAT_TO: u16 = 8083;
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
        ("unresolved", b.unresolved - a.unresolved),
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

/// A connection from `client` to `vip`:`port` through `l`: (client side, server side, client port).
fn connected(l: &std::net::TcpListener, client: IpAddr, vip: IpAddr, port: u16) -> (std::net::TcpStream, std::net::TcpStream, u16) {
    let c = connect_from(client, std::net::SocketAddr::new(vip, port));
    let s = accept(l);
    let cport = c.local_addr().expect("local").port();
    (c, s, cport)
}

/// Closes the client side `c` of a connection whose server side closed first, after reading
/// the server's FIN: the server's side goes to TIME_WAIT.
fn finish(mut c: std::net::TcpStream) {
    use std::io::Read;
    c.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut buf = [0u8; 16];
    while c.read(&mut buf).expect("read to the server's FIN") > 0 {}
    drop(c);
}

/// Until this namespace has a TCP socket of local port `port`, peer port `cport`, in `state`
/// (as ss names it), polled every 10 ms for at most 5 s.
fn wait_state(port: u16, cport: u16, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = run(&["ss", "-Htan"]);
        if out.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 5 && f[0] == state && f[3].ends_with(&format!(":{port}")) && f[4].ends_with(&format!(":{cport}"))
        }) {
            return;
        }
        assert!(Instant::now() < deadline, "no socket of port {port} to port {cport} in {state}:\n{out}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `p` (an IP packet with TCP) with its sequence number plus `n`.
fn seq_plus(p: &[u8], n: u32) -> Vec<u8> {
    let mut p = p.to_vec();
    let at = if p[0] >> 4 == 4 { (p[0] & 0xf) as usize * 4 } else { 40 };
    let seq = u32::from_be_bytes(p[at + 4..at + 8].try_into().expect("4")).wrapping_add(n);
    p[at + 4..at + 8].copy_from_slice(&seq.to_be_bytes());
    p
}

/// A TCP listener on `addr` in an SO_REUSEPORT group (of one).
fn listen_reuseport(addr: std::net::SocketAddr) -> std::net::TcpListener {
    use nix::sys::socket::{bind, listen, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn};
    let std::net::SocketAddr::V4(a) = addr else { panic!("IPv4 only") };
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).expect("socket");
    setsockopt(&fd, sockopt::ReusePort, &true).expect("SO_REUSEPORT");
    bind(fd.as_raw_fd(), &SockaddrIn::from(a)).expect("bind");
    listen(&fd, Backlog::new(16).expect("backlog")).expect("listen");
    std::net::TcpListener::from(fd)
}

/// Whether the kernel's 32-bit jiffies are within two minutes (and a second) after zero, where
/// a listener's "last cookie" of 0 looks recent: five minutes after boot (they start at -300 s),
/// and at each wrap after.
fn jiffies_near_zero(de: &mut Decap) -> bool {
    let (jiffies, hz) = de.jiffies().expect("jiffies");
    (jiffies as u32).wrapping_add(hz) <= 122 * hz
}

/// CONFIG_HZ from /proc/config.gz, where the kernel has it.
fn configured_hz() -> Option<u32> {
    let out = std::process::Command::new("sh").args(["-c", "zcat /proc/config.gz 2>/dev/null | grep '^CONFIG_HZ='"]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().strip_prefix("CONFIG_HZ=")?.parse().ok()
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
    let mut de = load(true);
    // The clock rate lb decap measured is the kernel's, where its configuration says it.
    let (_, hz) = de.jiffies().expect("jiffies");
    if let Some(configured) = configured_hz() {
        assert_eq!(hz, configured, "the measured clock rate");
    }
    assert!(de.has_conntrack(), "this kernel has conntrack built in: its lookup resolves");
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
    // No route to the hop, or a route by another interface (which XDP_TX cannot take):
    // delivered here.
    for (what, hop) in [("no route to the hop", ip("10.95.0.9")), ("a hop behind another interface", ip(OTHER_LINK4))] {
        let f = gue_frame(lb4, here4, 64, &[hop], 0, &unknown4);
        check(&de, what, &f, XDP_PASS, Some(&decapsulated(&f, &unknown4)), &["no_route", "decapsulated"]);
    }
    // A hop on the link whose MAC is not known (backends on one segment that never talked):
    // dropped, for its sender to send again, and listed for lb decap to have it resolved; (m),
    // at the end, waits out the 3 s after which such a packet is delivered here.
    let no_neigh = gue_frame(lb4, here4, 64, &[ip(NO_NEIGH4)], 0, &unknown4);
    let unresolved_since = Instant::now();
    check(&de, "no neighbour for the hop", &no_neigh, XDP_DROP, None, &["unresolved"]);
    check(&de, "no neighbour for the hop, again", &no_neigh, XDP_DROP, None, &["unresolved"]);
    let listed = de.unresolved().expect("unresolved");
    assert_eq!(listed.iter().map(|u| u.0).collect::<Vec<_>>(), vec![ip(NO_NEIGH4)], "the hop is listed for resolving");
    assert!(listed[0].1 < Duration::from_secs(2), "listed since it was first found unresolved: {:?}", listed[0].1);

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

    // (i) Closing sockets hold a packet of their tuple only while their connection can still
    // carry it. TIME_WAIT (this host closed first): the connection is over, and a packet of its
    // tuple is a new connection's, held elsewhere (delivered here, it would get a stale ACK and
    // the live connection would hang).
    // Its peer's FIN sent again (its ACK was lost) is the one packet it still holds.
    let cap = capture_lo();
    let (c, s, cport) = connected(&l4, client4, vip4, PORT);
    drop(s);
    finish(c);
    wait_state(PORT, cport, "TIME-WAIT");
    let fin = captured(&cap, |p| tcp_of(p).is_some_and(|(t, flags)| u16::from_be_bytes([t[0], t[1]]) == cport && flags & FIN != 0));
    let inner = segment(client4, vip4, cport, PORT, ACK);
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &inner);
    check(&de, "an ACK of a tuple in TIME_WAIT here", &f, XDP_TX, Some(&sent_on(&f, &[hop4], 0)), &["sent_on"]);
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &fin);
    check(&de, "TIME_WAIT: the peer's FIN sent again", &f, XDP_PASS, Some(&decapsulated(&f, &fin)), &["hop_local", "decapsulated"]);
    // An orphaned FIN_WAIT2 (this host closed and its application is gone; the kernel keeps it
    // in the TIME_WAIT table, as a FIN_WAIT2): the peer may still send, near the window.
    let cap = capture_lo();
    let (c, s, cport) = connected(&l4, client4, vip4, PORT);
    let ack = captured(&cap, |p| tcp_of(p).is_some_and(|(t, flags)| u16::from_be_bytes([t[0], t[1]]) == cport && flags == ACK));
    drop(s);
    wait_state(PORT, cport, "FIN-WAIT-2");
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &ack);
    check(&de, "orphaned FIN_WAIT2: the peer's segment", &f, XDP_PASS, Some(&decapsulated(&f, &ack)), &["hop_local", "decapsulated"]);
    let far = seq_plus(&ack, 0x8000_0000);
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &far);
    check(&de, "orphaned FIN_WAIT2: a segment far from the window", &f, XDP_TX, Some(&sent_on(&f, &[hop4], 0)), &["sent_on"]);
    drop(c);
    // FIN_WAIT2 (this host stopped sending; the peer may still send) and CLOSE_WAIT (the peer
    // stopped; this host may still send, and its peer acknowledges): the peer's own segments are
    // this host's; one far from the socket's window is a new connection's that reuses the tuple.
    for (what, state) in [("FIN_WAIT2", "FIN-WAIT-2"), ("CLOSE_WAIT", "CLOSE-WAIT")] {
        let cap = capture_lo();
        let (mut c, s, cport) = connected(&l4, client4, vip4, PORT);
        use std::io::Write;
        if state == "FIN-WAIT-2" {
            s.shutdown(std::net::Shutdown::Write).expect("shutdown");
            wait_state(PORT, cport, state);
            c.write_all(b"x").expect("write");
        } else {
            c.shutdown(std::net::Shutdown::Write).expect("shutdown");
            wait_state(PORT, cport, state);
        }
        // The client's last segment (its data, or its FIN), as it crossed lo.
        let last = captured(&cap, |p| match tcp_of(p) {
            Some((t, flags)) => u16::from_be_bytes([t[0], t[1]]) == cport && flags & (FIN | PSH) != 0,
            None => false,
        });
        let f = gue_frame(lb4, here4, 64, &[hop4], 0, &last);
        check(&de, &format!("{what}: the peer's segment"), &f, XDP_PASS, Some(&decapsulated(&f, &last)), &["hop_local", "decapsulated"]);
        let far = seq_plus(&last, 0x8000_0000);
        let f = gue_frame(lb4, here4, 64, &[hop4], 0, &far);
        check(&de, &format!("{what}: a segment far from the window"), &f, XDP_TX, Some(&sent_on(&f, &[hop4], 0)), &["sent_on"]);
        drop((c, s));
    }

    // (j) A REDIRECT of the VIP's port to another (kube-proxy, a proxy on 8080): no socket has
    // the VIP's tuple, and the kernel's conntrack is what knows the connection is this host's.
    run(&["nft", "add", "table", "ip", "lbtest"]);
    run(&["nft", "add", "chain", "ip", "lbtest", "out", "{ type nat hook output priority -100 ; }"]);
    run(&["nft", "add", "rule", "ip", "lbtest", "out", "ip", "daddr", VIP4, "tcp", "dport", &NAT_PORT.to_string(), "redirect", "to", &format!(":{NAT_TO}")]);
    let ln = std::net::TcpListener::bind(("0.0.0.0", NAT_TO)).expect("listen");
    // A listener on the VIP's port too (an application beside a sidecar's REDIRECT): the
    // socket lookup finds it, and conntrack is asked all the same.
    let beside = std::net::TcpListener::bind((vip4, NAT_PORT)).expect("listen");
    let (c, s, cport) = connected(&ln, client4, vip4, NAT_PORT);
    let inner = segment(client4, vip4, cport, NAT_PORT, ACK);
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &inner);
    check(&de, "an ACK of a REDIRECTed connection", &f, XDP_PASS, Some(&decapsulated(&f, &inner)), &["hop_local", "decapsulated"]);
    let icmp = icmp_error(vip4, NAT_PORT, client4, cport);
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &icmp);
    check(&de, "frag needed about a REDIRECTed connection", &f, XDP_PASS, Some(&decapsulated(&f, &icmp)), &["hop_local", "decapsulated"]);
    let other = segment(client4, vip4, cport.wrapping_add(1), NAT_PORT, ACK);
    let f2 = gue_frame(lb4, here4, 64, &[hop4], 0, &other);
    check(&de, "an ACK to the REDIRECTed port, of no connection", &f2, XDP_TX, Some(&sent_on(&f2, &[hop4], 0)), &["sent_on"]);
    // Closed, conntrack keeps the entry a while in TIME_WAIT: over, like a TIME_WAIT socket.
    drop(s);
    finish(c);
    wait_state(NAT_TO, cport, "TIME-WAIT");
    check(&de, "an ACK of a REDIRECTed connection that closed", &f, XDP_TX, Some(&sent_on(&f, &[hop4], 0)), &["sent_on"]);

    // (k) The SYN-cookie secret is one per kernel: a cookie another network namespace sent (a
    // backend in another container of this host) checks out here too, but the kernel would
    // take it here only if this listener had sent cookies lately, and neither does lb decap.
    let mine = std::net::TcpListener::bind((vip4, COOKIE_PORT)).expect("listen");
    let theirs = std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare a network namespace");
        run(&["ip", "link", "set", "lo", "up"]);
        for a in [VIP4, CLIENT4] {
            run(&["ip", "addr", "add", &format!("{a}/32"), "dev", "lo"]);
        }
        run(&["sysctl", "-qw", "net.ipv4.tcp_syncookies=2"]);
        let l = std::net::TcpListener::bind((vip4, COOKIE_PORT)).expect("listen");
        cookie_ack(&l, client4, vip4)
    })
    .join()
    .expect("the other namespace's cookie");
    let f = gue_frame(lb4, here4, 64, &[hop4], 0, &theirs);
    if jiffies_near_zero(&mut de) {
        // A listener that never sent a cookie notes its last one at jiffy 0, which the kernel's
        // clock passes 5 minutes after boot: for 2 minutes then, it takes any valid cookie.
        println!("(k) skipped: the kernel booted 5 to 7 minutes ago, when every listener takes any cookie");
    } else {
        check(&de, "a SYN cookie of another namespace", &f, XDP_TX, Some(&sent_on(&f, &[hop4], 0)), &["sent_on"]);
    }
    drop(mine);

    // (h) SYN cookies: the ACK that completes a handshake answered with a cookie finds only the
    // listener, yet is this host's; the same ACK with another acknowledgement number is not.
    // The IPv4 listener is in an SO_REUSEPORT group, where the kernel notes its cookies apart.
    run(&["sysctl", "-qw", "net.ipv4.tcp_syncookies=2"]);
    let lc4 = listen_reuseport((vip4, COOKIE_PORT).into());
    let lc6 = std::net::TcpListener::bind((vip6, COOKIE_PORT)).expect("listen");
    for (what, lb, here, hop, listener, client, vip) in [("IPv4", lb4, here4, hop4, &lc4, client4, vip4), ("IPv6", lb6, here6, hop6, &lc6, client6, vip6)] {
        let ack = cookie_ack(listener, client, vip);
        let f = gue_frame(lb, here, 64, &[hop], 0, &ack);
        check(&de, &format!("{what}: a SYN cookie's ACK"), &f, XDP_PASS, Some(&decapsulated(&f, &ack)), &["hop_local", "decapsulated"]);
        let wrong = ack_plus_one(&ack);
        let f = gue_frame(lb, here, 64, &[hop], 0, &wrong);
        check(&de, &format!("{what}: the ACK with ack_seq + 1"), &f, XDP_TX, Some(&sent_on(&f, &[hop], 0)), &["sent_on"]);
    }

    // (m) A hop still unresolved 3 s after it was first found so: delivered here, as with no
    // route; forgotten (as lb decap does after 10 s), the next packet waits again.
    std::thread::sleep(Duration::from_millis(3100).saturating_sub(unresolved_since.elapsed()));
    check(&de, "no neighbour for the hop, 3 s on", &no_neigh, XDP_PASS, Some(&decapsulated(&no_neigh, &unknown4)), &["no_route", "decapsulated"]);
    de.forget_unresolved(ip(NO_NEIGH4)).expect("forget");
    assert!(de.unresolved().expect("unresolved").is_empty(), "forgotten");
    check(&de, "no neighbour for the hop, forgotten", &no_neigh, XDP_DROP, None, &["unresolved"]);

    drop((s6, c6, l4, l6, lc4, lc6, ln, beside));
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

/// lb decap loads where libbpf cannot read the kernel's configuration (a container without
/// /boot, a kernel without /proc/config.gz): the program asks nothing of it. (It once read
/// CONFIG_HZ from there, and failed to load, with or without --second-chance.)
#[test]
fn root_decap_loads_without_the_kernels_configuration() {
    common::require_root();
    let worker = std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare a mount namespace");
        use nix::mount::{mount, MsFlags};
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>).expect("private mounts");
        // libbpf looks in /boot/config-RELEASE, then /proc/config.gz: an empty /boot and /proc
        // (in this thread's mount namespace) have neither.
        for hidden in ["/boot", "/proc"] {
            mount(Some("tmpfs"), hidden, Some("tmpfs"), MsFlags::empty(), None::<&str>).expect("hide the configuration");
        }
        for second_chance in [false, true] {
            let mut de = Decap::load(GUE_PORT, second_chance).expect("lb decap loads without the kernel's configuration");
            assert!(de.jiffies().expect("jiffies").1 >= 100, "the clock rate is measured, not read");
        }
    });
    if let Err(e) = worker.join() {
        std::panic::resume_unwind(e);
    }
}
