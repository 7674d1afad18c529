#!/usr/bin/env bash
# The README's first command: set up, build, and run lb end to end on the example pool, in a
# topology of network namespaces that this script creates and always removes: a client with
# 230 addresses, the load balancer, and three backends on one bridge (scripts/lib/topology.sh).
# Needs root (it uses sudo when it is not root).
#
#   scripts/demo.sh            L2 direct server return (configs/pool.yaml)
#   scripts/demo.sh --encap    backends behind a router, reached by IPIP and GUE, each running
#                              `lb decap` (configs/pool-encap.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
    exec sudo -E "$0" "$@"
fi
scripts/setup.sh build >/dev/null
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --bins --examples 2>&1 | grep -v '^ *\(Compiling\|Finished\)' || true
# shellcheck source=scripts/lib/topology.sh
source scripts/lib/topology.sh

P=lbdemo
WORK=$(mktemp -d /tmp/lb-demo.XXXXXX)
LBPID=
cleanup() {
    [ -n "$LBPID" ] && kill "$LBPID" 2>/dev/null && wait "$LBPID" 2>/dev/null
    topo_down "$P"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

lb=target/release/lb
e2e=target/release/examples/e2e

if [ "${1:-}" = --encap ]; then
    echo "== topology: client, router, lb, and backends b1 b2 b3 each in a subnet of its own behind the router"
    echo "   (namespaces $P-*; every backend runs \`lb decap eth0 --allow-from 10.99.0.2/32 --allow-from fd99::2/128\`,"
    echo "   unwrapping only what lb sends, and holds the VIPs on its loopback)"
    topo_routed_up "$P" 3 native
    cp configs/pool-encap.yaml "$WORK/pool.yaml"
    echo
    echo "== lb attach eth0 --config pool.yaml (a copy of configs/pool-encap.yaml), in $P-lb"
    ip netns exec "$P-lb" "$lb" attach eth0 --config "$WORK/pool.yaml" --stats-interval 1 >"$WORK/stats" 2>"$WORK/lb.log" &
    LBPID=$!
    for _ in $(seq 1 100); do grep -q "serving;" "$WORK/lb.log" && break; sleep 0.1; done
    sed 's/^/   /' "$WORK/lb.log"
    grep -q "serving;" "$WORK/lb.log" || { echo "lb attach did not start" >&2; exit 1; }
    echo
    echo "== 1000 TCP connections to 10.99.0.100:80 (web: IPIP), checked against the table"
    ip netns exec "$P-client" "$e2e" probe --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 200 >"$WORK/web" 2>/dev/null
    "$e2e" check --config "$WORK/pool.yaml" --service web "$WORK/web"
    echo
    echo "== 500 UDP queries to 10.99.0.100:53 (dns: GUE to port 6080)"
    ip netns exec "$P-client" "$e2e" probe --udp --vip 10.99.0.100 --port 53 --sources "$TOPO_RCLIENTS4" --count 100 >"$WORK/dns" 2>/dev/null
    "$e2e" check --config "$WORK/pool.yaml" --service dns "$WORK/dns"
    echo
    echo "== 500 IPv6 connections to [fd99::100]:80 (web6: IPv6 in IPv6)"
    ip netns exec "$P-client" "$e2e" probe --vip fd99::100 --port 80 --sources "$TOPO_RCLIENTS6" --count 100 >"$WORK/web6" 2>/dev/null
    "$e2e" check --config "$WORK/pool.yaml" --service web6 "$WORK/web6"
    echo
    echo "== path MTU: the router's link to the client is lowered to 1280 bytes; a 2 MB download from"
    echo "   10.99.0.100:9000 (bulk: GUE over IPv6) completes only if the router's 'fragmentation needed',"
    echo "   sent to the VIP, reaches the backend; a 2 MB upload needs lb's own 'too big' answers"
    ip netns exec "$P-client" "$e2e" transfer --vip 10.99.0.100 --port 9000 --upload 2000000 | awk '{printf "   upload: %s bytes to %s in %s s\n", $2, $1, $3}'
    ip -n "$P-router" link set c0 mtu 1280
    ip netns exec "$P-client" "$e2e" transfer --vip 10.99.0.100 --port 9000 --download 2000000 | awk '{printf "   download: %s bytes from %s in %s s\n", $2, $1, $3}'
    sleep 1.2
    echo "   lb: $(grep -o 'icmp: forwarded=[0-9]*' "$WORK/stats" | tail -1) (ICMP errors sent on to their flows' backends), $(grep -o 'too_big=[0-9]*' "$WORK/stats" | tail -1) (answered)"
    echo
    echo "== stopping lb and the backends' decapsulation (SIGTERM)"
    kill -TERM "$LBPID"
    wait "$LBPID" || true
    LBPID=
    tail -1 "$WORK/lb.log" | sed 's/^/   /'
    for i in 1 2 3; do
        pid=$(ip netns pids "$P-b$i" | xargs -r ps -o pid=,comm= -p | awk '$2 == "lb" {print $1}')
        [ -n "$pid" ] && kill -TERM "$pid"
    done
    sleep 0.5
    for i in 1 2 3; do echo "   b$i: $(tail -1 "/tmp/$P-b$i.decap.log" | sed 's/^lb: //')"; done
    exit 0
fi

clients="$TOPO_CLIENTS4"
for i in $(seq 20 50) $(seq 55 99) $(seq 101 249); do clients+=",10.99.0.$i"; done

echo "== topology: client (230 addresses), lb, backends b1 b2 b3 on one bridge, in namespaces $P-*"
topo_up "$P" 3 native
for a in ${clients//,/ }; do ip -n "$P-client" addr add "$a/24" dev eth0 2>/dev/null || true; done
cp configs/pool.yaml "$WORK/pool.yaml"

echo
echo "== lb attach eth0 --config pool.yaml (a copy of configs/pool.yaml), in $P-lb"
ip netns exec "$P-lb" "$lb" attach eth0 --config "$WORK/pool.yaml" --metrics 127.0.0.1:9100 >/dev/null 2>"$WORK/lb.log" &
LBPID=$!
for _ in $(seq 1 100); do grep -q "serving;" "$WORK/lb.log" && break; sleep 0.1; done
sed 's/^/   /' "$WORK/lb.log"
grep -q "serving;" "$WORK/lb.log" || { echo "lb attach did not start" >&2; exit 1; }
echo "   status page: http://127.0.0.1:9100/ and metrics: http://127.0.0.1:9100/metrics, inside the namespace"
echo "   (while the demo runs: sudo ip netns exec $P-lb curl -s http://127.0.0.1:9100/metrics | grep lb_forwarded)"

echo
echo "== 2300 TCP connections to 10.99.0.100:80 (service web: ring, hash client-ip), 10 from each of 230 clients"
ip netns exec "$P-client" "$e2e" probe --vip 10.99.0.100 --port 80 --sources "$clients" --count 10 >"$WORK/before" 2>/dev/null
"$e2e" check --config "$WORK/pool.yaml" --service web "$WORK/before"
spread=$(awk '{print $1, $3}' "$WORK/before" | sort -u | awk '{n[$1]++} END {s=0; for (c in n) if (n[c] > 1) s++; print s}')
echo "  clients whose connections went to more than one backend: $spread"

echo
echo "== 630 UDP queries to 10.99.0.100:53 (service dns: maglev, hash flow)"
ip netns exec "$P-client" "$e2e" probe --udp --vip 10.99.0.100 --port 53 --sources "$TOPO_CLIENTS4" --count 126 >"$WORK/udp" 2>/dev/null
"$e2e" check --config "$WORK/pool.yaml" --service dns "$WORK/udp" --alias b1=10.99.0.11,b2=10.99.0.12,b3=10.99.0.13

echo
echo "== removing backend b2 from web: the pool file is replaced by configs/pool-b2-removed.yaml"
echo "   (lb diff predicted: $("$lb" diff configs/pool.yaml configs/pool-b2-removed.yaml | head -1))"
cp configs/pool-b2-removed.yaml "$WORK/pool.new" && mv "$WORK/pool.new" "$WORK/pool.yaml"
for _ in $(seq 1 100); do grep -q "reload (" "$WORK/lb.log" && break; sleep 0.05; done
grep "reload (" "$WORK/lb.log" | sed 's/^/   /'
ip netns exec "$P-client" "$e2e" probe --vip 10.99.0.100 --port 80 --sources "$clients" --count 10 >"$WORK/after" 2>/dev/null
echo "   the same 2300 connections again:"
"$e2e" compare "$WORK/before" "$WORK/after" --removed b2
"$e2e" check --config "$WORK/pool.yaml" --service web "$WORK/after" | tail -1

echo
echo "== stopping lb (SIGTERM)"
kill -TERM "$LBPID"
wait "$LBPID" || true
LBPID=
tail -1 "$WORK/lb.log" | sed 's/^/   /'
echo "   XDP programs left on $P-lb's eth0: $(ip -n "$P-lb" -d link show dev eth0 | grep -c prog/xdp || true)"
