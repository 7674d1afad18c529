#!/usr/bin/env bash
# Restarts and upgrades of a pinned data plane, measured (docs/restarts.md):
#   - the time from a new controller's start to its first reload applied on the adopted data
#     plane, for one service of N backends (default 1000);
#   - packets lost while 64-byte frames stream in (the veth benchmark's generator, native XDP):
#     frames the generator sent minus frames lb counted (forwarded, passed or dropped), in a run
#     without a restart, a run with a restart, and a run with an upgrade to a build whose map
#     layout differs (target/release/lb-layout-test; scripts/test.sh builds it).
#
#   scripts/bench-restart.sh [BACKENDS] [ROUNDS]      needs root and the release build
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/topology.sh
N=${1:-1000}
ROUNDS=${2:-5}
LB=target/release/lb
NEXT=target/release/lb-layout-test
E2E=target/release/examples/e2e
[ -x "$LB" ] && [ -x "$E2E" ] && [ -x "$NEXT" ] || {
    echo "build first: cargo build --release --bins --examples, and lb-layout-test as scripts/test.sh does" >&2
    exit 1
}
G=lbrst-gen
L=lbrst-lb
PINS=/run/lbrst-bpf
WORK=$(mktemp -d /tmp/lb-restart.XXXXXX)
LBPID=
cleanup() {
    [ -n "$LBPID" ] && kill "$LBPID" 2>/dev/null && wait "$LBPID" 2>/dev/null
    ip netns exec "$L" "$LB" detach eth0 --pin-dir "$PINS" >/dev/null 2>&1 || true
    umount "$PINS" 2>/dev/null || true
    rmdir "$PINS" 2>/dev/null || true
    ip netns del "$G" 2>/dev/null || true
    ip netns del "$L" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

topo_bench_pair "$G" "$L"
ip -n "$L" route add 10.96.0.0/16 dev eth0
mkdir -p "$PINS"
mount -t bpf bpf "$PINS"

# N backends on the link, resolved at once (their "MAC" is the generator's end).
backends=""
for i in $(seq 1 "$N"); do
    a="10.96.$((i / 250)).$((i % 250 + 1))"
    echo "neigh replace $a lladdr $GMAC dev eth0 nud permanent"
    backends+="${backends:+, }$a"
done >"$WORK/neigh.batch"
ip -n "$L" -batch "$WORK/neigh.batch"
printf 'services:\n  - name: bench\n    vip: 10.98.0.100\n    port: 53\n    protocol: udp\n    hash: flow\n    backends: [%s]\n' "$backends" >"$WORK/pool.yaml"

start() { # BINARY: starts a pinned controller, waits until it serves
    local n
    n=$(grep -c "serving;" "$WORK/lb.log" 2>/dev/null || true)
    n=${n:-0}
    ip netns exec "$L" "$1" attach eth0 --config "$WORK/pool.yaml" --xdp-mode native --pin --pin-dir "$PINS" \
        --resolve-timeout 0.2 >/dev/null 2>>"$WORK/lb.log" &
    LBPID=$!
    for _ in $(seq 1 400); do
        [ "$(grep -c "serving;" "$WORK/lb.log" || true)" -gt "$n" ] && return 0
        sleep 0.025
    done
    cat "$WORK/lb.log" >&2
    echo "lb did not start" >&2
    exit 1
}
stop() {
    kill -TERM "$LBPID"
    wait "$LBPID" || true
    LBPID=
}
counted() { # packets lb counted: forwarded + passed + every drop
    ip netns exec "$L" "$LB" status eth0 --json --pin-dir "$PINS" |
        python3 -c 'import json,sys; s=json.load(sys.stdin)["status"]; print(s["forwarded"] + s["passed"] + sum(s["drops"].values()))'
}
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

start "$LB"
echo "== time from a new controller's start to its first reload applied on the adopted data plane ($N backends)"
took=()
applied=()
for r in $(seq 1 "$ROUNDS"); do
    stop
    start "$LB"
    line=$(grep "adopted the data plane" "$WORK/lb.log" | tail -1)
    took+=("$(grep -o '([0-9]* ms after this process started)' <<<"$line" | tr -dc 0-9)")
    applied+=("$(grep -o 'in [0-9.]* ms' <<<"$line" | tail -1 | tr -dc 0-9.)")
    echo "  round $r: ${took[-1]} ms from start (of which adopting and applying: ${applied[-1]} ms)"
done
echo "  median: $(median "${took[@]}") ms from start, $(median "${applied[@]}") ms adopting and applying"

loss() { # LABEL ACTION: 4 s of frames; ACTION runs 1 s in
    local before after sent
    before=$(counted)
    ip netns exec "$G" "$E2E" trafgen eth0 --dst-mac "$LMAC" --src 10.98.0.1 --dst 10.98.0.100 --dport 53 --seconds 4 --total >"$WORK/gen" &
    local gen=$!
    sleep 1
    $2
    wait "$gen"
    sleep 0.2
    after=$(counted)
    sent=$(awk '{print $2}' "$WORK/gen")
    printf '  %-40s sent %10s  counted %10s  lost %s\n' "$1" "$sent" "$((after - before))" "$((sent - (after - before)))"
}
nothing() { :; }
restart() { stop; start "$LB"; }
upgrade() { stop; start "$NEXT"; }
downgrade() { stop; start "$LB"; }
echo "== packets lost while 64-byte frames stream in (4 s; the change 1 s in)"
loss "no change" nothing
loss "restart (SIGTERM, new controller)" restart
loss "upgrade (a build with another layout)" upgrade
loss "back to this build" downgrade
grep "adopted the data plane" "$WORK/lb.log" | tail -2 | sed 's/^/  /'
stop
