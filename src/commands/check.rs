//! `lb check -c FILE`: a pool file validated whole, one line per service.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use lb::report;

#[derive(clap::Args)]
pub struct Args {
    /// The pool YAML file.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: PathBuf,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let pool = super::load(&args.config)?;
    super::to_stdout(|out| {
        for s in &pool.services {
            writeln!(out, "{}", report::service_summary(s))?;
        }
        writeln!(out, "{}: ok, {} service(s)", args.config.display(), pool.services.len())?;
        Ok(())
    })
}
