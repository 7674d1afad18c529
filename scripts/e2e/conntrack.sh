# shellcheck shell=bash
# Connection tracking: established connections keep their backends through pool changes, and
# the guard keeps a SYN flood from washing the flow table out.

test_conntrack_keeps_established_connections_through_pool_changes() { # MODE
    setup "$1" 5
    web_pool "$WORK/pool.yaml" "1:1 2:1 3:2" ring
    start_lb "$1"
    hold_open "$TOPO_CLIENTS4" 300 6 --allow-broken-on b2
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
    hold_wait "an established connection on a surviving backend broke"
    say "$(hold_summary)"
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
        hold_wait "an established connection broke during the flood"
        [ $((ok * 100)) -ge $((total * 99)) ] || { grep " FAIL " "$WORK/during" | head -5 >&2; fail "only $ok of $total new connections succeeded during the flood"; }
        [ "$evicted" = 0 ] || fail "the flood evicted $evicted established flows"
        say "guard on: $(hold_summary)"
    else
        if wait "$HOLD"; then fail "with the guard off, no established connection broke: the test proves nothing"; fi
        [ "$evicted" -gt 0 ] || fail "with the guard off, nothing was evicted"
        say "guard off: $(hold_summary) (as expected without the guard)"
    fi
}
