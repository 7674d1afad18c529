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

# A spoofed-source flood at the VIP while 200 long-lived tracked flows run and every backend is
# reweighted and one added. KIND says what each spoofed source (a new address and port) sends:
#   syn      one SYN;
#   syn-ack  its SYN and then its bare ACK, back to back: a completed handshake as lb sees one
#            (lb never sees the backend's SYN-ACK), so each source's entry is promoted from the
#            half-open table into the flow table (issue 22, finding 3);
#   udp      two datagrams to a UDP service: the second promotes the first's entry the same way.
# GUARD on (lb's default): no held flow breaks, at least 99% of the new connections (or UDP
# exchanges) made during the flood succeed, at least 1,000,000 sources reached lb, lb dropped no
# packet, and for the SYN flood nothing was evicted (the pair floods evict on purpose: with
# finding 3's rule, their own unconfirmed entries give way to each other). GUARD off (syn only):
# the flood washes the flow table out and the reweight breaks held connections; the test then
# asserts that they broke, so that it proves the guard does something.
#
# The test measures lb, not the test's own network. The generator has its own port on the switch
# and sends from CPU 0; the clients run on CPU 1. lb's link has two queues each way, and the
# switch's port to lb sends what CPU 0 forwards to lb's first receive queue and what CPU 1
# forwards to its second (XPS), as a NIC's receive-side scaling gives a flood and a client's flow
# different queues. So when the flood fills its queue (the generator sends faster than lb takes
# in), the frames the switch drops are the flood's, not the clients' segments: before this, one
# run in six failed on an idle machine when a held connection's segment was dropped there once
# too often (docs/testing.md). Both queues feed the one flow table lb shares between CPUs. What
# the network still drops is counted and printed by outside_drops.
conntrack_flood() { # MODE GUARD KIND
    local guard=$2 kind=$3 port=80 proto=tcp
    local gen=(--new-every 1) probe_args=()
    case $kind in
        syn) ;;
        syn-ack) gen+=(--pairs) ;;
        udp) gen+=(--pairs --udp) port=53 proto=udp probe_args=(--udp) ;;
        *) fail "unknown flood $kind" ;;
    esac
    TOPO_LB_QUEUES=2 setup "$1" 4
    if [ "$(nproc)" -ge 2 ]; then
        ip netns exec "$PREFIX-sw" sh -c 'echo 1 >/sys/class/net/p-lb/queues/tx-0/xps_cpus && echo 2 >/sys/class/net/p-lb/queues/tx-1/xps_cpus' ||
            fail "XPS on the switch's port to lb"
        # shellcheck disable=SC2034 # probe and hold_open (lib.sh) read it
        CLIENT_CPU=1
    fi
    flood_pool "$WORK/pool.yaml" "1:1 2:1 3:1" "$port" "$proto"
    # A flow table of 65,536 slots: a flood of millions of sources overflows it many times.
    start_lb "$1" --conntrack-size 65536 --conntrack-guard "$guard" --stats-interval 1
    # b4 joins in the reweight during the flood. Its MAC goes into lb's neighbour table now, as
    # for a backend that is up before it is added: resolved during the flood, its ARP answer
    # would wait in lb's full veth ring, and the flood's packets for its slots be dropped as
    # no_mac meanwhile (a drop the test would count against lb, though it is the test network's).
    ip -n "$PREFIX-lb" neigh replace 10.99.0.14 lladdr "$(ip -n "$PREFIX-b4" link show eth0 | awk '/ether/{print $2}')" dev eth0 nud reachable
    # The generator: its own port on the switch (XDP_PASS there takes its frames in).
    topo_link "$PREFIX" gen
    ip -n "$PREFIX-gen" addr add 10.99.0.3/24 dev eth0
    topo_ns "$PREFIX-sw" "$E2E" xdp-pass p-gen
    local lbmac
    lbmac=$(ip -n "$PREFIX-lb" link show eth0 | awk '/ether/{print $2}')
    # Held flows wait up to 10 s for an answer: a client's segment the test's own queues drop
    # under the flood (outside lb, counted below) is retransmitted by TCP after 0.2, 0.6, 1.4,
    # 3.0, 6.2 s, which is a stall, not a break; a flow lb sends to another backend is reset or
    # answered by that backend at once, and lb itself must drop nothing (asserted below).
    if [ "$proto" = udp ]; then
        HOLD_PORT=53 hold_open "$TOPO_CLIENTS4" 200 14 --udp --patience 10
    else
        hold_open "$TOPO_CLIENTS4" 200 14 --patience 10
    fi
    # What the guard promises is for confirmed flows: a flow's packets a second after its
    # first (docs/security.md). The held connections send a round every 0.1 s or so; 1.5 s
    # confirms every one before the flood (in their first second a pair flood may displace
    # them, the youngest unconfirmed entries first).
    sleep 1.5
    local drops_before
    drops_before=$(outside_drops)
    # The flood lasts until the new flows and the reweight are done, at least 8 s, and until a
    # million sources have reached lb (at most 40 s): how fast the generator sends, and how much
    # of it the switch takes, depends on what else the machine runs.
    local started=$SECONDS
    ip netns exec "$PREFIX-gen" "$E2E" trafgen eth0 --dst-mac "$lbmac" --src 10.99.0.3 --dst 10.99.0.100 --dport "$port" \
        --seconds 40 --batch 262144 --stop-file "$WORK/flood.stop" "${gen[@]}" --cpus 0 --total >"$WORK/flood.out" &
    local flood=$!
    sleep 2
    # During the flood: new connections, and a reweight of every backend plus one more. Each
    # waits up to 5 s (SYNs are sent again after 1 and 3 s) and is tried twice.
    probe "$WORK/during" --vip 10.99.0.100 --port "$port" "${probe_args[@]}" --sources "$TOPO_CLIENTS4" --first-port 30000 --count 400 \
        --timeout-ms 5000 &
    local p=$!
    sleep 1
    flood_pool "$WORK/pool.yaml" "1:3 2:2 3:1 4:2" "$port" "$proto"
    wait_log "web changed" 1
    wait "$p" || true
    while kill -0 "$flood" 2>/dev/null; do
        if [ $((SECONDS - started)) -ge 8 ] && [ "$(flood_sources "$guard")" -ge 1050000 ]; then touch "$WORK/flood.stop"; fi
        sleep 0.5
    done
    wait "$flood" || fail "the flood generator failed"
    local rate sent ok total reached promoted evicted dropped drops_in drops_out drops_backlog retrans
    read -r rate sent <"$WORK/flood.out"
    read -r drops_in drops_out drops_backlog retrans <<<"$(outside_drops "$drops_before")"
    total=$(wc -l <"$WORK/during")
    ok=$(grep -vc " FAIL " "$WORK/during" || true)
    sleep 1.5
    reached=$(flood_sources "$guard")
    promoted=$(last_counter new)
    evicted=$(last_counter evicted)
    dropped=$(grep -o "dropped [0-9]*" "$WORK/stats.out" | tail -1 | cut -d' ' -f2)
    local what="spoofed SYNs" per=1
    [ "$kind" = syn-ack ] && what="spoofed SYN+ACK pairs" per=2
    [ "$kind" = udp ] && what="pairs of spoofed UDP datagrams" per=2
    say "flood: the generator sent $((sent / per)) $what ($rate packets per second), each from another source address and port;"
    say "  $reached sources reached lb through the switch; lb made $promoted flow-table entries and evicted $evicted"
    say "  lb dropped $dropped packets; outside lb, $drops_in frames found lb's veth full, $drops_out of lb's found the switch's port"
    say "  full, $drops_backlog were dropped from receive backlogs; the clients retransmitted $retrans TCP segments"
    say "new ${proto^^} flows during the flood: $ok of $total succeeded"
    [ "$reached" -ge 1000000 ] || fail "only $reached sources reached lb: not a flood of a million sources"
    if [ "$guard" = on ]; then
        hold_wait "an established flow broke during the flood"
        [ $((ok * 100)) -ge $((total * 99)) ] || { grep " FAIL " "$WORK/during" | head -5 >&2; fail "only $ok of $total new flows succeeded during the flood"; }
        if [ "$kind" = syn ]; then [ "$evicted" = 0 ] || fail "the flood evicted $evicted established flows"; fi
        [ "$dropped" = 0 ] || { grep -A1 "^stats at" "$WORK/stats.out" | tail -2 >&2; fail "lb dropped $dropped packets during the flood"; }
        say "guard on: $(hold_summary)"
    else
        if wait "$HOLD"; then fail "with the guard off, no established connection broke: the test proves nothing"; fi
        [ "$evicted" -gt 0 ] || fail "with the guard off, nothing was evicted"
        say "guard off: $(hold_summary) (as expected without the guard)"
    fi
}

# The conntrack floods' pool: web alone, backends "bN:WEIGHT ...", Maglev, on PORT over PROTOCOL
# (one file write, so that lb never reads a pool of the wrong protocol).
flood_pool() { # FILE BACKENDS PORT PROTOCOL
    local list="" b
    for b in $2; do
        list+="${list:+, }{address: 10.99.0.$((10 + ${b%%:*})), name: b${b%%:*}, weight: ${b##*:}}"
    done
    printf 'services:\n  - name: web\n    vip: 10.99.0.100\n    port: %s\n    protocol: %s\n    hash: flow\n    algorithm: maglev\n    backends: [%s]\n' \
        "$3" "$4" "$list" | write_atomic "$1"
}

# How many sources' first packets have reached lb so far (by its --stats-interval lines): recorded
# half-open with the guard, made into entries without it.
flood_sources() { # GUARD
    local n
    if [ "$1" = on ]; then n=$(last_counter pending); else n=$(last_counter new); fi
    echo "${n:-0}"
}

# What the test's own network lost, since BEFORE ("IN OUT BACKLOG RETRANS", default all 0): IN,
# frames the switch could not hand to lb's veth (its receive ring full: TX drops of the switch's
# port p-lb); OUT, frames lb sent that its veth could not hand back to the switch (TX drops of
# lb's eth0: its XDP_TX errors); BACKLOG, frames dropped from the CPUs' receive backlogs (the
# second column of /proc/net/softnet_stat, for the whole machine), which every frame crosses
# between a veth without XDP and its namespace's stack; RETRANS, the clients' retransmitted TCP
# segments, which tell whether the losses met the clients' own traffic.
outside_drops() { # [BEFORE]
    local b in out backlog retrans
    read -r -a b <<<"${1:-0 0 0 0}"
    in=$(ip -n "$PREFIX-sw" -s -j link show p-lb | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["dropped"])')
    out=$(ip -n "$PREFIX-lb" -s -j link show eth0 | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["dropped"])')
    backlog=$(python3 -c 'import sys; print(sum(int(l.split()[1], 16) for l in open("/proc/net/softnet_stat")))')
    # shellcheck disable=SC2016 # awk's own fields
    retrans=$(ip netns exec "$PREFIX-client" awk '/^Tcp:/ { if (seen) print $13; seen = 1 }' /proc/net/snmp)
    echo "$((in - b[0])) $((out - b[1])) $((backlog - b[2])) $((retrans - b[3]))"
}

test_conntrack_a_syn_flood_breaks_no_established_connection() { # MODE GUARD
    conntrack_flood "$1" "$2" syn
}

test_conntrack_a_syn_ack_flood_breaks_no_established_connection() { # MODE
    conntrack_flood "$1" on syn-ack
}

test_conntrack_a_udp_pair_flood_breaks_no_established_flow() { # MODE
    conntrack_flood "$1" on udp
}
