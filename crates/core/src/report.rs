//! What `lb check`, `lb table` and `lb diff` print, as text for people and JSON for programs.

use std::fmt::Write;

use serde_json::{json, Value};

use crate::config::{Algorithm, Forward, Service};
use crate::diff::{Change, ServiceDiff};
use crate::table::{shares, Table};

/// One line describing a validated service.
pub fn service_summary(s: &Service) -> String {
    let live = s.backends.iter().filter(|b| b.serving_weight() > 0).count();
    let mut line = format!(
        "{}: {} {} slots={} hash={} backends={} (with weight: {}, total weight {})",
        s.name,
        s.endpoint(),
        s.algorithm.as_str(),
        s.slots,
        s.hash.as_str(),
        s.backends.len(),
        live,
        s.total_weight()
    );
    if s.algorithm == Algorithm::Ring {
        let _ = write!(line, " vnodes_per_weight={}", s.vnodes_per_weight);
    }
    if s.algorithm == Algorithm::Bounded {
        let _ = write!(line, " load_bound={}.{:03}", s.load_bound / 1000, s.load_bound % 1000);
    }
    match s.forward {
        Forward::L2 => {}
        Forward::Ipip => line.push_str(" forward=ipip"),
        Forward::Gue => {
            let _ = write!(line, " forward=gue gue_port={}", s.gue_port);
            if s.second_chance {
                line.push_str(" second_chance=on");
            }
        }
    }
    if let Some(a) = &s.agent {
        let _ = write!(line, " agent={}:{}{} every {:?}", if a.path.is_some() { "http" } else { "tcp" }, a.port, a.path.as_deref().unwrap_or(""), a.interval);
    }
    if let Some(ss) = &s.slow_start {
        let _ = write!(line, " slow_start={:?}", ss.window);
    }
    if let Some(q) = &s.quic_lb {
        let mode = if q.key.is_some() { "encrypted" } else { "plaintext" };
        let _ = write!(line, " quic_lb=rotation:{},server_id:{},nonce:{},{mode}", q.rotation, q.server_id_len, q.nonce_len);
    }
    if live == 0 {
        line.push_str(" [empty table: traffic to this service is dropped]");
    }
    line
}

fn percent(x: f64) -> String {
    format!("{:.3}%", x * 100.0)
}

/// The per-backend table of `lb table`.
pub fn table_text(s: &Service, table: &Table) -> String {
    let shares = shares(s, table);
    let rows: Vec<[String; 6]> = s
        .backends
        .iter()
        .zip(&shares)
        .map(|(b, sh)| {
            let who = match &b.name {
                Some(n) => format!("{n} ({})", b.address),
                None => b.address.to_string(),
            };
            let dev = match sh.deviation() {
                Some(d) => format!("{:+.3}%", d * 100.0),
                None => "-".to_string(),
            };
            [who, b.weight.to_string(), sh.slots.to_string(), percent(sh.share), percent(sh.ideal), dev]
        })
        .collect();
    let header = ["backend", "weight", "slots", "share", "ideal", "deviation"];
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let _ = writeln!(out, "{}", service_summary(s));
    let line = |out: &mut String, cells: [&str; 6]| {
        let _ = write!(out, "  {:<w$}", cells[0], w = widths[0]);
        for (cell, w) in cells[1..].iter().zip(&widths[1..]) {
            let _ = write!(out, "  {:>w$}", cell, w = *w);
        }
        out.push('\n');
    };
    line(&mut out, header);
    for r in &rows {
        line(&mut out, [&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
    }
    let empty = table.owners().iter().filter(|&&o| o == crate::table::EMPTY).count();
    if empty > 0 {
        let _ = writeln!(out, "  empty slots: {empty} of {}", table.len());
    }
    if s.second_chance {
        let with = |k: usize| table.hops().iter().filter(|h| h[k] != crate::table::EMPTY).count();
        let _ = writeln!(
            out,
            "  second chance: {} slots list their previous owner, {} a runner-up",
            with(0),
            with(1)
        );
    }
    let ids: Vec<String> = s.backends.iter().map(|b| b.identity()).collect();
    let _ = writeln!(out, "  digest: {:016x}", crate::table::digest(table, &ids));
    if let Some(q) = &s.quic_lb {
        let sids: Vec<String> = s
            .backends
            .iter()
            .map(|b| format!("{} {}", b.identity(), b.server_id.as_deref().map(crate::quic_lb::hex).unwrap_or_default()))
            .collect();
        let _ = writeln!(
            out,
            "  quic-lb: server IDs {} (`lb quic-lb --backend NAME` prints a server's parameters{})",
            sids.join(", "),
            if q.key.is_some() { ", key included" } else { "" }
        );
    }
    if s.load_aware() {
        let _ = writeln!(
            out,
            "  weights as configured, at full capacity: lb serves each scaled by its agent's reports and slow start (the status page, --stats-interval and the log say how, and why)"
        );
    }
    out
}

/// One service of `lb table --json`.
pub fn table_json(s: &Service, table: &Table) -> Value {
    let ids: Vec<String> = s.backends.iter().map(|b| b.identity()).collect();
    let shares = shares(s, table);
    let backends: Vec<Value> = s
        .backends
        .iter()
        .zip(&ids)
        .zip(&shares)
        .map(|((b, id), sh)| {
            let mut v = json!({
                "identity": id,
                "address": b.address.to_string(),
                "weight": b.weight,
                "slots": sh.slots,
                "share": sh.share,
                "ideal_share": sh.ideal,
            });
            if let Some(sid) = &b.server_id {
                v["server_id"] = json!(crate::quic_lb::hex(sid));
            }
            v
        })
        .collect();
    let entries: Vec<Value> = (0..table.len())
        .map(|i| match table.owner(i) {
            Some(o) => Value::String(ids[o].clone()),
            None => Value::Null,
        })
        .collect();
    let mut v = json!({
        "name": s.name,
        "vip": s.vip.to_string(),
        "port": s.port,
        "protocol": s.protocol.as_str(),
        "hash": s.hash.as_str(),
        "forward": s.forward.as_str(),
        "algorithm": s.algorithm.as_str(),
        "slots": s.slots,
        "backends": backends,
        "table": entries,
    });
    if s.algorithm == Algorithm::Bounded {
        v["load_bound"] = json!(s.load_bound as f64 / 1000.0);
    }
    if s.second_chance {
        // Per slot, the backends besides its owner that a packet tries next, in order.
        let name = |o: u32| (o != crate::table::EMPTY).then(|| ids[o as usize].clone());
        let hops: Vec<Value> = table.hops().iter().map(|h| json!(h.iter().filter_map(|&o| name(o)).collect::<Vec<_>>())).collect();
        v["second_chance"] = json!(true);
        v["hops"] = json!(hops);
    }
    let ids: Vec<String> = s.backends.iter().map(|b| b.identity()).collect();
    v["digest"] = json!(format!("{:016x}", crate::table::digest(table, &ids)));
    if let Some(a) = &s.agent {
        v["agent"] = json!({"port": a.port, "path": a.path, "interval_seconds": a.interval.as_secs_f64(), "timeout_seconds": a.timeout.as_secs_f64()});
    }
    if let Some(q) = &s.quic_lb {
        // The key stays out: `lb table --json` output lands in logs and tickets.
        v["quic_lb"] = json!({"rotation": q.rotation, "server_id_len": q.server_id_len, "nonce_len": q.nonce_len, "encrypted": q.key.is_some()});
    }
    if let Some(ss) = &s.slow_start {
        v["slow_start"] = json!({"window_seconds": ss.window.as_secs_f64(), "min_percent": ss.min_percent, "aggression": ss.aggression});
    }
    v
}

fn owner_name(o: &Option<String>) -> &str {
    o.as_deref().unwrap_or("(empty)")
}

/// The human-readable report of `lb diff`.
pub fn diff_text(diffs: &[ServiceDiff]) -> String {
    let mut out = String::new();
    if diffs.is_empty() {
        out.push_str("no services in either file\n");
    }
    for d in diffs {
        match d.change {
            Change::Added | Change::Removed => {
                let _ = writeln!(out, "{}: {}", d.name, d.notes.join("; "));
                continue;
            }
            Change::Unchanged => {
                let _ = writeln!(out, "{}: unchanged", d.name);
                continue;
            }
            Change::Changed => {}
        }
        let unit = if d.sampled { "sampled flows" } else { "slots" };
        let _ = writeln!(
            out,
            "{}: {} of {} {} change owner ({}); unavoidable minimum {}",
            d.name,
            d.moved,
            d.compared,
            unit,
            percent(d.moved_fraction()),
            percent(d.minimum)
        );
        for n in &d.notes {
            let _ = writeln!(out, "  note: {n}");
        }
        if !d.moves.is_empty() {
            let _ = writeln!(out, "  moves (from -> to: {unit}):");
            for m in &d.moves {
                let _ = writeln!(out, "    {} -> {}: {}", owner_name(&m.from), owner_name(&m.to), m.count);
            }
        }
    }
    out
}

pub fn diff_json(diffs: &[ServiceDiff]) -> Value {
    let services: Vec<Value> = diffs
        .iter()
        .map(|d| {
            json!({
                "name": d.name,
                "change": d.change.as_str(),
                "old_slots": d.old_slots,
                "new_slots": d.new_slots,
                "compared": d.compared,
                "sampled": d.sampled,
                "moved": d.moved,
                "moved_fraction": d.moved_fraction(),
                "minimum_fraction": d.minimum,
                "moves": d.moves.iter().map(|m| json!({"from": m.from, "to": m.to, "count": m.count})).collect::<Vec<_>>(),
                "notes": d.notes,
            })
        })
        .collect();
    json!({ "services": services })
}

/// `lb quic-lb`: the service and server parameters of `backend` (its name, or its address when
/// it has none) among the pool's `quic_lb:` services, or why there are none.
pub fn quic_lb_params<'p>(pool: &'p crate::config::Pool, backend: &str, service: Option<&str>) -> Result<(&'p Service, crate::quic_lb::ServerParams), String> {
    let quic: Vec<&Service> = pool.services.iter().filter(|s| s.quic_lb.is_some()).collect();
    if quic.is_empty() {
        return Err("no service has `quic_lb:`".to_string());
    }
    let named: Vec<&Service> = quic.iter().copied().filter(|s| service.is_none_or(|n| s.name == n)).collect();
    let found: Vec<(&Service, &crate::config::Backend)> =
        named.iter().flat_map(|s| s.backends.iter().filter(|b| b.identity() == backend).map(move |b| (*s, b))).collect();
    match found.as_slice() {
        [(s, b)] => {
            let q = s.quic_lb.as_ref().expect("filtered on quic_lb");
            let server_id = b.server_id.clone().expect("every backend of a quic_lb service has a server ID");
            Ok((s, crate::quic_lb::ServerParams { rotation: q.rotation, server_id, nonce_len: q.nonce_len as usize, key: q.key }))
        }
        [] => {
            let names: Vec<String> =
                named.iter().flat_map(|s| s.backends.iter().map(move |b| format!("{} ({})", b.identity(), s.name))).collect();
            match service {
                Some(n) if named.is_empty() => Err(format!(
                    "no `quic_lb:` service named `{n}` (those with quic_lb: {})",
                    quic.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
                )),
                _ => Err(format!("no backend `{backend}` in a `quic_lb:` service (backends: {})", names.join(", "))),
            }
        }
        many => Err(format!(
            "backend `{backend}` is in several `quic_lb:` services ({}): name one with --service",
            many.iter().map(|(s, _)| s.name.as_str()).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// `lb quic-lb --json`: the same parameters, under the same names, with where they come from.
pub fn quic_lb_json(s: &Service, backend: &str, p: &crate::quic_lb::ServerParams) -> Value {
    let mut v = json!({
        "service": s.name,
        "endpoint": s.endpoint(),
        "backend": backend,
        "config-rotation-bits": p.rotation,
        "server-id": crate::quic_lb::hex(&p.server_id),
        "server-id-length": p.server_id.len(),
        "nonce-length": p.nonce_len,
        "cid-length": p.cid_len(),
    });
    if let Some(k) = &p.key {
        v["cid-key"] = json!(crate::quic_lb::hex(k));
    }
    v
}
