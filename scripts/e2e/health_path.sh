# shellcheck shell=bash
# Health checks through the data path (`health_check: {via: vip}`): a backend whose own address
# answers every plain probe, while the path real connections take to it is broken. In turn on b2:
# its `lb decap` stopped (GUE only: L2 needs none), the VIP gone from its loopback, its tunnel's
# packets (L2: its packets to the VIP) dropped by a firewall, its SYN-ACKs from the VIP dropped.
# For each, the control first: under plain probes b2 stays in and its share of new connections
# fails; then, probing through the VIP (a hot reload), b2 leaves within three probe intervals,
# new connections succeed, and b2 comes back once repaired.

# Probes every 300 ms, down after 2 failures: out within three intervals of the breaking.
HP_INTERVAL_MS=300
HP_CHECK="{kind: tcp, interval: ${HP_INTERVAL_MS}ms, timeout: 250ms, rise: 2, fall: 2"

# The pool: web on the VIP, port 80, forwarding FORWARD to BACKENDS ("name address ..."), its
# checks plain (VIA backend) or through the VIP (VIA vip).
hp_pool() { # FILE FORWARD VIA BACKENDS...
    local file=$1 fwd=$2 via=$3 list=""
    shift 3
    while [ $# -ge 2 ]; do
        list+="${list:+, }{address: $2, name: $1}"
        shift 2
    done
    write_atomic "$file" <<EOF
services:
  - name: web
    vip: 10.99.0.100
    port: 80
    hash: flow
    forward: $fwd
    health_check: $HP_CHECK, via: $via}
    backends: [$list]
EOF
}

# A round of 300 new connections from the client, on source ports no round used before (the
# flow table keeps an earlier round's on their backends); HP_FAILED says how many failed, and
# $WORK/NAME holds the flows.
HP_PORT=20000
hp_round() { # NAME SOURCES
    HP_PORT=$((HP_PORT + 60))
    probe "$WORK/$1" --vip 10.99.0.100 --port 80 --sources "$2" --count 60 --first-port "$HP_PORT" --timeout-ms 500 || true
    [ "$(wc -l <"$WORK/$1")" -eq 300 ] || fail "round $1: $(wc -l <"$WORK/$1") flows, not 300"
    HP_FAILED=$(grep -c ' FAIL ' "$WORK/$1" || true)
}

# b2's breakage NAME, or its repair (REPAIR=1), in the topology TOPO (l2: the bridge; gue: the
# routed one, whose router is $PREFIX-router).
hp_break() { # TOPO NAME MODE [REPAIR]
    local topo=$1 what=$2 mode=$3 repair=${4:-} b2="$PREFIX-b2"
    case "$what/$repair" in
        decap/) kill "$(cat "/tmp/$PREFIX-b2.decap.pid")" ;;
        decap/1)
            topo_routed_decap "$PREFIX" 2 "$mode"
            wait_until 100 0.05 grep -q serving "/tmp/$PREFIX-b2.decap.log" || fail "b2's decap did not restart"
            ;;
        vip/) ip -n "$b2" addr del 10.99.0.100/32 dev lo ;;
        vip/1) ip -n "$b2" addr add 10.99.0.100/32 dev lo ;;
        firewall/)
            if [ "$topo" = gue ]; then
                # b2's own firewall comes after its XDP decap: the one in front of it drops GUE.
                ip netns exec "$PREFIX-router" nft -f - <<EOF || fail "nft"
table inet hp {
    chain to_b2 {
        type filter hook forward priority 0;
        oifname "b2" udp dport 6080 drop
    }
}
EOF
            else
                ip netns exec "$b2" nft -f - <<EOF || fail "nft"
table inet hp {
    chain to_vip {
        type filter hook input priority 0;
        ip daddr 10.99.0.100 tcp dport 80 drop
    }
}
EOF
            fi
            ;;
        firewall/1)
            if [ "$topo" = gue ]; then ip netns exec "$PREFIX-router" nft delete table inet hp; else ip netns exec "$b2" nft delete table inet hp; fi
            ;;
        synack/)
            ip netns exec "$b2" nft -f - <<EOF || fail "nft"
table inet hp {
    chain from_vip {
        type filter hook output priority 0;
        ip saddr 10.99.0.100 tcp flags & (syn | ack) == syn | ack drop
    }
}
EOF
            ;;
        synack/1) ip netns exec "$b2" nft delete table inet hp ;;
        *) fail "no breakage $what" ;;
    esac
}

test_health_through_the_vip_catches_what_plain_probes_miss() { # MODE TOPO
    local mode=$1 topo=$2 sources b2addr breakages what n=0 t0 t1 failed control summary=""
    begin_test lbh teardown
    if [ "$topo" = gue ]; then
        topo_routed_up "$PREFIX" 3 "$mode" || fail "routed topology"
        sources=$TOPO_RCLIENTS4 b2addr=10.97.2.2 breakages="decap vip firewall synack"
        set -- b1 10.97.1.2 b2 10.97.2.2 b3 10.97.3.2
    else
        topo_up "$PREFIX" 3 "$mode" || fail "topology"
        sources=$TOPO_CLIENTS4 b2addr=10.99.0.12 breakages="vip firewall synack"
        set -- b1 10.99.0.11 b2 10.99.0.12 b3 10.99.0.13
    fi
    local fwd=$topo
    hp_pool "$WORK/pool.yaml" "$fwd" backend "$@"
    start_lb "$mode"
    for what in $breakages; do
        n=$((n + 1))
        hp_break "$topo" "$what" "$mode"
        # The control: plain probes see b2's own address answer; b2 stays, its share fails.
        hp_round "control-$what" "$sources"
        control=$HP_FAILED
        [ "$(grep -c "b2 $b2addr is down" "$WORK/lb.log")" -eq $((n - 1)) ] || fail "$what: plain probes took b2 out"
        [ "$control" -ge 30 ] || fail "$what: only $control of 300 connections failed with b2 broken and plainly probed"
        # Through the VIP: b2 leaves within three probe intervals of the switch.
        t0=$(date +%s%N)
        hp_pool "$WORK/pool.yaml" "$fwd" vip "$@"
        wait_log "web backend b2 $b2addr is down after 2 failed probes (through the VIP: " "$n"
        t1=$(date +%s%N)
        wait_log "health: applied in" "$((2 * n - 1))"
        # Three intervals, and the reload's own debounce (50 ms) and scheduling.
        [ $(((t1 - t0) / 1000000)) -le $((3 * HP_INTERVAL_MS + 300)) ] || fail "$what: b2 left $(((t1 - t0) / 1000000)) ms after the switch"
        hp_round "vip-$what" "$sources"
        failed=$HP_FAILED
        [ "$failed" -le 3 ] || fail "$what: $failed of 300 connections failed with b2 out"
        if grep -q ' b2$' "$WORK/vip-$what"; then fail "$what: b2 still gets new connections"; fi
        # Repaired: b2 comes back and serves again.
        hp_break "$topo" "$what" "$mode" 1
        wait_log "web backend b2 $b2addr is up after 2 good probes" "$n"
        wait_log "health: applied in" "$((2 * n))"
        hp_round "back-$what" "$sources"
        failed=$HP_FAILED
        [ "$failed" -le 3 ] || fail "$what: $failed of 300 connections failed after the repair"
        grep -q ' b2$' "$WORK/back-$what" || fail "$what: b2 is back but gets no connection"
        summary+="; $what: $control/300 failed plainly probed, out in $(((t1 - t0) / 1000000)) ms through the VIP, then $failed/300"
        hp_pool "$WORK/pool.yaml" "$fwd" backend "$@"
        wait_log "web changed" "$((2 * n))"
    done
    say "${summary#; }"
}
