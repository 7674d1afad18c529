//! The table keys of a service: `algorithm`, `slots`, `vnodes_per_weight` and `load_bound`,
//! and the ring's size limit. They are checked together because which of them apply, and what
//! `slots` may be, depends on the algorithm.

use super::{FieldPath, Fields, Validator};
use crate::config::yaml::Node;
use crate::config::{
    Algorithm, ConfigError, Service, DEFAULT_LOAD_BOUND, DEFAULT_SLOTS, DEFAULT_VNODES_PER_WEIGHT, MAX_LOAD_BOUND, MAX_RING_TOKENS, MAX_SLOTS,
    MAX_VNODES_PER_WEIGHT, MIN_LOAD_BOUND,
};

/// The table keys of one service, with their defaults filled in.
pub(super) struct TableKeys {
    pub(super) algorithm: Algorithm,
    pub(super) slots: u32,
    pub(super) vnodes_per_weight: u32,
    pub(super) load_bound: u32,
}

impl Validator<'_> {
    /// `algorithm`, then `slots` (prime for maglev), then the parameters that only one
    /// algorithm takes.
    pub(super) fn table_keys(&self, f: Fields<'_>, at: &FieldPath) -> Result<TableKeys, ConfigError> {
        let algorithm = match Self::get(f, "algorithm") {
            // Tables whose weights lb scales at run time change often: bounded moves least.
            None if Self::get(f, "agent").is_some() || Self::get(f, "slow_start").is_some() => Algorithm::Bounded,
            None => Algorithm::Ring,
            Some(n) => self.choice(
                n,
                &at.key("algorithm"),
                &[("ring", Algorithm::Ring), ("maglev", Algorithm::Maglev), ("bounded", Algorithm::Bounded)],
            )?,
        };
        let slots = match Self::get(f, "slots") {
            None => DEFAULT_SLOTS,
            Some(n) => self.integer(n, &at.key("slots"), 1, MAX_SLOTS)?,
        };
        if algorithm == Algorithm::Maglev && !is_prime(slots) {
            return Err(self.err(
                &at.key("slots"),
                format!("maglev needs a prime table size, and {slots} is not prime (nearby primes: {})", nearby_primes(slots)),
            ));
        }
        let vnodes_per_weight = match Self::get(f, "vnodes_per_weight") {
            None => DEFAULT_VNODES_PER_WEIGHT,
            Some(_) if algorithm != Algorithm::Ring => {
                return Err(self.err(&at.key("vnodes_per_weight"), "applies to `algorithm: ring` only"));
            }
            Some(n) => self.integer(n, &at.key("vnodes_per_weight"), 1, MAX_VNODES_PER_WEIGHT)?,
        };
        let load_bound = match Self::get(f, "load_bound") {
            None => DEFAULT_LOAD_BOUND,
            Some(_) if algorithm != Algorithm::Bounded => {
                return Err(self.err(&at.key("load_bound"), "applies to `algorithm: bounded` only"));
            }
            Some(n) => self.load_bound(n, &at.key("load_bound"))?,
        };
        Ok(TableKeys { algorithm, slots, vnodes_per_weight, load_bound })
    }

    /// `1.02`: a number from 1.000 to 2.000 with at most three decimals, as thousandths.
    fn load_bound(&self, node: &Node, at: &FieldPath) -> Result<u32, ConfigError> {
        let bad = |what: String| self.err(at, format!("{what}: expected a number from 1.000 to 2.000 with at most three decimals"));
        let x = match node {
            Node::Int(i) => *i as f64,
            Node::Float(x) => *x,
            other => return Err(bad(other.kind().to_string())),
        };
        let milli = (x * 1000.0).round();
        if (x * 1000.0 - milli).abs() > 1e-6 {
            return Err(bad(format!("{x} has more than three decimals")));
        }
        if !(MIN_LOAD_BOUND as f64..=MAX_LOAD_BOUND as f64).contains(&milli) {
            return Err(bad(format!("{x}")));
        }
        Ok(milli as u32)
    }

    /// A ring holds a token per unit of weight per vnode, and only a whole service knows its
    /// total weight: this runs once the backends are read. `at` is the service.
    pub(super) fn ring_size(&self, svc: &Service, at: &FieldPath) -> Result<(), ConfigError> {
        if svc.algorithm != Algorithm::Ring {
            return Ok(());
        }
        let vnodes_per_weight = svc.vnodes_per_weight;
        let tokens = svc.total_weight() * vnodes_per_weight as u64;
        if tokens > MAX_RING_TOKENS {
            return Err(self.err(
                &at.key("backends"),
                format!(
                    "the ring would have {tokens} tokens (total weight {} x vnodes_per_weight {vnodes_per_weight}); \
                     the limit is {MAX_RING_TOKENS}: lower the weights or vnodes_per_weight",
                    svc.total_weight()
                ),
            ));
        }
        Ok(())
    }
}

pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    if n % 2 == 0 {
        return n == 2;
    }
    let n = n as u64;
    let mut d = 3u64;
    while d * d <= n {
        if n % d == 0 {
            return false;
        }
        d += 2;
    }
    true
}

fn nearby_primes(n: u32) -> String {
    let below = (2..n).rev().find(|&k| is_prime(k));
    let above = (n + 1..=MAX_SLOTS).find(|&k| is_prime(k));
    match (below, above) {
        (Some(b), Some(a)) => format!("{b}, {a}"),
        (Some(b), None) => b.to_string(),
        (None, Some(a)) => a.to_string(),
        (None, None) => "none".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_str;

    #[test]
    fn bounded_takes_a_load_bound_in_thousandths() {
        let p = parse_str("p.yaml", "services:\n  - {name: a, vip: 10.0.0.1, port: 80, algorithm: bounded, slots: 1000, backends: [10.1.0.1]}\n  - {name: b, vip: 10.0.0.1, port: 81, algorithm: bounded, load_bound: 1.005, backends: [10.1.0.1]}\n  - {name: c, vip: 10.0.0.1, port: 82, algorithm: bounded, load_bound: 2, backends: [10.1.0.1]}\n").expect("valid");
        assert_eq!(p.services.iter().map(|s| s.load_bound).collect::<Vec<_>>(), [1020, 1005, 2000]);
        assert_eq!(p.services[0].algorithm, Algorithm::Bounded);
        let e = parse_str("p.yaml", "services:\n  - {name: a, vip: 10.0.0.1, port: 80, algorithm: bounded, vnodes_per_weight: 10, backends: [10.1.0.1]}\n").unwrap_err();
        assert!(e.to_string().contains("vnodes_per_weight: applies to `algorithm: ring` only"), "{e}");
    }

    #[test]
    fn primes() {
        let small: Vec<u32> = (0..30).filter(|&n| is_prime(n)).collect();
        assert_eq!(small, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert!(is_prime(65537));
        assert!(!is_prime(65536));
        assert!(is_prime(1_048_573));
        assert_eq!(nearby_primes(65536), "65521, 65537");
    }
}
