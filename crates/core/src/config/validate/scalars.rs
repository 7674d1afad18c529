//! The shapes every key group is built from: a mapping with known keys, a string, an integer in
//! a range, one of a few words, an address, a duration.

use std::net::IpAddr;

use super::{FieldPath, Fields, Validator};
use crate::config::yaml::Node;
use crate::config::ConfigError;

impl Validator<'_> {
    /// Checks that `node` is a mapping with only `allowed` keys, and returns its entries.
    pub(super) fn mapping<'n>(&self, node: &'n Node, at: &FieldPath, allowed: &[&str]) -> Result<Fields<'n>, ConfigError> {
        let Node::Map(entries) = node else {
            return Err(self.err(at, format!("expected a mapping, found {}", node.kind())));
        };
        for (i, (k, _)) in entries.iter().enumerate() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.err_located(
                    &at.key(k),
                    &at.key_at(i),
                    format!("unknown key `{k}`; expected one of: {}", allowed.join(", ")),
                ));
            }
        }
        Ok(entries)
    }

    pub(super) fn get<'n>(fields: Fields<'n>, key: &str) -> Option<&'n Node> {
        fields.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub(super) fn required<'n>(&self, fields: Fields<'n>, at: &FieldPath, key: &str) -> Result<&'n Node, ConfigError> {
        Self::get(fields, key).ok_or_else(|| self.err(at, format!("missing required key `{key}`")))
    }

    pub(super) fn string<'n>(&self, node: &'n Node, at: &FieldPath, what: &str) -> Result<&'n str, ConfigError> {
        match node {
            Node::Str(s) => Ok(s),
            other => Err(self.err(at, format!("expected {what}, found {}", other.kind()))),
        }
    }

    /// An HTTP request path (`what` names an example for the error): starts with `/`, at most
    /// 1024 bytes, no whitespace or control characters.
    pub(super) fn http_path(&self, node: &Node, at: &FieldPath, what: &str) -> Result<String, ConfigError> {
        let s = self.string(node, at, what)?;
        if !s.starts_with('/') || s.len() > 1024 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(self.err(at, format!("`{s}` is not a path: it must start with / and hold no spaces")));
        }
        Ok(s.to_string())
    }

    pub(super) fn integer(&self, node: &Node, at: &FieldPath, lo: u32, hi: u32) -> Result<u32, ConfigError> {
        let msg = || format!("expected an integer {lo}..={hi}");
        match node {
            Node::Int(i) if (lo as i128..=hi as i128).contains(i) => Ok(*i as u32),
            Node::Int(i) => Err(self.err(at, format!("{}, found {i}", msg()))),
            other => Err(self.err(at, format!("{}, found {}", msg(), other.kind()))),
        }
    }

    pub(super) fn choice<T: Copy>(&self, node: &Node, at: &FieldPath, options: &[(&str, T)]) -> Result<T, ConfigError> {
        let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
        let expected = names.join(" | ");
        let s = self.string(node, at, &format!("one of {expected}"))?;
        options
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, v)| *v)
            .ok_or_else(|| self.err(at, format!("expected one of {expected}, found `{s}`")))
    }

    pub(super) fn address(&self, node: &Node, at: &FieldPath) -> Result<IpAddr, ConfigError> {
        let s = self.string(node, at, "an IPv4 or IPv6 address")?;
        let addr: IpAddr = s
            .trim()
            .parse()
            .map_err(|_| self.err(at, format!("`{s}` is not an IPv4 or IPv6 address")))?;
        if let Some(why) = not_unicast(addr) {
            return Err(self.err(at, format!("{addr} is {why}; expected a unicast address")));
        }
        Ok(addr)
    }

    /// `2s`, `500ms`, `1.5s`, `1m`, or a number of seconds, within lo..=hi seconds.
    pub(super) fn duration(&self, node: &Node, at: &FieldPath, lo: f64, hi: f64) -> Result<std::time::Duration, ConfigError> {
        let secs = match node {
            Node::Int(i) => *i as f64,
            Node::Float(x) => *x,
            Node::Str(s) => {
                let t = s.trim();
                let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
                    Some(i) => t.split_at(i),
                    None => (t, "s"),
                };
                let scale = match unit {
                    "ms" => 0.001,
                    "s" => 1.0,
                    "m" => 60.0,
                    _ => return Err(self.err(at, format!("`{s}` is not a duration: use a number with ms, s or m, such as 2s"))),
                };
                match num.trim().parse::<f64>() {
                    Ok(v) => v * scale,
                    Err(_) => return Err(self.err(at, format!("`{s}` is not a duration: use a number with ms, s or m, such as 2s"))),
                }
            }
            other => return Err(self.err(at, format!("expected a duration such as 2s, found {}", other.kind()))),
        };
        if !(lo..=hi).contains(&secs) {
            return Err(self.err(at, format!("expected a duration from {lo}s to {hi}s, found {secs}s")));
        }
        Ok(std::time::Duration::from_secs_f64(secs))
    }
}

/// Why an address cannot be a VIP or a backend, if it cannot.
fn not_unicast(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(a) if a.is_unspecified() => Some("the unspecified address"),
        IpAddr::V4(a) if a.is_broadcast() => Some("the broadcast address"),
        IpAddr::V4(a) if a.is_multicast() => Some("a multicast address"),
        IpAddr::V4(a) if a.octets()[0] == 0 => Some("in 0.0.0.0/8 (\"this network\")"),
        IpAddr::V6(a) if a.is_unspecified() => Some("the unspecified address"),
        IpAddr::V6(a) if a.is_multicast() => Some("a multicast address"),
        IpAddr::V6(a) if a.to_ipv4_mapped().is_some() => Some("an IPv4-mapped IPv6 address (write the IPv4 form)"),
        _ => None,
    }
}
