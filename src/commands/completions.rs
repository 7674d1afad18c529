//! `lb completions SHELL`: the completion script, made from the clap definitions by
//! clap_complete (`lb man`'s sibling).

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use clap::Command;

#[derive(clap::Args)]
pub struct Args {
    /// The shell to complete for.
    #[arg(value_name = "SHELL")]
    shell: clap_complete::Shell,
}

/// Writes the completion script of `cli` (the whole command line) for the shell asked.
pub fn run(args: Args, cli: Command) -> Result<ExitCode> {
    super::to_stdout(|out| {
        completions(cli, args.shell, out)?;
        Ok(())
    })
}

/// Writes the completion script for `shell` to `out`. Made in memory first: clap_complete
/// panics on a failed write, and a closed pipe (`lb completions bash | head`) is not a panic.
fn completions(mut cmd: Command, shell: clap_complete::Shell, out: &mut dyn Write) -> std::io::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "lb", &mut script);
    out.write_all(&script)
}
