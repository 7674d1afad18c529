//! Nanoseconds per packet through BPF_PROG_TEST_RUN for a QUIC short-header packet routed by its
//! connection ID (QUIC-LB, crates/dataplane/src/bpf/quic.h), in plain sight and encrypted (one AES-128 block for
//! 16 octets of server ID and nonce; three or four for the Feistel network), against a plain UDP
//! flow of a service without quic_lb, measured in the same rounds. Prints figures and ratios;
//! asserts only that every repeat took the intended path (its counter moved by the repeats).
//!
//! Then the same over a working set of W distinct flows (10,000 by default), one run per packet
//! round-robin, the way a link delivers them (benches/flows.rs's method; the floor program,
//! which only swaps MACs, measures the method's own cost on the same packets): a plain UDP flow
//! without quic_lb; QUIC-LB with encrypted IDs decoded before ("steady": the later packets of
//! W connections); every ID new ("first packets", with the decode budget off, so that each pays
//! the cipher); a flood of made-up IDs, each new, with the budget on as it ships; and IDs in
//! plain sight (QUIC-LB's own path, with nothing to decode or look up per flow). Ratios
//! are against the plain UDP row of the same round.
//!
//! Needs root. `cargo bench --bench quic [-- --flows W]` for the full run; under `cargo test
//! --benches` it runs a few thousand repeats once, as a smoke test.

use std::time::Duration;

use lb::balancer::Balancer;
use lb::config::parse_str;
use lb::dataplane::types::lb_stat as S;
use lb::quic_lb::{encode, parse_hex, Config};

const KEY: &str = "8f95f09245765f80256934e50c66207f";

/// (port, name, server ID length, nonce length, encrypted); port 443 has no quic_lb.
const ROWS: [(u16, &str, usize, usize, bool); 5] = [
    (443, "plain UDP flow (no quic_lb)", 2, 6, false),
    (444, "QUIC-LB, in plain sight (2+6)", 2, 6, false),
    (445, "QUIC-LB, AES single pass (8+8)", 8, 8, true),
    (446, "QUIC-LB, Feistel 3 passes (2+6)", 2, 6, true),
    (447, "QUIC-LB, Feistel 4 passes (10+5)", 10, 5, true),
];

fn pool() -> String {
    let mut text = String::from("services:\n");
    for (port, _, sid, nonce, encrypted) in ROWS {
        let quic = if port == 443 {
            String::new()
        } else {
            let key = if encrypted { format!(", key: {KEY}") } else { String::new() };
            format!("    quic_lb: {{server_id_len: {sid}, nonce_len: {nonce}{key}}}\n")
        };
        // Each service's own server IDs: a plaintext and an encrypted service may not share one.
        let ids = |i: u8| if port == 443 { String::new() } else { format!(", server_id: '{}'", lb::quic_lb::hex(&vec![sid_octet(port, i); sid])) };
        text.push_str(&format!(
            "  - name: s{port}\n    vip: 10.99.0.100\n    port: {port}\n    protocol: udp\n    hash: flow\n    conntrack: off\n{quic}    backends:\n      - {{address: 10.99.0.11{}}}\n      - {{address: 10.99.0.12{}}}\n",
            ids(0),
            ids(1)
        ));
    }
    text
}

/// The octet that fills backend `i`'s server ID in the service on `port`.
fn sid_octet(port: u16, i: u8) -> u8 {
    (port as u8) << 1 | i
}

/// Ethernet + IPv4 + UDP from 192.0.2.7:40000 to the VIP's `port`, carrying a short-header
/// packet with `cid` and 40 octets behind it.
fn frame(port: u16, cid: &[u8]) -> Vec<u8> {
    let mut q = vec![0x41];
    q.extend_from_slice(cid);
    q.extend_from_slice(&[0x5a; 40]);
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x99, 0x08, 0x00];
    let total = (20 + 8 + q.len()) as u16;
    f.extend_from_slice(&[0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0, 192, 0, 2, 7, 10, 99, 0, 100]);
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&((8 + q.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&q);
    f
}

/// [`frame`] from flow `i` of a working set: source 172.16.0.0/12 and port by `i`.
fn frame_of(port: u16, i: u32, cid: &[u8]) -> Vec<u8> {
    let mut f = frame(port, cid);
    f[26..30].copy_from_slice(&(0xac10_0000 | (i >> 10)).to_be_bytes());
    f[34..36].copy_from_slice(&(1024 + (i & 1023) as u16).to_be_bytes());
    f
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let quick = !std::env::args().any(|a| a == "--bench");
    if !nix::unistd::geteuid().is_root() {
        println!("quic benchmark skipped: BPF_PROG_TEST_RUN needs root (CAP_BPF)");
        return Ok(());
    }
    let (repeat, rounds) = if quick { (5_000u32, 1) } else { (1_000_000u32, 11) };
    let pool = parse_str("bench.yaml", &pool())?;
    let mut dp = Balancer::load(1 << 20)?;
    // Every backend has the interface's own MAC, so that the forwarded frame is still addressed
    // to lb at the next repeat (see benches/xdp.rs).
    dp.install(&pool, [0x02, 0, 0, 0, 0, 1], &|_| Some([0x02, 0, 0, 0, 0, 1]))?;
    let key: [u8; 16] = parse_hex(KEY).expect("hex").try_into().expect("16 octets");
    let frames: Vec<Vec<u8>> = ROWS
        .iter()
        .map(|&(port, _, sid, nonce, encrypted)| {
            let config = Config::new(0, sid, nonce, encrypted.then_some(key)).expect("valid");
            frame(port, &encode(&config, &vec![sid_octet(port, 0); sid], &(0..nonce as u8).collect::<Vec<_>>()))
        })
        .collect();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); ROWS.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); ROWS.len()];
    for _ in 0..rounds {
        // Interleaved, so that drifts of the machine hit every row alike.
        let mut round = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            let before = (dp.forwarded()?, dp.stat(S::LB_QUIC_ROUTED)?);
            let (action, d): (u32, Duration) = dp.test_run_repeat(f, repeat)?;
            anyhow::ensure!(action == 3, "{}: returned {action}, not XDP_TX", ROWS[i].1);
            anyhow::ensure!(dp.forwarded()? - before.0 == repeat as u64, "{}: not every repeat forwarded", ROWS[i].1);
            let routed = dp.stat(S::LB_QUIC_ROUTED)? - before.1;
            let want = if i == 0 { 0 } else { repeat as u64 };
            anyhow::ensure!(routed == want, "{}: {routed} of {repeat} routed by connection ID", ROWS[i].1);
            round.push(d.as_nanos() as f64);
        }
        for (i, t) in round.iter().enumerate() {
            times[i].push(*t);
            ratios[i].push(t / round[0]);
        }
    }
    println!("QUIC-LB per packet, BPF_PROG_TEST_RUN, {repeat} repeats x {rounds} rounds (medians over rounds)");
    println!("{:<36} {:>8} {:>14}", "path", "ns/pkt", "x plain flow");
    for (i, (_, name, ..)) in ROWS.iter().enumerate() {
        println!("{:<36} {:>8.0} {:>14.2}", name, median(times[i].clone()), median(ratios[i].clone()));
    }
    working_set(&mut dp, &key, quick)
}

/// The working-set rows (see the top of the file).
fn working_set(dp: &mut Balancer, key: &[u8; 16], quick: bool) -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    let w: u32 = match argv.iter().position(|a| a == "--flows") {
        Some(i) => argv.get(i + 1).ok_or_else(|| anyhow::anyhow!("--flows needs a value"))?.replace('_', "").parse()?,
        None if quick => 500,
        None => 10_000,
    };
    let rounds = if quick { 1 } else { 7 };
    let mut floor_obj = std::mem::MaybeUninit::uninit();
    let floor = {
        use libbpf_rs::skel::{OpenSkel, SkelBuilder};
        lb::dataplane::floor::FloorSkelBuilder::default().open(&mut floor_obj)?.load()?
    };
    let run_floor = |f: &[u8]| -> anyhow::Result<f64> {
        let out = floor.progs.floor_xdp.test_run(libbpf_rs::ProgramInput { data_in: Some(f), repeat: 1, ..Default::default() })?;
        Ok(out.duration.as_nanos() as f64)
    };
    // The services: 443 plain UDP, 446 (2+6, three Feistel passes) and 445 (8+8, one AES block).
    let ids = |port: u16, sid: usize, nonce: usize, first: u32| -> Vec<Vec<u8>> {
        let config = Config::new(0, sid, nonce, (port != 444).then_some(*key)).expect("valid");
        (first..first + w)
            .map(|i| {
                let mut n: Vec<u8> = (0..nonce as u8).collect();
                n[..4].copy_from_slice(&i.to_be_bytes());
                frame_of(port, i, &encode(&config, &vec![sid_octet(port, 0); sid], &n))
            })
            .collect()
    };
    let plain: Vec<Vec<u8>> = (0..w).map(|i| frame_of(443, i, &[0x41; 9])).collect();
    let (feistel, aes, in_sight) = (ids(446, 2, 6, 0), ids(445, 8, 8, 0), ids(444, 2, 6, 0));
    let run = |dp: &Balancer, frames: &[Vec<u8>]| -> anyhow::Result<f64> {
        let mut total = 0.0;
        for f in frames {
            let (action, d) = dp.test_run_repeat(f, 1)?;
            anyhow::ensure!(action == 3, "XDP action {action}, not XDP_TX");
            total += d.as_nanos() as f64;
        }
        Ok(total / frames.len() as f64)
    };
    // A flood of made-up IDs (random octets after the first, rotation 0), each new: 20 packets
    // for each flow of the working set (200,000 by default), so that the budget's burst is a
    // small part of it; each packet's ID written into a frame of the flood's own working set.
    let flood = |dp: &Balancer, frames: &mut [Vec<u8>], seed: u64| -> anyhow::Result<f64> {
        let mut x = seed | 1;
        let mut total = 0.0;
        let at = frames[0].len() - 48; // the ID's octets after its first (frame(): 40 octets behind it)
        for k in 0..20 * frames.len() {
            let n = frames.len();
            let f = &mut frames[k % n];
            for b in &mut f[at..at + 8] {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let (action, d) = dp.test_run_repeat(f, 1)?;
            anyhow::ensure!(action == 3, "XDP action {action}, not XDP_TX");
            total += d.as_nanos() as f64;
        }
        Ok(total / (20 * frames.len()) as f64)
    };
    let flooding: Vec<Vec<u8>> = (0..w).map(|i| frame_of(446, i, &[0x05; 9])).collect();
    let floor_of = |frames: &[Vec<u8>]| -> anyhow::Result<f64> { Ok(frames.iter().map(|f| run_floor(f)).sum::<anyhow::Result<f64>>()? / frames.len() as f64) };
    // Each ID decoded once before the steady rows (all at once: past the budget).
    dp.set_quic_decode_budget(0)?;
    run(dp, &feistel)?;
    run(dp, &aes)?;
    dp.set_quic_decode_budget(lb::dataplane::DEFAULT_QUIC_DECODES)?;
    let names = [
        "floor (the method's own cost)",
        "plain UDP flow (no quic_lb)",
        "steady, Feistel 3 passes (2+6)",
        "steady, AES single pass (8+8)",
        "first packets, Feistel (2+6)",
        "first packets, AES (8+8)",
        "flood of made-up IDs (20 W), budget on",
        "in plain sight (2+6), no decoding",
    ];
    let mut t: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut decoded = vec![Vec::new(); names.len()];
    let mut over = vec![Vec::new(); names.len()];
    for r in 0..rounds {
        let fresh = 1_000_000 * (r + 1);
        let (new_feistel, new_aes) = (ids(446, 2, 6, fresh), ids(445, 8, 8, fresh));
        let mut one = |dp: &Balancer, i: usize, f: &dyn Fn(&Balancer) -> anyhow::Result<f64>| -> anyhow::Result<()> {
            let (d0, o0) = (dp.stat(S::LB_QUIC_DECODED)?, dp.stat(S::LB_QUIC_OVER_BUDGET)?);
            t[i].push(f(dp)?);
            let packets = if i == 6 { 20 * w } else { w } as f64;
            decoded[i].push((dp.stat(S::LB_QUIC_DECODED)? - d0) as f64 / packets);
            over[i].push((dp.stat(S::LB_QUIC_OVER_BUDGET)? - o0) as f64 / packets);
            Ok(())
        };
        one(dp, 0, &|_| floor_of(&plain))?;
        one(dp, 1, &|dp| run(dp, &plain))?;
        one(dp, 2, &|dp| run(dp, &feistel))?;
        one(dp, 3, &|dp| run(dp, &aes))?;
        dp.set_quic_decode_budget(0)?;
        one(dp, 4, &|dp| run(dp, &new_feistel))?;
        one(dp, 5, &|dp| run(dp, &new_aes))?;
        dp.set_quic_decode_budget(lb::dataplane::DEFAULT_QUIC_DECODES)?;
        // The budget as a CPU has it after a quiet second.
        std::thread::sleep(Duration::from_millis(if quick { 10 } else { 1000 }));
        // A copy, written over as the flood goes (`one` takes a closure that cannot change what it holds).
        one(dp, 6, &|dp| flood(dp, &mut flooding.clone(), fresh as u64))?;
        one(dp, 7, &|dp| run(dp, &in_sight))?;
    }
    println!();
    println!("Over a working set of {w} flows, one run per packet, round-robin, {rounds} rounds (medians):");
    println!("{:<36} {:>8} {:>12} {:>12} {:>9} {:>9}", "path", "ns/pkt", "x plain UDP", "x over floor", "decoded", "over bgt");
    let (fl, pl) = (median(t[0].clone()), median(t[1].clone()));
    for (i, name) in names.iter().enumerate() {
        let ns = median(t[i].clone());
        let over_floor = if i == 0 { String::new() } else { format!("{:.2}", (ns - fl) / (pl - fl)) };
        println!(
            "{:<36} {:>8.0} {:>12.2} {:>12} {:>8.0}% {:>8.0}%",
            name,
            ns,
            ns / pl,
            over_floor,
            100.0 * median(decoded[i].clone()),
            100.0 * median(over[i].clone())
        );
    }
    Ok(())
}
