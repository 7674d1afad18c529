#!/usr/bin/env bash
# Packets per second through lb on a veth pair, against a floor program (swap MACs, XDP_TX) on
# the same interface in the same run. A generator namespace sends identical 64-byte UDP frames
# to the VIP with BPF_PROG_TEST_RUN's live-frame mode (examples/e2e.rs trafgen: xdp-trafficgen
# 1.3.1 from Debian does not load on this kernel); the load balancer's namespace receives them
# in native XDP. Packets processed per second are read from the veth's own XDP counters, the
# same way for both programs. Frames sent back (XDP_TX) are dropped at the generator's end,
# which has no XDP program: only the receiving side is measured. Each round measures lb twice: a
# service forwarding by L2 (UDP port 53) and one encapsulating in IPIP (port 54) to backends
# behind a "router" (the generator's address), whose frames also go back to the generator.
#
#   scripts/bench-veth.sh [SECONDS] [ROUNDS]      needs root and the release build
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/topology.sh
SECONDS_PER_RUN=${1:-3}
ROUNDS=${2:-3}
LB=target/release/lb
E2E=target/release/examples/e2e
[ -x "$LB" ] && [ -x "$E2E" ] || { echo "build first: cargo build --release --bins --examples" >&2; exit 1; }
G=lbbench-gen
L=lbbench-lb
WORK=$(mktemp -d /tmp/lb-bench.XXXXXX)
LBPID=
cleanup() {
    [ -n "$LBPID" ] && kill "$LBPID" 2>/dev/null && wait "$LBPID" 2>/dev/null
    ip netns del "$G" 2>/dev/null || true
    ip netns del "$L" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup
WORK=$(mktemp -d /tmp/lb-bench.XXXXXX)

topo_bench_pair "$G" "$L"
# Two backends on the link; their "MACs" send forwarded frames back to the generator's end.
ip -n "$L" neigh replace 10.98.0.11 lladdr "$GMAC" dev eth0 nud permanent
ip -n "$L" neigh replace 10.98.0.12 lladdr "$GMAC" dev eth0 nud permanent
# Encapsulated backends behind the generator's address.
ip -n "$L" neigh replace 10.98.0.1 lladdr "$GMAC" dev eth0 nud permanent
ip -n "$L" route add 10.97.0.0/24 via 10.98.0.1
cat >"$WORK/pool.yaml" <<YAML
services:
  - name: bench
    vip: 10.98.0.100
    port: 53
    protocol: udp
    hash: flow
    backends: [10.98.0.11, 10.98.0.12]
  - name: bench-ipip
    vip: 10.98.0.100
    port: 54
    protocol: udp
    hash: flow
    forward: ipip
    backends: [10.97.0.11, 10.97.0.12]
YAML

xdp_packets() { ip netns exec "$L" ethtool -S eth0 | awk '/rx_queue_0_xdp_packets/{print $2}'; }
measure() { # [DPORT] prints packets processed per second on the load balancer's side
    local c0 c1 t0 t1
    c0=$(xdp_packets)
    t0=$(date +%s%N)
    ip netns exec "$G" "$E2E" trafgen eth0 --dst-mac "$LMAC" --src 10.98.0.1 --dst 10.98.0.100 --dport "${1:-53}" --seconds "$SECONDS_PER_RUN" >/dev/null
    t1=$(date +%s%N)
    c1=$(xdp_packets)
    echo $(((c1 - c0) * 1000000000 / (t1 - t0)))
}

floor_runs=()
lb_runs=()
ipip_runs=()
for r in $(seq 1 "$ROUNDS"); do
    ip netns exec "$L" "$E2E" xdp-floor eth0
    floor_runs+=("$(measure)")
    ip -n "$L" link set dev eth0 xdp off

    ip netns exec "$L" "$LB" attach eth0 --config "$WORK/pool.yaml" --xdp-mode native >/dev/null 2>"$WORK/lb.log" &
    LBPID=$!
    for _ in $(seq 1 100); do grep -q "serving;" "$WORK/lb.log" && break; sleep 0.05; done
    # Alternate which goes first, so that a drift of the machine does not favour one.
    if [ $((r % 2)) = 1 ]; then
        lb_runs+=("$(measure 53)")
        ipip_runs+=("$(measure 54)")
    else
        ipip_runs+=("$(measure 54)")
        lb_runs+=("$(measure 53)")
    fi
    kill -TERM "$LBPID"
    wait "$LBPID" || true
    LBPID=
    fwd=$(grep -o "forwarded [0-9]*" "$WORK/lb.log" | awk '{print $2}')
    echo "round $r: floor ${floor_runs[-1]} pps, lb ${lb_runs[-1]} pps, lb IPIP ${ipip_runs[-1]} pps (lb forwarded $fwd packets, $(grep -o 'dropped [0-9]*' "$WORK/lb.log"))"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
f=$(median "${floor_runs[@]}")
l=$(median "${lb_runs[@]}")
e=$(median "${ipip_runs[@]}")
echo "packets per second through one veth in native XDP, 64-byte UDP frames, $ROUNDS rounds of ${SECONDS_PER_RUN}s (median):"
printf '  %-34s %12s\n' "floor (swap MACs, XDP_TX)" "$f"
printf '  %-34s %12s\n' "lb (VIP hit, L2, XDP_TX)" "$l"
printf '  %-34s %12s\n' "lb (VIP hit, IPIP, XDP_TX)" "$e"
echo "  lb / floor: $(awk -v a="$l" -v b="$f" 'BEGIN {printf "%.2f", a / b}')"
echo "  lb IPIP / floor: $(awk -v a="$e" -v b="$f" 'BEGIN {printf "%.2f", a / b}')"
