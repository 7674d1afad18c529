#!/usr/bin/env bash
# The reload soak (tests/root_reload_soak.rs says what it checks) with RELOADS files instead of
# the suite's 5000. Needs root.
#   scripts/soak-reloads.sh [RELOADS]             default 20000
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
LB_SOAK_RELOADS=${1:-20000} cargo test --release --test root_reload_soak -- --nocapture 2>&1 |
    grep -E "reload soak:|panicked|round [0-9]|test result" -A20
