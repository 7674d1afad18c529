//! `lb fleet etcd://.../KEY`: the nodes that serve a pool from the store, what each applied and
//! when, how far each lags, and every disagreement, from the store alone.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};

use lb::fleet::url::Entry;
use lb::fleet::{summary::Summary, NodeView};

use super::push::store_url;
use crate::store::{Client, TlsArgs, CALL_TIMEOUT};

#[derive(clap::Args)]
pub struct Args {
    /// etcd://HOST:PORT[,HOST:PORT...]/KEY, as the nodes' --config names it.
    #[arg(value_name = "URL")]
    url: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    tls: TlsArgs,
}

/// Exits 0 when every live node serves the newest pool with the same tables, 1 otherwise.
pub fn run(args: Args) -> Result<ExitCode> {
    let url = store_url(&args.url)?;
    let client = Client::new(&url, &args.tls, CALL_TIMEOUT)?;
    let snap = client.range(&url.key, &url.range_end()).context("reading the store")?;
    let pool_revision = snap.get(&url.key).map_or(0, |kv| kv.mod_revision);
    let nodes: Vec<NodeView> = snap
        .kvs
        .iter()
        // As the nodes count them.
        .filter_map(|kv| match url.classify(&kv.key) {
            Entry::Node(node) => NodeView::from_store(node, &kv.value, kv.lease),
            _ => None,
        })
        .collect();
    let summary = Summary::new(snap.revision, pool_revision, nodes);
    let now = lb::clock::unix_ms();
    super::to_stdout(|out| {
        if args.json {
            serde_json::to_writer(&mut *out, &summary.json(now)).context("writing JSON")?;
            writeln!(out)?;
        } else {
            write!(out, "{}", summary.text(now))?;
        }
        Ok(())
    })?;
    Ok(if summary.agrees() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
