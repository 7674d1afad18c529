#!/usr/bin/env bash
# Packets per second through lb on a veth pair, against a floor program (swap MACs, XDP_TX) on
# the same interface in the same run. A generator namespace sends identical 64-byte UDP frames
# to the VIP with BPF_PROG_TEST_RUN's live-frame mode (examples/e2e/ trafgen: xdp-trafficgen
# 1.3.1 from Debian does not load on this kernel); the load balancer's namespace receives them
# in native XDP. Packets processed per second are read from the veth's own XDP counters, the
# same way for both programs. Frames sent back (XDP_TX) are dropped at the generator's end,
# which has no XDP program: only the receiving side is measured. Each round measures lb twice: a
# service forwarding by L2 (UDP port 53) and one encapsulating in IPIP (port 54) to backends
# behind a "router" (the generator's address), whose frames also go back to the generator.
#
#
# With --flows W, every packet is another TCP flow of a working set of W (the generator walks it
# round-robin; crates/dataplane/src/bpf/trafgen.bpf.c), with --new PCT percent of the packets SYNs of flows never
# seen, generated on --cpus N CPUs (a veth with N queues: the receiving side runs on as many).
# Each round then measures the floor and four lb services: L2 with connection tracking off and
# on, IPIP off and on (one lb for the L2 pair, a fresh one for the IPIP pair, so each flow table
# holds W flows); each tracked service's W flows shake hands first, so they are tracked, and
# lb is given 2.5 s to sweep its slots stable before it is measured.
#
#   scripts/bench-veth.sh [SECONDS] [ROUNDS] [--flows W] [--new PCT] [--cpus N] [--conntrack-size N]
#                                                   needs root and the release build
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/topology.sh
SECONDS_PER_RUN=3
ROUNDS=3
FLOWS=0
NEW=0
CPUS=1
CT_SIZE=()
pos=0
while [ $# -gt 0 ]; do
    case "$1" in
    --flows) FLOWS=$2; shift 2 ;;
    --new) NEW=$2; shift 2 ;;
    --cpus) CPUS=$2; shift 2 ;;
    --conntrack-size) CT_SIZE=(--conntrack-size "$2"); shift 2 ;;
    *)
        pos=$((pos + 1))
        if [ $pos = 1 ]; then SECONDS_PER_RUN=$1; else ROUNDS=$1; fi
        shift
        ;;
    esac
done
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

topo_bench_pair "$G" "$L" "$CPUS"
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
  - {name: l2-ct, vip: 10.98.0.100, port: 80, hash: flow, backends: [10.98.0.11, 10.98.0.12]}
  - {name: l2, vip: 10.98.0.100, port: 81, hash: flow, conntrack: off, backends: [10.98.0.11, 10.98.0.12]}
  - {name: ipip-ct, vip: 10.98.0.100, port: 82, hash: flow, forward: ipip, backends: [10.97.0.11, 10.97.0.12]}
  - {name: ipip, vip: 10.98.0.100, port: 83, hash: flow, forward: ipip, conntrack: off, backends: [10.97.0.11, 10.97.0.12]}
YAML
GEN=()
if [ "$FLOWS" -gt 0 ]; then
    GEN=(--flows "$FLOWS" --cpus "$(seq -s, 0 $((CPUS - 1)))")
    [ "$NEW" -gt 0 ] && GEN+=(--new-every $((100 / NEW)))
elif [ "$CPUS" -gt 1 ]; then
    GEN=(--cpus "$(seq -s, 0 $((CPUS - 1)))")
fi

xdp_packets() { ip netns exec "$L" ethtool -S eth0 | awk '/rx_queue_[0-9]*_xdp_packets/{n += $2} END {print n}'; }
measure() { # [DPORT] prints packets processed per second on the load balancer's side
    local c0 c1 t0 t1
    c0=$(xdp_packets)
    t0=$(date +%s%N)
    ip netns exec "$G" "$E2E" trafgen eth0 --dst-mac "$LMAC" --src 10.98.0.1 --dst 10.98.0.100 --dport "${1:-53}" --seconds "$SECONDS_PER_RUN" "${GEN[@]}" >/dev/null
    t1=$(date +%s%N)
    c1=$(xdp_packets)
    echo $(((c1 - c0) * 1000000000 / (t1 - t0)))
}

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
lb_start() { # LOG [ARGS]: lb attach in the load balancer's namespace, until it serves
    local log=$1
    shift
    ip netns exec "$L" "$LB" attach eth0 --config "$WORK/pool.yaml" --xdp-mode native "$@" >/dev/null 2>"$log" &
    LBPID=$!
    for _ in $(seq 1 100); do grep -q "serving;" "$log" && break; sleep 0.05; done
}
lb_stop() {
    kill -TERM "$LBPID"
    wait "$LBPID" || true
    LBPID=
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }

if [ "$FLOWS" -gt 0 ]; then
    runs_f=() runs_l2=() runs_l2ct=() runs_ip=() runs_ipct=()
    for r in $(seq 1 "$ROUNDS"); do
        ip netns exec "$L" "$E2E" xdp-floor eth0
        runs_f+=("$(measure 81)")
        ip -n "$L" link set dev eth0 xdp off
        # One lb per forwarding mode, so that each flow table holds one working set (W flows).
        for mode in l2 ipip; do
            lb_start "$WORK/lb-$mode.log" "${CT_SIZE[@]}"
            # The tracked service's working set shakes hands first.
            port=80
            [ $mode = ipip ] && port=82
            ip netns exec "$G" "$E2E" trafgen eth0 --dst-mac "$LMAC" --src 10.98.0.1 --dst 10.98.0.100 --dport $port \
                --seconds 0 --flows "$FLOWS" --warmup --cpus 0 >/dev/null
            # lb's sweep (every second) then makes the slots stable that no flow tracked
            # elsewhere hashes to, as in any service that has run a while (docs/data-plane.md,
            # "Stable slots"); until then every tracked packet takes the flow-table lookup.
            sleep 2.5
            if [ $mode = l2 ]; then
                runs_l2+=("$(measure 81)")
                runs_l2ct+=("$(measure 80)")
            else
                runs_ipct+=("$(measure 82)")
                runs_ip+=("$(measure 83)")
            fi
            lb_stop
        done
        echo "round $r: floor ${runs_f[-1]}, L2 off ${runs_l2[-1]}, L2 on ${runs_l2ct[-1]}, IPIP off ${runs_ip[-1]}, IPIP on ${runs_ipct[-1]} pps"
        for mode in l2 ipip; do
            echo "  lb ($mode): $(grep -o 'dropped [0-9]*' "$WORK/lb-$mode.log" | tail -1), conntrack$(grep -o 'conntrack hit=.*' "$WORK/lb-$mode.log" | tail -1 | sed 's/^conntrack//')"
        done
    done
    f=$(median "${runs_f[@]}")
    a=$(median "${runs_l2[@]}") b=$(median "${runs_l2ct[@]}") c=$(median "${runs_ip[@]}") d=$(median "${runs_ipct[@]}")
    echo "packets per second through one veth in native XDP: 64-byte TCP frames over $FLOWS flows, $NEW% new,"
    echo "$CPUS CPU(s); $ROUNDS rounds of ${SECONDS_PER_RUN}s (median):"
    printf '  %-28s %12s %9s %12s\n' "" "pps" "/ floor" "/ ct off"
    printf '  %-28s %12s %9s\n' "floor (swap MACs, XDP_TX)" "$f" "1.00"
    printf '  %-28s %12s %9s\n' "lb L2, conntrack off" "$a" "$(ratio "$a" "$f")"
    printf '  %-28s %12s %9s %12s\n' "lb L2, conntrack on" "$b" "$(ratio "$b" "$f")" "$(ratio "$b" "$a")"
    printf '  %-28s %12s %9s\n' "lb IPIP, conntrack off" "$c" "$(ratio "$c" "$f")"
    printf '  %-28s %12s %9s %12s\n' "lb IPIP, conntrack on" "$d" "$(ratio "$d" "$f")" "$(ratio "$d" "$c")"
    exit 0
fi

floor_runs=()
lb_runs=()
ipip_runs=()
for r in $(seq 1 "$ROUNDS"); do
    ip netns exec "$L" "$E2E" xdp-floor eth0
    floor_runs+=("$(measure)")
    ip -n "$L" link set dev eth0 xdp off

    lb_start "$WORK/lb.log"
    # Alternate which goes first, so that a drift of the machine does not favour one.
    if [ $((r % 2)) = 1 ]; then
        lb_runs+=("$(measure 53)")
        ipip_runs+=("$(measure 54)")
    else
        ipip_runs+=("$(measure 54)")
        lb_runs+=("$(measure 53)")
    fi
    lb_stop
    fwd=$(grep -o "forwarded [0-9]*" "$WORK/lb.log" | awk '{print $2}')
    echo "round $r: floor ${floor_runs[-1]} pps, lb ${lb_runs[-1]} pps, lb IPIP ${ipip_runs[-1]} pps (lb forwarded $fwd packets, $(grep -o 'dropped [0-9]*' "$WORK/lb.log"))"
done
f=$(median "${floor_runs[@]}")
l=$(median "${lb_runs[@]}")
e=$(median "${ipip_runs[@]}")
echo "packets per second through one veth in native XDP, 64-byte UDP frames, $ROUNDS rounds of ${SECONDS_PER_RUN}s (median):"
printf '  %-34s %12s\n' "floor (swap MACs, XDP_TX)" "$f"
printf '  %-34s %12s\n' "lb (VIP hit, L2, XDP_TX)" "$l"
printf '  %-34s %12s\n' "lb (VIP hit, IPIP, XDP_TX)" "$e"
echo "  lb / floor: $(awk -v a="$l" -v b="$f" 'BEGIN {printf "%.2f", a / b}')"
echo "  lb IPIP / floor: $(awk -v a="$e" -v b="$f" 'BEGIN {printf "%.2f", a / b}')"
