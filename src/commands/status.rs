//! `lb status IFACE`: a pinned data plane shown from its maps, from any process.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use lb::dataplane::{layout_hash, pin, PinnedMaps};

use super::pinned::{controller_holds, find_plane};
use crate::log::since_text;
use crate::xdp::check_privileges;

#[derive(clap::Args)]
pub struct Args {
    /// The interface the pinned program is attached to.
    #[arg(value_name = "IFACE")]
    iface: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// The bpffs directory `lb attach --pin` pinned under (its --pin-dir) [default:
    /// /sys/fs/bpf/lb, then lb.service's /sys/fs/bpf/lb-unit]
    #[arg(long, value_name = "DIR")]
    pin_dir: Option<PathBuf>,
}

/// `lb status IFACE`: what the pinned data plane holds and counts, from any process.
pub fn run(args: Args) -> Result<ExitCode> {
    let (iface, given, json) = (args.iface.as_str(), args.pin_dir.as_deref(), args.json);
    check_privileges()?;
    let Some(dir) = find_plane(given, iface)? else {
        return Ok(ExitCode::FAILURE);
    };
    let link = pin::open_pinned(&dir.join(pin::LINK))?;
    let (link_id, prog_id, ifindex) = pin::link_info(&link)?;
    let maps = PinnedMaps::open(&dir)?;
    let meta = maps.meta()?.context("the pinned lb_meta has a format this version does not know")?;
    let running = controller_holds(&dir, meta.controller_pid);
    let st = lb::balancer::status(&maps)?;
    // With --config etcd://...: the controller's word on the fleet's store.
    let fleet: Option<serde_json::Value> = running
        .then(|| std::fs::read(crate::daemon::fleet_status_path(iface)).ok())
        .flatten()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let mut out = std::io::stdout().lock();
    if json {
        let v = serde_json::json!({
            "interface": iface,
            "ifindex": ifindex,
            "pin_dir": dir.display().to_string(),
            "program_id": prog_id,
            "link_id": link_id,
            "attached_ms": meta.attached_ms,
            "layout_matches": meta.layout == layout_hash(),
            "controller": if running { serde_json::json!({"pid": meta.controller_pid, "since_ms": meta.controller_since}) } else { serde_json::Value::Null },
            "status": st.json(),
            "fleet": fleet,
        });
        serde_json::to_writer(&mut out, &v)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "{iface} (ifindex {ifindex}): XDP program {prog_id}, link {link_id}, pinned at {}, attached {}",
            dir.display(),
            since_text(meta.attached_ms)
        )?;
        if running {
            writeln!(out, "controller: lb pid {}, since {}", meta.controller_pid, since_text(meta.controller_since))?;
        } else {
            writeln!(out, "controller: none (forwarding with the tables it has; health checks and reloads wait for one)")?;
        }
        if let Some(f) = &fleet {
            let state = if f["connected"].as_bool() == Some(true) {
                "connected".to_string()
            } else {
                format!("DOWN since {}{}", since_text(f["lost_since_ms"].as_u64().unwrap_or(0)), if f["alone"].as_bool() == Some(true) { ", deciding alone" } else { "" })
            };
            writeln!(
                out,
                "store: {} as node {}: {state}; pool revision {}, decided at {}{}",
                f["store"].as_str().unwrap_or("-"),
                f["node"].as_str().unwrap_or("-"),
                f["pool_revision"],
                f["revision"],
                f["refused"]["revision"].as_u64().map_or(String::new(), |r| format!("; refused revision {r}: {}", f["refused"]["reason"].as_str().unwrap_or("")))
            )?;
        }
        write!(out, "{}", st.text())?;
    }
    Ok(ExitCode::SUCCESS)
}
