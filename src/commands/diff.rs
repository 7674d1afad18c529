//! `lb diff OLD NEW`: which slots a change of pool would move, before it is applied.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use lb::{diff, report};

#[derive(clap::Args)]
pub struct Args {
    /// The pool file as it is served now.
    #[arg(value_name = "OLD")]
    old: PathBuf,
    /// The pool file as it would be.
    #[arg(value_name = "NEW")]
    new: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (a, b) = (lb::load::at_full_capacity(&super::load(&args.old)?), lb::load::at_full_capacity(&super::load(&args.new)?));
    let diffs = diff::diff(&a, &b);
    super::to_stdout(|out| {
        if args.json {
            serde_json::to_writer(&mut *out, &report::diff_json(&diffs)).context("writing JSON")?;
            writeln!(out)?;
        } else {
            write!(out, "{}", report::diff_text(&diffs))?;
        }
        Ok(())
    })
}
