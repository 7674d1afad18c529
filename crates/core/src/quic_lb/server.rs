//! What one QUIC server needs to issue routable QUIC-LB connection IDs, and the short YAML text
//! in which it travels from lb (which allocates server IDs and keys) to a server (which reads it
//! at start). The keys are named after the draft's YANG model (Appendix A); hex is lowercase and
//! has no `0x`:
//!
//! ```text
//! # a comment line, or several
//! config-rotation-bits: 0
//! server-id: 0a1b
//! server-id-length: 2
//! nonce-length: 6
//! cid-key: 8f95f09245765f80256934e50c66207f
//! cid-length: 9
//! ```
//!
//! `cid-key` is absent for an unencrypted configuration; `cid-length` (1 + server ID + nonce) is
//! there for the reader's sake and, when present, must agree.

use std::str::FromStr;

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

use super::codec::{Config, ConfigError};
use super::ids::{hex, parse_hex};

/// One server's share of a QUIC-LB configuration: the config rotation codepoint (0 to 6), the
/// server ID it was given, how many nonce octets follow it, and the AES-128 key when IDs are
/// encrypted. [`ServerParams::config`] turns it into the codec's [`Config`]; `to_yaml` and
/// `parse` (or `str::parse`) carry it as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerParams {
    pub rotation: u8,
    pub server_id: Vec<u8>,
    pub nonce_len: usize,
    pub key: Option<[u8; 16]>,
}

/// The text form as serde reads it: every key spelled out, nothing else allowed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Text {
    config_rotation_bits: u8,
    server_id: String,
    server_id_length: usize,
    nonce_length: usize,
    cid_key: Option<String>,
    cid_length: Option<usize>,
}

impl ServerParams {
    /// The codec configuration these parameters describe (its server ID length is that of
    /// `server_id`); the codec's error when the draft forbids the lengths or the rotation.
    pub fn config(&self) -> Result<Config, ConfigError> {
        Config::new(self.rotation, self.server_id.len(), self.nonce_len, self.key)
    }

    /// The length of every routable connection ID issued with these parameters: the first octet,
    /// the server ID and the nonce.
    pub fn cid_len(&self) -> usize {
        1 + self.server_id.len() + self.nonce_len
    }

    /// The text form above, `comment` first with each of its lines behind `# ` (none when empty).
    pub fn to_yaml(&self, comment: &str) -> String {
        let mut out = String::new();
        for line in comment.lines() {
            if line.is_empty() {
                out.push_str("#\n");
            } else {
                out.push_str(&format!("# {line}\n"));
            }
        }
        out.push_str(&format!("config-rotation-bits: {}\n", self.rotation));
        out.push_str(&format!("server-id: {}\n", hex(&self.server_id)));
        out.push_str(&format!("server-id-length: {}\n", self.server_id.len()));
        out.push_str(&format!("nonce-length: {}\n", self.nonce_len));
        if let Some(key) = &self.key {
            out.push_str(&format!("cid-key: {}\n", hex(key)));
        }
        out.push_str(&format!("cid-length: {}\n", self.cid_len()));
        out
    }

    /// Reads the text form, refusing unknown keys, bad hex, a key that is not 16 octets, lengths
    /// that disagree with the values they describe and configurations the draft forbids; each
    /// message names the key at fault.
    pub fn parse(text: &str) -> Result<ServerParams> {
        let t: Text = serde_yaml::from_str(text).context("QUIC-LB server parameters")?;
        let server_id = unhex("server-id", &t.server_id)?;
        if server_id.len() != t.server_id_length {
            bail!("server-id-length: {}, but server-id {} has {} octets", t.server_id_length, t.server_id, server_id.len());
        }
        let key = match &t.cid_key {
            None => None,
            Some(text) => {
                // Not repeated in the error: a key with one wrong digit is still most of a key.
                let octets = parse_hex(text).ok_or_else(|| anyhow!("cid-key: not hex octets (32 digits 0-9 and a-f, without 0x)"))?;
                let n = octets.len();
                let key: [u8; 16] = octets.try_into().map_err(|_| anyhow!("cid-key: {n} octets; an AES-128 key has 16"))?;
                Some(key)
            }
        };
        let params = ServerParams { rotation: t.config_rotation_bits, server_id, nonce_len: t.nonce_length, key };
        params.config().map_err(|e| {
            let key = match e {
                ConfigError::Rotation(_) => "config-rotation-bits",
                ConfigError::ServerIdLength(_) => "server-id-length",
                ConfigError::NonceLength(_) => "nonce-length",
                ConfigError::TooLong(_) => "server-id-length + nonce-length",
            };
            anyhow!("{key}: {e}")
        })?;
        if let Some(n) = t.cid_length {
            if n != params.cid_len() {
                bail!("cid-length: {n}, but 1 + server-id-length + nonce-length is {}", params.cid_len());
            }
        }
        Ok(params)
    }
}

impl FromStr for ServerParams {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<ServerParams> {
        ServerParams::parse(text)
    }
}

/// `text` as octets: pairs of hex digits (either case), nothing else.
fn unhex(key: &str, text: &str) -> Result<Vec<u8>> {
    parse_hex(text).ok_or_else(|| anyhow!("{key}: {text:?} is not hex octets (pairs of digits 0-9 and a-f, without 0x)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quic_lb::{decode_server_id, encode};

    const KEY: [u8; 16] = [
        0x8f, 0x95, 0xf0, 0x92, 0x45, 0x76, 0x5f, 0x80, 0x25, 0x69, 0x34, 0xe5, 0x0c, 0x66, 0x20, 0x7f,
    ];

    const TEXT: &str = "# b1 in pool web\n# config 0\nconfig-rotation-bits: 0\nserver-id: 0a1b\nserver-id-length: 2\nnonce-length: 6\ncid-key: 8f95f09245765f80256934e50c66207f\ncid-length: 9\n";

    fn params() -> ServerParams {
        ServerParams { rotation: 0, server_id: vec![0x0a, 0x1b], nonce_len: 6, key: Some(KEY) }
    }

    /// The reference text with `key: value` in place of that key's line (None: the line dropped).
    fn with(key: &str, value: Option<&str>) -> String {
        TEXT.lines()
            .filter_map(|l| match l.split_once(": ") {
                Some((k, _)) if k == key => value.map(|v| format!("{k}: {v}\n")),
                _ => Some(format!("{l}\n")),
            })
            .collect()
    }

    fn refused(text: &str) -> String {
        match ServerParams::parse(text) {
            Ok(p) => panic!("accepted {p:?} from\n{text}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn the_text_form_is_the_documented_one_and_round_trips() {
        let p = params();
        assert_eq!(p.to_yaml("b1 in pool web\nconfig 0"), TEXT);
        assert_eq!(ServerParams::parse(TEXT).expect("parses"), p);
        let plain = ServerParams { rotation: 6, server_id: vec![0xc4, 0x60, 0x5e], nonce_len: 4, key: None };
        let text = plain.to_yaml("");
        assert!(!text.contains("cid-key") && !text.contains('#'), "{text}");
        assert_eq!(text.parse::<ServerParams>().expect("parses"), plain);
        assert_eq!(plain.to_yaml("a\n\nb"), format!("# a\n#\n# b\n{text}"));
    }

    #[test]
    fn the_config_is_the_codecs() {
        let p = params();
        let config = p.config().expect("valid");
        assert_eq!((config.rotation, config.server_id_len, config.nonce_len, config.cid_len()), (0, 2, 6, 9));
        let cid = encode(&config, &p.server_id, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(decode_server_id(&config, &cid), Some(p.server_id));
    }

    #[test]
    fn optional_and_quoted_values_are_read() {
        let p = ServerParams::parse(&with("cid-length", None)).expect("cid-length may be left out");
        assert_eq!(p, params());
        // All digits: YAML would call it a number, but a string is asked for and given.
        let p = ServerParams::parse(&with("server-id", Some("1234"))).expect("digits only");
        assert_eq!(p.server_id, vec![0x12, 0x34]);
        let p = ServerParams::parse(&with("server-id", Some("\"0A1B\""))).expect("quoted, upper case");
        assert_eq!(p.server_id, vec![0x0a, 0x1b]);
        let p = ServerParams::parse(&with("cid-key", None)).expect("unencrypted");
        assert_eq!(p.key, None);
    }

    #[test]
    fn bad_text_is_refused_naming_the_key() {
        let cases: &[(String, &str)] = &[
            (with("server-id", Some("0x0a1b")), "server-id: \"0x0a1b\" is not hex"),
            (with("server-id", Some("0a1")), "server-id: \"0a1\" is not hex"),
            (with("server-id", Some("0a1g")), "server-id: \"0a1g\" is not hex"),
            (with("cid-key", Some("8f95f09245765f80256934e50c6620zz")), "cid-key: "),
            (with("cid-key", Some("8f95f09245765f80256934e50c6620")), "cid-key: 15 octets"),
            (with("cid-key", Some("8f95f09245765f80256934e50c66207f00")), "cid-key: 17 octets"),
            (with("server-id-length", Some("3")), "server-id-length: 3, but server-id 0a1b has 2 octets"),
            (with("config-rotation-bits", Some("7")), "config-rotation-bits: config rotation 7"),
            (with("config-rotation-bits", Some("256")), "config-rotation-bits"),
            (with("nonce-length", Some("3")), "nonce-length: a nonce of 3 octets"),
            (with("nonce-length", Some("18")), "server-id-length + nonce-length: server ID and nonce are 20 octets"),
            (with("cid-length", Some("8")), "cid-length: 8, but 1 + server-id-length + nonce-length is 9"),
            (format!("{TEXT}cid-len: 9\n"), "unknown field `cid-len`"),
            (with("nonce-length", None), "missing field `nonce-length`"),
            (with("server-id", None), "missing field `server-id`"),
            (with("nonce-length", Some("six")), "nonce-length"),
        ];
        for (text, expected) in cases {
            let message = refused(text);
            assert!(message.contains(expected), "{message:?} lacks {expected:?}");
        }
        let message = refused("server-id: \"\"\nserver-id-length: 0\nnonce-length: 4\nconfig-rotation-bits: 0\n");
        assert!(message.starts_with("server-id: \"\" is not hex"), "{message}");
        assert!(refused("").contains("QUIC-LB server parameters"));
    }
}
