#!/usr/bin/env bash
# The README's test command: set up, then run every test.
# Tests that need root live in tests/root_*.rs and run as their own group; the rest run anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh package
export PATH="$HOME/.cargo/bin:$PATH"

plain=()
for t in tests/*.rs; do
    name=$(basename "$t" .rs)
    case "$name" in root_*) ;; *) plain+=(--test "$name") ;; esac
done
echo "== tests that need no root (config, tables, diff, CLI; benches build and run once, quickly)"
cargo test --release --lib --bins --benches "${plain[@]}"
# The QUIC-LB generator for quinn servers is behind the cargo feature quinn.
cargo test --release --features quinn --lib quic_lb

echo "== tests that need root (packet fixtures through BPF_PROG_TEST_RUN; lb attach in network namespaces)"
if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: the root_* tests need root; run scripts/test.sh as root (CI does)" >&2
    exit 1
fi
cargo test --release --test 'root_*'

echo "== end-to-end: real clients and servers in network namespaces, native and generic XDP"
# The upgrade test needs a second build whose map layout differs (cargo feature layout-test).
cargo build --release --features layout-test --bin lb
cp target/release/lb target/release/lb-layout-test
cargo build --release --bins --examples
# The QUIC-LB test's quinn server and client: a crate of its own (tools/quic-echo).
cargo build --release -p quic-echo
# The package test installs the Debian package this build makes (README, "Install").
scripts/package.sh
scripts/e2e.sh
