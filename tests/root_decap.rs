//! `lb decap` as an operator runs it, on a backend in a network namespace of its own: what it
//! changes in the host's settings and what it leaves to the operator. (What its program does to
//! packets is tests/root_second_chance.rs and tests/root_encap.rs.)
//! Needs root (CAP_BPF, CAP_NET_ADMIN): `cargo test --test root_decap`.

mod common;

use std::time::{Duration, Instant};

use common::{pair, Netns, Running};

/// The value of sysctl `name` in `ns`.
fn sysctl(ns: &Netns, name: &str) -> String {
    let out = ns.cmd("sysctl").args(["-n", name]).output().expect("sysctl");
    assert!(out.status.success(), "sysctl -n {name}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn set_sysctl(ns: &Netns, name: &str, value: &str) {
    let out = ns.cmd("sysctl").args(["-qw", &format!("{name}={value}")]).output().expect("sysctl");
    assert!(out.status.success(), "sysctl -w {name}={value}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Second chance needs the loopback's forwarding on, and lb decap turns it on at start. An
/// operator who turns it off afterwards (or turns all forwarding off with ip_forward=0) has the
/// last word: lb decap leaves it off, says once what that costs, and once when it is back.
#[test]
fn root_decap_leaves_the_loopback_forwarding_as_an_operator_set_it() {
    common::require_root();
    let p = pair();
    let v4 = "net.ipv4.conf.lo.forwarding";
    let v6 = "net.ipv6.conf.lo.forwarding";
    // Off to begin with (a new namespace copies the host's IPv4 switches, on where the host
    // forwards).
    set_sysctl(&p.be, v4, "0");
    set_sysctl(&p.be, v6, "0");
    let mut d = Running::start(&p.be, &["decap", "lbv1", "--allow-from", "10.77.0.0/24", "--second-chance"]);
    let on = d.wait_for("turned on", Duration::from_secs(10));
    assert!(on.contains(v4) && on.contains(v6), "{on}");
    d.wait_for("serving", Duration::from_secs(10));
    assert_eq!((sysctl(&p.be, v4).as_str(), sysctl(&p.be, v6).as_str()), ("1", "1"));

    // Off by the operator's hand: it stays off through several of lb decap's checks (one a
    // second), and lb decap says so once.
    set_sysctl(&p.be, v4, "0");
    let said = d.wait_for(&format!("{v4} was turned off"), Duration::from_secs(5));
    assert!(said.contains("no_route") && said.contains(&format!("sysctl -w {v4}=1")), "{said}");
    let until = Instant::now() + Duration::from_millis(3500);
    while Instant::now() < until {
        assert_eq!(sysctl(&p.be, v4), "0", "lb decap turned {v4} back on; it said:\n{}", d.seen.join("\n"));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(sysctl(&p.be, v6), "1", "the other family's switch is untouched");

    // Back on by the operator: said once; the warning was not repeated meanwhile.
    set_sysctl(&p.be, v4, "1");
    d.wait_for(&format!("{v4} is on again"), Duration::from_secs(5));
    let warnings = d.seen.iter().filter(|l| l.contains("was turned off")).count();
    assert_eq!(warnings, 1, "{}", d.seen.join("\n"));

    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(d.wait_exit(Duration::from_secs(10)).success(), "{}", d.seen.join("\n"));
    // Left on: it forwards nothing, and another lb decap of this host may rely on it.
    assert_eq!(sysctl(&p.be, v4), "1");
}
