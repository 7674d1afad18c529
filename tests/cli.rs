//! The `lb check`, `lb table`, `lb diff` and `lb quic-lb` commands, and `lb decap`'s flag checks, run as a user runs them. No root needed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn lb(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lb")).args(args).output().expect("run lb")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/pool.yaml").display().to_string()
}

/// A scratch file removed when dropped.
struct Scratch(PathBuf);
impl Scratch {
    fn new(name: &str, text: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("lb-cli-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        Scratch(p)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const FOUR: &str = include_str!("pools/four-services.yaml");

#[test]
fn check_prints_one_line_per_service_and_exits_zero() {
    let o = lb(&["check", "--config", &example()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.lines().any(|l| l.starts_with("web: 10.99.0.100:80/tcp ring slots=65537")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("dns: 10.99.0.100:53/udp maglev")), "{out}");
}

#[test]
fn check_refuses_a_bad_file_with_its_position() {
    let bad = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/bad/weight-out-of-range.yaml");
    let o = lb(&["check", "--config", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("weight-out-of-range.yaml:9:17: services[0].backends[1].weight: expected an integer 0..=1000"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
}

#[test]
fn missing_file_and_directory_are_clear_errors() {
    let o = lb(&["check", "--config", "/nonexistent/pool.yaml"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o).trim(), "lb: error: /nonexistent/pool.yaml: no such file");
    let o = lb(&["table", "--config", env!("CARGO_MANIFEST_DIR")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("is a directory"), "{}", stderr(&o));
}

#[test]
fn table_json_has_the_documented_shape_and_agrees_with_itself() {
    let o = lb(&["table", "--config", &example(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let services = v["services"].as_array().unwrap();
    assert_eq!(services.len(), 2);
    for s in services {
        let m = s["slots"].as_u64().unwrap() as usize;
        let table = s["table"].as_array().unwrap();
        assert_eq!(table.len(), m);
        assert!(s["name"].is_string() && s["algorithm"].is_string());
        for b in s["backends"].as_array().unwrap() {
            let id = b["identity"].as_str().unwrap();
            assert!(b["address"].is_string() && b["weight"].is_u64());
            let owned = table.iter().filter(|e| e.as_str() == Some(id)).count();
            assert_eq!(owned as u64, b["slots"].as_u64().unwrap(), "{id}");
        }
    }
    assert_eq!(services[0]["backends"][0]["identity"], "b1");
    assert_eq!(services[1]["backends"][0]["identity"], "10.99.0.11");
}

#[test]
fn table_service_filter_and_unknown_service() {
    let o = lb(&["table", "--config", &example(), "--service", "dns"]);
    assert!(o.status.success());
    let out = stdout(&o);
    assert!(out.starts_with("dns:") && !out.contains("web:"), "{out}");
    assert!(out.contains("deviation"));
    let o = lb(&["table", "--config", &example(), "--service", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no service named `nope` (services: web, dns)"), "{}", stderr(&o));
}

#[test]
fn table_text_shows_weights_slots_shares() {
    let f = Scratch::new("w.yaml", &FOUR.replace("ALG", "maglev").replace("name: d}", "name: d, weight: 0}"));
    let o = lb(&["table", "--config", f.path()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // 65537 / 3 = 21845.67: every live backend gets 21845 or 21846; d owns nothing.
    let rows: Vec<&str> = out.lines().filter(|l| l.contains(" (10.1.0.1")).collect();
    assert_eq!(rows.len(), 4, "{out}");
    for r in &rows[..3] {
        assert!(r.contains(" 21845 ") || r.contains(" 21846 "), "{r}");
        assert!(r.contains("33.333%"), "{r}");
    }
    assert!(rows[3].contains(" 0 ") && rows[3].trim_end().ends_with('-'), "{}", rows[3]);
}

#[test]
fn diff_of_a_ring_removal_moves_only_the_removed_backends_slots() {
    let old = Scratch::new("old.yaml", &FOUR.replace("ALG", "ring"));
    let new = Scratch::new("new.yaml", &FOUR.replace("ALG", "ring").replace("      - {address: 10.1.0.12, name: b}\n", ""));
    let table = lb(&["table", "--config", old.path(), "--json"]);
    let before: Value = serde_json::from_slice(&table.stdout).unwrap();
    let b_slots = before["services"][0]["backends"][1]["slots"].as_u64().unwrap();

    let o = lb(&["diff", old.path(), new.path(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let s = &v["services"][0];
    assert_eq!(s["change"], "changed");
    assert_eq!(s["moved"].as_u64().unwrap(), b_slots);
    assert!((s["minimum_fraction"].as_f64().unwrap() - 0.25).abs() < 1e-9);
    let moves = s["moves"].as_array().unwrap();
    assert!(!moves.is_empty());
    assert!(moves.iter().all(|m| m["from"] == "b"), "{moves:?}");
    assert_eq!(moves.iter().map(|m| m["count"].as_u64().unwrap()).sum::<u64>(), b_slots);

    let text = stdout(&lb(&["diff", old.path(), new.path()]));
    assert!(text.contains(&format!("app: {b_slots} of 65537 slots change owner")), "{text}");
    assert!(text.contains("unavoidable minimum 25.000%"), "{text}");
    assert!(text.contains("note: backend b removed"), "{text}");
}

#[test]
fn diff_reports_added_removed_and_unchanged_services() {
    let a = Scratch::new("a.yaml", &FOUR.replace("ALG", "ring"));
    let b = Scratch::new("b.yaml", &FOUR.replace("ALG", "ring").replace("name: app", "name: other"));
    let v: Value = serde_json::from_slice(&lb(&["diff", a.path(), b.path(), "--json"]).stdout).unwrap();
    let changes: Vec<(&str, &str)> =
        v["services"].as_array().unwrap().iter().map(|s| (s["name"].as_str().unwrap(), s["change"].as_str().unwrap())).collect();
    assert_eq!(changes, [("other", "added"), ("app", "removed")]);
    let same: Value = serde_json::from_slice(&lb(&["diff", a.path(), a.path(), "--json"]).stdout).unwrap();
    assert_eq!(same["services"][0]["change"], "unchanged");
    assert_eq!(same["services"][0]["moved"], 0);
}

#[test]
fn diff_across_table_sizes_is_sampled_and_says_so() {
    let a = Scratch::new("s1.yaml", &FOUR.replace("ALG", "maglev"));
    let b = Scratch::new("s2.yaml", &FOUR.replace("ALG", "maglev").replace("port: 443", "port: 443\n    slots: 65521"));
    let v: Value = serde_json::from_slice(&lb(&["diff", a.path(), b.path(), "--json"]).stdout).unwrap();
    let s = &v["services"][0];
    assert_eq!(s["sampled"], true);
    // A new table size reshuffles flows: about 3/4 of them land on another of 4 backends.
    let f = s["moved_fraction"].as_f64().unwrap();
    assert!((0.6..0.9).contains(&f), "{f}");
}

#[test]
fn diff_with_a_bad_file_fails_with_its_position() {
    let bad = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/bad/bad-protocol.yaml");
    let o = lb(&["diff", &example(), bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bad-protocol.yaml:5:15: services[0].protocol"), "{}", stderr(&o));
}

#[test]
fn bounded_services_check_table_and_diff_like_the_others() {
    let dir = std::env::temp_dir().join(format!("lb-cli-bounded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let a = dir.join("a.yaml");
    let b = dir.join("b.yaml");
    std::fs::write(&a, "services:\n  - {name: web, vip: 10.0.0.1, port: 80, algorithm: bounded, load_bound: 1.05, slots: 1000, backends: [10.1.0.1, 10.1.0.2, 10.1.0.3]}\n").expect("write");
    std::fs::write(&b, "services:\n  - {name: web, vip: 10.0.0.1, port: 80, algorithm: bounded, load_bound: 1.05, slots: 1000, backends: [10.1.0.1, 10.1.0.3]}\n").expect("write");
    let check = lb(&["check", "--config", a.to_str().expect("utf-8")]);
    assert!(check.status.success());
    assert!(stdout(&check).contains("bounded slots=1000") && stdout(&check).contains("load_bound=1.050"), "{}", stdout(&check));
    let table = lb(&["table", "--config", a.to_str().expect("utf-8"), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&table)).expect("json");
    assert_eq!(v["services"][0]["algorithm"], "bounded");
    assert_eq!(v["services"][0]["load_bound"], 1.05);
    // Every backend within its cap: ceil(1.05 * 1000 / 3) = 350.
    for be in v["services"][0]["backends"].as_array().expect("backends") {
        assert!(be["slots"].as_u64().expect("slots") <= 350, "{be}");
    }
    let diff = lb(&["diff", a.to_str().expect("utf-8"), b.to_str().expect("utf-8"), "--json"]);
    let d: serde_json::Value = serde_json::from_str(&stdout(&diff)).expect("json");
    let moved = d["services"][0]["moved"].as_u64().expect("moved");
    let removed_slots = v["services"][0]["backends"][1]["slots"].as_u64().expect("slots");
    assert!(moved >= removed_slots && moved <= 2 * removed_slots, "moved {moved} for {removed_slots}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn decap_refuses_to_start_without_being_told_whom_to_trust() {
    // Checked before privileges and the interface: no root needed, nothing touched.
    let o = lb(&["decap", "eth0"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.starts_with("lb: error: lb decap needs to know whom to trust: give --allow-from PREFIX"), "{err}");
    assert!(err.contains("--allow-any"), "{err}");
    // Both at once, or a prefix with host bits, is a usage error.
    let o = lb(&["decap", "eth0", "--allow-any", "--allow-from", "10.0.0.0/8"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
    let o = lb(&["decap", "eth0", "--allow-from", "10.0.0.1/8"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("did you mean 10.0.0.0/8 or 10.0.0.1/32?"), "{}", stderr(&o));
}

/// `lb quic-lb` prints what a server reads (lb::quic_lb::ServerParams), with the server ID
/// `lb table --json` shows and the service's parameters; IDs made from it decode to that server
/// ID; a backend it does not know, or one in two services, is a clear error.
#[test]
fn quic_lb_prints_what_a_server_needs_and_lb_table_agrees() {
    let pool = Scratch::new(
        "quic.yaml",
        "services:\n  - name: h3\n    vip: 10.0.0.1\n    port: 443\n    protocol: udp\n    quic_lb: {rotation: 3, server_id_len: 3, nonce_len: 5, key: 8f95f09245765f80256934e50c66207f}\n    backends: [{address: 10.1.0.1, name: b1}, {address: 10.1.0.2, name: b2, server_id: 'abcdef'}]\n  - name: h3b\n    vip: 10.0.0.2\n    port: 443\n    protocol: udp\n    quic_lb: {}\n    backends: [{address: 10.1.0.1, name: b1}]\n",
    );
    let table: Value = serde_json::from_str(&stdout(&lb(&["table", "-c", pool.path(), "--json", "-s", "h3"]))).expect("JSON");
    assert_eq!(table["services"][0]["quic_lb"], serde_json::json!({"rotation": 3, "server_id_len": 3, "nonce_len": 5, "encrypted": true}));
    assert!(!table.to_string().contains("8f95f092"), "lb table --json never shows the key");
    for (j, name) in ["b1", "b2"].iter().enumerate() {
        let o = lb(&["quic-lb", "-c", pool.path(), "-b", name, "-s", "h3"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let params = lb::quic_lb::ServerParams::parse(&stdout(&o)).expect("what lb quic-lb prints, a server reads");
        assert_eq!(Value::String(lb::quic_lb::hex(&params.server_id)), table["services"][0]["backends"][j]["server_id"]);
        assert_eq!((params.rotation, params.nonce_len, params.key.map(|k| k[0])), (3, 5, Some(0x8f)));
        let config = params.config().expect("valid");
        let cid = lb::quic_lb::encode(&config, &params.server_id, &[9, 8, 7, 6, 5]);
        assert_eq!(lb::quic_lb::decode_server_id(&config, &cid), Some(params.server_id.clone()));
    }
    assert_eq!(table["services"][0]["backends"][1]["server_id"], "abcdef");
    let o = lb(&["quic-lb", "-c", pool.path(), "-b", "b1"]);
    assert!(!o.status.success() && stderr(&o).contains("several `quic_lb:` services (h3, h3b): name one with --service"), "{}", stderr(&o));
    let o = lb(&["quic-lb", "-c", pool.path(), "-b", "b9"]);
    assert!(!o.status.success() && stderr(&o).contains("no backend `b9`"), "{}", stderr(&o));
    let json: Value = serde_json::from_str(&stdout(&lb(&["quic-lb", "-c", pool.path(), "-b", "b1", "-s", "h3b", "--json"]))).expect("JSON");
    assert_eq!((json["server-id-length"].as_u64(), json["nonce-length"].as_u64(), json.get("cid-key")), (Some(2), Some(6), None));
}

/// `lb --version`: the crate's version, the commit this checkout is at (CI builds a clean
/// clone), and the layout of the maps it pins: the hash of crates/dataplane/src/bpf/lb.h's code
/// (lb::dataplane::identity, comments aside), which decides whether a restart adopts a pinned
/// data plane.
#[test]
fn version_names_the_commit_and_the_bpf_layout() {
    let o = lb(&["--version"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(root.join("crates/dataplane/src/bpf/lb.h")).unwrap();
    // The upgrade test's second build says it is another layout.
    let layout = lb::dataplane::identity::layout(&header, cfg!(feature = "layout-test"));
    // A build told its commit ($LB_GIT_COMMIT, as from a source tarball) names that one; else
    // git's, when this crate is the top of its repository (not a tree inside another one).
    let git = |args: &[&str]| match Command::new("git").arg("-C").arg(root).args(args).output() {
        Ok(g) if g.status.success() => Some(String::from_utf8_lossy(&g.stdout).trim().to_string()),
        _ => None,
    };
    let own_repo = git(&["rev-parse", "--show-toplevel"]).and_then(|t| std::fs::canonicalize(t).ok()) == std::fs::canonicalize(root).ok();
    let commit = match std::env::var("LB_GIT_COMMIT").ok().filter(|c| !c.is_empty()) {
        Some(c) => c,
        None if own_repo => git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string()),
        None => "unknown".to_string(),
    };
    assert_eq!(
        text.trim(),
        format!("lb {} (commit {commit}, BPF layout {layout:016x})", env!("CARGO_PKG_VERSION")),
        "lb --version"
    );
    // -V is the same.
    assert_eq!(stdout(&lb(&["-V"])), text);
}

/// The flags `lb SUBCOMMAND --help` lists.
fn flags_in_help(args: &[&str]) -> Vec<String> {
    let mut a = args.to_vec();
    a.push("--help");
    let help = stdout(&lb(&a));
    let mut flags: Vec<String> = help
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2 && w != &"--help")
        .map(str::to_string)
        .collect();
    flags.sort();
    flags.dedup();
    flags
}

/// `lb man DIR`: a page per command, named as `man` looks them up, each listing every flag its
/// command's --help lists, so the pages cannot drift from the binary.
#[test]
fn man_pages_cover_every_command_and_flag() {
    let dir = std::env::temp_dir().join(format!("lb-cli-{}-man", std::process::id()));
    let o = lb(&["man", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let commands = ["check", "table", "attach", "detach", "status", "decap", "agent", "quic-lb", "man", "completions", "diff", "push", "fleet"];
    let written: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    assert_eq!(written.len(), commands.len() + 1, "{written:?}");
    for sub in [None].into_iter().chain(commands.iter().map(Some)) {
        let (page, args) = match sub {
            None => ("lb.1".to_string(), vec![]),
            Some(s) => (format!("lb-{s}.1"), vec![*s]),
        };
        let path = dir.join(&page);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}")).replace("\\-", "-");
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page} is not a man page");
        assert!(text.contains("SEE ALSO"), "{page}");
        for flag in flags_in_help(&args) {
            assert!(text.contains(&flag), "{page} does not mention {flag}");
        }
        if sub.is_none() {
            for c in commands {
                assert!(text.contains(&format!("lb-{c}")), "lb.1 does not name lb-{c}");
            }
        }
    }
    // Rendered by man itself, when it is installed: no roff warnings.
    if let Ok(r) = Command::new("man").env("MANWIDTH", "80").arg("--warnings").arg("-l").arg(dir.join("lb-attach.1")).output() {
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        assert!(String::from_utf8_lossy(&r.stderr).trim().is_empty(), "man warns: {}", String::from_utf8_lossy(&r.stderr));
        assert!(String::from_utf8_lossy(&r.stdout).contains("--conntrack-guard"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a shell offers after `words`, from `lb completions SHELL` loaded into that shell.
fn completed(shell: &str, words: &str) -> String {
    let lb = env!("CARGO_BIN_EXE_lb");
    // bash's words: a trailing space starts an empty one.
    let array = if words.ends_with(' ') { format!("{words}''") } else { words.to_string() };
    let script = match shell {
        "bash" => format!(
            "source <('{lb}' completions bash); COMP_WORDS=({array}); COMP_CWORD=$((${{#COMP_WORDS[@]}}-1)); \
             COMP_LINE='{words}'; COMP_POINT=${{#COMP_LINE}}; \
             _lb lb \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        ),
        "fish" => format!("'{lb}' completions fish | source; complete -C '{words}'"),
        _ => unreachable!(),
    };
    let o = Command::new(shell).arg("-c").arg(&script).output().unwrap_or_else(|e| panic!("{shell} (scripts/setup.sh test installs it): {e}"));
    assert!(o.status.success(), "{shell}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `lb completions`: bash and fish, loaded into the real shells, offer lb's subcommands and
/// flags; zsh's script is valid zsh. (scripts/setup.sh test installs fish and zsh.)
#[test]
fn completions_complete_in_real_shells() {
    for shell in ["bash", "fish"] {
        let subs = completed(shell, "lb a");
        for s in ["attach", "agent"] {
            assert!(subs.lines().any(|l| l.split_whitespace().next() == Some(s)), "{shell}: `lb a` offers {subs:?}");
        }
        let flags = completed(shell, "lb attach --con");
        for f in ["--config", "--conntrack-guard", "--conntrack-size"] {
            assert!(flags.lines().any(|l| l.split_whitespace().next() == Some(f)), "{shell}: `lb attach --con` offers {flags:?}");
        }
        let modes = completed(shell, "lb attach eth0 --xdp-mode ");
        assert!(modes.contains("generic") && modes.contains("native"), "{shell}: modes {modes:?}");
    }
    let zsh = lb(&["completions", "zsh"]);
    let dir = std::env::temp_dir().join(format!("lb-cli-{}-zsh", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("_lb"), &zsh.stdout).unwrap();
    let o = Command::new("zsh").arg("-n").arg(dir.join("_lb")).output().expect("zsh (scripts/setup.sh test installs it)");
    assert!(o.status.success(), "zsh -n _lb: {}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&zsh.stdout).contains("#compdef lb"));
    let _ = std::fs::remove_dir_all(&dir);
    // A shell clap does not know is a usage error.
    assert_eq!(lb(&["completions", "tcsh"]).status.code(), Some(2));
}
