# shellcheck shell=bash
# Reloads: a changed pool moves only the flows it must, a broken one is refused, and long-lived
# connections of services it does not touch carry on.

test_reload_under_traffic_moves_only_what_it_must() { # MODE
    setup "$1" 4
    start_lb "$1"
    local args=(--vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --count 400)
    # Remove b2 while 2000 connections are being made: none of b1's or b3's fails or moves;
    # afterwards, flows on b1 and b3 kept their backend, flow by flow.
    remove_b2_under_traffic "${args[@]}" -- write_pool "$WORK/pool.yaml" "1 3"

    # Add b4: flows only move to it.
    write_pool "$WORK/pool.yaml" "1 3 4"
    wait_log "b4 added" 1
    probe "$WORK/added" "${args[@]}" || fail "after addition"
    compare_flows cmp2 "a flow moved elsewhere than b4" "$WORK/removed" "$WORK/added" --added b4
    check web "$WORK/added"

    # An invalid file written while 2000 connections are being made: none fails, and the
    # previous table keeps serving.
    probe "$WORK/during" "${args[@]}" &
    local p=$!
    sleep 0.1
    echo "services: [ {name: web, vip: 10.99.0.100, port: 80, backends: [" >"$WORK/pool.yaml"
    wait "$p" || fail "connections failed while an invalid file was written"
    wait_log "reload refused" 1
    write_pool "$WORK/expected.yaml" "1 3 4"
    check web "$WORK/during" "$WORK/expected.yaml" "old table not serving"
    say "$(grep -c . "$WORK/before") flows: removal moved only b2's, addition moved flows only to b4; invalid file refused, 0 failed connections"
}

test_long_lived_connections_survive_a_reload() { # MODE
    setup "$1"
    start_lb "$1"
    hold_open "$TOPO_CLIENTS4" 60 3
    reload_without_web
    hold_wait "a long-lived connection broke"
    say "$(hold_summary)"
}
