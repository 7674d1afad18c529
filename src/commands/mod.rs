//! One room per subcommand, each with its arguments (a clap `Args`) and its `run`; src/main.rs
//! only names them and dispatches. `lb attach` serves through src/daemon/; the rooms here that
//! share something keep it beside them (`pinned` for status and detach, `values` for flag
//! parsers).

pub mod agent;
pub mod attach;
pub mod check;
pub mod completions;
pub mod decap;
pub mod detach;
pub mod diff;
pub mod fleet;
pub mod man;
mod pinned;
pub mod push;
pub mod quic_lb;
pub mod status;
pub mod table;
pub(crate) mod values;

use std::io::{StdoutLock, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;

use lb::config::{self, Pool};

/// A pool file loaded and validated whole (its error already names file, line, column and
/// field).
fn load(path: &Path) -> Result<Pool> {
    config::load(path).map_err(anyhow::Error::new)
}

/// A command that prints what it found: `write` puts it on stdout, locked once and flushed at
/// the end (a closed pipe is main's to forgive), and the command succeeds.
fn to_stdout(write: impl FnOnce(&mut StdoutLock<'static>) -> Result<()>) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    write(&mut out)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
