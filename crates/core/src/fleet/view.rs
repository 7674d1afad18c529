//! A node's view: what one `lb attach --config etcd://...` publishes about itself under
//! `KEY/nodes/NODE`, bound to its lease. The other nodes read the observations in it (health,
//! agents) to decide alike; `lb fleet` reads the rest (what it applied, when, its digests).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One node's view, as JSON in the store. Unknown fields are ignored and missing ones default,
/// so that nodes of two versions read each other's views during an upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeView {
    /// The node's name (`--node-name`, by default the host's name).
    pub node: String,
    /// The interface it serves on, and its lb version.
    pub interface: String,
    pub version: String,
    /// The store revision that wrote the pool it serves (the pool key's mod revision); 0 before
    /// it served one from the store.
    pub pool_revision: u64,
    /// The store revision its tables were last decided at: the pool, and the fleet's health and
    /// agent decisions, as of that revision.
    pub revision: u64,
    /// When it applied that (Unix milliseconds).
    pub applied_ms: u64,
    /// Each service it serves and the digest of its table (`lb status`'s digest).
    pub services: BTreeMap<String, String>,
    /// Per service, the backends its own health checks see down (by identity: name, or address).
    pub down: BTreeMap<String, Vec<String>>,
    /// Per service and backend, what its agent answered this node in the newest epoch asked.
    pub agents: BTreeMap<String, BTreeMap<String, AgentSeen>>,
    /// The newest pool revision it refused, and why; None when it serves the newest.
    pub refused: Option<Refusal>,
    /// Whether it decides alone: cut off from the store, it goes by its own observations.
    pub alone: bool,
}

/// One agent answer as a node saw it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AgentSeen {
    /// The load epoch it was asked in (lb_core::load: the same on every node).
    pub epoch: u64,
    /// The report as an agent line (`ready 75%`); None: no usable answer that epoch.
    pub report: Option<String>,
}

/// A pool revision a node would not apply.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Refusal {
    pub revision: u64,
    pub reason: String,
}

impl NodeView {
    /// The view as stored.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A view read from the store; None for a value that is not one (written by something else).
    pub fn from_json(bytes: &[u8]) -> Option<NodeView> {
        serde_json::from_slice(bytes).ok()
    }

    /// The view under `KEY/nodes/NODE` as the fleet counts it: bound to a lease (a value bound
    /// to none, written by hand or left over, is no live node's), and named by its key whatever
    /// its JSON says. None for anything else.
    pub fn from_store(node: &str, bytes: &[u8], lease: i64) -> Option<NodeView> {
        if lease == 0 {
            return None;
        }
        let mut v = NodeView::from_json(bytes)?;
        v.node = node.to_string();
        Some(v)
    }

    /// Whether this node's own checks see `backend` of `service` down.
    pub fn sees_down(&self, service: &str, backend: &str) -> bool {
        self.down.get(service).is_some_and(|b| b.iter().any(|x| x == backend))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_reads_back_and_tolerates_fields_it_does_not_know() {
        let mut v = NodeView { node: "a".into(), pool_revision: 7, revision: 9, ..NodeView::default() };
        v.down.insert("web".into(), vec!["b2".into()]);
        v.agents.entry("web".into()).or_default().insert("b1".into(), AgentSeen { epoch: 5, report: Some("ready 40%".into()) });
        assert_eq!(NodeView::from_json(v.to_json().as_bytes()), Some(v.clone()));
        assert!(v.sees_down("web", "b2") && !v.sees_down("web", "b1"));
        let newer = br#"{"node":"b","revision":3,"a_field_of_a_later_version":[1,2]}"#;
        assert_eq!(NodeView::from_json(newer).map(|v| (v.node, v.revision)), Some(("b".into(), 3)));
        assert_eq!(NodeView::from_json(b"not json"), None);
        let named = NodeView::from_store("c", br#"{"node":"someone-else"}"#, 7).expect("a view under a lease");
        assert_eq!(named.node, "c", "a view goes by its key's name");
        assert_eq!(NodeView::from_store("c", br#"{"node":"c"}"#, 0), None, "a view bound to no lease counts for nothing");
    }
}
