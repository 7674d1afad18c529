//! One entry of `services:`: its keys, and the order in which the groups are checked (the
//! first error found is the one reported, so the order is part of the behaviour).

use std::net::IpAddr;

use super::algorithm::TableKeys;
use super::{FieldPath, Fields, Validator};
use crate::config::yaml::Node;
use crate::config::{ConfigError, Forward, HashMode, Protocol, Service, DEFAULT_GUE_PORT};

/// Every key a service may have, in the order the unknown-key error lists them.
const KEYS: &[&str] = &[
    "name",
    "vip",
    "port",
    "protocol",
    "algorithm",
    "slots",
    "vnodes_per_weight",
    "hash",
    "backends",
    "health_check",
    "conntrack",
    "forward",
    "gue_port",
    "load_bound",
    "second_chance",
    "agent",
    "slow_start",
    "quic_lb",
];

/// Where a service listens: `name`, `vip`, `port` and `protocol`.
struct Listener<'n> {
    name: &'n str,
    vip: IpAddr,
    port: u16,
    protocol: Protocol,
}

impl Validator<'_> {
    pub(super) fn service(&self, node: &Node, at: &FieldPath) -> Result<Service, ConfigError> {
        let f = self.mapping(node, at, KEYS)?;
        let Listener { name, vip, port, protocol } = self.listener(f, at)?;
        let TableKeys { algorithm, slots, vnodes_per_weight, load_bound } = self.table_keys(f, at)?;
        let hash = match Self::get(f, "hash") {
            None => HashMode::ClientIp,
            Some(n) => self.choice(n, &at.key("hash"), &[("client-ip", HashMode::ClientIp), ("flow", HashMode::Flow)])?,
        };
        let (forward, gue_port) = self.forwarding(f, at)?;
        let backends = self.backends(self.required(f, at, "backends")?, &at.key("backends"), vip, forward)?;
        let conntrack = self.conntrack(f, at)?;
        let second_chance = self.second_chance(f, at, forward, protocol)?;
        let health_check = match Self::get(f, "health_check") {
            None => None,
            Some(n) => self.health_check(n, &at.key("health_check"), port, protocol, conntrack)?,
        };
        let agent = self.agent(f, at)?;
        let slow_start = self.slow_start(f, at)?;
        let quic_lb = self.quic_lb(f, at, protocol)?;
        let backends = self.server_ids(backends, quic_lb.as_ref(), &at.key("backends"))?;
        let svc = Service {
            name: name.to_string(),
            vip,
            port,
            protocol,
            algorithm,
            slots,
            vnodes_per_weight,
            load_bound,
            hash,
            backends,
            health_check,
            conntrack,
            forward,
            gue_port,
            second_chance,
            agent,
            slow_start,
            quic_lb,
        };
        self.ring_size(&svc, at)?;
        self.scaled_ring_size(&svc, at)?;
        Ok(svc)
    }

    fn listener<'n>(&self, f: Fields<'n>, at: &FieldPath) -> Result<Listener<'n>, ConfigError> {
        let name_at = at.key("name");
        let name = self.string(self.required(f, at, "name")?, &name_at, "a service name")?;
        if !valid_service_name(name) {
            return Err(self.err(
                &name_at,
                format!("`{name}` is not a valid service name: use 1..=63 characters from A-Z a-z 0-9 . _ -"),
            ));
        }
        let vip = self.address(self.required(f, at, "vip")?, &at.key("vip"))?;
        let port = self.integer(self.required(f, at, "port")?, &at.key("port"), 1, 65535)? as u16;
        let protocol = match Self::get(f, "protocol") {
            None => Protocol::Tcp,
            Some(n) => self.choice(n, &at.key("protocol"), &[("tcp", Protocol::Tcp), ("udp", Protocol::Udp)])?,
        };
        Ok(Listener { name, vip, port, protocol })
    }

    /// `forward`, and `gue_port`, which only `forward: gue` takes.
    fn forwarding(&self, f: Fields<'_>, at: &FieldPath) -> Result<(Forward, u16), ConfigError> {
        let forward = match Self::get(f, "forward") {
            None => Forward::L2,
            Some(n) => self.choice(
                n,
                &at.key("forward"),
                &[("l2", Forward::L2), ("ipip", Forward::Ipip), ("gue", Forward::Gue)],
            )?,
        };
        let gue_port = match Self::get(f, "gue_port") {
            None => DEFAULT_GUE_PORT,
            Some(_) if forward != Forward::Gue => {
                return Err(self.err(&at.key("gue_port"), "applies to `forward: gue` only"));
            }
            Some(n) => self.integer(n, &at.key("gue_port"), 1, 65535)? as u16,
        };
        Ok((forward, gue_port))
    }

    /// `second_chance`: only where a hop list can travel (GUE) and be used (TCP, whose backends
    /// can tell their own connections).
    fn second_chance(&self, f: Fields<'_>, at: &FieldPath, forward: Forward, protocol: Protocol) -> Result<bool, ConfigError> {
        let on = match Self::get(f, "second_chance") {
            None => return Ok(false),
            Some(Node::Bool(b)) => *b,
            Some(n) => self.choice(n, &at.key("second_chance"), &[("on", true), ("off", false)])?,
        };
        if on && forward != Forward::Gue {
            return Err(self.err(&at.key("second_chance"), "needs `forward: gue` (the hop list travels in the GUE header)"));
        }
        if on && protocol != Protocol::Tcp {
            return Err(self.err(&at.key("second_chance"), "applies to TCP services only (a backend cannot tell a UDP flow of its own)"));
        }
        Ok(on)
    }

    fn conntrack(&self, f: Fields<'_>, at: &FieldPath) -> Result<bool, ConfigError> {
        match Self::get(f, "conntrack") {
            None => Ok(true),
            // `on | off` as the docs write it; true/false mean the same.
            Some(Node::Bool(b)) => Ok(*b),
            Some(n) => self.choice(n, &at.key("conntrack"), &[("on", true), ("off", false)]),
        }
    }
}

fn valid_service_name(name: &str) -> bool {
    (1..=63).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

#[cfg(test)]
mod tests {
    use crate::config::{parse_str, Forward, DEFAULT_GUE_PORT};

    #[test]
    fn encapsulating_services_carry_either_family_and_default_to_l2() {
        let text = "services:\n  - name: a\n    vip: 10.0.0.1\n    port: 80\n    forward: ipip\n    backends: [10.1.0.1, 'fd00::1']\n  - name: b\n    vip: 'fd00::100'\n    port: 80\n    forward: gue\n    gue_port: 7000\n    backends: [10.1.0.1]\n  - name: c\n    vip: 10.0.0.1\n    port: 81\n    backends: [10.1.0.1]\n";
        let p = parse_str("p.yaml", text).expect("valid");
        assert_eq!((p.services[0].forward, p.services[0].gue_port), (Forward::Ipip, DEFAULT_GUE_PORT));
        assert_eq!((p.services[1].forward, p.services[1].gue_port), (Forward::Gue, 7000));
        assert_eq!(p.services[2].forward, Forward::L2);
    }
}
