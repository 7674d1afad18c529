#!/usr/bin/env bash
# The README's test command, and CI's (.ci/run): set up, build, then run every test, stopping after
# the first phase that fails:
#   1. the tests that need no root (cargo nextest);
#   2. each benchmark once, quickly;
#   3. the root tests (tests/root_*.rs: the real XDP program, lb attach in network namespaces);
#   4. the end-to-end suite (scripts/e2e.sh), whose package test installs the package's tools
#      and makes the package (scripts/package.sh --no-build) when it runs.
# Ends with how long each phase took, and each end-to-end test (the Rust tests' times are on their
# own lines, and the slowest are listed again at the end). docs/testing.md says more.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

LOGS=target/test-logs
# The phases so far, "MILLISECONDS NAME", and the one running.
PHASES=()
PHASE=
PHASE_T0=
phase() { # [NAME]: ends the phase running; starts NAME
    local now
    now=$(date +%s%N)
    [ -z "$PHASE" ] || PHASES+=("$(((now - PHASE_T0) / 1000000)) $PHASE")
    PHASE=${1:-}
    PHASE_T0=$now
    [ -z "$PHASE" ] || echo "== $PHASE"
}
report() {
    local rc=$? p ms total=0
    phase
    echo
    echo "test.sh: where the time went"
    for p in "${PHASES[@]}"; do
        ms=${p%% *}
        total=$((total + ms))
        printf '  %6d s  %s\n' $((ms / 1000)) "${p#* }"
    done
    printf '  %6d s  in all (%s)\n' $((total / 1000)) "$([ $rc -eq 0 ] && echo passed || echo "FAILED, exit $rc")"
    if [ -f "$LOGS/nextest.log" ]; then
        echo "test.sh: the slowest Rust tests"
        # awk reads all of sort's output and prints the first 12: `head` would leave sort writing
        # to a closed pipe, whose SIGPIPE (under pipefail, in this EXIT trap) made a passing
        # run exit 141.
        grep -E '^ *PASS \[' "$LOGS/nextest.log" | sed 's/^ *PASS \[ *\([0-9.]*\)s\] *([0-9/ ]*)/\1/' | sort -rn |
            awk 'NR <= 12 {printf "  %8.1f s  %s %s\n", $1, $2, $3}'
    fi
}
trap report EXIT

phase "setup: the packages the tests use (scripts/setup.sh test)"
scripts/setup.sh test
mkdir -p "$LOGS"
: >"$LOGS/nextest.log"

phase "build: lb, its tests and examples; the upgrade test's second build; the QUIC-LB test's server"
cargo build --release --bins --examples
cargo nextest run --release --no-run
cargo test --release --no-run --benches
cargo test --release --no-run -p lb-core --features quinn --lib
# The upgrade test needs a second build whose map layout differs (cargo feature layout-test),
# which replaces target/release/lb until the build after it.
cargo build --release --features layout-test --bin lb
cp target/release/lb target/release/lb-layout-test
cargo build --release --bins
# The QUIC-LB test's quinn server and client: a crate of its own (tools/quic-echo).
cargo build --release -p quic-echo
# A QUIC server needs lb's core alone, which builds without clang: tools/quic-echo again, from
# nothing, with every clang hidden (each name build.rs or a crate could call fails loudly).
# Anything on the way that reached lb-dataplane's BPF build would fail here (tests/layout.rs
# checks the dependency tree too).
noclang=target/no-clang-bin
rm -rf "$noclang" target/no-clang
mkdir -p "$noclang"
for c in clang $(seq -f 'clang-%g' 11 25); do
    printf '#!/bin/sh\necho "clang is hidden for this build" >&2\nexit 1\n' >"$noclang/$c"
    chmod +x "$noclang/$c"
done
PATH="$PWD/$noclang:$PATH" LB_CLANG="$PWD/$noclang/clang" CARGO_TARGET_DIR=target/no-clang cargo build --offline --quiet -p quic-echo
rm -rf "$noclang" target/no-clang

phase "tests that need no root (config, tables, diff, CLI, layout, docs)"
cargo nextest run --release --no-fail-fast -E 'not binary(/^root_/)' 2>&1 | tee -a "$LOGS/nextest.log"
# The QUIC-LB generator for quinn servers is behind the cargo feature quinn.
cargo test --release -p lb-core --features quinn --lib quic_lb

phase "benchmarks, each once, quickly (cargo test --benches)"
cargo test --release --benches

if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: the root tests and the end-to-end suite need root; run scripts/test.sh as root (CI does)" >&2
    exit 1
fi
phase "root tests (tests/root_*.rs: packet fixtures through BPF_PROG_TEST_RUN, lb attach in namespaces)"
cargo nextest run --release --no-fail-fast -E 'binary(/^root_/)' 2>&1 | tee -a "$LOGS/nextest.log"

phase "end-to-end: real clients, servers, routers in network namespaces (scripts/e2e.sh)"
scripts/e2e.sh
