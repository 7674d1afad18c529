//! Validation: a parsed [`yaml::Document`] checked field by field into a [`Pool`].
//!
//! One file per group of keys, each adding its part to [`Validator`]:
//! - here: the walker itself (field paths, positioned errors) and the top level (`services:`,
//!   and the rules that span services);
//! - `service`: one service's keys, and the order in which its groups are checked;
//! - `algorithm`: the table keys (`algorithm`, `slots`, `vnodes_per_weight`, `load_bound`);
//! - `backends`: the backend list and each backend's keys;
//! - `health_check`: `health_check:` and its keys;
//! - `scalars`: the shapes shared by every group (mapping, integer, choice, address, duration).
//!
//! The first error found is the one reported, so the order of the checks is part of the
//! behaviour: a file with two mistakes names the same one every time.

mod algorithm;
mod backends;
mod health_check;
mod load;
mod quic_lb;
mod scalars;
mod service;

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::Path;

use super::yaml::{self, Node, Seg};
use super::{ConfigError, Pool, Protocol, Service, MAX_BACKENDS_TOTAL, MAX_SERVICES};

pub use algorithm::is_prime;

/// Checks a parsed document into a pool; `file` is only used in error messages.
pub(super) fn pool(file: &Path, doc: &yaml::Document<'_>) -> Result<Pool, ConfigError> {
    Validator { file, doc }.pool()
}

/// A field path under construction, printed as `services[0].backends[2].weight`.
#[derive(Clone, Default)]
struct FieldPath(Vec<Seg>);

impl FieldPath {
    fn key(&self, k: &str) -> FieldPath {
        let mut p = self.0.clone();
        p.push(Seg::Key(k.to_string()));
        FieldPath(p)
    }
    fn index(&self, i: usize) -> FieldPath {
        let mut p = self.0.clone();
        p.push(Seg::Index(i));
        FieldPath(p)
    }
    fn key_at(&self, i: usize) -> FieldPath {
        let mut p = self.0.clone();
        p.push(Seg::KeyAt(i));
        FieldPath(p)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mut first = true;
        for seg in &self.0 {
            match seg {
                Seg::Key(k) => {
                    if !first {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Seg::Index(i) => write!(f, "[{i}]")?,
                // Errors about a key name the key itself, which Display shows via the caller.
                Seg::KeyAt(_) => {}
            }
            first = false;
        }
        Ok(())
    }
}

struct Validator<'a> {
    file: &'a Path,
    doc: &'a yaml::Document<'a>,
}

/// The entries of a mapping, in file order.
type Fields<'n> = &'n [(String, Node)];

impl Validator<'_> {
    fn err(&self, at: &FieldPath, message: impl Into<String>) -> ConfigError {
        self.err_located(at, at, message)
    }

    /// An error about field `shown`, positioned at the node `located` (a key rather than its
    /// value, for instance).
    fn err_located(&self, shown: &FieldPath, located: &FieldPath, message: impl Into<String>) -> ConfigError {
        // A field written in shorthand (a bare-string backend has no `address` key) is found at
        // its nearest enclosing node.
        let pos = (0..=located.0.len()).rev().find_map(|n| self.doc.locate(&located.0[..n]));
        ConfigError {
            file: self.file.to_path_buf(),
            line: pos.map(|p| p.0),
            column: pos.map(|p| p.1),
            field: shown.to_string(),
            message: message.into(),
        }
    }

    /// The top level: a mapping whose one key is the list of services.
    fn pool(&self) -> Result<Pool, ConfigError> {
        let root = FieldPath::default();
        let fields = self.mapping(&self.doc.root, &root, &["services", "previous"])?;
        let previous_file = match Self::get(fields, "previous") {
            None => None,
            Some(n) => {
                let file = self.string(n, &root.key("previous"), "a file name")?;
                if file.is_empty() {
                    return Err(self.err(&root.key("previous"), "expected a file name, found an empty string"));
                }
                Some(std::path::PathBuf::from(file))
            }
        };
        let services_path = root.key("services");
        let list = match Self::get(fields, "services") {
            None => return Err(self.err(&root, "missing required key `services`")),
            Some(Node::Null) => &[][..],
            Some(Node::Seq(items)) => &items[..],
            Some(other) => return Err(self.err(&services_path, format!("expected a list of services, found {}", other.kind()))),
        };
        if list.len() > MAX_SERVICES {
            return Err(self.err(&services_path, format!("{} services; at most {MAX_SERVICES} are supported", list.len())));
        }

        let mut services: Vec<Service> = Vec::with_capacity(list.len());
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut endpoints: HashMap<(IpAddr, u16, Protocol), usize> = HashMap::new();
        let mut total_backends = 0usize;
        for (i, node) in list.iter().enumerate() {
            let at = services_path.index(i);
            let svc = self.service(node, &at)?;
            if let Some(prev) = names.insert(svc.name.clone(), i) {
                return Err(self.err(
                    &at.key("name"),
                    format!("duplicate service name `{}` (also services[{prev}])", svc.name),
                ));
            }
            if let Some(prev) = endpoints.insert((svc.vip, svc.port, svc.protocol), i) {
                return Err(self.err(
                    &at.key("vip"),
                    format!("{} is already served by services[{prev}] (`{}`)", svc.endpoint(), services[prev].name),
                ));
            }
            self.quic_lb_spaces(&services, &svc, &at)?;
            total_backends += svc.backends.len();
            if total_backends > MAX_BACKENDS_TOTAL {
                return Err(self.err(
                    &at.key("backends"),
                    format!("the file has more than {MAX_BACKENDS_TOTAL} backends in all"),
                ));
            }
            services.push(svc);
        }
        Ok(Pool { services, previous_file, previous: None })
    }
}
