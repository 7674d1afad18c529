//! `backends:`: the list, each backend's keys, and the rules between backends of one service
//! (one address family under `forward: l2`, no address or identity twice).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use super::{FieldPath, Validator};
use crate::config::yaml::Node;
use crate::config::{Backend, BackendState, ConfigError, Forward, MAX_BACKENDS_PER_SERVICE, MAX_WEIGHT};

impl Validator<'_> {
    /// The backend list at `at` of a service with this `vip` and `forward`.
    pub(super) fn backends(&self, node: &Node, at: &FieldPath, vip: IpAddr, forward: Forward) -> Result<Vec<Backend>, ConfigError> {
        let list = match node {
            Node::Null => &[][..],
            Node::Seq(items) => &items[..],
            other => return Err(self.err(at, format!("expected a list of backends, found {}", other.kind()))),
        };
        if list.len() > MAX_BACKENDS_PER_SERVICE {
            return Err(self.err(at, format!("{} backends; at most {MAX_BACKENDS_PER_SERVICE} per service are supported", list.len())));
        }
        let mut backends = Vec::with_capacity(list.len());
        let mut identities: HashMap<String, usize> = HashMap::new();
        let mut addresses: HashSet<IpAddr> = HashSet::new();
        for (j, bnode) in list.iter().enumerate() {
            let bat = at.index(j);
            let b = self.backend(bnode, &bat)?;
            self.family(&b, &bat, vip, forward)?;
            if !addresses.insert(b.address) {
                return Err(self.err(&bat.key("address"), format!("duplicate backend address {}", b.address)));
            }
            let identity = b.identity();
            if let Some(prev) = identities.insert(identity.clone(), j) {
                let field = if b.name.is_some() { "name" } else { "address" };
                return Err(self.err(
                    &bat.key(field),
                    format!("duplicate backend identity `{identity}` (also backends[{prev}])"),
                ));
            }
            backends.push(b);
        }
        Ok(backends)
    }

    /// Encapsulation carries either family in either (the backend's address is the outer
    /// destination); L2 forwarding hands the backend the client's packet as it is, so the
    /// backend must be of the vip's family.
    fn family(&self, b: &Backend, at: &FieldPath, vip: IpAddr, forward: Forward) -> Result<(), ConfigError> {
        if b.address.is_ipv4() != vip.is_ipv4() && !forward.encapsulates() {
            let fam = |a: IpAddr| if a.is_ipv4() { "IPv4" } else { "IPv6" };
            return Err(self.err(
                &at.key("address"),
                format!(
                    "{} is {} but the service's vip {vip} is {}; `forward: l2` needs one family (ipip and gue carry either)",
                    b.address,
                    fam(b.address),
                    fam(vip)
                ),
            ));
        }
        Ok(())
    }

    fn backend(&self, node: &Node, at: &FieldPath) -> Result<Backend, ConfigError> {
        // A bare address is a handy shorthand: `- 10.0.0.1`.
        if let Node::Str(_) = node {
            return Ok(Backend { address: self.address(node, at)?, name: None, weight: 1, state: BackendState::Active, server_id: None });
        }
        let f = self.mapping(node, at, &["address", "name", "weight", "state", "server_id"])?;
        let address = self.address(self.required(f, at, "address")?, &at.key("address"))?;
        let name = match Self::get(f, "name") {
            None => None,
            Some(n) => {
                let name_at = at.key("name");
                let s = self.string(n, &name_at, "a backend name")?;
                if s.is_empty() || s.len() > 255 || s.chars().any(|c| c.is_control()) {
                    return Err(self.err(&name_at, "expected a name of 1..=255 bytes without control characters"));
                }
                Some(s.to_string())
            }
        };
        let weight = match Self::get(f, "weight") {
            None => 1,
            Some(n) => self.integer(n, &at.key("weight"), 0, MAX_WEIGHT)?,
        };
        let state = match Self::get(f, "state") {
            None => BackendState::Active,
            Some(n) => self.choice(n, &at.key("state"), &[("active", BackendState::Active), ("drain", BackendState::Drain)])?,
        };
        let server_id = match Self::get(f, "server_id") {
            None => None,
            Some(n) => Some(self.hex(n, &at.key("server_id"), "a server ID in hex, such as '0a1b'", false)?),
        };
        Ok(Backend { address, name, weight, state, server_id })
    }
}
