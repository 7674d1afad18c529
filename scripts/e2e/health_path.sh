# shellcheck shell=bash
# Health checks through the data path (`health_check: {via: vip}`): a backend whose own address
# answers every plain probe, while the path real connections take to it is broken. In turn on b2:
# its `lb decap` stopped (GUE and IPIP only: L2 needs none), the VIP gone from its loopback, its tunnel's
# packets (L2: its packets to the VIP) dropped by a firewall, its SYN-ACKs from the VIP dropped.
# For each, the control first: under plain probes b2 stays in and its share of new connections
# fails; then, probing through the VIP (a hot reload), b2 leaves within three probe intervals,
# new connections succeed, and b2 comes back once repaired.

# Probes every 300 ms, down after 2 failures: out within three intervals of the breaking.
HP_INTERVAL_MS=300
HP_CHECK="{kind: tcp, interval: ${HP_INTERVAL_MS}ms, timeout: 250ms, rise: 2, fall: 2"

# The pool: web on the VIP, port 80, forwarding FORWARD to BACKENDS ("name address ..."), its
# check's keys besides HP_CHECK's CHECK ("via: vip, signals: off"); then HP_EXTRA, the YAML of
# a test's other services.
hp_pool() { # FILE FORWARD CHECK BACKENDS...
    local file=$1 fwd=$2 check=$3 list=""
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
    health_check: $HP_CHECK, $check}
    backends: [$list]
${HP_EXTRA:-}
EOF
}

# HP_EXTRA for a topology whose backend i has the IPv6 address HEAD i TAIL: web6 on the IPv6
# VIP, HTTP health on 8081 through the VIP.
hp_web6() { # FORWARD HEAD TAIL
    local i list=""
    for i in 1 2 3; do list+="${list:+, }{address: '$2$i$3', name: b$i}"; done
    HP_EXTRA="  - name: web6
    vip: $TOPO_VIP6
    port: 8081
    forward: $1
    health_check: {kind: http, path: /healthz, interval: ${HP_INTERVAL_MS}ms, timeout: 250ms, rise: 2, fall: 2, via: vip, signals: off}
    backends: [$list]"
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

# Backend I's (b2's by default) breakage NAME, or its repair (REPAIR=1), in the topology TOPO
# (l2: the bridge; gue or ipip: the routed one, whose router is $PREFIX-router).
hp_break() { # TOPO NAME MODE [REPAIR] [I]
    local topo=$1 what=$2 mode=$3 repair=${4:-} b2="$PREFIX-b${5:-2}"
    case "$what/$repair" in
        decap/) topo_kill "$PREFIX" "$(cat "/tmp/$PREFIX-b2.decap.pid")" ;;
        decap/1)
            topo_routed_decap "$PREFIX" 2 "$mode"
            wait_until 100 0.05 grep -q serving "/tmp/$PREFIX-b2.decap.log" || fail "b2's decap did not restart"
            ;;
        vip/) ip -n "$b2" addr del 10.99.0.100/32 dev lo ;;
        vip/1) ip -n "$b2" addr add 10.99.0.100/32 dev lo ;;
        firewall/)
            if [ "$topo" != l2 ]; then
                # b2's own firewall comes after its XDP decap: the one in front of it drops the
                # tunnel (GUE, or IPIP and IPv6-in-IPv6).
                ip netns exec "$PREFIX-router" nft -f - <<EOF || fail "nft"
table inet hp {
    chain to_b2 {
        type filter hook forward priority 0;
        oifname "b2" udp dport 6080 drop
        oifname "b2" meta l4proto { 4, 41 } drop
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
            if [ "$topo" != l2 ]; then ip netns exec "$PREFIX-router" nft delete table inet hp; else ip netns exec "$b2" nft delete table inet hp; fi
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
    if [ "$topo" != l2 ]; then
        topo_routed_up "$PREFIX" 3 "$mode" || fail "routed topology"
        sources=$TOPO_RCLIENTS4 b2addr=10.97.2.2 breakages="decap vip firewall synack"
        set -- b1 10.97.1.2 b2 10.97.2.2 b3 10.97.3.2
        hp_web6 "$topo" fd97: ::2
    else
        topo_up "$PREFIX" 3 "$mode" || fail "topology"
        sources=$TOPO_CLIENTS4 b2addr=10.99.0.12 breakages="vip firewall synack"
        set -- b1 10.99.0.11 b2 10.99.0.12 b3 10.99.0.13
        hp_web6 l2 fd99::1 ""
    fi
    local fwd=$topo
    # Signals off: this test is about probes alone (signals have the test below).
    hp_pool "$WORK/pool.yaml" "$fwd" "via: backend, signals: off" "$@"
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
        hp_pool "$WORK/pool.yaml" "$fwd" "via: vip, signals: off" "$@"
        wait_log "web backend b2 $b2addr is down after 2 failed probes (through the VIP: " "$n"
        t1=$(date +%s%N)
        wait_log "web changed (b2 active -> down" "$n"
        # Three intervals, and the reload's own debounce (50 ms) and scheduling.
        [ $(((t1 - t0) / 1000000)) -le $((3 * HP_INTERVAL_MS + 300)) ] || fail "$what: b2 left $(((t1 - t0) / 1000000)) ms after the switch"
        hp_round "vip-$what" "$sources"
        failed=$HP_FAILED
        [ "$failed" -le 3 ] || fail "$what: $failed of 300 connections failed with b2 out"
        if grep -q ' b2$' "$WORK/vip-$what"; then fail "$what: b2 still gets new connections"; fi
        # Repaired: b2 comes back and serves again.
        hp_break "$topo" "$what" "$mode" 1
        wait_log "web backend b2 $b2addr is up after 2 good probes" "$n"
        wait_log "web changed (b2 down -> active" "$n"
        hp_round "back-$what" "$sources"
        failed=$HP_FAILED
        [ "$failed" -le 3 ] || fail "$what: $failed of 300 connections failed after the repair"
        grep -q ' b2$' "$WORK/back-$what" || fail "$what: b2 is back but gets no connection"
        if [ "$what" = decap ]; then
            # Its decap stopped, b2 failed IPv6 too: web6's HTTP probes through the VIP saw it.
            wait_log "web6 backend b2 fd97:2::2 is down after 2 failed probes (through the VIP: " 1
            wait_log "web6 backend b2 fd97:2::2 is up after 2 good probes" 1
        fi
        summary+="; $what: $control/300 failed plainly probed, out in $(((t1 - t0) / 1000000)) ms through the VIP, then $failed/300"
        hp_pool "$WORK/pool.yaml" "$fwd" "via: backend, signals: off" "$@"
        wait_log "reload (.*): .* applied in" "$((2 * n))"
    done
    # web6 (HTTP through the IPv6 VIP) saw b1 and b3 healthy throughout, from the start on.
    if grep -q "web6 backend b[13] .* is down" "$WORK/lb.log"; then fail "web6: a healthy backend failed its HTTP probe through the IPv6 VIP"; fi
    grep -q "service web6: " "$WORK/lb.log" || fail "web6 was not installed"
    say "${summary#; }; web6's HTTP probes through the IPv6 VIP: b1, b3 healthy throughout"
}

# wait_log with room for the signals' own pace: a window of readings, then probes at the check's
# interval, on a machine that runs other tests beside this one.
hp_wait_log() { # PATTERN COUNT
    wait_until 300 0.05 log_has "$1" "$2" "$WORK/lb.log" && return 0
    cat "$WORK/lb.log" >&2
    fail "no log line matching '$1' within 15 s"
}

# Signals from real traffic, under a steady stream of new connections and plain probes (which
# b2's own address passes throughout): loss on the clients' side takes no backend out; with
# `signals: off` (the control) b2, its SYN-ACKs from the VIP dropped, stays in and its share of
# connections fails; with signals on it stands out and fails through the VIP, but while lb's
# host drops the VIP's answers its peer fails too and nobody goes out; once they pass, b2 is
# out; a second broken backend (b3) stands out too but stays, a third being the limit;
# repaired, both are back.
test_health_signals_take_out_what_plain_probes_miss() { # MODE
    local mode=$1 t0 t1 n
    setup "$mode"
    set -- b1 10.99.0.11 b2 10.99.0.12 b3 10.99.0.13
    # api: HTTP on 8081 (the backends' status server, which answers with their names), checked
    # plainly at each backend's own address; quiet until its own step at the end.
    HP_EXTRA="  - name: api
    vip: 10.99.0.100
    port: 8081
    hash: flow
    forward: l2
    health_check: {kind: http, path: /healthz, interval: ${HP_INTERVAL_MS}ms, timeout: 250ms, rise: 2, fall: 2}
    backends: [{address: 10.99.0.11, name: b1}, {address: 10.99.0.12, name: b2}, {address: 10.99.0.13, name: b3}]"
    hp_pool "$WORK/pool.yaml" l2 "via: backend" "$@"
    start_lb "$mode" --metrics 127.0.0.1:9100
    CHURN_COUNT=40 CHURN_TIMEOUT_MS=300 churn_start

    # Loss on the clients' side: a fifth of what the VIP sends them dropped, for every backend.
    ip netns exec "$PREFIX-client" nft -f - <<NFT || fail "nft"
table inet loss {
    chain in {
        type filter hook input priority 0;
        ip saddr 10.99.0.100 tcp sport 80 numgen random mod 100 < 20 drop
    }
}
NFT
    sleep 7
    ip netns exec "$PREFIX-client" nft delete table inet loss
    if grep -q "signals: " "$WORK/lb.log"; then fail "loss on the clients' side made a suspect: $(grep "signals: " "$WORK/lb.log" | head -3)"; fi
    lb_scrape "$WORK/m0"
    local again1
    again1=$(awk '$1 == "lb_backend_signals_total{service=\"web\",backend=\"b1\",signal=\"syn_again\"}" {print $2}' "$WORK/m0")
    [ "${again1:-0}" -gt 0 ] || fail "the clients' loss left no SYN sent again on b1 (${again1:-no series})"

    # The control: signals off, b2's SYN-ACKs from the VIP dropped; it stays in.
    sed -i 's/via: backend}/via: backend, signals: off}/' "$WORK/pool.yaml"
    wait_log "reload (.*): .* applied in" 1
    hp_break l2 synack "$mode"
    sleep 6
    if grep -q "signals: " "$WORK/lb.log"; then fail "signals: off still judged"; fi
    hp_round control "$TOPO_CLIENTS4"
    local control=$HP_FAILED
    [ "$control" -ge 30 ] || fail "only $control of 300 connections failed with b2 broken and no signals"

    # Signals on, while lb's own host drops what the VIP answers it: b2 stands out and fails
    # through the VIP, but so does its peer (the control), so the way through the VIP is at
    # fault: nobody goes out.
    ip netns exec "$PREFIX-lb" nft -f - <<NFT || fail "nft"
table inet hp {
    chain in {
        type filter hook input priority 0;
        ip saddr 10.99.0.100 tcp sport 80 drop
    }
}
NFT
    sed -i 's/, signals: off}/}/' "$WORK/pool.yaml"
    hp_wait_log "signals: web backend b2 10.99.0.12 stands out" 1
    hp_wait_log "signals: web's peer b1 10.99.0.11 fails through the VIP too (through the VIP: timeout): the way through the VIP is at fault, not its suspects; none goes out" 1
    sleep 1
    if grep -q "): out (" "$WORK/lb.log"; then fail "a suspect went out while its peer failed through the VIP too"; fi
    # The way through the VIP works again: b2 fails it alone, and is out.
    t0=$(date +%s%N)
    ip netns exec "$PREFIX-lb" nft delete table inet hp
    hp_wait_log "signals: web backend b2 10.99.0.12 fails through the VIP too (through the VIP: timeout, [0-9]* in a row; its peer passes): out (1 of 3" 1
    t1=$(date +%s%N)
    wait_log "health: applied in" 1
    hp_round out "$TOPO_CLIENTS4"
    [ "$HP_FAILED" -le 3 ] || fail "$HP_FAILED of 300 connections failed with b2 out"
    if grep -q ' b2$' "$WORK/out"; then fail "b2 out, yet it gets new connections"; fi
    lb_scrape "$WORK/m1"
    grep -q '^lb_backend_signal_out{service="web",backend="b2"} 1$' "$WORK/m1" || fail "lb_backend_signal_out of b2 is not 1"
    grep -q '^lb_backend_signal_out{service="web",backend="b1"} 0$' "$WORK/m1" || fail "lb_backend_signal_out of b1 is not 0"
    n=$(awk '$1 == "lb_backend_signals_total{service=\"web\",backend=\"b2\",signal=\"syn_again\"}" {print $2}' "$WORK/m1")
    [ "${n:-0}" -ge 20 ] || fail "b2's SYNs sent again: ${n:-no series}"
    lb_scrape "$WORK/page.html" /
    grep -q '<td class="signals">[0-9]* SYNs again, [0-9]* resets of [0-9]* connections, [0-9]* without data of [0-9]* handshakes; out</td>' "$WORK/page.html" || fail "the status page does not show b2's signals"

    # b3 broken too: it stands out and fails through the VIP, but a third of three is out.
    hp_break l2 synack "$mode" "" 3
    hp_wait_log "signals: web backend b3 10.99.0.13 fails through the VIP too (through the VIP: timeout), but 1 of 3 are out by this rule already (at most a third): it stays" 1
    [ "$(grep -c "): out (" "$WORK/lb.log")" -eq 1 ] || fail "more than a third out by signals"
    lb_scrape "$WORK/m1b"
    grep -q '^lb_backend_signal_suspect{service="web",backend="b3"} 1$' "$WORK/m1b" || fail "lb_backend_signal_suspect of b3 is not 1"
    grep -q '^lb_backend_signal_out{service="web",backend="b3"} 0$' "$WORK/m1b" || fail "b3, held in, is out by the metrics"
    grep -q '^lb_backend_signal_suspect{service="web",backend="b1"} 0$' "$WORK/m1b" || fail "lb_backend_signal_suspect of b1 is not 0"

    # Repaired: both pass through the VIP; b2 is back, b3 no longer a suspect.
    hp_break l2 synack "$mode" 1
    hp_break l2 synack "$mode" 1 3
    hp_wait_log "signals: web backend b2 10.99.0.12 passes 2 probes through the VIP in a row: back" 1
    hp_wait_log "signals: web backend b3 10.99.0.13 passes 2 probes through the VIP in a row: no longer a suspect" 1
    wait_log "health: applied in" 2
    churn_stop 2>/dev/null || true
    hp_round back "$TOPO_CLIENTS4"
    [ "$HP_FAILED" -le 3 ] || fail "$HP_FAILED of 300 connections failed after the repair"
    grep -q ' b2$' "$WORK/back" || fail "b2 is back but gets no connection"
    local summary
    summary="clients' loss: no suspect (b1's SYNs again: $again1); signals off: $control/300 failed; on, lb's host dropping the VIP's answers: b2 a suspect, its peer failing too, nobody out; the way back: b2 out in $(((t1 - t0) / 1000000)) ms, then $(grep -c FAIL "$WORK/out" || true)/300; b3 broken too stayed in (a third); repaired: both back"
    hp_no_data "$mode"
    if grep -q "plain probes\|is down after" "$WORK/lb.log"; then fail "a plain probe failed"; fi
    say "$summary; $HP_SUMMARY"
}

# The third signal, on api: b2 completes every handshake, then none of its data from the VIP
# leaves (nft drops what carries PSH, as a return path that loses full-size packets would), while
# its own address answers api's plain HTTP probe. Under a steady stream of requests its clients
# give up and close having acknowledged nothing: b2 stands out by its ends without data alone
# (no SYN again, no early reset), fails the HTTP check sent through the VIP, and is out; requests
# then succeed; repaired, b2 is back. HP_SUMMARY says what happened.
hp_no_data() { # MODE
    local start out_ms repaired_ms failed total before loader applied
    applied=$(grep -c "health: applied in" "$WORK/lb.log" || true)
    start=$(date +%s%3N)
    ip netns exec "$PREFIX-client" "$E2E" load --vip 10.99.0.100 --port 8081 --rate 60 --seconds 30 --workers 64 --timeout 0.5 --out "$WORK/api.load" >/dev/null 2>&1 &
    loader=$!
    sleep 3
    local broke
    broke=$(($(date +%s%3N) - start))
    ip netns exec "$PREFIX-b2" nft -f - <<NFT || fail "nft"
table inet quiet {
    chain from_vip {
        type filter hook output priority 0;
        ip saddr 10.99.0.100 tcp sport 8081 tcp flags & psh == psh drop
    }
}
NFT
    hp_wait_log "signals: api backend b2 10.99.0.12 stands out: [0-9]* SYNs sent again, [0-9]* early resets and [1-9][0-9]* ends without data" 1
    # By its ends without data: its failed handshakes (a few SYNs sent again, on a loaded
    # machine) are under the rule's 0.5 a connection.
    local line again resets conns
    line=$(grep -m1 "signals: api backend b2 10.99.0.12 stands out" "$WORK/lb.log")
    read -r again resets conns < <(sed -E 's/.*stands out: ([0-9]+) SYNs sent again, ([0-9]+) early resets and [0-9]+ ends without data for ([0-9]+) connections.*/\1 \2 \3/' <<<"$line")
    [ $((2 * (again + resets))) -lt "$conns" ] || fail "b2 stood out by its failed handshakes, not by its ends without data: $line"
    hp_wait_log "signals: api backend b2 10.99.0.12 fails through the VIP too (through the VIP: [^,]*, [0-9]* in a row; its peer passes): out (1 of 3" 1
    wait_log "health: applied in" $((applied + 1))
    out_ms=$(($(date +%s%3N) - start))
    sleep 4
    repaired_ms=$(($(date +%s%3N) - start))
    ip netns exec "$PREFIX-b2" nft delete table inet quiet
    hp_wait_log "signals: api backend b2 10.99.0.12 passes 2 probes through the VIP in a row: back" 1
    wait "$loader" || true
    # Before: b2's share of requests failed. Once out (from half a second after lb applied it,
    # for requests begun then, to the repair): at least 99% succeed, none on b2.
    before=$(awk -v a="$broke" -v b="$out_ms" '$1 >= a + 1000 && $1 < b - 1000 && $2 == "FAIL"' "$WORK/api.load" | wc -l)
    [ "$before" -ge 10 ] || fail "only $before requests failed with b2 broken and in"
    total=$(awk -v a="$out_ms" -v b="$repaired_ms" '$1 >= a + 500 && $1 < b - 600' "$WORK/api.load" | wc -l)
    failed=$(awk -v a="$out_ms" -v b="$repaired_ms" '$1 >= a + 500 && $1 < b - 600 && $2 == "FAIL"' "$WORK/api.load" | wc -l)
    [ "$total" -ge 100 ] || fail "only $total requests while b2 was out"
    [ $((failed * 100)) -le "$total" ] || fail "$failed of $total requests failed while b2 was out"
    if awk -v a="$out_ms" -v b="$repaired_ms" '$1 >= a + 500 && $1 < b - 600 && $2 == "b2"' "$WORK/api.load" | grep -q .; then fail "b2 answered requests begun while it was out"; fi
    grep -q ' b2 ' "$WORK/api.load" || fail "b2 answered no request at all (before its breaking)"
    local n
    lb_scrape "$WORK/m2"
    n=$(awk '$1 == "lb_backend_signals_total{service=\"api\",backend=\"b2\",signal=\"no_data\"}" {print $2}' "$WORK/m2")
    [ "${n:-0}" -ge 10 ] || fail "b2's ends without data: ${n:-no series}"
    HP_SUMMARY="api, b2's data lost: $before requests failed, b2 out by no_data alone ($n ends without data) $((out_ms - broke)) ms after the breaking (lb applied), then $failed/$total failed"
}
