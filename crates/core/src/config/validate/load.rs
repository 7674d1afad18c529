//! `agent:` and `slow_start:`: the keys that let lb scale a service's weights at run time
//! (crates/core/src/load/, docs/load.md).

use super::{FieldPath, Fields, Validator};
use crate::config::yaml::Node;
use crate::config::{AgentCheck, ConfigError, Service, SlowStart, MAX_RING_TOKENS, WEIGHT_STEPS};

impl Validator<'_> {
    /// `agent: {port, path, interval, timeout}`; `path` makes it an HTTP GET.
    pub(super) fn agent(&self, f: Fields<'_>, at: &FieldPath) -> Result<Option<AgentCheck>, ConfigError> {
        let Some(node) = Self::get(f, "agent") else { return Ok(None) };
        let at = at.key("agent");
        let f = self.mapping(node, &at, &["port", "path", "interval", "timeout"])?;
        let port = self.integer(self.required(f, &at, "port")?, &at.key("port"), 1, 65535)? as u16;
        let path = match Self::get(f, "path") {
            None => None,
            Some(n) => Some(self.http_path(n, &at.key("path"), "a path such as /load")?),
        };
        let interval = match Self::get(f, "interval") {
            None => std::time::Duration::from_secs(2),
            Some(n) => self.duration(n, &at.key("interval"), 0.5, 3600.0)?,
        };
        // A report must be in before the interval's decision, 90% into it; the poll starts at
        // 30%.
        let longest = interval / 2;
        let timeout = match Self::get(f, "timeout") {
            None => std::time::Duration::from_secs(1).min(longest),
            Some(n) => self.duration(n, &at.key("timeout"), 0.01, 1800.0)?,
        };
        if timeout > longest {
            return Err(self.err(
                &at.key("timeout"),
                format!("{timeout:?} is longer than half the interval ({longest:?}); a report must be in before the interval's weights are decided"),
            ));
        }
        Ok(Some(AgentCheck { port, path, interval, timeout }))
    }

    /// `slow_start: 30s`, or `slow_start: {window: 30s, min: 10%, aggression: 1.0}`.
    pub(super) fn slow_start(&self, f: Fields<'_>, at: &FieldPath) -> Result<Option<SlowStart>, ConfigError> {
        let Some(node) = Self::get(f, "slow_start") else { return Ok(None) };
        let at = at.key("slow_start");
        let window_of = |n: &Node, at: &FieldPath| self.duration(n, at, 1.0, 3600.0);
        if !matches!(node, Node::Map(_)) {
            return Ok(Some(SlowStart { window: window_of(node, &at)?, min_percent: 10, aggression: 1.0 }));
        }
        let f = self.mapping(node, &at, &["window", "min", "aggression"])?;
        let window = window_of(self.required(f, &at, "window")?, &at.key("window"))?;
        let min_percent = match Self::get(f, "min") {
            None => 10,
            Some(n) => self.percent(n, &at.key("min"))?,
        };
        let aggression = match Self::get(f, "aggression") {
            None => 1.0,
            Some(n) => {
                let x = match n {
                    Node::Int(i) => *i as f64,
                    Node::Float(x) => *x,
                    other => return Err(self.err(&at.key("aggression"), format!("expected a number from 0.1 to 10, found {}", other.kind()))),
                };
                if !(0.1..=10.0).contains(&x) {
                    return Err(self.err(&at.key("aggression"), format!("expected a number from 0.1 to 10, found {x}")));
                }
                x
            }
        };
        Ok(Some(SlowStart { window, min_percent, aggression }))
    }

    /// `10%` or `10`: a whole percentage 0..=100.
    fn percent(&self, node: &Node, at: &FieldPath) -> Result<u32, ConfigError> {
        match node {
            Node::Str(s) => match s.trim().strip_suffix('%').map(|n| n.trim().parse::<u32>()) {
                Some(Ok(v)) if v <= 100 => Ok(v),
                _ => Err(self.err(at, format!("`{s}` is not a percentage: expected 0% to 100%"))),
            },
            n => self.integer(n, at, 0, 100),
        }
    }

    /// A service whose weights lb scales builds its ring with WEIGHT_STEPS times the tokens:
    /// they must fit too. `at` is the service.
    pub(super) fn scaled_ring_size(&self, svc: &Service, at: &FieldPath) -> Result<(), ConfigError> {
        if svc.algorithm != crate::config::Algorithm::Ring || !svc.load_aware() {
            return Ok(());
        }
        let tokens = svc.total_weight() * svc.vnodes_per_weight as u64 * WEIGHT_STEPS as u64;
        if tokens > MAX_RING_TOKENS {
            return Err(self.err(
                &at.key("algorithm"),
                format!(
                    "with `agent` or `slow_start` the ring is built in {WEIGHT_STEPS} steps per unit of weight: {tokens} tokens, over the limit of {MAX_RING_TOKENS}; \
                     use `algorithm: bounded` (the default for such services) or lower the weights or vnodes_per_weight"
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{parse_str, Algorithm};
    use std::time::Duration;

    const HEAD: &str = "services:\n  - name: web\n    vip: 10.0.0.1\n    port: 80\n    backends: [10.0.0.2, 10.0.0.3]\n";

    #[test]
    fn agent_and_slow_start_parse_with_their_defaults_and_choose_the_bounded_table() {
        let p = parse_str("p.yaml", &format!("{HEAD}    agent: {{port: 4050}}\n    slow_start: 30s\n")).expect("valid");
        let s = &p.services[0];
        let a = s.agent.clone().expect("agent");
        assert_eq!((a.port, a.path, a.interval, a.timeout), (4050, None, Duration::from_secs(2), Duration::from_secs(1)));
        let ss = s.slow_start.clone().expect("slow start");
        assert_eq!((ss.window, ss.min_percent, ss.aggression), (Duration::from_secs(30), 10, 1.0));
        assert_eq!(s.algorithm, Algorithm::Bounded, "tables that change this often move least with bounded");
        let p = parse_str(
            "p.yaml",
            &format!("{HEAD}    algorithm: maglev\n    slots: 65537\n    agent: {{port: 4050, path: /load, interval: 1s}}\n    slow_start: {{window: 1m, min: 5%, aggression: 2}}\n"),
        )
        .expect("valid");
        let s = &p.services[0];
        assert_eq!(s.algorithm, Algorithm::Maglev, "an algorithm written down stands");
        let a = s.agent.clone().expect("agent");
        assert_eq!((a.path.as_deref(), a.interval, a.timeout), (Some("/load"), Duration::from_secs(1), Duration::from_millis(500)));
        assert_eq!(s.slow_start.clone().map(|x| (x.window.as_secs(), x.min_percent, x.aggression)), Some((60, 5, 2.0)));
        assert_eq!(parse_str("p.yaml", HEAD).expect("valid").services[0].algorithm, Algorithm::Ring);
    }

    #[test]
    fn bad_agent_and_slow_start_keys_name_their_field() {
        for (extra, want) in [
            ("    agent: {path: /load}\n", "p.yaml:6:12: services[0].agent: missing required key `port`"),
            ("    agent: {port: 4050, interval: 100ms}\n", "p.yaml:6:35: services[0].agent.interval: expected a duration from 0.5s to 3600s, found 0.1s"),
            ("    agent: {port: 4050, interval: 1s, timeout: 600ms}\n", "services[0].agent.timeout: 600ms is longer than half the interval (500ms)"),
            ("    agent: {port: 4050, path: load}\n", "services[0].agent.path: `load` is not a path"),
            ("    slow_start: 0.5s\n", "p.yaml:6:17: services[0].slow_start: expected a duration from 1s to 3600s, found 0.5s"),
            ("    slow_start: {window: 30s, min: 120%}\n", "services[0].slow_start.min: `120%` is not a percentage"),
            ("    slow_start: {window: 30s, aggression: 0}\n", "services[0].slow_start.aggression: expected a number from 0.1 to 10, found 0"),
            ("    slow_start: {min: 10}\n", "services[0].slow_start: missing required key `window`"),
        ] {
            let e = parse_str("p.yaml", &format!("{HEAD}{extra}")).expect_err(extra).to_string();
            assert!(e.contains(want), "{extra}: {e}");
        }
        let heavy = "services:\n  - name: web\n    vip: 10.0.0.1\n    port: 80\n    algorithm: ring\n    slow_start: 10s\n    backends: [{address: 10.0.0.2, weight: 1000}, {address: 10.0.0.3, weight: 1000}]\n";
        let e = parse_str("p.yaml", heavy).expect_err("too many tokens").to_string();
        assert!(e.contains("p.yaml:5:16: services[0].algorithm: with `agent` or `slow_start` the ring is built in 100 steps per unit of weight: 30000000 tokens"), "{e}");
        assert!(parse_str("p.yaml", &heavy.replace("    slow_start: 10s\n", "")).is_ok(), "the same ring without scaling fits");
    }
}
