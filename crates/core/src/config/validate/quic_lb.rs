//! `quic_lb:` and the backends' `server_id`: QUIC-LB connection-ID routing (docs/quic-lb.md),
//! with every combination the draft forbids refused where it is written.

use std::collections::{HashMap, HashSet};

use super::{FieldPath, Fields, Validator};
use crate::config::yaml::Node;
use crate::config::{Backend, ConfigError, Protocol, QuicLb, Service};
use crate::quic_lb::{derived_server_id, Config};

impl Validator<'_> {
    /// `quic_lb: {rotation, server_id_len, nonce_len, key}` (UDP services only).
    pub(super) fn quic_lb(&self, f: Fields<'_>, at: &FieldPath, protocol: Protocol) -> Result<Option<QuicLb>, ConfigError> {
        let Some(node) = Self::get(f, "quic_lb") else { return Ok(None) };
        let at = at.key("quic_lb");
        if protocol != Protocol::Udp {
            return Err(self.err(&at, "applies to `protocol: udp` services only (QUIC runs over UDP)"));
        }
        let f = self.mapping(node, &at, &["rotation", "server_id_len", "nonce_len", "key"])?;
        let rotation = match Self::get(f, "rotation") {
            None => 0,
            Some(n) => self.integer(n, &at.key("rotation"), 0, 7)? as u8,
        };
        let server_id_len = match Self::get(f, "server_id_len") {
            None => 2,
            Some(n) => self.integer(n, &at.key("server_id_len"), 0, 20)? as u8,
        };
        let nonce_len = match Self::get(f, "nonce_len") {
            None => 6,
            Some(n) => self.integer(n, &at.key("nonce_len"), 0, 20)? as u8,
        };
        let key = match Self::get(f, "key") {
            None => None,
            Some(n) => {
                let bytes = self.hex(n, &at.key("key"), "a 128-bit key as 32 hex digits", true)?;
                let key: [u8; 16] = bytes.as_slice().try_into().map_err(|_| {
                    self.err(&at.key("key"), format!("{} octets: an AES-128 key is 16 (32 hex digits)", bytes.len()))
                })?;
                Some(key)
            }
        };
        // The draft's rules, each reported at the key that breaks it.
        if let Err(e) = Config::new(rotation, server_id_len as usize, nonce_len as usize, None) {
            use crate::quic_lb::ConfigError as E;
            let field = match e {
                E::Rotation(_) => "rotation",
                E::ServerIdLength(_) => "server_id_len",
                E::NonceLength(_) | E::TooLong(_) => "nonce_len",
            };
            return Err(self.err(&at.key(field), e.to_string()));
        }
        Ok(Some(QuicLb { rotation, server_id_len, nonce_len, key }))
    }

    /// Every backend's server ID under `quic`: as written (of the configured length), or derived
    /// from its identity; no two alike. Without `quic_lb`, a `server_id` is refused.
    pub(super) fn server_ids(&self, mut backends: Vec<Backend>, quic: Option<&QuicLb>, at: &FieldPath) -> Result<Vec<Backend>, ConfigError> {
        let field = |j: usize| at.index(j).key("server_id");
        let Some(quic) = quic else {
            if let Some(j) = backends.iter().position(|b| b.server_id.is_some()) {
                return Err(self.err(&field(j), "applies to services with `quic_lb:` only"));
            }
            return Ok(backends);
        };
        let len = quic.server_id_len as usize;
        let written: Vec<bool> = backends.iter().map(|b| b.server_id.is_some()).collect();
        let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
        for (j, b) in backends.iter_mut().enumerate() {
            let sid = match b.server_id.take() {
                Some(sid) if sid.len() != len => {
                    return Err(self.err(
                        &field(j),
                        format!("{} octets, but quic_lb.server_id_len is {len}", sid.len()),
                    ));
                }
                Some(sid) => sid,
                None => derived_server_id(&b.identity(), len),
            };
            if let Some(&prev) = seen.get(&sid) {
                let how = |k: usize| if written[k] { "written" } else { "derived from its identity" };
                let shown = if written[j] { field(j) } else { at.index(j) };
                return Err(self.err(
                    &shown,
                    format!(
                        "server ID {} ({}) is also backends[{prev}]'s ({}); give one of them another `server_id`{}",
                        crate::quic_lb::hex(&sid),
                        how(j),
                        how(prev),
                        if len < 2 { ", or a longer quic_lb.server_id_len" } else { "" }
                    ),
                ));
            }
            seen.insert(sid.clone(), j);
            b.server_id = Some(sid);
        }
        Ok(backends)
    }

    /// A server ID must not be in plain sight in one service and encrypted in another: the
    /// draft (section 9.7) forbids plaintext and encrypted configurations to share a server-ID
    /// space.
    pub(super) fn quic_lb_spaces(&self, earlier: &[Service], svc: &Service, at: &FieldPath) -> Result<(), ConfigError> {
        let Some(q) = &svc.quic_lb else { return Ok(()) };
        for other in earlier {
            let Some(oq) = &other.quic_lb else { continue };
            if oq.key.is_some() == q.key.is_some() {
                continue;
            }
            let theirs: HashSet<&[u8]> = other.backends.iter().filter_map(|b| b.server_id.as_deref()).collect();
            let shared = svc.backends.iter().position(|b| b.server_id.as_deref().is_some_and(|s| theirs.contains(s)));
            if let Some(j) = shared {
                let sid = svc.backends[j].server_id.as_deref().map(crate::quic_lb::hex).unwrap_or_default();
                let (mine, its) = if q.key.is_some() { ("encrypted", "in plain sight") } else { ("in plain sight", "encrypted") };
                return Err(self.err(
                    &at.key("backends").index(j),
                    format!(
                        "server ID {sid} is {mine} here and {its} in service `{}`: the draft (section 9.7) forbids plaintext and encrypted IDs to share a server-ID space; give one of them another `server_id`",
                        other.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Hex digits (an optional `0x` in front), an even number of them, as octets. With `secret`,
    /// an error does not repeat the text (a key with one wrong digit is still most of a key).
    pub(super) fn hex(&self, node: &Node, at: &FieldPath, what: &str, secret: bool) -> Result<Vec<u8>, ConfigError> {
        let s = match node {
            Node::Str(s) => s.trim(),
            Node::Int(_) | Node::Float(_) => {
                return Err(self.err(at, format!("expected {what}, found a number: quote it ('...'), or YAML reads the digits as a decimal number")))
            }
            other => return Err(self.err(at, format!("expected {what}, found {}", other.kind()))),
        };
        let digits = s.strip_prefix("0x").unwrap_or(s);
        crate::quic_lb::parse_hex(digits).ok_or_else(|| {
            if secret {
                self.err(at, format!("not {what} (the value is not repeated here: it is a key)"))
            } else {
                self.err(at, format!("`{s}` is not {what}"))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse_str;

    fn pool(service_keys: &str, backends: &str) -> Result<crate::config::Pool, String> {
        let text = format!("services:\n  - name: q\n    vip: 10.0.0.1\n    port: 443\n    protocol: udp\n{service_keys}    backends:\n{backends}");
        parse_str("p.yaml", &text).map_err(|e| e.to_string())
    }

    #[test]
    fn server_ids_are_written_or_derived_and_never_shared() {
        let p = pool("    quic_lb: {server_id_len: 2, nonce_len: 6}\n", "      - {address: 10.1.0.1, server_id: '0a1b'}\n      - {address: 10.1.0.2, name: b2}\n").expect("valid");
        let s = &p.services[0];
        assert_eq!(s.backends[0].server_id.as_deref(), Some(&[0x0a, 0x1b][..]));
        assert_eq!(s.backends[1].server_id, Some(crate::quic_lb::derived_server_id("b2", 2)));
        let same = crate::quic_lb::hex(&crate::quic_lb::derived_server_id("b2", 2));
        let e = pool("    quic_lb: {}\n", &format!("      - {{address: 10.1.0.1, server_id: '{same}'}}\n      - {{address: 10.1.0.2, name: b2}}\n")).unwrap_err();
        assert!(e.contains("services[0].backends[1]") && e.contains("also backends[0]"), "{e}");
    }

    #[test]
    fn what_the_draft_forbids_is_refused_at_its_key() {
        let b = "      - 10.1.0.1\n";
        for (keys, field, words) in [
            ("    quic_lb: {rotation: 7}\n", "quic_lb.rotation", "0b111"),
            ("    quic_lb: {server_id_len: 0}\n", "quic_lb.server_id_len", "at least 1"),
            ("    quic_lb: {nonce_len: 3}\n", "quic_lb.nonce_len", "at least 4"),
            ("    quic_lb: {server_id_len: 2, nonce_len: 18}\n", "quic_lb.nonce_len", "at most 19"),
            ("    quic_lb: {key: '00112233'}\n", "quic_lb.key", "16 (32 hex digits)"),
            ("    quic_lb: {key: 'zz112233445566778899aabbccddeeff'}\n", "quic_lb.key", "not a 128-bit key"),
            ("    quic_lb: {bits: 1}\n", "quic_lb", "bits"),
        ] {
            let e = pool(keys, b).unwrap_err();
            assert!(e.contains(field) && e.contains(words), "{keys}: {e}");
        }
        let e = parse_str("p.yaml", "services:\n  - {name: t, vip: 10.0.0.1, port: 443, quic_lb: {}, backends: [10.1.0.1]}\n").unwrap_err().to_string();
        assert!(e.contains("quic_lb") && e.contains("udp"), "{e}");
        let e = pool("", "      - {address: 10.1.0.1, server_id: '0a'}\n").unwrap_err();
        assert!(e.contains("backends[0].server_id") && e.contains("quic_lb"), "{e}");
        let e = pool("    quic_lb: {}\n", "      - {address: 10.1.0.1, server_id: '0a'}\n").unwrap_err();
        assert!(e.contains("1 octets, but quic_lb.server_id_len is 2"), "{e}");
        let e = pool("    quic_lb: {}\n", "      - {address: 10.1.0.1, server_id: 1234}\n").unwrap_err();
        assert!(e.contains("quote it"), "{e}");
        assert!(pool("    quic_lb: {server_id_len: 1, nonce_len: 18, key: 8f95f09245765f80256934e50c66207f}\n", b).is_ok(), "nonces up to 18 octets");
        let e = pool("    quic_lb: {key: '8f95f09245765f80256934e50c6620zz'}\n", b).unwrap_err();
        assert!(e.contains("quic_lb.key") && !e.contains("8f95f09245765f8025"), "a key's error never repeats it: {e}");
    }

    #[test]
    fn one_server_id_is_never_both_in_plain_sight_and_encrypted() {
        let two = |second_key: &str, second_sid: &str| {
            let text = format!("services:\n  - {{name: a, vip: 10.0.0.1, port: 443, protocol: udp, quic_lb: {{}}, backends: [{{address: 10.1.0.1, name: b1}}]}}\n  - {{name: e, vip: 10.0.0.2, port: 443, protocol: udp, quic_lb: {{{second_key}}}, backends: [{{address: 10.1.0.1, name: b1{second_sid}}}]}}\n");
            parse_str("p.yaml", &text).map_err(|e| e.to_string())
        };
        let e = two("key: 8f95f09245765f80256934e50c66207f", "").unwrap_err();
        assert!(e.contains("services[1].backends[0]") && e.contains("section 9.7") && e.contains("service `a`"), "{e}");
        assert!(two("key: 8f95f09245765f80256934e50c66207f", ", server_id: 'beef'").is_ok(), "another ID: allowed");
        assert!(two("", "").is_ok(), "both in plain sight: one space");
    }
}
