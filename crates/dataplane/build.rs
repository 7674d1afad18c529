//! Compiles the XDP data plane (crates/dataplane/src/bpf/lb.bpf.c) into a Rust skeleton in $OUT_DIR, and next to
//! it the backends' decapsulation program (crates/dataplane/src/bpf/decap.bpf.c) and the benchmarks' floor program
//! and traffic generator (crates/dataplane/src/bpf/floor.bpf.c, crates/dataplane/src/bpf/trafgen.bpf.c).
//!
//! Kept boring on purpose: the sources, the pinned CO-RE header for the target
//! architecture, and a rerun trigger for every file under crates/dataplane/src/bpf.

use std::env;
use std::ffi::OsString;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

// The same file is the library's `identity` module, where it is tested.
#[path = "src/identity.rs"]
mod identity;

/// (source, skeleton file in $OUT_DIR)
const PROGRAMS: [(&str, &str); 4] = [
    ("src/bpf/lb.bpf.c", "lb.skel.rs"),
    ("src/bpf/decap.bpf.c", "decap.skel.rs"),
    ("src/bpf/floor.bpf.c", "floor.skel.rs"),
    ("src/bpf/trafgen.bpf.c", "trafgen.skel.rs"),
];

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");

    let vmlinux_dir = manifest.join("vmlinux").join(&arch);
    if !vmlinux_dir.join("vmlinux.h").exists() {
        panic!(
            "no pinned vmlinux.h for target_arch {arch}: generate {}/vmlinux.h as vmlinux/README.md describes",
            vmlinux_dir.display()
        );
    }

    let mut include = OsString::from("-I");
    include.push(vmlinux_dir.as_os_str());
    let mut bpf_dir = OsString::from("-I");
    bpf_dir.push(manifest.join("src").join("bpf").as_os_str());

    // The upgrade test builds a second binary whose flow value has one more field.
    let layout_test = env::var_os("CARGO_FEATURE_LAYOUT_TEST").is_some();
    let mut args = vec![include.clone(), bpf_dir.clone(), OsString::from("-Wall"), OsString::from("-Werror")];
    if layout_test {
        args.push(OsString::from("-DLB_LAYOUT_TEST"));
    }
    let clang = pick_clang();
    // The headers' test (tests/headers.rs) compiles each one alone with the same clang.
    println!("cargo:rustc-env=LB_BPF_CLANG={}", clang.display());
    for (src, skel) in PROGRAMS {
        SkeletonBuilder::new()
            .source(manifest.join(src))
            .clang(&clang)
            .clang_args(args.clone())
            .build_and_generate(out_dir.join(skel))
            .unwrap_or_else(|e| panic!("building the BPF skeleton from {src} failed: {e:#}"));
    }

    // The identity of what a pinned data plane holds (lb.h's structs as compiled) and of the
    // program itself: a controller adopting a pinned data plane reuses its maps only when the
    // layout is this one, and replaces the program when it differs.
    let header = std::fs::read_to_string(manifest.join("src/bpf/lb.h")).expect("src/bpf/lb.h is readable");
    let layout = identity::layout(&header, layout_test);
    let object = std::fs::read(out_dir.join("lb.skel.rs")).expect("the skeleton was just written");
    println!("cargo:rustc-env=LB_LAYOUT_HASH={layout}");
    // For the crates that depend on this one (links = "lb_bpf"): DEP_LB_BPF_LAYOUT_HEX.
    println!("cargo:layout_hex={layout:016x}");
    println!("cargo:rustc-env=LB_PROGRAM_HASH={}", identity::fnv1a(&object));

    for entry in std::fs::read_dir(manifest.join("src").join("bpf")).expect("src/bpf exists") {
        let path = entry.expect("readable src/bpf entry").path();
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-changed={}", vmlinux_dir.join("vmlinux.h").display());
}

/// The clang that compiles the BPF programs: $LB_CLANG if set, else the newest versioned clang
/// found (clang-25 down to clang-15), else `clang` if it is 15 or later. The data plane keeps the kernel's AES
/// context for QUIC-LB as a kernel pointer in a map (crates/dataplane/src/bpf/quic.h), which the verifier knows
/// only by a BTF type tag; clang 14 (Debian 12's `clang`) does not emit those, so an older one
/// is refused here with the way out, rather than failing at load time on every machine.
fn pick_clang() -> PathBuf {
    println!("cargo:rerun-if-env-changed=LB_CLANG");
    let candidates: Vec<String> = match env::var("LB_CLANG") {
        Ok(c) => vec![c],
        Err(_) => (15..=25).rev().map(|v| format!("clang-{v}")).chain(["clang".to_string()]).collect(),
    };
    let mut too_old = Vec::new();
    for c in candidates {
        let Ok(out) = std::process::Command::new(&c).arg("--version").output() else { continue };
        let text = String::from_utf8_lossy(&out.stdout);
        let major = text
            .split("clang version ")
            .nth(1)
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.parse::<u32>().ok())
            .unwrap_or(0);
        if major >= 15 {
            return PathBuf::from(c);
        }
        too_old.push(format!("{c} is clang {major}"));
    }
    panic!(
        "no clang >= 15 found ({}): the data plane needs its BTF type tags; scripts/setup.sh installs clang-19, or set LB_CLANG",
        if too_old.is_empty() { "none at all".to_string() } else { too_old.join(", ") }
    )
}

