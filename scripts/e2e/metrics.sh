# shellcheck shell=bash
# Monitoring: lb's /metrics read by promtool and a real Prometheus, and its status page in a
# real browser (headless Chromium).

# GET http://127.0.0.1:9100$1 inside the load balancer's namespace.
lb_get() {
    ip netns exec "$PREFIX-lb" curl -sf --max-time 5 "http://127.0.0.1:9100$1"
}

# The test's Prometheus answer to the instant QUERY, as JSON.
prom_api() { # QUERY
    ip netns exec "$PREFIX-lb" curl -sf --max-time 5 --data-urlencode "query=$1" http://127.0.0.1:9090/api/v1/query
}

# An instant query to the test's Prometheus; prints the result vector as "labels value" lines.
prom_query() { # QUERY
    prom_api "$1" |
        python3 -c '
import json, sys
r = json.load(sys.stdin)["data"]["result"]
for s in r:
    print(s["metric"].get("backend", "-"), s["value"][1])'
}

# The value of QUERY's one result.
prom_value() { prom_query "$1" | awk '{print $2}'; }

prom_ready() { ip netns exec "$PREFIX-lb" curl -sf http://127.0.0.1:9090/-/ready >/dev/null 2>&1; }
prom_scraped_lb() { [ "$(prom_value 'up{job="lb"}')" = 1 ]; }

# A real Prometheus in the lb namespace, scraping lb's --metrics 127.0.0.1:9100 every second;
# returns once it has scraped lb. Its pid joins the test's (stopped with the topology).
prometheus_up() {
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
    wait_until 100 0.1 prom_ready || { tail -5 "$WORK/prom.log" >&2; fail "prometheus did not start"; }
    # Its first scrape comes a few seconds after it is ready (target discovery is batched).
    wait_until 150 0.1 prom_scraped_lb || fail "prometheus never scraped lb"
}

test_metrics_prometheus_and_the_status_page() { # MODE
    setup "$1"
    command -v prometheus >/dev/null && command -v promtool >/dev/null || fail "prometheus is not installed (scripts/setup.sh test installs it)"
    command -v chromium >/dev/null || fail "chromium is not installed (scripts/setup.sh test installs it)"
    web_add "$WORK/pool.yaml" "health_check: {kind: tcp, interval: 300ms, timeout: 250ms, rise: 2, fall: 2}"
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
    prometheus_up

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
        held=$(prom_value "lb_forwarded_packets_total{service=\"dns\",backend=\"$b\"}")
        prom_query "increase(lb_forwarded_packets_total{service=\"dns\",backend=\"$b\"}[20s])" >"$WORK/inc.$b"
        inc=$(awk '{printf "%.0f", $2}' "$WORK/inc.$b")
        [ "${held:-x}" = "$sent" ] || fail "$b: clients got $sent answers, Prometheus holds ${held:-nothing}"
        awk -v a="$inc" -v s="$sent" 'BEGIN {exit !(a >= 0.8 * s && a <= 1.2 * s)}' || { prom_api "lb_forwarded_packets_total{service=\"dns\",backend=\"$b\"}[20s]" >&2; fail "$b: increase() $inc for $sent packets"; }
        say "dns backend $b: $sent queries answered; lb_forwarded_packets_total $held; increase over 20 s $inc"
    done

    # A backend stopped by its health check shows health 0.
    topo_server_stop "$PREFIX" 2
    wait_log "web backend b2 10.99.0.12 is down" 1
    sleep 2.5
    [ "$(prom_value 'lb_backend_healthy{service="web",backend="b2"}')" = 0 ] || fail "Prometheus does not show b2 down"
    [ "$(prom_value 'lb_backend_healthy{service="web",backend="b1"}')" = 1 ] || fail "Prometheus does not show b1 up"
    say "after b2's server stopped, Prometheus shows lb_backend_healthy 0 for b2, 1 for b1"

    # The status page in headless Chromium: every service and backend with its health, the
    # escaped name, and a screenshot for people to look at.
    # A profile of its own: another Chromium running beside this test must not share it.
    local chrome=(chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars --user-data-dir="$WORK/chromium")
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

