//! The house's layering, checked from the source text, so that a change that breaks it fails
//! here rather than in a reviewer's memory (docs/architecture.md draws the same picture):
//! - the kernel-free core (config, table, plan, diff, report, flowhash, stats, metrics, health)
//!   never names the data plane, the balancer, the daemon or libbpf;
//! - src/dataplane/ talks to the kernel and never drives the core: no table builder, no planner,
//!   no state rebuild;
//! - the rooms' imports form no cycle.
//!
//! No root needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules of the kernel-free core.
const CORE: [&str; 9] = ["config", "table", "plan", "diff", "report", "flowhash", "stats", "metrics", "health"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "bpf") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `mod NAME;` / `pub mod NAME;` declared in a crate root.
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

/// The room a file is in: its first path component under src/ ("main" and "lib" for the roots).
fn room_of(file: &Path) -> String {
    let rel = file.strip_prefix("src").expect("under src");
    let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_string()
}

/// Code lines only: without `//` comments (doc comments name other rooms freely).
fn code(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The rooms `text` names through `prefix::ROOM`.
fn named(text: &str, prefix: &str, rooms: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices(prefix) {
        let before = text[..i].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[i + prefix.len()..];
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if rooms.contains(&name) {
            out.insert(name);
        }
    }
    out
}

struct House {
    /// (file, room, is in the library, code text)
    files: Vec<(PathBuf, String, bool, String)>,
    lib: BTreeSet<String>,
    bin: BTreeSet<String>,
}

fn house() -> House {
    let lib = declared("src/lib.rs");
    let bin = declared("src/main.rs");
    let mut paths = Vec::new();
    rust_files(Path::new("src"), &mut paths);
    let files = paths
        .into_iter()
        .map(|p| {
            let room = room_of(&p);
            let in_lib = room == "lib" || lib.contains(&room);
            let text = code(&std::fs::read_to_string(&p).expect("read"));
            (p, room, in_lib, text)
        })
        .collect();
    House { files, lib, bin }
}

/// Edges room -> room, among the library's rooms and among the binary's (lib rooms seen from the
/// binary through `lb::`).
fn edges(h: &House) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, room, in_lib, text) in &h.files {
        let mut to = if *in_lib { named(text, "crate::", &h.lib) } else { named(text, "crate::", &h.bin) };
        if !*in_lib {
            to.extend(named(text, "lb::", &h.lib).into_iter().map(|r| format!("lb::{r}")));
        }
        let from = if *in_lib { room.clone() } else { format!("bin::{room}") };
        let to: BTreeSet<String> = to
            .into_iter()
            .map(|r| if *in_lib || r.starts_with("lb::") { r.trim_start_matches("lb::").to_string() } else { format!("bin::{r}") })
            .filter(|r| *r != from)
            .collect();
        g.entry(from).or_default().extend(to);
    }
    g
}

#[test]
fn the_core_never_names_the_kernel_side() {
    let h = house();
    for (file, room, _, text) in &h.files {
        if !CORE.contains(&room.as_str()) {
            continue;
        }
        for bad in ["crate::dataplane", "crate::balancer", "libbpf", "lb::dataplane", "lb::balancer"] {
            assert!(!text.contains(bad), "{}: the kernel-free core names `{bad}`", file.display());
        }
    }
}

#[test]
fn the_data_plane_does_not_drive_the_core() {
    let h = house();
    let mut seen = 0;
    for (file, _, _, text) in h.files.iter().filter(|f| f.1 == "dataplane") {
        seen += 1;
        // Core types are data it may encode; the builders, the planner and the state's rebuild
        // are the balancer's to call.
        for bad in ["crate::table", "crate::balancer", "plan::plan(", "State::rebuild"] {
            assert!(!text.contains(bad), "{}: the data plane drives the core (`{bad}`)", file.display());
        }
    }
    assert!(seen > 1, "src/dataplane/ has its files");
}

#[test]
fn no_room_imports_in_a_circle() {
    let h = house();
    let g = edges(&h);
    // Depth-first search for a back edge; the cycle is named in the failure.
    fn visit(n: &str, g: &BTreeMap<String, BTreeSet<String>>, state: &mut BTreeMap<String, u8>, stack: &mut Vec<String>) {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                0 => visit(m, g, state, stack),
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap_or(0);
                    panic!("import cycle: {} -> {m}", stack[at..].join(" -> "));
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            visit(n, &g, &mut state, &mut Vec::new());
        }
    }
    assert!(g.len() > 10, "the rooms were found: {:?}", g.keys().collect::<Vec<_>>());
}
