//! Table build benchmark: prints figures, asserts nothing.
//!
//! Builds the destination table at M = 65537 for N = 10, 100 and 1000 equal-weight backends with
//! our ring and Maglev builders, and does the same work in the same run with the `hashring` crate
//! (a ring of N x 150 virtual nodes, then one lookup per slot) and the `maglev` crate (its lookup
//! table at capacity 65537). Prints medians, peer/ours ratios and peak heap use.
//!
//! Then, for all three builders side by side (ring, Maglev, bounded at several load bounds), at
//! N = 10, 100 and 1000 backends with equal weights and with weights 4:2:3:1 repeated: the
//! balance (the largest backend's slots over its fair share), and the disruption of removing one
//! backend (slots that change owner over the removed backend's slots), averaged over several
//! choices of the backend. Every builder is a function of the set of backends, so adding a
//! backend is the same change the other way round: its disruption (over the added backend's
//! slots) is the same figure. The trade-off table in docs/table-spec.md comes from this.
//!
//! Run: cargo bench --bench tables

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use lb::config::Algorithm;
use lb::table::{self, Member};

/// Counts live heap bytes and their high-water mark, to report peak memory of one build.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const M: u32 = 65537;
const VNODES: u32 = 150;

#[derive(Clone, Hash, PartialEq, Eq)]
struct VNode {
    backend: u32,
    replica: u32,
}

/// Median wall time (ms) over `runs` and the peak heap growth (bytes) of one run.
fn measure(runs: usize, mut f: impl FnMut()) -> (f64, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    f();
    let peak = PEAK.load(Ordering::Relaxed) - base;
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    (times[times.len() / 2], peak)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    // `cargo test --benches` runs this with --bench absent; keep that quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let runs = |n: usize| if quick { 1 } else if n >= 1000 { 9 } else { 21 };

    println!("destination table build at M = {M}, equal weights, {VNODES} vnodes per weight (median of runs)");
    println!(
        "{:<7} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10}  peer",
        "algo", "N", "ours ms", "peer ms", "peer/ours", "ours MiB", "peer MiB"
    );
    for n in [10usize, 100, 1000] {
        let ids: Vec<String> = (0..n).map(|i| format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)).collect();
        let members: Vec<Member> = ids.iter().map(|id| Member { identity: id, weight: 1 }).collect();

        let (ours, ours_mem) = measure(runs(n), || {
            black_box(table::build(Algorithm::Ring, M, VNODES, black_box(&members)));
        });
        let (peer, peer_mem) = measure(runs(n).min(5), || {
            // batch_add sorts once; adding one by one is quadratic (29 s at N = 1000).
            let mut ring = hashring::HashRing::new();
            ring.batch_add((0..n as u32).flat_map(|b| (0..VNODES).map(move |replica| VNode { backend: b, replica })).collect());
            let table: Vec<u32> = (0..M).map(|slot| ring.get(&slot).map_or(u32::MAX, |v| v.backend)).collect();
            black_box(table);
        });
        println!(
            "{:<7} {:>5} {:>10.3} {:>10.3} {:>10.1} {:>10.2} {:>10.2}  hashring 0.3",
            "ring", n, ours, peer, peer / ours, mib(ours_mem), mib(peer_mem)
        );

        let (ours, ours_mem) = measure(runs(n), || {
            black_box(table::build(Algorithm::Maglev, M, VNODES, black_box(&members)));
        });
        let (peer, peer_mem) = measure(runs(n).min(5), || {
            black_box(maglev::Maglev::with_capacity(black_box(ids.clone()), M as usize));
        });
        println!(
            "{:<7} {:>5} {:>10.3} {:>10.3} {:>10.1} {:>10.2} {:>10.2}  maglev 0.2",
            "maglev", n, ours, peer, peer / ours, mib(ours_mem), mib(peer_mem)
        );
    }
    println!("targets at N = 1000: ring <= 10 ms, maglev <= 3 ms, both >= 5x faster than the peer");
    for n in [10usize, 100, 1000] {
        let ids: Vec<String> = (0..n).map(|i| format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)).collect();
        let members: Vec<Member> = ids.iter().map(|id| Member { identity: id, weight: 1 }).collect();
        let (ms, mem) = measure(runs(n), || {
            black_box(table::bounded::build(black_box(&members), M, table::bounded::DEFAULT_LOAD_BOUND));
        });
        println!("{:<7} {:>5} {:>10.3} {:>10} {:>10} {:>10.2} {:>10}  (load_bound 1.02)", "bounded", n, ms, "-", "-", mib(mem), "-");
    }
    tradeoffs(quick);
    cap_cycle(quick);
}

/// A builder under comparison: its name and how it builds a table.
type Builder = (&'static str, Box<dyn Fn(&[Member]) -> table::Table>);

fn builders() -> Vec<Builder> {
    let mut v: Vec<Builder> = vec![
        ("ring (150 vnodes)", Box::new(|m: &[Member]| table::build(Algorithm::Ring, M, VNODES, m))),
        ("maglev", Box::new(|m: &[Member]| table::build(Algorithm::Maglev, M, VNODES, m))),
    ];
    for (name, bound) in [("bounded 1.00", 1000u32), ("bounded 1.02", 1020), ("bounded 1.05", 1050), ("bounded 1.10", 1100)] {
        v.push((name, Box::new(move |m: &[Member]| table::bounded::build(m, M, bound))));
    }
    v
}

/// (balance, removal disruption) of `build` for these members.
fn figures(build: &dyn Fn(&[Member]) -> table::Table, ids: &[String], weights: &[u32], picks: &[usize]) -> (f64, f64) {
    let all: Vec<Member> = ids.iter().zip(weights).map(|(id, &w)| Member { identity: id, weight: w }).collect();
    let full = build(&all);
    let counts = full.counts(all.len());
    let total: u64 = weights.iter().map(|&w| w as u64).sum();
    let balance = counts
        .iter()
        .zip(weights)
        .map(|(&c, &w)| c as f64 / (M as f64 * w as f64 / total as f64))
        .fold(0.0f64, f64::max);
    let owner_ids = |t: &table::Table, m: &[Member]| -> Vec<Option<String>> {
        (0..t.len()).map(|i| t.owner(i).map(|o| m[o].identity.to_string())).collect()
    };
    let full_ids = owner_ids(&full, &all);
    let mut removal = 0.0;
    for &k in picks {
        let rest: Vec<Member> = all.iter().enumerate().filter(|(i, _)| *i != k).map(|(_, m)| *m).collect();
        let without = owner_ids(&build(&rest), &rest);
        let moved = full_ids.iter().zip(&without).filter(|(a, b)| a != b).count() as f64;
        removal += moved / counts[k] as f64;
    }
    (balance, removal / picks.len() as f64)
}

/// The bounded builder's cap is a whole number of slots: where ceil(bound * M / N) steps as N
/// changes, one removal moves more. Removal disruption for every N over a range that crosses
/// steps, at each bound: the worst single change and the mean over the range.
fn cap_cycle(quick: bool) {
    let range: Vec<usize> = if quick { (95..=100).collect() } else { (960..=1000).collect() };
    println!();
    println!(
        "bounded: removing one of N equal backends for every N in {}..={} (the cap ceil(bound * M / N) steps inside it)",
        range[0],
        range[range.len() - 1]
    );
    println!("{:<14} {:>10} {:>10} {:>10}", "load_bound", "min", "mean", "max");
    let ids: Vec<String> = (0..range[range.len() - 1]).map(|i| format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)).collect();
    for bound in [1000u32, 1020, 1050] {
        let mut all = Vec::new();
        for &n in &range {
            let build = move |m: &[Member]| table::bounded::build(m, M, bound);
            let (_, r) = figures(&build, &ids[..n], &vec![1; n], &[n - 1]);
            all.push(r);
        }
        let mean = all.iter().sum::<f64>() / all.len() as f64;
        let (min, max) = all.iter().fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
        println!("{:<14} {:>9.2}x {:>9.2}x {:>9.2}x", format!("{}.{:03}", bound / 1000, bound % 1000), min, mean, max);
    }
}

fn tradeoffs(quick: bool) {
    println!();
    println!("balance (largest backend's slots / its fair share) and disruption (slots that change owner / the removed");
    println!("backend's slots; adding it back is the same figure), M = {M}, averaged over removing 5 backends");
    println!("{:<18} {:>5} {:>9} {:>10} {:>18}", "builder", "N", "weights", "balance", "removal = addition");
    let sizes: &[usize] = if quick { &[10] } else { &[10, 100, 1000] };
    for &n in sizes {
        let ids: Vec<String> = (0..n).map(|i| format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)).collect();
        let picks: Vec<usize> = (0..5).map(|i| i * n / 5).collect();
        for (label, weights) in [("equal", vec![1u32; n]), ("4:2:3:1", (0..n).map(|i| [4u32, 2, 3, 1][i % 4]).collect::<Vec<_>>())] {
            for (name, build) in builders() {
                let (b, r) = figures(build.as_ref(), &ids, &weights, &picks);
                println!("{:<18} {:>5} {:>9} {:>10.3} {:>17.2}x", name, n, label, b, r);
            }
        }
    }
}
