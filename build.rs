//! The lb binary's identity for `lb --version` and `lb_build_info`: the commit it is built from,
//! and the layout of the maps it pins, which crates/dataplane/build.rs derives from lb.h and
//! hands on (links = "lb_bpf" there, DEP_LB_BPF_LAYOUT_HEX here). The BPF programs themselves are
//! built by that crate: nothing here needs clang.

use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let layout = env::var("DEP_LB_BPF_LAYOUT_HEX").expect("lb-dataplane's build script sets layout_hex");
    println!("cargo:rustc-env=LB_LAYOUT_HEX={layout}");
    println!("cargo:rustc-env=LB_GIT_COMMIT={}", git_commit(&manifest));
}

/// The commit lb is built from, for `lb --version` and `lb_build_info`: $LB_GIT_COMMIT if set
/// (a build from a source tarball can name its commit), else git's 12-digit abbreviation of
/// HEAD, else `unknown`. Only a repository whose top is this directory counts: a source tree
/// unpacked inside another repository is not that repository's commit. The script reruns when
/// HEAD moves (its reflog, HEAD, the branch it names, packed-refs: whichever exist, so a `git
/// gc` that packs the branch is seen too); changes not yet committed are not marked.
fn git_commit(manifest: &std::path::Path) -> String {
    println!("cargo:rerun-if-env-changed=LB_GIT_COMMIT");
    if let Some(c) = env::var("LB_GIT_COMMIT").ok().filter(|c| !c.is_empty()) {
        // It goes into cargo's directives and Prometheus labels: a name, nothing more.
        assert!(
            c.len() <= 64 && c.chars().all(|ch| ch.is_ascii_alphanumeric() || ".-_".contains(ch)),
            "LB_GIT_COMMIT must be at most 64 letters, digits, '.', '-' or '_' (a commit's name); it is {c:?}"
        );
        return c;
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(manifest)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let top = git(&["rev-parse", "--show-toplevel"]).and_then(|t| std::fs::canonicalize(t).ok());
    if top.is_none() || top != std::fs::canonicalize(manifest).ok() {
        return "unknown".to_string();
    }
    let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".to_string();
    };
    // Watch only files that exist: cargo reruns on every build for a missing one. --git-path
    // answers relative to the manifest's directory (older git has no --path-format).
    let mut watched = vec!["HEAD".to_string(), "logs/HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["rev-parse", "--symbolic-full-name", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]).map(|p| manifest.join(p)) {
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    commit
}

