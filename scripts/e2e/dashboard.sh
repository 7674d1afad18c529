# shellcheck shell=bash
# The Grafana dashboard (configs/grafana/lb-dashboard.json) against a real Prometheus scraping a
# real lb: every panel's every query, and every template variable, must return data, so the
# dashboard cannot drift from the metrics' names and labels. Uses prom_ready and prom_scraped_lb
# from metrics.sh.

DASHBOARD=configs/grafana/lb-dashboard.json

# Runs every query of the dashboard against the test's Prometheus (inside the lb namespace) and
# prints a line per query and variant: the panel, the target, the variables, how many series
# came back. A query fails when Prometheus refuses it, when it returns no series or only NaN, or
# when a series lacks a label the target's legend names (a legend of "{{backend}}" over series
# without one is a panel showing the wrong thing). Every failure is listed before it exits 1.
dashboard_check() { # DASHBOARD
    ip netns exec "$PREFIX-lb" python3 - "$1" <<'EOF'
import json, math, re, sys, urllib.parse, urllib.request

PROM = "http://127.0.0.1:9090/api/v1/"
# Straight to the test's Prometheus, whatever proxy the environment names.
OPEN = urllib.request.build_opener(urllib.request.ProxyHandler({})).open
# Grafana's own variables, given values that fit the test's 1 s scrapes and short life.
BUILTIN = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
# Each query runs with every service (Grafana's "All") and with one concrete service.
VARIANTS = [{"instance": ".*", "service": ".*"}, {"instance": ".*", "service": "web"}]

def get(path, params):
    url = PROM + path + "?" + urllib.parse.urlencode(params, doseq=True)
    try:
        with OPEN(url, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)

def substitute(expr, values):
    out = re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: values.get(m.group(1) or m.group(2), m.group(0)), expr)
    left = re.findall(r"\$\{?\w+", out)
    return out, left

def panels(items):
    for p in items:
        yield p
        yield from panels(p.get("panels", []))

d = json.load(open(sys.argv[1]))
failures = []

# The template variables: each label_values() must give values (Grafana's "label values" call).
for v in d["templating"]["list"]:
    if v["type"] != "query":
        continue
    q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
    q, left = substitute(q, {**BUILTIN, **VARIANTS[0]})
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q)
    if left or not m:
        failures.append(f"variable {v['name']}: cannot run {q!r}")
        continue
    r = get(f"label/{m.group(2)}/values", {"match[]": m.group(1)})
    values = r.get("data") or []
    print(f"    variable {v['name']}: {len(values)} values ({', '.join(values)})")
    if r.get("status") != "success" or not values:
        failures.append(f"variable {v['name']}: {q} gave no values ({r.get('error', 'empty')})")

queries = 0
for p in panels(d["panels"]):
    for t in p.get("targets", []):
        legend = re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", ""))
        counts = []
        for variant in VARIANTS:
            expr, left = substitute(t["expr"], {**BUILTIN, **variant})
            what = f"panel {p['title']!r} target {t['refId']} (service {variant['service']!r})"
            queries += 1
            if left:
                failures.append(f"{what}: unknown variables {left}")
                continue
            r = get("query", {"query": expr})
            if r.get("status") != "success":
                failures.append(f"{what}: {r.get('errorType')}: {r.get('error')}")
                continue
            series = r["data"]["result"]
            counts.append(str(len(series)))
            if not series:
                failures.append(f"{what}: no data: {expr}")
                continue
            if all(math.isnan(float(s["value"][1])) for s in series):
                failures.append(f"{what}: only NaN: {expr}")
            for label in legend:
                bare = [s["metric"] for s in series if not s["metric"].get(label)]
                if bare:
                    failures.append(f"{what}: the legend names {label!r}, {len(bare)} of {len(series)} series have none, e.g. {bare[0]}")
        print(f"    {p['title']} / {t['refId']}: {' and '.join(counts) or 'no'} series")

print(f"    {queries} queries run")
for f in failures:
    print(f"    FAILED {f}", file=sys.stderr)
sys.exit(1 if failures else 0)
EOF
}

test_dashboard_every_panel_query_returns_data() { # MODE
    setup "$1"
    command -v prometheus >/dev/null || fail "prometheus is not installed (scripts/setup.sh test installs it)"
    [ -f "$DASHBOARD" ] || fail "no $DASHBOARD"
    # web tracks connections (the flow table fills) and is health-checked (probes, latency);
    # ghost's backend does not exist, so its packets are dropped as no_mac.
    sed -i '/name: web$/,/backends:/ {/conntrack: off/d}' "$WORK/pool.yaml"
    web_add "$WORK/pool.yaml" "health_check: {kind: tcp, interval: 200ms, timeout: 150ms, rise: 2, fall: 2}"
    cat >>"$WORK/pool.yaml" <<'EOF'
  - name: ghost
    vip: 10.99.0.100
    port: 9999
    protocol: udp
    backends: [{address: 10.99.0.19, name: g1}]
EOF
    start_lb "$1" --metrics 127.0.0.1:9100 --resolve-timeout 0.3

    prometheus_up

    # Counters that move while Prometheus watches: TCP to web, UDP to dns, and to ghost (dropped).
    probe "$WORK/tcp" --vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --count 40 || fail "TCP to web"
    probe "$WORK/udp" --udp --vip 10.99.0.100 --port 53 --sources "$TOPO_CLIENTS4" --count 40 || fail "UDP to dns"
    probe "$WORK/ghost" --udp --vip 10.99.0.100 --port 9999 --sources "$TOPO_CLIENTS4" --count 4 --timeout-ms 200 || true
    # A reload applied, and one refused.
    reload_without_web
    echo "services: [" | write_atomic "$WORK/pool.yaml"
    wait_log "reload refused" 1
    # A stopped backend: its probes fail until it is down.
    topo_server_stop "$PREFIX" 2
    wait_log "web backend b2 10.99.0.12 is down" 1
    # The decision is logged before the tables are written: new connections avoid b2 from then.
    wait_log "web changed (b2 active -> down" 1
    # More traffic after all that, and time for Prometheus to scrape it.
    probe "$WORK/tcp2" --vip 10.99.0.100 --port 80 --sources "$TOPO_CLIENTS4" --first-port 21000 --count 20 || fail "TCP to web after b2 stopped"
    sleep 3
    local dropped
    dropped=$(prom_value 'sum(lb_dropped_packets_total{reason="no_mac"})')
    [ "${dropped:-0}" -gt 0 ] || fail "no packet was dropped as no_mac"
    say "lb forwarded TCP and UDP, dropped $dropped packets as no_mac, reloaded (applied and refused), b2 down"

    dashboard_check "$DASHBOARD" || fail "some of the dashboard's queries failed (listed above)"
    say "every query of $DASHBOARD returned data"
}
