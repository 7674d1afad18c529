# shellcheck shell=bash
# Health checks: a stopped backend leaves the table and comes back, a flapping one does not
# churn it, HTTP checks honour their status range, and a service with every backend down
# fails open.

test_health_a_stopped_backend_leaves_and_comes_back() { # MODE
    setup "$1"
    web_add "$WORK/pool.yaml" "health_check: {kind: tcp, interval: 500ms, timeout: 300ms, rise: 2, fall: 3}"
    start_lb "$1"
    local args=(--vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --count 200)
    probe "$WORK/before" "${args[@]}" || fail "before"

    local t0 t1
    t0=$(date +%s%N)
    topo_server_stop "$PREFIX" 2
    wait_log "web backend b2 10.99.0.12 is down after 3 failed probes (connection refused)" 1
    t1=$(date +%s%N)
    # interval x fall = 1.5 s, plus a probe in flight and scheduling: 2.5 s is the bound.
    [ $(((t1 - t0) / 1000000)) -le 2500 ] || fail "took $(((t1 - t0) / 1000000)) ms to leave"
    wait_log "health: applied in" 1
    probe "$WORK/down" "${args[@]}" || fail "connections failed with b2 down"
    compare_flows cmp "a flow moved that was not on b2" "$WORK/before" "$WORK/down" --removed b2
    local moved
    moved=$(grep -o "[0-9]* moved," "$WORK/cmp" | head -1 | tr -dc 0-9)

    # A reload that does not touch web keeps b2's health: it stays out.
    reload_without_web
    wait_log "  health: web: b1 10.99.0.11 healthy, b2 10.99.0.12 down (connection refused), b3 10.99.0.13 healthy" 1
    probe "$WORK/reloaded" "${args[@]}" || fail "after the reload"
    compare_flows cmp3 "the reload moved flows back to b2" "$WORK/down" "$WORK/reloaded"

    topo_server_start "$PREFIX" 2
    wait_log "web backend b2 10.99.0.12 is up after 2 good probes" 1
    wait_log "health: applied in" 2
    probe "$WORK/back" "${args[@]}" || fail "after recovery"
    compare_flows cmp2 "flows did not all return" "$WORK/before" "$WORK/back"
    say "b2 left in $(((t1 - t0) / 1000000)) ms, $moved of 1000 flows (only b2's) moved, stayed out across a reload; after 2 good probes every flow is back"
}

test_health_a_flapping_backend_does_not_churn_the_table() { # MODE
    setup "$1"
    web_add "$WORK/pool.yaml" "health_check: {kind: http, port: 8081, path: /healthz, interval: 300ms, timeout: 250ms, rise: 2, fall: 2}"
    echo flap >"/tmp/$PREFIX-b2.status"
    start_lb "$1"
    sleep 3.5 # about 12 probes, alternating good and bad
    if grep -q "is down\|health: applied" "$WORK/lb.log"; then cat "$WORK/lb.log" >&2; fail "a flapping backend changed the table"; fi
    # Two bad answers in a row do take it out.
    echo 503 >"/tmp/$PREFIX-b2.status"
    wait_log "web backend b2 10.99.0.12 is down after 2 failed probes (HTTP 503)" 1
    say "12 alternating probes: no change; then 2 failures in a row: down (HTTP 503)"
}

test_health_http_checks_honour_the_status_range() { # MODE
    setup "$1"
    web_add "$WORK/pool.yaml" "health_check: {kind: http, port: 8081, path: /healthz, expect: 200-299, interval: 300ms, timeout: 200ms, rise: 2, fall: 2}"
    start_lb "$1"
    echo 302 >"/tmp/$PREFIX-b3.status"
    wait_log "web backend b3 10.99.0.13 is down after 2 failed probes (HTTP 302)" 1
    echo 204 >"/tmp/$PREFIX-b3.status"
    wait_log "web backend b3 10.99.0.13 is up after 2 good probes" 1
    # Every backend down: the service fails open.
    for i in 1 2 3; do echo 503 >"/tmp/$PREFIX-b$i.status"; done
    wait_log "every backend of web is down; serving web with all of them (fail open)" 1
    probe "$WORK/open" --vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --count 100 || fail "fail open does not serve"
    check web "$WORK/open"
    echo 200 >"/tmp/$PREFIX-b1.status"
    wait_log "web has a healthy backend again" 1
    probe "$WORK/one" --vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --count 100 || fail "after recovery"
    [ "$(awk '{print $3}' "$WORK/one" | sort -u)" = b1 ] || fail "traffic not only on b1: $(awk '{print $3}' "$WORK/one" | sort | uniq -c)"
    say "302 outside 200-299: down; 204: up; all down: served as configured (fail open); b1 back: only b1"
}
