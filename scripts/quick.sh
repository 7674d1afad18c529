#!/usr/bin/env bash
# The quick loop: what to run between edits, apart from the full suite (scripts/test.sh, CI's):
#
#   scripts/quick.sh             build; every Rust test but the reload soak and the packet fuzzer
#                                (cargo nextest: unit, no-root and root tests, side by side)
#   scripts/quick.sh PART...     that, then the end-to-end tests whose names (with their
#                                arguments) contain a PART, in native mode only: the part being
#                                changed, e.g. `scripts/quick.sh reload conntrack_keeps`
#
# Under 3 minutes on this project's 2-core VM after a one-line change to the data plane
# (docs/testing.md, "The quick loop"). The soak, the fuzzer, the benchmarks, the generic-mode
# runs and the other end-to-end tests are the full suite's. Needs root (it runs itself with sudo
# when it is not root) and what `scripts/setup.sh test` installs.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
    exec sudo -E "$0" "$@"
fi
export PATH="$HOME/.cargo/bin:$PATH"
started=$(date +%s)

selected=""
if [ $# -gt 0 ]; then
    selected=$(E2E_MODES=native scripts/e2e.sh --list "$@")
    [ -n "$selected" ] || { echo "quick.sh: no end-to-end test's name contains any of: $*" >&2; exit 2; }
fi

echo "== build"
# What the selected end-to-end tests need beyond lb and its examples: the upgrade test's second
# build (which replaces target/release/lb until the build after it) and the QUIC-LB test's
# server. (The package test makes its package itself.)
if grep -q '^test_pin_' <<<"$selected"; then
    cargo build --release --features layout-test --bin lb
    cp target/release/lb target/release/lb-layout-test
fi
cargo build --release --bins --examples
if grep -q '^test_quic_' <<<"$selected"; then cargo build --release -p quic-echo; fi

echo "== Rust tests, but the reload soak and the packet fuzzer"
cargo nextest run --release --no-fail-fast -E 'not (binary(root_reload_soak) | binary(root_fuzz_packets))'

if [ -n "$selected" ]; then
    echo "== end-to-end, native mode: $*"
    E2E_MODES=native scripts/e2e.sh "$@"
fi
echo "quick.sh: passed in $(($(date +%s) - started)) s"
