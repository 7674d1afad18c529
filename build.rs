//! Compiles the XDP data plane (src/bpf/lb.bpf.c) into a Rust skeleton in $OUT_DIR, and next to
//! it the backends' decapsulation program (src/bpf/decap.bpf.c) and the benchmarks' floor program
//! and traffic generator (src/bpf/floor.bpf.c, src/bpf/trafgen.bpf.c).
//!
//! Kept boring on purpose: the sources, the pinned CO-RE header for the target
//! architecture, and a rerun trigger for every file under src/bpf.

use std::env;
use std::ffi::OsString;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

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

    for (src, skel) in PROGRAMS {
        SkeletonBuilder::new()
            .source(manifest.join(src))
            .clang_args([include.clone(), bpf_dir.clone(), OsString::from("-Wall"), OsString::from("-Werror")])
            .build_and_generate(out_dir.join(skel))
            .unwrap_or_else(|e| panic!("building the BPF skeleton from {src} failed: {e:#}"));
    }

    for entry in std::fs::read_dir(manifest.join("src").join("bpf")).expect("src/bpf exists") {
        let path = entry.expect("readable src/bpf entry").path();
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-changed={}", vmlinux_dir.join("vmlinux.h").display());
}
