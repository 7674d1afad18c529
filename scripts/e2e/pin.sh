# shellcheck shell=bash
# A data plane that outlives its controller (lb attach --pin): restarts, kill -9 and an upgrade
# to another map layout lose no connection; lb detach leaves nothing behind.

pin_setup() { # MODE
    setup "$1"
    pins_up
    trap 'pin_teardown; teardown' EXIT
    web_pool "$WORK/pool.yaml" "1:1 2:1 3:1" ring
}

pin_teardown() {
    if [ -n "${LBPID:-}" ]; then stop_lb KILL || true; fi
    pins_down lb
}

# lb attach --pin with BINARY (lb by default), its output appended to the test's stats and log;
# returns once it serves (a new "serving;" line), waiting up to 15 s: since issue 22 the program is
# twice the size (keyed flow tags, IPv6 extension headers, fragments), and verifying it takes
# seconds on a busy 2-core machine; the pinned program forwards all the while. Sets LBPID.
start_pinned() { # MODE [LB BINARY]
    local bin=${2:-$LB} before
    before=$(grep -c "serving;" "$WORK/lb.log" 2>/dev/null || true)
    ip netns exec "$PREFIX-lb" "$bin" attach eth0 --config "$WORK/pool.yaml" --xdp-mode "$1" --pin --pin-dir "$PINS" \
        --reload-delay 0.05 >>"$WORK/stats.out" 2>>"$WORK/lb.log" &
    LBPID=$!
    wait_serving "$WORK/lb.log" "${before:-0}" "$LBPID" "lb attach --pin" 300
}

test_pin_restart_kill_and_upgrade_lose_no_connection() { # MODE
    pin_setup "$1"
    start_pinned "$1"
    hold_open "$TOPO_CLIENTS4" 100 12
    local before after out
    churn_start
    sleep 0.5
    before=$(lb_status lb status flows entries)
    [ "$before" -ge 100 ] || fail "the flow table holds $before entries with 100 connections open"

    # (1) SIGTERM, then a new controller adopts the data plane.
    stop_lb TERM || fail "SIGTERM exit status"
    grep -q "left the data plane on eth0 attached and pinned" "$WORK/lb.log" || fail "no 'left pinned' line"
    xdp_attached || fail "the program went with its controller"
    sleep 0.5
    start_pinned "$1"
    grep "adopted the data plane" "$WORK/lb.log" | tail -1 | grep -q "no service changed" || fail "adoption changed something"
    after=$(lb_status lb status flows entries)
    [ "$after" -ge 100 ] || fail "after adoption the flow table holds $after entries"
    say "(1) SIGTERM and a new controller: flow table $before entries before, $after after"

    # (2) kill -9: forwarding goes on with no controller; then a new one adopts.
    stop_lb KILL || true
    [ "$(lb_status lb controller)" = null ] || fail "lb status shows a controller after kill -9"
    local fwd0 fwd1
    fwd0=$(lb_status lb status forwarded)
    sleep 1
    fwd1=$(lb_status lb status forwarded)
    [ "$fwd1" -gt "$fwd0" ] || fail "nothing forwarded without a controller"
    start_pinned "$1"
    say "(2) kill -9: $((fwd1 - fwd0)) packets forwarded in 1 s with no controller (lb status: controller null); adopted again"

    # (3) An upgrade to a build whose flow-table value has one more field.
    stop_lb TERM || true
    start_pinned "$1" "$LB_NEXT"
    out=$(grep "adopted the data plane" "$WORK/lb.log" | tail -1)
    grep -q "an upgrade: new maps for flows" <<<"$out" || fail "no upgrade: $out"
    local carried
    carried=$(grep -o "[0-9]* tracked flows carried over" <<<"$out" | awk '{print $1}')
    [ "${carried:-0}" -ge 100 ] || fail "only ${carried:-0} tracked flows carried over: $out"
    after=$(lb_status lb status flows entries)
    [ "$after" -ge 100 ] || fail "after the upgrade the flow table holds $after entries"
    say "(3) upgrade: $carried tracked flows carried over into the new layout"
    # Tracked flows matter from here: every backend's weight changes, so the table moves, and
    # the held connections must keep their backends through the carried entries.
    web_pool "$WORK/pool.yaml" "1:3 2:2 3:1" ring
    wait_log "b1 weight 1 -> 3" 1

    hold_wait "a long-lived connection broke"
    churn_stop || fail "new connections: $CHURN_SUMMARY"
    say "$CHURN_SUMMARY; $(hold_summary)"

    # (5) lb detach leaves nothing pinned or attached.
    stop_lb TERM || true
    ip netns exec "$PREFIX-lb" "$LB" detach eth0 --pin-dir "$PINS" >"$WORK/detach.out" || fail "lb detach"
    if xdp_attached; then fail "a program is left after lb detach"; fi
    [ -z "$(find "$PINS" -type f ! -name '*.debug')" ] || fail "pins left: $(find "$PINS" -type f ! -name '*.debug')"
    say "(5) $(cat "$WORK/detach.out")"
}
