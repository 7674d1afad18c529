//! Nanoseconds per packet through BPF_PROG_TEST_RUN: lb_xdp on a VIP hit and on a non-VIP pass,
//! against, in the same run, a floor program that only swaps MACs and returns XDP_TX.
//! Prints figures and ratios; asserts only that every iteration took the intended path.
//!
//! Encapsulated paths cannot use `repeat`: the kernel runs every repeat on one buffer, and a
//! program that grows the frame at the front (bpf_xdp_adjust_head) would see its own output on
//! the next run. They are measured one run per call instead (a fresh copy of the frame each
//! time), with the floor and the L2 hit measured the same way in the same rounds: that method
//! adds a constant cost to every figure, so an encapsulated path's cost over the floor is the
//! difference of the two, and its "x floor" figure puts that difference on the repeat scale
//! (floor + difference) / floor. The L2 hit, measured both ways, shows the two scales agree.
//!
//! Needs root. `cargo bench --bench xdp` for the full run (millions of repeats per figure);
//! under `cargo test --benches` it runs a few thousand repeats once, as a smoke test.

use std::mem::MaybeUninit;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::ProgramInput;

use lb::config::parse_str;
use lb::balancer::Balancer;
use lb::dataplane::types;

use lb::dataplane::floor;

/// Port 80: connection tracking on (the default); port 81: the same service with it off.
const POOL: &str = include_str!("../tests/pools/bench-xdp.yaml");

/// An ICMP "fragmentation needed" from a router to the VIP about the packet the VIP (port
/// `port`) sent to 192.0.2.7:`cport`: what lb routes to the flow's backend.
fn icmp_error(port: u16, cport: u16) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x99, 0x08, 0x00];
    let mut ip = vec![0x45, 0, 0, 56, 0, 1, 0x40, 0, 64, 1, 0, 0, 203, 0, 113, 1, 10, 99, 0, 100];
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0x00];
    icmp.extend_from_slice(&[0x45, 0, 5, 0xdc, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 99, 0, 100, 192, 0, 2, 7]);
    icmp.extend_from_slice(&port.to_be_bytes());
    icmp.extend_from_slice(&cport.to_be_bytes());
    icmp.extend_from_slice(&[0, 0, 0, 1]);
    let c = checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&icmp);
    f
}

fn checksum(b: &[u8]) -> u16 {
    let mut s: u32 = b.chunks(2).map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

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
    let mut dp = Balancer::load(lb::dataplane::DEFAULT_TABLE_CAPACITY)?;
    dp.set_encap_sources(Some(("10.99.0.2".parse()?, 32)), None)?;
    // Every backend and next hop has the interface's own MAC: `repeat` runs every repeat on one
    // buffer, and lb balances only frames sent to its MAC, so the frame it forwards must still be
    // addressed to it at the next repeat (a real frame arrives fresh).
    dp.install(&pool, [0x02, 0, 0, 0, 0, 1], &|a| match a {
        std::net::IpAddr::V4(_) => Some([0x02, 0, 0, 0, 0, 1]),
        std::net::IpAddr::V6(_) => None,
    })?;
    // The same pool on a second plane, whose slots are swept stable (crates/core/src/stable.rs) after its
    // flow shook hands: the tracked packet then goes by the table, one in 16 excepted.
    let mut stable = Balancer::load(lb::dataplane::DEFAULT_TABLE_CAPACITY)?;
    stable.install(&pool, [0x02, 0, 0, 0, 0, 1], &|a| match a {
        std::net::IpAddr::V4(_) => Some([0x02, 0, 0, 0, 0, 1]),
        std::net::IpAddr::V6(_) => None,
    })?;
    std::thread::sleep(Duration::from_millis(150));
    stable.test_run(&frame([10, 99, 0, 100], 80, 40001, 0x02))?;
    stable.test_run(&frame([10, 99, 0, 100], 80, 40001, 0x10))?;
    // Past the flow's young seconds (conntrack.h, ct_young), in which its packets take the whole
    // path to be promoted and confirmed.
    std::thread::sleep(Duration::from_millis(2300));
    while stable.sweep()? > 0 {}
    anyhow::ensure!(stable.unstable_slots() == 0, "the stable plane's slots were not swept stable");
    let mut floor_obj = MaybeUninit::uninit();
    let floor = floor::FloorSkelBuilder::default().open(&mut floor_obj)?.load()?;

    let vip = [10, 99, 0, 100];
    // Tracking off; a tracked flow (its SYN went first, so its ACKs hit the entry); an RST of
    // a flow never seen (a lookup miss, then the table: the one packet that never makes an
    // entry, so every repeat misses; any other packet of an unknown flow is adopted and hits
    // from its second); another address.
    let plain = frame(vip, 81, 40000, 0x02);
    let tracked = frame(vip, 80, 40001, 0x10);
    dp.test_run(&frame(vip, 80, 40001, 0x02))?;
    let untracked = frame(vip, 80, 40002, 0x14);
    let other = frame([10, 99, 0, 101], 80, 40000, 0x02);
    use types::lb_stat as S;
    let mut figures: Vec<(&str, Vec<f64>, Vec<f64>)> = vec![
        ("lb_xdp VIP hit, conntrack off", Vec::new(), Vec::new()),
        ("lb_xdp VIP hit, conntrack hit", Vec::new(), Vec::new()),
        ("lb_xdp VIP hit, conntrack miss", Vec::new(), Vec::new()),
        ("lb_xdp non-VIP (XDP_PASS)", Vec::new(), Vec::new()),
        ("lb_xdp VIP hit, conntrack, stable", Vec::new(), Vec::new()),
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
        // The stable slot: every repeat by the table or (the sample) by its entry.
        let before = stable.stat(S::LB_CT_STABLE)? + stable.stat(S::LB_CT_HIT)?;
        let (action, d) = stable.test_run_repeat(&tracked, repeat)?;
        let n = stable.stat(S::LB_CT_STABLE)? + stable.stat(S::LB_CT_HIT)? - before;
        anyhow::ensure!(action == 3 && n == repeat as u64, "stable slot: {n} of {repeat} runs by the table or the entry");
        figures[4].1.push(ns(d));
        figures[4].2.push(ns(d) / f);
    }
    // This machine's speed drifts between rounds; a round's figures are taken back to back, so
    // the ratio within a round is steadier than the ratio of medians.
    let f = median(f_ns);
    println!("XDP per-packet cost through BPF_PROG_TEST_RUN ({repeat} repeats x {rounds} rounds; medians)");
    println!("{:<34} {:>8} {:>8}   target", "path", "ns/pkt", "x floor");
    println!("{:<34} {:>8.0} {:>8.2}", "floor (swap MACs, XDP_TX)", f, 1.0);
    let base = median(figures[0].1.clone());
    let targets = ["<= 2.0", "<= conntrack off + 25 ns", "", "<= 1.5", "<= conntrack off + 25 ns"];
    for ((name, times, ratios), target) in figures.into_iter().zip(targets) {
        let t = median(times);
        let extra = if name.contains("conntrack") && !name.ends_with("off") { format!(" (+{:.0} ns)", t - base) } else { String::new() };
        println!("{:<34} {:>8.0} {:>8.2}   {target}{extra}", name, t, median(ratios));
    }

    // The ICMP path: an error about a flow of the L2 service, routed to its backend (MACs only,
    // so `repeat` works).
    let icmp = icmp_error(81, 40000);
    let mut icmp_ns = Vec::new();
    let mut icmp_ratio = Vec::new();
    for _ in 0..rounds {
        let out = floor.progs.floor_xdp.test_run(ProgramInput { data_in: Some(&plain), repeat, ..Default::default() })?;
        let before = dp.stat(S::LB_ICMP_FORWARDED)?;
        let (action, d) = dp.test_run_repeat(&icmp, repeat)?;
        let n = dp.stat(S::LB_ICMP_FORWARDED)? - before;
        anyhow::ensure!(action == 3 && n == repeat as u64, "ICMP error: {n} of {repeat} runs routed");
        icmp_ns.push(ns(d));
        icmp_ratio.push(ns(d) / ns(out.duration));
    }
    println!("{:<34} {:>8.0} {:>8.2}", "lb_xdp ICMP error to its backend", median(icmp_ns), median(icmp_ratio));
    encapsulated(&dp, &floor, &plain, f, base, quick)
}

/// Encapsulated paths, one run per call (see the top of this file).
fn encapsulated(dp: &Balancer, floor: &floor::FloorSkel, plain: &[u8], floor_rep: f64, l2_rep: f64, quick: bool) -> anyhow::Result<()> {
    use types::lb_stat as S;
    let (calls, rounds) = if quick { (200, 1) } else { (100_000, 5) };
    let vip = [10, 99, 0, 100];
    dp.test_run(&frame(vip, 83, 40001, 0x02))?;
    dp.test_run(&frame(vip, 85, 40001, 0x02))?;
    let rows: Vec<(&str, Vec<u8>, Option<S>)> = vec![
        ("lb_xdp VIP hit, L2, conntrack off", plain.to_vec(), None),
        ("IPIP hit, conntrack off", frame(vip, 82, 40000, 0x10), None),
        ("IPIP hit, conntrack hit", frame(vip, 83, 40001, 0x10), Some(S::LB_CT_HIT)),
        ("GUE hit, conntrack off", frame(vip, 84, 40000, 0x10), None),
        ("GUE hit, conntrack hit", frame(vip, 85, 40001, 0x10), Some(S::LB_CT_HIT)),
        ("ICMP error to an IPIP backend", icmp_error(82, 40000), Some(S::LB_ICMP_FORWARDED)),
    ];
    let one = |run: &dyn Fn() -> anyhow::Result<(u32, Duration)>| -> anyhow::Result<f64> {
        let mut total = 0.0;
        for _ in 0..calls {
            let (action, d) = run()?;
            anyhow::ensure!(action == 3, "returned {action}, not XDP_TX");
            total += ns(d);
        }
        Ok(total / calls as f64)
    };
    let mut floor_1 = Vec::new();
    let mut extra: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut raw: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for _ in 0..rounds {
        let fl = one(&|| {
            let out = floor.progs.floor_xdp.test_run(ProgramInput { data_in: Some(plain), repeat: 1, ..Default::default() })?;
            Ok((out.return_value, out.duration))
        })?;
        floor_1.push(fl);
        for (i, (_, pkt, counter)) in rows.iter().enumerate() {
            let (fwd, ct) = (dp.forwarded()?, counter.map(|c| dp.stat(c)).transpose()?);
            let t = one(&|| dp.test_run_repeat(pkt, 1))?;
            anyhow::ensure!(dp.forwarded()? - fwd == calls as u64, "{}: not every call forwarded", rows[i].0);
            if let (Some(c), Some(before)) = (counter, ct) {
                anyhow::ensure!(dp.stat(*c)? - before == calls as u64, "{}: counter did not move on every call", rows[i].0);
            }
            raw[i].push(t);
            extra[i].push(t - fl);
        }
    }
    println!();
    println!("one run per call ({calls} calls x {rounds} rounds; means per round, medians over rounds); the method adds a");
    println!("constant to every figure, so 'over floor' is the path's own cost and 'x floor' is (floor + it) / floor");
    println!("with the floor of the repeat table above ({floor_rep:.0} ns)");
    println!("{:<34} {:>8} {:>10} {:>8}   target", "path", "ns/call", "over floor", "x floor");
    println!("{:<34} {:>8.0} {:>10} {:>8.2}", "floor (swap MACs, XDP_TX)", median(floor_1), "", 1.0);
    for (i, (name, _, _)) in rows.iter().enumerate() {
        let over = median(extra[i].clone());
        let target = if name.starts_with("IPIP hit") || name.starts_with("GUE hit") { "<= 2.5" } else { "" };
        println!("{:<34} {:>8.0} {:>10.0} {:>8.2}   {target}", name, median(raw[i].clone()), over, (floor_rep + over) / floor_rep);
    }
    println!("(the L2 hit measured with repeat: {:.2} x floor; the same path on this scale above)", l2_rep / floor_rep);
    Ok(())
}
