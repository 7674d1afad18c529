# shellcheck shell=bash
# The demo and end-to-end topology, in network namespaces this script creates and removes:
#
#   $P-client --+                       client: 10.99.0.1, .51-.54 / fd99::1, ::51-::54
#   $P-lb ------+-- br0 (in $P-sw)      lb:     10.99.0.2 + VIP 10.99.0.100 / fd99::2 + fd99::100
#   $P-b1..bN --+                       backend i: 10.99.0.(10+i) / fd99::(10+i), VIP on lo
#
# Every namespace has one veth, eth0; its peer (p-client, p-lb, p-b1, ...) is a port of br0.
# Backends hold the VIPs on their loopback with arp_ignore=1 / arp_announce=2 and run the e2e
# server, which answers with the backend's name. Source it, then:
#   topo_up PREFIX N MODE     MODE native: XDP_PASS on the lb's bridge-side peer (without it
#                             native XDP_TX frames are dropped there) and the client's TX
#                             checksum offload off (native XDP on veth does not complete it);
#                             MODE generic needs neither
#   topo_down PREFIX          kills the servers, deletes the namespaces; safe to call twice
#   topo_add_backend PREFIX I adds backend I to a running topology
# Needs root, iproute2, ethtool, and target/release/examples/e2e (cargo build --release --examples).

TOPO_E2E=${TOPO_E2E:-target/release/examples/e2e}
TOPO_VIP4=10.99.0.100
TOPO_VIP6=fd99::100
TOPO_CLIENTS4=10.99.0.1,10.99.0.51,10.99.0.52,10.99.0.53,10.99.0.54
TOPO_CLIENTS6=fd99::1,fd99::51,fd99::52,fd99::53,fd99::54

topo_ns() { ip netns exec "$@"; }

# topo_link PREFIX NAME: a namespace PREFIX-NAME whose eth0 is a port of the bridge.
topo_link() {
    local p=$1 name=$2
    ip netns add "$p-$name"
    ip -n "$p-$name" link set lo up
    ip link add eth0 netns "$p-$name" type veth peer name "p-$name" netns "$p-sw"
    ip -n "$p-sw" link set "p-$name" master br0 up
    ip -n "$p-$name" link set eth0 up
}

topo_add_backend() {
    local p=$1 i=$2 ns="$1-b$2"
    topo_link "$p" "b$i"
    ip -n "$ns" addr add "10.99.0.$((10 + i))/24" dev eth0
    ip -n "$ns" addr add "fd99::$((10 + i))/64" dev eth0 nodad
    ip -n "$ns" addr add "$TOPO_VIP4/32" dev lo
    ip -n "$ns" addr add "$TOPO_VIP6/128" dev lo
    topo_ns "$ns" sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
        net.ipv4.conf.eth0.arp_ignore=1 net.ipv4.conf.eth0.arp_announce=2
    topo_server_start "$p" "$i"
}

# topo_server_start PREFIX I / topo_server_stop PREFIX I: backend I's server (TCP 80, 8080,
# 443; UDP 53; HTTP health on 8081, answering the status code in /tmp/PREFIX-bI.status).
topo_server_start() {
    local p=$1 i=$2
    # UDP answers must leave from the VIP they were sent to: bind UDP to the VIPs.
    # Not through topo_ns: $! must be the server's own pid (ip netns exec execs it).
    ip netns exec "$p-b$i" "$TOPO_E2E" serve "b$i" --tcp 80 --tcp 8080 --tcp 443 --udp 53 \
        --udp-address "$TOPO_VIP4" --udp-address "$TOPO_VIP6" --http 8081 --status-file "/tmp/$p-b$i.status" >/dev/null 2>&1 &
    echo $! >>"/tmp/$p.pids"
    echo $! >"/tmp/$p-b$i.pid"
}

topo_server_stop() {
    local p=$1 i=$2 pid
    if [ -f "/tmp/$p-b$i.pid" ]; then
        pid=$(cat "/tmp/$p-b$i.pid")
        kill "$pid" 2>/dev/null || true
        # Gone for good before returning: its ports refuse from now on.
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.02; done
    fi
    rm -f "/tmp/$p-b$i.pid"
}

topo_up() {
    local p=$1 n=$2 mode=$3 i
    [ -x "$TOPO_E2E" ] || { echo "topology: $TOPO_E2E is missing; cargo build --release --examples" >&2; return 1; }
    topo_down "$p"
    ip netns add "$p-sw"
    ip -n "$p-sw" link add br0 type bridge
    ip -n "$p-sw" link set br0 up
    topo_link "$p" client
    for a in ${TOPO_CLIENTS4//,/ }; do ip -n "$p-client" addr add "$a/24" dev eth0; done
    for a in ${TOPO_CLIENTS6//,/ }; do ip -n "$p-client" addr add "$a/64" dev eth0 nodad; done
    topo_link "$p" lb
    ip -n "$p-lb" addr add 10.99.0.2/24 dev eth0
    ip -n "$p-lb" addr add "$TOPO_VIP4/32" dev eth0
    ip -n "$p-lb" addr add fd99::2/64 dev eth0 nodad
    ip -n "$p-lb" addr add "$TOPO_VIP6/128" dev eth0 nodad
    for i in $(seq 1 "$n"); do topo_add_backend "$p" "$i"; done
    if [ "$mode" = native ]; then
        topo_ns "$p-sw" "$TOPO_E2E" xdp-pass p-lb
        topo_ns "$p-client" ethtool -K eth0 tx off >/dev/null
    fi
    # Wait for the servers to listen.
    for i in $(seq 1 "$n"); do
        for _ in $(seq 1 50); do
            topo_ns "$p-b$i" ss -ltn 2>/dev/null | grep -q ':80 ' && break
            sleep 0.1
        done
    done
}

topo_down() {
    local p=$1 ns
    if [ -f "/tmp/$p.pids" ]; then
        xargs -r kill <"/tmp/$p.pids" 2>/dev/null || true
        rm -f "/tmp/$p.pids"
    fi
    rm -f "/tmp/$p"-b*.pid "/tmp/$p"-b*.status
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$p-" || true); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
}
