//! Nanoseconds per packet over a working set of distinct flows, the way a real link delivers
//! them: every packet another flow, round-robin over W flows, with a share of TCP SYNs of flows
//! never seen before. BPF_PROG_TEST_RUN one run per packet (benches/xdp.rs's `repeat` runs one
//! packet over and over, which keeps every lookup in the CPU's caches: the best case). The
//! method itself costs about the same on every call, so the floor program (swap MACs, XDP_TX)
//! is measured the same way on the same packets, and the figures that matter are the
//! differences: lb over the floor, and tracking over no tracking.
//!
//! Needs root. `cargo bench --bench flows -- [--flows W,W..] [--new PCT,PCT..] [--packets N]
//! [--rounds R] [--conntrack-size N]`; defaults: W = 1, 1000, 100000, 1000000; new = 0, 1, 10
//! (percent); 500,000 measured packets per figure (at least twice W) in 5 interleaved rounds,
//! medians; the default flow table (`--conntrack-size`, 262,144 entries), as a user gets it. Under `cargo test --benches` it runs a small smoke set.
//!
//! Before a working set is measured, a SYN and an ACK of each of its flows make its flow-table
//! entry (for tracked services); then the pool is reloaded with a fourth backend, which gives
//! about a quarter of the slots a new owner (1/N, N = 4), and the unstable slots are swept, as
//! the daemon does every second (crates/core/src/stable.rs). A tracked packet whose slot kept its owner then
//! goes by the table without its flow-table lookup (counted `stable`); the flows whose slot
//! changed keep their backends through the lookup, and the "moved" rows measure those alone,
//! the "kept" rows the others (stable slots only).
//! The shares of packets sent by the table ("by table") and by a looked-up entry ("hits") are
//! printed with the figures, and "x off" is a tracked row's cost over the floor divided by the
//! untracked row's (the ratio: tracking's cost against none).

mod common;
use common::{median, Pass};
use std::mem::MaybeUninit;
use std::time::Duration;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::ProgramInput;

use lb::config::parse_str;
use lb::balancer::Balancer;
use lb::dataplane::types;

use lb::dataplane::floor;

/// Port 80: tracked; 81: the same service untracked; 82/83: the same by IPIP. The L2 rows and
/// the IPIP rows run on two data planes loaded from this pool.
const POOL: &str = include_str!("../tests/pools/bench-flows.yaml");

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;

/// Ethernet + IPv4 + TCP + 8 bytes, to the VIP; the flow is set by [`set_flow`].
fn template(dport: u16) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x99, 0x08, 0x00];
    f.extend_from_slice(&[
        0x45, 0, 0, 48, 0, 1, 0x40, 0, 64, 6, 0, 0, 0, 0, 0, 0, 10, 99, 0, 100,
    ]);
    let mut tcp = vec![0u8; 20];
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[12] = 5 << 4;
    f.extend_from_slice(&tcp);
    f.extend_from_slice(b"payload!");
    f
}

/// Working-set flow `i` comes from 172.16.0.0/12, fresh flow `i` from 11.0.0.0/8: never the same.
fn set_flow(f: &mut [u8], fresh: bool, i: u64, flags: u8) {
    let base: u32 = if fresh { 0x0b00_0000 } else { 0xac10_0000 };
    let src = base | ((i >> 10) as u32 & 0x000f_ffff);
    f[26..30].copy_from_slice(&src.to_be_bytes());
    f[34..36].copy_from_slice(&(1024 + (i & 1023) as u16).to_be_bytes());
    f[47] = flags;
}

struct Args {
    flows: Vec<u64>,
    new: Vec<u64>,
    packets: u64,
    conntrack_size: u32,
    rounds: u64,
}

fn args() -> anyhow::Result<Args> {
    let argv: Vec<String> = std::env::args().collect();
    let quick = !argv.iter().any(|a| a == "--bench");
    let mut a = if quick {
        Args {
            flows: vec![1, 1000],
            new: vec![0, 10],
            packets: 4000,
            conntrack_size: 1 << 14,
            rounds: 1,
        }
    } else {
        Args {
            flows: vec![1, 1000, 100_000, 1_000_000],
            new: vec![0, 1, 10],
            packets: 500_000,
            conntrack_size: lb::dataplane::DEFAULT_CONNTRACK_SIZE,
            rounds: 5,
        }
    };
    let list = |v: &str| {
        v.split(',')
            .map(|x| x.replace('_', "").parse::<u64>())
            .collect::<Result<Vec<_>, _>>()
    };
    let mut it = argv.iter().skip(1);
    while let Some(k) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("{k} needs a value"))
        };
        match k.as_str() {
            "--flows" => a.flows = list(&val()?)?,
            "--new" => a.new = list(&val()?)?,
            "--packets" => a.packets = val()?.parse()?,
            "--conntrack-size" => a.conntrack_size = val()?.parse()?,
            "--rounds" => a.rounds = val()?.parse::<u64>()?.max(1),
            _ => {}
        }
    }
    anyhow::ensure!(a.new.iter().all(|&n| n <= 100), "--new is a percentage");
    anyhow::ensure!(
        a.flows.iter().all(|&w| w >= 1),
        "--flows must be at least 1"
    );
    Ok(a)
}

fn ns(d: Duration) -> f64 {
    d.as_nanos() as f64
}

/// Runs one packet: (XDP action, in-kernel time).
type RunOne<'a> = dyn Fn(&[u8]) -> anyhow::Result<(u32, Duration)> + 'a;

/// Sends `packets` packets to `dport`: round-robin over the working set `set` (flow numbers,
/// ACKs) from its `start`-th on, every `every`-th one instead a SYN of a never-seen flow
/// numbered from `*fresh`. `run` runs one packet and gives (XDP action, in-kernel time).
#[allow(clippy::too_many_arguments)]
fn pass(
    dp: &Balancer,
    dport: u16,
    set: &[u64],
    every: u64,
    start: u64,
    packets: u64,
    fresh: &mut u64,
    run: &RunOne,
) -> anyhow::Result<Pass> {
    use types::lb_stat as S;
    let mut f = template(dport);
    let (hits0, stable0) = (dp.stat(S::LB_CT_HIT)?, dp.stat(S::LB_CT_STABLE)?);
    let mut total = 0.0;
    for k in 0..packets {
        if every != 0 && k % every == every - 1 {
            set_flow(&mut f, true, *fresh, SYN);
            *fresh += 1;
        } else {
            set_flow(&mut f, false, set[((start + k) % set.len() as u64) as usize], ACK);
        }
        let (action, d) = run(&f)?;
        anyhow::ensure!(action == 3, "port {dport}: XDP action {action}, not XDP_TX");
        total += ns(d);
    }
    Ok(Pass {
        ns: total / packets as f64,
        hits: (dp.stat(S::LB_CT_HIT)? - hits0) as f64 / packets as f64,
        stable: (dp.stat(S::LB_CT_STABLE)? - stable0) as f64 / packets as f64,
    })
}

/// The pool reloaded with a fourth backend in every service: about a quarter of each table's
/// slots get a new owner.
fn grown(pool: &str) -> String {
    pool.replace("{address: 10.99.0.13, name: b3}]", "{address: 10.99.0.13, name: b3}, {address: 10.99.0.14, name: b4}]")
        .replace("{address: 10.1.0.13, name: b3}]", "{address: 10.1.0.13, name: b3}, {address: 10.1.0.14, name: b4}]")
}

/// The flows of working set `w` (numbers 0..w) whose slot of the service on `dport` is unstable
/// after the reload: those whose backend changed, which the flow table keeps.
fn moved(dp: &Balancer, dport: u16, w: u64) -> Vec<u64> {
    let svc = dp.installed().iter().find(|s| s.key.port == dport).cloned();
    let Some(svc) = svc else { return Vec::new() };
    let mut f = template(dport);
    (0..w)
        .filter(|&i| {
            set_flow(&mut f, false, i, ACK);
            let src = std::net::Ipv4Addr::new(f[26], f[27], f[28], f[29]);
            let sport = u16::from_be_bytes([f[34], f[35]]);
            let h = lb::flowhash::flow_hash(lb::config::HashMode::Flow, src.into(), "10.99.0.100".parse().expect("vip"), sport, dport, 6);
            dp.is_unstable(svc.base + h % svc.slots)
        })
        .collect()
}

fn main() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        println!("flows benchmark skipped: BPF_PROG_TEST_RUN needs root (CAP_BPF)");
        return Ok(());
    }
    let a = args()?;
    let pool = parse_str("bench.yaml", POOL)?;
    let reloaded = parse_str("bench.yaml", &grown(POOL))?;
    let macs = |addr: std::net::IpAddr| match addr {
        std::net::IpAddr::V4(v4) => Some([0x02, 0xbb, 0, 0, 0, v4.octets()[3]]),
        std::net::IpAddr::V6(_) => None,
    };
    // The reload, then the sweep until nothing more becomes stable.
    // (A slot is judged only a moment after the last marking, crates/core/src/stable.rs: PLACED_MARGIN.)
    let settle = |dp: &mut Balancer| -> anyhow::Result<()> {
        std::thread::sleep(Duration::from_millis(120));
        while dp.sweep()? > 0 {}
        Ok(())
    };
    let reload = |dp: &mut Balancer| -> anyhow::Result<()> {
        settle(dp)?;
        dp.apply(&reloaded)?;
        for a in ["10.99.0.14", "10.1.0.14"] {
            let a: std::net::IpAddr = a.parse()?;
            dp.set_mac(a, macs(a))?;
        }
        settle(dp)
    };
    // One data plane per forwarding mode, so that each one's flow table holds W flows, not 2 W.
    let load = || -> anyhow::Result<Balancer> {
        let mut dp =
            Balancer::load_sized(lb::dataplane::DEFAULT_TABLE_CAPACITY, a.conntrack_size)?;
        dp.set_encap_sources(Some(("10.99.0.2".parse()?, 32)), None)?;
        dp.install(&pool, [0x02, 0, 0, 0, 0, 1], &macs)?;
        Ok(dp)
    };
    let mut unguarded = load()?;
    unguarded.set_conntrack_guard(false)?;
    let mut floor_obj = MaybeUninit::uninit();
    let floor = floor::FloorSkelBuilder::default()
        .open(&mut floor_obj)?
        .load()?;
    let run_floor = |f: &[u8]| -> anyhow::Result<(u32, Duration)> {
        let out = floor.progs.floor_xdp.test_run(ProgramInput {
            data_in: Some(f),
            repeat: 1,
            ..Default::default()
        })?;
        Ok((out.return_value, out.duration))
    };

    println!("XDP per-packet cost over a working set of flows: BPF_PROG_TEST_RUN, one run per packet, round-robin;");
    println!("{} packets per figure (at least 2 W) in {} rounds, medians; flow table of {} entries. ns per packet, each including the", a.packets, a.rounds, a.conntrack_size);
    println!("method's own cost, which the floor row measures. After one reload that gave about 1/4 of the slots a new owner:");
    println!("'on' is every flow of the working set, 'kept' the flows whose slot kept its owner, 'moved' those whose slot changed");
    println!("(they keep their backends through the flow table); 'x off' is (row - floor) / (off - floor); 'table' and 'hits' the shares of packets sent");
    println!("by a stable slot without a lookup and by a looked-up entry.");
    let mut fresh = 0u64;
    for &w in &a.flows {
        // Fresh data planes for each working set, so that each flow table holds W flows.
        let (mut l2, mut ipip) = (load()?, load()?);
        // Flows begin a while after their tables are placed, as in service: an entry written
        // within moments of its range's placement counts as older than it (crates/core/src/stable.rs,
        // PLACED_MARGIN), and would hold every slot until its flow is seen again.
        std::thread::sleep(Duration::from_millis(200));
        // The working set's entries, for both tracked services.
        let mut f80 = template(80);
        let mut f82 = template(82);
        for i in 0..w {
            // A handshake's SYN, then its ACK: the flow is established.
            for flags in [SYN, ACK] {
                set_flow(&mut f80, false, i, flags);
                set_flow(&mut f82, false, i, flags);
                l2.test_run_repeat(&f80, 1)?;
                ipip.test_run_repeat(&f82, 1)?;
            }
        }
        // Past the last flows' young seconds (conntrack.h, ct_young: their packets take the
        // whole path for about 2 s after their SYN), then the reload.
        std::thread::sleep(Duration::from_millis(2300));
        reload(&mut l2)?;
        reload(&mut ipip)?;
        let all: Vec<u64> = (0..w).collect();
        let (l2_moved, ip_moved) = (moved(&l2, 80, w), moved(&ipip, 82, w));
        let kept = |moved: &[u64]| -> Vec<u64> {
            let m: std::collections::HashSet<u64> = moved.iter().copied().collect();
            (0..w).filter(|i| !m.contains(i)).collect()
        };
        let (l2_kept, ip_kept) = (kept(&l2_moved), kept(&ip_moved));
        let run_l2 = |f: &[u8]| l2.test_run_repeat(f, 1);
        let run_ipip = |f: &[u8]| ipip.test_run_repeat(f, 1);
        println!();
        println!(
            "W = {w}: {} of {} L2 slots unstable after the reload, {} flows moved ({:.1}%)",
            l2.unstable_slots(),
            l2.installed().iter().find(|s| s.key.port == 80).map_or(0, |s| s.slots),
            l2_moved.len(),
            l2_moved.len() as f64 * 100.0 / w as f64
        );
        println!(
            "{:>5} {:>6} {:>8} {:>8} {:>6} {:>6} {:>6} {:>8} {:>6} {:>6}",
            "new%", "floor", "row", "ns", "x off", "table", "hits", "IPIP ns", "x off", "table"
        );
        for &new in &a.new {
            let every = 100u64.checked_div(new).unwrap_or(0);
            let packets = a.packets.max(2 * w);
            // Interleaved rows, in rounds: a drift of the machine hits every row alike; medians.
            let per = (packets / a.rounds).max(1);
            let mut rows: Vec<Vec<Pass>> = (0..9).map(|_| Vec::new()).collect();
            for round in 0..a.rounds {
                // Each round walks on where the last one stopped: over all W flows in the end.
                let start = round * per;
                rows[0].push(pass(&l2, 81, &all, every, start, per, &mut fresh, &run_floor)?);
                rows[1].push(pass(&l2, 81, &all, every, start, per, &mut fresh, &run_l2)?);
                rows[2].push(pass(&l2, 80, &all, every, start, per, &mut fresh, &run_l2)?);
                rows[3].push(pass(&ipip, 83, &all, every, start, per, &mut fresh, &run_ipip)?);
                rows[4].push(pass(&ipip, 82, &all, every, start, per, &mut fresh, &run_ipip)?);
                if !l2_moved.is_empty() && !ip_moved.is_empty() {
                    rows[5].push(pass(&l2, 80, &l2_moved, every, start, per, &mut fresh, &run_l2)?);
                    rows[6].push(pass(&ipip, 82, &ip_moved, every, start, per, &mut fresh, &run_ipip)?);
                    rows[7].push(pass(&l2, 80, &l2_kept, every, start, per, &mut fresh, &run_l2)?);
                    rows[8].push(pass(&ipip, 82, &ip_kept, every, start, per, &mut fresh, &run_ipip)?);
                }
            }
            let [fl, l2_off, l2_on, ip_off, ip_on] = [0, 1, 2, 3, 4].map(|i| median(&rows[i]));
            let over = |row: &Pass, off: &Pass| (row.ns - fl.ns) / (off.ns - fl.ns);
            let line = |name: &str, l: &Pass, i: &Pass, off: bool| {
                let (lx, ix) = if off { ("1.00".to_string(), "1.00".to_string()) } else { (format!("{:.2}", over(l, &l2_off)), format!("{:.2}", over(i, &ip_off))) };
                println!(
                    "{:>5} {:>6.0} {:>8} {:>8.0} {:>6} {:>5.0}% {:>5.0}% {:>8.0} {:>6} {:>5.0}%",
                    new, fl.ns, name, l.ns, lx, l.stable * 100.0, l.hits * 100.0, i.ns, ix, i.stable * 100.0
                );
            };
            line("off", &l2_off, &ip_off, true);
            line("on", &l2_on, &ip_on, false);
            if !rows[5].is_empty() {
                line("kept", &median(&rows[7]), &median(&rows[8]), false);
                line("moved", &median(&rows[5]), &median(&rows[6]), false);
            }
        }
    }
    let l2 = load()?;
    let run_l2 = |f: &[u8]| l2.test_run_repeat(f, 1);
    // A SYN flood: every packet a SYN of a flow never seen, each from another source. With the
    // guard (the default) it is recorded in the half-open table; without it, it makes (and
    // evicts) flow-table entries.
    let packets = a.packets;
    let one = [0u64];
    let fl = pass(&l2, 81, &one, 1, 0, packets, &mut fresh, &run_floor)?;
    let off = pass(&l2, 81, &one, 1, 0, packets, &mut fresh, &run_l2)?;
    let on = pass(&l2, 80, &one, 1, 0, packets, &mut fresh, &run_l2)?;
    let run_unguarded = |f: &[u8]| unguarded.test_run_repeat(f, 1);
    let unguarded_on = pass(&unguarded, 80, &one, 1, 0, packets, &mut fresh, &run_unguarded)?;
    println!();
    println!("SYN flood, every packet a SYN from a new source ({packets} packets): ns per packet");
    println!("{:>7} {:>8} {:>14} {:>16}", "floor", "ct off", "ct on (guard)", "ct on, no guard");
    println!("{:>7.0} {:>8.0} {:>14.0} {:>16.0}", fl.ns, off.ns, on.ns, unguarded_on.ns);
    Ok(())
}