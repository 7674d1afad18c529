//! The one place that knows which YAML crate we use.
//!
//! Everything else in `lb` sees a [`Node`] tree and asks [`Document::locate`] for the line and
//! column of a path when it needs to report an error. Swapping the YAML crate means rewriting
//! this file and nothing else.
//!
//! serde_yaml does not expose source positions on its `Value` tree, but it does attach the
//! position of the event being read to any error a `Deserialize` impl raises. `locate` uses that:
//! it re-reads the text with a visitor that walks down the requested path and fails on purpose at
//! the target, then reads the position off the error. Errors are rare, so the second parse costs
//! nothing in the common case.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A parsed YAML value, reduced to what a configuration file needs.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Keys in file order. Non-string scalar keys are kept as their text.
    Map(Vec<(String, Node)>),
}

impl Node {
    /// A short name of the node's type, for "expected X, found Y" messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Int(_) => "an integer",
            Node::Float(_) => "a float",
            Node::Str(_) => "a string",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a mapping",
        }
    }
}

/// One step of a path from the document root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// The value under a mapping key.
    Key(String),
    /// The key itself (by position in the mapping), for errors about the key.
    KeyAt(usize),
    /// An element of a list.
    Index(usize),
}

/// A syntax error: the text is not YAML, or uses a feature we refuse.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

/// A parsed document that remembers its text, so that positions can be recovered.
pub struct Document<'a> {
    text: &'a str,
    pub root: Node,
}

/// Parses `text` as a single YAML document.
pub fn parse(text: &str) -> Result<Document<'_>, SyntaxError> {
    let value: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| {
        let message = strip_location(&e.to_string());
        let loc = e.location().map(|l| (l.line(), l.column())).or_else(|| {
            // The parser gives no position for a second document: the marker that starts it.
            message.contains("more than one document").then(|| second_document(text)).flatten()
        });
        SyntaxError { line: loc.map(|l| l.0), column: loc.map(|l| l.1), message }
    })?;
    let root = convert(value).map_err(|message| {
        // Converting loses positions: find the construct in the text (a tag, or a key that is
        // not a plain scalar), else the first line of content.
        let loc = find(text, |l| l.contains('!'))
            .or_else(|| {
                find(text, |l| {
                    let t = l.trim_start().trim_start_matches("- ").trim_start();
                    (t.starts_with('?') || t.starts_with('[') || t.starts_with('{')) && t.contains(':')
                })
            })
            .or_else(|| find(text, |l| !l.trim().is_empty() && !l.trim_start().starts_with('#')));
        SyntaxError { line: loc.map(|l| l.0), column: loc.map(|l| l.1), message }
    })?;
    Ok(Document { text, root })
}

/// The first line (1-based, with column 1) that satisfies `pred`.
fn find(text: &str, pred: impl Fn(&str) -> bool) -> Option<(usize, usize)> {
    text.lines().position(pred).map(|i| (i + 1, 1))
}

/// Where a second YAML document starts: a `---` or `...` marker after some content, or else the
/// first line after the first document's content that is not indented.
fn second_document(text: &str) -> Option<(usize, usize)> {
    let mut seen = false;
    for (i, l) in text.lines().enumerate() {
        let t = l.trim_end();
        let content = !t.trim_start().is_empty() && !t.trim_start().starts_with('#');
        if seen && (t.starts_with("---") || t.starts_with("...")) {
            return Some((i + 1, 1));
        }
        if seen && content && !l.starts_with(' ') && !l.starts_with('\t') {
            return Some((i + 1, 1));
        }
        seen |= content;
    }
    // One line that reads as two documents (an alias where a value should be, say): that line.
    text.lines().position(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')).map(|i| (i + 1, 1))
}

impl Document<'_> {
    /// Line and column (both 1-based) where the node at `path` starts, if it can be found.
    pub fn locate(&self, path: &[Seg]) -> Option<(usize, usize)> {
        let de = serde_yaml::Deserializer::from_str(self.text);
        match (Seek { path }).deserialize(de) {
            Ok(()) => None,
            Err(e) => {
                if !e.to_string().contains(FOUND) {
                    return None;
                }
                e.location().map(|l| (l.line(), l.column()))
            }
        }
    }
}

/// serde_yaml appends " at line L column C" to messages; we print positions our own way.
fn strip_location(msg: &str) -> String {
    match msg.find(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

fn convert(v: serde_yaml::Value) -> Result<Node, String> {
    use serde_yaml::Value;
    Ok(match v {
        Value::Null => Node::Null,
        Value::Bool(b) => Node::Bool(b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Node::Int(i as i128)
            } else if let Some(u) = n.as_u64() {
                Node::Int(u as i128)
            } else {
                Node::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => Node::Str(s),
        Value::Sequence(items) => Node::Seq(items.into_iter().map(convert).collect::<Result<_, _>>()?),
        Value::Mapping(map) => {
            let mut out = Vec::with_capacity(map.len());
            for (k, v) in map {
                let key = match k {
                    Value::String(s) => s,
                    Value::Bool(b) => b.to_string(),
                    Value::Number(n) => n.to_string(),
                    Value::Null => "null".to_string(),
                    _ => return Err("mapping keys must be plain scalars".to_string()),
                };
                out.push((key, convert(v)?));
            }
            Node::Map(out)
        }
        Value::Tagged(t) => return Err(format!("YAML tags such as {} are not supported", t.tag)),
    })
}

/// The marker message of the deliberate error raised at the target node.
const FOUND: &str = "\u{0}lb-locate-target";

/// Walks down a path, skipping everything else, and fails at the target.
struct Seek<'p> {
    path: &'p [Seg],
}

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.scalar()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.scalar()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.scalar()
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.scalar()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        match self.path.split_first() {
            None => Err(de::Error::custom(FOUND)),
            Some((Seg::Index(i), rest)) => {
                for _ in 0..*i {
                    if seq.next_element::<IgnoredAny>()?.is_none() {
                        return Ok(());
                    }
                }
                seq.next_element_seed(Seek { path: rest })?;
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        match self.path.split_first() {
            None => Err(de::Error::custom(FOUND)),
            Some((Seg::Key(want), rest)) => {
                while let Some(key) = map.next_key::<serde_yaml::Value>()? {
                    let matches = match &key {
                        serde_yaml::Value::String(s) => s == want,
                        serde_yaml::Value::Number(n) => &n.to_string() == want,
                        serde_yaml::Value::Bool(b) => &b.to_string() == want,
                        _ => false,
                    };
                    if matches {
                        return map.next_value_seed(Seek { path: rest });
                    }
                    map.next_value::<IgnoredAny>()?;
                }
                Ok(())
            }
            Some((Seg::KeyAt(i), _)) => {
                for _ in 0..*i {
                    if map.next_key::<IgnoredAny>()?.is_none() {
                        return Ok(());
                    }
                    map.next_value::<IgnoredAny>()?;
                }
                map.next_key_seed(Seek { path: &[] })?;
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }
}

impl Seek<'_> {
    fn scalar<E: de::Error>(self) -> Result<(), E> {
        if self.path.is_empty() {
            Err(E::custom(FOUND))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "services:\n  - name: web\n    port: 80\n    backends:\n      - address: 10.0.0.1\n      - { address: 10.0.0.2, weight: 3 }\n";

    fn path(segs: &[&str]) -> Vec<Seg> {
        segs.iter()
            .map(|s| match s.parse::<usize>() {
                Ok(i) => Seg::Index(i),
                Err(_) => Seg::Key(s.to_string()),
            })
            .collect()
    }

    #[test]
    fn locates_block_and_flow_nodes() {
        let doc = parse(TEXT).unwrap();
        assert_eq!(doc.locate(&path(&["services", "0", "port"])), Some((3, 11)));
        assert_eq!(doc.locate(&path(&["services", "0", "backends", "0", "address"])), Some((5, 18)));
        assert_eq!(doc.locate(&path(&["services", "0", "backends", "1", "weight"])), Some((6, 38)));
        assert_eq!(doc.locate(&path(&["services", "0", "backends", "1"])), Some((6, 9)));
        assert_eq!(doc.locate(&path(&["services", "0", "nope"])), None);
    }

    #[test]
    fn locates_keys_by_position() {
        let doc = parse(TEXT).unwrap();
        let mut p = path(&["services", "0"]);
        p.push(Seg::KeyAt(1));
        assert_eq!(doc.locate(&p), Some((3, 5)));
    }

    #[test]
    fn syntax_errors_carry_positions() {
        let e = parse("a: [1, 2\nb: 3\n").err().unwrap();
        assert!(e.line.is_some(), "{e:?}");
        assert!(!e.message.contains(" at line "), "{e:?}");
    }

    #[test]
    fn tags_and_complex_keys_are_refused() {
        assert!(parse("a: !foo 1\n").is_err());
        assert!(parse("? [1, 2]\n: 3\n").is_err());
    }
}
