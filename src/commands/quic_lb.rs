//! `lb quic-lb -c FILE -b BACKEND`: what a backend's QUIC server needs to issue connection IDs
//! lb routes to it (QUIC-LB): its server ID and its service's parameters, as
//! lb_core::quic_lb::ServerParams reads them.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use lb::report;

#[derive(clap::Args)]
pub struct Args {
    /// The pool YAML file.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: PathBuf,
    /// The backend: its name, or its address when it has none.
    #[arg(long, short = 'b', value_name = "NAME")]
    backend: String,
    /// The service, when the backend is in several `quic_lb:` services.
    #[arg(long, short = 's', value_name = "NAME")]
    service: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let Args { config, backend, service, json } = args;
    let pool = super::load(&config)?;
    let (s, params) = report::quic_lb_params(&pool, &backend, service.as_deref()).map_err(|e| anyhow::anyhow!("{}: {e}", config.display()))?;
    super::to_stdout(|out| {
        if json {
            serde_json::to_writer(&mut *out, &report::quic_lb_json(s, &backend, &params)).context("writing JSON")?;
            writeln!(out)?;
        } else {
            let comment = format!(
                "lb quic-lb: backend {backend} of service {} ({}), from {}\nQUIC-LB, draft-ietf-quic-load-balancers-21{}",
                s.name,
                s.endpoint(),
                config.display(),
                if params.key.is_some() { "; holds the key: keep it as secret as the pool file" } else { "" }
            );
            write!(out, "{}", params.to_yaml(&comment))?;
        }
        Ok(())
    })
}
