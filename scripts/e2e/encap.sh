# shellcheck shell=bash
# Encapsulation (ipip, gue): backends behind a router (scripts/lib/topology.sh, topo_routed_up)
# or on the link, each running lb decap.

# The routed pool: FORWARD for the web services, BACKENDS by number, CONNTRACK for web.
routed_pool() { # FILE FORWARD [BACKENDS] [CONNTRACK]
    local web="" web6="" i
    for i in ${3:-1 2 3}; do
        web+="${web:+, }{address: 10.97.$i.2, name: b$i}"
        web6+="${web6:+, }{address: 'fd97:$i::2', name: b$i}"
    done
    write_atomic "$1" <<EOF
services:
  - name: web
    vip: 10.99.0.100
    port: 80
    hash: flow
    forward: $2
    conntrack: ${4:-off}
    backends: [$web]
  - name: dns
    vip: 10.99.0.100
    port: 53
    protocol: udp
    hash: flow
    forward: $2
    conntrack: off
    backends: [$web]
  - name: web6
    vip: fd99::100
    port: 80
    hash: flow
    forward: $2
    conntrack: off
    backends: [$web6]
  - name: mixed
    vip: 10.99.0.100
    port: 443
    hash: flow
    forward: gue
    conntrack: off
    backends: [$web6]
  - name: bulk
    vip: 10.99.0.100
    port: 9000
    forward: $2
    backends: [$web]
  - name: bulk6
    vip: fd99::100
    port: 9000
    forward: $2
    backends: [$web6]
EOF
}

# The routed topology with BACKENDS backends and the routed pool forwarding by FORWARD.
setup_routed() { # MODE FORWARD [BACKENDS]
    begin_test lbr teardown
    topo_routed_up "$PREFIX" "${3:-3}" "$1" || fail "routed topology"
    routed_pool "$WORK/pool.yaml" "$2"
}

test_encap_tcp_udp_ipv4_ipv6_through_a_router() { # MODE FORWARD
    setup_routed "$1" "$2"
    start_lb "$1"
    probe "$WORK/tcp" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 120 || fail "TCP over $2"
    check web "$WORK/tcp"
    probe "$WORK/udp" --udp --vip 10.99.0.100 --port 53 --sources "$TOPO_RCLIENTS4" --count 60 || fail "UDP over $2"
    check dns "$WORK/udp"
    probe "$WORK/v6" --vip fd99::100 --port 80 --sources "$TOPO_RCLIENTS6" --count 60 || fail "IPv6 over $2"
    check web6 "$WORK/v6"
    probe "$WORK/mixed" --vip 10.99.0.100 --port 443 --sources "$TOPO_RCLIENTS4" --count 60 || fail "IPv4 in IPv6 (GUE)"
    check mixed "$WORK/mixed"
    grep -q "via 10.99.0.1, MAC" "$WORK/lb.log" || fail "backends not reached via the router"
    say "$2: 600 TCP, 300 UDP, 300 IPv6 and 300 IPv4-in-IPv6 (GUE) flows on their predicted backends, through the router"
}

test_encap_reload_moves_l2_to_ipip_under_traffic() { # MODE
    # Backends on the link (the bridge topology), running lb decap: l2 and ipip both reach them.
    # lb encapsulates from its eth0 address, the only source the backends unwrap from.
    setup "$1"
    local i d r
    decap_up "$1" 10.99.0.2/32 fd99::2/128
    sed -i 's/    conntrack: off/    conntrack: on/' "$WORK/pool.yaml"
    start_lb "$1"
    hold_open "$TOPO_CLIENTS4" 100 4
    probe "$WORK/during" --vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --count 300 &
    local p=$!
    sleep 0.2
    web_add "$WORK/pool.yaml" "forward: ipip"
    wait_log "forward l2 -> ipip" 1
    wait "$p" || fail "new connections failed while web moved from l2 to ipip"
    hold_wait "a long-lived connection broke when web moved to ipip"
    probe "$WORK/after" --vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --count 100 || fail "after the move"
    for i in 1 2 3; do
        ip netns pids "$PREFIX-b$i" | xargs -r ps -o pid=,comm= -p | awk '$2 == "lb" {print $1}' | xargs -r kill -TERM
    done
    for i in 1 2 3; do wait_until 50 0.1 grep -q "detached" "$WORK/decap$i.log" || true; done
    d=$(cat "$WORK"/decap*.log | grep -o "decapsulated [0-9]*" | awk '{s += $2} END {print s + 0}')
    [ "$d" -gt 0 ] || { cat "$WORK"/decap*.log >&2; fail "the backends decapsulated nothing"; }
    # lb's own packets are never refused: its source is allowed and the VIP is each backend's.
    # Every backend must have said so (its exit line carries the counters).
    n=$(grep -l "not_local [0-9]*" "$WORK"/decap*.log | wc -l)
    [ "$n" -eq 3 ] || { cat "$WORK"/decap*.log >&2; fail "only $n of 3 backends reported their decap counters"; }
    r=$(cat "$WORK"/decap*.log | grep -o "not_allowed [0-9]*\|not_local [0-9]*" | awk '{s += $2} END {print s + 0}')
    [ "$r" -eq 0 ] || { cat "$WORK"/decap*.log >&2; fail "the backends refused $r of lb's packets"; }
    say "web l2 -> ipip under traffic: 2000 connections during and 500 after, none failed; $d packets decapsulated, none refused"
    say "$(hold_summary)"
}

test_encap_backend_removed_under_traffic_moves_only_its_flows() { # MODE
    setup_routed "$1" ipip 4
    routed_pool "$WORK/pool.yaml" ipip "1 2 3 4"
    start_lb "$1"
    remove_b2_under_traffic --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 300 -- routed_pool "$WORK/pool.yaml" ipip "1 3 4"
    say "ipip: $(grep -c . "$WORK/before") flows; removing b2 under traffic moved only b2's"
}

test_encap_health_check_takes_a_stopped_backend_out() { # MODE
    setup_routed "$1" gue
    web_add "$WORK/pool.yaml" "health_check: {kind: tcp, interval: 300ms, timeout: 250ms, rise: 2, fall: 2}"
    start_lb "$1"
    topo_server_stop "$PREFIX" 2
    wait_log "web backend b2 10.97.2.2 is down" 1
    # The decision is logged before the tables are written: new connections avoid b2 from then.
    wait_log "web changed (b2 active -> down" 1
    probe "$WORK/flows" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || fail "connections while b2 is down"
    if grep -q " b2$" "$WORK/flows"; then fail "a flow reached the stopped b2"; fi
    say "gue: the stopped backend was taken out by its health check; 500 connections went to the others"
}

test_encap_tracked_connections_survive_a_reweight() { # MODE
    setup_routed "$1" ipip
    routed_pool "$WORK/pool.yaml" ipip "1 2 3" on
    start_lb "$1"
    hold_open "$TOPO_RCLIENTS4" 100 3
    sed -i '/name: web$/,/backends:/ s/{address: 10.97.1.2, name: b1}/{address: 10.97.1.2, name: b1, weight: 5}/' "$WORK/pool.yaml"
    wait_log "b1 weight 1 -> 5" 1
    hold_wait "a tracked connection broke on a reweight"
    say "ipip with conntrack: $(hold_summary)"
}

test_encap_follows_a_route_change() { # MODE
    setup_routed "$1" ipip
    start_lb "$1"
    # A second address of the router becomes b1's next hop: lb hears the route change, resolves
    # the new neighbour and sends b1's packets there.
    ip -n "$PREFIX-router" addr add 10.99.0.3/24 dev l0
    ip -n "$PREFIX-lb" route add 10.97.1.0/24 via 10.99.0.3
    wait_log "backend 10.97.1.2 is now reached via 10.99.0.3" 1
    probe "$WORK/flows" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || fail "connections after the route change"
    check web "$WORK/flows"
    say "b1's next hop followed a route change (10.99.0.1 -> 10.99.0.3); 500 connections on their predicted backends"
}

# A 2 MB DIRECTION (upload or download) through port 9000 of the IPv4 VIP, then of the IPv6
# one, each within 10 s; says each one's backend, bytes and seconds. PATH says the way it took.
transfer_both() { # DIRECTION PATH
    local vip family out
    for vip in 10.99.0.100 fd99::100; do
        family=IPv4
        if [[ $vip == *:* ]]; then family=IPv6; fi
        out=$(ip netns exec "$PREFIX-client" "$E2E" transfer --vip "$vip" --port 9000 "--$1" 2000000 --timeout 10) \
            || fail "a 2 MB $family $1 $2 did not complete"
        say "$family $1 $2: $out (backend, bytes, seconds)"
    done
}

test_encap_path_mtu_works_because_icmp_reaches_the_backend() { # MODE FORWARD
    setup_routed "$1" "$2"
    start_lb "$1" --stats-interval 0.5
    local icmp big
    # Uploads: the backend says MSS 1460, so the client sends 1500-byte packets, which do not
    # fit the tunnel: lb answers "too big" and the client's stack sends smaller ones.
    transfer_both upload "over $2"
    # Downloads: the router's link to the client carries 1280 bytes while the client's side still
    # says 1500, so backends send 1500-byte packets that only an ICMP error can shrink. The
    # error goes to the VIP (the packets' source), reaches lb, and must go on to the flow's
    # backend.
    ip -n "$PREFIX-router" link set c0 mtu 1280
    transfer_both download "over $2 through a 1280-byte link"
    sleep 1.2
    icmp=$(grep -o "icmp: forwarded=[0-9]*" "$WORK/stats.out" | tail -1 | cut -d= -f2)
    [ "${icmp:-0}" -gt 0 ] || fail "lb forwarded no ICMP error"
    big=$(last_counter too_big)
    [ "${big:-0}" -gt 0 ] || fail "lb answered no packet as too big"
    # The control: with the router's ICMP errors to the VIP thrown away, the same download
    # stalls. That is what routing them to the backend prevented. (Backends forget the path
    # MTU they learned, and the download comes from another client address.)
    ip -n "$PREFIX-router" rule add ipproto icmp to 10.99.0.100 lookup 100
    ip -n "$PREFIX-router" route add blackhole 10.99.0.100/32 table 100
    local i
    for i in 1 2 3; do ip -n "$PREFIX-b$i" route flush cache; done
    if ip netns exec "$PREFIX-client" "$E2E" transfer --vip 10.99.0.100 --port 9000 --source 10.98.0.54 \
        --download 2000000 --timeout 4 >/dev/null 2>&1; then
        fail "control: the download completed without the ICMP error; the test proves nothing"
    fi
    say "lb sent $icmp ICMP errors on to their flows' backends and answered $big packets as too big; without those errors the download stalls"
}
