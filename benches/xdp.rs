//! Nanoseconds per packet through BPF_PROG_TEST_RUN: lb_xdp on a VIP hit and on a non-VIP pass,
//! against, in the same run, a floor program that only swaps MACs and returns XDP_TX.
//! Prints figures and ratios; asserts only that every iteration took the intended path.
//!
//! Needs root. `cargo bench --bench xdp` for the full run (millions of repeats per figure);
//! under `cargo test --benches` it runs a few thousand repeats once, as a smoke test.

use std::mem::MaybeUninit;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::ProgramInput;

use lb::config::parse_str;
use lb::dataplane::{types, Dataplane};

#[allow(clippy::all, dead_code, non_camel_case_types, non_snake_case, non_upper_case_globals)]
mod floor {
    include!(concat!(env!("OUT_DIR"), "/floor.skel.rs"));
}

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

/// Ethernet + IPv4 + TCP SYN from 192.0.2.7:40000 to `dst`:80, with 8 bytes of payload.
fn frame(dst: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x99, 0x08, 0x00];
    let mut ip = vec![0x45, 0, 0, 48, 0, 1, 0x40, 0, 64, 6, 0, 0, 192, 0, 2, 7];
    ip.extend_from_slice(&dst);
    f.extend_from_slice(&ip);
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x02;
    f.extend_from_slice(&tcp);
    f.extend_from_slice(b"payload!");
    f
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn ns(d: Duration) -> f64 {
    d.as_nanos() as f64
}

fn main() -> anyhow::Result<()> {
    let quick = !std::env::args().any(|a| a == "--bench");
    if !nix::unistd::geteuid().is_root() {
        println!("xdp benchmark skipped: BPF_PROG_TEST_RUN needs root (CAP_BPF)");
        return Ok(());
    }
    let (repeat, rounds) = if quick { (10_000u32, 1) } else { (2_000_000u32, 15) };

    let pool = parse_str("bench.yaml", POOL)?;
    let mut dp = Dataplane::load(lb::dataplane::DEFAULT_TABLE_CAPACITY)?;
    dp.install(&pool, [0x02, 0, 0, 0, 0, 1], &|a| match a {
        std::net::IpAddr::V4(v4) => Some([0x02, 0xbb, 0, 0, 0, v4.octets()[3]]),
        std::net::IpAddr::V6(_) => None,
    })?;
    let mut floor_obj = MaybeUninit::uninit();
    let floor = floor::FloorSkelBuilder::default().open(&mut floor_obj)?.load()?;

    let hit = frame([10, 99, 0, 100]);
    let miss = frame([10, 99, 0, 101]);
    let (mut f_ns, mut hit_ns, mut pass_ns) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        // Interleaved, so drifts of the machine hit all three alike.
        let out = floor.progs.floor_xdp.test_run(ProgramInput { data_in: Some(&hit), repeat, ..Default::default() })?;
        anyhow::ensure!(out.return_value == 3, "floor returned {}", out.return_value);
        f_ns.push(ns(out.duration));

        let before = dp.forwarded()?;
        let (action, d) = dp.test_run_repeat(&hit, repeat)?;
        let took = dp.forwarded()? - before;
        // The program only rewrites MACs, which it never reads back, so every repeat of the
        // reused buffer must have been a forward.
        anyhow::ensure!(action == 3 && took == repeat as u64, "VIP hit: {took} of {repeat} runs forwarded");
        hit_ns.push(ns(d));

        let before = dp.stat(types::lb_stat::LB_STAT_PASSED)?;
        let (action, d) = dp.test_run_repeat(&miss, repeat)?;
        let took = dp.stat(types::lb_stat::LB_STAT_PASSED)? - before;
        anyhow::ensure!(action == 2 && took == repeat as u64, "non-VIP: {took} of {repeat} runs passed");
        pass_ns.push(ns(d));
    }
    // This machine's speed drifts between rounds; a round's three figures are taken back to
    // back, so the ratio within a round is steadier than the ratio of medians.
    let hit_ratio = median(hit_ns.iter().zip(&f_ns).map(|(h, f)| h / f).collect());
    let pass_ratio = median(pass_ns.iter().zip(&f_ns).map(|(p, f)| p / f).collect());
    let (f, h, p) = (median(f_ns), median(hit_ns), median(pass_ns));
    println!("XDP per-packet cost through BPF_PROG_TEST_RUN ({repeat} repeats x {rounds} rounds; medians)");
    println!("{:<34} {:>8} {:>8}   target", "path", "ns/pkt", "x floor");
    println!("{:<34} {:>8.0} {:>8.2}", "floor (swap MACs, XDP_TX)", f, 1.0);
    println!("{:<34} {:>8.0} {:>8.2}   <= 2.0", "lb_xdp VIP hit (XDP_TX)", h, hit_ratio);
    println!("{:<34} {:>8.0} {:>8.2}   <= 1.5", "lb_xdp non-VIP (XDP_PASS)", p, pass_ratio);
    Ok(())
}
