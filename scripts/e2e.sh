#!/usr/bin/env bash
# End-to-end tests: real TCP and UDP clients and servers in network namespaces, through lb
# attached to a veth, in native and generic XDP mode. One function per test; each runs in its
# own subshell with its own topology, a time bound, and a trap that tears everything down.
#
#   scripts/e2e.sh                 every test, both modes
#   scripts/e2e.sh NAME...         only tests whose name contains NAME
#   V=1 scripts/e2e.sh             show lb's log and the checks' tables as they run
#
# Needs root and the release build (cargo build --release --bins --examples). Exit status: 0
# all passed, 1 some failed.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/topology.sh
source scripts/lib/topology.sh

LB=${LB:-target/release/lb}
# A second build whose map layout differs (cargo feature layout-test), for the upgrade test.
LB_NEXT=${LB_NEXT:-target/release/lb-layout-test}
E2E=$TOPO_E2E
TEST_TIMEOUT=${TEST_TIMEOUT:-120}
V=${V:-0}

say() { echo "    $*"; }
fail() { echo "    FAIL: $*" >&2; exit 1; }
show() { if [ "$V" = 1 ]; then cat "$1"; fi; }

# The pool the tests serve; backends are named as their servers answer. WEB lists the web
# service's backends by number (b3 has weight 2). Its services track no connections: these
# tests replay the same flows and follow the tables themselves (a connection attempt that
# failed would otherwise stay tracked to its backend); the conntrack test tracks them.
write_pool() { # FILE [WEB]
    local web="" i weight
    for i in ${2:-1 2 3}; do
        weight=""
        if [ "$i" = 3 ]; then weight=", weight: 2"; fi
        web+="${web:+, }{address: 10.99.0.$((10 + i)), name: b$i$weight}"
    done
    cat >"$1.tmp" <<EOF
services:
  - name: web
    vip: 10.99.0.100
    port: 80
    hash: flow
    conntrack: off
    backends: [$web]
  - name: sticky
    vip: 10.99.0.100
    port: 8080
    hash: client-ip
    conntrack: off
    backends: [{address: 10.99.0.11, name: b1}, {address: 10.99.0.12, name: b2}, {address: 10.99.0.13, name: b3}]
  - name: dns
    vip: 10.99.0.100
    port: 53
    protocol: udp
    algorithm: maglev
    hash: flow
    conntrack: off
    backends: [{address: 10.99.0.11, name: b1}, {address: 10.99.0.12, name: b2}, {address: 10.99.0.13, name: b3}]
  - name: web6
    vip: fd99::100
    port: 80
    hash: flow
    conntrack: off
    backends: [{address: 'fd99::11', name: b1}, {address: 'fd99::12', name: b2}, {address: 'fd99::13', name: b3}]
EOF
    mv "$1.tmp" "$1"
}

# Per-test state: PREFIX, WORK (a scratch directory), LBPID.
setup() { # MODE [BACKENDS]
    PREFIX="lbe$$${RANDOM}"
    WORK=$(mktemp -d /tmp/lb-e2e.XXXXXX)
    trap teardown EXIT
    trap 'exit 124' TERM INT
    topo_up "$PREFIX" "${2:-3}" "$1" || fail "topology"
    write_pool "$WORK/pool.yaml"
}

start_lb() { # MODE [EXTRA ARGS]
    local mode=$1
    shift
    ip netns exec "$PREFIX-lb" "$LB" attach eth0 --config "$WORK/pool.yaml" --xdp-mode "$mode" --reload-delay 0.05 "$@" \
        >"$WORK/stats.out" 2>"$WORK/lb.log" &
    LBPID=$!
    for _ in $(seq 1 100); do
        grep -q "serving;" "$WORK/lb.log" && return 0
        kill -0 "$LBPID" 2>/dev/null || break
        sleep 0.1
    done
    cat "$WORK/lb.log" >&2
    fail "lb attach did not start"
}

teardown() {
    [ -n "${LBPID:-}" ] && kill "$LBPID" 2>/dev/null && wait "$LBPID" 2>/dev/null
    topo_down "$PREFIX"
    [ "$V" = 1 ] && [ -f "$WORK/lb.log" ] && sed 's/^/    | /' "$WORK/lb.log"
    rm -rf "$WORK"
}

probe() { # OUT ARGS...  (in the client namespace)
    local out=$1
    shift
    ip netns exec "$PREFIX-client" "$E2E" probe "$@" >"$out" 2>>"$WORK/probe.log"
}

check() { # SERVICE FLOWS
    "$E2E" check --config "$WORK/pool.yaml" --service "$1" "$2" >"$WORK/check.out" || { cat "$WORK/check.out" >&2; fail "check $1"; }
    show "$WORK/check.out"
}

wait_log() { # PATTERN COUNT: until lb.log has COUNT lines matching
    for _ in $(seq 1 100); do
        [ "$(grep -c -- "$1" "$WORK/lb.log")" -ge "$2" ] && return 0
        sleep 0.05
    done
    cat "$WORK/lb.log" >&2
    fail "no log line matching '$1'"
}

# Opens CONNECTIONS long-lived connections to 10.99.0.100:80 from SOURCES that keep talking for
# SECONDS (e2e hold); sets HOLD to the holder's pid once every connection is open.
hold_open() { # SOURCES CONNECTIONS SECONDS [HOLD ARGS...]
    local sources=$1 n=$2 secs=$3
    shift 3
    ip netns exec "$PREFIX-client" "$E2E" hold --vip 10.99.0.100 --port 80 --sources "$sources" \
        --connections "$n" --seconds "$secs" --ready-file "$WORK/ready" "$@" 2>"$WORK/hold.log" &
    HOLD=$!
    for _ in $(seq 1 100); do [ -f "$WORK/ready" ] && break; sleep 0.05; done
    [ -f "$WORK/ready" ] || { cat "$WORK/hold.log" >&2; fail "connections did not open"; }
}

# Starts `lb decap eth0` on backends 1 to 3 (stopped with the topology) and waits until each
# serves.
decap_up() { # MODE
    local i
    for i in 1 2 3; do
        ip netns exec "$PREFIX-b$i" "$LB" decap eth0 --xdp-mode "$1" >/dev/null 2>"$WORK/decap$i.log" &
        echo $! >>"/tmp/$PREFIX.pids"
    done
    for i in 1 2 3; do
        for _ in $(seq 1 50); do grep -q serving "$WORK/decap$i.log" && break; sleep 0.1; done
        grep -q serving "$WORK/decap$i.log" || { cat "$WORK/decap$i.log" >&2; fail "lb decap on b$i"; }
    done
}

xdp_attached() { ip -n "$PREFIX-lb" -d link show dev eth0 | grep -q 'prog/xdp'; }

# ---- the tests ----

test_3000_tcp_connections_follow_the_table() { # MODE
    setup "$1"
    start_lb "$1"
    probe "$WORK/flows" --vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --count 600 || fail "connections failed"
    [ "$(wc -l <"$WORK/flows")" -eq 3000 ] || fail "not 3000 flows"
    # Every connection completed, so every reply came from the VIP; each is on the predicted
    # backend and the counts match the shares.
    check web "$WORK/flows"
    grep "flows:" "$WORK/check.out" | sed 's/^ */    /'
}

test_udp_and_ipv6_end_to_end() { # MODE
    setup "$1"
    start_lb "$1"
    probe "$WORK/udp" --udp --vip 10.99.0.100 --port 53 --sources "$TOPO_CLIENTS4" --count 200 || fail "UDP"
    show "$WORK/probe.log"
    check dns "$WORK/udp"
    probe "$WORK/v6" --vip fd99::100 --port 80 --sources "$TOPO_CLIENTS6" --count 200 || fail "IPv6"
    check web6 "$WORK/v6"
    say "1000 UDP exchanges and 1000 IPv6 connections on their predicted backends"
}

test_client_ip_keeps_each_client_on_one_backend() { # MODE
    setup "$1"
    start_lb "$1"
    probe "$WORK/flows" --vip 10.99.0.100 --port 8080 --sources "$TOPO_CLIENTS4" --count 200 || fail "connections"
    check sticky "$WORK/flows"
    local spread
    spread=$(awk '{print $1, $3}' "$WORK/flows" | sort -u | awk '{n[$1]++} END {for (c in n) if (n[c] > 1) print c}')
    [ -z "$spread" ] || fail "clients on more than one backend: $spread"
    say "$(awk '{print $1}' "$WORK/flows" | sort -u | wc -l) clients, each on one backend over 200 source ports"
}

test_reload_under_traffic_moves_only_what_it_must() { # MODE
    setup "$1" 4
    start_lb "$1"
    local args=(--vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --count 400)
    probe "$WORK/before" "${args[@]}" || fail "before"

    # Remove b2 while 2000 connections are being made: none of b1's or b3's fails or moves;
    # afterwards, flows on b1 and b3 kept their backend, flow by flow.
    probe "$WORK/during_removal" "${args[@]}" &
    local during=$!
    sleep 0.1
    write_pool "$WORK/pool.yaml" "1 3"
    wait "$during" || true
    wait_log "web changed (b2 removed" 1
    "$E2E" compare "$WORK/before" "$WORK/during_removal" --removed b2 --transition >"$WORK/cmp0" \
        || { cat "$WORK/cmp0" >&2; fail "a flow not on b2 failed or moved while b2 was removed"; }
    show "$WORK/cmp0"
    probe "$WORK/removed" "${args[@]}" || fail "after removal"
    "$E2E" compare "$WORK/before" "$WORK/removed" --removed b2 >"$WORK/cmp" || { cat "$WORK/cmp" >&2; fail "a flow moved that was not on b2"; }
    show "$WORK/cmp"
    check web "$WORK/removed"

    # Add b4: flows only move to it.
    write_pool "$WORK/pool.yaml" "1 3 4"
    wait_log "b4 added" 1
    probe "$WORK/added" "${args[@]}" || fail "after addition"
    "$E2E" compare "$WORK/removed" "$WORK/added" --added b4 >"$WORK/cmp2" || { cat "$WORK/cmp2" >&2; fail "a flow moved elsewhere than b4"; }
    show "$WORK/cmp2"
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
    "$E2E" check --config "$WORK/expected.yaml" --service web "$WORK/during" >"$WORK/check.out" || { cat "$WORK/check.out" >&2; fail "old table not serving"; }
    say "$(grep -c . "$WORK/before") flows: removal moved only b2's, addition moved flows only to b4; invalid file refused, 0 failed connections"
}

test_long_lived_connections_survive_a_reload() { # MODE
    setup "$1"
    start_lb "$1"
    hold_open "$TOPO_CLIENTS4" 60 3
    local h=$HOLD
    # A reload that does not touch web: dns changes, a service is added.
    sed -i 's/    port: 53/    port: 5353/' "$WORK/pool.yaml"
    wait_log "dns changed" 1
    wait "$h" || { cat "$WORK/hold.log" >&2; fail "a long-lived connection broke"; }
    say "$(tail -1 "$WORK/hold.log" | sed 's/^hold: //')"
}

test_sigterm_and_kill_leave_the_interface_clean() { # MODE
    setup "$1"
    start_lb "$1"
    xdp_attached || fail "no program while lb runs"
    kill -TERM "$LBPID"
    local rc=0
    wait "$LBPID" || rc=$?
    LBPID=
    [ "$rc" -eq 0 ] || fail "SIGTERM exit status $rc"
    grep -q "SIGTERM: detached from eth0" "$WORK/lb.log" || fail "no detach line"
    if xdp_attached; then fail "program left after SIGTERM"; fi
    start_lb "$1"
    kill -9 "$LBPID"
    wait "$LBPID" 2>/dev/null || true
    LBPID=
    for _ in $(seq 1 50); do xdp_attached || break; sleep 0.1; done
    if xdp_attached; then fail "program left after kill -9"; fi
    say "SIGTERM: exit 0 and detached; kill -9: no stale program"
}

test_bad_command_lines_fail_clearly_and_attach_nothing() { # MODE
    setup "$1"
    chmod 755 "$WORK" && chmod 644 "$WORK/pool.yaml" # readable by the unprivileged user below
    expect_error() { # NEEDLE COMMAND...
        local needle=$1
        shift
        local out
        if out=$("$@" 2>&1); then fail "succeeded: $*"; fi
        grep -qF -- "$needle" <<<"$out" || fail "expected '$needle' from $*, got: $out"
        if xdp_attached; then fail "left a program attached: $*"; fi
    }
    expect_error "no such interface \`eth9\`" ip netns exec "$PREFIX-lb" "$LB" attach eth9 --config "$WORK/pool.yaml"
    expect_error "missing.yaml: no such file" ip netns exec "$PREFIX-lb" "$LB" attach eth0 --config "$WORK/missing.yaml"
    expect_error "invalid value 'fast' for '--xdp-mode <MODE>'" ip netns exec "$PREFIX-lb" "$LB" attach eth0 --config "$WORK/pool.yaml" --xdp-mode fast
    expect_error "lb attach needs root" ip netns exec "$PREFIX-lb" setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
        "$LB" attach eth0 --config "$WORK/pool.yaml"
    say "no such interface, missing config, bad flag, not root: each a clear error, nothing attached"
}

# A health check on web: WEB_CHECK is its YAML mapping.
with_check() { # FILE CHECK
    sed -i "/name: web$/,/backends:/ s|^    hash: flow$|    hash: flow\n    health_check: $2|" "$1"
    grep -q "health_check: $2" "$1" || fail "could not add the health check"
}

test_health_a_stopped_backend_leaves_and_comes_back() { # MODE
    setup "$1"
    with_check "$WORK/pool.yaml" "{kind: tcp, interval: 500ms, timeout: 300ms, rise: 2, fall: 3}"
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
    "$E2E" compare "$WORK/before" "$WORK/down" --removed b2 >"$WORK/cmp" || { cat "$WORK/cmp" >&2; fail "a flow moved that was not on b2"; }
    show "$WORK/cmp"
    local moved
    moved=$(grep -o "[0-9]* moved," "$WORK/cmp" | head -1 | tr -dc 0-9)

    # A reload that does not touch web keeps b2's health: it stays out.
    sed -i 's/    port: 53$/    port: 5353/' "$WORK/pool.yaml"
    wait_log "dns changed" 1
    wait_log "  health: web: b1 10.99.0.11 healthy, b2 10.99.0.12 down (connection refused), b3 10.99.0.13 healthy" 1
    probe "$WORK/reloaded" "${args[@]}" || fail "after the reload"
    "$E2E" compare "$WORK/down" "$WORK/reloaded" >"$WORK/cmp3" || { cat "$WORK/cmp3" >&2; fail "the reload moved flows back to b2"; }

    topo_server_start "$PREFIX" 2
    wait_log "web backend b2 10.99.0.12 is up after 2 good probes" 1
    wait_log "health: applied in" 2
    probe "$WORK/back" "${args[@]}" || fail "after recovery"
    "$E2E" compare "$WORK/before" "$WORK/back" >"$WORK/cmp2" || { cat "$WORK/cmp2" >&2; fail "flows did not all return"; }
    say "b2 left in $(((t1 - t0) / 1000000)) ms, $moved of 1000 flows (only b2's) moved, stayed out across a reload; after 2 good probes every flow is back"
}

test_health_a_flapping_backend_does_not_churn_the_table() { # MODE
    setup "$1"
    with_check "$WORK/pool.yaml" "{kind: http, port: 8081, path: /healthz, interval: 300ms, timeout: 250ms, rise: 2, fall: 2}"
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
    with_check "$WORK/pool.yaml" "{kind: http, port: 8081, path: /healthz, expect: 200-299, interval: 300ms, timeout: 200ms, rise: 2, fall: 2}"
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

# web alone, backends "bN:WEIGHT ...", algorithm ALGORITHM.
web_pool() { # FILE BACKENDS ALGORITHM
    local list="" b
    for b in $2; do
        list+="${list:+, }{address: 10.99.0.$((10 + ${b%%:*})), name: b${b%%:*}, weight: ${b##*:}}"
    done
    printf 'services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    hash: flow\n    algorithm: %s\n    backends: [%s]\n' "$3" "$list" >"$1.tmp"
    mv "$1.tmp" "$1"
}

test_conntrack_keeps_established_connections_through_pool_changes() { # MODE
    setup "$1" 5
    web_pool "$WORK/pool.yaml" "1:1 2:1 3:2" ring
    start_lb "$1"
    hold_open "$TOPO_CLIENTS4" 300 6 --allow-broken-on b2
    local h=$HOLD
    # Reweight every backend, add two, remove one, switch ring -> maglev: lb diff predicts each
    # change's moved slots, and the reload writes exactly those.
    local n=0 step prev="$WORK/pool.yaml.prev"
    for step in "1:3 2:2 3:1|ring" "1:3 2:2 3:1 4:1 5:1|ring" "1:3 3:1 4:1 5:1|ring" "1:3 3:1 4:1 5:1|maglev"; do
        cp "$WORK/pool.yaml" "$prev"
        web_pool "$WORK/pool.yaml" "${step%|*}" "${step#*|}"
        n=$((n + 1))
        wait_log "web changed" "$n"
        local predicted written
        predicted=$("$LB" diff --json "$prev" "$WORK/pool.yaml" | grep -o '"moved":[0-9]*' | head -1 | cut -d: -f2)
        written=$(grep "web changed" "$WORK/lb.log" | sed -n "${n}p" | grep -o '[0-9]* slots written' | awk '{print $1}')
        [ "$predicted" = "$written" ] || fail "step $n: lb diff predicted $predicted moved slots, the reload wrote $written"
        say "step $n (${step/|/, }): $written slots moved, as lb diff predicted"
        sleep 0.3
    done
    wait "$h" || { cat "$WORK/hold.log" >&2; fail "an established connection on a surviving backend broke"; }
    say "$(tail -1 "$WORK/hold.log" | sed 's/^hold: //')"
}

# A spoofed-source SYN flood at the VIP while 200 long-lived tracked connections run and every
# backend is reweighted and one added. GUARD on (lb's default): no connection breaks, and new
# connections made during the flood succeed. GUARD off: the same flood washes the flow table
# out and the reweight breaks established connections; the test then asserts that they broke,
# so that it proves the guard does something.
test_conntrack_a_syn_flood_breaks_no_established_connection() { # MODE GUARD
    local guard=$2
    setup "$1" 4
    web_pool "$WORK/pool.yaml" "1:1 2:1 3:1" maglev
    # A flow table of 65,536 slots: a flood of millions of sources overflows it many times.
    start_lb "$1" --conntrack-size 65536 --conntrack-guard "$guard" --stats-interval 1
    # The generator: its own port on the switch (XDP_PASS there takes its frames in).
    topo_link "$PREFIX" gen
    ip -n "$PREFIX-gen" addr add 10.99.0.3/24 dev eth0
    topo_ns "$PREFIX-sw" "$E2E" xdp-pass p-gen
    local lbmac
    lbmac=$(ip -n "$PREFIX-lb" link show eth0 | awk '/ether/{print $2}')
    hold_open "$TOPO_CLIENTS4" 200 14
    local h=$HOLD
    ip netns exec "$PREFIX-gen" "$E2E" trafgen eth0 --dst-mac "$lbmac" --src 10.99.0.3 --dst 10.99.0.100 --dport 80 \
        --seconds 8 --new-every 1 --cpus 0 --total >"$WORK/flood.out" &
    local flood=$!
    sleep 2
    # During the flood: new connections, and a reweight of every backend plus one more.
    probe "$WORK/during" --vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --first-port 30000 --count 400 &
    local p=$!
    sleep 1
    web_pool "$WORK/pool.yaml" "1:3 2:2 3:1 4:2" maglev
    wait_log "web changed" 1
    wait "$p" || true
    wait "$flood" || fail "the flood generator failed"
    local rate sent ok total reached evicted
    read -r rate sent <"$WORK/flood.out"
    total=$(wc -l <"$WORK/during")
    ok=$(grep -vc " FAIL " "$WORK/during" || true)
    sleep 1.5
    # SYNs that reached lb: recorded half-open with the guard, made into entries without it.
    if [ "$guard" = on ]; then reached=$(last_counter pending); else reached=$(last_counter new); fi
    evicted=$(last_counter evicted)
    say "flood: the generator sent $sent spoofed SYNs ($rate per second), each from another source address and port;"
    say "  $reached reached lb through the switch (about $((reached / 8)) per second); lb evicted $evicted established flows"
    say "new connections during the flood: $ok of $total succeeded"
    [ "$reached" -ge 1000000 ] || fail "only $reached SYNs reached lb: not a flood of a million sources"
    if [ "$guard" = on ]; then
        wait "$h" || { cat "$WORK/hold.log" >&2; fail "an established connection broke during the flood"; }
        [ $((ok * 100)) -ge $((total * 99)) ] || fail "only $ok of $total new connections succeeded during the flood"
        [ "$evicted" = 0 ] || fail "the flood evicted $evicted established flows"
        say "guard on: $(tail -1 "$WORK/hold.log" | sed 's/^hold: //')"
    else
        if wait "$h"; then fail "with the guard off, no established connection broke: the test proves nothing"; fi
        [ "$evicted" -gt 0 ] || fail "with the guard off, nothing was evicted"
        say "guard off: $(tail -1 "$WORK/hold.log" | sed 's/^hold: //') (as expected without the guard)"
    fi
}

# ---- encapsulation: backends behind a router (scripts/lib/topology.sh, topo_routed_up) ----

# The routed pool: FORWARD for the web services, BACKENDS by number, CONNTRACK for web.
routed_pool() { # FILE FORWARD [BACKENDS] [CONNTRACK]
    local web="" web6="" i
    for i in ${3:-1 2 3}; do
        web+="${web:+, }{address: 10.97.$i.2, name: b$i}"
        web6+="${web6:+, }{address: 'fd97:$i::2', name: b$i}"
    done
    cat >"$1.tmp" <<EOF
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
    mv "$1.tmp" "$1"
}

setup_routed() { # MODE FORWARD [BACKENDS]
    PREFIX="lbr$$${RANDOM}"
    WORK=$(mktemp -d /tmp/lb-e2e.XXXXXX)
    trap teardown EXIT
    trap 'exit 124' TERM INT
    topo_routed_up "$PREFIX" "${3:-3}" "$1" || fail "routed topology"
    routed_pool "$WORK/pool.yaml" "$2"
}

# The last value lb's --stats-interval output gave counter NAME.
last_counter() { # NAME
    grep -o "$1=[0-9]*" "$WORK/stats.out" | tail -1 | cut -d= -f2
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
    setup "$1"
    local i d
    decap_up "$1"
    sed -i 's/    conntrack: off/    conntrack: on/' "$WORK/pool.yaml"
    start_lb "$1"
    hold_open "$TOPO_CLIENTS4" 100 4
    local h=$HOLD
    probe "$WORK/during" --vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --count 300 &
    local p=$!
    sleep 0.2
    sed -i '/name: web$/,/backends:/ s/^    hash: flow$/    hash: flow\n    forward: ipip/' "$WORK/pool.yaml"
    wait_log "forward l2 -> ipip" 1
    wait "$p" || fail "new connections failed while web moved from l2 to ipip"
    wait "$h" || { cat "$WORK/hold.log" >&2; fail "a long-lived connection broke when web moved to ipip"; }
    probe "$WORK/after" --vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --count 100 || fail "after the move"
    for i in 1 2 3; do
        ip netns pids "$PREFIX-b$i" | xargs -r ps -o pid=,comm= -p | awk '$2 == "lb" {print $1}' | xargs -r kill -TERM
    done
    for i in 1 2 3; do
        for _ in $(seq 1 50); do grep -q "detached" "$WORK/decap$i.log" && break; sleep 0.1; done
    done
    d=$(cat "$WORK"/decap*.log | grep -o "decapsulated [0-9]*" | awk '{s += $2} END {print s + 0}')
    [ "$d" -gt 0 ] || { cat "$WORK"/decap*.log >&2; fail "the backends decapsulated nothing"; }
    say "web l2 -> ipip under traffic: 2000 connections during and 500 after, none failed; $d packets decapsulated"
    say "$(tail -1 "$WORK/hold.log" | sed 's/^hold: //')"
}

test_encap_backend_removed_under_traffic_moves_only_its_flows() { # MODE
    setup_routed "$1" ipip 4
    routed_pool "$WORK/pool.yaml" ipip "1 2 3 4"
    start_lb "$1"
    local args=(--vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 300)
    probe "$WORK/before" "${args[@]}" || fail "before"
    probe "$WORK/during" "${args[@]}" &
    local during=$!
    sleep 0.1
    routed_pool "$WORK/pool.yaml" ipip "1 3 4"
    wait "$during" || true
    wait_log "web changed (b2 removed" 1
    "$E2E" compare "$WORK/before" "$WORK/during" --removed b2 --transition >"$WORK/cmp0" \
        || { cat "$WORK/cmp0" >&2; fail "a flow not on b2 failed or moved while b2 was removed"; }
    probe "$WORK/after" "${args[@]}" || fail "after"
    "$E2E" compare "$WORK/before" "$WORK/after" --removed b2 >"$WORK/cmp" || { cat "$WORK/cmp" >&2; fail "a flow moved that was not on b2"; }
    check web "$WORK/after"
    say "ipip: $(grep -c . "$WORK/before") flows; removing b2 under traffic moved only b2's"
}

test_encap_health_check_takes_a_stopped_backend_out() { # MODE
    setup_routed "$1" gue
    sed -i "/name: web$/,/backends:/ s|^    hash: flow$|    hash: flow\n    health_check: {kind: tcp, interval: 300ms, timeout: 250ms, rise: 2, fall: 2}|" "$WORK/pool.yaml"
    start_lb "$1"
    topo_server_stop "$PREFIX" 2
    wait_log "web backend b2 10.97.2.2 is down" 1
    probe "$WORK/flows" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || fail "connections while b2 is down"
    if grep -q " b2$" "$WORK/flows"; then fail "a flow reached the stopped b2"; fi
    say "gue: the stopped backend was taken out by its health check; 500 connections went to the others"
}

test_encap_tracked_connections_survive_a_reweight() { # MODE
    setup_routed "$1" ipip
    routed_pool "$WORK/pool.yaml" ipip "1 2 3" on
    start_lb "$1"
    hold_open "$TOPO_RCLIENTS4" 100 3
    local h=$HOLD
    sed -i '/name: web$/,/backends:/ s/{address: 10.97.1.2, name: b1}/{address: 10.97.1.2, name: b1, weight: 5}/' "$WORK/pool.yaml"
    wait_log "b1 weight 1 -> 5" 1
    wait "$h" || { cat "$WORK/hold.log" >&2; fail "a tracked connection broke on a reweight"; }
    say "ipip with conntrack: $(tail -1 "$WORK/hold.log" | sed 's/^hold: //')"
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

test_encap_path_mtu_works_because_icmp_reaches_the_backend() { # MODE FORWARD
    setup_routed "$1" "$2"
    start_lb "$1" --stats-interval 0.5
    local out icmp big
    # Uploads: the backend says MSS 1460, so the client sends 1500-byte packets, which do not
    # fit the tunnel: lb answers "too big" and the client's stack sends smaller ones.
    out=$(ip netns exec "$PREFIX-client" "$E2E" transfer --vip 10.99.0.100 --port 9000 --upload 2000000 --timeout 10) \
        || fail "a 2 MB IPv4 upload did not complete"
    say "IPv4 upload over $2: $out (backend, bytes, seconds)"
    out=$(ip netns exec "$PREFIX-client" "$E2E" transfer --vip fd99::100 --port 9000 --upload 2000000 --timeout 10) \
        || fail "a 2 MB IPv6 upload did not complete"
    say "IPv6 upload: $out"
    # Downloads: the router's link to the client carries 1280 bytes while the client's side still
    # says 1500, so backends send 1500-byte packets that only an ICMP error can shrink. The
    # error goes to the VIP (the packets' source), reaches lb, and must go on to the flow's
    # backend.
    ip -n "$PREFIX-router" link set c0 mtu 1280
    out=$(ip netns exec "$PREFIX-client" "$E2E" transfer --vip 10.99.0.100 --port 9000 --download 2000000 --timeout 10) \
        || fail "a 2 MB IPv4 download through a 1280-byte link did not complete"
    say "IPv4 download through a 1280-byte hop: $out"
    out=$(ip netns exec "$PREFIX-client" "$E2E" transfer --vip fd99::100 --port 9000 --download 2000000 --timeout 10) \
        || fail "a 2 MB IPv6 download through a 1280-byte link did not complete"
    say "IPv6 download: $out"
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

# ---- a data plane that outlives its controller (lb attach --pin) ----

# A bpffs for this test's pins, mounted in this (the root) mount namespace: `ip netns exec`
# sees it and its pins outlive each command (one mounted inside `ip netns exec` would not).
pin_setup() { # MODE
    setup "$1"
    PINS="/run/$PREFIX-bpf"
    mkdir -p "$PINS"
    mount -t bpf bpf "$PINS"
    trap 'pin_teardown; teardown' EXIT
    web_pool "$WORK/pool.yaml" "1:1 2:1 3:1" ring
}

pin_teardown() {
    [ -n "${LBPID:-}" ] && kill -9 "$LBPID" 2>/dev/null && wait "$LBPID" 2>/dev/null
    LBPID=
    [ -n "${PINS:-}" ] || return 0
    ip netns exec "$PREFIX-lb" "$LB" detach eth0 --pin-dir "$PINS" >/dev/null 2>&1 || true
    umount "$PINS" 2>/dev/null || true
    rmdir "$PINS" 2>/dev/null || true
}

start_pinned() { # MODE [LB BINARY]
    local bin=${2:-$LB}
    ip netns exec "$PREFIX-lb" "$bin" attach eth0 --config "$WORK/pool.yaml" --xdp-mode "$1" --pin --pin-dir "$PINS" \
        --reload-delay 0.05 >>"$WORK/stats.out" 2>>"$WORK/lb.log" &
    LBPID=$!
    local n
    n=$(grep -c "serving;" "$WORK/lb.log" || true)
    for _ in $(seq 1 100); do
        [ "$(grep -c "serving;" "$WORK/lb.log" || true)" -gt "$n" ] && return 0
        kill -0 "$LBPID" 2>/dev/null || break
        sleep 0.05
    done
    cat "$WORK/lb.log" >&2
    fail "lb attach --pin did not start"
}

pin_status() { # FIELD... : a value from lb status --json (python3 reads it)
    ip netns exec "$PREFIX-lb" "$LB" status eth0 --json --pin-dir "$PINS" | python3 -c "
import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1:]:
    v = v[int(k)] if isinstance(v, list) else v[k]
print(json.dumps(v))" "$@"
}

# New connections without pause until $WORK/stop exists: each round is 500 connections from
# 5 addresses; every failure is kept in $WORK/churn.failed.
churn_start() {
    rm -f "$WORK/stop" "$WORK/churn.failed"
    (
        r=0
        while [ ! -f "$WORK/stop" ]; do
            ip netns exec "$PREFIX-client" "$E2E" probe --vip 10.99.0.100 --port 80 --sources "${CHURN_SOURCES:-$TOPO_CLIENTS4}" \
                --first-port $((30000 + (r % 20) * 100)) --count 100 --timeout-ms 1000 >"$WORK/churn.$r" 2>/dev/null
            grep FAIL "$WORK/churn.$r" >>"$WORK/churn.failed" || true
            r=$((r + 1))
        done
        echo "$r" >"$WORK/churn.rounds"
    ) &
    CHURN=$!
}

churn_stop() { # sets CHURN_SUMMARY to "N new connections, F failed"; fails if any failed
    touch "$WORK/stop"
    wait "$CHURN" || true
    local rounds failed
    rounds=$(cat "$WORK/churn.rounds")
    failed=$(grep -c . "$WORK/churn.failed" || true)
    CHURN_SUMMARY="$((rounds * 500)) new connections, $failed failed"
    [ "$rounds" -gt 0 ] || { CHURN_SUMMARY="no round of new connections ran"; return 1; }
    [ "$failed" -eq 0 ] || { head -5 "$WORK/churn.failed" >&2; return 1; }
}

test_pin_restart_kill_and_upgrade_lose_no_connection() { # MODE
    pin_setup "$1"
    start_pinned "$1"
    hold_open "$TOPO_CLIENTS4" 100 12
    local h=$HOLD before after out
    churn_start
    sleep 0.5
    before=$(pin_status status flows entries)
    [ "$before" -ge 100 ] || fail "the flow table holds $before entries with 100 connections open"

    # (1) SIGTERM, then a new controller adopts the data plane.
    kill -TERM "$LBPID"
    wait "$LBPID" || fail "SIGTERM exit status"
    grep -q "left the data plane on eth0 attached and pinned" "$WORK/lb.log" || fail "no 'left pinned' line"
    xdp_attached || fail "the program went with its controller"
    sleep 0.5
    start_pinned "$1"
    grep "adopted the data plane" "$WORK/lb.log" | tail -1 | grep -q "no service changed" || fail "adoption changed something"
    after=$(pin_status status flows entries)
    [ "$after" -ge 100 ] || fail "after adoption the flow table holds $after entries"
    say "(1) SIGTERM and a new controller: flow table $before entries before, $after after"

    # (2) kill -9: forwarding goes on with no controller; then a new one adopts.
    kill -9 "$LBPID"
    wait "$LBPID" 2>/dev/null || true
    LBPID=
    [ "$(pin_status controller)" = null ] || fail "lb status shows a controller after kill -9"
    local fwd0 fwd1
    fwd0=$(pin_status status forwarded)
    sleep 1
    fwd1=$(pin_status status forwarded)
    [ "$fwd1" -gt "$fwd0" ] || fail "nothing forwarded without a controller"
    start_pinned "$1"
    say "(2) kill -9: $((fwd1 - fwd0)) packets forwarded in 1 s with no controller (lb status: controller null); adopted again"

    # (3) An upgrade to a build whose flow-table value has one more field.
    kill -TERM "$LBPID"
    wait "$LBPID" || true
    start_pinned "$1" "$LB_NEXT"
    out=$(grep "adopted the data plane" "$WORK/lb.log" | tail -1)
    grep -q "an upgrade: new maps for flows" <<<"$out" || fail "no upgrade: $out"
    local carried
    carried=$(grep -o "[0-9]* tracked flows carried over" <<<"$out" | awk '{print $1}')
    [ "${carried:-0}" -ge 100 ] || fail "only ${carried:-0} tracked flows carried over: $out"
    after=$(pin_status status flows entries)
    [ "$after" -ge 100 ] || fail "after the upgrade the flow table holds $after entries"
    say "(3) upgrade: $carried tracked flows carried over into the new layout"
    # Tracked flows matter from here: every backend's weight changes, so the table moves, and
    # the held connections must keep their backends through the carried entries.
    web_pool "$WORK/pool.yaml" "1:3 2:2 3:1" ring
    wait_log "b1 weight 1 -> 3" 1

    wait "$h" || { cat "$WORK/hold.log" >&2; fail "a long-lived connection broke"; }
    churn_stop || fail "new connections: $CHURN_SUMMARY"
    say "$CHURN_SUMMARY; $(tail -1 "$WORK/hold.log" | sed 's/^hold: //')"

    # (5) lb detach leaves nothing pinned or attached.
    kill -TERM "$LBPID"
    wait "$LBPID" || true
    LBPID=
    ip netns exec "$PREFIX-lb" "$LB" detach eth0 --pin-dir "$PINS" >"$WORK/detach.out" || fail "lb detach"
    if xdp_attached; then fail "a program is left after lb detach"; fi
    [ -z "$(find "$PINS" -type f ! -name '*.debug')" ] || fail "pins left: $(find "$PINS" -type f ! -name '*.debug')"
    say "(5) $(cat "$WORK/detach.out")"
}

# ---- monitoring: a real Prometheus and a real browser ----

# GET http://127.0.0.1:9100$1 inside the load balancer's namespace.
lb_get() {
    ip netns exec "$PREFIX-lb" curl -sf --max-time 5 "http://127.0.0.1:9100$1"
}

# An instant query to the test's Prometheus; prints the result vector as "labels value" lines.
prom_query() { # QUERY
    ip netns exec "$PREFIX-lb" curl -sf --max-time 5 --data-urlencode "query=$1" http://127.0.0.1:9090/api/v1/query |
        python3 -c '
import json, sys
r = json.load(sys.stdin)["data"]["result"]
for s in r:
    print(s["metric"].get("backend", "-"), s["value"][1])'
}

test_metrics_prometheus_and_the_status_page() { # MODE
    setup "$1"
    command -v prometheus >/dev/null && command -v promtool >/dev/null || fail "prometheus is not installed (scripts/setup.sh installs it)"
    command -v chromium >/dev/null || fail "chromium is not installed (scripts/setup.sh installs it)"
    with_check "$WORK/pool.yaml" "{kind: tcp, interval: 300ms, timeout: 250ms, rise: 2, fall: 2}"
    # A backend whose name needs escaping, on a service of its own.
    cat >>"$WORK/pool.yaml" <<'EOF'
  - name: esc
    vip: 10.99.0.100
    port: 443
    backends: [{address: 10.99.0.11, name: '<i>&"q"'}]
EOF
    start_lb "$1" --metrics 127.0.0.1:9100
    # Only /metrics and / exist.
    ip netns exec "$PREFIX-lb" curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:9100/nothing | grep -q 404 || fail "unknown path is not 404"

    # promtool: exit 0, or 3 for lint remarks only; 1 is a parse error.
    lb_get /metrics >"$WORK/scrape.txt" || fail "no scrape"
    local rc=0
    promtool check metrics <"$WORK/scrape.txt" >"$WORK/promtool.out" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] || { cat "$WORK/promtool.out" >&2; fail "promtool check metrics: exit $rc"; }
    say "promtool check metrics: exit $rc ($(grep -c . "$WORK/scrape.txt") lines scraped)"

    # A real Prometheus scraping lb every second.
    mkdir -p "$WORK/prom"
    cat >"$WORK/prometheus.yml" <<EOF
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: lb
    static_configs: [{targets: ['127.0.0.1:9100']}]
EOF
    ip netns exec "$PREFIX-lb" prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prom" \
        --web.listen-address=127.0.0.1:9090 >"$WORK/prom.log" 2>&1 &
    echo $! >>"/tmp/$PREFIX.pids"
    for _ in $(seq 1 100); do ip netns exec "$PREFIX-lb" curl -sf http://127.0.0.1:9090/-/ready >/dev/null 2>&1 && break; sleep 0.1; done
    ip netns exec "$PREFIX-lb" curl -sf http://127.0.0.1:9090/-/ready >/dev/null || { tail -5 "$WORK/prom.log" >&2; fail "prometheus did not start"; }
    # Its first scrape comes a few seconds after it is ready (target discovery is batched).
    for _ in $(seq 1 150); do [ "$(prom_query 'up{job="lb"}' | awk '{print $2}')" = 1 ] && break; sleep 0.1; done
    [ "$(prom_query 'up{job="lb"}' | awk '{print $2}')" = 1 ] || fail "prometheus never scraped lb"

    # 1500 UDP queries (one packet each to lb), spread over about 5 s.
    local r
    for r in 0 1 2 4 5; do
        probe "$WORK/udp.$r" --udp --vip 10.99.0.100 --port 53 --sources "$TOPO_CLIENTS4" --first-port $((20000 + r * 100)) --count 60 || fail "UDP"
        sleep 1
    done
    cat "$WORK"/udp.* >"$WORK/udp"
    sleep 3
    # Per backend: what the clients saw answered, what Prometheus holds, and increase() over
    # the window of the traffic (within 20%: increase() extrapolates to the window's edges).
    local b sent held inc
    for b in b1 b2 b3; do
        sent=$(awk -v b="$b" '$3 == b' "$WORK/udp" | wc -l)
        held=$(prom_query "lb_forwarded_packets_total{service=\"dns\",backend=\"$b\"}" | awk '{print $2}')
        prom_query "increase(lb_forwarded_packets_total{service=\"dns\",backend=\"$b\"}[20s])" >"$WORK/inc.$b"
        inc=$(awk '{printf "%.0f", $2}' "$WORK/inc.$b")
        [ "${held:-x}" = "$sent" ] || fail "$b: clients got $sent answers, Prometheus holds ${held:-nothing}"
        awk -v a="$inc" -v s="$sent" 'BEGIN {exit !(a >= 0.8 * s && a <= 1.2 * s)}' || { ip netns exec "$PREFIX-lb" curl -s --data-urlencode "query=lb_forwarded_packets_total{service=\"dns\",backend=\"$b\"}[20s]" http://127.0.0.1:9090/api/v1/query >&2; fail "$b: increase() $inc for $sent packets"; }
        say "dns backend $b: $sent queries answered; lb_forwarded_packets_total $held; increase over 20 s $inc"
    done

    # A backend stopped by its health check shows health 0.
    topo_server_stop "$PREFIX" 2
    wait_log "web backend b2 10.99.0.12 is down" 1
    sleep 2.5
    [ "$(prom_query 'lb_backend_healthy{service="web",backend="b2"}' | awk '{print $2}')" = 0 ] || fail "Prometheus does not show b2 down"
    [ "$(prom_query 'lb_backend_healthy{service="web",backend="b1"}' | awk '{print $2}')" = 1 ] || fail "Prometheus does not show b1 up"
    say "after b2's server stopped, Prometheus shows lb_backend_healthy 0 for b2, 1 for b1"

    # The status page in headless Chromium: every service and backend with its health, the
    # escaped name, and a screenshot for people to look at.
    local chrome=(chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars)
    timeout 60 ip netns exec "$PREFIX-lb" "${chrome[@]}" --dump-dom http://127.0.0.1:9100/ >"$WORK/dom.html" 2>"$WORK/chrome.log" \
        || { tail -5 "$WORK/chrome.log" >&2; fail "chromium --dump-dom"; }
    local s
    for s in web sticky dns web6 esc; do grep -q "data-service=\"$s\"" "$WORK/dom.html" || fail "service $s missing from the page"; done
    grep -q 'data-backend="b1" data-health="up"' "$WORK/dom.html" || fail "b1 not shown up"
    grep -q 'data-backend="b2" data-health="down"' "$WORK/dom.html" || fail "b2 not shown down"
    grep -q '&lt;i&gt;&amp;"q"' "$WORK/dom.html" || fail "the escaped name is not in the page"
    if grep -q '<i>&' "$WORK/dom.html"; then fail "a name from the config reached the page unescaped"; fi
    mkdir -p target/artifacts
    timeout 60 ip netns exec "$PREFIX-lb" "${chrome[@]}" --window-size=1280,1100 --screenshot="$PWD/target/artifacts/status-page-$1.png" \
        http://127.0.0.1:9100/ >/dev/null 2>>"$WORK/chrome.log" || fail "chromium --screenshot"
    [ -s "target/artifacts/status-page-$1.png" ] || fail "no screenshot"
    say "Chromium: 5 services, b2 down, names escaped; screenshot target/artifacts/status-page-$1.png"
}

# ---- a fleet: two lb nodes announced by BGP (BIRD), ECMP on the router ----

fleet_pool() { # FILE BACKENDS
    local list="" i
    for i in $2; do list+="${list:+, }{address: 10.96.0.$((10 + i)), name: b$i}"; done
    printf 'services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    hash: flow\n    forward: %s\n    backends: [%s]\n' \
        "${FLEET_FORWARD:-l2}" "$list" >"$1.tmp"
    mv "$1.tmp" "$1"
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

fleet_forwarded() { # NODE: what lb status says the node forwarded
    ip netns exec "$PREFIX-$1" "$LB" status eth0 --json --pin-dir "$PINS" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"]["forwarded"])'
}

start_node() { # NODE MODE
    ip netns exec "$PREFIX-$1" "$LB" attach eth0 --config "$WORK/pool-$1.yaml" --xdp-mode "$2" --pin --pin-dir "$PINS" \
        --announce ifb0 --reload-delay 0.05 >"$WORK/stats-$1.out" 2>>"$WORK/lb-$1.log" &
    echo $! >"$WORK/lb-$1.pid"
    local n
    for _ in $(seq 1 100); do
        n=$(grep -c "serving;" "$WORK/lb-$1.log" || true)
        [ "${n:-0}" -ge "${3:-1}" ] && return 0
        sleep 0.05
    done
    cat "$WORK/lb-$1.log" >&2
    fail "lb on $1 did not start"
}

fleet_teardown() {
    local n
    for n in na nb; do
        [ -f "$WORK/lb-$n.pid" ] && kill -9 "$(cat "$WORK/lb-$n.pid")" 2>/dev/null || true
        ip netns exec "$PREFIX-$n" "$LB" detach eth0 --pin-dir "$PINS" >/dev/null 2>&1 || true
    done
    umount "$PINS" 2>/dev/null || true
    rmdir "$PINS" 2>/dev/null || true
    teardown
    if [ "$V" = 1 ]; then for f in "$WORK"/lb-n*.log "$WORK"/bird-*.log; do [ -f "$f" ] && sed "s|^|    $(basename "$f"): |" "$f"; done; fi
}

# Long-lived connections through the router: HOLD's pid once all are open.
fleet_hold() { # CONNECTIONS SECONDS LOG [HOLD ARGS]
    local n=$1 secs=$2 log=$3
    shift 3
    rm -f "$WORK/ready"
    ip netns exec "$PREFIX-client" "$E2E" hold --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" \
        --connections "$n" --seconds "$secs" --ready-file "$WORK/ready" "$@" 2>"$log" &
    HOLD=$!
    for _ in $(seq 1 200); do [ -f "$WORK/ready" ] && break; sleep 0.05; done
    [ -f "$WORK/ready" ] || { cat "$log" >&2; fail "connections did not open"; }
}

test_fleet_two_nodes_behind_ecmp_lose_no_connection() { # MODE [FORWARD]
    FLEET_FORWARD=${2:-l2}
    PREFIX="lbf$$${RANDOM}"
    WORK=$(mktemp -d /tmp/lb-e2e.XXXXXX)
    PINS="/run/$PREFIX-bpf"
    trap fleet_teardown EXIT
    trap 'exit 124' TERM INT
    command -v bird >/dev/null || fail "bird is not installed (scripts/setup.sh installs bird2)"
    topo_fleet_up "$PREFIX" "$1" || fail "fleet topology"
    mkdir -p "$PINS"
    mount -t bpf bpf "$PINS"
    if [ "$FLEET_FORWARD" != l2 ]; then
        # Encapsulated to the backends, which take the outer header off with lb decap.
        decap_up "$1"
    fi
    fleet_pool "$WORK/pool-na.yaml" "1 2 3"
    fleet_pool "$WORK/pool-nb.yaml" "1 2 3"
    # Both nodes compute the same table: lb table's digest says so before anything runs.
    [ "$("$LB" table --config "$WORK/pool-na.yaml" --json | grep -o '"digest":"[0-9a-f]*"')" = \
      "$("$LB" table --config "$WORK/pool-nb.yaml" --json | grep -o '"digest":"[0-9a-f]*"')" ] || fail "the nodes' tables differ"
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
    da=$(ip netns exec "$PREFIX-na" "$LB" status eth0 --json --pin-dir "$PINS" | grep -o '"digest":"[0-9a-f]*"')
    db=$(ip netns exec "$PREFIX-nb" "$LB" status eth0 --json --pin-dir "$PINS" | grep -o '"digest":"[0-9a-f]*"')
    [ "$da" = "$db" ] && [ -n "$da" ] || fail "live tables differ: $da / $db"
    [ "$da" = "$("$LB" table --config "$WORK/pool-na.yaml" --json | grep -o '"digest":"[0-9a-f]*"')" ] || fail "the live table is not the file's"
    say "(1) forward $FLEET_FORWARD: the router learned the VIP from both nodes by BGP in ${took} ms (2 next hops); both serve table ${da#*:}"

    # (1) New connections from many clients reach both nodes and land where the table says.
    probe "$WORK/flows" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 200 || fail "connections"
    "$E2E" check --config "$WORK/pool-na.yaml" --service web "$WORK/flows" >"$WORK/check.out" || { cat "$WORK/check.out" >&2; fail "check"; }
    local fa fb
    fa=$(fleet_forwarded na)
    fb=$(fleet_forwarded nb)
    [ "$fa" -gt 0 ] && [ "$fb" -gt 0 ] || fail "ECMP used one node only (forwarded $fa and $fb)"
    say "    1000 connections on their predicted backends; node A forwarded $fa packets, node B $fb"

    # (2) 200 long-lived connections; node A withdraws (its BIRD stops).
    fleet_hold 200 10 "$WORK/hold1.log"
    local h=$HOLD
    CHURN_SOURCES=$TOPO_RCLIENTS4
    churn_start
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
    wait "$h" || { cat "$WORK/hold1.log" >&2; fail "a long-lived connection broke during the failover"; }
    churn_stop || fail "new connections: $CHURN_SUMMARY"
    say "(3) node A back in ${took} ms; $(tail -1 "$WORK/hold1.log" | sed 's/^hold: //'); $CHURN_SUMMARY"

    # (4) A rolling pool change: b2 removed on A, then on B a few seconds later. No flow of
    # another backend breaks or moves at any point.
    probe "$WORK/before" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || fail "before the rolling change"
    fleet_hold 200 12 "$WORK/hold2.log" --allow-broken-on b2
    h=$HOLD
    fleet_pool "$WORK/pool-na.yaml" "1 3"
    for _ in $(seq 1 100); do grep -q "web changed (b2 removed" "$WORK/lb-na.log" && break; sleep 0.05; done
    grep -q "web changed (b2 removed" "$WORK/lb-na.log" || fail "node A did not reload"
    probe "$WORK/mixed" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || true
    "$E2E" compare "$WORK/before" "$WORK/mixed" --removed b2 --transition >"$WORK/cmp-mixed" \
        || { cat "$WORK/cmp-mixed" >&2; fail "with the nodes on different pools, a flow not on b2 failed or moved"; }
    sleep 2
    fleet_pool "$WORK/pool-nb.yaml" "1 3"
    for _ in $(seq 1 100); do grep -q "web changed (b2 removed" "$WORK/lb-nb.log" && break; sleep 0.05; done
    probe "$WORK/after" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || fail "after the rolling change"
    "$E2E" compare "$WORK/before" "$WORK/after" --removed b2 >"$WORK/cmp-after" || { cat "$WORK/cmp-after" >&2; fail "a flow not on b2 moved"; }
    say "(4) rolling change (b2 out on A, then on B 2 s later): $(grep -o '[0-9]* flows compared.*' "$WORK/cmp-after" | head -1)"

    # (5) kill -9 node A's lb: its pinned data plane keeps forwarding and its route stays.
    kill -9 "$(cat "$WORK/lb-na.pid")"
    sleep 0.5
    [ "$(vip_nexthops)" = 2 ] || fail "node A's route went with its controller"
    probe "$WORK/after-kill" --vip 10.99.0.100 --port 80 --sources "$TOPO_RCLIENTS4" --count 100 || fail "connections after kill -9"
    "$E2E" check --config "$WORK/pool-na.yaml" --service web "$WORK/after-kill" >"$WORK/check2.out" || { cat "$WORK/check2.out" >&2; fail "check after kill -9"; }
    wait "$h" || { cat "$WORK/hold2.log" >&2; fail "a long-lived connection of another backend broke"; }
    say "(5) kill -9 of node A's lb: route kept, 500 new connections on their backends; $(tail -1 "$WORK/hold2.log" | sed 's/^hold: //')"
}

# ---- runner ----

TESTS=(
    "test_3000_tcp_connections_follow_the_table native"
    "test_3000_tcp_connections_follow_the_table generic"
    "test_udp_and_ipv6_end_to_end native"
    "test_udp_and_ipv6_end_to_end generic"
    "test_client_ip_keeps_each_client_on_one_backend native"
    "test_client_ip_keeps_each_client_on_one_backend generic"
    "test_reload_under_traffic_moves_only_what_it_must native"
    "test_reload_under_traffic_moves_only_what_it_must generic"
    "test_long_lived_connections_survive_a_reload native"
    "test_long_lived_connections_survive_a_reload generic"
    "test_sigterm_and_kill_leave_the_interface_clean native"
    "test_sigterm_and_kill_leave_the_interface_clean generic"
    "test_bad_command_lines_fail_clearly_and_attach_nothing native"
    "test_health_a_stopped_backend_leaves_and_comes_back native"
    "test_health_a_stopped_backend_leaves_and_comes_back generic"
    "test_health_a_flapping_backend_does_not_churn_the_table native"
    "test_health_http_checks_honour_the_status_range native"
    "test_conntrack_keeps_established_connections_through_pool_changes native"
    "test_conntrack_keeps_established_connections_through_pool_changes generic"
    "test_conntrack_a_syn_flood_breaks_no_established_connection native on"
    "test_conntrack_a_syn_flood_breaks_no_established_connection native off"
    "test_encap_tcp_udp_ipv4_ipv6_through_a_router native ipip"
    "test_encap_tcp_udp_ipv4_ipv6_through_a_router native gue"
    "test_encap_tcp_udp_ipv4_ipv6_through_a_router generic ipip"
    "test_encap_tcp_udp_ipv4_ipv6_through_a_router generic gue"
    "test_encap_reload_moves_l2_to_ipip_under_traffic native"
    "test_encap_reload_moves_l2_to_ipip_under_traffic generic"
    "test_encap_backend_removed_under_traffic_moves_only_its_flows native"
    "test_encap_health_check_takes_a_stopped_backend_out native"
    "test_encap_tracked_connections_survive_a_reweight native"
    "test_encap_tracked_connections_survive_a_reweight generic"
    "test_encap_follows_a_route_change native"
    "test_pin_restart_kill_and_upgrade_lose_no_connection native"
    "test_pin_restart_kill_and_upgrade_lose_no_connection generic"
    "test_metrics_prometheus_and_the_status_page native"
    "test_fleet_two_nodes_behind_ecmp_lose_no_connection native"
    "test_fleet_two_nodes_behind_ecmp_lose_no_connection generic"
    "test_fleet_two_nodes_behind_ecmp_lose_no_connection native ipip"
    "test_encap_path_mtu_works_because_icmp_reaches_the_backend native ipip"
    "test_encap_path_mtu_works_because_icmp_reaches_the_backend native gue"
    "test_encap_path_mtu_works_because_icmp_reaches_the_backend generic ipip"
)

if [ "$(id -u)" -ne 0 ]; then
    echo "e2e.sh: needs root (network namespaces, XDP)" >&2
    exit 1
fi
[ -x "$LB" ] && [ -x "$E2E" ] || { echo "e2e.sh: build first: cargo build --release --bins --examples" >&2; exit 1; }

# One test in this process: e2e.sh --one "test_name mode".
if [ "${1:-}" = --one ]; then
    set -e
    # shellcheck disable=SC2086
    $2
    exit 0
fi

passed=0
failed=()
for t in "${TESTS[@]}"; do
    if [ $# -gt 0 ]; then
        match=0
        for f in "$@"; do [[ "$t" == *"$f"* ]] && match=1; done
        [ $match = 1 ] || continue
    fi
    started=$(date +%s%N)
    echo "== ${t/ / (}):"
    timeout -s TERM "$TEST_TIMEOUT" "$0" --one "$t"
    rc=$?
    ms=$((($(date +%s%N) - started) / 1000000))
    took="$((ms / 1000)).$((ms % 1000 / 100))"
    if [ $rc -eq 0 ]; then
        echo "   ok (${took}s)"
        passed=$((passed + 1))
    else
        [ $rc -eq 124 ] && echo "   timed out after ${TEST_TIMEOUT}s"
        echo "   FAILED (${took}s)"
        failed+=("$t")
    fi
done
echo "e2e: $passed passed, ${#failed[@]} failed"
for t in "${failed[@]}"; do echo "  failed: $t"; done
[ ${#failed[@]} -eq 0 ]
