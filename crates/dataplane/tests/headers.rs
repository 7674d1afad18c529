//! Every header of the BPF programs stands alone: it includes what it uses, so it compiles as
//! the only line of a file, and a program (or a reader) may include it in any order. Before,
//! thirteen headers had no includes and worked only in the order lb.bpf.c gave them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// libbpf's API headers (bpf_helpers.h, ...), written where clang can find them, as
/// libbpf-cargo does for the build.
fn libbpf_headers(dir: &Path) -> PathBuf {
    let bpf = dir.join("bpf");
    std::fs::create_dir_all(&bpf).expect("a directory for libbpf's headers");
    for (name, text) in libbpf_rs::libbpf_sys::API_HEADERS.iter() {
        std::fs::write(bpf.join(name), text).expect("writing a libbpf header");
    }
    dir.to_path_buf()
}

/// clang's complaint when `header` is compiled alone, or None.
fn alone(header: &Path, include: &Path) -> Option<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bpf");
    let vmlinux = Path::new(env!("CARGO_MANIFEST_DIR")).join("vmlinux").join(std::env::consts::ARCH);
    let out = Command::new(env!("LB_BPF_CLANG"))
        .args(["-x", "c", "-target", "bpf", "-O2", "-g", "-fsyntax-only", "-Wall", "-Werror"])
        .arg("-I")
        .arg(&vmlinux)
        .arg("-I")
        .arg(include)
        .arg("-I")
        .arg(&src)
        .arg(header)
        .output()
        .expect("clang runs");
    (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).lines().take(3).collect::<Vec<_>>().join("\n"))
}

/// A file whose one line includes `name`.
fn one_line(dir: &Path, name: &str) -> PathBuf {
    let file = dir.join(format!("alone-{name}.c"));
    std::fs::write(&file, format!("#include \"{name}\"\n")).expect("writing the one-line file");
    file
}

#[test]
fn every_header_compiles_alone() {
    let tmp = std::env::temp_dir().join(format!("lb-headers-{}", std::process::id()));
    let include = libbpf_headers(&tmp.join("include"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bpf");
    let mut headers: Vec<String> = std::fs::read_dir(&src)
        .expect("src/bpf")
        .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".h"))
        .collect();
    headers.sort();
    assert!(headers.len() >= 15, "{headers:?}");
    let failed: Vec<String> =
        headers.iter().filter_map(|h| alone(&one_line(&tmp, h), &include).map(|e| format!("{h}:\n{e}"))).collect();
    // The check is not vacuous: a header that uses what it does not include fails it.
    let bare = tmp.join("bare.h");
    std::fs::write(&bare, "static __always_inline int f(void) { return count(LB_DROP_MALFORMED, XDP_DROP); }\n").expect("write");
    let caught = alone(&bare, &include).is_some();
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(failed.is_empty(), "headers that do not stand alone:\n{}", failed.join("\n"));
    assert!(caught, "a header that includes nothing was accepted");
}
