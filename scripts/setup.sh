#!/usr/bin/env bash
# Installs what building and testing lb needs on a Debian machine, then builds it.
# Idempotent: packages already installed are not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(clang llvm libelf-dev zlib1g-dev pkg-config make gcc iproute2 ethtool bpftool)
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The monitoring test's real Prometheus (and promtool) and headless browser, and the fleet
# test's BIRD, without the recommended packages (with them, about 165 more).
extras=(prometheus chromium curl bird2)
missing=()
for p in "${extras[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] || {
        echo "setup: no Rust toolchain; installing rustup (needs Rust >= 1.82)" >&2
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >&2
    }
    export PATH="$HOME/.cargo/bin:$PATH"
fi

cargo build --release --quiet
