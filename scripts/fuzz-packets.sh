#!/usr/bin/env bash
# Fuzzes the live XDP program with packets for SECONDS from SEED (tests/root_fuzz_packets.rs says
# what it generates and checks on every packet): valid packets of every kind, mutated, through
# BPF_PROG_TEST_RUN against a pool that uses every feature. A failure prints the seed, the
# packet number and its bytes. Needs root.
#   scripts/fuzz-packets.sh [SECONDS] [SEED]      default 60 s, seed from the clock
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
FUZZ_PACKETS_SECONDS=${1:-60} FUZZ_PACKETS_SEED=${2:-$(date +%s)} cargo test --release --test root_fuzz_packets -- --nocapture 2>&1 |
    grep -E "fuzz_packets:|panicked|seed [0-9]|test result" -A20
