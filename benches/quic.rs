//! Nanoseconds per packet through BPF_PROG_TEST_RUN for a QUIC short-header packet routed by its
//! connection ID (QUIC-LB, crates/dataplane/src/bpf/quic.h), in plain sight and encrypted (one AES-128 block for
//! 16 octets of server ID and nonce; three or four for the Feistel network), against a plain UDP
//! flow of a service without quic_lb, measured in the same rounds. Prints figures and ratios;
//! asserts only that every repeat took the intended path (its counter moved by the repeats).
//!
//! Needs root. `cargo bench --bench quic` for the full run; under `cargo test --benches` it runs
//! a few thousand repeats once, as a smoke test.

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
    Ok(())
}
