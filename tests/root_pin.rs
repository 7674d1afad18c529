//! A data plane that outlives its controller (`lb attach --pin`), in network namespaces this
//! test creates, with a bpffs it mounts under /run (a bpffs mounted inside `ip netns exec` would
//! vanish with that command; see docs/restarts.md): a stopped controller leaves
//! the program forwarding; a new one adopts it; `kill -9` at random points of reloads never
//! leaves a table an adoption cannot repair; `lb detach` and `lb status`; and the clear errors
//! and clean recoveries for pins that are not what they should be.
//! Needs root: run with `cargo test --test root_pin`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use lb::config::{parse_str, Pool};
use nix::sys::signal::Signal;

const SECS: Duration = Duration::from_secs(15);

/// A bpffs mounted on a fresh directory under /run; unmounted and removed when dropped.
struct BpfMount(PathBuf);

impl BpfMount {
    fn new() -> BpfMount {
        let d = PathBuf::from(format!("/run/lbt{}-{}-bpf", std::process::id(), rand_u32()));
        std::fs::create_dir_all(&d).expect("mkdir");
        sh(&["mount", "-t", "bpf", "bpf", d.to_str().expect("utf-8")]);
        BpfMount(d)
    }

    fn arg(&self) -> &str {
        self.0.to_str().expect("utf-8")
    }
}

impl Drop for BpfMount {
    fn drop(&mut self) {
        // Whatever a failing test left attached goes with the namespaces; the pins go here.
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    t.subsec_nanos() ^ (t.as_secs() as u32).rotate_left(7)
}

fn env() -> (Pair, TempDir, BpfMount) {
    let p = pair();
    static_backends(&p);
    (p, temp_dir(), BpfMount::new())
}

/// A pool of `services` services on ports 80.., each with the backends 10.77.0.NN listed.
fn pool_text(services: &[(u16, &str, &[u32])]) -> String {
    let mut t = String::from("services:\n");
    for (port, algorithm, backends) in services {
        let list: Vec<String> = backends.iter().map(|n| format!("{{address: 10.77.0.{n}, name: b{n}}}")).collect();
        let slots = if *algorithm == "maglev" { 4099 } else { 8192 };
        t.push_str(&format!(
            "  - {{name: s{port}, vip: 10.77.0.100, port: {port}, algorithm: {algorithm}, slots: {slots}, hash: flow, backends: [{}]}}\n",
            list.join(", ")
        ));
    }
    t
}

/// Whether the program `prog_id` serves exactly `pool` (common::serves, with these MACs).
fn serves(prog_id: u32, pool: &Pool) -> Result<(), String> {
    common::serves(prog_id, pool, &static_backend_mac, &[])
}

fn attach(p: &Pair, config: &Path, pins: &BpfMount) -> Running {
    Running::start(
        &p.lb,
        &["attach", "lbv0", "--config", config.to_str().expect("utf-8"), "--pin", "--pin-dir", pins.arg(), "--reload-delay", "0.001", "--xdp-mode", "generic"],
    )
}

/// The program id lb said it attached or adopted.
fn prog_of(line: &str) -> u32 {
    if line.contains("adopted") {
        line.split(" -> ").nth(1).and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()).and_then(|n| n.parse().ok()).expect("program id")
    } else {
        Running::prog_id(line)
    }
}

fn status_json(p: &Pair, pins: &BpfMount) -> serde_json::Value {
    let out = lb_run(&p.lb, &["status", "lbv0", "--json", "--pin-dir", pins.arg()]);
    assert!(out.status.success(), "lb status: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("status json")
}

#[test]
fn root_a_pinned_data_plane_outlives_its_controller_and_is_adopted() {
    let (p, dir, pins) = env();
    let text = pool_text(&[(80, "ring", &[21, 22, 23]), (81, "maglev", &[24, 25])]);
    let config = write_config(&dir, "pool.yaml", &text);
    let pool = parse_str("pool.yaml", &text).expect("valid");

    let mut lb = attach(&p, &config, &pins);
    let first = prog_of(&lb.wait_for("attached to lbv0", SECS));
    lb.wait_for("serving", SECS);
    serves(first, &pool).expect("first controller's tables");
    let st = status_json(&p, &pins);
    assert!(st["controller"]["pid"].as_u64().is_some(), "a controller runs: {st}");
    assert_eq!(st["status"]["services"].as_array().map(|a| a.len()), Some(2));
    assert_eq!(st["status"]["services"][0]["name"], "s80");

    // SIGTERM: the program stays, forwarding with its tables; no controller.
    lb.signal(Signal::SIGTERM);
    assert!(lb.wait_exit(SECS).success());
    assert!(lb.seen.iter().any(|l| l.contains("left the data plane on lbv0 attached and pinned")), "{:?}", lb.seen);
    assert!(p.lb.has_xdp("lbv0"), "the program went with its controller");
    serves(first, &pool).expect("tables after the controller left");
    let st = status_json(&p, &pins);
    assert!(st["controller"].is_null(), "{st}");
    assert_eq!(st["program_id"].as_u64(), Some(first as u64));
    let b21 = &st["status"]["services"][0]["backends"][0];
    assert_eq!((b21["identity"].as_str(), b21["state"].as_str()), (Some("b21"), Some("active")));

    // A new controller adopts it: the program is replaced in the link, nothing else changes.
    let mut lb = attach(&p, &config, &pins);
    let line = lb.wait_for("adopted the data plane", SECS);
    assert!(line.contains("no service changed"), "{line}");
    let second = prog_of(&line);
    assert_ne!(first, second);
    lb.wait_for("serving", SECS);
    serves(second, &pool).expect("adopted tables");
    // A second controller for the same interface is refused while this one runs.
    let out = lb_run(&p.lb, &["attach", "lbv0", "--config", config.to_str().expect("utf-8"), "--pin", "--pin-dir", pins.arg()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("controls lbv0's data plane"), "{err}");
    // lb detach is refused while a controller runs.
    let out = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
    assert!(!out.status.success());

    // kill -9: the data plane goes on; a reload by the next controller applies the new file.
    lb.signal(Signal::SIGKILL);
    lb.wait_exit(SECS);
    assert!(p.lb.has_xdp("lbv0"));
    let text2 = pool_text(&[(80, "ring", &[21, 23]), (82, "ring", &[26, 27, 28])]);
    let config2 = write_config(&dir, "pool.yaml", &text2);
    let pool2 = parse_str("pool.yaml", &text2).expect("valid");
    let mut lb = attach(&p, &config2, &pins);
    let line = lb.wait_for("adopted the data plane", SECS);
    assert!(line.contains("s80 changed (b22 removed") && line.contains("s81 removed") && line.contains("s82 added"), "{line}");
    lb.wait_for("serving", SECS);
    serves(prog_of(&line), &pool2).expect("tables after the adoption's reload");
    lb.signal(Signal::SIGTERM);
    lb.wait_exit(SECS);

    // lb detach removes it all and says what it removed; a second detach has nothing to remove.
    let out = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("detached XDP program") && said.contains("link"), "{said}");
    assert!(!p.lb.has_xdp("lbv0"), "detach left a program");
    let left: Vec<_> = walk(&pins.0).into_iter().filter(|f| !f.ends_with(".debug")).collect();
    assert!(left.is_empty(), "pins left: {left:?}");
    let out = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no pinned lb data plane for lbv0"));
}

fn walk(d: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

#[test]
fn root_without_pin_nothing_is_pinned_and_exit_detaches() {
    let (p, dir, pins) = env();
    let config = write_config(&dir, "pool.yaml", &pool_text(&[(80, "ring", &[21, 22])]));
    let mut lb = Running::start(&p.lb, &["attach", "lbv0", "--config", config.to_str().expect("utf-8"), "--xdp-mode", "generic"]);
    lb.wait_for("serving", SECS);
    lb.signal(Signal::SIGTERM);
    assert!(lb.wait_exit(SECS).success());
    assert!(!p.lb.has_xdp("lbv0"));
    let left: Vec<_> = walk(&pins.0).into_iter().filter(|f| !f.ends_with(".debug")).collect();
    assert!(left.is_empty(), "{left:?}");
}

/// 50 reloads, each interrupted by kill -9 at a random moment (before, during or after the
/// writes), each followed by an adoption with the file as it is then: every table must come out
/// exactly as the builder computes it.
#[test]
fn root_kill_9_at_random_points_of_reloads_never_leaves_a_table_adoption_cannot_repair() {
    let (p, dir, pins) = env();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ rand_u32() as u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let random_pool = |r: &mut dyn FnMut() -> u64| -> String {
        let mut services = Vec::new();
        for port in 80..84u16 {
            if r() % 4 == 0 {
                continue;
            }
            let backends: Vec<u32> = (21..=39).filter(|_| r() % 3 == 0).collect();
            services.push((port, if r() % 2 == 0 { "ring" } else { "maglev" }, backends));
        }
        let refs: Vec<(u16, &str, &[u32])> = services.iter().map(|(p, a, b)| (*p, *a, b.as_slice())).collect();
        pool_text(&refs)
    };
    let mut text = random_pool(&mut next);
    let config = write_config(&dir, "pool.yaml", &text);
    let mut lb = attach(&p, &config, &pins);
    lb.wait_for("serving", SECS);
    let mut interrupted = 0;
    for round in 0..50 {
        // A new file; kill -9 after 0 to 25 ms, while the reload may be anywhere.
        text = random_pool(&mut next);
        let tmp = dir.join("pool.yaml.tmp");
        std::fs::write(&tmp, &text).expect("write");
        std::fs::rename(&tmp, &config).expect("rename");
        std::thread::sleep(Duration::from_micros(next() % 25_000));
        lb.signal(Signal::SIGKILL);
        lb.wait_exit(SECS);
        if !lb.seen.iter().any(|l| l.contains("reload (file changed)")) {
            interrupted += 1;
        }
        let killed_log: Vec<String> = lb.seen.iter().filter(|l| !l.contains("  backend")).cloned().collect();
        // The next controller adopts the data plane with the file as it is now.
        lb = attach(&p, &config, &pins);
        let line = lb.wait_for("adopted the data plane", SECS);
        lb.wait_for("serving", SECS);
        let pool = parse_str("pool.yaml", &text).expect("valid");
        if let Err(e) = serves(prog_of(&line), &pool) {
            let live = Live::new(prog_of(&line));
            let routes: Vec<String> = pool.services.iter().map(|s| format!("{}: {:?}", s.name, live.route(s.vip, s.port, s.protocol))).collect();
            panic!("round {round}: {e}\nadoption: {line}\nroutes: {routes:?}\nfile:\n{text}\nlog of the killed controller:\n{}", killed_log.join("\n"));
        }
    }
    println!("50 adoptions after kill -9; {interrupted} kills came before the reload finished logging");
    lb.signal(Signal::SIGTERM);
    lb.wait_exit(SECS);
    let out = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
    assert!(out.status.success());
}

#[test]
fn root_pins_that_are_not_what_they_should_be_give_clear_errors_or_clean_recoveries() {
    let (p, dir, pins) = env();
    let config = write_config(&dir, "pool.yaml", &pool_text(&[(80, "ring", &[21, 22])]));
    let cfg = config.to_str().expect("utf-8");

    // A pin directory that is not bpffs and not empty.
    let plain = temp_dir();
    std::fs::write(plain.join("file"), "x").expect("write");
    let out = lb_run(&p.lb, &["attach", "lbv0", "--config", cfg, "--pin", "--pin-dir", plain.to_str().expect("utf-8")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is not on a bpf filesystem and is not empty"), "{err}");
    assert!(!p.lb.has_xdp("lbv0"));

    // A layout from the future: lb_meta in a format this version does not know.
    let mut lb = attach(&p, &config, &pins);
    lb.wait_for("serving", SECS);
    lb.signal(Signal::SIGTERM);
    lb.wait_exit(SECS);
    let plane = walk(&pins.0).into_iter().find(|f| f.ends_with("/lb_meta")).expect("lb_meta pinned");
    let mut args = vec!["bpftool", "map", "update", "pinned", plane.as_str(), "key", "0", "0", "0", "0", "value", "hex"];
    args.extend(std::iter::repeat_n("ff", std::mem::size_of::<lb::dataplane::types::lb_meta>()));
    sh(&args);
    let out = lb_run(&p.lb, &["attach", "lbv0", "--config", cfg, "--pin", "--pin-dir", pins.arg()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("a version of lb this one does not know"), "{err}");
    assert!(p.lb.has_xdp("lbv0"), "a refusal must leave the pinned data plane alone");
    let out = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // A pin left by another interface: the directory of lbv0 holds a link attached elsewhere.
    p.lb.ip(&["link", "add", "lbx0", "type", "veth", "peer", "name", "lbx1"]);
    p.lb.ip(&["link", "set", "lbx0", "up"]);
    p.lb.ip(&["link", "set", "lbx1", "up"]);
    p.lb.ip(&["addr", "add", "10.78.0.1/24", "dev", "lbx0"]);
    let other = write_config(&dir, "other.yaml", "services:\n  - {name: o, vip: 10.78.0.100, port: 80, backends: []}\n");
    let mut lb = Running::start(&p.lb, &["attach", "lbx0", "--config", other.to_str().expect("utf-8"), "--pin", "--pin-dir", pins.arg(), "--xdp-mode", "generic"]);
    lb.wait_for("serving", SECS);
    lb.signal(Signal::SIGTERM);
    lb.wait_exit(SECS);
    let lbx = walk(&pins.0).into_iter().find(|f| f.ends_with("/lbx0/link")).expect("lbx0 pinned");
    let lbv_dir = Path::new(&lbx).parent().and_then(|d| d.parent()).expect("ns dir").join("lbv0");
    std::fs::create_dir_all(&lbv_dir).expect("mkdir");
    for f in std::fs::read_dir(Path::new(&lbx).parent().expect("dir")).expect("read").flatten() {
        std::fs::rename(f.path(), lbv_dir.join(f.file_name())).expect("move pin");
    }
    let out = lb_run(&p.lb, &["attach", "lbv0", "--config", cfg, "--pin", "--pin-dir", pins.arg()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is attached to lbx0, not lbv0"), "{err}");
    assert!(!p.lb.has_xdp("lbv0"));

    // A stale pin whose interface is gone: removed, and a fresh data plane attached.
    p.lb.ip(&["link", "del", "lbx0"]);
    let mut lb = attach(&p, &config, &pins);
    lb.wait_for("removing a stale pinned data plane", SECS);
    lb.wait_for("attached to lbv0", SECS);
    lb.wait_for("serving", SECS);
    lb.signal(Signal::SIGTERM);
    lb.wait_exit(SECS);

    // A plane directory that is a symbolic link (whoever owns the pin directory can make one,
    // pointing at pins it does not own): lb detach, as root, does not follow it.
    let link = walk(&pins.0).into_iter().find(|f| f.ends_with("/lbv0/link")).expect("lbv0 pinned");
    let lbv_dir = Path::new(&link).parent().expect("plane dir").to_path_buf();
    let decoy = lbv_dir.with_file_name("lbz0");
    std::os::unix::fs::symlink(&lbv_dir, &decoy).expect("symlink on bpffs");
    let out = lb_run(&p.lb, &["detach", "lbz0", "--pin-dir", pins.arg()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is a symbolic link"), "{err}");
    assert!(p.lb.has_xdp("lbv0") && Path::new(&link).exists(), "detach followed the link: lbv0's plane went");
    std::fs::remove_file(&decoy).expect("remove the symlink");
    // The same through a pin: a real directory whose `link` points at lbv0's.
    std::fs::create_dir(&decoy).expect("mkdir on bpffs");
    std::os::unix::fs::symlink(&link, decoy.join("link")).expect("symlink on bpffs");
    let out = lb_run(&p.lb, &["detach", "lbz0", "--pin-dir", pins.arg()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is a symbolic link"), "{err}");
    assert!(p.lb.has_xdp("lbv0") && Path::new(&link).exists(), "detach followed the pin's link: lbv0's plane went");
    let out = lb_run(&p.lb, &["status", "lbz0", "--pin-dir", pins.arg()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("is a symbolic link"));
    std::fs::remove_file(decoy.join("link")).expect("remove the symlink");
    std::fs::remove_dir(&decoy).expect("rmdir");

    let out = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
    assert!(out.status.success());
}

#[test]
fn root_announce_holds_the_vips_while_serving_and_withdraws_them_first() {
    let (p, dir, pins) = env();
    p.lb.ip(&["link", "add", "vips0", "type", "ifb"]);
    let config = write_config(&dir, "pool.yaml", &pool_text(&[(80, "ring", &[21, 22])]));
    let cfg = config.to_str().expect("utf-8");
    let holds = |p: &Pair| p.lb.ip(&["addr", "show", "dev", "vips0"]).contains("10.77.0.100/32");

    // Refused: the attached interface itself.
    let out = lb_run(&p.lb, &["attach", "lbv0", "--config", cfg, "--announce", "lbv0"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("another interface than the one lb attaches to"));

    // Without --pin: held while serving, withdrawn on exit.
    let mut lb = Running::start(&p.lb, &["attach", "lbv0", "--config", cfg, "--announce", "vips0", "--xdp-mode", "generic", "--reload-delay", "0.01"]);
    lb.wait_for("announce: 10.77.0.100 on vips0", SECS);
    lb.wait_for("serving", SECS);
    assert!(holds(&p));
    // A reload that moves the service to another VIP withdraws the old one, announces the new.
    std::fs::write(&config, pool_text(&[(80, "ring", &[21, 22])]).replace("10.77.0.100", "10.77.0.101")).expect("write");
    lb.wait_for("withdraw: 10.77.0.100 from vips0", SECS);
    lb.wait_for("announce: 10.77.0.101 on vips0", SECS);
    lb.signal(Signal::SIGTERM);
    assert!(lb.wait_exit(SECS).success());
    let addrs = p.lb.ip(&["addr", "show", "dev", "vips0"]);
    assert!(!addrs.contains("10.77.0.10"), "VIPs left after exit: {addrs}");

    // With --pin: they stay after exit (the data plane still serves them); lb detach withdraws them.
    std::fs::write(&config, pool_text(&[(80, "ring", &[21, 22])])).expect("write");
    let mut lb = Running::start(&p.lb, &["attach", "lbv0", "--config", cfg, "--announce", "vips0", "--pin", "--pin-dir", pins.arg(), "--xdp-mode", "generic"]);
    lb.wait_for("serving", SECS);
    lb.signal(Signal::SIGKILL);
    lb.wait_exit(SECS);
    assert!(holds(&p), "a pinned data plane's VIPs go with its controller");
    let out = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("withdrew the VIPs 10.77.0.100"), "{said}");
    assert!(!holds(&p));

    // Only its own: an address the operator put there by hand (no lb mark) stays, even when
    // it equals a VIP of the detached data plane.
    let mut lb = Running::start(&p.lb, &["attach", "lbv0", "--config", cfg, "--announce", "vips0", "--pin", "--pin-dir", pins.arg(), "--xdp-mode", "generic"]);
    lb.wait_for("serving", SECS);
    lb.signal(Signal::SIGKILL);
    lb.wait_exit(SECS);
    p.lb.ip(&["addr", "del", "10.77.0.100/32", "dev", "vips0"]);
    p.lb.ip(&["addr", "add", "10.77.0.100/32", "dev", "vips0"]);
    let out = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.contains("left the VIPs 10.77.0.100: not marked as lb's"), "{said}");
    assert!(holds(&p), "the operator's address was withdrawn");
}

/// The generation of every backend id in the pinned data plane of `prog_id` (index = id).
fn generations(prog_id: u32) -> Vec<u32> {
    Live::new(prog_id).values("backend_gen").iter().map(|v| u32::from_ne_bytes(v[..4].try_into().expect("u32"))).collect()
}

/// Issue 22, finding 12: a backend id retired by one controller and reissued by the next, which
/// adopted the data plane, gets a generation its first owner's flow entries never carried, so
/// those entries stay unusable (flow.h's usable() compares the entry's generation with
/// backend_gen). Adoption used to read generations only up to the highest id in the pool, so the
/// retired id 3 came back at generation 1 again: the one its first owner's entries hold.
#[test]
fn root_a_backend_id_retired_before_an_adoption_is_reissued_with_a_newer_generation() {
    let (p, dir, pins) = env();
    let config = write_config(&dir, "pool.yaml", &pool_text(&[(80, "ring", &[21, 22, 23])]));
    let mut lb = attach(&p, &config, &pins);
    let prog = prog_of(&lb.wait_for("attached to lbv0", SECS));
    lb.wait_for("serving", SECS);
    let first = generations(prog)[3];
    assert!(first > 0, "id 3 (b23) was issued: {:?}", &generations(prog)[..5]);

    // b23 leaves the pool: id 3 retires, keeping its generation (flows of b23 may still name it).
    std::fs::write(&config, pool_text(&[(80, "ring", &[21, 22])])).expect("write");
    lb.wait_for("reload (file changed)", SECS);
    lb.signal(Signal::SIGTERM);
    assert!(lb.wait_exit(SECS).success());

    // The next controller adopts ids 1 and 2; a new backend then takes id 3 again.
    let mut lb = attach(&p, &config, &pins);
    let prog = prog_of(&lb.wait_for("adopted the data plane", SECS));
    lb.wait_for("serving", SECS);
    std::fs::write(&config, pool_text(&[(80, "ring", &[21, 22, 24])])).expect("write");
    lb.wait_for("reload (file changed)", SECS);
    let addr3 = Live::new(prog).values("backend_addrs")[3].clone();
    assert!(addr3.windows(4).any(|w| w == [10, 77, 0, 24]), "the test needs b24 to reuse id 3; id 3 holds {addr3:?}");
    let again = generations(prog)[3];
    assert!(
        again & 0xffff != first & 0xffff && again > first,
        "id 3 was reissued at generation {again}, which b23's flow entries (generation {first}) match: they are usable again"
    );
    lb.signal(Signal::SIGTERM);
    lb.wait_exit(SECS);
    let _ = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
}

/// Issue 22, finding 14: `lb status` must never make a starting controller fail. It used to
/// take the directory's lock for an instant to see whether a controller runs, and a controller
/// starting in that instant was refused ("another lb controls ..."). Now status reads
/// /proc/locks first (under strace, with a controller holding the lock, it makes no flock call),
/// and only where the lock is not listed there tries it, while a starting controller tries its
/// lock for 500 ms before it gives up. Here one thread runs `lb status` over and over with no
/// controller (so every run tries the lock) while another takes and drops the lock exactly as a
/// starting controller does, counting the refusals.
#[test]
fn root_lb_status_never_makes_a_starting_controller_fail() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (p, dir, pins) = env();
    let config = write_config(&dir, "pool.yaml", &pool_text(&[(80, "ring", &[21, 22])]));
    let mut lb = attach(&p, &config, &pins);
    lb.wait_for("serving", SECS);

    // With a controller running, /proc/locks shows its lock: status never touches it.
    let traced = dir.join("status.strace");
    let out = p
        .lb
        .cmd("strace")
        .args(["-f", "-qq", "-e", "trace=flock", "-o", traced.to_str().expect("utf-8"), LB, "status", "lbv0", "--pin-dir", pins.arg()])
        .output()
        .expect("strace (needed by this test)");
    assert!(out.status.success(), "lb status under strace: {}", String::from_utf8_lossy(&out.stderr));
    let calls = std::fs::read_to_string(&traced).expect("strace output");
    assert!(!calls.contains("LOCK_EX"), "lb status takes the lock of a controller /proc/locks lists:\n{calls}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("controller: lb pid"), "{}", String::from_utf8_lossy(&out.stdout));
    lb.signal(Signal::SIGTERM);
    assert!(lb.wait_exit(SECS).success());
    let plane = walk(&pins.0).into_iter().find(|f| f.ends_with("/link")).map(PathBuf::from).expect("the pinned link");
    let plane_dir = plane.parent().expect("its directory").to_path_buf();

    // A process started while this one holds the lock holds it too, until it execs (the
    // descriptor is copied at the fork): the lock attempts pause while lb status is started, so
    // that only lb status itself can be seen holding it.
    let gate = std::sync::RwLock::new(());
    let stop = AtomicBool::new(false);
    let (runs, refused, tries) = std::thread::scope(|s| {
        let status = s.spawn(|| {
            // The other loop stops with this one, panic or not.
            struct Stop<'a>(&'a AtomicBool);
            impl Drop for Stop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let _stop = Stop(&stop);
            let mut runs = 0;
            let until = std::time::Instant::now() + Duration::from_secs(4);
            while std::time::Instant::now() < until {
                let child = {
                    let _paused = gate.write().expect("gate");
                    p.lb.cmd(LB).args(["status", "lbv0", "--json", "--pin-dir", pins.arg()]).stdout(std::process::Stdio::piped()).spawn().expect("spawn lb status")
                };
                let out = child.wait_with_output().expect("lb status");
                let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
                assert!(st["program_id"].as_u64().is_some(), "{st}");
                runs += 1;
            }
            runs
        });
        let (mut refused, mut tries) = (0u64, 0u64);
        while !stop.load(Ordering::Relaxed) {
            let _running = gate.read().expect("gate");
            // What a starting controller does (src/daemon/pinning.rs), the lock dropped at once.
            match lb::dataplane::pin::lock_patiently(&plane_dir, lb::dataplane::pin::LOCK_PATIENCE).expect("lock") {
                Some(_lock) => {}
                None => refused += 1,
            }
            tries += 1;
        }
        (status.join().expect("status thread"), refused, tries)
    });
    println!("{runs} runs of lb status; {tries} controller-style lock attempts, {refused} refused");
    assert!(runs > 3, "lb status ran only {runs} times");
    assert_eq!(refused, 0, "{refused} of {tries} lock attempts found the lock taken while only lb status ran");
    let _ = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
}

/// Review of finding 14: /proc/locks leaves out locks whose holder's pid the reader cannot see,
/// so `lb status` run in another pid namespace (a container, `kubectl exec`) than a running
/// controller said "controller: none". It now tries the lock where /proc/locks does not list it.
#[test]
fn root_lb_status_sees_a_controller_in_another_pid_namespace() {
    let (p, dir, pins) = env();
    let config = write_config(&dir, "pool.yaml", &pool_text(&[(80, "ring", &[21, 22])]));
    let mut lb = attach(&p, &config, &pins);
    lb.wait_for("serving", SECS);
    let status_in_own_pid_ns = || {
        let out = p.lb.cmd("unshare").args(["-p", "-f", "--mount-proc", LB, "status", "lbv0", "--json", "--pin-dir", pins.arg()]).output().expect("unshare (util-linux)");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("status json")
    };
    let st = status_in_own_pid_ns();
    assert_eq!(st["controller"]["pid"].as_u64(), Some(u64::from(lb.child.id())), "{st}");
    lb.signal(Signal::SIGTERM);
    assert!(lb.wait_exit(SECS).success());
    let st = status_in_own_pid_ns();
    assert!(st["controller"].is_null(), "{st}");
    let _ = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
}

/// Issue 22, finding 9: a VIP announced by one run and removed from the pool while lb was down
/// (pinned and stopped, or killed) is withdrawn by the next run before it attaches, while the
/// operator's own addresses on the same device, host addresses included, stay. lb used to start
/// with nothing announced, so the lost VIP stayed on the device and BGP kept attracting it.
#[test]
fn root_announce_withdraws_at_start_the_vips_an_earlier_run_left_and_only_those() {
    let (p, dir, pins) = env();
    p.lb.ip(&["link", "add", "vips0", "type", "ifb"]);
    // The operator's: a host address and a subnet on the device lb announces on.
    p.lb.ip(&["addr", "add", "10.99.0.7/32", "dev", "vips0"]);
    p.lb.ip(&["addr", "add", "10.99.0.1/24", "dev", "vips0"]);
    let both = "services:\n  - {name: a, vip: 10.77.0.100, port: 80, backends: [{address: 10.77.0.21, name: b21}]}\n  \
                - {name: b, vip: 10.77.0.101, port: 80, backends: [{address: 10.77.0.22, name: b22}]}\n";
    let one = both.lines().take(2).collect::<Vec<_>>().join("\n") + "\n";
    let config = write_config(&dir, "pool.yaml", both);
    let cfg = config.to_str().expect("utf-8");
    let addrs = |p: &Pair| p.lb.ip(&["addr", "show", "dev", "vips0"]);

    for pin in [true, false] {
        // A first run announces both VIPs and dies without withdrawing them (a pinned data plane
        // keeps them on purpose; kill -9 of an unpinned one cannot withdraw them).
        std::fs::write(&config, both).expect("write");
        let mut args = vec!["attach", "lbv0", "--config", cfg, "--announce", "vips0", "--xdp-mode", "generic"];
        if pin {
            args.extend_from_slice(&["--pin", "--pin-dir", pins.arg()]);
        }
        let mut lb = Running::start(&p.lb, &args);
        lb.wait_for("announce: 10.77.0.101 on vips0", SECS);
        lb.wait_for("serving", SECS);
        lb.signal(Signal::SIGKILL);
        lb.wait_exit(SECS);
        assert!(addrs(&p).contains("10.77.0.101/32"), "pin {pin}: {}", addrs(&p));

        // The next run's pool has lost service b: its VIP goes before the new pool is attached;
        // the other VIP stays, and so do the operator's addresses.
        std::fs::write(&config, &one).expect("write");
        let mut lb = Running::start(&p.lb, &args);
        lb.wait_for("serving", SECS);
        let at = |needle: &str| lb.seen.iter().position(|l| l.contains(needle));
        let withdrawn = at("withdraw: 10.77.0.101 from vips0");
        let attached = at("attached to lbv0").or(at("adopted the data plane"));
        assert!(withdrawn.is_some() && withdrawn < attached, "pin {pin}: withdrawn before attaching: {:?}", lb.seen);
        // The VIP the pool keeps: with a pinned data plane serving it, it stays; without one it
        // goes before attaching (the kernel would answer its TCP with resets meanwhile) and
        // comes back once the program is attached.
        let kept = at("withdraw: 10.77.0.100 from vips0");
        let again = at("announce: 10.77.0.100 on vips0");
        if pin {
            assert!(kept.is_none() && again.is_none(), "pin: the adopted data plane's VIP was withdrawn: {:?}", lb.seen);
        } else {
            assert!(kept.is_some() && kept < attached && attached < again, "no pin: withdrawn before attaching, announced after: {:?}", lb.seen);
        }
        let held = addrs(&p);
        assert!(!held.contains("10.77.0.101") && held.contains("10.77.0.100/32"), "pin {pin}: {held}");
        assert!(held.contains("10.99.0.7/32") && held.contains("10.99.0.1/24"), "pin {pin}: the operator's addresses went: {held}");
        lb.signal(Signal::SIGTERM);
        assert!(lb.wait_exit(SECS).success());
        if pin {
            let out = lb_run(&p.lb, &["detach", "lbv0", "--pin-dir", pins.arg()]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        let left = addrs(&p);
        assert!(!left.contains("10.77.0.10") && left.contains("10.99.0.7/32"), "pin {pin}: {left}");
    }
}

/// Review of finding 9: lb's mark on an address means "some lb", not "this lb". Two lbs attached
/// to two interfaces announce on one device; starting (or restarting after kill -9) one of them
/// used to withdraw the other's VIPs as its own leftovers, since its pool lacked them. Each lb
/// now withdraws only what its own state file lists.
#[test]
fn root_announce_two_lbs_on_one_device_never_withdraw_each_others_vips() {
    let (p, dir, _pins) = env();
    p.lb.ip(&["link", "add", "vips0", "type", "ifb"]);
    // A second interface in the same namespace, with a backend of its own.
    p.lb.ip(&["link", "add", "lbw0", "type", "veth", "peer", "name", "lbw1"]);
    p.lb.ip(&["addr", "add", "10.88.0.1/24", "dev", "lbw0"]);
    p.lb.ip(&["link", "set", "lbw0", "up"]);
    p.lb.ip(&["link", "set", "lbw1", "up"]);
    p.lb.ip(&["neigh", "replace", "10.88.0.21", "lladdr", "02:00:00:00:00:21", "dev", "lbw0", "nud", "permanent"]);
    let a = write_config(&dir, "a.yaml", "services:\n  - {name: a, vip: 10.77.0.100, port: 80, backends: [{address: 10.77.0.21, name: b21}]}\n");
    let b = write_config(&dir, "b.yaml", "services:\n  - {name: b, vip: 10.88.0.100, port: 80, backends: [{address: 10.88.0.21, name: w21}]}\n");
    let args = |iface: &'static str, cfg: &Path| -> Vec<String> {
        ["attach", iface, "--config", cfg.to_str().expect("utf-8"), "--announce", "vips0", "--xdp-mode", "generic"].iter().map(|s| s.to_string()).collect()
    };
    let start = |iface: &'static str, cfg: &Path| {
        let args = args(iface, cfg);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut lb = Running::start(&p.lb, &refs);
        lb.wait_for("serving", SECS);
        lb
    };
    let addrs = || p.lb.ip(&["addr", "show", "dev", "vips0"]);

    let mut first = start("lbv0", &a);
    assert!(addrs().contains("10.77.0.100/32"), "{}", addrs());
    let mut second = start("lbw0", &b);
    let both = addrs();
    assert!(both.contains("10.77.0.100/32") && both.contains("10.88.0.100/32"), "starting the second lb withdrew the first's VIP: {both}");
    // The second is killed and restarted: its own VIP is withdrawn and announced again, the
    // first's never.
    second.signal(Signal::SIGKILL);
    second.wait_exit(SECS);
    let mut second = start("lbw0", &b);
    let both = addrs();
    assert!(both.contains("10.77.0.100/32") && both.contains("10.88.0.100/32"), "restarting the second lb withdrew the first's VIP: {both}");
    assert!(!second.seen.iter().any(|l| l.contains("10.77.0.100")), "{:?}", second.seen);
    // The same the other way round, and an orderly stop withdraws only the stopping lb's.
    first.signal(Signal::SIGKILL);
    first.wait_exit(SECS);
    let mut first = start("lbv0", &a);
    assert!(addrs().contains("10.88.0.100/32"), "restarting the first lb withdrew the second's VIP: {}", addrs());
    second.signal(Signal::SIGTERM);
    assert!(second.wait_exit(SECS).success());
    let left = addrs();
    assert!(left.contains("10.77.0.100/32") && !left.contains("10.88.0.100"), "{left}");
    first.signal(Signal::SIGTERM);
    assert!(first.wait_exit(SECS).success());
    assert!(!addrs().contains("10.77.0.100"), "{}", addrs());
}
