#!/usr/bin/env bash
# Builds lb's Debian package: target/debian/lb_VERSION-1_ARCH.deb (the path is printed last).
#
#   scripts/package.sh [--no-build] [CARGO-DEB OPTIONS...]
#
# --no-build packages the lb already built in target/release as it is (the end-to-end suite's
# package test: the binary the other tests ran, not a build made beside them).
# The man pages and shell completions are made by the binary itself (lb man, lb completions),
# so they say what it does. Needs what `scripts/setup.sh` installs for building lb, and installs
# cargo-deb 3.8.0 when it is missing (scripts/cargo-deb.sh). Testing the package needs more:
# `scripts/setup.sh package`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

build=1
if [ "${1:-}" = --no-build ]; then
    build=0
    shift
fi

scripts/cargo-deb.sh

[ $build = 0 ] || cargo build --release --quiet --bin lb
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
lb="$target/release/lb"
[ -x "$lb" ] || { echo "package.sh: no $lb: build it first (cargo build --release --bin lb)" >&2; exit 1; }
assets="$target/release/deb-assets"
rm -rf "$assets"
mkdir -p "$assets/man"
"$lb" man "$assets/man" >/dev/null
gzip -9n "$assets"/man/*.1
"$lb" completions bash >"$assets/lb.bash"
"$lb" completions zsh >"$assets/_lb"
"$lb" completions fish >"$assets/lb.fish"

# The commit the binary names is the one cargo built; the package is made from that build.
cargo deb --no-build --strip --locked --quiet "$@"
