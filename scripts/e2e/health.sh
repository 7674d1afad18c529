# shellcheck shell=bash
# Health checks: a stopped backend leaves the table and comes back, a flapping one does not
# churn it, HTTP checks honour their status range, and a service with every backend down
# fails open. Along the way, lb's /metrics counts each backend's probes by outcome.

# web's BACKEND: lb_backend_probes_total for OUTCOME in the scrape FILE (empty if absent).
probes_of() { # FILE BACKEND OUTCOME
    awk -v s="lb_backend_probes_total{service=\"web\",backend=\"$2\",outcome=\"$3\"}" '$1 == s {print $2}' "$1"
}

# web's BACKEND has every outcome's counter in the scrape FILE, and its latency histogram
# counts as many probes as they add up to.
probes_add_up() { # FILE BACKEND
    local sum=0 o n count
    for o in success timeout refused bad_status error; do
        n=$(probes_of "$1" "$2" "$o")
        [ -n "$n" ] || fail "no lb_backend_probes_total of $2 for $o"
        sum=$((sum + n))
    done
    count=$(awk -v s="lb_backend_probe_duration_seconds_count{service=\"web\",backend=\"$2\"}" '$1 == s {print $2}' "$1")
    [ "$count" = "$sum" ] || fail "$2: the latency histogram counts ${count:-nothing}, its outcome counters add up to $sum"
}

test_health_a_stopped_backend_leaves_and_comes_back() { # MODE
    setup "$1"
    web_add "$WORK/pool.yaml" "health_check: {kind: tcp, interval: 500ms, timeout: 300ms, rise: 2, fall: 3}"
    start_lb "$1" --metrics 127.0.0.1:9100
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

    # The metrics: b2's refused probes grow, the others' successes do, and nothing else.
    local b
    lb_scrape "$WORK/m1"
    sleep 1.2 # two probes or more each
    lb_scrape "$WORK/m2"
    [ "$(probes_of "$WORK/m1" b2 refused)" -ge 3 ] || fail "b2 is down with $(probes_of "$WORK/m1" b2 refused) refused probes counted"
    [ "$(probes_of "$WORK/m2" b2 refused)" -gt "$(probes_of "$WORK/m1" b2 refused)" ] || fail "b2's refused probes do not grow"
    [ "$(probes_of "$WORK/m2" b2 success)" -gt 0 ] || fail "b2's successes before it stopped are not counted"
    # The per-service pair of before issue 27 goes on: b2's refusals are web's failures.
    local failures
    failures=$(awk '$1 == "lb_health_probes_total{service=\"web\",outcome=\"failure\"}" {print $2}' "$WORK/m2")
    [ "${failures:-0}" -ge "$(probes_of "$WORK/m2" b2 refused)" ] || fail "lb_health_probes_total{outcome=failure} is ${failures:-absent}"
    grep -q '^lb_health_probe_duration_seconds_count{service="web"}' "$WORK/m2" || fail "no per-service probe latency"
    for b in b1 b3; do
        [ "$(probes_of "$WORK/m2" $b success)" -gt "$(probes_of "$WORK/m1" $b success)" ] || fail "$b's successes do not grow"
        [ "$(probes_of "$WORK/m2" $b refused)" = 0 ] || fail "$b has refused probes"
    done
    for b in b1 b2 b3; do probes_add_up "$WORK/m2" $b; done
    lb_scrape "$WORK/page.html" /
    grep -q '<td>b2</td><td>10.99.0.12</td><td class="down">down (connection refused)</td><td class="probe">refused, [0-9.]* ms</td>' "$WORK/page.html" ||
        fail "the status page does not show b2's last probe"
    local refused
    refused=$(probes_of "$WORK/m2" b2 refused)

    # A reload that does not touch web keeps b2's health: it stays out.
    reload_without_web
    wait_log "  health: web: b1 10.99.0.11 healthy, b2 10.99.0.12 down (connection refused), b3 10.99.0.13 healthy" 1
    probe "$WORK/reloaded" "${args[@]}" || fail "after the reload"
    compare_flows cmp3 "the reload moved flows back to b2" "$WORK/down" "$WORK/reloaded"
    # ... and its probe counts.
    lb_scrape "$WORK/m3"
    [ "$(probes_of "$WORK/m3" b2 refused)" -ge "$refused" ] || fail "the reload reset b2's probe counts ($refused refused before, $(probes_of "$WORK/m3" b2 refused) after)"

    topo_server_start "$PREFIX" 2
    wait_log "web backend b2 10.99.0.12 is up after 2 good probes" 1
    wait_log "health: applied in" 2
    probe "$WORK/back" "${args[@]}" || fail "after recovery"
    compare_flows cmp2 "flows did not all return" "$WORK/before" "$WORK/back"

    # A backend that leaves the pool takes its probe series along; those that stay keep theirs.
    lb_scrape "$WORK/m4"
    sed -i 's/, {address: 10.99.0.13, name: b3, weight: 2}//' "$WORK/pool.yaml"
    wait_log "b3 removed" 1
    lb_scrape "$WORK/m5"
    if grep -q 'lb_backend_probe.*backend="b3"' "$WORK/m5"; then fail "b3 left web, its probe series did not"; fi
    [ "$(probes_of "$WORK/m5" b1 success)" -ge "$(probes_of "$WORK/m4" b1 success)" ] || fail "removing b3 reset b1's probe counts"
    probes_add_up "$WORK/m5" b2
    say "b2 left in $(((t1 - t0) / 1000000)) ms, $moved of 1000 flows (only b2's) moved, stayed out across a reload; after 2 good probes every flow is back"
    say "metrics: b2 $(probes_of "$WORK/m5" b2 refused) refused and $(probes_of "$WORK/m5" b2 success) successful probes, b1 $(probes_of "$WORK/m5" b1 success) successful; counts kept across reloads, b3's series gone with b3"
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
    start_lb "$1" --metrics 127.0.0.1:9100
    echo 302 >"/tmp/$PREFIX-b3.status"
    wait_log "web backend b3 10.99.0.13 is down after 2 failed probes (HTTP 302)" 1
    # An answer outside the range is counted as bad_status, not as a refusal or a timeout.
    local b
    lb_scrape "$WORK/m1"
    [ "$(probes_of "$WORK/m1" b3 bad_status)" -ge 2 ] || fail "b3 is down with $(probes_of "$WORK/m1" b3 bad_status) bad_status probes counted"
    [ "$(probes_of "$WORK/m1" b3 refused)$(probes_of "$WORK/m1" b3 timeout)" = 00 ] || fail "b3's bad answers were counted as refusals or timeouts"
    for b in b1 b2; do
        [ "$(probes_of "$WORK/m1" $b success)" -gt 0 ] || fail "no successful probe of $b counted"
        [ "$(probes_of "$WORK/m1" $b bad_status)" = 0 ] || fail "$b has bad_status probes"
    done
    for b in b1 b2 b3; do probes_add_up "$WORK/m1" $b; done
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
    say "302 outside 200-299: down ($(probes_of "$WORK/m1" b3 bad_status) bad_status probes counted); 204: up; all down: served as configured (fail open); b1 back: only b1"
}
