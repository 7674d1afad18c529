#!/usr/bin/env bash
# Installs what one purpose needs on a Debian machine, and nothing more:
#
#   scripts/setup.sh            building lb and running the demo (the default)
#   scripts/setup.sh test       that, and what the tests use: bpftool, strace, curl, Prometheus,
#                               Chromium, BIRD, etcd, fish, zsh, man; cargo-nextest when missing or
#                               older than .config/nextest.toml asks
#   scripts/setup.sh package    that, and what making and testing the Debian package needs:
#                               cargo-deb, lintian, debootstrap, systemd-container
#
# The purposes nest: test includes the build's packages, package includes the tests'. Idempotent:
# packages already installed are not fetched again. Builds nothing; the callers build what they
# need (scripts/demo.sh, scripts/test.sh, scripts/package.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

purpose=${1:-build}
case "$purpose" in
    build | demo) level=0 ;;
    test) level=1 ;;
    package) level=2 ;;
    *)
        echo "usage: scripts/setup.sh [build|test|package] (got '$purpose')" >&2
        exit 2
        ;;
esac

# install [--no-install-recommends] PACKAGES...: installs those that are missing, in one apt run.
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
    # One index refresh per run of this script: a second install call reuses it.
    if [ -z "${SETUP_APT_UPDATED:-}" ]; then
        $sudo apt-get update -qq
        SETUP_APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${opts[@]}" "${missing[@]}" >/dev/null
}

# Building and the demo: clang-19 (the data plane needs clang >= 15, build.rs; Debian 12's
# `clang` is 14), the libraries libbpf-sys links, and what the demo's topology runs (ip, ethtool,
# ps and sysctl).
# Without recommended packages: clang-19's pull in about 60 more that nothing here uses.
install --no-install-recommends clang-19 libelf-dev zlib1g-dev pkg-config make gcc libc6-dev iproute2 ethtool procps

if ((level >= 1)); then
    # The root tests read programs with bpftool and trace lb status with strace; the monitoring
    # test's real Prometheus (and promtool) and headless browser, the fleet tests' BIRD, and nft
    # for the second-chance tests' backends behind a REDIRECT; the completions test loads
    # `lb completions` into real shells, and man renders the man pages.
    install --no-install-recommends bpftool strace curl python3 prometheus chromium bird2 nftables fish zsh man-db
    # The fleet store's tests run a real etcd cluster (Debian's etcd 3.4: its JSON gateway is
    # what lb speaks) and write into it with etcdctl; openssl makes their TLS certificates.
    install --no-install-recommends etcd-server etcd-client openssl
fi

if ((level >= 2)); then
    # The package test checks the .deb with lintian, makes a fresh Debian root with debootstrap
    # and boots systemd in it with systemd-nspawn (systemd-container).
    install --no-install-recommends lintian debootstrap systemd-container
fi

if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] || {
        command -v curl >/dev/null 2>&1 || install --no-install-recommends curl ca-certificates
        echo "setup: no Rust toolchain; installing rustup (needs Rust >= 1.85)" >&2
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >&2
    }
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# The cargo-nextest version .config/nextest.toml requires, and the one installed (none: 0).
nextest_required=$(sed -n 's/^nextest-version = { required = "\(.*\)" }/\1/p' .config/nextest.toml)
nextest_have=$(cargo nextest --version 2>/dev/null | awk 'NR == 1 {print $2}')
if ((level >= 1)) && [ "$(printf '%s\n' "${nextest_have:-0}" "$nextest_required" | sort -V | head -1)" != "$nextest_required" ]; then
    # The Rust tests run under cargo-nextest (.config/nextest.toml): each in a process of its
    # own, several at once, each with its time.
    echo "setup: installing cargo-nextest (${nextest_have:+$nextest_have is older than $nextest_required; }a few minutes, once)" >&2
    cargo install --quiet --locked cargo-nextest
fi

if ((level >= 2)); then
    # scripts/package.sh builds the Debian package with cargo-deb, at the version it was written for.
    scripts/cargo-deb.sh
fi
