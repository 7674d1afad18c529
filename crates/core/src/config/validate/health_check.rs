//! `health_check:`: how a service's backends are probed. `kind: none` (or no key) turns the
//! checks off; `path` and `expect` apply to HTTP checks only.

use super::{FieldPath, Validator};
use crate::config::yaml::Node;
use crate::config::{CheckKind, ConfigError, HealthCheck, ProbeVia, Protocol};

impl Validator<'_> {
    /// `port` and `protocol` are the service's: the port probed by default, and UDP services
    /// must name a TCP port to probe; `conntrack`, whether it tracks flows (signals need it).
    pub(super) fn health_check(&self, node: &Node, at: &FieldPath, port: u16, protocol: Protocol, conntrack: bool) -> Result<Option<HealthCheck>, ConfigError> {
        let f = self.mapping(node, at, &["kind", "port", "path", "expect", "interval", "timeout", "rise", "fall", "via", "signals"])?;
        let kind = match self.choice(self.required(f, at, "kind")?, &at.key("kind"), &[("tcp", Some(CheckKind::Tcp)), ("http", Some(CheckKind::Http)), ("none", None)])? {
            None => return Ok(None),
            Some(k) => k,
        };
        let check_port = match Self::get(f, "port") {
            Some(n) => self.integer(n, &at.key("port"), 1, 65535)? as u16,
            None if protocol == Protocol::Udp => {
                return Err(self.err(
                    &at.key("kind"),
                    format!("a UDP service's {} check connects over TCP: give the `port` to probe", kind.as_str()),
                ));
            }
            None => port,
        };
        let http_only = |key: &str| -> Result<(), ConfigError> {
            if kind != CheckKind::Http && Self::get(f, key).is_some() {
                return Err(self.err(&at.key(key), "applies to `kind: http` only"));
            }
            Ok(())
        };
        http_only("path")?;
        http_only("expect")?;
        let path = match Self::get(f, "path") {
            None => "/".to_string(),
            Some(n) => self.http_path(n, &at.key("path"), "a path such as /healthz")?,
        };
        let expect = match Self::get(f, "expect") {
            None => (200, 399),
            Some(n) => self.status_range(n, &at.key("expect"))?,
        };
        let interval = match Self::get(f, "interval") {
            None => std::time::Duration::from_secs(2),
            Some(n) => self.duration(n, &at.key("interval"), 0.1, 3600.0)?,
        };
        let timeout = match Self::get(f, "timeout") {
            None => std::time::Duration::from_secs(1).min(interval),
            Some(n) => self.duration(n, &at.key("timeout"), 0.01, 60.0)?,
        };
        if timeout > interval {
            return Err(self.err(
                &at.key("timeout"),
                format!("{:?} is longer than the interval ({:?}); a probe must end before the next one starts", timeout, interval),
            ));
        }
        let rise = match Self::get(f, "rise") {
            None => 2,
            Some(n) => self.integer(n, &at.key("rise"), 1, 100)?,
        };
        let fall = match Self::get(f, "fall") {
            None => 3,
            Some(n) => self.integer(n, &at.key("fall"), 1, 100)?,
        };
        let via = match Self::get(f, "via") {
            None => ProbeVia::Backend,
            Some(n) => self.choice(n, &at.key("via"), &[("backend", ProbeVia::Backend), ("vip", ProbeVia::Vip)])?,
        };
        if via == ProbeVia::Vip {
            // The probe is a client's connection to the service: the same protocol and port.
            if protocol == Protocol::Udp {
                return Err(self.err(&at.key("via"), "a probe through the VIP is a TCP connection to the service, and this service is UDP: use `via: backend`"));
            }
            if check_port != port {
                return Err(self.err(&at.key("port"), format!("a probe through the VIP goes to the service's own port ({port}), not {check_port}")));
            }
        }
        // Signals from real traffic: a tracked TCP service's, on unless turned off.
        let signals = match Self::get(f, "signals") {
            None => protocol == Protocol::Tcp && conntrack,
            Some(n) => {
                let on = match n {
                    Node::Bool(b) => *b,
                    n => self.choice(n, &at.key("signals"), &[("on", true), ("off", false)])?,
                };
                if on && (protocol != Protocol::Tcp || !conntrack) {
                    return Err(self.err(&at.key("signals"), "signals come from tracked TCP connections: this service needs `protocol: tcp` and `conntrack: on`"));
                }
                on
            }
        };
        Ok(Some(HealthCheck { kind, port: check_port, path, expect, interval, timeout, rise, fall, via, signals }))
    }

    /// `200`, or `200-399`.
    fn status_range(&self, node: &Node, at: &FieldPath) -> Result<(u16, u16), ConfigError> {
        let bad = |what: String| self.err(at, format!("{what}: expected a status code or a range such as 200-399, within 100..=599"));
        let (lo, hi) = match node {
            Node::Int(i) => (*i, *i),
            Node::Str(s) => {
                let (a, b) = s.split_once('-').unwrap_or((s, s));
                match (a.trim().parse::<i128>(), b.trim().parse::<i128>()) {
                    (Ok(a), Ok(b)) => (a, b),
                    _ => return Err(bad(format!("`{s}`"))),
                }
            }
            other => return Err(bad(other.kind().to_string())),
        };
        if !(100..=599).contains(&lo) || !(100..=599).contains(&hi) || lo > hi {
            return Err(bad(format!("{lo}-{hi}")));
        }
        Ok((lo as u16, hi as u16))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{parse_str, CheckKind, ProbeVia};

    #[test]
    fn health_checks_parse_with_their_defaults() {
        let text = "services:\n  - name: web\n    vip: 10.0.0.1\n    port: 80\n    health_check: {kind: http, path: /healthz, expect: 200, interval: 500ms, rise: 1}\n    backends: [10.0.0.2]\n  - name: dns\n    vip: 10.0.0.1\n    port: 53\n    protocol: udp\n    health_check: {kind: tcp, port: 8053}\n    backends: [10.0.0.2]\n  - name: off\n    vip: 10.0.0.1\n    port: 81\n    health_check: {kind: none}\n    backends: [10.0.0.2]\n";
        let p = parse_str("p.yaml", text).expect("valid");
        let web = p.services[0].health_check.clone().expect("web is checked");
        assert_eq!(web.kind, CheckKind::Http);
        assert_eq!((web.port, web.path.as_str(), web.expect), (80, "/healthz", (200, 200)));
        assert_eq!((web.interval.as_millis(), web.timeout.as_millis(), web.rise, web.fall), (500, 500, 1, 3));
        let dns = p.services[1].health_check.clone().expect("dns is checked");
        assert_eq!((dns.kind, dns.port, dns.expect, dns.interval.as_secs(), dns.timeout.as_secs()), (CheckKind::Tcp, 8053, (200, 399), 2, 1));
        assert_eq!(p.services[2].health_check, None);
        assert_eq!((web.via, dns.via), (ProbeVia::Backend, ProbeVia::Backend));
        assert_eq!((web.signals, dns.signals), (true, false), "signals: on for a tracked TCP service, off for UDP");
    }

    #[test]
    fn signals_need_a_tracked_tcp_service() {
        let svc = |extra: &str| format!("services:\n  - name: web\n    vip: 10.0.0.1\n    port: 80\n{extra}    health_check: {{kind: tcp, signals: on}}\n    backends: [10.0.0.2]\n");
        assert!(parse_str("p.yaml", &svc("")).expect("valid").services[0].health_check.as_ref().is_some_and(|c| c.signals));
        let off = svc("").replace("signals: on", "signals: off");
        assert!(!parse_str("p.yaml", &off).expect("valid").services[0].health_check.as_ref().is_some_and(|c| c.signals));
        let e = parse_str("p.yaml", &svc("    conntrack: off\n")).expect_err("untracked").to_string();
        assert!(e.contains("p.yaml:6") && e.contains("health_check.signals") && e.contains("conntrack: on"), "{e}");
        let untracked = svc("    conntrack: off\n").replace(", signals: on", "");
        assert!(!parse_str("p.yaml", &untracked).expect("valid").services[0].health_check.as_ref().is_some_and(|c| c.signals), "off by default there");
    }

    #[test]
    fn a_probe_through_the_vip_is_a_tcp_connection_to_the_service_port() {
        let svc = |extra: &str, proto: &str| format!("services:\n  - name: web\n    vip: 10.0.0.1\n    port: 80\n    protocol: {proto}\n    health_check: {{kind: tcp, via: vip{extra}}}\n    backends: [10.0.0.2]\n");
        let p = parse_str("p.yaml", &svc("", "tcp")).expect("valid");
        let c = p.services[0].health_check.clone().expect("checked");
        assert_eq!((c.via, c.port), (ProbeVia::Vip, 80));
        assert!(parse_str("p.yaml", &svc(", port: 80", "tcp")).is_ok());
        let e = parse_str("p.yaml", &svc(", port: 8080", "tcp")).expect_err("another port").to_string();
        assert!(e.contains("p.yaml:6") && e.contains("health_check.port") && e.contains("service's own port (80)"), "{e}");
        let e = parse_str("p.yaml", &svc(", port: 8080", "udp")).expect_err("UDP").to_string();
        assert!(e.contains("health_check.via") && e.contains("UDP"), "{e}");
        let e = parse_str("p.yaml", &svc("", "tcp").replace("via: vip", "via: tunnel")).expect_err("unknown").to_string();
        assert!(e.contains("health_check.via") && e.contains("tunnel"), "{e}");
    }
}
