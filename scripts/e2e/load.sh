# shellcheck shell=bash
# Load-aware weights (docs/load.md): backends doing real CPU work in CPU-limited cgroups, lb's
# reference agent (`lb agent`) on each, a slower backend that gets less, two nodes that agree,
# slow start, and what an agent's drain, down, garbage and silence do.

# A cgroup for backend NAME limited to PERCENT of one CPU (what a container gets), v2 or v1;
# prints its directory.
cgroup_make() { # NAME PERCENT
    local d
    if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        d="/sys/fs/cgroup/$PREFIX-$1"
        grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control || echo +cpu >/sys/fs/cgroup/cgroup.subtree_control
        mkdir -p "$d"
        echo "$(($2 * 1000)) 100000" >"$d/cpu.max"
    else
        d="/sys/fs/cgroup/cpu/$PREFIX-$1"
        mkdir -p "$d"
        echo 100000 >"$d/cpu.cfs_period_us"
        echo "$(($2 * 1000))" >"$d/cpu.cfs_quota_us"
    fi
    echo "$d" >>"/tmp/$PREFIX.cgroups"
    echo "$d"
}

# The topology's teardown, then the cgroups (empty once their servers are gone).
load_teardown() {
    local d
    teardown
    if [ -f "/tmp/$PREFIX.cgroups" ]; then
        while read -r d; do
            for _ in $(seq 1 50); do rmdir "$d" 2>/dev/null && break; sleep 0.1; done
        done <"/tmp/$PREFIX.cgroups"
        rm -f "/tmp/$PREFIX.cgroups"
    fi
}

# Backend I's CPU-bound HTTP server on port 8000 (KILO thousand rounds of work a request, one
# request at a time), in a cgroup of PERCENT of a CPU; its pid in $WORK/work-bI.pid.
work_start() { # I KILO PERCENT
    local cg pid
    cg=$(cgroup_make "b$1" "$3")
    ip netns exec "$PREFIX-b$1" "$E2E" work-serve "b$1" --port 8000 --kilo-rounds "$2" >/dev/null 2>&1 &
    pid=$!
    echo "$pid" >>"/tmp/$PREFIX.pids"
    echo "$pid" >"$WORK/work-b$1.pid"
    echo "$pid" >"$cg/cgroup.procs"
    wait_until 50 0.1 sh -c "ip netns exec $PREFIX-b$1 ss -ltn | grep -q ':8000 '" || fail "b$1's work server did not listen"
}

# lb agent on backend I for its work server (or, with PID, that process), on port 4050, every
# second; its override file is $WORK/override-bI. ARGS go to lb agent.
agent_start() { # I [ARGS...]
    local i=$1
    shift
    ip netns exec "$PREFIX-b$i" "$LB" agent --pid "$(cat "$WORK/work-b$i.pid" 2>/dev/null || cat "/tmp/$PREFIX-b$i.pid")" \
        --listen 0.0.0.0:4050 --interval 1 --override-file "$WORK/override-b$i" "$@" 2>"$WORK/agent-b$i.log" &
    echo $! >>"/tmp/$PREFIX.pids"
    echo $! >"$WORK/agent-b$i.pid"
    wait_until 50 0.1 grep -qs "agent: reporting" "$WORK/agent-b$i.log" || { cat "$WORK/agent-b$i.log" >&2; fail "lb agent on b$i"; }
}

# The CPU seconds backend I's work server has used.
work_cpu() { # I
    cat /proc/"$(cat "$WORK/work-b$1.pid")"/task/*/schedstat | awk '{ns += $1} END {printf "%.6f\n", ns / 1e9}'
}

# e2e load from the client: RATE new connections a second to port PORT for SECONDS from SOURCE,
# into OUT. Each run takes a source of its own: lb keeps a 5-tuple that was in use in the last
# 30 s on its backend, and the client reuses its ports.
load_run() { # OUT PORT RATE SECONDS SOURCE
    ip netns exec "$PREFIX-client" "$E2E" load --vip 10.99.0.100 --port "$2" --rate "$3" --seconds "$4" --source "$5" --out "$1" >/dev/null ||
        fail "the load client failed"
}

# Shares, failures and latency of the requests in FILE started from FROM_MS to TO_MS: prints
# `b1=N b2=N ... fail=N p50=MS p99=MS`.
load_stats() { # FILE FROM_MS TO_MS
    python3 - "$@" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
lo, hi = float(sys.argv[2]), float(sys.argv[3])
rows = [r for r in rows if lo <= float(r[0]) < hi]
counts, lat, fail = {}, [], 0
for r in rows:
    if r[1] == "FAIL":
        fail += 1
        lat.append(float(r[3]))
    else:
        counts[r[1]] = counts.get(r[1], 0) + 1
        lat.append(float(r[2]))
lat.sort()
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] if lat else 0
print(" ".join(f"{k}={counts[k]}" for k in sorted(counts)), f"fail={fail} p50={q(0.5):.0f} p99={q(0.99):.0f}")
PY
}

field() { tr ' ' '\n' <<<"$1" | grep "^$2=" | cut -d= -f2; }

# wait_log with 15 s to wait: an agent's answer takes an interval to be latched, three to drain
# or take out, and a capacity five or more to move.
wait_load_log() { # PATTERN
    wait_until 300 0.05 log_has "$1" 1 "$WORK/lb.log" && return 0
    tail -20 "$WORK/lb.log" >&2
    fail "no log line matching '$1'"
}

test_load_a_slower_backend_gets_less() { # MODE
    begin_test lbw load_teardown
    topo_up "$PREFIX" 3 "$1" || fail "topology"
    # b3 does three times the work per request (about 4 ms and 12 ms of CPU); each backend may
    # use half a CPU.
    work_start 1 1500 50
    work_start 2 1500 50
    work_start 3 4500 50
    printf 'services:\n  - name: work\n    vip: 10.99.0.100\n    port: 8000\n    hash: flow\n    algorithm: bounded\n    backends: [{address: 10.99.0.11, name: b1}, {address: 10.99.0.12, name: b2}, {address: 10.99.0.13, name: b3}]\n' |
        write_atomic "$WORK/pool.yaml"
    start_lb "$1" --metrics 127.0.0.1:9100

    # The control: static weights, 150 new connections a second for 20 s. b3 gets a third of
    # them, more than its half CPU can serve, and its queue grows.
    local c0 c1 control agent ref
    c0=$(work_cpu 1)
    load_run "$WORK/control" 8000 150 20 10.99.0.51
    c1=$(work_cpu 1)
    control=$(load_stats "$WORK/control" 8000 20000)
    # What a request costs a server at full speed: b1's CPU per request it served.
    ref=$(python3 -c "print(f'{($c1 - $c0) / $(grep -c ' b1 ' "$WORK/control"):.6f}')")
    say "control (static weights), from 8 s to 20 s: $control; a request costs b1 ${ref} s of CPU"

    # Agents on: each reports its server's speed against that cost.
    for i in 1 2 3; do agent_start "$i" --request-cpu "$ref"; done
    sed -i 's/^    algorithm: bounded$/    algorithm: bounded\n    agent: {port: 4050, interval: 1s}/' "$WORK/pool.yaml"
    wait_log "reload (file changed)" 1
    local t0 loader took
    t0=$(date +%s%N)
    load_run "$WORK/agent" 8000 150 55 10.99.0.52 &
    loader=$!
    # Within a few intervals of the first connections, b3 is down to its speed.
    wait_until 400 0.05 grep -qE "load: work backend b3 10.99.0.13 is served at (2[5-9]|3[0-9]|4[0-5])% " "$WORK/lb.log" ||
        fail "b3's weight did not fall: $(grep 'load:' "$WORK/lb.log" | tail -3)"
    took=$((($(date +%s%N) - t0) / 1000000))
    wait "$loader" || fail "the load client failed"
    agent=$(load_stats "$WORK/agent" 10000 55000)
    grep "load: work backend" "$WORK/lb.log" | sed 's/^/      /' | tail -4
    say "agents on: b3 served at its speed $took ms after the first connections (1 s intervals); from 10 s to 55 s: $agent"
    local b1 b2 b3
    b1=$(field "$agent" b1)
    b2=$(field "$agent" b2)
    b3=$(field "$agent" b3)
    # b3's share of new connections is about a third of each other's, within 10%; so is its
    # share of the table.
    ip netns exec "$PREFIX-lb" curl -sf --max-time 5 http://127.0.0.1:9100/metrics >"$WORK/scrape.txt" || fail "no scrape"
    local slots
    slots=$(grep '^lb_backend_slots{service="work"' "$WORK/scrape.txt" | sed 's/.*backend="\(b[0-9]\)"} /\1=/' | tr '\n' ' ')
    # (Its share of new connections is its share of the table plus chance: about 900 connections
    # of b3 vary by 3.5%, so the connections are held to the table within 3 standard errors.)
    python3 -c "
import math
s = {k: int(v) for k, v in (kv.split('=') for kv in '$slots'.split())}
t = s['b3'] / ((s['b1'] + s['b2']) / 2)
n, k = $b1 + $b2 + $b3, $b3
r = k / (($b1 + $b2) / 2)
p = s['b3'] / sum(s.values())
z = (k - n * p) / math.sqrt(n * p * (1 - p))
print(f'      b3 gets {t:.3f} of the others\' mean share of the table (a third is 0.333), and {r:.3f} of their new connections: {k} of {n}, {z:+.1f} standard errors from its table share')
assert abs(t - 1 / 3) <= 0.1 / 3, t
assert abs(z) <= 3, z" || fail "b3's share is not a third of the others'"
    [ "$(field "$agent" fail)" = 0 ] || fail "requests failed with the agents on: $agent"
    [ "$(field "$agent" p99)" -lt "$(field "$control" p99)" ] || fail "p99 did not drop: control $control, agents $agent"
    say "p99 latency $(field "$control" p99) ms with static weights, $(field "$agent" p99) ms with the agents (p50 $(field "$control" p50) / $(field "$agent" p50) ms)"

    # Visible: the capacity b3 reported and its effective weight in the metrics, why on the page.
    grep -E '^lb_backend_reported_capacity\{service="work",vip="10.99.0.100",backend="b3"\} (2[0-9]|3[0-9]|4[0-5])$' "$WORK/scrape.txt" >/dev/null ||
        fail "no reported capacity near a third for b3: $(grep reported_capacity "$WORK/scrape.txt")"
    grep -E '^lb_backend_effective_weight\{service="work",vip="10.99.0.100",backend="b3"\} 0\.[2-4][0-9]*$' "$WORK/scrape.txt" >/dev/null ||
        fail "b3's effective weight: $(grep effective_weight "$WORK/scrape.txt")"
    grep -q '^lb_agent_answers_total{service="work",backend="b3",outcome="ok"} [1-9]' "$WORK/scrape.txt" || fail "no agent answers counted"
    ip netns exec "$PREFIX-lb" curl -sf --max-time 5 http://127.0.0.1:9100/ | grep -q 'served: agent [0-9]*%)' || fail "the status page does not say why"
}

# A value of lb's /metrics (in the lb namespace, port 9100): the first line matching PATTERN.
metric() { # PATTERN
    ip netns exec "$PREFIX-lb" curl -sf --max-time 5 http://127.0.0.1:9100/metrics | grep -E "$1" | head -1 | awk '{print $NF}'
}

# Waits until backend NAME of service web holds no slot of the installed table.
wait_no_slots() { # NAME
    wait_until 100 0.05 sh -c "ip netns exec $PREFIX-lb curl -sf --max-time 5 http://127.0.0.1:9100/metrics | grep -q '^lb_backend_slots{service=\"web\",vip=\"10.99.0.100\",backend=\"$1\"} 0\$'" ||
        fail "$1 still holds slots: $(metric "lb_backend_slots\\{service=\"web\",vip=\"10.99.0.100\",backend=\"$1\"\\}")"
}

test_load_slow_start_and_what_agents_say() { # MODE
    begin_test lbw load_teardown
    topo_up "$PREFIX" 4 "$1" || fail "topology"
    local i
    for i in 1 2 3 4; do agent_start "$i"; done
    local pool='services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    hash: flow\n    agent: {port: 4050, interval: 1s}\n    slow_start: 8s\n    backends: [%s]\n'
    local three='{address: 10.99.0.11, name: b1}, {address: 10.99.0.12, name: b2}, {address: 10.99.0.13, name: b3}'
    # shellcheck disable=SC2059 # the format is the pool's
    printf "$pool" "$three" | write_atomic "$WORK/pool.yaml"
    start_lb "$1" --metrics 127.0.0.1:9100
    # Held connections on b1, b2 and b3 throughout; b2's may break once its agent says down.
    HOLD_TRIES=200 hold_open "$TOPO_CLIENTS4" 60 40 --allow-broken-on b2

    # (1) b4 joins with an 8 s slow start (beginning at the next 5 s of the clock): its slots, read
    # every 0.25 s, only rise, to its share; its share of new connections, per 2 s, rises and
    # never overshoots.
    (while [ ! -f "$WORK/stop-sampling" ]; do metric 'lb_backend_slots\{service="web",vip="10.99.0.100",backend="b4"\}' >>"$WORK/b4-slots" || true; sleep 0.25; done) &
    local sampler=$!
    # shellcheck disable=SC2059
    printf "$pool" "$three, {address: 10.99.0.14, name: b4}" | write_atomic "$WORK/pool.yaml"
    wait_log "reload (file changed)" 1
    load_run "$WORK/ramp" 80 100 16 10.99.0.51
    touch "$WORK/stop-sampling"
    wait "$sampler" || true
    python3 - "$WORK/b4-slots" "$WORK/ramp" <<'PY' || fail "b4's slow start"
import sys
slots = [int(l) for l in open(sys.argv[1]) if l.strip()]
assert slots, "no samples"
assert all(a <= b for a, b in zip(slots, slots[1:])), f"b4's slots fell: {slots}"
final = slots[-1] / 65537
assert 0.23 <= final <= 0.26, f"b4 ends with {final:.3f} of the table"
rows = [l.split() for l in open(sys.argv[2]) if l.strip()]
buckets = {}
for r in rows:
    b = int(float(r[0]) // 2000)
    n, on = buckets.get(b, (0, 0))
    buckets[b] = (n + 1, on + (r[1] == "b4"))
shares = [on / n for _, (n, on) in sorted(buckets.items())]
print("      b4's slots every 0.25 s rose from", slots[0], "to", slots[-1], f"({final:.1%} of the table);",
      "its share of new connections per 2 s:", " ".join(f"{s:.0%}" for s in shares))
assert shares[0] < 0.15 and shares[-1] > 0.18, shares
# Never over its full share by more than chance allows (200 connections a bucket: 3 sd is 9 points).
assert max(shares) <= 0.25 + 0.09, shares
assert not any(r[1] == "FAIL" for r in rows), "connections failed"
PY
    wait_load_log "load: web backend b4 10.99.0.14 is served at 10% of its weight (slow start 10%)"
    wait_load_log "load: web backend b4 10.99.0.14 is served at its full weight$"

    # (2) What agents say. drain: no new connections on b1, its held ones stay.
    echo drain >"$WORK/override-b1"
    wait_load_log "load: web backend b1 10.99.0.11 drains (agent says drain)"
    # (The line is logged as the table is computed, before it is installed: the metric follows
    # the installed table.)
    wait_no_slots b1
    probe "$WORK/drained" --vip 10.99.0.100 --port 80 --sources 10.99.0.52 --count 200 || fail "connections with b1 drained"
    ! grep -q ' b1$' "$WORK/drained" || fail "a new connection went to the drained b1"
    # down: b2 is out, new and tracked connections alike.
    echo down >"$WORK/override-b2"
    wait_load_log "load: web backend b2 10.99.0.12 is out (agent says down)"
    wait_no_slots b2
    probe "$WORK/down" --vip 10.99.0.100 --port 80 --sources 10.99.0.53 --count 200 || fail "connections with b2 down"
    ! grep -qE ' b[12]$' "$WORK/down" || fail "a new connection went to b1 or b2"
    # garbage: counted, and the last good report (80%) stands: b3's weight does not move.
    local w3
    echo 80% >"$WORK/override-b3"
    wait_load_log "load: web backend b3 10.99.0.13 is served at 80% of its weight (agent 80%)"
    w3=$(metric 'lb_backend_effective_weight\{service="web",vip="10.99.0.100",backend="b3"\}')
    [ "$w3" = 0.8 ] || fail "b3's effective weight at 80% is $w3"
    # An agent that says garbage: not lb agent, which answers only what lb can read (its
    # override file is not echoed), but one in a few lines of Python in its place.
    kill "$(cat "$WORK/agent-b3.pid")"
    wait_until 50 0.1 sh -c "! ip netns exec $PREFIX-b3 ss -ltn | grep -q ':4050 '" || fail "b3's lb agent did not stop"
    ip netns exec "$PREFIX-b3" python3 -c '
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 4050))
s.listen(64)
while True:
    c, _ = s.accept()
    c.sendall(b"75 percent, please\n")
    c.close()
' 2>"$WORK/garbage-agent.log" &
    echo $! >>"/tmp/$PREFIX.pids"
    echo $! >"$WORK/agent-b3.pid"
    wait_until 100 0.1 sh -c "[ \"\$(ip netns exec $PREFIX-lb curl -sf http://127.0.0.1:9100/metrics | grep -c 'lb_agent_answers_total{service=\"web\",backend=\"b3\",outcome=\"garbage\"} [3-9]')\" = 1 ]" ||
        fail "garbage was not counted"
    wait_load_log "load: web backend b3 10.99.0.13's agent: .*is neither a capacity nor ready, drain or down.*(garbage); its last good report stands"
    [ "$(metric 'lb_backend_effective_weight\{service="web",vip="10.99.0.100",backend="b3"\}')" = "$w3" ] || fail "garbage moved b3's weight"
    # silence (the agent stopped): counted as failed, the weight as it was.
    kill -STOP "$(cat "$WORK/agent-b3.pid")"
    wait_until 100 0.1 sh -c "ip netns exec $PREFIX-lb curl -sf http://127.0.0.1:9100/metrics | grep -q 'lb_agent_answers_total{service=\"web\",backend=\"b3\",outcome=\"failed\"} [3-9]'" ||
        fail "silence was not counted"
    kill -CONT "$(cat "$WORK/agent-b3.pid")"
    [ "$(metric 'lb_backend_effective_weight\{service="web",vip="10.99.0.100",backend="b3"\}')" = "$w3" ] || fail "silence moved b3's weight"
    wait_load_log "load: web backend b3 10.99.0.13's agent: timeout (failed)"
    hold_wait "a held connection broke (only b2's may)"
    say "(2) drain: no new connection on b1; down: b2 out; garbage and silence counted, b3's weight stayed $w3; held: $(hold_summary)"
}

# Two nodes, started 2.5 s apart, read the same agents while the reports and the pool change:
# their live tables' digests (lb status) differ at most two intervals at a time.
test_load_two_nodes_reading_the_same_agents_agree() { # MODE
    begin_test lbn fleet_teardown
    topo_fleet_up "$PREFIX" "$1" || fail "fleet topology"
    pins_up
    local i n
    # The agents' answers are the test's (through their override files), so that the table at
    # the end is known: an idle server's measure may read 99% or 100%.
    echo 100% >"$WORK/override-b1"
    echo 60% >"$WORK/override-b2"
    echo ready >"$WORK/override-b3"
    for i in 1 2 3; do agent_start "$i"; done
    local pool='services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    hash: flow\n    agent: {port: 4050, interval: 1s}\n    slow_start: 5s\n    backends: [%s]\n'
    local b1='{address: 10.96.0.11, name: b1}' rest='{address: 10.96.0.12, name: b2}, {address: 10.96.0.13, name: b3}'
    # shellcheck disable=SC2059
    for n in na nb; do printf "$pool" "$b1, $rest" | write_atomic "$WORK/pool-$n.yaml"; done
    start_node na "$1"
    sleep 2.5
    start_node nb "$1"
    (while [ ! -f "$WORK/stop-sampling" ]; do
        echo "$(date +%s%3N) $(live_digest na || true) $(live_digest nb || true)" >>"$WORK/digests"
        sleep 0.1
    done) &
    local sampler=$!
    # Changes, each early in an interval (nodes that see a pool change in the same interval
    # ramp alike): b2's capacity falls, b3 drains and comes back, b1 leaves and rejoins.
    at_interval() { while [ $(($(date +%s%3N) % 1000)) -gt 300 ] || [ $(($(date +%s%3N) % 1000)) -lt 100 ]; do sleep 0.02; done; }
    sleep 3
    echo 30% >"$WORK/override-b2"
    sleep 5
    echo drain >"$WORK/override-b3"
    sleep 5
    echo ready >"$WORK/override-b3"
    at_interval
    # shellcheck disable=SC2059
    for n in na nb; do printf "$pool" "$rest" | write_atomic "$WORK/pool-$n.yaml"; done
    sleep 4
    at_interval
    # shellcheck disable=SC2059
    for n in na nb; do printf "$pool" "$b1, $rest" | write_atomic "$WORK/pool-$n.yaml"; done
    # b1 ramps for 5 s from the next 5 s mark: up to 10 s.
    sleep 13
    touch "$WORK/stop-sampling"
    wait "$sampler" || true
    python3 - "$WORK/digests" <<'PY' || fail "the nodes' tables disagreed too long"
import sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 3]
assert len(rows) > 30, len(rows)
longest, since, tables = 0, None, []
for t, a, b in rows:
    t = int(t)
    if a != b:
        since = t if since is None else since
        longest = max(longest, t - since)
    else:
        since = None
        if not tables or tables[-1] != a:
            tables.append(a)
print(f"      {len(rows)} samples of both nodes' digests: {len(tables)} tables in turn, the longest disagreement {longest} ms")
assert len(tables) >= 5, tables
assert longest <= 2000, longest
PY
    # The table both serve at the end is the one lb table builds for the weights the log names.
    printf 'services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    hash: flow\n    algorithm: bounded\n    backends: [{address: 10.96.0.11, name: b1, weight: 100}, {address: 10.96.0.12, name: b2, weight: 30}, {address: 10.96.0.13, name: b3, weight: 100}]\n' >"$WORK/expected.yaml"
    [ "$(live_digest na)" = "$(table_digest "$WORK/expected.yaml")" ] || { grep "load:" "$WORK/lb-na.log" | tail -8 >&2; fail "node na's table is not lb table's for b2 at 30%"; }
    [ "$(live_digest nb)" = "$(live_digest na)" ] || fail "the nodes' tables differ at the end"
    grep -q "load: web backend b2 10.96.0.12 is served at 30% of its weight (agent 30%)" "$WORK/lb-nb.log" || fail "nb never served b2 at 30%"
    say "both serve $(live_digest na), lb table's for b1 100, b2 30, b3 100 (in points)"

    # nb restarts (its data plane stays pinned): it goes on from the weights its plane serves,
    # not from full capacity, so it serves na's table from its first moment.
    local want
    want=$(live_digest na)
    kill -TERM "$(cat "$WORK/lb-nb.pid")"
    wait "$(cat "$WORK/lb-nb.pid")" 2>/dev/null || true
    rm -f "$WORK/stop-sampling"
    (while [ ! -f "$WORK/stop-sampling" ]; do live_digest nb >>"$WORK/restart-digests" || true; done) &
    sampler=$!
    start_node nb "$1"
    sleep 3
    touch "$WORK/stop-sampling"
    wait "$sampler" || true
    local other
    other=$(grep -vcF "$want" "$WORK/restart-digests" || true)
    [ "$other" = 0 ] || fail "the restarted node served another table in $other of $(grep -c . "$WORK/restart-digests") samples: $(sort "$WORK/restart-digests" | uniq -c)"
    say "nb restarted with --pin: its table was na's in all $(grep -c . "$WORK/restart-digests") samples, before and after it adopted its plane"
}
