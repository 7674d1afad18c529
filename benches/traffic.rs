//! What tracked traffic costs against untracked, row by row as issue 41 states its targets,
//! measured in one run: nanoseconds per packet through BPF_PROG_TEST_RUN, one run per packet,
//! round-robin over W distinct flows (benches/flows.rs's method; the floor program measures the
//! method's own cost on the same packets), each tracked row beside the untracked row of the same
//! service measured in the same round, and their ratio.
//!
//! - TCP over W flows (100,000) within their first 2 s: their handshake (SYN, then ACK) is
//!   sent, and their next packets are measured at once, while each flow is young (conntrack.h,
//!   ct_young: a young flow's packets take the whole path). Each round takes new flows.
//! - The same flows once they have settled (2.5 s after their SYN): stable slots send them by
//!   the table.
//! - The same after a reload that removes 1 of the 20 backends, once the sweep has settled.
//! - UDP over W flows (10,000), steady: each flow's entry made, established and confirmed
//!   (three packets, the last a refresh interval after the first) before it is measured.
//! - The TCP flows' handshake ACKs (their second packets: the promotion to the flow table,
//!   where the no_data signal notes the acknowledgment number), and at the end each flow's
//!   client FIN acknowledging only the SYN-ACK (which the no_data signal counts): the packets
//!   that begin and end a short connection, beside an established one's.
//!
//! Needs root. `cargo bench --bench traffic [-- --tcp-flows W] [--udp-flows W] [--rounds R]`;
//! under `cargo test --benches` a small smoke run.

mod common;
use common::{median, Pass};
use std::time::{Duration, Instant};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::ProgramInput;

use lb::balancer::Balancer;
use lb::config::parse_str;
use lb::dataplane::floor;
use lb::dataplane::types::lb_stat as S;

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

/// TCP on 80 (tracked) and 81 (not), UDP on 90 (tracked) and 91 (not), over 20 backends.
fn pool_text(backends: usize) -> String {
    let list: Vec<String> = (1..=backends).map(|i| format!("{{address: 10.99.0.{}, name: b{i}}}", 10 + i)).collect();
    let list = list.join(", ");
    let mut text = String::from("services:\n");
    for (port, proto, ct) in [(80, "tcp", "on"), (81, "tcp", "off"), (90, "udp", "on"), (91, "udp", "off")] {
        text.push_str(&format!(
            "  - {{name: s{port}, vip: 10.99.0.100, port: {port}, protocol: {proto}, hash: flow, conntrack: {ct}, backends: [{list}]}}\n"
        ));
    }
    text
}

/// Ethernet + IPv4 + TCP (or UDP) + 8 octets, to the VIP's `dport`.
fn template(dport: u16, udp: bool) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x99, 0x08, 0x00];
    let (proto, l4) = if udp { (17u8, 8usize) } else { (6, 20) };
    let total = (20 + l4 + 8) as u16;
    f.extend_from_slice(&[0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, proto, 0, 0, 0, 0, 0, 0, 10, 99, 0, 100]);
    f[16..18].copy_from_slice(&total.to_be_bytes());
    let mut h = vec![0u8; l4];
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    if udp {
        h[4..6].copy_from_slice(&((8 + 8) as u16).to_be_bytes());
    } else {
        h[12] = 5 << 4;
    }
    f.extend_from_slice(&h);
    f.extend_from_slice(b"payload!");
    f
}

/// Flow `i` of set `set` (each round's flows are new): its source address and port; a TCP
/// packet's flags, and an acknowledgment number of the flow's own (0 in a SYN), as a backend's
/// random initial sequence number makes it.
fn set_flow(f: &mut [u8], set: u32, i: u32, flags: Option<u8>) {
    let src = 0x0b00_0000 | (set & 0xff) << 16 | (i >> 10) & 0xffff;
    f[26..30].copy_from_slice(&src.to_be_bytes());
    f[34..36].copy_from_slice(&(1024 + (i & 1023) as u16).to_be_bytes());
    if let Some(flags) = flags {
        f[47] = flags;
        let ack = if flags == SYN { 0 } else { (i ^ set << 24).wrapping_mul(0x9e37_79b1) | 1 };
        f[42..46].copy_from_slice(&ack.to_be_bytes());
    }
}

struct Args {
    tcp: u32,
    udp: u32,
    rounds: u32,
}

fn args() -> anyhow::Result<Args> {
    let argv: Vec<String> = std::env::args().collect();
    let quick = !argv.iter().any(|a| a == "--bench");
    let mut a = if quick { Args { tcp: 2000, udp: 1000, rounds: 1 } } else { Args { tcp: 100_000, udp: 10_000, rounds: 5 } };
    let mut it = argv.iter().skip(1);
    while let Some(k) = it.next() {
        let mut val = || -> anyhow::Result<u32> {
            Ok(it.next().ok_or_else(|| anyhow::anyhow!("{k} needs a value"))?.replace('_', "").parse()?)
        };
        match k.as_str() {
            "--tcp-flows" => a.tcp = val()?.max(1),
            "--udp-flows" => a.udp = val()?.max(1),
            "--rounds" => a.rounds = val()?.max(1),
            _ => {}
        }
    }
    Ok(a)
}

type Run<'a> = dyn Fn(&[u8]) -> anyhow::Result<Duration> + 'a;

/// Sends one packet of each of flows 0..n of set `set` to `dport` (ACKs for TCP) through `run`.
fn pass(dp: &Balancer, run: &Run, dport: u16, udp: bool, set: u32, n: u32) -> anyhow::Result<Pass> {
    pass_flags(dp, run, dport, udp, set, n, ACK)
}

/// [`pass`] with TCP flags `flags`.
fn pass_flags(dp: &Balancer, run: &Run, dport: u16, udp: bool, set: u32, n: u32, flags: u8) -> anyhow::Result<Pass> {
    let mut f = template(dport, udp);
    let (stable0, hits0) = (dp.stat(S::LB_CT_STABLE)?, dp.stat(S::LB_CT_HIT)?);
    let mut total = 0.0;
    for i in 0..n {
        set_flow(&mut f, set, i, (!udp).then_some(flags));
        total += run(&f)?.as_nanos() as f64;
    }
    let share = |now: u64, before: u64| (now - before) as f64 / n as f64;
    Ok(Pass { ns: total / n as f64, stable: share(dp.stat(S::LB_CT_STABLE)?, stable0), hits: share(dp.stat(S::LB_CT_HIT)?, hits0) })
}

/// Makes the entries of UDP flows 0..n of set `set` on `dport`: two datagrams each (TCP's are
/// made by [`handshakes`]).
fn open_udp(dp: &Balancer, dport: u16, set: u32, n: u32) -> anyhow::Result<()> {
    let mut f = template(dport, true);
    for i in 0..n {
        set_flow(&mut f, set, i, None);
        for _ in 0..2 {
            let (action, _) = dp.test_run_repeat(&f, 1)?;
            anyhow::ensure!(action == 3, "port {dport}: XDP action {action}, not XDP_TX");
        }
    }
    Ok(())
}

/// The handshakes of flows 0..n of set `set` on TCP port `dport`: each flow's SYN through `dp`,
/// then at once its ACK through `run`, measured (on a tracked port, the promotion).
fn handshakes(dp: &Balancer, run: &Run, dport: u16, set: u32, n: u32) -> anyhow::Result<Pass> {
    let mut f = template(dport, false);
    let mut total = 0.0;
    for i in 0..n {
        set_flow(&mut f, set, i, Some(SYN));
        let (action, _) = dp.test_run_repeat(&f, 1)?;
        anyhow::ensure!(action == 3, "port {dport}: XDP action {action}, not XDP_TX");
        set_flow(&mut f, set, i, Some(ACK));
        total += run(&f)?.as_nanos() as f64;
    }
    Ok(Pass { ns: total / n as f64, stable: 0.0, hits: 0.0 })
}

/// The sweep until nothing more becomes stable (a slot is judged only a moment after the last
/// marking: crates/core/src/stable.rs, PLACED_MARGIN).
fn settle(dp: &mut Balancer) -> anyhow::Result<()> {
    std::thread::sleep(Duration::from_millis(120));
    while dp.sweep()? > 0 {}
    Ok(())
}

fn main() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        println!("traffic benchmark skipped: BPF_PROG_TEST_RUN needs root (CAP_BPF)");
        return Ok(());
    }
    let a = args()?;
    let pool = parse_str("bench.yaml", &pool_text(20))?;
    let fewer = parse_str("bench.yaml", &pool_text(20).replace(", {address: 10.99.0.30, name: b20}", ""))?;
    anyhow::ensure!(fewer.services[0].backends.len() == 19, "the reload removes one backend");
    let macs = |addr: std::net::IpAddr| match addr {
        std::net::IpAddr::V4(v4) => Some([0x02, 0xbb, 0, 0, 0, v4.octets()[3]]),
        std::net::IpAddr::V6(_) => None,
    };
    let mut floor_obj = std::mem::MaybeUninit::uninit();
    let floor = floor::FloorSkelBuilder::default().open(&mut floor_obj)?.load()?;
    let run_floor = |f: &[u8]| -> anyhow::Result<Duration> {
        Ok(floor.progs.floor_xdp.test_run(ProgramInput { data_in: Some(f), repeat: 1, ..Default::default() })?.duration)
    };
    // Rows: (name, tracked port, untracked port, udp).
    let names = [
        "TCP, young (within 2 s of the SYN)",
        "TCP, settled (2.5 s on)",
        "TCP, after a reload (1 of 20 out)",
        "UDP, steady",
        "TCP, the handshake's ACK",
        "TCP, the client's FIN, no data",
    ];
    let mut on: Vec<Vec<Pass>> = vec![Vec::new(); names.len()];
    let mut off: Vec<Vec<Pass>> = vec![Vec::new(); names.len()];
    let mut fl: Vec<Vec<Pass>> = vec![Vec::new(); names.len()];
    // The FINs the no_data signal counted (a flow whose cell another handshake took is not).
    let mut counted = 0u64;
    for r in 0..a.rounds {
        // A fresh plane each round, so that its flow table holds this round's flows only.
        let mut dp = Balancer::load(lb::dataplane::DEFAULT_TABLE_CAPACITY)?;
        dp.install(&pool, [0x02, 0, 0, 0, 0, 1], &macs)?;
        // The sweep marks the slots stable, as the daemon's does every second; flows begin a
        // while after their tables are placed, as in service (benches/flows.rs).
        settle(&mut dp)?;
        std::thread::sleep(Duration::from_millis(200));
        let run = |f: &[u8]| -> anyhow::Result<Duration> {
            let (action, d) = dp.test_run_repeat(f, 1)?;
            anyhow::ensure!(action == 3, "XDP action {action}, not XDP_TX");
            Ok(d)
        };
        let set = r + 1;
        let t0 = Instant::now();
        // Every backend id of port 80, before the reload removes one: the FINs count on them.
        let s80: Vec<u32> = dp.installed().iter().find(|s| s.key.port == 80).map(|s| s.backends.iter().map(|b| b.id).collect()).unwrap_or_default();
        // The handshakes, their ACKs measured (on 80, the promotions).
        on[4].push(handshakes(&dp, &run, 80, set, a.tcp)?);
        off[4].push(handshakes(&dp, &run, 81, set, a.tcp)?);
        fl[4].push(handshakes(&dp, &run_floor, 81, set, a.tcp)?);
        on[0].push(pass(&dp, &run, 80, false, set, a.tcp)?);
        off[0].push(pass(&dp, &run, 81, false, set, a.tcp)?);
        fl[0].push(pass(&dp, &run_floor, 81, false, set, a.tcp)?);
        let young = t0.elapsed();
        anyhow::ensure!(young < Duration::from_millis(1900), "the young rows took {young:?}: past the young seconds");
        // UDP's flows meanwhile: two datagrams make the entry, a third one a refresh interval
        // (about 1.1 s) later confirms it.
        open_udp(&dp, 90, set, a.udp)?;
        std::thread::sleep(Duration::from_millis(2500).saturating_sub(t0.elapsed()));
        pass(&dp, &run, 90, true, set, a.udp)?;
        on[3].push(pass(&dp, &run, 90, true, set, a.udp)?);
        off[3].push(pass(&dp, &run, 91, true, set, a.udp)?);
        fl[3].push(pass(&dp, &run_floor, 91, true, set, a.udp)?);
        on[1].push(pass(&dp, &run, 80, false, set, a.tcp)?);
        off[1].push(pass(&dp, &run, 81, false, set, a.tcp)?);
        fl[1].push(pass(&dp, &run_floor, 81, false, set, a.tcp)?);
        // The reload, then the sweep until nothing more becomes stable (benches/flows.rs).
        dp.apply(&fewer)?;
        settle(&mut dp)?;
        let run = |f: &[u8]| -> anyhow::Result<Duration> {
            let (action, d) = dp.test_run_repeat(f, 1)?;
            anyhow::ensure!(action == 3, "XDP action {action}, not XDP_TX");
            Ok(d)
        };
        on[2].push(pass(&dp, &run, 80, false, set, a.tcp)?);
        off[2].push(pass(&dp, &run, 81, false, set, a.tcp)?);
        fl[2].push(pass(&dp, &run_floor, 81, false, set, a.tcp)?);
        // The clients end their connections, having acknowledged only the SYN-ACKs.
        on[5].push(pass_flags(&dp, &run, 80, false, set, a.tcp, FIN | ACK)?);
        off[5].push(pass_flags(&dp, &run, 81, false, set, a.tcp, FIN | ACK)?);
        fl[5].push(pass_flags(&dp, &run_floor, 81, false, set, a.tcp, FIN | ACK)?);
        counted += s80.iter().map(|&id| dp.signals(id).map_or(0, |s| s.no_data)).sum::<u64>();
    }
    println!(
        "Tracked against untracked, one BPF_PROG_TEST_RUN per packet, round-robin; TCP over {} flows, UDP over {}; {} rounds, medians.",
        a.tcp, a.udp, a.rounds
    );
    println!("'x off' is tracked / untracked; 'x over floor' the same with the method's own cost (the floor row) taken from both;");
    println!("'table' and 'hits' the shares of tracked packets sent by a stable slot without a lookup, and by a looked-up entry.");
    println!("{:<36} {:>6} {:>9} {:>8} {:>6} {:>13} {:>6} {:>6}", "traffic", "floor", "untracked", "tracked", "x off", "x over floor", "table", "hits");
    for (i, name) in names.iter().enumerate() {
        let (t, u, f) = (median(&on[i]), median(&off[i]), median(&fl[i]));
        println!(
            "{:<36} {:>6.0} {:>9.0} {:>8.0} {:>6.2} {:>13.2} {:>5.0}% {:>5.0}%",
            name,
            f.ns,
            u.ns,
            t.ns,
            t.ns / u.ns,
            (t.ns - f.ns) / (u.ns - f.ns),
            t.stable * 100.0,
            t.hits * 100.0
        );
    }
    println!("The FINs counted as no_data: {counted} of {} ({:.0}%).", u64::from(a.tcp) * u64::from(a.rounds), counted as f64 * 100.0 / (f64::from(a.tcp) * f64::from(a.rounds)));
    Ok(())
}
