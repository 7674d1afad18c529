//! Table build benchmark: prints figures, asserts nothing.
//!
//! Builds the destination table at M = 65537 for N = 10, 100 and 1000 equal-weight backends with
//! our ring and Maglev builders, and does the same work in the same run with the `hashring` crate
//! (a ring of N x 150 virtual nodes, then one lookup per slot) and the `maglev` crate (its lookup
//! table at capacity 65537). Prints medians, peer/ours ratios and peak heap use.
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
}
