//! Fuzzed pools, on stable Rust: structure-aware random pools and byte-level mutations of the
//! fixtures (configs/*.yaml, configs/bad/*.yaml) through validation, every table builder,
//! `lb table`'s JSON and `lb diff`. Invariants checked on every input:
//! - nothing panics, and each input is handled within a time bound;
//! - every rejection names the file, and the line wherever the input has one (only whole-file
//!   problems, such as an empty file, come without a line);
//! - every accepted pool builds tables with the properties the spec promises: the right size,
//!   only backends with weight own slots, no slot is empty while one has weight, the bounded
//!   builder's caps hold, and a pool compared with itself moves nothing.
//!
//! `cargo test --test fuzz_pools` runs 4000 inputs from a fixed seed (the same inputs on every
//! machine); `scripts/fuzz-pools.sh SECONDS [SEED]` runs for a time from any seed. No root needed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lb::config::{parse_bytes, Algorithm, Pool};
use lb::{diff, report, table};

mod common;
use common::rng::Rng;


/// A scalar that is sometimes valid for `key` and often not.
fn value(r: &mut Rng, key: &str) -> String {
    let valid: &[&str] = match key {
        "name" => &["web", "dns", "a.b-c_d", "x"],
        "vip" | "address" => &["10.0.0.1", "10.0.0.2", "fd00::1", "'fd00::2'", "192.0.2.9"],
        "port" | "gue_port" => &["80", "53", "1", "65535", "6080"],
        "protocol" => &["tcp", "udp"],
        "algorithm" => &["ring", "maglev", "bounded"],
        "slots" => &["97", "101", "1000", "4099", "65537", "1"],
        "vnodes_per_weight" => &["1", "10", "150"],
        "hash" => &["client-ip", "flow"],
        "conntrack" => &["on", "off", "true"],
        "forward" => &["l2", "ipip", "gue"],
        "load_bound" => &["1.02", "1", "1.5", "2.000"],
        "weight" => &["0", "1", "2", "1000"],
        "state" => &["active", "drain"],
        "kind" => &["tcp", "http", "none"],
        "interval" | "timeout" => &["1s", "500ms", "2s"],
        "rise" | "fall" => &["1", "3"],
        "path" => &["/", "/healthz"],
        "expect" => &["200", "200-399"],
        _ => &["1"],
    };
    let wild = [
        "-1", "0", "70000", "4294967296", "99999999999999999999", "1.0205", "0.9", "nan", ".inf", "''", "\"\"", "~", "null", "[]", "{}",
        "[1, 2]", "{a: 1}", "\"<b>&\\\"\"", "'10.0.0.300'", "224.0.0.1", "0.0.0.0", "::", "'::ffff:10.0.0.1'", "true", "yes", "2 weeks",
        "1048577", "65536", "10001", "\"\\u0001\"",
    ];
    if r.chance(75) {
        r.pick(valid).to_string()
    } else {
        r.pick(&wild).to_string()
    }
}

const SERVICE_KEYS: [&str; 14] = [
    "name", "vip", "port", "protocol", "algorithm", "slots", "vnodes_per_weight", "hash", "conntrack", "forward", "gue_port", "load_bound",
    "backends", "health_check",
];

/// A random pool, in flow or block style, mostly plausible.
fn structured(r: &mut Rng) -> String {
    let mut out = String::from("services:\n");
    for si in 0..r.below(4) {
        out.push_str("  - ");
        let mut first = true;
        for key in SERVICE_KEYS {
            let required = matches!(key, "name" | "vip" | "port" | "backends");
            // A required key is written 95% of the time, any other 25%; the draws happen in
            // this order, so a seed keeps giving the same pools.
            let written = required && r.chance(95);
            if !written && !r.chance(25) {
                continue;
            }
            let indent = if first { "" } else { "    " };
            first = false;
            match key {
                "name" => out.push_str(&format!("{indent}name: s{si}{}\n", if r.chance(10) { value(r, "name") } else { String::new() })),
                "backends" => {
                    out.push_str(&format!("{indent}backends:\n"));
                    for bi in 0..r.below(6) {
                        if r.chance(30) {
                            out.push_str(&format!("      - 10.0.{}.{}\n", si, bi + 1));
                            continue;
                        }
                        out.push_str(&format!("      - address: 10.0.{}.{}\n", si, bi + 1));
                        for k in ["name", "weight", "state"] {
                            if r.chance(40) {
                                out.push_str(&format!("        {k}: {}\n", value(r, k)));
                            }
                        }
                        if r.chance(3) {
                            out.push_str(&format!("        bogus_key: {}\n", value(r, "x")));
                        }
                    }
                }
                "health_check" => {
                    out.push_str(&format!("{indent}health_check:\n"));
                    for k in ["kind", "port", "path", "expect", "interval", "timeout", "rise", "fall"] {
                        if r.chance(if k == "kind" { 95 } else { 35 }) {
                            out.push_str(&format!("      {k}: {}\n", value(r, k)));
                        }
                    }
                }
                k => out.push_str(&format!("{indent}{k}: {}\n", value(r, k))),
            }
        }
        if first {
            out.push_str("{}\n");
        }
    }
    out
}

/// A byte-level mutation of `seed`: flips, cuts, duplicated or deleted lines, inserted bytes.
fn mutated(r: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + r.below(4) {
        if b.is_empty() {
            b.push(b'x');
        }
        let at = r.below(b.len() as u64) as usize;
        match r.below(6) {
            0 => b[at] ^= 1 << r.below(8),
            1 => b.truncate(at),
            2 => {
                let ins = *r.pick(&[b":".as_slice(), b"\n", b"- ", b"  ", b"{", b"]", b"\xff", b"#", b"'", b"&a ", b"*a", b"!!int "]);
                b.splice(at..at, ins.iter().copied());
            }
            3 => {
                // Duplicate the line at `at`.
                let start = b[..at].iter().rposition(|&c| c == b'\n').map_or(0, |p| p + 1);
                let end = b[at..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| at + p + 1);
                let line = b[start..end].to_vec();
                b.splice(end..end, line);
            }
            4 => {
                let start = b[..at].iter().rposition(|&c| c == b'\n').map_or(0, |p| p + 1);
                let end = b[at..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| at + p + 1);
                b.drain(start..end);
            }
            _ => {
                let other = r.below(256) as u8;
                b[at] = other;
            }
        }
    }
    b
}

fn fixtures() -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut out = Vec::new();
    for dir in [root.clone(), root.join("bad")] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.path().extension().is_some_and(|x| x == "yaml") {
                if let Ok(b) = std::fs::read(e.path()) {
                    out.push(b);
                }
            }
        }
    }
    out
}

/// The properties every accepted pool's tables must have. Returns what went wrong.
fn check_pool(pool: &Pool) -> Result<(), String> {
    for s in &pool.services {
        let t = table::build_service(s);
        if t.len() != s.slots as usize {
            return Err(format!("{}: {} slots built for {}", s.name, t.len(), s.slots));
        }
        let serving: Vec<bool> = s.backends.iter().map(|b| b.serving_weight() > 0).collect();
        let any = serving.iter().any(|&x| x);
        let counts = t.counts(s.backends.len());
        for (i, c) in counts.iter().enumerate() {
            if *c > 0 && !serving[i] {
                return Err(format!("{}: backend {i} without weight owns {c} slots", s.name));
            }
        }
        let empty = t.owners().iter().filter(|&&o| o == table::EMPTY).count();
        if any && empty > 0 {
            return Err(format!("{}: {empty} empty slots with backends that have weight", s.name));
        }
        if !any && empty != t.len() {
            return Err(format!("{}: slots owned without any backend with weight", s.name));
        }
        if s.algorithm == Algorithm::Bounded && any {
            let total: u64 = s.backends.iter().map(|b| b.serving_weight() as u64).sum();
            for (b, c) in s.backends.iter().zip(&counts) {
                let cap = table::bounded::cap(s.load_bound, s.slots as u64, b.serving_weight() as u64, total);
                if *c > cap {
                    return Err(format!("{}: {} holds {c} slots over its cap {cap}", s.name, b.identity()));
                }
            }
        }
        let _ = report::table_json(s, &t);
    }
    let d = diff::diff(pool, pool);
    if d.iter().any(|x| x.moved != 0) {
        return Err("a pool compared with itself moves slots".to_string());
    }
    Ok(())
}

/// Whole-file problems, which have no line.
fn whole_file(message: &str) -> bool {
    message.contains("the file is empty") || message.contains("is a directory") || message.contains("no such file")
}

/// Runs `inputs` inputs or for `seconds`, whichever ends first; returns (inputs, accepted,
/// rejected).
fn fuzz(inputs: u64, seconds: f64, seed: u64) -> (u64, u64, u64) {
    let fixtures = fixtures();
    assert!(!fixtures.is_empty(), "no fixtures found");
    let mut r = Rng(seed);
    let path = PathBuf::from("fuzz.yaml");
    let (mut n, mut ok, mut bad) = (0u64, 0u64, 0u64);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    while n < inputs && Instant::now() < end {
        let input: Vec<u8> = if r.chance(50) {
            structured(&mut r).into_bytes()
        } else {
            let seed_file = r.pick(&fixtures).clone();
            mutated(&mut r, &seed_file)
        };
        let start = Instant::now();
        let outcome = std::panic::catch_unwind(|| match parse_bytes(&path, &input) {
            Ok(pool) => check_pool(&pool).map(|()| true),
            Err(e) => {
                let text = e.to_string();
                if !text.starts_with("fuzz.yaml") {
                    return Err(format!("a rejection that does not name the file: {text}"));
                }
                if e.line.is_none() && !whole_file(&e.message) {
                    return Err(format!("a rejection without a line: {text}"));
                }
                Ok(false)
            }
        });
        let took = start.elapsed();
        match outcome {
            Ok(Ok(true)) => ok += 1,
            Ok(Ok(false)) => bad += 1,
            Ok(Err(why)) => panic!("input {n} (seed {seed}): {why}\n--- input ---\n{}", String::from_utf8_lossy(&input)),
            Err(_) => panic!("input {n} (seed {seed}) panicked\n--- input ---\n{}", String::from_utf8_lossy(&input)),
        }
        assert!(took < Duration::from_secs(5), "input {n} took {took:?}\n{}", String::from_utf8_lossy(&input));
        n += 1;
    }
    (n, ok, bad)
}

#[test]
fn fuzzed_pools_never_panic_hang_or_lose_their_positions() {
    // By default a fixed count, so that every run tests the same inputs; the script sets a time.
    let seconds: Option<f64> = std::env::var("LB_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok());
    let seed: u64 = std::env::var("LB_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    let (inputs, secs) = match seconds {
        Some(s) => (u64::MAX, s),
        None => (4000, 600.0),
    };
    let (n, ok, bad) = fuzz(inputs, secs, seed);
    println!("fuzzed pools: {n} inputs (seed {seed}, at most {secs} s): {ok} accepted and checked, {bad} rejected with file and line");
    assert!(ok > 0 && bad > 0, "the generator should produce both valid and invalid pools ({ok} / {bad})");
}
