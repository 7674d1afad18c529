//! The house's layering where the compiler cannot see it, checked from the source text and
//! cargo's dependency tree (docs/architecture.md draws the same picture). The layers are crates
//! (crates/core, crates/dataplane, this package), so the compiler already refuses an import that
//! runs back up; what is left here:
//! - the core, and a QUIC server built on it (tools/quic-echo), depend on no libbpf, nix, clap or
//!   lb-dataplane, even indirectly: they build without clang (cargo tree);
//! - the data plane talks to the kernel and never drives the core: it may use the core's types,
//!   but no table builder, no planner, no state rebuild;
//! - imports form no cycle inside a crate, neither between rooms (the top-level modules) nor
//!   between files.
//!
//! Paths are read the way the compiler reads them: `use` trees with braces are expanded
//! (`crate::{a, b::{c, d}}`), `super::` and `self::` are resolved from the file's own module,
//! and each path is resolved to the deepest module that exists. A file naming its own ancestor
//! (a submodule using its parent's types) is not an edge: that is how a module is built, the
//! parent does not import the child, it declares it. No root needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where each crate's sources are, and its name in paths ("lb" is this package's library, "bin"
/// its binary: both live under src/, told apart by src/lib.rs's `mod` lines).
const CRATES: [(&str, &str); 3] = [("crates/core/src", "lb_core"), ("crates/dataplane/src", "lb_dataplane"), ("src", "lb")];

/// The data plane's writes the balancer's mirror must know of (crates/dataplane/src/write.rs).
const MIRRORED_WRITES: [&str; 11] = [
    "execute",
    "write_backend",
    "recall",
    "quic_before",
    "quic_after",
    "remember_via",
    "remember_mac",
    "mark_unstable",
    "mark_stable",
    "finish_marks",
    "write_mark",
];

/// A module: its crate and its path in that crate.
type Module = (String, Vec<String>);

struct File {
    path: PathBuf,
    module: Module,
    /// Code without comments.
    code: String,
}

impl File {
    /// The top-level module a file belongs to (its room), crate-qualified.
    fn room(&self) -> String {
        format!("{}::{}", self.module.0, self.module.1.first().map_or("", String::as_str))
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).expect("read_dir").map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `mod NAME;` and `pub mod NAME;` declared in a crate root.
fn declared(root: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root).expect("crate root");
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("pub mod ").or_else(|| l.strip_prefix("mod "))?;
            rest.strip_suffix(';').map(str::to_string)
        })
        .collect()
}

/// Code lines only: without `//` comments (doc comments name other rooms freely).
fn code(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Reads a path tree at `s[i..]` (`a::b::{c, d::e}`), appending each full path to `out` after
/// `prefix`; returns where it ended.
fn tree(s: &[char], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut segs = prefix.to_vec();
    loop {
        while i < s.len() && s[i].is_whitespace() {
            i += 1;
        }
        if i < s.len() && s[i] == '{' {
            i += 1;
            loop {
                while i < s.len() && (s[i].is_whitespace() || s[i] == ',') {
                    i += 1;
                }
                if i >= s.len() || s[i] == '}' {
                    return i + 1;
                }
                i = tree(s, i, &segs, out);
                // Skip what follows a path inside the group (`as name`, `*`) up to `,` or `}`.
                while i < s.len() && s[i] != ',' && s[i] != '}' {
                    i += 1;
                }
            }
        }
        let start = i;
        while i < s.len() && is_ident(s[i]) {
            i += 1;
        }
        if i == start {
            break;
        }
        let seg: String = s[start..i].iter().collect();
        if seg != "self" {
            segs.push(seg);
        }
        if s.get(i) == Some(&':') && s.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            break;
        }
    }
    out.push(segs);
    i
}

/// Every path in `code` that starts at `crate::`, `super::`, `self::` or a crate of the house,
/// expanded.
fn paths(code: &str) -> Vec<Vec<String>> {
    let s: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let at_word = i == 0 || !(is_ident(s[i - 1]) || s[i - 1] == ':');
        if at_word {
            for start in ["crate::", "super::", "self::", "lb::", "lb_core::", "lb_dataplane::"] {
                let w: Vec<char> = start.chars().collect();
                if s[i..].starts_with(&w) {
                    i = tree(&s, i, &[], &mut out);
                    break;
                }
            }
        }
        i += 1;
    }
    out
}

struct House {
    files: Vec<File>,
    modules: BTreeSet<Module>,
}

impl House {
    fn read() -> House {
        let lib = declared("src/lib.rs");
        let mut files = Vec::new();
        for (dir, krate) in CRATES {
            let mut list = Vec::new();
            rust_files(Path::new(dir), &mut list);
            for path in list {
                let rel = path.strip_prefix(dir).expect("under its crate");
                if rel.starts_with("bpf") {
                    continue;
                }
                let mut segs: Vec<String> = rel.iter().map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
                if segs.last().is_some_and(|s| s == "mod" || s == "lib" || s == "main") {
                    segs.pop();
                }
                let in_lib = rel == Path::new("lib.rs") || segs.first().is_some_and(|r| lib.contains(r));
                let krate = if krate == "lb" && !in_lib { "bin" } else { krate };
                let code = code(&std::fs::read_to_string(&path).expect("read"));
                files.push(File { path, module: (krate.to_string(), segs), code });
            }
        }
        let modules = files.iter().map(|f| f.module.clone()).collect();
        House { files, modules }
    }

    /// The module a path names, from `file`: the deepest existing module along it. `lb::NAME`
    /// is followed through lib.rs's re-exports to the crate that defines NAME.
    fn resolve(&self, file: &File, path: &[String]) -> Option<Module> {
        let (mut krate, mut base) = (file.module.0.clone(), file.module.1.clone());
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &rest[1..];
            }
            Some(name @ ("lb" | "lb_core" | "lb_dataplane")) => {
                krate = name.to_string();
                base.clear();
                rest = &rest[1..];
                if name == "lb" && rest.first().is_some_and(|s| s == "dataplane") {
                    krate = "lb_dataplane".to_string();
                    rest = &rest[1..];
                } else if name == "lb" && rest.first().is_some_and(|s| self.modules.contains(&("lb_core".to_string(), vec![s.clone()]))) {
                    krate = "lb_core".to_string();
                }
            }
            _ => {}
        }
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
        let mut full = base;
        full.extend(rest.iter().cloned());
        (0..=full.len()).rev().map(|n| (krate.clone(), full[..n].to_vec())).find(|m| self.modules.contains(m))
    }

    /// The modules each file imports, without itself, its ancestors and the crate roots.
    fn edges(&self, file: &File) -> BTreeSet<Module> {
        paths(&file.code)
            .iter()
            .filter_map(|p| self.resolve(file, p))
            .filter(|m| !m.1.is_empty() || m.0 != file.module.0)
            .filter(|m| !(m.0 == file.module.0 && file.module.1.starts_with(&m.1)))
            .collect()
    }
}

fn name(m: &Module) -> String {
    format!("{}::{}", m.0, m.1.join("::"))
}

/// The first cycle of a graph, as its nodes in order.
fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(n: &str, g: &BTreeMap<String, BTreeSet<String>>, state: &mut BTreeMap<String, u8>, stack: &mut Vec<String>) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                0 => {
                    if let Some(c) = visit(m, g, state, stack) {
                        return Some(c);
                    }
                }
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut c = stack[at..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// Every rule, as the list of what breaks it (empty: the house holds).
fn violations(h: &House) -> Vec<String> {
    let mut bad = Vec::new();
    let mut files_graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut rooms_graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &h.files {
        let edges = h.edges(f);
        let room = f.room();
        // The data plane's writes that the balancer's mirror must know of are public only
        // because the balancer is another crate: the binary calls them through it, never directly.
        if f.module.0 == "bin" {
            for w in MIRRORED_WRITES {
                if f.code.contains(&format!(".{w}(")) {
                    bad.push(format!("{}: calls the data plane's `{w}` around the balancer", f.path.display()));
                }
            }
        }
        if f.module.0 == "lb_dataplane" {
            for m in edges.iter().filter(|m| m.0 == "lb_core" && m.1.first().is_some_and(|r| r == "table")) {
                bad.push(format!("{}: the data plane imports {}", f.path.display(), name(m)));
            }
            // The planner and the state's rebuild are the balancer's to call, by any name.
            for call in ["plan", "rebuild"] {
                let s: Vec<char> = f.code.chars().collect();
                let w: Vec<char> = call.chars().collect();
                let calls = (0..s.len()).any(|i| {
                    s[i..].starts_with(&w)
                        && (i == 0 || !is_ident(s[i - 1]))
                        && s[i + w.len()..].iter().find(|c| !c.is_whitespace()) == Some(&'(')
                });
                if calls {
                    bad.push(format!("{}: the data plane calls `{call}(`", f.path.display()));
                }
            }
        }
        // Only edges inside a crate can close a circle: the crates' own imports are a tree.
        let inside: Vec<&Module> = edges.iter().filter(|m| m.0 == f.module.0 && !m.1.is_empty()).collect();
        files_graph.entry(name(&f.module)).or_default().extend(inside.iter().map(|m| name(m)));
        let to_rooms: Vec<String> = inside.iter().map(|m| format!("{}::{}", m.0, m.1[0])).filter(|r| *r != room).collect();
        rooms_graph.entry(room).or_default().extend(to_rooms);
    }
    if let Some(c) = cycle(&rooms_graph) {
        bad.push(format!("the rooms import in a circle: {}", c.join(" -> ")));
    }
    if let Some(c) = cycle(&files_graph) {
        bad.push(format!("the files import in a circle: {}", c.join(" -> ")));
    }
    bad
}

#[test]
fn the_house_keeps_its_layers_and_has_no_import_cycle() {
    let h = House::read();
    assert!(h.files.len() > 30, "the source files were found");
    assert!(h.modules.contains(&("lb_dataplane".to_string(), vec!["write".to_string()])));
    assert!(h.modules.contains(&("lb_core".to_string(), vec!["plan".to_string(), "steps".to_string()])));
    assert!(h.modules.contains(&("lb".to_string(), vec!["balancer".to_string()])));
    assert!(h.modules.contains(&("bin".to_string(), vec!["daemon".to_string(), "serve".to_string()])));
    let bad = violations(&h);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn use_trees_are_read_as_the_compiler_reads_them() {
    let got = paths("use crate::{dataplane, plan::{self, State as S}};\nlet x = super::super::a::B::new(); lb::config::load(p); my_crate::x();");
    let want: Vec<Vec<&str>> = vec![
        vec!["crate", "dataplane"],
        vec!["crate", "plan"],
        vec!["crate", "plan", "State"],
        vec!["super", "super", "a", "B", "new"],
        vec!["lb", "config", "load"],
    ];
    let got: Vec<Vec<&str>> = got.iter().map(|p| p.iter().map(String::as_str).collect()).collect();
    assert_eq!(got, want);
}

/// Each rule fails when broken: the house with one file changed the way a careless change would.
#[test]
fn each_rule_catches_its_breach() {
    let cases: [(&str, &str, &str); 7] = [
        ("src/daemon/state.rs", "fn f(d: &mut D) { d.dp.write_backend(1, a, true, true); }", "calls the data plane's `write_backend` around the balancer"),
        ("crates/dataplane/src/write.rs", "use lb_core::{plan, table};", "the data plane imports lb_core::table"),
        ("crates/dataplane/src/write.rs", "fn f(l: &L) { S::rebuild(l); }", "the data plane calls `rebuild(`"),
        ("crates/dataplane/src/quic.rs", "fn f(p: &P) { let _ = plan(p); }", "the data plane calls `plan(`"),
        ("crates/core/src/config/mod.rs", "use crate::table::bounded;", "the rooms import in a circle"),
        ("src/settings.rs", "use crate::{daemon};", "the rooms import in a circle"),
        ("src/daemon/health.rs", "use super::reload::Reloader;", "the files import in a circle"),
    ];
    for (file, line, expected) in cases {
        let mut h = House::read();
        let f = h.files.iter_mut().find(|f| f.path == Path::new(file)).expect("the file exists");
        f.code.push('\n');
        f.code.push_str(line);
        let bad = violations(&h);
        assert!(bad.iter().any(|b| b.contains(expected)), "`{line}` in {file}: expected `{expected}`, got {bad:?}");
    }
}

/// The crates that the core, and a QUIC server built on it, must not pull in, even indirectly:
/// libbpf (and with it clang, through lb-dataplane's build script), nix and clap.
const NOT_IN_THE_CORE: [&str; 6] = ["lb-dataplane", "libbpf-rs", "libbpf-sys", "libbpf-cargo", "nix", "clap"];

/// What `package` depends on, normal and build dependencies, transitively: cargo tree's lines,
/// one package each (`name vX.Y.Z ...`), as Cargo.lock pins them. Without the network first;
/// where a crate of the tree was never downloaded (a fresh clone that built no QUIC tool), with.
fn dependency_tree(package: &str) -> String {
    let tree = |offline: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO"));
        cmd.args(["tree", "--locked", "-e", "normal,build", "--prefix", "none", "-p", package]);
        if offline {
            cmd.arg("--offline");
        }
        cmd.output().expect("cargo tree runs")
    };
    let mut out = tree(true);
    if !out.status.success() {
        out = tree(false);
    }
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The forbidden crates in a tree of cargo tree's lines.
fn forbidden(tree: &str) -> Vec<String> {
    let names: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    NOT_IN_THE_CORE.iter().filter(|n| names.contains(**n)).map(|n| n.to_string()).collect()
}

/// The core builds without clang, libbpf or root, and so does a QUIC server that uses its
/// connection-ID generator: neither reaches lb-dataplane, whose build script runs clang.
/// (scripts/test.sh also builds tools/quic-echo with every clang hidden, which shows the same
/// by doing it.)
#[test]
fn the_core_and_a_quic_server_on_it_need_no_libbpf_nix_or_clap() {
    let core = dependency_tree("lb-core");
    assert!(core.lines().any(|l| l.starts_with("aes ")), "lb-core's tree was read: {core}");
    assert_eq!(forbidden(&core), Vec::<String>::new(), "lb-core depends on these");
    // The tool has a command line of its own (clap); what matters for it is the kernel side.
    let tool = dependency_tree("quic-echo");
    assert!(tool.lines().any(|l| l.starts_with("lb-core ")), "quic-echo's tree was read: {tool}");
    let bad: Vec<String> = forbidden(&tool).into_iter().filter(|n| n.starts_with("lb") || n.starts_with("libbpf")).collect();
    assert!(bad.is_empty(), "quic-echo depends on {bad:?}");
    // The rule is not vacuous: the binary's own tree has every one of them.
    assert_eq!(forbidden(&dependency_tree("lb")).len(), NOT_IN_THE_CORE.len());
}

/// The longest a function may be, in lines, signature to closing brace: past it, a function is
/// doing several things that want names of their own.
const LONGEST_FUNCTION: usize = 120;

/// Functions of `text` longer than `limit` lines: (first line, length, signature). A Rust `fn`
/// or a C function definition at any indent runs to the first line that closes it at that
/// indent (`}` alone, as rustfmt and the kernel's style leave it).
fn long_functions(text: &str, limit: usize, c_source: bool) -> Vec<(usize, usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let body = l.trim_start();
        let indent = &l[..l.len() - body.len()];
        // Rust: `fn` after any of pub/pub(..)/const/async/unsafe/extern "C".
        let words: Vec<&str> = body.split_whitespace().take_while(|w| *w != "fn").collect();
        let rust = !c_source
            && body.split_whitespace().nth(words.len()) == Some("fn")
            && words.iter().all(|w| w.starts_with("pub") || ["const", "async", "unsafe", "extern", "\"C\""].contains(w));
        // C: a definition at the left edge, the signature on this line, the body after it.
        let c = c_source
            && indent.is_empty()
            && body.starts_with(|ch: char| ch.is_ascii_alphabetic() || ch == '_')
            && (body.contains('(') || body.starts_with("SEC("))
            && !["struct ", "enum ", "union ", "typedef ", "return ", "if ", "for ", "while "].iter().any(|k| body.starts_with(k));
        // A declaration (`fn f();`, a prototype) has no body to measure.
        if !(rust || c) || body.trim_end().ends_with(';') {
            continue;
        }
        // A body on one line (`fn f() -> u32 { 1 }`) is one line long.
        if body.contains('{') && body.trim_end().ends_with('}') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = lines[i + 1..].iter().position(|m| *m == close) {
            let len = end + 2;
            if len > limit {
                out.push((i + 1, len, body.chars().take(70).collect()));
            }
        }
    }
    out
}

/// No function of lb itself (the crates' and the binary's sources, tools/ and the BPF programs)
/// is longer than LONGEST_FUNCTION lines. Tests, benchmarks and the end-to-end harness are
/// scripts of steps and are not held to it.
#[test]
fn no_function_is_longer_than_120_lines() {
    let mut files = Vec::new();
    for dir in ["src", "crates/core/src", "crates/dataplane/src", "tools/quic-echo/src"] {
        rust_files(Path::new(dir), &mut files);
    }
    files.extend(["build.rs", "crates/dataplane/build.rs"].map(PathBuf::from));
    let mut bpf: Vec<PathBuf> = std::fs::read_dir("crates/dataplane/src/bpf")
        .expect("the BPF sources")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "c" || x == "h"))
        .collect();
    bpf.sort();
    assert!(bpf.len() > 10 && files.len() > 80, "the sources were found");
    files.extend(bpf);
    let mut long = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        let c_source = f.extension().is_some_and(|x| x == "c" || x == "h");
        for (line, len, sig) in long_functions(&text, LONGEST_FUNCTION, c_source) {
            long.push(format!("{}:{line}: {len} lines: {sig}", f.display()));
        }
    }
    assert!(long.is_empty(), "functions over {LONGEST_FUNCTION} lines:\n{}", long.join("\n"));
    // The measure sees a long function of either language.
    let body = "    x += 1;\n".repeat(LONGEST_FUNCTION);
    assert_eq!(long_functions(&format!("pub fn f() {{\n{body}}}\n"), LONGEST_FUNCTION, false).len(), 1);
    assert_eq!(long_functions(&format!("    fn g() {{\n{body}    }}\n"), LONGEST_FUNCTION, false).len(), 1);
    assert_eq!(long_functions(&format!("static __always_inline int h(void)\n{{\n{}}}\n", "\tx++;\n".repeat(LONGEST_FUNCTION)), LONGEST_FUNCTION, true).len(), 1);
    assert_eq!(long_functions(&format!("pub async fn g() {{\n{body}}}\n"), LONGEST_FUNCTION, false).len(), 1);
    assert_eq!(long_functions(&format!("pub(crate) unsafe fn g() {{\n{body}}}\n"), LONGEST_FUNCTION, false).len(), 1);
    assert_eq!(long_functions(&format!("__u32 h(void)\n{{\n{}}}\n", "\tx++;\n".repeat(LONGEST_FUNCTION)), LONGEST_FUNCTION, true).len(), 1);
    assert!(long_functions(&format!("fn short() {{\n{}}}\n", "    x += 1;\n".repeat(10)), LONGEST_FUNCTION, false).is_empty());
    assert!(long_functions(&format!("    fn one() -> u32 {{ 1 }}\n{body}    }}\n"), LONGEST_FUNCTION, false).is_empty(), "a one-line body");
}
