#!/usr/bin/env bash
# Builds lb's Debian package: target/debian/lb_VERSION-1_ARCH.deb (the path is printed last).
# The man pages and shell completions are made by the binary itself (lb man, lb completions),
# so they say what it does. Needs what `scripts/setup.sh` installs for building lb, and installs
# cargo-deb 3.8.0 when it is missing (scripts/cargo-deb.sh). Testing the package needs more:
# `scripts/setup.sh package`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

scripts/cargo-deb.sh

cargo build --release --quiet --bin lb
target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
lb="$target/release/lb"
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
