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

/// Port 80: connection tracking on (the default); port 81: the same service with it off.
const POOL: &str = "services:
  - name: web
    vip: 10.99.0.100
    port: 80
    hash: flow
    backends:
      - {address: 10.99.0.11, name: b1}
      - {address: 10.99.0.12, name: b2}
      - {address: 10.99.0.13, name: b3, weight: 2}
  - name: plain
    vip: 10.99.0.100
    port: 81
    hash: flow
    conntrack: off
    backends:
      - {address: 10.99.0.11, name: b1}
      - {address: 10.99.0.12, name: b2}
      - {address: 10.99.0.13, name: b3, weight: 2}
";

/// Ethernet + IPv4 + TCP from 192.0.2.7:`sport` to `dst`:`dport` with `flags`, 8 bytes of
/// payload.
fn frame(dst: [u8; 4], dport: u16, sport: u16, flags: u8) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x99, 0x08, 0x00];
    let mut ip = vec![0x45, 0, 0, 48, 0, 1, 0x40, 0, 64, 6, 0, 0, 192, 0, 2, 7];
    ip.extend_from_slice(&dst);
    f.extend_from_slice(&ip);
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = flags;
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

    let vip = [10, 99, 0, 100];
    // Tracking off; a tracked flow (its SYN went first, so its ACKs hit the entry); an ACK of
    // a flow never seen (a lookup miss, then the table; no entry is made mid-flow); another
    // address.
    let plain = frame(vip, 81, 40000, 0x02);
    let tracked = frame(vip, 80, 40001, 0x10);
    dp.test_run(&frame(vip, 80, 40001, 0x02))?;
    let untracked = frame(vip, 80, 40002, 0x10);
    let other = frame([10, 99, 0, 101], 80, 40000, 0x02);
    use types::lb_stat as S;
    let mut figures: Vec<(&str, Vec<f64>, Vec<f64>)> = vec![
        ("lb_xdp VIP hit, conntrack off", Vec::new(), Vec::new()),
        ("lb_xdp VIP hit, conntrack hit", Vec::new(), Vec::new()),
        ("lb_xdp VIP hit, conntrack miss", Vec::new(), Vec::new()),
        ("lb_xdp non-VIP (XDP_PASS)", Vec::new(), Vec::new()),
    ];
    let mut f_ns = Vec::new();
    for _ in 0..rounds {
        // Interleaved, so drifts of the machine hit all rows alike.
        let out = floor.progs.floor_xdp.test_run(ProgramInput { data_in: Some(&plain), repeat, ..Default::default() })?;
        anyhow::ensure!(out.return_value == 3, "floor returned {}", out.return_value);
        let f = ns(out.duration);
        f_ns.push(f);
        // Each row checks through the counters that every repeat took its path (the kernel
        // reuses one buffer; the program only rewrites MACs, which it never reads back).
        let rows: [(&[u8], u32, Option<S>); 4] =
            [(&plain, 3, None), (&tracked, 3, Some(S::LB_CT_HIT)), (&untracked, 3, Some(S::LB_CT_MISS)), (&other, 2, None)];
        for (i, (pkt, want, counter)) in rows.into_iter().enumerate() {
            let (fwd, passed, ct) = (dp.forwarded()?, dp.stat(S::LB_STAT_PASSED)?, counter.map(|c| dp.stat(c)).transpose()?);
            let (action, d) = dp.test_run_repeat(pkt, repeat)?;
            let took = if want == 3 { dp.forwarded()? - fwd } else { dp.stat(S::LB_STAT_PASSED)? - passed };
            anyhow::ensure!(action == want && took == repeat as u64, "{}: {took} of {repeat} runs took the path", figures[i].0);
            if let (Some(c), Some(before)) = (counter, ct) {
                let n = dp.stat(c)? - before;
                anyhow::ensure!(n == repeat as u64, "{}: counter moved {n} for {repeat} runs", figures[i].0);
            }
            figures[i].1.push(ns(d));
            figures[i].2.push(ns(d) / f);
        }
    }
    // This machine's speed drifts between rounds; a round's figures are taken back to back, so
    // the ratio within a round is steadier than the ratio of medians.
    let f = median(f_ns);
    println!("XDP per-packet cost through BPF_PROG_TEST_RUN ({repeat} repeats x {rounds} rounds; medians)");
    println!("{:<34} {:>8} {:>8}   target", "path", "ns/pkt", "x floor");
    println!("{:<34} {:>8.0} {:>8.2}", "floor (swap MACs, XDP_TX)", f, 1.0);
    let base = median(figures[0].1.clone());
    let targets = ["<= 2.0", "<= conntrack off + 25 ns", "", "<= 1.5"];
    for ((name, times, ratios), target) in figures.into_iter().zip(targets) {
        let t = median(times);
        let extra = if name.contains("conntrack ") && !name.ends_with("off") { format!(" (+{:.0} ns)", t - base) } else { String::new() };
        println!("{:<34} {:>8.0} {:>8.2}   {target}{extra}", name, t, median(ratios));
    }
    Ok(())
}
