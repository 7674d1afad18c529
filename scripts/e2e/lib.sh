# shellcheck shell=bash
# What the end-to-end tests share: output, per-test setup and teardown, lb attach, the client
# tools (probe, check, compare, hold, churn), waiting, and the pools more than one feature
# uses. scripts/e2e.sh sources it after scripts/lib/topology.sh and sets LB, LB_NEXT, E2E and V.

say() { echo "    $*"; }
fail() { echo "    FAIL: $*" >&2; exit 1; }
show() { if [ "$V" = 1 ]; then cat "$1"; fi; }

# Runs COMMAND every STEP seconds until it succeeds, at most TRIES times, then once more: the
# status is that last run's.
wait_until() { # TRIES STEP COMMAND...
    local tries=$1 step=$2
    shift 2
    for _ in $(seq 1 "$tries"); do
        "$@" && return 0
        sleep "$step"
    done
    "$@"
}

# Writes standard input to FILE by one rename: lb's watcher never reads half a pool.
write_atomic() { # FILE
    cat >"$1.tmp"
    mv "$1.tmp" "$1"
}

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
    write_atomic "$1" <<EOF
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
}

# web alone (tracking connections, lb's default), backends "bN:WEIGHT ...", algorithm ALGORITHM.
web_pool() { # FILE BACKENDS ALGORITHM
    local list="" b
    for b in $2; do
        list+="${list:+, }{address: 10.99.0.$((10 + ${b%%:*})), name: b${b%%:*}, weight: ${b##*:}}"
    done
    printf 'services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    hash: flow\n    algorithm: %s\n    backends: [%s]\n' "$3" "$list" |
        write_atomic "$1"
}

# Adds the line "KEY: VALUE" to the web service of the pool in FILE, after its hash line.
web_add() { # FILE "KEY: VALUE"
    sed -i "/name: web$/,/backends:/ s|^    hash: flow$|    hash: flow\n    $2|" "$1"
    grep -qF "    $2" "$1" || fail "could not add '$2' to web"
}

# A reload that does not touch web: dns moves to another port.
reload_without_web() {
    sed -i 's/    port: 53$/    port: 5353/' "$WORK/pool.yaml"
    wait_log "dns changed" 1
}

# Per-test state: PREFIX (of the test's namespaces: STEM, this process's id, a dash and a random
# number, so that no two tests running side by side can have the same) and WORK (a scratch
# directory). TEARDOWN runs on every exit; a timeout's TERM exits with 124.
begin_test() { # STEM TEARDOWN
    PREFIX="$1$$-${RANDOM}"
    WORK=$(mktemp -d /tmp/lb-e2e.XXXXXX)
    # shellcheck disable=SC2064 # the handler's name is fixed now, on purpose
    trap "background_down; $2" EXIT
    trap 'exit 124' TERM INT
}

# The bridge topology (scripts/lib/topology.sh, topo_up) with BACKENDS backends and the pool.
setup() { # MODE [BACKENDS]
    begin_test lbe teardown
    topo_up "$PREFIX" "${2:-3}" "$1" || fail "topology"
    write_pool "$WORK/pool.yaml"
}

# Stops what churn_start and hold_open left running when a test fails before churn_stop or
# hold_wait: the churn loop waits for $WORK/stop, which the teardown removes with $WORK, so it
# would spin on for good. Called on every test's exit (begin_test, teardown).
background_down() {
    # Each step may fail (the loop may be gone already), and the tests run under set -e.
    if [ -n "${CHURN:-}" ]; then
        touch "$WORK/stop" 2>/dev/null || true
        kill "$CHURN" 2>/dev/null || true
        wait "$CHURN" 2>/dev/null || true
        CHURN=
    fi
    if [ -n "${HOLD:-}" ]; then
        kill "$HOLD" 2>/dev/null || true
        wait "$HOLD" 2>/dev/null || true
        HOLD=
    fi
    return 0
}

teardown() {
    background_down
    [ -n "${LBPID:-}" ] && kill "$LBPID" 2>/dev/null && wait "$LBPID" 2>/dev/null
    topo_down "$PREFIX"
    [ "$V" = 1 ] && [ -f "$WORK/lb.log" ] && sed 's/^/    | /' "$WORK/lb.log"
    rm -rf "$WORK"
}

# Waits up to TRIES x 50 ms (default 200: 10 s) until LOG holds more than BEFORE "serving;"
# lines (lb attach serves) while PID runs; fails with "WHAT did not start" and the log otherwise.
wait_serving() { # LOG BEFORE PID WHAT [TRIES]
    local n
    for _ in $(seq 1 "${5:-200}"); do
        n=$(grep -c "serving;" "$1" 2>/dev/null || true)
        [ "${n:-0}" -gt "$2" ] && return 0
        kill -0 "$3" 2>/dev/null || break
        sleep 0.05
    done
    cat "$1" >&2
    fail "$4 did not start"
}

# lb attach in the lb namespace with the test's pool; its log starts afresh in $WORK/lb.log,
# its --stats-interval lines in $WORK/stats.out. Sets LBPID.
start_lb() { # MODE [EXTRA ARGS]
    local mode=$1
    shift
    : >"$WORK/lb.log"
    ip netns exec "$PREFIX-lb" "$LB" attach eth0 --config "$WORK/pool.yaml" --xdp-mode "$mode" --reload-delay 0.05 "$@" \
        >"$WORK/stats.out" 2>>"$WORK/lb.log" &
    LBPID=$!
    wait_serving "$WORK/lb.log" 0 "$LBPID" "lb attach"
}

# lb's /metrics (or PATH: / is the status page) into FILE, from lb's namespace, where the test
# started it with --metrics 127.0.0.1:9100.
lb_scrape() { # FILE [PATH]
    ip netns exec "$PREFIX-lb" curl -sf --max-time 5 "http://127.0.0.1:9100${2:-/metrics}" >"$1" || fail "no scrape of ${2:-/metrics}"
}

# Until LOG (lb's, by default) has COUNT lines matching PATTERN.
wait_log() { # PATTERN COUNT [LOG]
    local log=${3:-$WORK/lb.log}
    wait_until 100 0.05 log_has "$1" "$2" "$log" && return 0
    cat "$log" >&2
    fail "no log line matching '$1'"
}

log_has() { # PATTERN COUNT LOG
    local n
    n=$(grep -c -- "$1" "$3" 2>/dev/null || true)
    [ "${n:-0}" -ge "$2" ]
}

# The last value lb's --stats-interval output gave counter NAME.
last_counter() { # NAME
    grep -o "$1=[0-9]*" "$WORK/stats.out" | tail -1 | cut -d= -f2
}

xdp_attached() { ip -n "$PREFIX-lb" -d link show dev eth0 | grep -q 'prog/xdp'; }
# How the program on lb's eth0 runs, as ip link names it: xdp (native), xdpgeneric, or nothing.
xdp_mode() { ip -n "$PREFIX-lb" link show dev eth0 | grep -o ' xdp[a-z]* ' | tr -d ' '; }
xdp_detached() { ! xdp_attached; }

# probe and hold_open run on CPU CLIENT_CPU when it is set (the floods keep the clients' packets
# on a CPU and a receive queue of lb's other than the flood's: conntrack.sh).
probe() { # OUT ARGS...  (in the client namespace)
    local out=$1
    shift
    ip netns exec "$PREFIX-client" ${CLIENT_CPU:+taskset -c "$CLIENT_CPU"} "$E2E" probe "$@" >"$out" 2>>"$WORK/probe.log"
}

# Every flow in FLOWS is on the backend that CONFIG's table (the test's pool by default) gives
# SERVICE, and the counts match the shares; fails with WHAT ("check SERVICE") otherwise.
check() { # SERVICE FLOWS [CONFIG [WHAT]]
    "$E2E" check --config "${3:-$WORK/pool.yaml}" --service "$1" "$2" >"$WORK/check.out" || { cat "$WORK/check.out" >&2; fail "${4:-check $1}"; }
    show "$WORK/check.out"
}

# e2e compare BEFORE AFTER [ARGS] into $WORK/OUT; fails with MESSAGE and the comparison when
# a flow failed or moved where ARGS (--removed, --added, --transition) do not allow it.
compare_flows() { # OUT MESSAGE BEFORE AFTER [COMPARE ARGS...]
    local out="$WORK/$1" msg=$2
    shift 2
    "$E2E" compare "$@" >"$out" || { cat "$out" >&2; fail "$msg"; }
    show "$out"
}

# Takes b2 out of web while connections are being made (PROBE ARGS, through e2e probe), by
# running COMMAND, which rewrites the pool without it; then proves that only b2's flows moved:
# while it happened no flow of another backend failed or moved, and afterwards each kept its
# backend, flow by flow, and all are where the new table says. The flows before, during and
# after are left in $WORK/before, $WORK/during_removal and $WORK/removed.
remove_b2_under_traffic() { # PROBE ARGS... -- COMMAND...
    local args=()
    while [ "$1" != -- ]; do
        args+=("$1")
        shift
    done
    shift
    probe "$WORK/before" "${args[@]}" || fail "before"
    probe "$WORK/during_removal" "${args[@]}" &
    local during=$!
    sleep 0.1
    "$@"
    wait "$during" || true
    wait_log "web changed (b2 removed" 1
    compare_flows cmp0 "a flow not on b2 failed or moved while b2 was removed" "$WORK/before" "$WORK/during_removal" --removed b2 --transition
    probe "$WORK/removed" "${args[@]}" || fail "after removal"
    compare_flows cmp "a flow moved that was not on b2" "$WORK/before" "$WORK/removed" --removed b2
    check web "$WORK/removed"
}

# Sends SIGNAL to lb attach (LBPID) and waits for it to end; returns its exit status.
stop_lb() { # SIGNAL
    local rc=0
    kill "-$1" "$LBPID" 2>/dev/null || true
    wait "$LBPID" 2>/dev/null || rc=$?
    LBPID=
    return "$rc"
}

# Opens CONNECTIONS long-lived connections to 10.99.0.100:80 (HOLD_PORT) from SOURCES that keep
# talking for SECONDS (e2e hold, its report in $WORK/hold.log; with --udp, UDP flows); sets HOLD
# to the holder's pid once every connection is open, waiting HOLD_TRIES x 50 ms for that (100:
# 5 s; the fleet's 200 through a router take longer). hold_wait waits for it to end,
# hold_summary prints its last line.
hold_open() { # SOURCES CONNECTIONS SECONDS [HOLD ARGS...]
    local sources=$1 n=$2 secs=$3
    shift 3
    rm -f "$WORK/ready"
    ip netns exec "$PREFIX-client" ${CLIENT_CPU:+taskset -c "$CLIENT_CPU"} "$E2E" hold --vip 10.99.0.100 --port "${HOLD_PORT:-80}" --sources "$sources" \
        --connections "$n" --seconds "$secs" --ready-file "$WORK/ready" "$@" 2>"$WORK/hold.log" &
    HOLD=$!
    wait_until "${HOLD_TRIES:-100}" 0.05 test -f "$WORK/ready" || { cat "$WORK/hold.log" >&2; fail "connections did not open"; }
}

hold_wait() { # MESSAGE: fails with it if a held connection broke
    local rc=0
    wait "$HOLD" || rc=$?
    HOLD=
    [ "$rc" -eq 0 ] || { cat "$WORK/hold.log" >&2; fail "$1"; }
}

hold_summary() { tail -1 "$WORK/hold.log" | sed 's/^hold: //'; }

# New connections without pause until $WORK/stop exists: each round is CHURN_COUNT (100)
# connections from each of the 5 addresses in SOURCES (the bridge's clients by default), each
# given CHURN_TIMEOUT_MS (1000) to be answered, with one retry; every failure is kept in
# $WORK/churn.failed. Sets CHURN to the loop's pid.
churn_start() { # [SOURCES]
    rm -f "$WORK/stop" "$WORK/churn.failed" "$WORK/churn.rounds" "$WORK/churn.exits"
    (
        r=0
        while [ ! -f "$WORK/stop" ]; do
            # A probe that fails must not end the loop (the tests run under set -e): its failed
            # flows are counted, and any other exit is recorded.
            ip netns exec "$PREFIX-client" "$E2E" probe --vip 10.99.0.100 --port 80 --sources "${1:-$TOPO_CLIENTS4}" \
                --first-port $((30000 + (r % 20) * 100)) --count "${CHURN_COUNT:-100}" --timeout-ms "${CHURN_TIMEOUT_MS:-1000}" \
                >"$WORK/churn.$r" 2>"$WORK/churn.err" || echo "round $r: the probe exited $?: $(tail -1 "$WORK/churn.err")" >>"$WORK/churn.exits"
            grep FAIL "$WORK/churn.$r" >>"$WORK/churn.failed" || true
            r=$((r + 1))
            echo "$r" >"$WORK/churn.rounds"
        done
    ) &
    CHURN=$!
}

# shellcheck disable=SC2034 # CHURN_SUMMARY is for the tests that call it
churn_stop() { # sets CHURN_SUMMARY to "N new connections, F failed"; fails if any failed
    touch "$WORK/stop"
    wait "$CHURN" || true
    CHURN=
    local rounds failed
    rounds=$(cat "$WORK/churn.rounds" 2>/dev/null || echo 0)
    failed=$(grep -c . "$WORK/churn.failed" || true)
    CHURN_SUMMARY="$((rounds * 5 * ${CHURN_COUNT:-100})) new connections, $failed failed"
    [ "$rounds" -gt 0 ] || { CHURN_SUMMARY="no round of new connections ran"; return 1; }
    [ "$failed" -eq 0 ] || { head -5 "$WORK/churn.failed" >&2; return 1; }
    # A probe that failed without a failed flow (it could not run): named, and a failure.
    if [ -s "$WORK/churn.exits" ]; then
        head -3 "$WORK/churn.exits" >&2
        CHURN_SUMMARY+="; $(grep -c . "$WORK/churn.exits") rounds' probes failed to run"
        return 1
    fi
}

# Starts `lb decap eth0` on backends 1 to 3 (stopped with the topology), unwrapping only what
# comes from SOURCEs (the load balancers' encapsulation sources), and waits until each serves.
decap_up() { # MODE SOURCE...
    local i mode=$1 allow=() s
    shift
    for s in "$@"; do allow+=(--allow-from "$s"); done
    for i in 1 2 3; do
        ip netns exec "$PREFIX-b$i" "$LB" decap eth0 "${allow[@]}" --xdp-mode "$mode" >/dev/null 2>"$WORK/decap$i.log" &
        echo $! >>"/tmp/$PREFIX.pids"
    done
    for i in 1 2 3; do
        wait_until 50 0.1 grep -q serving "$WORK/decap$i.log" || { cat "$WORK/decap$i.log" >&2; fail "lb decap on b$i"; }
    done
}

# A bpffs for the test's pins (PINS), mounted in this (the root) mount namespace: `ip netns
# exec` sees it and its pins outlive each command (one mounted inside `ip netns exec` would not).
# Mode 0700, as systemd mounts /sys/fs/bpf on a host: only root may walk it.
pins_up() {
    PINS="/run/$PREFIX-bpf"
    mkdir -p "$PINS"
    mount -t bpf -o mode=0700 bpf "$PINS"
}

# Detaches what lb left pinned on eth0 in the namespaces of NODEs and removes the bpffs; does
# nothing before pins_up.
pins_down() { # NODE...
    [ -n "${PINS:-}" ] || return 0
    local n
    for n in "$@"; do ip netns exec "$PREFIX-$n" "$LB" detach eth0 --pin-dir "$PINS" >/dev/null 2>&1 || true; done
    umount "$PINS" 2>/dev/null || true
    rmdir "$PINS" 2>/dev/null || true
}

# A value from lb status --json of the data plane pinned in NODE's namespace, as JSON
# (python3 reads it): lb_status lb status flows entries.
lb_status() { # NODE FIELD...
    local node=$1
    shift
    ip netns exec "$PREFIX-$node" "$LB" status eth0 --json --pin-dir "$PINS" | python3 -c "
import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1:]:
    v = v[int(k)] if isinstance(v, list) else v[k]
print(json.dumps(v))" "$@"
}
