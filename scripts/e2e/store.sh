# shellcheck shell=bash
# The fleet's store end to end (docs/fleet.md, "The store"): a three-member etcd cluster (Debian's
# etcd-server) in namespaces of its own on the nodes' link, three lb nodes with
# --config etcd://..., BIRD with ECMP, and four GUE backends running `lb decap --second-chance`
# (the second-chance topology, scripts/lib/topology.sh topo_chaos_up). No pool file and no
# previous file anywhere on a node: every change is `lb push`.
#   round 1: the pool changes (b4 added, b1 reweighted), pushed, and node C starts fresh from the
#            store and joins the ECMP set;
#   round 2: node A's link goes down while b2 drains, pushed;
# then, with second chance's previous pool from the store: one node firewalled from b3's checks
# (b3 stays everywhere), b3's checks failing for every node (it leaves every table at one
# revision); an agent that answers each node differently (the nodes agree); an invalid pool
# written straight into etcd (no node applies it); two pushes from one base (one conflicts);
# one member killed (pushes and watches go on); every member killed (nothing breaks, the nodes
# say so, and catch up when the store returns). The control pushes with etcdctl, which writes no
# previous pool: connections must break.

ST_MEMBERS="1 2 3"

st_endpoints() { echo "10.96.0.21:2379,10.96.0.22:2379,10.96.0.23:2379"; }
st_url() { echo "etcd://$(st_endpoints)/lb/pool"; }

# Member I of the cluster, in namespace $PREFIX-eI at 10.96.0.2I on the nodes' link; its data
# survives a kill (the same directory), so that a restart rejoins.
st_member_start() { # I
    local i=$1 ns="$PREFIX-e$1" cluster=""
    for m in $ST_MEMBERS; do cluster+="${cluster:+,}e$m=http://10.96.0.2$m:2380"; done
    ip netns exec "$ns" etcd --name "e$i" --data-dir "$WORK/etcd-e$i" \
        --listen-client-urls "http://10.96.0.2$i:2379" --advertise-client-urls "http://10.96.0.2$i:2379" \
        --listen-peer-urls "http://10.96.0.2$i:2380" --initial-advertise-peer-urls "http://10.96.0.2$i:2380" \
        --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$PREFIX" \
        --heartbeat-interval 50 --election-timeout 500 --auto-compaction-mode revision --auto-compaction-retention 1000 --logger zap --log-level error >>"$WORK/etcd-e$i.log" 2>&1 &
    echo $! >"$WORK/etcd-e$i.pid"
    echo $! >>"/tmp/$PREFIX.pids"
}

st_member_kill() { # I
    local p
    p=$(cat "$WORK/etcd-e$1.pid")
    { kill -9 "$p" && wait "$p"; } 2>/dev/null || true
    rm -f "$WORK/etcd-e$1.pid"
}

st_etcdctl() { ip netns exec "$PREFIX-e1" etcdctl --endpoints "$(st_endpoints)" --command-timeout 3s "$@"; }

st_cluster_up() {
    local i
    for i in $ST_MEMBERS; do
        topo_link "$PREFIX" "e$i"
        ip -n "$PREFIX-e$i" addr add "10.96.0.2$i/24" dev eth0
    done
    for i in $ST_MEMBERS; do st_member_start "$i"; done
    wait_until 100 0.1 st_etcdctl endpoint health >/dev/null 2>&1 || { cat "$WORK"/etcd-e*.log >&2; fail "the etcd cluster did not come up"; }
}

# The pool: web, maglev, tracked, GUE, second chance on, a TCP check on the backends' 8080,
# on backends SPEC... (I, I:WEIGHT or I:drain); AGENT: "agent" adds a load agent on port 5555.
st_pool() { # FILE AGENT SPEC...
    local file=$1 agent=$2 list
    shift 2
    list=$(sc_backends "$@")
    {
        printf 'services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    hash: flow\n    algorithm: maglev\n'
        printf '    forward: gue\n    second_chance: on\n'
        printf '    health_check: {kind: tcp, port: 8080, interval: 300ms, timeout: 200ms, rise: 2, fall: 2}\n'
        if [ "$agent" = agent ]; then printf '    agent: {port: 5555, interval: 1s, timeout: 300ms}\n'; fi
        printf '    backends: [%s]\n' "$list"
    } | write_atomic "$file"
}

# A push of FILE: `lb push` (with the previous pool), or, in the control, etcdctl (without).
st_push() { # FILE HOW
    if [ "$2" = lb ]; then
        ip netns exec "$PREFIX-e1" "$LB" push "$1" --to "$(st_url)" >>"$WORK/push.log" 2>&1 || { cat "$WORK/push.log" >&2; fail "lb push $1"; }
    else
        st_etcdctl put /lb/pool <"$1" >/dev/null || fail "etcdctl put $1"
    fi
}

# lb attach --config etcd://... on NODE; returns once it serves.
st_start_node() { # NODE MODE
    local before
    before=$(grep -c "serving;" "$WORK/lb-$1.log" 2>/dev/null || true)
    ip netns exec "$PREFIX-$1" "$LB" attach eth0 --config "$(st_url)" --node-name "$1" --xdp-mode "$2" --pin --pin-dir "$PINS" \
        --announce ifb0 --metrics 127.0.0.1:9100 >"$WORK/stats-$1.out" 2>>"$WORK/lb-$1.log" &
    echo $! >"$WORK/lb-$1.pid"
    wait_serving "$WORK/lb-$1.log" "${before:-0}" "$(cat "$WORK/lb-$1.pid")" "lb on $1" 200
}

# The lines of each node's log so far: st_spread and st_logged look only at the lines after.
declare -gA ST_FROM=()
st_mark() {
    local n
    for n in $TOPO_CHAOS_NODES; do ST_FROM[$n]=$(wc -l <"$WORK/lb-$n.log" 2>/dev/null || echo 0); done
}

# Whether NODE's log has a line matching PATTERN after the last st_mark.
st_logged() { # NODE PATTERN
    tail -n "+$((${ST_FROM[$1]:-0} + 1))" "$WORK/lb-$1.log" 2>/dev/null | grep -- "$2" >/dev/null
}

# Until each NODE's log has a line matching PATTERN (after the last st_mark): prints the
# milliseconds between the first and the last node's (polled every 10 ms, at most 10 s).
st_spread() { # PATTERN NODE...
    local pattern=$1 n t0 first="" last="" left
    shift
    declare -A at=()
    t0=$(date +%s%N)
    for _ in $(seq 1 1000); do
        left=0
        for n in "$@"; do
            [ -n "${at[$n]:-}" ] && continue
            if st_logged "$n" "$pattern"; then at[$n]=$(date +%s%N); else left=1; fi
        done
        [ "$left" = 0 ] && break
        sleep 0.01
    done
    for n in "$@"; do
        [ -n "${at[$n]:-}" ] || fail "node $n has no line matching '$pattern' after $((($(date +%s%N) - t0) / 1000000)) ms"
        first=$(( ${first:-${at[$n]}} < at[$n] ? ${first:-${at[$n]}} : at[$n] ))
        last=$(( ${last:-0} > at[$n] ? ${last:-0} : at[$n] ))
    done
    echo $(((last - first) / 1000000))
}

# A metric's value as NODE's --metrics serves it.
st_metric() { # NODE NAME
    ip netns exec "$PREFIX-$1" curl -s --max-time 2 http://127.0.0.1:9100/metrics | awk -v m="$2" '$1 == m {print $2}'
}

# lb fleet's JSON, from the first member's namespace.
st_fleet() { ip netns exec "$PREFIX-e1" "$LB" fleet "$(st_url)" --json; }

# Whether lb fleet says N live nodes serve the newest pool alike.
st_agrees() { # N
    st_fleet 2>/dev/null | python3 -c 'import json, sys; v = json.load(sys.stdin); sys.exit(0 if v["agree"] and len(v["nodes"]) == int(sys.argv[1]) else 1)' "$1"
}

# Until lb fleet says every live node (N of them) serves the newest pool alike (at most 30 s: a
# node whose lease lapsed while CI starved it of CPU is back once its store thread has granted a
# new one and written its view again, after a back-off of up to 5 s; CI once saw a node's view
# missing for more than 10 s in the generic run). On failure, each node's store lines.
st_agree() { # N
    local n
    wait_until 300 0.1 st_agrees "$1" && return 0
    st_fleet >&2
    for n in na nb nc; do
        [ -f "$WORK/lb-$n.log" ] && grep -E "store|fleet|lease|view" "$WORK/lb-$n.log" | tail -8 | sed "s/^/      $n: /" >&2
    done
    fail "the fleet's $1 nodes never agreed"
}

# Whether lb fleet names N nodes that refused revision REV.
st_refusals() { # REV N
    [ "$(ip netns exec "$PREFIX-e1" "$LB" fleet "$(st_url)" 2>/dev/null | grep -c "refused revision $1")" = "$2" ]
}

# Whether the nodes' views name, for web, the backends DOWN says: "na=b3 nb= nc=".
st_views_down() { # DOWN
    [ "$(st_fleet 2>/dev/null | python3 -c 'import json, sys; print(" ".join(n["node"] + "=" + ",".join(n["down"].get("web", [])) for n in json.load(sys.stdin)["nodes"]))')" = "$1" ]
}

st_teardown() {
    local n f p
    # Killed and reaped here, quietly (bash reports a killed job it reaps later).
    for f in "$WORK"/lb-n?.pid "$WORK"/etcd-e?.pid; do
        [ -f "$f" ] || continue
        p=$(cat "$f")
        { kill -9 "$p" && wait "$p"; } 2>/dev/null || true
    done
    # shellcheck disable=SC2086 # the list of nodes
    pins_down $TOPO_CHAOS_NODES
    if [ "$V" = 1 ]; then
        for f in "$WORK"/lb-n*.log "$WORK"/push.log "$WORK"/etcd-e*.log; do [ -f "$f" ] && sed "s|^|    $(basename "$f"): |" "$f"; done
    fi
    teardown
}

test_store_fleet_follows_one_store_and_loses_no_connection() { # MODE lb|etcdctl
    local mode=$1 how=$2 ms keep=() broken1 broken2 hold_failed=0 rev n want
    begin_test lbs st_teardown
    command -v bird >/dev/null || fail "bird is not installed (scripts/setup.sh test installs bird2)"
    command -v etcd >/dev/null || fail "etcd is not installed (scripts/setup.sh test installs etcd-server)"
    [ "$how" = etcdctl ] && keep=(--keep-going)
    topo_chaos_up "$PREFIX" "$mode" "--second-chance --stats-interval 1" || fail "topology"
    st_cluster_up
    pins_up
    st_pool "$WORK/p0.yaml" "" 1 2 3
    st_push "$WORK/p0.yaml" "$how"
    st_start_node na "$mode"
    st_start_node nb "$mode"
    {
        sed -e 's/@ROUTER@/10.96.0.1/g' -e 's/@NODE_A@/10.96.0.2/g' -e 's/@NODE_B@/10.96.0.3/g' configs/bird/router.conf
        printf 'protocol bgp node_c from node {\n\tneighbor 10.96.0.4 as 65001;\n}\n'
    } >"$WORK/router.conf"
    bird_start router "$PREFIX-router" "$WORK/router.conf"
    sc_bird_node na 10.96.0.2
    sc_bird_node nb 10.96.0.3
    sc_bird_node nc 10.96.0.4
    wait_nexthops 2 30 >/dev/null || fail "the router never learned nodes A and B"
    say "store, $mode, pushed by $how: nodes A and B follow $(st_url); C peered and silent"

    # Round 1: the pool change is pushed (b4 added, b1 reweighted) and node C starts fresh from
    # the store and joins the ECMP set: it picks up the connections ECMP moves to it under the
    # new pool, knowing the old one only as the store's previous pool.
    HOLD_TRIES=400 hold_open "$TOPO_RCLIENTS4" 300 12 --patience 12 ${keep[@]+"${keep[@]}"}
    CHURN_COUNT=20 CHURN_TIMEOUT_MS=4000 churn_start "$TOPO_RCLIENTS4"
    sleep 1.5
    st_pool "$WORK/p1.yaml" "" 1:2 2 3 4
    st_push "$WORK/p1.yaml" "$how"
    rev=$(st_etcdctl get /lb/pool -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["kvs"][0]["mod_revision"])')
    ms=$(st_spread "reload (store revision $rev)" na nb)
    st_start_node nc "$mode"
    grep -q "following .* (pool revision $rev) as node nc" "$WORK/lb-nc.log" || fail "node C did not start from revision $rev"
    sc_wait_nexthops 3 || fail "node C did not join the ECMP set"
    wait "$HOLD" || hold_failed=1
    broken1=$(sc_broken)
    CHURN_COUNT=20 churn_stop || fail "round 1, new connections: $CHURN_SUMMARY"
    say "(1) revision $rev was pushed: A and B applied it within ${ms} ms of each other, and C started from it and joined;"
    say "    C picked up $(sc_adopted nc) flows in mid-connection; $(hold_summary); $CHURN_SUMMARY"
    if [ "$how" = lb ]; then
        st_agree 3
        # The tables lb table computes from the pool and the pool it replaced.
        { printf 'previous: p0.yaml\n'; cat "$WORK/p1.yaml"; } >"$WORK/p1-files.yaml"
        want=$(table_digest "$WORK/p1-files.yaml")
        for n in na nb nc; do
            [ "$(live_digest "$n")" = "$want" ] || fail "node $n serves another table than lb table computes from the pushed pools"
        done
        say "    lb fleet: 3 nodes at revision $rev, one digest ($(grep -o '[0-9a-f]\{16\}' <<<"$want")), the one lb table computes"
    fi

    # Round 2: A's link goes down while b2 drains.
    HOLD_TRIES=400 hold_open "$TOPO_RCLIENTS4" 300 14 --patience 12 --first-port 41000 ${keep[@]+"${keep[@]}"}
    CHURN_COUNT=20 CHURN_TIMEOUT_MS=4000 churn_start "$TOPO_RCLIENTS4"
    sleep 1.5
    st_pool "$WORK/p2.yaml" "" 1:2 2:drain 3 4
    ip -n "$PREFIX-na" link set eth0 down
    st_push "$WORK/p2.yaml" "$how"
    rev=$(st_etcdctl get /lb/pool -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["kvs"][0]["mod_revision"])')
    ms=$(st_spread "reload (store revision $rev)" nb nc)
    wait_nexthops 2 30 >/dev/null || fail "the router never dropped node A"
    wait "$HOLD" || hold_failed=1
    broken2=$(sc_broken)
    CHURN_COUNT=20 churn_stop || fail "round 2, new connections: $CHURN_SUMMARY"
    say "(2) A's link went down and revision $rev (b2 drains) was pushed: B and C applied it within ${ms} ms;"
    say "    $(hold_summary); $CHURN_SUMMARY; backends sent $(sc_decap sent_on) packets on in all"

    if [ "$how" = etcdctl ]; then
        [ $((broken1 + broken2)) -gt 0 ] || fail "the control (no previous pool in the store) broke no connection: the test proves nothing"
        say "control (pushed without the previous pool): $broken1 of 300 connections broken in round 1, $broken2 of 300 in round 2"
        return 0
    fi
    if [ "${broken1:-1}" != 0 ] || [ "${broken2:-1}" != 0 ] || [ "$hold_failed" != 0 ]; then
        fail "connections broke: $broken1 in round 1, $broken2 in round 2"
    fi
    say "0 of 300 connections broken in either round, with no previous file anywhere"

    # A comes back: its link up, its lb catches up with the store.
    ip -n "$PREFIX-na" link set eth0 up
    ip -n "$PREFIX-na" route replace default via 10.96.0.1
    st_agree 3
    say "(3) A's link is back: A caught up to revision $rev; lb fleet shows one digest"
    # The faults take the same paths in either XDP mode (docs/testing.md, "Native and generic").
    [ "$mode" = native ] || return 0
    st_store_faults "$mode"
}

# The store's other promises, on the three nodes that agree.
st_store_faults() { # MODE
    local rev digest n r
    digest=$(live_digest nb)
    # From here on, only what each node logs from now counts (A decided alone while its link was
    # down, and said so).
    st_mark
    # One node cut off from b3's checks: b3 stays in every table.
    ip netns exec "$PREFIX-na" nft -f - <<NFT || fail "node A's firewall"
table ip lbtest {
    chain out {
        type filter hook output priority 0; policy accept;
        ip daddr 10.97.3.2 tcp dport 8080 counter drop
    }
}
NFT
    wait_until 100 0.1 st_logged na "web backend b3 .* is down after 2 failed probes.*this node tells the fleet" || fail "node A never saw b3 down"
    # A's view in the store says so (lb fleet reads it), and B's and C's do not.
    wait_until 50 0.1 st_views_down "na=b3 nb= nc=" || { st_fleet >&2; fail "node A's view in the store does not name b3 down (or another's does)"; }
    sleep 2
    for n in na nb nc; do
        [ "$(live_digest "$n")" = "$digest" ] || fail "node $n's table changed when only node A lost b3"
        ! st_logged "$n" "fleet: at revision [0-9]*, web backend b3" || fail "node $n took b3 out though only A saw it down"
    done
    say "(4) node A firewalled from b3's checks: A sees b3 down, b3 stays in all three tables"
    # b3's checks fail for every node: it leaves every table at the same revision.
    ip netns exec "$PREFIX-b3" nft -f - <<NFT || fail "b3's firewall"
table ip lbtest {
    chain in {
        type filter hook input priority 0; policy accept;
        tcp dport 8080 counter reject with tcp reset
    }
}
NFT
    st_spread "fleet: at revision [0-9]*, web backend b3 .* is down" na nb nc >/dev/null
    r=$(for n in na nb nc; do tail -n "+$((ST_FROM[$n] + 1))" "$WORK/lb-$n.log" | grep -o "fleet: at revision [0-9]*, web backend b3 .* is down" | grep -o "revision [0-9]*"; done | sort -u)
    [ "$(wc -l <<<"$r")" = 1 ] || fail "the nodes took b3 out at different revisions: $r"
    st_agree 3
    say "(5) b3's checks fail for every node: all three took it out at $r; one digest"
    ip netns exec "$PREFIX-b3" nft delete table ip lbtest
    ip netns exec "$PREFIX-na" nft delete table ip lbtest
    st_spread "fleet: at revision [0-9]*, web backend b3 .* is up again" na nb nc >/dev/null
    st_agree 3

    # An agent on b1 that answers each node differently.
    ip netns exec "$PREFIX-b1" python3 -c '
import socketserver
say = {"10.96.0.2": b"10%\n", "10.96.0.3": b"90%\n", "10.96.0.4": b"50%\n"}
class H(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(say.get(self.client_address[0], b"100%\n"))
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("0.0.0.0", 5555), H).serve_forever()' >/dev/null 2>&1 &
    echo $! >>"/tmp/$PREFIX.pids"
    st_pool "$WORK/p3.yaml" agent 1:2 2:drain 3 4
    st_push "$WORK/p3.yaml" lb
    wait_until 150 0.1 grep -q "load: web backend b1 .* is served at" "$WORK/lb-nb.log" || fail "b1's agent was not heard"
    sleep 4
    st_agree 3
    digest=$(live_digest nb)
    for n in na nc; do [ "$(live_digest "$n")" = "$digest" ] || fail "node $n weighs b1's agent differently"; done
    # The median of 10%, 90% and 50%, on every node.
    for n in na nb nc; do
        grep "load: web backend b1 " "$WORK/lb-$n.log" | tail -1 | grep -q "agent 50%" || { grep "load: web backend b1" "$WORK/lb-$n.log" >&2; fail "node $n does not serve b1 at the median of its agent's answers"; }
    done
    say "(6) b1's agent answers A 10%, B 90%, C 50%: all three serve it at 50% (the median), one digest"

    # An invalid pool written straight into etcd: no node applies it, each says why.
    printf 'services:\n  - name: web\n    vip: 10.99.0.100\n    port: 99999\n    backends: [10.97.1.2]\n' | st_etcdctl put /lb/pool >/dev/null
    rev=$(st_etcdctl get /lb/pool -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["kvs"][0]["mod_revision"])')
    st_spread "reload refused (store revision $rev): .*services\[0\].port" na nb nc >/dev/null
    wait_until 50 0.1 st_refusals "$rev" 3 || { st_fleet >&2; fail "lb fleet does not show three refusals"; }
    for n in na nb nc; do [ "$(live_digest "$n")" = "$digest" ] || fail "node $n changed its tables for an invalid pool"; done
    say "(7) an invalid pool put with etcdctl (revision $rev): refused by all three, lb fleet names why; tables unchanged"

    # Two pushes from the same base: one lands, the other conflicts and writes nothing.
    st_push "$WORK/p3.yaml" lb
    rev=$(st_etcdctl get /lb/pool -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["kvs"][0]["mod_revision"])')
    st_pool "$WORK/p4.yaml" agent 1:2 3 4
    st_pool "$WORK/p5.yaml" agent 1 3 4
    ip netns exec "$PREFIX-e1" "$LB" push "$WORK/p4.yaml" --to "$(st_url)" --expect-revision "$rev" >/dev/null || fail "the first push from revision $rev"
    if ip netns exec "$PREFIX-e1" "$LB" push "$WORK/p5.yaml" --to "$(st_url)" --expect-revision "$rev" >/dev/null 2>"$WORK/conflict.err"; then
        fail "two pushes from revision $rev both landed"
    fi
    grep -q "conflict" "$WORK/conflict.err" || { cat "$WORK/conflict.err" >&2; fail "the second push did not say conflict"; }
    st_etcdctl get /lb/pool --print-value-only | grep -q "{name: b1, address: 10.97.1.2, weight: 2}" || fail "the store holds the second push"
    say "(8) two pushes from revision $rev: the first landed, the second failed: $(head -c 120 "$WORK/conflict.err")"

    # One member killed, the one every client asks first: a push and the watches go on.
    st_member_kill 1
    st_pool "$WORK/p6.yaml" agent 1:2 2 3 4
    st_push "$WORK/p6.yaml" lb
    rev=$(st_etcdctl get /lb/pool -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["kvs"][0]["mod_revision"])')
    ms=$(st_spread "reload (store revision $rev)" na nb nc)
    say "(9) member e1 killed: revision $rev pushed, applied by all three within ${ms} ms of each other"

    # Every member killed: nothing breaks, the nodes say so; they catch up when it returns.
    HOLD_TRIES=400 hold_open "$TOPO_RCLIENTS4" 100 10 --patience 8 --first-port 45000
    st_member_kill 2
    st_member_kill 3
    st_spread "store: .* does not answer" na nb nc >/dev/null
    for n in na nb nc; do
        [ "$(lb_status "$n" fleet connected)" = false ] || fail "lb status on $n does not say the store is down"
        [ "$(st_metric "$n" lb_store_up)" = 0 ] || fail "$n's lb_store_up is not 0 with the store down"
    done
    # After a lease's time, each decides alone.
    st_spread "this node decides alone" na nb nc >/dev/null
    sleep 1
    hold_wait "held connections broke while the store was down"
    say "(10) every member killed: the nodes say so (lb status: connected false, lb_store_up 0) and decide alone; 100 held connections, 0 broken"
    for i in $ST_MEMBERS; do st_member_start "$i"; done
    wait_until 100 0.1 st_etcdctl endpoint health >/dev/null 2>&1 || fail "the cluster did not come back"
    st_spread "store: .* answers again" na nb nc >/dev/null
    st_pool "$WORK/p7.yaml" agent 1:2 2 3 4:2
    st_push "$WORK/p7.yaml" lb
    rev=$(st_etcdctl get /lb/pool -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)["kvs"][0]["mod_revision"])')
    st_spread "reload (store revision $rev)" na nb nc >/dev/null
    st_agree 3
    for n in na nb nc; do
        [ "$(st_metric "$n" lb_store_up)" = 1 ] || fail "$n's lb_store_up is not 1 with the store back"
        [ "$(st_metric "$n" lb_store_pool_revision)" = "$rev" ] || fail "$n's lb_store_pool_revision is not $rev"
        [ "$(st_metric "$n" lb_store_lost_total)" -ge 1 ] || fail "$n's lb_store_lost_total did not count the outage"
    done
    say "(11) the store is back: the nodes caught up and applied revision $rev; lb fleet agrees"
}
