# shellcheck shell=bash
# Second chance end to end (docs/fleet.md, "Second chance"): three lb nodes behind a BIRD router
# that spreads the VIP over them by ECMP, four backends in subnets of their own running
# `lb decap --second-chance` (scripts/lib/topology.sh, topo_chaos_up). The fleet and the pool
# change at the same moment, twice, under 300 long-lived connections and a stream of new ones:
#   round 1: node C starts fresh and joins the ECMP set (2 -> 3 next hops), and within 100 ms
#            every node's pool changes (b4 added, b1 reweighted 1 -> 2);
#   round 2: node A fails as a whole (its link goes down; its BGP session dies without a
#            withdrawal, so the router black-holes its share until the hold time ends) while b2
#            is set to drain on every node.
# With second chance on, no connection breaks and some packets are sent on by a backend; the
# same run with it off (the control) must break connections, which shows the mechanism is what
# keeps them.

# The backends SPEC... name (I, I:WEIGHT or I:drain; backend I is 10.97.I.2, bI), as a YAML
# flow list's items.
sc_backends() { # SPEC...
    local list="" spec i more
    for spec in "$@"; do
        i=${spec%%:*}
        more=""
        case "$spec" in
            *:drain) more=", state: drain" ;;
            *:*) more=", weight: ${spec#*:}" ;;
        esac
        list+="${list:+, }{name: b$i, address: 10.97.$i.2$more}"
    done
    echo "$list"
}

# The fleet's pool: web, maglev, tracked, GUE, second_chance SC, PREVIOUS as its previous pool
# (none if empty), on backends SPEC... (I, I:WEIGHT or I:drain; backend I is 10.97.I.2, bI).
sc_pool() { # FILE SC PREVIOUS SPEC...
    local file=$1 sc=$2 prev=$3 list
    shift 3
    list=$(sc_backends "$@")
    {
        if [ -n "$prev" ]; then echo "previous: $prev"; fi
        printf 'services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    hash: flow\n    algorithm: maglev\n'
        printf '    forward: gue\n    second_chance: %s\n    backends: [%s]\n' "$sc" "$list"
    } | write_atomic "$file"
}

sc_bird_node() { # NODE ADDRESS
    sed -e 's/@ROUTER@/10.96.0.1/g' -e "s/@NODE@/$2/g" -e 's/@DEV@/ifb0/g' configs/bird/node.conf >"$WORK/$1.conf"
    bird_start "$1" "$PREFIX-$1" "$WORK/$1.conf"
}

# Until every LOG has a line matching PATTERN, polled every 10 ms (at most 5 s).
sc_wait_logs() { # PATTERN LOG...
    local pattern=$1 f
    shift
    for _ in $(seq 1 500); do
        for f in "$@"; do grep -q -- "$pattern" "$f" 2>/dev/null || { sleep 0.01; continue 2; }; done
        return 0
    done
    fail "no line matching '$pattern' in $*"
}

# Until the router has N next hops for the VIP, polled every 10 ms (at most 30 s).
sc_wait_nexthops() { # N
    for _ in $(seq 1 3000); do
        [ "$(vip_nexthops)" = "$1" ] && return 0
        sleep 0.01
    done
    return 1
}

sc_teardown() {
    local n f
    for n in $TOPO_CHAOS_NODES; do
        if [ -f "$WORK/lb-$n.pid" ]; then kill -9 "$(cat "$WORK/lb-$n.pid")" 2>/dev/null || true; fi
    done
    # shellcheck disable=SC2086 # the list of nodes
    pins_down $TOPO_CHAOS_NODES
    if [ "$V" = 1 ]; then
        for f in "$WORK"/lb-n*.log "$WORK"/bird-*.log /tmp/"$PREFIX"-b*.decap.log; do [ -f "$f" ] && sed "s|^|    $(basename "$f"): |" "$f"; done
    fi
    teardown
}

# A decap counter summed over the backends, from their latest stats lines (every second).
sc_decap() { # COUNTER
    local i v total=0
    for i in 1 2 3 4; do
        v=$(grep "decap stats" "/tmp/$PREFIX-b$i.decap.log" | tail -1 | grep -o "$1 [0-9]*" | grep -o '[0-9]*$' || true)
        total=$((total + ${v:-0}))
    done
    echo "$total"
}

# How many held connections broke, from the holder's last line.
sc_broken() { tail -1 "$WORK/hold.log" | grep -o '[0-9]* broken' | grep -o '^[0-9]*'; }

# Packets NODE's lb forwarded, and the flows it picked up in mid-connection, from lb status.
sc_forwarded() { # NODE
    lb_status "$1" status forwarded 2>/dev/null || echo 0
}
sc_adopted() { # NODE...
    local n total=0 v
    for n in "$@"; do
        v=$(lb_status "$n" status conntrack adopted 2>/dev/null || echo 0)
        total=$((total + v))
    done
    echo "$total"
}

test_second_chance_keeps_every_connection_when_nodes_and_pools_change_at_once() { # MODE on|off
    local mode=$1 sc=$2 ms t0 t1 keep=() broken1 broken2 sent1 sent2 hold_failed=0
    begin_test lbs sc_teardown
    command -v bird >/dev/null || fail "bird is not installed (scripts/setup.sh test installs bird2)"
    local decap_args="--stats-interval 1"
    [ "$sc" = on ] && decap_args="--second-chance --stats-interval 1"
    # The control run counts every break instead of stopping at the first.
    [ "$sc" = off ] && keep=(--keep-going)
    topo_chaos_up "$PREFIX" "$mode" "$decap_args" || fail "topology"
    pins_up
    sc_pool "$WORK/pool-p0.yaml" "$sc" "" 1 2 3
    cp "$WORK/pool-p0.yaml" "$WORK/pool-ab.yaml"
    start_node na "$mode" "$WORK/pool-ab.yaml" 0.01
    start_node nb "$mode" "$WORK/pool-ab.yaml" 0.01
    {
        sed -e 's/@ROUTER@/10.96.0.1/g' -e 's/@NODE_A@/10.96.0.2/g' -e 's/@NODE_B@/10.96.0.3/g' configs/bird/router.conf
        printf 'protocol bgp node_c from node {\n\tneighbor 10.96.0.4 as 65001;\n}\n'
    } >"$WORK/router.conf"
    bird_start router "$PREFIX-router" "$WORK/router.conf"
    sc_bird_node na 10.96.0.2
    sc_bird_node nb 10.96.0.3
    # Node C's BIRD peers now but announces nothing until its lb holds the VIP on ifb0.
    sc_bird_node nc 10.96.0.4
    wait_nexthops 2 30 >/dev/null || { cat "$WORK"/bird-*.log >&2; fail "the router never learned nodes A and B"; }
    say "second chance $sc, $mode: nodes A and B behind ECMP, C peered and silent; backends b1-b3 of b1-b4"

    # Round 1: C joins and the pool changes (b4 added, b1 1 -> 2) at the same moment.
    HOLD_TRIES=400 hold_open "$TOPO_RCLIENTS4" 300 12 --patience 12 ${keep[@]+"${keep[@]}"}
    CHURN_COUNT=20 CHURN_TIMEOUT_MS=4000 churn_start "$TOPO_RCLIENTS4"
    sleep 1.5
    sc_pool "$WORK/pool-p1.yaml" "$sc" pool-p0.yaml 1:2 2 3 4
    cp "$WORK/pool-p1.yaml" "$WORK/pool-c.yaml"
    start_node nc "$mode" "$WORK/pool-c.yaml" 0.01
    sc_wait_nexthops 3 || fail "node C did not join the ECMP set"
    t0=$(date +%s%N)
    cp "$WORK/pool-p1.yaml" "$WORK/pool-ab.yaml.new"
    mv "$WORK/pool-ab.yaml.new" "$WORK/pool-ab.yaml"
    sc_wait_logs "web changed (b1 weight 1 -> 2" "$WORK/lb-na.log" "$WORK/lb-nb.log"
    t1=$(date +%s%N)
    ms=$(((t1 - t0) / 1000000))
    # The three nodes serve the same table and hop lists: lb status's digests agree with lb table's.
    local want
    want=$("$LB" table --config "$WORK/pool-ab.yaml" --json | grep -o '"digest":"[0-9a-f]*"')
    for n in na nb nc; do
        [ "$(live_digest "$n")" = "$want" ] || fail "node $n serves another table or other hop lists than lb table computes"
    done
    wait "$HOLD" || hold_failed=1
    broken1=$(sc_broken)
    cp "$WORK/hold.log" "$WORK/hold-round1.log"
    CHURN_COUNT=20 churn_stop || fail "round 1, new connections: $CHURN_SUMMARY"
    sent1=$(sc_decap sent_on)
    local adopted_b0 adopted_c
    adopted_c=$(sc_adopted nc)
    say "(1) C joined (2 -> 3 next hops), and ${ms} ms after the router had it both other nodes served the new pool;"
    say "    C picked up $adopted_c flows in mid-connection and forwarded $(sc_forwarded nc) packets;"
    say "    $(hold_summary); $CHURN_SUMMARY; backends sent $sent1 packets on"

    # Round 2: A dies as a whole while b2 drains (fresh connections: round 1's have ended). The
    # previous pool stays P0: connections from before round 1 could still live. So the nodes
    # that pick up A's flows adopt those on slots round 1 changed to their P0 owner, which is
    # wrong for these connections (opened under P1): that owner's second chance sends them on.
    HOLD_TRIES=400 hold_open "$TOPO_RCLIENTS4" 300 14 --patience 12 --first-port 41000 ${keep[@]+"${keep[@]}"}
    CHURN_COUNT=20 CHURN_TIMEOUT_MS=4000 churn_start "$TOPO_RCLIENTS4"
    sleep 1.5
    sc_pool "$WORK/pool-p2.yaml" "$sc" pool-p0.yaml 1:2 2:drain 3 4
    adopted_b0=$(sc_adopted nb nc)
    t0=$(date +%s%N)
    ip -n "$PREFIX-na" link set eth0 down
    cp "$WORK/pool-p2.yaml" "$WORK/pool-ab.yaml.new" && mv "$WORK/pool-ab.yaml.new" "$WORK/pool-ab.yaml"
    cp "$WORK/pool-p2.yaml" "$WORK/pool-c.yaml.new" && mv "$WORK/pool-c.yaml.new" "$WORK/pool-c.yaml"
    sc_wait_logs "web changed (b2 active -> drain" "$WORK/lb-nb.log" "$WORK/lb-nc.log"
    ms=$((($(date +%s%N) - t0) / 1000000))
    # B (which lived through both changes) and C serve the hops lb table computes from the files.
    want=$("$LB" table --config "$WORK/pool-ab.yaml" --json | grep -o '"digest":"[0-9a-f]*"')
    for n in nb nc; do
        [ "$(live_digest "$n")" = "$want" ] || fail "after the drain, node $n serves other hop lists than lb table computes"
    done
    local took
    took=$(wait_nexthops 2 30) || fail "the router never dropped node A"
    wait "$HOLD" || hold_failed=1
    broken2=$(sc_broken)
    CHURN_COUNT=20 churn_stop || fail "round 2, new connections: $CHURN_SUMMARY"
    sleep 1.2
    sent2=$(($(sc_decap sent_on) - sent1))
    say "(2) A's link went down and b2 drained ${ms} ms later; the router black-holed A's share for ${took} ms;"
    say "    B and C picked up $(($(sc_adopted nb nc) - adopted_b0)) flows in mid-connection;"
    say "    $(hold_summary); $CHURN_SUMMARY; backends sent $sent2 packets on"

    if [ "$sc" = on ]; then
        if [ "${broken1:-1}" != 0 ] || [ "${broken2:-1}" != 0 ] || [ "$hold_failed" != 0 ]; then
            grep -h "^hold: .* (on " "$WORK/hold-round1.log" "$WORK/hold.log" 2>/dev/null | head -5 >&2 || true
            fail "connections broke with second chance on: $broken1 in round 1, $broken2 in round 2"
        fi
        # Round 2's adoptions by P0 owners are wrong for connections opened under P1: only the
        # backends' second chance keeps those.
        if [ "$sent2" -eq 0 ]; then fail "no packet was sent on in round 2"; fi
        say "second chance on: 0 of 300 connections broken in either round"
    else
        [ $((broken1 + broken2)) -gt 0 ] || fail "the control run (second chance off) broke no connection: the test proves nothing"
        [ "$sent1" = 0 ] || fail "packets were sent on with second chance off"
        say "control (second chance off): $broken1 of 300 connections broken in round 1, $broken2 of 300 in round 2"
    fi
}

# The one-segment test's pool: web on the bridge topology's VIP, GUE with second chance, no flow
# table (every packet goes by the table), PREVIOUS as its previous pool (none if empty), on
# backends BACKEND... (I: bI, 10.99.0.1I).
sn_pool() { # FILE PREVIOUS BACKEND...
    local file=$1 prev=$2 list="" b
    shift 2
    for b in "$@"; do list+="${list:+, }{name: b$b, address: 10.99.0.1$b}"; done
    {
        if [ -n "$prev" ]; then echo "previous: $prev"; fi
        printf 'services:\n  - name: web\n    vip: %s\n    port: 80\n    hash: flow\n' "$TOPO_VIP4"
        printf '    forward: gue\n    second_chance: on\n    conntrack: off\n    backends: [%s]\n' "$list"
    } | write_atomic "$file"
}

# Second chance where the lab's routed topology hid two faults (docs/fleet.md, "Second chance"):
# backends on one segment (the bridge topology) that have never talked to each other, so that a
# backend sending a packet on knows no MAC for the next hop; and b1 behind NAT, its nftables
# REDIRECTing the VIP's port 80 to its server's 8080 (as kube-proxy or a proxy sidecar would),
# so that no socket of b1 has the VIP's tuple. Short connections go through first (each packet
# to b1 carries its runner-up as a hop: b1 must keep its REDIRECTed connections); then b3 joins
# under 150 held connections, and those whose slots it takes reach b3, which sends them on to
# b1 and b2 after resolving their MACs. No connection may fail.
test_second_chance_backends_on_one_segment_one_behind_nat() { # MODE
    local mode=$1 i sent unresolved redirected
    begin_test lbn teardown
    command -v nft >/dev/null || fail "nft is not installed (scripts/setup.sh test installs nftables)"
    topo_up "$PREFIX" 3 "$mode" || fail "topology"
    # A frame a backend's native XDP sends back out (XDP_TX) is dropped by its veth peer unless
    # that peer has an XDP program too: the bridge-side peers get one, as lb's has.
    if [ "$mode" = native ]; then
        for i in 1 2 3; do topo_ns "$PREFIX-sw" "$E2E" xdp-pass "p-b$i"; done
    fi
    ip netns exec "$PREFIX-b1" nft -f - <<NFT || fail "b1's REDIRECT"
table ip lbtest {
    chain pre {
        type nat hook prerouting priority dstnat; policy accept;
        ip daddr $TOPO_VIP4 tcp dport 80 counter redirect to :8080
    }
}
NFT
    for i in 1 2 3; do
        ip netns exec "$PREFIX-b$i" "$LB" decap eth0 --second-chance --allow-from 10.99.0.0/24 --xdp-mode "$mode" \
            --stats-interval 1 >"$WORK/decap$i.log" 2>&1 &
        echo $! >>"/tmp/$PREFIX.pids"
    done
    for i in 1 2 3; do
        wait_until 50 0.1 grep -q serving "$WORK/decap$i.log" || { cat "$WORK/decap$i.log" >&2; fail "lb decap on b$i"; }
    done
    sn_pool "$WORK/pool-p0.yaml" "" 1 2
    cp "$WORK/pool-p0.yaml" "$WORK/pool.yaml"
    start_lb "$mode"
    # No backend has a neighbour entry for another: none has sent one anything.
    for i in 1 2 3; do
        ip -n "$PREFIX-b$i" neigh show dev eth0 | grep -q "10.99.0.1[123] " && fail "b$i already knows another backend's MAC"
    done

    probe "$WORK/short" --vip "$TOPO_VIP4" --port 80 --sources "$TOPO_CLIENTS4" --count 120 || fail "short connections through b1's REDIRECT and b2"
    check web "$WORK/short"
    redirected=$(ip netns exec "$PREFIX-b1" nft list chain ip lbtest pre | grep -o 'packets [0-9]*' | grep -o '[0-9]*')
    [ "${redirected:-0}" -gt 0 ] || fail "b1's REDIRECT saw no packet"
    say "120 connections through lb, b1's behind its REDIRECT ($redirected packets redirected), none failed"

    HOLD_TRIES=200 hold_open "$TOPO_CLIENTS4" 150 6 --patience 6
    sleep 1
    sn_pool "$WORK/pool.yaml" pool-p0.yaml 1 2 3
    wait_log "web changed" 1
    hold_wait "held connections broke when b3 joined"
    sleep 1.2
    sent=$(grep "decap stats" "$WORK/decap3.log" | tail -1 | grep -o "sent_on [0-9]*" | grep -o '[0-9]*$')
    unresolved=$(grep "decap stats" "$WORK/decap3.log" | tail -1 | grep -o "unresolved [0-9]*" | grep -o '[0-9]*$')
    [ "${sent:-0}" -gt 0 ] || { cat "$WORK/decap3.log" >&2; fail "b3 sent nothing on"; }
    [ "${unresolved:-0}" -gt 0 ] || { cat "$WORK/decap3.log" >&2; fail "b3 never waited for a MAC: the test did not test it"; }
    grep -q "has no known MAC: resolving it" "$WORK/decap3.log" || fail "b3 did not say it resolved a next hop"
    say "b3 joined under 150 held connections: $(hold_summary); b3 sent $sent packets on to b1 and b2, after $unresolved waited for their MACs"
}
