//! `lb table -c FILE`: each service's destination table, built as lb serves it, and how its
//! backends share the slots.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};

use lb::config::Service;
use lb::{report, table};

#[derive(clap::Args)]
pub struct Args {
    /// The pool YAML file.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: PathBuf,
    /// Only this service.
    #[arg(long, short = 's', value_name = "NAME")]
    service: Option<String>,
    /// Print JSON, including every slot's owner.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let Args { config, service, json } = args;
    let pool = super::load(&config)?;
    let selected: Vec<&Service> = match &service {
        Some(name) => match pool.service(name) {
            Some(s) => vec![s],
            None => {
                let names: Vec<&str> = pool.services.iter().map(|s| s.name.as_str()).collect();
                bail!("{}: no service named `{name}` (services: {})", config.display(), names.join(", "));
            }
        },
        None => pool.services.iter().collect(),
    };
    // Built as lb serves them: load-aware services' weights in points (lb::load).
    let served = lb::load::at_full_capacity(&pool);
    let previous = pool.previous.as_deref().map(lb::load::at_full_capacity);
    let build = |s: &Service| {
        let s = served.service(&s.name).unwrap_or(s);
        table::with_hops(s, table::build_service(s), previous.as_ref().and_then(|p| p.service(&s.name)))
    };
    super::to_stdout(|out| {
        if json {
            let services: Vec<serde_json::Value> = selected.iter().map(|s| report::table_json(s, &build(s))).collect();
            serde_json::to_writer(&mut *out, &serde_json::json!({ "services": services })).context("writing JSON")?;
            writeln!(out)?;
        } else {
            for (i, s) in selected.iter().enumerate() {
                if i > 0 {
                    writeln!(out)?;
                }
                write!(out, "{}", report::table_text(s, &build(s)))?;
            }
        }
        Ok(())
    })
}
