//! Every fixture under configs/bad/ is refused with an error that names the file, the line and
//! column, and the field. No root needed.

use std::path::Path;

/// (fixture, the error after the file name)
const CASES: &[(&str, &str)] = &[
    ("bad-address.yaml", ":8:18: services[0].backends[1].address: `10.99.0.300` is not an IPv4 or IPv6 address"),
    ("bad-protocol.yaml", ":5:15: services[0].protocol: expected one of tcp | udp, found `sctp`"),
    ("bad-service-name.yaml", ":2:11: services[0].name: `web site` is not a valid service name: use 1..=63 characters from A-Z a-z 0-9 . _ -"),
    ("comments-only.yaml", ": the file is empty; expected a mapping with a `services` list"),
    ("conntrack-bad.yaml", ":5:16: services[0].conntrack: expected one of on | off, found `sometimes`"),
    ("duplicate-backend-address.yaml", ":9:18: services[0].backends[2].address: duplicate backend address 10.99.0.11"),
    ("duplicate-backend-identity.yaml", ":10:15: services[0].backends[1].name: duplicate backend identity `app` (also backends[0])"),
    ("duplicate-endpoint.yaml", ":10:10: services[1].vip: 10.99.0.100:80/tcp is already served by services[0] (`web`)"),
    ("duplicate-key.yaml", ":2:5: invalid YAML: services[0]: duplicate entry with key \"port\""),
    ("duplicate-service-name.yaml", ":9:11: services[1].name: duplicate service name `web` (also services[0])"),
    ("empty.yaml", ": the file is empty; expected a mapping with a `services` list"),
    ("health-bad-expect.yaml", ":7:15: services[0].health_check.expect: 399-200: expected a status code or a range such as 200-399, within 100..=599"),
    ("health-bad-interval.yaml", ":7:17: services[0].health_check.interval: `2 weeks` is not a duration: use a number with ms, s or m, such as 2s"),
    ("health-path-on-tcp.yaml", ":7:13: services[0].health_check.path: applies to `kind: http` only"),
    ("health-rise-zero.yaml", ":5:37: services[0].health_check.rise: expected an integer 1..=100, found 0"),
    ("health-timeout-over-interval.yaml", ":8:16: services[0].health_check.timeout: 1.5s is longer than the interval (1s); a probe must end before the next one starts"),
    ("health-udp-without-port.yaml", ":6:26: services[0].health_check.kind: a UDP service's tcp check connects over TCP: give the `port` to probe"),
    ("health-unknown-kind.yaml", ":6:13: services[0].health_check.kind: expected one of tcp | http | none, found `icmp`"),
    ("invalid-yaml.yaml", ":5:13: invalid YAML: did not find expected ',' or ']'"),
    ("maglev-not-prime.yaml", ":7:12: services[0].slots: maglev needs a prime table size, and 65536 is not prime (nearby primes: 65521, 65537)"),
    ("missing-vip.yaml", ":2:5: services[0]: missing required key `vip`"),
    ("mixed-families.yaml", ":8:18: services[0].backends[1].address: fd00::12 is IPv6 but the service's vip 10.99.0.100 is IPv4; `forward: l2` needs one family (ipip and gue carry either)"),
    ("load-bound-four-decimals.yaml", ":6:17: services[0].load_bound: 1.0205 has more than three decimals: expected a number from 1.000 to 2.000 with at most three decimals"),
    ("load-bound-on-ring.yaml", ":6:17: services[0].load_bound: applies to `algorithm: bounded` only"),
    ("load-bound-out-of-range.yaml", ":6:17: services[0].load_bound: 0.9: expected a number from 1.000 to 2.000 with at most three decimals"),
    ("mixed-families-shorthand.yaml", ":6:9: services[0].backends[0].address: 10.0.0.1 is IPv4 but the service's vip fd00::1 is IPv6; `forward: l2` needs one family (ipip and gue carry either)"),
    ("forward-unknown.yaml", ":5:14: services[0].forward: expected one of l2 | ipip | gue, found `vxlan`"),
    ("gue-port-on-ipip.yaml", ":6:15: services[0].gue_port: applies to `forward: gue` only"),
    ("gue-port-out-of-range.yaml", ":6:15: services[0].gue_port: expected an integer 1..=65535, found 0"),
    ("multicast-vip.yaml", ":3:10: services[0].vip: 224.0.0.5 is a multicast address; expected a unicast address"),
    ("not-utf8.yaml", ":2:12: the file is not valid UTF-8"),
    ("port-out-of-range.yaml", ":4:11: services[0].port: expected an integer 1..=65535, found 70000"),
    ("second-chance-on-ipip.yaml", ":6:20: services[0].second_chance: needs `forward: gue` (the hop list travels in the GUE header)"),
    ("second-chance-udp.yaml", ":7:20: services[0].second_chance: applies to TCP services only (a backend cannot tell a UDP flow of its own)"),
    ("ring-too-large.yaml", ":8:7: services[0].backends: the ring would have 10010000 tokens (total weight 1001 x vnodes_per_weight 10000); the limit is 4194304: lower the weights or vnodes_per_weight"),
    ("services-not-a-list.yaml", ":2:3: services: expected a list of services, found a mapping"),
    ("slots-zero.yaml", ":6:12: services[0].slots: expected an integer 1..=1048576, found 0"),
    ("state-bad.yaml", ":6:38: services[0].backends[0].state: expected one of active | drain, found `down`"),
    ("unknown-key.yaml", ":5:5: services[0].protocl: unknown key `protocl`; expected one of: name, vip, port, protocol, algorithm, slots, vnodes_per_weight, hash, backends, health_check, conntrack, forward, gue_port, load_bound, second_chance, agent, slow_start, quic_lb"),
    ("agent-timeout-over-half.yaml", ":6:48: services[0].agent.timeout: 1.5s is longer than half the interval (1s); a report must be in before the interval's weights are decided"),
    ("slow-start-bad-min.yaml", ":7:12: services[0].slow_start.min: `150%` is not a percentage: expected 0% to 100%"),
    ("quic-lb-bad-key.yaml", ":6:20: services[0].quic_lb.key: 15 octets: an AES-128 key is 16 (32 hex digits)"),
    ("quic-lb-on-tcp.yaml", ":5:14: services[0].quic_lb: applies to `protocol: udp` services only (QUIC runs over UDP)"),
    ("quic-lb-rotation-7.yaml", ":6:25: services[0].quic_lb.rotation: config rotation 7 is not one of 0 to 6 (7, 0b111, marks unroutable IDs)"),
    ("quic-lb-server-id-twice.yaml", ":9:52: services[0].backends[1].server_id: server ID 0a (written) is also backends[0]'s (written); give one of them another `server_id`, or a longer quic_lb.server_id_len"),
    ("quic-lb-too-long.yaml", ":8:18: services[0].quic_lb.nonce_len: server ID and nonce are 20 octets together: at most 19 (a connection ID is at most 20)"),
    ("unknown-top-level-key.yaml", ":1:1: service: unknown key `service`; expected one of: services, previous"),
    ("unspecified-backend.yaml", ":8:18: services[0].backends[1].address: 0.0.0.0 is the unspecified address; expected a unicast address"),
    ("vnodes-on-maglev.yaml", ":7:24: services[0].vnodes_per_weight: applies to `algorithm: ring` only"),
    ("weight-float.yaml", ":9:17: services[0].backends[1].weight: expected an integer 0..=1000, found a float"),
    ("weight-negative.yaml", ":9:17: services[0].backends[1].weight: expected an integer 0..=1000, found -1"),
    ("weight-out-of-range.yaml", ":9:17: services[0].backends[1].weight: expected an integer 0..=1000, found 1001"),
    ("wrong-type-port.yaml", ":4:11: services[0].port: expected an integer 1..=65535, found a string"),
];

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/bad").join(name)
}

#[test]
fn every_bad_fixture_gives_its_error() {
    for (name, want) in CASES {
        let path = fixture(name);
        let err = lb::config::load(&path).expect_err(name);
        assert_eq!(err.to_string(), format!("{}{want}", path.display()), "{name}");
    }
}

/// Fixtures whose error names another file than themselves: the previous pool's.
const PREVIOUS_CASES: &[&str] = &["previous-missing.yaml", "previous-with-error.yaml"];

#[test]
fn a_previous_pool_that_cannot_be_read_or_is_invalid_is_named() {
    let err = lb::config::load(&fixture("previous-missing.yaml")).expect_err("missing").to_string();
    assert_eq!(
        err,
        format!("{}:1:11: previous: {}: no such file", fixture("previous-missing.yaml").display(), fixture("no-such-previous.yaml").display())
    );
    let err = lb::config::load(&fixture("previous-with-error.yaml")).expect_err("invalid").to_string();
    assert_eq!(
        err,
        format!("{}:9:17: services[0].backends[1].weight: expected an integer 0..=1000, found -1", fixture("weight-negative.yaml").display())
    );
}

#[test]
fn every_fixture_in_the_folder_is_covered() {
    let mut on_disk: Vec<String> = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/bad"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = CASES.iter().map(|(n, _)| n.to_string()).chain(PREVIOUS_CASES.iter().map(|n| n.to_string())).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
}

#[test]
fn positions_point_at_the_offending_text() {
    // Independent of the messages: the line:column of a few errors lands on the bad token.
    for (name, token) in [
        ("weight-out-of-range.yaml", "1001"),
        ("state-bad.yaml", "down"),
        ("unknown-key.yaml", "protocl"),
        ("bad-protocol.yaml", "sctp"),
        ("multicast-vip.yaml", "224.0.0.5"),
    ] {
        let path = fixture(name);
        let err = lb::config::load(&path).unwrap_err();
        let text = std::fs::read_to_string(&path).unwrap();
        let line = text.lines().nth(err.line.unwrap() - 1).unwrap();
        assert!(line[err.column.unwrap() - 1..].starts_with(token), "{name}: {line:?} at column {:?}", err.column);
    }
}

#[test]
fn directories_and_missing_files_are_clear_errors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    assert!(lb::config::load(&dir).unwrap_err().to_string().ends_with("configs: is a directory, expected a YAML file"));
    let missing = dir.join("no-such-file.yaml");
    assert!(lb::config::load(&missing).unwrap_err().to_string().ends_with("no-such-file.yaml: no such file"));
}

#[test]
fn all_zero_weights_and_empty_backend_lists_are_valid() {
    let pool = lb::config::parse_str(
        "t.yaml",
        "services:\n  - {name: a, vip: 10.0.0.1, port: 1, backends: [{address: 10.0.0.2, weight: 0}]}\n  - {name: b, vip: 10.0.0.1, port: 2, backends: []}\n",
    )
    .unwrap();
    for s in &pool.services {
        let t = lb::table::build_service(s);
        assert!((0..t.len()).all(|i| t.owner(i).is_none()));
    }
}

#[test]
fn the_example_pools_are_valid() {
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            lb::config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
