//! What second chance costs, per packet, through BPF_PROG_TEST_RUN, as ratios measured in one run:
//! - on lb: a GUE packet that carries a hop list against a plain GUE packet of the same service
//!   shape (the hop list is built from table_hops and written into a larger header);
//! - on a backend (`lb decap`): a packet with a hop list delivered to a connection of this host
//!   (one socket lookup), a SYN (no lookup), and a packet sent on to its next hop (the lookup, a
//!   FIB lookup and the rewrite), against the same hop-list packet decapsulated with second
//!   chance off, and a plain GUE packet.
//!
//! Every path grows or shrinks the frame at its front or rewrites the hop list's index, so each
//! call runs the program once on a fresh copy of its frame (as benches/xdp.rs measures its
//! encapsulated paths); the floor program (swap MACs, XDP_TX) is measured the same way in the same
//! rounds, so 'over floor' is a path's own cost. The backend side runs in a network namespace of
//! its own, with a real listener and connection on the VIP, which the socket lookup finds.
//!
//! Needs root. `cargo bench --bench second_chance` for the full run; under `cargo test --benches`
//! it runs a few hundred calls once, as a smoke test.

use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::ProgramInput;

use lb::balancer::Balancer;
use lb::config::{parse_str, HashMode};
use lb::dataplane::decap::Decap;

use lb::dataplane::floor;

/// Port 84: plain GUE; port 86: the same with second chance, whose previous pool lacked b4, so
/// b4's slots list their previous owner.
const POOL: &str = "services:
  - {name: gue, vip: 10.99.0.100, port: 84, hash: flow, algorithm: maglev, slots: 4099, forward: gue, conntrack: off,
     backends: [{address: 10.1.0.11, name: b1}, {address: 10.1.0.12, name: b2}, {address: 10.1.0.13, name: b3}, {address: 10.1.0.14, name: b4}]}
  - {name: hops, vip: 10.99.0.100, port: 86, hash: flow, algorithm: maglev, slots: 4099, forward: gue, conntrack: off, second_chance: on,
     backends: [{address: 10.1.0.11, name: b1}, {address: 10.1.0.12, name: b2}, {address: 10.1.0.13, name: b3}, {address: 10.1.0.14, name: b4}]}
";
const PREVIOUS: &str = "services:
  - {name: hops, vip: 10.99.0.100, port: 86, hash: flow, algorithm: maglev, slots: 4099, forward: gue, second_chance: on,
     backends: [{address: 10.1.0.11, name: b1}, {address: 10.1.0.12, name: b2}, {address: 10.1.0.13, name: b3}]}
";

fn checksum(b: &[u8]) -> u16 {
    let mut s: u32 = b.chunks(2).map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, payload: &[u8]) -> Vec<u8> {
    let len = (20 + payload.len()) as u16;
    let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, proto, 0, 0];
    ip[2..4].copy_from_slice(&len.to_be_bytes());
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(payload);
    ip
}

/// An IPv4 TCP packet from `src`:`sport` to `dst`:`dport` with `flags`, 8 bytes of payload
/// (TCP checksum left 0: neither program checks it).
fn tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, flags: u8) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&1u32.to_be_bytes());
    t[8..12].copy_from_slice(&1u32.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&512u16.to_be_bytes());
    t.extend_from_slice(b"payload!");
    ipv4(src, dst, 6, &t)
}

fn ether(l3: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x99, 0x08, 0x00];
    f.extend_from_slice(l3);
    f
}

/// The frame lb would send: GUE from `from` to `to`, port 6080, with a hop list of `hops`
/// (version 0) or none (version 1), around `inner`.
fn gue(from: Ipv4Addr, to: Ipv4Addr, hops: &[Ipv4Addr], inner: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    if !hops.is_empty() {
        payload.extend_from_slice(&[(1 + hops.len()) as u8, 4, 0, 0, 0, 0, 0, hops.len() as u8]);
        for h in hops {
            payload.extend_from_slice(&h.octets());
        }
    }
    payload.extend_from_slice(inner);
    let mut udp = vec![0u8; 8];
    udp[0..2].copy_from_slice(&50000u16.to_be_bytes());
    udp[2..4].copy_from_slice(&6080u16.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&payload);
    ether(&ipv4(from, to, 17, &udp))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn sh(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(args[0]).args(&args[1..]).output()?;
    anyhow::ensure!(out.status.success(), "{}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// One row: a name, a program run, its frame, and the XDP action every call must return.
type Run<'a> = Box<dyn Fn(&[u8]) -> anyhow::Result<(u32, Duration)> + 'a>;

/// Mean ns per call of each row over `calls` calls, `rounds` times, interleaved with the floor;
/// prints each row's median, its cost over the floor, and its ratio to row `base`.
fn measure(title: &str, rows: &[(&str, &Run<'_>, Vec<u8>, u32)], base: usize, floor: &floor::FloorSkel, calls: u32, rounds: u32) -> anyhow::Result<()> {
    let plain = ether(&tcp(Ipv4Addr::new(192, 0, 2, 7), 40000, Ipv4Addr::new(10, 99, 0, 100), 80, 0x10));
    let mut floor_ns = Vec::new();
    let mut over: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for _ in 0..rounds {
        let mut f = 0.0;
        for _ in 0..calls {
            let out = floor.progs.floor_xdp.test_run(ProgramInput { data_in: Some(&plain), repeat: 1, ..Default::default() })?;
            f += out.duration.as_nanos() as f64;
        }
        let f = f / calls as f64;
        floor_ns.push(f);
        for (i, (name, run, frame, want)) in rows.iter().enumerate() {
            let mut t = 0.0;
            for _ in 0..calls {
                let (action, d) = run(frame)?;
                anyhow::ensure!(action == *want, "{name}: returned {action}, not {want}");
                t += d.as_nanos() as f64;
            }
            over[i].push(t / calls as f64 - f);
        }
    }
    println!("{title}");
    println!("{:<46} {:>10} {:>10}", "path", "over floor", "x row 1");
    println!("{:<46} {:>10.0} {:>10}", "floor (swap MACs, XDP_TX), ns per call", median(floor_ns), "");
    let b = median(over[base].clone());
    for (i, (name, ..)) in rows.iter().enumerate() {
        let o = median(over[i].clone());
        println!("{:<46} {:>10.0} {:>10.2}", name, o, o / b);
    }
    println!();
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let quick = !std::env::args().any(|a| a == "--bench");
    if !nix::unistd::geteuid().is_root() {
        println!("second_chance benchmark skipped: BPF_PROG_TEST_RUN needs root (CAP_BPF)");
        return Ok(());
    }
    let (calls, rounds) = if quick { (200, 1) } else { (50_000, 7) };
    let mut floor_obj = MaybeUninit::uninit();
    let floor = floor::FloorSkelBuilder::default().open(&mut floor_obj)?.load()?;
    lb_side(&floor, calls, rounds)?;
    // The backend side in a namespace of its own, on a thread that alone enters it.
    std::thread::spawn(move || backend_side(calls, rounds)).join().map_err(|_| anyhow::anyhow!("the backend side panicked"))?
}

/// lb: one flow of each service, on a slot of b4 that b1 held before (so its packet carries b1,
/// and b4's runner-up if that is another backend), against the same flow of the plain service.
fn lb_side(floor: &floor::FloorSkel, calls: u32, rounds: u32) -> anyhow::Result<()> {
    let mut pool = parse_str("bench.yaml", POOL)?;
    pool.previous = Some(Box::new(parse_str("previous.yaml", PREVIOUS)?));
    let mut dp = Balancer::load(lb::dataplane::DEFAULT_TABLE_CAPACITY)?;
    dp.set_encap_sources(Some(("10.99.0.2".parse()?, 32)), None)?;
    dp.install(&pool, [0x02, 0, 0, 0, 0, 1], &|_| Some([0x02, 0, 0, 0, 0, 2]))?;
    let s = &pool.services[1];
    let t = lb::table::with_hops(s, lb::table::build_service(s), pool.previous_of(s));
    let (client, vip) = (Ipv4Addr::new(192, 0, 2, 7), Ipv4Addr::new(10, 99, 0, 100));
    let sport = (1024..u16::MAX)
        .find(|&p| {
            let h = lb::flowhash::flow_hash(HashMode::Flow, IpAddr::V4(client), IpAddr::V4(vip), p, 86, 6);
            let slot = h as usize % t.len();
            t.hops()[slot][0] != lb::table::EMPTY
        })
        .ok_or_else(|| anyhow::anyhow!("no flow on a slot with a previous owner"))?;
    let with = ether(&tcp(client, sport, vip, 86, 0x10));
    let plain = ether(&tcp(client, sport, vip, 84, 0x10));
    let (_, out) = dp.test_run(&with)?;
    // Ethernet 14, IPv4 20, UDP 8: the GUE header's first byte, version 0 and its length.
    anyhow::ensure!(out.len() > 42 && out[42] >> 6 == 0 && out[42] & 0x1f >= 2, "the hop-list packet is not GUE version 0 with hops");
    let hops = out[42 + 7] as usize;
    let run: Run<'_> = Box::new(|f: &[u8]| dp.test_run_repeat(f, 1));
    let rows = [("GUE, plain (version 1)", &run, plain, 3), ("GUE with a hop list", &run, with, 3)];
    measure(
        &format!("lb, per encapsulated packet ({calls} calls x {rounds} rounds; medians); the hop list holds {hops} hop(s)"),
        &rows,
        0,
        floor,
        calls,
        rounds,
    )
}

/// A backend: this host is 10.1.0.11 (and holds the VIP), its next hop for 10.1.0.12 is a
/// neighbour on veth0; a listener on the VIP's port 80 with one connection from 10.99.0.200.
fn backend_side(calls: u32, rounds: u32) -> anyhow::Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
    sh(&["ip", "link", "set", "lo", "up"])?;
    for a in ["10.99.0.100/32", "10.99.0.200/32", "10.1.0.11/32"] {
        sh(&["ip", "addr", "add", a, "dev", "lo"])?;
    }
    sh(&["ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"])?;
    sh(&["ip", "link", "set", "veth0", "up"])?;
    std::fs::write("/proc/sys/net/ipv6/conf/veth1/disable_ipv6", "1")?;
    sh(&["ip", "link", "set", "veth1", "up"])?;
    sh(&["ip", "addr", "add", "10.200.0.1/24", "dev", "veth0"])?;
    sh(&["ip", "route", "add", "10.1.0.12/32", "via", "10.200.0.2"])?;
    sh(&["ip", "neigh", "add", "10.200.0.2", "lladdr", "02:00:00:00:00:02", "nud", "permanent", "dev", "veth0"])?;
    for p in ["/proc/sys/net/ipv4/conf/lo/forwarding", "/proc/sys/net/ipv6/conf/lo/forwarding"] {
        std::fs::write(p, "1")?;
    }
    let listener = TcpListener::bind("10.99.0.100:80")?;
    let client = {
        let s = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Inet,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::empty(),
            None,
        )?;
        nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&s), &nix::sys::socket::SockaddrIn::new(10, 99, 0, 200, 45000))?;
        let stream = TcpStream::from(s);
        let addr: SocketAddr = "10.99.0.100:80".parse()?;
        nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&stream), &nix::sys::socket::SockaddrIn::from(match addr {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => unreachable!(),
        }))?;
        stream
    };
    let (_server, _) = listener.accept()?;

    let lbs = Ipv4Addr::new(10, 96, 0, 2);
    let here = Ipv4Addr::new(10, 1, 0, 11);
    let next = Ipv4Addr::new(10, 1, 0, 12);
    let vip = Ipv4Addr::new(10, 99, 0, 100);
    let known = tcp(Ipv4Addr::new(10, 99, 0, 200), 45000, vip, 80, 0x10);
    let unknown = tcp(Ipv4Addr::new(192, 0, 2, 9), 45001, vip, 80, 0x10);
    let syn = tcp(Ipv4Addr::new(192, 0, 2, 9), 45002, vip, 80, 0x02);
    let load = |second: bool| -> anyhow::Result<Decap> {
        let mut d = Decap::load(6080, second)?;
        d.allow_from(&[("10.96.0.0".parse()?, 24), ("10.1.0.0".parse()?, 24)])?;
        d.set_local(&["10.99.0.100".parse()?, "10.99.0.200".parse()?, "10.1.0.11".parse()?])?;
        Ok(d)
    };
    let (on, off) = (load(true)?, load(false)?);
    // Every run "arrives" on veth0, whose receive queue an attached program registers: a packet
    // sent on goes back out of it (XDP_TX), as on a backend's one interface.
    let veth0 = lb::dataplane::link::interface("veth0")?.ifindex;
    let _attached = lb::dataplane::link::attach(on.program_fd(), veth0, lb::dataplane::link::XdpMode::Native)?;
    let run_on: Run<'_> = Box::new(|f: &[u8]| on.test_run_on_repeat(f, veth0, 1));
    let run_off: Run<'_> = Box::new(|f: &[u8]| off.test_run_on_repeat(f, veth0, 1));
    let before = on.counters()?;
    let rows = [
        ("hop list, second chance off (decapsulated)", &run_off, gue(lbs, here, &[next], &known), 2),
        ("plain GUE, second chance on (decapsulated)", &run_on, gue(lbs, here, &[], &known), 2),
        ("hop list, a SYN: delivered (no lookup)", &run_on, gue(lbs, here, &[next], &syn), 2),
        ("hop list, a connection here: delivered", &run_on, gue(lbs, here, &[next], &known), 2),
        ("hop list, no connection: sent on", &run_on, gue(lbs, here, &[next], &unknown), 3),
    ];
    measure(&format!("backend (lb decap), per packet ({calls} calls x {rounds} rounds; medians)"), &rows, 0, &floor_in_ns()?, calls, rounds)?;
    let after = on.counters()?;
    anyhow::ensure!(after.sent_on - before.sent_on == (calls * rounds) as u64, "not every unknown-flow packet was sent on");
    drop(client);
    Ok(())
}

/// The floor program, loaded again in this thread's namespace (any namespace runs it alike).
fn floor_in_ns() -> anyhow::Result<floor::FloorSkel<'static>> {
    let obj = Box::leak(Box::new(MaybeUninit::uninit()));
    Ok(floor::FloorSkelBuilder::default().open(obj)?.load()?)
}
