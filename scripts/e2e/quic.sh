# shellcheck shell=bash
# QUIC-LB: real quinn connections (tools/quic-echo) keep their server through NAT rebinding, an
# address change and pool changes, because lb routes them by the server ID in their connection
# IDs; with quic_lb off, the same run loses most of them at the rebinding.

QUIC_ECHO=${QUIC_ECHO:-target/release/quic-echo}
QUIC_KEY=8f95f09245765f80256934e50c66207f
QUIC_N=50

# The pool: one QUIC service on the VIP's UDP 4433, tracking nothing (conntrack off: what keeps
# a connection on its server is its connection ID alone). QUIC is "on" or "off" (no quic_lb:
# key; the servers issue the same IDs, which lb then ignores). BACKENDS: "N" or "N:WEIGHT".
quic_pool() { # FILE QUIC BACKENDS...
    local file=$1 quic=$2 list="" b w
    shift 2
    for b in "$@"; do
        w=1
        [[ "$b" == *:* ]] && w=${b#*:}
        list+="${list:+, }{address: 10.99.0.$((10 + ${b%%:*})), name: b${b%%:*}, weight: $w}"
    done
    {
        printf 'services:\n  - name: h3\n    vip: 10.99.0.100\n    port: 4433\n    protocol: udp\n    hash: flow\n    conntrack: off\n'
        [ "$quic" = on ] && printf '    quic_lb: {rotation: 1, server_id_len: 2, nonce_len: 6, key: %s}\n' "$QUIC_KEY"
        printf '    backends: [%s]\n' "$list"
    } | write_atomic "$file"
}

# Backend I's QUIC server, issuing the IDs `lb quic-lb` gives it from the "on" pool.
quic_server_start() { # I
    local i=$1
    "$LB" quic-lb --config "$WORK/params.yaml" --backend "b$i" >"$WORK/b$i.quic" || fail "lb quic-lb b$i"
    ip netns exec "$PREFIX-b$i" "$QUIC_ECHO" serve --name "b$i" --listen "$TOPO_VIP4:4433" --quic-lb "$WORK/b$i.quic" \
        >"$WORK/b$i.qlog" 2>&1 &
    echo $! >>"/tmp/$PREFIX.pids"
    wait_until 100 0.05 grep -q listening "$WORK/b$i.qlog" || { cat "$WORK/b$i.qlog" >&2; fail "b$i's QUIC server did not start"; }
}

# The client: QUIC_N connections from 10.99.0.1, commands through fd 7, reports in
# $WORK/reports (one JSON line each).
quic_client_start() {
    mkfifo "$WORK/cmd"
    ip netns exec "$PREFIX-client" "$QUIC_ECHO" client --connect "$TOPO_VIP4:4433" --connections "$QUIC_N" --bind 10.99.0.1 \
        <"$WORK/cmd" >"$WORK/reports" 2>"$WORK/client.log" &
    echo $! >>"/tmp/$PREFIX.pids"
    exec 7>"$WORK/cmd"
}

quic_say() { echo "$1" >&7; }

# Ends the current phase: a report, then its checks (quic_check). Phases last 3 s: a connection
# with no answer for 3 s is broken.
quic_phase() { # LABEL
    quic_say "mark $1"
    sleep 3
    quic_say report
    wait_until 100 0.05 quic_has_report "$1" || fail "no report for phase $1"
}

quic_has_report() { grep -q "\"phase\":\"$1\"" "$WORK/reports"; }

# Checks the report of phase LABEL: connections broken must be exactly those on the backends
# listed in LOST (space-separated, may be empty); every other one answered in the phase from one
# backend only, the one it started on. Prints "broken=B moved=M on=b1:N,b2:N..." for the log.
quic_check() { # LABEL LOST
    grep "\"phase\":\"$1\"" "$WORK/reports" | tail -1 | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
lost = set(sys.argv[1].split())
bad, on, broken, moved = [], {}, 0, 0
for c in r["connections"]:
    first = c["backends"][0] if c["backends"] else None
    on[first] = on.get(first, 0) + 1
    if len(c["backends"]) > 1:
        moved += 1
    if c["broken"]:
        broken += 1
        if first not in lost:
            bad.append("c%d on %s broke: %s" % (c["id"], first, c["error"]))
    elif first in lost:
        bad.append("c%d on %s, which was removed, still answers" % (c["id"], first))
    elif len(c["backends"]) != 1 or c["ok_in_phase"] == 0:
        bad.append("c%d: backends %s, %d answers this phase" % (c["id"], c["backends"], c["ok_in_phase"]))
print("broken=%d moved=%d on=%s" % (broken, moved, ",".join("%s:%d" % kv for kv in sorted(on.items(), key=str))))
if bad:
    print("\n".join(bad[:10]), file=sys.stderr)
    sys.exit(1)
' "$2"
}

# How many connections the phase LABEL's report says are broken.
quic_broken() { # LABEL
    grep "\"phase\":\"$1\"" "$WORK/reports" | tail -1 | python3 -c 'import json, sys; print(sum(c["broken"] for c in json.loads(sys.stdin.read())["connections"]))'
}

# How many of the phase's live connections the table of POOL sends elsewhere by their 5-tuple
# as it is now (examples/e2e check, on "address port backend" lines from the report): what the
# table alone would have done with them.
quic_elsewhere() { # LABEL POOL
    grep "\"phase\":\"$1\"" "$WORK/reports" | tail -1 | python3 -c '
import json, sys
for c in json.loads(sys.stdin.read())["connections"]:
    if not c["broken"] and c["last"]:
        host, port = c["local"].rsplit(":", 1)
        print(host, port, c["last"])
' >"$WORK/flows.$1"
    "$E2E" check --config "$2" --service h3 "$WORK/flows.$1" >"$WORK/check.$1" 2>&1
    grep -o "[0-9]* elsewhere" "$WORK/check.$1" | cut -d' ' -f1
}

# After the pool file's CHANGES-th change of h3 (WHAT): phase LABEL, in which no connection may
# break or move, and in which the table alone must have sent some elsewhere (or the phase would
# prove nothing).
quic_pool_changed() { # LABEL CHANGES WHAT
    local out moved
    wait_log "h3 changed" "$2"
    quic_phase "$1"
    out=$(quic_check "$1" "") || fail "after $3: $out"
    moved=$(quic_elsewhere "$1" "$WORK/pool.yaml")
    [ "${moved:-0}" -gt 0 ] || fail "$3 would have moved no connection: the phase proves nothing"
    say "$3 (the table alone would have sent $moved elsewhere): $out"
}

quic_teardown() {
    exec 7>&- 2>/dev/null
    teardown
}

test_quic_connections_keep_their_server_through_rebinding_migration_and_pool_changes() { # MODE QUIC
    local mode=$1 quic=$2 out
    begin_test lbq quic_teardown
    [ -x "$QUIC_ECHO" ] || fail "$QUIC_ECHO is missing: cargo build --release -p quic-echo"
    topo_up "$PREFIX" 3 "$mode" || fail "topology"
    quic_pool "$WORK/params.yaml" on 1 2 3 4
    quic_pool "$WORK/pool.yaml" "$quic" 1 2 3
    start_lb "$mode" --stats-interval 1
    for i in 1 2 3; do quic_server_start "$i"; done
    quic_client_start
    quic_phase start
    out=$(quic_check start "") || fail "connections failed before anything changed: $out"
    [ "$(quic_elsewhere start "$WORK/pool.yaml")" = 0 ] || fail "connections did not start where the table says: $(cat "$WORK/check.start")"
    say "$QUIC_N connections echoing, each from a port of its own, where the table put them: $out"
    if [ "$quic" = off ]; then
        # The control: the new source ports hash anew, and lb knows nothing else.
        quic_say rebind
        sleep 1
        quic_phase rebound
        local broken
        broken=$(quic_broken rebound)
        say "quic_lb off: $broken of $QUIC_N connections broke when the client rebound"
        # Each new port lands on another of the 3 backends with a chance near 2/3 (less when the
        # first draw was uneven, 0.6 for 25/13/12): about 33 of 50 break. Half of 50, the bound
        # until 2026-12-04, fails by chance in 0.5% of runs at 2/3 and 6% at 0.6 (it did once,
        # 24 of 50); a fifth fails in under one run in 10^8 at 0.6, and still shows that the test
        # sees connections break.
        [ "$broken" -ge $((QUIC_N / 5)) ] || fail "only $broken of $QUIC_N broke without quic_lb: the test would not tell"
        return 0
    fi
    # Pool changes first, while the 5-tuples are the ones the table placed: each shows how many
    # connections the table alone would have moved.
    quic_pool "$WORK/pool.yaml" on 1:3 2 3
    quic_pool_changed reweighted 1 "b1 reweighted to 3"
    topo_add_backend "$PREFIX" 4
    quic_server_start 4
    quic_pool "$WORK/pool.yaml" on 1:3 2 3 4
    quic_pool_changed added 2 "b4 added"
    quic_say rebind
    sleep 1
    quic_phase rebound
    out=$(quic_check rebound "") || fail "after the rebinding: $out"
    say "rebound to new source ports ($(quic_elsewhere rebound "$WORK/pool.yaml") now hash elsewhere): $out"
    quic_say "move 10.99.0.51"
    sleep 1
    quic_phase moved
    out=$(quic_check moved "") || fail "after the move to 10.99.0.51: $out"
    say "moved to another source address ($(quic_elsewhere moved "$WORK/pool.yaml") hash elsewhere): $out"
    quic_pool "$WORK/pool.yaml" on 1:3 3 4
    wait_log "h3 changed" 3
    quic_phase removed
    out=$(quic_check removed "b2") || fail "after b2 was removed: $out"
    say "b2 removed: only b2's connections broke: $out"
    say "lb: $(grep -o "quic-lb: .*" "$WORK/stats.out" | tail -1)"
}
