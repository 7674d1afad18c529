#!/usr/bin/env bash
# Fuzzes pool files for SECONDS from SEED (tests/fuzz_pools.rs says what it generates and
# checks): structure-aware random pools and mutated fixtures through validation, every table
# builder, lb table's JSON and lb diff. A failure prints the seed and the input.
#   scripts/fuzz-pools.sh [SECONDS] [SEED]        default 60 s, seed from the clock
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
LB_FUZZ_SECONDS=${1:-60} LB_FUZZ_SEED=${2:-$(date +%s)} cargo test --release --test fuzz_pools -- --nocapture 2>&1 |
    grep -E "fuzzed pools|panicked|input [0-9]|test result" -A40
