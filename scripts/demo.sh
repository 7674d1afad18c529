#!/usr/bin/env bash
# The README's first command: set up, build, and show the example pool's destination tables,
# then what removing one backend would move.
# (The veth demo with real traffic arrives with the data plane.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
lb=target/release/lb

echo "== lb check --config configs/pool.yaml"
$lb check --config configs/pool.yaml
echo
echo "== lb table --config configs/pool.yaml"
$lb table --config configs/pool.yaml
echo
echo "== lb diff configs/pool.yaml configs/pool-b2-removed.yaml"
$lb diff configs/pool.yaml configs/pool-b2-removed.yaml
