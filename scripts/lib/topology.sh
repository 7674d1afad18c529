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
#                             MODE generic needs neither. TOPO_LB_QUEUES gives the lb's link
#                             that many queues each way (default 1)
#   topo_down PREFIX          kills the servers, deletes the namespaces; safe to call twice
#   topo_add_backend PREFIX I adds backend I to a running topology
# Needs root, iproute2, ethtool, and target/release/examples/e2e (cargo build --release --examples).

TOPO_E2E=${TOPO_E2E:-target/release/examples/e2e}
TOPO_VIP4=10.99.0.100
TOPO_VIP6=fd99::100
TOPO_CLIENTS4=10.99.0.1,10.99.0.51,10.99.0.52,10.99.0.53,10.99.0.54
TOPO_CLIENTS6=fd99::1,fd99::51,fd99::52,fd99::53,fd99::54

topo_ns() { ip netns exec "$@"; }

# topo_netns NS: a new network namespace whose links skip IPv6 duplicate address detection, link-
# local addresses included: a link-local address is tentative for a second or two after its link
# comes up, and until then the kernel sends no neighbour solicitation from it, so a router just
# wired could not resolve a backend, and the first packets lb sent through it (probes through an
# IPv6 VIP at start) were lost. Real links have long settled. (nsenter, not ip netns exec, which
# remounts /sys on every call.)
topo_netns() {
    ip netns add "$1"
    nsenter --net="/run/netns/$1" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
}

# topo_bench_pair GEN LB [QUEUES]: the benchmarks' two namespaces, joined by one veth pair (eth0
# in each, with QUEUES queues each way, default 1): the generator 10.98.0.1/24; lb 10.98.0.2/24
# with the VIP 10.98.0.100/32. Sets GMAC and LMAC to the two ends' addresses.
topo_bench_pair() {
    local g=$1 l=$2 q=${3:-1} ns
    topo_netns "$g"
    topo_netns "$l"
    ip link add eth0 netns "$g" numtxqueues "$q" numrxqueues "$q" type veth peer name eth0 netns "$l" numtxqueues "$q" numrxqueues "$q"
    for ns in "$g" "$l"; do ip -n "$ns" link set lo up; ip -n "$ns" link set eth0 up; done
    ip -n "$g" addr add 10.98.0.1/24 dev eth0
    ip -n "$l" addr add 10.98.0.2/24 dev eth0
    ip -n "$l" addr add 10.98.0.100/32 dev eth0
    GMAC=$(ip -n "$g" link show eth0 | awk '/ether/{print $2}')
    LMAC=$(ip -n "$l" link show eth0 | awk '/ether/{print $2}')
}

# topo_link PREFIX NAME [QUEUES]: a namespace PREFIX-NAME whose eth0 is a port of the bridge,
# with QUEUES queues each way on both ends (default 1).
topo_link() {
    local p=$1 name=$2 q=${3:-1}
    topo_netns "$p-$name"
    ip -n "$p-$name" link set lo up
    ip link add eth0 netns "$p-$name" numtxqueues "$q" numrxqueues "$q" type veth peer name "p-$name" netns "$p-sw" numtxqueues "$q" numrxqueues "$q"
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

# topo_kill PREFIX PID: SIGTERM to PID if it runs in one of PREFIX's namespaces: a pid a test
# recorded may have ended and been given to another test's process since.
topo_kill() {
    case "$(ip netns identify "$2" 2>/dev/null)" in
        "$1"-*) kill "$2" 2>/dev/null || true ;;
    esac
}

topo_server_stop() {
    local p=$1 i=$2 pid
    if [ -f "/tmp/$p-b$i.pid" ]; then
        pid=$(cat "/tmp/$p-b$i.pid")
        topo_kill "$p" "$pid"
        # Gone for good before returning: its ports refuse from now on.
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.02; done
    fi
    rm -f "/tmp/$p-b$i.pid"
}

topo_up() {
    local p=$1 n=$2 mode=$3 i
    [ -x "$TOPO_E2E" ] || { echo "topology: $TOPO_E2E is missing; cargo build --release --examples" >&2; return 1; }
    topo_down "$p"
    topo_netns "$p-sw"
    ip -n "$p-sw" link add br0 type bridge
    ip -n "$p-sw" link set br0 up
    topo_link "$p" client
    for a in ${TOPO_CLIENTS4//,/ }; do ip -n "$p-client" addr add "$a/24" dev eth0; done
    for a in ${TOPO_CLIENTS6//,/ }; do ip -n "$p-client" addr add "$a/64" dev eth0 nodad; done
    topo_link "$p" lb "${TOPO_LB_QUEUES:-1}"
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
        # Only those still in this topology's namespaces: a process that ended long ago (a
        # server or decap a test stopped) left its pid here, which may belong to another test's
        # process by now (pid_max can be as low as 32768, and a full run starts many more).
        local pid
        while read -r pid; do topo_kill "$p" "$pid"; done <"/tmp/$p.pids"
        rm -f "/tmp/$p.pids"
    fi
    rm -f "/tmp/$p"-b*.pid "/tmp/$p"-b*.status "/tmp/$p"-b*.decap.log
    # The names under /run/netns, not `ip netns list`: that asks the kernel about every namespace
    # and complains of those another test is deleting at the same moment.
    for ns in /run/netns/"$p"-*; do
        [ -e "$ns" ] || continue
        ns=${ns##*/}
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
}

# ---- the routed topology: backends in subnets of their own, behind a router ----
#
#   $P-client  eth0 10.98.0.2,.51-.54 / fd98::2,::51-::54 ---- c0 10.98.0.1 / fd98::1
#   $P-lb      eth0 10.99.0.2 / fd99::2, VIPs on lo ---------- l0 10.99.0.1 / fd99::1   $P-router
#   $P-bI      eth0 10.97.I.2 / fd97:I::2, VIPs on lo -------- bI 10.97.I.1 / fd97:I::1
#
# The router sends the VIPs to the load balancer (static routes; the fleet tests announce them
# by BGP instead); the load balancer reaches backends through the router, encapsulated, from its
# eth0 addresses (lb's default outer source); each backend runs `lb decap eth0`, unwrapping only
# what comes from those (TOPO_RLB_SOURCES), and answers clients directly through the router.
#   topo_routed_up PREFIX N MODE   MODE as for topo_up (native: XDP_PASS on the router's l0,
#                                   client TX checksum offload off)
#   topo_down PREFIX               as for topo_up
TOPO_LB=${TOPO_LB:-target/release/lb}
TOPO_RCLIENTS4=10.98.0.2,10.98.0.51,10.98.0.52,10.98.0.53,10.98.0.54
TOPO_RCLIENTS6=fd98::2,fd98::51,fd98::52,fd98::53,fd98::54
# The load balancer's encapsulation sources in the routed topology: the backends' allow-list.
TOPO_RLB_SOURCES="10.99.0.2/32 fd99::2/128"

# topo_wire NS_A DEV_A NS_B DEV_B: a veth pair between two namespaces, both ends up.
topo_wire() {
    ip link add "$2" netns "$1" type veth peer name "$4" netns "$3"
    ip -n "$1" link set "$2" up
    ip -n "$3" link set "$4" up
}

# topo_routed_decap PREFIX I MODE: routed backend I as scripts/backend-setup.sh prepares one:
# VIPs on lo, ARP and reverse-path settings, then `lb decap eth0` in the foreground (here in the
# background, its log in /tmp/PREFIX-bI.decap.log), trusting only the load balancer's
# encapsulation sources. TOPO_DECAP_ALLOW and TOPO_DECAP_ARGS change both (the second-chance
# topology's backends also trust each other and pass --second-chance). Run again to restart a
# stopped decap.
topo_routed_decap() { # PREFIX I MODE
    local p=$1 i=$2 mode=$3 ns="$1-b$2" allow=() s
    for s in ${TOPO_DECAP_ALLOW:-$TOPO_RLB_SOURCES}; do allow+=(--allow-from "$s"); done
    # shellcheck disable=SC2086 # TOPO_DECAP_ARGS is a list of flags
    LB="$TOPO_LB" ip netns exec "$ns" scripts/backend-setup.sh --vip "$TOPO_VIP4" --vip "$TOPO_VIP6" --iface eth0 lb \
        "${allow[@]}" --xdp-mode "$mode" ${TOPO_DECAP_ARGS:-} >"/tmp/$p-b$i.decap.log" 2>&1 &
    disown $!
    echo $! >>"/tmp/$p.pids"
    echo $! >"/tmp/$p-b$i.decap.pid"
}

topo_routed_backend() { # PREFIX I MODE
    local p=$1 i=$2 mode=$3 ns="$1-b$2"
    topo_netns "$ns"
    ip -n "$ns" link set lo up
    topo_wire "$p-router" "b$i" "$ns" eth0
    ip -n "$p-router" addr add "10.97.$i.1/24" dev "b$i"
    ip -n "$p-router" addr add "fd97:$i::1/64" dev "b$i" nodad
    ip -n "$ns" addr add "10.97.$i.2/24" dev eth0
    ip -n "$ns" addr add "fd97:$i::2/64" dev eth0 nodad
    ip -n "$ns" route add default via "10.97.$i.1"
    ip -n "$ns" -6 route add default via "fd97:$i::1"
    topo_routed_decap "$p" "$i" "$mode"
    # The server binds UDP to the VIPs: wait until the script has added them.
    for _ in $(seq 1 50); do
        ip -n "$ns" addr show dev lo | grep -q "$TOPO_VIP6" && break
        sleep 0.05
    done
    ip netns exec "$ns" "$TOPO_E2E" serve "b$i" --tcp 80 --tcp 8080 --tcp 443 --udp 53 --bulk 9000 \
        --udp-address "$TOPO_VIP4" --udp-address "$TOPO_VIP6" --http 8081 --status-file "/tmp/$p-b$i.status" >/dev/null 2>&1 &
    echo $! >>"/tmp/$p.pids"
    echo $! >"/tmp/$p-b$i.pid"
}

topo_routed_up() { # PREFIX N MODE
    local p=$1 n=$2 mode=$3 i a
    [ -x "$TOPO_E2E" ] && [ -x "$TOPO_LB" ] || { echo "topology: build first (cargo build --release --bins --examples)" >&2; return 1; }
    topo_down "$p"
    for a in client router lb; do
        topo_netns "$p-$a"
        ip -n "$p-$a" link set lo up
    done
    topo_ns "$p-router" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
        net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
    topo_wire "$p-client" eth0 "$p-router" c0
    ip -n "$p-router" addr add 10.98.0.1/24 dev c0
    ip -n "$p-router" addr add fd98::1/64 dev c0 nodad
    for a in ${TOPO_RCLIENTS4//,/ }; do ip -n "$p-client" addr add "$a/24" dev eth0; done
    for a in ${TOPO_RCLIENTS6//,/ }; do ip -n "$p-client" addr add "$a/64" dev eth0 nodad; done
    ip -n "$p-client" route add default via 10.98.0.1
    ip -n "$p-client" -6 route add default via fd98::1
    topo_wire "$p-lb" eth0 "$p-router" l0
    ip -n "$p-router" addr add 10.99.0.1/24 dev l0
    ip -n "$p-router" addr add fd99::1/64 dev l0 nodad
    ip -n "$p-lb" addr add 10.99.0.2/24 dev eth0
    ip -n "$p-lb" addr add fd99::2/64 dev eth0 nodad
    ip -n "$p-lb" addr add "$TOPO_VIP4/32" dev lo
    ip -n "$p-lb" addr add "$TOPO_VIP6/128" dev lo
    ip -n "$p-lb" route add default via 10.99.0.1
    ip -n "$p-lb" -6 route add default via fd99::1
    ip -n "$p-router" route add "$TOPO_VIP4/32" via 10.99.0.2
    ip -n "$p-router" -6 route add "$TOPO_VIP6/128" via fd99::2
    for i in $(seq 1 "$n"); do topo_routed_backend "$p" "$i" "$mode"; done
    if [ "$mode" = native ]; then
        topo_ns "$p-router" "$TOPO_E2E" xdp-pass l0
        topo_ns "$p-client" ethtool -K eth0 tx off >/dev/null
    else
        # Generic XDP runs after the stack has built (and merged) socket buffers: a client's
        # 64 KB TSO segment would reach lb as one packet. Frames as on a wire: segment first.
        topo_ns "$p-router" ethtool -K l0 tso off gso off >/dev/null
    fi
    topo_routed_wait "$p" "$n"
}

# Until routed backends 1..N serve (their server listens, their lb decap is attached); fails
# with the decap log of the first that does not within 5 s.
topo_routed_wait() { # PREFIX N
    local p=$1 n=$2 i
    for i in $(seq 1 "$n"); do
        for _ in $(seq 1 50); do
            topo_ns "$p-b$i" ss -ltn 2>/dev/null | grep -q ':9000 ' && grep -q serving "/tmp/$p-b$i.decap.log" && break
            sleep 0.1
        done
        grep -q serving "/tmp/$p-b$i.decap.log" || { cat "/tmp/$p-b$i.decap.log" >&2; return 1; }
    done
}

# ---- the fleet topology: two lb nodes behind a router that spreads the VIPs over them (ECMP) ----
#
#   $P-client  eth0 10.98.0.2,.51-.54 ------- c0 10.98.0.1       $P-router (BIRD, ECMP)
#                                             eth0 10.96.0.1  --+
#   $P-na      eth0 10.96.0.2, ifb0 (VIPs) ---------------------+-- br0 (in $P-sw)
#   $P-nb      eth0 10.96.0.3, ifb0 (VIPs) ---------------------+
#   $P-b1..b3  eth0 10.96.0.(10+i), VIPs on lo -----------------+
#
# Nodes forward by L2 DSR to the backends on the bridge; backends answer through the router.
# The VIPs reach the nodes only by the router's BGP-learned ECMP route (BIRD, started by the
# test). topo_fleet_up PREFIX MODE; topo_down PREFIX removes it.
# The client and the router of the fleet topologies: the bridge $P-sw, the client behind the
# router's c0, the router's eth0 on the bridge (10.96.0.1), forwarding with ECMP over the 5-tuple.
topo_ecmp_router() { # PREFIX
    local p=$1 a
    topo_netns "$p-sw"
    ip -n "$p-sw" link add br0 type bridge
    ip -n "$p-sw" link set br0 up
    topo_netns "$p-client"
    ip -n "$p-client" link set lo up
    topo_link "$p" router
    topo_wire "$p-client" eth0 "$p-router" c0
    ip -n "$p-router" addr add 10.98.0.1/24 dev c0
    ip -n "$p-router" addr add 10.96.0.1/24 dev eth0
    topo_ns "$p-router" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
        net.ipv4.fib_multipath_hash_policy=3 net.ipv4.fib_multipath_hash_fields=0x37
    for a in ${TOPO_RCLIENTS4//,/ }; do ip -n "$p-client" addr add "$a/24" dev eth0; done
    ip -n "$p-client" route add default via 10.98.0.1
}

topo_fleet_up() { # PREFIX MODE
    local p=$1 mode=$2 i a n
    [ -x "$TOPO_E2E" ] || { echo "topology: build first" >&2; return 1; }
    topo_down "$p"
    topo_ecmp_router "$p"
    for n in na nb; do
        topo_link "$p" "$n"
        ip -n "$p-$n" link add ifb0 type ifb
        ip -n "$p-$n" route add default via 10.96.0.1 2>/dev/null || true
    done
    ip -n "$p-na" addr add 10.96.0.2/24 dev eth0
    ip -n "$p-nb" addr add 10.96.0.3/24 dev eth0
    for n in na nb; do ip -n "$p-$n" route replace default via 10.96.0.1; done
    for i in 1 2 3; do
        topo_link "$p" "b$i"
        ip -n "$p-b$i" addr add "10.96.0.$((10 + i))/24" dev eth0
        ip -n "$p-b$i" route add default via 10.96.0.1
        ip -n "$p-b$i" addr add "$TOPO_VIP4/32" dev lo
        ip -n "$p-b$i" addr add "$TOPO_VIP6/128" dev lo
        topo_ns "$p-b$i" sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
            net.ipv4.conf.eth0.arp_ignore=1 net.ipv4.conf.eth0.arp_announce=2
        topo_server_start "$p" "$i"
    done
    if [ "$mode" = native ]; then
        topo_ns "$p-sw" "$TOPO_E2E" xdp-pass p-na
        topo_ns "$p-sw" "$TOPO_E2E" xdp-pass p-nb
        topo_ns "$p-client" ethtool -K eth0 tx off >/dev/null
    fi
    for i in 1 2 3; do
        for _ in $(seq 1 50); do
            topo_ns "$p-b$i" ss -ltn 2>/dev/null | grep -q ':80 ' && break
            sleep 0.1
        done
    done
}

# ---- the second-chance topology: three lb nodes behind a BIRD router (ECMP), four backends in
# subnets of their own behind the same router, each running `lb decap` ----
#
#   $P-client  eth0 10.98.0.2,.51-.54 ------------------------- c0 10.98.0.1   $P-router
#   $P-na, nb, nc  eth0 10.96.0.2, .3, .4, ifb0 -- br0 ($P-sw) -- eth0 10.96.0.1  (BIRD, ECMP
#                                                                                  over the 5-tuple)
#   $P-b1..b4  eth0 10.97.I.2, VIPs on lo -------------------- bI 10.97.I.1
#
# Unknown-unicast flooding is off on the nodes' bridge ports: a node whose link dies is a black
# hole, as on a real switch once its MAC ages out, instead of the bridge handing its frames to
# the others. The backends trust the nodes' subnet and each other's (a packet sent on by a
# backend's second chance comes from that backend); DECAP_ARGS go to lb decap (--second-chance).
# Nothing is attached to the nodes and BIRD is not started: the test does both.
#   topo_chaos_up PREFIX MODE DECAP_ARGS     MODE as for topo_up
TOPO_CHAOS_NODES="na nb nc"
topo_chaos_up() { # PREFIX MODE DECAP_ARGS
    local p=$1 mode=$2 i n a
    [ -x "$TOPO_E2E" ] && [ -x "$TOPO_LB" ] || { echo "topology: build first (cargo build --release --bins --examples)" >&2; return 1; }
    topo_down "$p"
    topo_ecmp_router "$p"
    i=2
    for n in $TOPO_CHAOS_NODES; do
        topo_link "$p" "$n"
        ip -n "$p-$n" link add ifb0 type ifb
        ip -n "$p-$n" addr add "10.96.0.$i/24" dev eth0
        ip -n "$p-$n" route replace default via 10.96.0.1
        bridge -n "$p-sw" link set dev "p-$n" flood off
        i=$((i + 1))
    done
    for i in 1 2 3 4; do
        TOPO_DECAP_ALLOW="10.96.0.0/24 10.97.0.0/16" TOPO_DECAP_ARGS="$3" topo_routed_backend "$p" "$i" "$mode"
    done
    if [ "$mode" = native ]; then
        # Native XDP_TX on veth needs a program on the peer: the nodes' bridge ports, and the
        # router's ends of the backends' links (a backend's second chance transmits there).
        for n in $TOPO_CHAOS_NODES; do topo_ns "$p-sw" "$TOPO_E2E" xdp-pass "p-$n"; done
        for i in 1 2 3 4; do topo_ns "$p-router" "$TOPO_E2E" xdp-pass "b$i"; done
        topo_ns "$p-client" ethtool -K eth0 tx off >/dev/null
    else
        topo_ns "$p-router" ethtool -K eth0 tso off gso off >/dev/null
    fi
    topo_routed_wait "$p" 4
}
