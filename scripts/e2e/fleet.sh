# shellcheck shell=bash
# A fleet: two lb nodes announced by BGP (BIRD), ECMP on the router (scripts/lib/topology.sh,
# topo_fleet_up). The nodes pin their data planes, so a node's controller can die while its
# plane and its route stay.

# web alone on the fleet's backends (by number), forwarded by FLEET_FORWARD (l2 by default).
fleet_pool() { # FILE BACKENDS
    local list="" i
    for i in $2; do list+="${list:+, }{address: 10.96.0.$((10 + i)), name: b$i}"; done
    printf 'services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    hash: flow\n    forward: %s\n    backends: [%s]\n' \
        "${FLEET_FORWARD:-l2}" "$list" | write_atomic "$1"
}

# BIRD in namespace NS with CONF; its pid in $WORK/bird-NAME.pid.
bird_start() { # NAME NS CONF
    ip netns exec "$2" bird -f -c "$3" -s "$WORK/bird-$1.ctl" -P "$WORK/bird-$1.pid" >"$WORK/bird-$1.log" 2>&1 &
    echo $! >"$WORK/bird-$1.pid.shell"
    echo $! >>"/tmp/$PREFIX.pids"
}

bird_stop() { # NAME
    kill "$(cat "$WORK/bird-$1.pid.shell")" 2>/dev/null || true
}

# How many next hops the router has for the VIP.
vip_nexthops() {
    local r
    r=$(ip -n "$PREFIX-router" route show 10.99.0.100 2>/dev/null)
    if grep -q nexthop <<<"$r"; then grep -c nexthop <<<"$r"; elif [ -n "$r" ]; then echo 1; else echo 0; fi
}

# Waits until the router has N next hops for the VIP; prints the milliseconds it took.
wait_nexthops() { # N TIMEOUT_S
    local t0 now
    t0=$(date +%s%N)
    while [ "$(vip_nexthops)" != "$1" ]; do
        now=$(date +%s%N)
        [ $(((now - t0) / 1000000)) -lt $(($2 * 1000)) ] || { ip -n "$PREFIX-router" route show >&2; return 1; }
        sleep 0.05
    done
    echo $((($(date +%s%N) - t0) / 1000000))
}

# The digest of the table lb computes from FILE, and of the table NODE's data plane serves.
table_digest() { "$LB" table --config "$1" --json | grep -o '"digest":"[0-9a-f]*"'; }
live_digest() { ip netns exec "$PREFIX-$1" "$LB" status eth0 --json --pin-dir "$PINS" | grep -o '"digest":"[0-9a-f]*"'; }

# lb attach --pin --announce on NODE with CONFIG (its own pool by default) and --reload-delay
# DELAY (0.05 s); its pid in $WORK/lb-NODE.pid, its log in $WORK/lb-NODE.log. Returns once it
# serves.
start_node() { # NODE MODE [CONFIG [DELAY]]
    local before
    before=$(grep -c "serving;" "$WORK/lb-$1.log" 2>/dev/null || true)
    ip netns exec "$PREFIX-$1" "$LB" attach eth0 --config "${3:-$WORK/pool-$1.yaml}" --xdp-mode "$2" --pin --pin-dir "$PINS" \
        --announce ifb0 --reload-delay "${4:-0.05}" >"$WORK/stats-$1.out" 2>>"$WORK/lb-$1.log" &
    echo $! >"$WORK/lb-$1.pid"
    wait_serving "$WORK/lb-$1.log" "${before:-0}" "$(cat "$WORK/lb-$1.pid")" "lb on $1" 100
}

fleet_teardown() {
    local n f
    for n in na nb; do
        if [ -f "$WORK/lb-$n.pid" ]; then kill -9 "$(cat "$WORK/lb-$n.pid")" 2>/dev/null || true; fi
    done
    pins_down na nb
    if [ "$V" = 1 ]; then for f in "$WORK"/lb-n*.log "$WORK"/bird-*.log; do [ -f "$f" ] && sed "s|^|    $(basename "$f"): |" "$f"; done; fi
    teardown
}

test_fleet_two_nodes_behind_ecmp_lose_no_connection() { # MODE [FORWARD]
    FLEET_FORWARD=${2:-l2}
    begin_test lbf fleet_teardown
    command -v bird >/dev/null || fail "bird is not installed (scripts/setup.sh test installs bird2)"
    topo_fleet_up "$PREFIX" "$1" || fail "fleet topology"
    pins_up
    if [ "$FLEET_FORWARD" != l2 ]; then
        # Encapsulated to the backends, which take the outer header off with lb decap, from
        # either node's address (each node's outer source) and no other.
        decap_up "$1" 10.96.0.2/32 10.96.0.3/32
    fi
    fleet_pool "$WORK/pool-na.yaml" "1 2 3"
    fleet_pool "$WORK/pool-nb.yaml" "1 2 3"
    # Both nodes compute the same table: lb table's digest says so before anything runs.
    [ "$(table_digest "$WORK/pool-na.yaml")" = "$(table_digest "$WORK/pool-nb.yaml")" ] || fail "the nodes' tables differ"
    start_node na "$1"
    start_node nb "$1"
    sed -e 's/@ROUTER@/10.96.0.1/g' -e 's/@NODE_A@/10.96.0.2/g' -e 's/@NODE_B@/10.96.0.3/g' configs/bird/router.conf >"$WORK/router.conf"
    sed -e 's/@ROUTER@/10.96.0.1/g' -e 's/@NODE@/10.96.0.2/g' -e 's/@DEV@/ifb0/g' configs/bird/node.conf >"$WORK/na.conf"
    sed -e 's/@ROUTER@/10.96.0.1/g' -e 's/@NODE@/10.96.0.3/g' -e 's/@DEV@/ifb0/g' configs/bird/node.conf >"$WORK/nb.conf"
    bird_start router "$PREFIX-router" "$WORK/router.conf"
    bird_start na "$PREFIX-na" "$WORK/na.conf"
    bird_start nb "$PREFIX-nb" "$WORK/nb.conf"
    local took
    took=$(wait_nexthops 2 30) || { cat "$WORK"/bird-*.log >&2; fail "the router never learned both nodes"; }
    ip -n "$PREFIX-router" route show 10.99.0.100 | grep -q "proto bird" || fail "the VIP route is not BGP's"
    # Both nodes serve the same live table: lb status's digest.
    local da db
    da=$(live_digest na)
    db=$(live_digest nb)
    [ "$da" = "$db" ] && [ -n "$da" ] || fail "live tables differ: $da / $db"
    [ "$da" = "$(table_digest "$WORK/pool-na.yaml")" ] || fail "the live table is not the file's"
    say "(1) forward $FLEET_FORWARD: the router learned the VIP from both nodes by BGP in ${took} ms (2 next hops); both serve table ${da#*:}"

    # (1) New connections from many clients reach both nodes and land where the table says.
    probe "$WORK/flows" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 200 || fail "connections"
    check web "$WORK/flows" "$WORK/pool-na.yaml" "check"
    local fa fb
    fa=$(lb_status na status forwarded)
    fb=$(lb_status nb status forwarded)
    [ "$fa" -gt 0 ] && [ "$fb" -gt 0 ] || fail "ECMP used one node only (forwarded $fa and $fb)"
    say "    1000 connections on their predicted backends; node A forwarded $fa packets, node B $fb"

    # (2) 200 long-lived connections; node A withdraws (its BIRD stops).
    HOLD_TRIES=200 hold_open "$TOPO_RCLIENTS4" 200 10
    churn_start "$TOPO_RCLIENTS4"
    sleep 0.5
    bird_stop na
    took=$(wait_nexthops 1 15) || fail "the router did not converge to node B"
    cp "$WORK/churn.failed" "$WORK/churn.during" 2>/dev/null || true
    local during
    during=$(grep -c . "$WORK/churn.during" 2>/dev/null || true)
    probe "$WORK/after-a" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || fail "new connections failed after convergence"
    say "(2) node A withdrew: the router converged to node B in ${took} ms; ${during:-0} new connections failed while it did, 0 after"

    # (3) A comes back.
    bird_start na "$PREFIX-na" "$WORK/na.conf"
    took=$(wait_nexthops 2 30) || fail "node A did not come back"
    sleep 1
    hold_wait "a long-lived connection broke during the failover"
    churn_stop || fail "new connections: $CHURN_SUMMARY"
    say "(3) node A back in ${took} ms; $(hold_summary); $CHURN_SUMMARY"

    # (4) A rolling pool change: b2 removed on A, then on B a few seconds later. No flow of
    # another backend breaks or moves at any point.
    probe "$WORK/before" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || fail "before the rolling change"
    HOLD_TRIES=200 hold_open "$TOPO_RCLIENTS4" 200 12 --allow-broken-on b2
    fleet_pool "$WORK/pool-na.yaml" "1 3"
    wait_log "web changed (b2 removed" 1 "$WORK/lb-na.log"
    probe "$WORK/mixed" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || true
    compare_flows cmp-mixed "with the nodes on different pools, a flow not on b2 failed or moved" "$WORK/before" "$WORK/mixed" --removed b2 --transition
    sleep 2
    fleet_pool "$WORK/pool-nb.yaml" "1 3"
    wait_log "web changed (b2 removed" 1 "$WORK/lb-nb.log"
    probe "$WORK/after" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || fail "after the rolling change"
    compare_flows cmp-after "a flow not on b2 moved" "$WORK/before" "$WORK/after" --removed b2
    say "(4) rolling change (b2 out on A, then on B 2 s later): $(grep -o '[0-9]* flows compared.*' "$WORK/cmp-after" | head -1)"

    # (5) kill -9 node A's lb: its pinned data plane keeps forwarding and its route stays.
    kill -9 "$(cat "$WORK/lb-na.pid")"
    sleep 0.5
    [ "$(vip_nexthops)" = 2 ] || fail "node A's route went with its controller"
    probe "$WORK/after-kill" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || fail "connections after kill -9"
    check web "$WORK/after-kill" "$WORK/pool-na.yaml" "check after kill -9"
    hold_wait "a long-lived connection of another backend broke"
    say "(5) kill -9 of node A's lb: route kept, 500 new connections on their backends; $(hold_summary)"
}
