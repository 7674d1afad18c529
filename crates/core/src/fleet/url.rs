//! `etcd://HOST:PORT[,HOST:PORT...]/KEY`: where a fleet's pool is kept, and the keys beside it.

use std::fmt;
use std::path::PathBuf;

/// A pool in etcd: the members to ask (any of them answers) and the pool's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl {
    /// `HOST:PORT` of each member, in the order given ([v6]:port for IPv6).
    pub endpoints: Vec<String>,
    /// The pool's key, with its leading `/`: `etcd://h:2379/lb/pool` is `/lb/pool`.
    pub key: String,
}

/// The scheme of a store URL.
pub const SCHEME: &str = "etcd://";

impl StoreUrl {
    /// Whether `--config`'s value names a store rather than a file.
    pub fn is_store(text: &str) -> bool {
        text.starts_with(SCHEME)
    }

    /// Reads `etcd://HOST:PORT[,HOST:PORT...]/KEY`; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<StoreUrl, String> {
        if text.contains('@') {
            // A password in a URL ends up in shell histories, process lists and logs: refused
            // first, and the URL is never echoed.
            return Err(format!("{SCHEME}...: '@' is not allowed in a store URL (no user or password: authenticate with client certificates, --store-cert and --store-key)"));
        }
        let rest = text.strip_prefix(SCHEME).ok_or_else(|| format!("{text:?}: a store URL begins with {SCHEME}"))?;
        let (hosts, key) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => return Err(format!("{text:?}: no key: etcd://HOST:PORT/KEY")),
        };
        let key = key.trim_end_matches('/');
        if key.is_empty() {
            return Err(format!("{text:?}: no key: etcd://HOST:PORT/KEY"));
        }
        if key.contains("//") || key.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(format!("{text:?}: the key {key:?} has an empty segment, a space or a control character"));
        }
        let mut endpoints = Vec::new();
        for h in hosts.split(',') {
            let port_ok = h.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
            if !port_ok {
                return Err(format!("{text:?}: {h:?} is not HOST:PORT"));
            }
            endpoints.push(h.to_string());
        }
        Ok(StoreUrl { endpoints, key: key.to_string() })
    }

    /// The key of the pool the current one replaced.
    pub fn previous_key(&self) -> String {
        format!("{}/previous", self.key)
    }

    /// The prefix of every node's view.
    pub fn nodes_prefix(&self) -> String {
        format!("{}/nodes/", self.key)
    }

    /// The key of `node`'s view.
    pub fn node_key(&self, node: &str) -> String {
        format!("{}{node}", self.nodes_prefix())
    }

    /// How errors name the pool written at `revision`, and the pool it replaced:
    /// `etcd://h:2379/lb/pool@7`, `etcd://h:2379/lb/pool/previous@7`.
    pub fn names_at(&self, revision: u64) -> (PathBuf, PathBuf) {
        (PathBuf::from(format!("{self}@{revision}")), PathBuf::from(format!("{self}/previous@{revision}")))
    }

    /// The end (exclusive) of the key range that holds the pool, its previous pool and the views:
    /// `KEY` up to `KEY0` (`0` follows `/`). Keys in it that are none of those (`KEY-staging`)
    /// are not lb's and are ignored.
    pub fn range_end(&self) -> String {
        format!("{}0", self.key)
    }

    /// What a key of the range is to lb.
    pub fn classify<'k>(&self, key: &'k str) -> Entry<'k> {
        if key == self.key {
            return Entry::Pool;
        }
        if key == self.previous_key() {
            return Entry::Previous;
        }
        match key.strip_prefix(&self.nodes_prefix()) {
            Some(node) if !node.is_empty() => Entry::Node(node),
            _ => Entry::Other,
        }
    }
}

/// A key of a pool's range, by what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'k> {
    Pool,
    Previous,
    Node(&'k str),
    Other,
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}{}", self.endpoints.join(","), self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_name_members_and_a_key() {
        let u = StoreUrl::parse("etcd://10.0.0.1:2379,10.0.0.2:2379,[fd00::3]:2379/lb/pool").unwrap();
        assert_eq!(u.endpoints, ["10.0.0.1:2379", "10.0.0.2:2379", "[fd00::3]:2379"]);
        assert_eq!(u.key, "/lb/pool");
        assert_eq!(u.to_string(), "etcd://10.0.0.1:2379,10.0.0.2:2379,[fd00::3]:2379/lb/pool");
        assert_eq!(u.previous_key(), "/lb/pool/previous");
        assert_eq!(u.node_key("a"), "/lb/pool/nodes/a");
        assert_eq!(u.classify("/lb/pool"), Entry::Pool);
        assert_eq!(u.classify("/lb/pool/previous"), Entry::Previous);
        assert_eq!(u.classify("/lb/pool/nodes/a"), Entry::Node("a"));
        assert_eq!(u.classify("/lb/pool-staging"), Entry::Other);
        assert_eq!(u.classify("/lb/pool/nodes/"), Entry::Other);
        assert!("/lb/pool-staging" < u.range_end().as_str() && "/lb/pool/nodes/zz" < u.range_end().as_str());
        assert_eq!(StoreUrl::parse("etcd://h:1/k/").unwrap().key, "/k");
    }

    #[test]
    fn bad_store_urls_say_what_is_wrong_and_never_echo_a_password() {
        for (bad, says) in [
            ("etcd://h:2379", "no key"),
            ("etcd://h:2379/", "no key"),
            ("etcd://h/lb", "not HOST:PORT"),
            ("etcd://h:0/lb", "not HOST:PORT"),
            ("etcd://h:1,/lb", "not HOST:PORT"),
            ("etcd://h:1/a//b", "empty segment"),
            ("etcd://h:1/a b", "space"),
            ("http://h:1/a", "begins with etcd://"),
        ] {
            let e = StoreUrl::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        for with_password in ["etcd://root:hunter2@h:1/lb", "etcd://root:hunter2@h:1", "etcd://root:hun/ter2@h:1/lb", "http://root:hunter2@h:1/lb"] {
            let e = StoreUrl::parse(with_password).unwrap_err();
            assert!(!e.contains("hunter2") && !e.contains("ter2") && e.contains("client certificates"), "{e}");
        }
    }
}
