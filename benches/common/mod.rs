//! What the per-packet benchmarks over many flows share (benches/flows.rs, benches/traffic.rs):
//! one pass's measurement, and the median of several.

/// What one pass measured: mean ns per packet, and the shares of tracked packets that found
/// their flow-table entry (`hits`) and that a stable slot sent by the table without a lookup
/// (`stable`).
#[derive(Clone, Copy, Default)]
pub struct Pass {
    pub ns: f64,
    pub hits: f64,
    pub stable: f64,
}

/// The median time of several passes, with their mean shares (all 0 for none).
pub fn median(v: &[Pass]) -> Pass {
    let mut t: Vec<f64> = v.iter().map(|p| p.ns).collect();
    t.sort_by(|a, b| a.total_cmp(b));
    let mean = |f: fn(&Pass) -> f64| v.iter().map(f).sum::<f64>() / v.len().max(1) as f64;
    Pass {
        ns: t.get(t.len() / 2).copied().unwrap_or(0.0),
        hits: mean(|p| p.hits),
        stable: mean(|p| p.stable),
    }
}
