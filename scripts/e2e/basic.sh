# shellcheck shell=bash
# Forwarding: real TCP, UDP and IPv6 clients land where the table says, on the bridge topology.

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
