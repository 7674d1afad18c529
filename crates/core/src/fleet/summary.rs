//! What `lb fleet` prints: the pool's revision, every live node's view beside it, how far each
//! lags, and every disagreement.

use serde_json::{json, Value};

use super::view::NodeView;

/// The fleet as the store holds it at one revision.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The store's revision when it was read.
    pub revision: u64,
    /// The revision that wrote the pool (0: no pool at the key).
    pub pool_revision: u64,
    /// Each live node's view, by name.
    pub nodes: Vec<NodeView>,
    /// What disagrees, one line each; empty when every node serves the newest pool alike.
    pub problems: Vec<String>,
}

impl Summary {
    /// Reads the views against the pool's revision.
    pub fn new(revision: u64, pool_revision: u64, mut nodes: Vec<NodeView>) -> Summary {
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        let mut problems = Vec::new();
        if pool_revision == 0 {
            problems.push("no pool at the key: push one with lb push".to_string());
        }
        if nodes.is_empty() {
            problems.push("no node is live (none holds a view in the store)".to_string());
        }
        for n in &nodes {
            if let Some(r) = &n.refused {
                problems.push(format!("{} refused revision {}: {}", n.node, r.revision, r.reason));
            }
            if pool_revision > 0 && n.pool_revision < pool_revision {
                problems.push(format!("{} serves revision {} of the pool, not {}", n.node, n.pool_revision, pool_revision));
            }
            if n.alone {
                problems.push(format!("{} decides alone: it lost the store", n.node));
            }
        }
        // Nodes on the newest pool must serve the same tables: any two digests that differ are
        // named, against the digests most of them serve.
        let current: Vec<&NodeView> = nodes.iter().filter(|n| n.pool_revision == pool_revision).collect();
        let mut counts: Vec<(&std::collections::BTreeMap<String, String>, usize)> = Vec::new();
        for n in &current {
            match counts.iter_mut().find(|(d, _)| *d == &n.services) {
                Some((_, c)) => *c += 1,
                None => counts.push((&n.services, 1)),
            }
        }
        if counts.len() > 1 {
            let most = counts.iter().max_by_key(|(_, c)| *c).map(|(d, _)| *d);
            for n in &current {
                if Some(&n.services) != most {
                    problems.push(format!("{} serves other tables than the rest: {}", n.node, digests(n)));
                }
            }
        }
        Summary { revision, pool_revision, nodes, problems }
    }

    /// Whether every live node serves the newest pool with the same tables.
    pub fn agrees(&self) -> bool {
        self.problems.is_empty()
    }

    pub fn json(&self, now_ms: u64) -> Value {
        let nodes: Vec<Value> = self
            .nodes
            .iter()
            .map(|n| {
                json!({
                    "node": n.node,
                    "interface": n.interface,
                    "version": n.version,
                    "pool_revision": n.pool_revision,
                    "lag": self.pool_revision.saturating_sub(n.pool_revision),
                    "revision": n.revision,
                    "applied_ms": n.applied_ms,
                    "applied_ago_ms": now_ms.saturating_sub(n.applied_ms),
                    "services": n.services,
                    "down": n.down,
                    "refused": n.refused.as_ref().map(|r| json!({"revision": r.revision, "reason": r.reason})),
                    "alone": n.alone,
                })
            })
            .collect();
        json!({
            "revision": self.revision,
            "pool_revision": self.pool_revision,
            "agree": self.agrees(),
            "nodes": nodes,
            "problems": self.problems,
        })
    }

    pub fn text(&self, now_ms: u64) -> String {
        let mut out = format!("pool revision {} (store at {}); {} live node(s)\n", self.pool_revision, self.revision, self.nodes.len());
        for n in &self.nodes {
            let lag = match self.pool_revision.saturating_sub(n.pool_revision) {
                0 => "current".to_string(),
                _ => format!("behind (serves {})", n.pool_revision),
            };
            out.push_str(&format!(
                "  {}: pool revision {} {lag}, decided at {}, applied {}; {}\n",
                n.node,
                n.pool_revision,
                n.revision,
                since_ms_text(now_ms, n.applied_ms),
                digests(n)
            ));
        }
        if self.problems.is_empty() {
            out.push_str("every node serves the newest pool with the same tables\n");
        } else {
            for p in &self.problems {
                out.push_str(&format!("disagreement: {p}\n"));
            }
        }
        out
    }
}

/// `12.3 s ago`, or `never` for a time never set.
fn since_ms_text(now_ms: u64, ms: u64) -> String {
    if ms == 0 {
        return "never".to_string();
    }
    format!("{:.1} s ago", now_ms.saturating_sub(ms) as f64 / 1e3)
}

fn digests(n: &NodeView) -> String {
    if n.services.is_empty() {
        return "no services".to_string();
    }
    n.services.iter().map(|(s, d)| format!("{s} {d}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, rev: u64, digest: &str) -> NodeView {
        let mut v = NodeView { node: name.into(), pool_revision: rev, revision: rev, applied_ms: 1_000, ..NodeView::default() };
        v.services.insert("web".into(), digest.into());
        v
    }

    #[test]
    fn a_fleet_that_agrees_says_so_and_one_that_does_not_names_who() {
        let s = Summary::new(12, 10, vec![node("b", 10, "aa"), node("a", 10, "aa")]);
        assert!(s.agrees(), "{:?}", s.problems);
        assert_eq!(s.nodes[0].node, "a", "sorted by name");
        assert!(s.text(3_000).contains("every node serves the newest pool"));

        let s = Summary::new(12, 10, vec![node("a", 10, "aa"), node("b", 10, "aa"), node("c", 10, "bb"), node("d", 8, "cc")]);
        assert!(!s.agrees());
        assert!(s.problems.iter().any(|p| p.starts_with("c serves other tables")), "{:?}", s.problems);
        assert!(s.problems.iter().any(|p| p.starts_with("d serves revision 8")), "{:?}", s.problems);
        let j = s.json(3_000);
        assert_eq!(j["nodes"][3]["lag"], 2);
        assert_eq!(j["nodes"][0]["applied_ago_ms"], 2_000);
        assert_eq!(j["agree"], false);
        assert!(Summary::new(5, 0, vec![]).problems.len() == 2);
    }
}
