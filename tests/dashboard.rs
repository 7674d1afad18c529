//! The Grafana dashboard (configs/grafana/lb-dashboard.json) holds together without root: every
//! metric its queries name is one docs/monitoring.md documents (so renaming a metric fails here,
//! before the end-to-end test runs it against a real Prometheus), every panel reads the data
//! source variable, and every variable a query uses is defined. No root needed.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

const DASHBOARD: &str = "configs/grafana/lb-dashboard.json";

/// Grafana's own variables, which a dashboard uses without defining.
const BUILTIN: [&str; 3] = ["__rate_interval", "__interval", "__range"];

fn dashboard() -> Value {
    let text = std::fs::read_to_string(DASHBOARD).expect("the dashboard exists");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every panel, rows' nested panels included.
fn panels(list: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in list.as_array().into_iter().flatten() {
        out.push(p);
        out.extend(panels(&p["panels"]));
    }
    out
}

/// (panel title, expression) for every target of every panel, and every query variable's query.
fn queries(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(&d["panels"]) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("panel {}: a target without expr", p["title"]));
            out.push((p["title"].as_str().unwrap_or("?").to_string(), expr.to_string()));
        }
    }
    for v in d["templating"]["list"].as_array().into_iter().flatten().filter(|v| v["type"] == "query") {
        let q = v["query"]["query"].as_str().or(v["query"].as_str()).expect("a query variable's query");
        out.push((format!("variable {}", v["name"]), q.to_string()));
    }
    out
}

/// Words of `text` that start with `prefix` and go on with letters, digits and `_`.
fn words<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let starts_word = rest[..i].chars().next_back().is_none_or(|c| !ident(c));
        let after = i + prefix.len();
        let end = rest[after..].find(|c: char| !ident(c)).map_or(rest.len(), |n| after + n);
        if starts_word {
            out.push(&rest[i..end]);
        }
        rest = &rest[end..];
    }
    out
}

/// The metrics of docs/monitoring.md's table, each with its type: the first column's names
/// (`lb_x_total{reason}`, `lb_a`, `lb_b`), the second column's type.
fn documented() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string("docs/monitoring.md").expect("docs/monitoring.md");
    let section = text.split("\n## The metrics").nth(1).expect("a section 'The metrics'");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut out = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `lb_")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (names, ty) = (cells[1], cells[2]);
        for name in words(names, "lb_") {
            out.insert(name.to_string(), ty.to_string());
        }
    }
    assert!(out.len() > 20, "found only {} metrics in docs/monitoring.md's table: {out:?}", out.len());
    out
}

/// Whether `name` is a documented metric, or a series of a documented histogram.
fn is_documented(name: &str, docs: &BTreeMap<String, String>) -> bool {
    docs.contains_key(name)
        || ["_bucket", "_sum", "_count"]
            .iter()
            .any(|s| name.strip_suffix(s).and_then(|base| docs.get(base)).is_some_and(|ty| ty == "histogram"))
}

#[test]
fn every_metric_the_dashboard_queries_is_documented() {
    let d = dashboard();
    let docs = documented();
    let mut used = BTreeSet::new();
    let mut unknown = Vec::new();
    for (title, expr) in queries(&d) {
        for name in words(&expr, "lb_") {
            used.insert(name.to_string());
            if !is_documented(name, &docs) {
                unknown.push(format!("{title}: {name}"));
            }
        }
    }
    assert!(unknown.is_empty(), "metrics the dashboard queries that docs/monitoring.md does not list: {unknown:#?}");
    // The panels issue 27 asks for are there.
    for name in [
        "lb_forwarded_packets_total",
        "lb_forwarded_bytes_total",
        "lb_dropped_packets_total",
        "lb_flow_table_entries",
        "lb_flow_table_capacity",
        "lb_flow_table_lookups_total",
        "lb_reloads_total",
        "lb_backend_healthy",
        "lb_backend_probes_total",
        "lb_backend_probe_duration_seconds_bucket",
        "lb_build_info",
    ] {
        assert!(used.contains(name), "no panel queries {name}");
    }
}

#[test]
fn every_panel_reads_the_data_source_variable_and_only_defined_variables() {
    let d = dashboard();
    let vars = d["templating"]["list"].as_array().expect("template variables");
    let ds = vars.iter().find(|v| v["type"] == "datasource").expect("a data source variable");
    assert_eq!(ds["query"], "prometheus");
    let ds_ref = format!("${{{}}}", ds["name"].as_str().expect("its name"));
    let defined: BTreeSet<&str> = vars.iter().filter_map(|v| v["name"].as_str()).chain(BUILTIN).collect();
    assert!(defined.contains("service"), "no service variable");

    let mut ids = BTreeSet::new();
    for p in panels(&d["panels"]) {
        let title = p["title"].as_str().expect("every panel has a title");
        assert!(ids.insert(p["id"].as_u64().expect("a panel id")), "panel {title}: its id is taken");
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().expect("gridPos.x"), g["w"].as_u64().expect("gridPos.w"));
        assert!(x + w <= 24, "panel {title}: wider than the grid's 24 columns");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], ds_ref.as_str(), "panel {title}: not on the data source variable");
        let targets = p["targets"].as_array().filter(|t| !t.is_empty()).unwrap_or_else(|| panic!("panel {title}: no query"));
        let mut refs = BTreeSet::new();
        for t in targets {
            assert_eq!(t["datasource"]["uid"], ds_ref.as_str(), "panel {title}: a target not on the data source variable");
            assert!(refs.insert(t["refId"].as_str().expect("a refId")), "panel {title}: refIds repeat");
        }
    }
    for (title, expr) in queries(&d) {
        // `${name}` and `$name` name the same variable.
        let expr = expr.replace("${", "$");
        for var in words(&expr, "$") {
            let name = var.trim_start_matches('$');
            assert!(defined.contains(name), "{title}: {expr} uses ${name}, which is not defined");
        }
    }
}
