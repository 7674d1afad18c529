#!/usr/bin/env bash
# Installs what building and testing lb needs on a Debian machine, then builds it.
# Idempotent: packages already installed are not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

# install [APT OPTIONS --] PACKAGES...: installs the packages that are missing.
install() {
    local opts=() missing=() p sudo=""
    if [ "${1:-}" = --no-install-recommends ]; then
        opts+=("$1")
        shift
    fi
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${opts[@]}" "${missing[@]}" >/dev/null
}

# clang-19: the data plane needs clang >= 15 (build.rs); Debian 12's `clang` is 14.
install clang-19 llvm libelf-dev zlib1g-dev pkg-config make gcc iproute2 ethtool bpftool strace
# The monitoring test's real Prometheus (and promtool) and headless browser, and the fleet
# test's BIRD, without the recommended packages (with them, about 165 more).
install --no-install-recommends prometheus chromium curl bird2
# The completions test loads `lb completions` into real shells; man renders the man pages. The
# package test checks the .deb with lintian, makes a fresh Debian root with debootstrap and
# boots systemd in it with systemd-nspawn (systemd-container).
install --no-install-recommends fish zsh man-db lintian debootstrap systemd-container

if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] || {
        echo "setup: no Rust toolchain; installing rustup (needs Rust >= 1.85)" >&2
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >&2
    }
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# scripts/package.sh builds the Debian package with cargo-deb.
scripts/cargo-deb.sh

cargo build --release --quiet
