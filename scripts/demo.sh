#!/usr/bin/env bash
# The README's first command: set up, build, and run lb end to end on the example pool, in a
# topology of network namespaces that this script creates and always removes: a client with
# 230 addresses, the load balancer, and three backends on one bridge (scripts/lib/topology.sh).
# Needs root (it uses sudo when it is not root).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
    exec sudo -E "$0" "$@"
fi
scripts/setup.sh >/dev/null
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
clients="$TOPO_CLIENTS4"
for i in $(seq 20 50) $(seq 55 99) $(seq 101 249); do clients+=",10.99.0.$i"; done

echo "== topology: client (230 addresses), lb, backends b1 b2 b3 on one bridge, in namespaces $P-*"
topo_up "$P" 3 native
for a in ${clients//,/ }; do ip -n "$P-client" addr add "$a/24" dev eth0 2>/dev/null || true; done
cp configs/pool.yaml "$WORK/pool.yaml"

echo
echo "== lb attach eth0 --config pool.yaml (a copy of configs/pool.yaml), in $P-lb"
ip netns exec "$P-lb" "$lb" attach eth0 --config "$WORK/pool.yaml" >/dev/null 2>"$WORK/lb.log" &
LBPID=$!
for _ in $(seq 1 100); do grep -q "serving;" "$WORK/lb.log" && break; sleep 0.1; done
sed 's/^/   /' "$WORK/lb.log"
grep -q "serving;" "$WORK/lb.log" || { echo "lb attach did not start" >&2; exit 1; }

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
