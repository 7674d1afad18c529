#!/usr/bin/env bash
# The README's test command: set up, then run every test.
# Tests that need root live in tests/root_*.rs and run as their own group; the rest run anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== tests that need no root (config, tables, diff, CLI; benches build and run once, quickly)"
cargo test --release --all-targets
