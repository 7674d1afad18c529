//! `lb man DIR`: the man pages, made from the clap definitions (main.rs and each command's
//! `Args`) by clap_mangen, so that they say what the binary does. The Debian package ships them
//! (scripts/package.sh); nothing here is written by hand. `lb completions` is its sibling.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Command;

#[derive(clap::Args)]
pub struct Args {
    /// The directory to write them into (created if missing).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

/// `lb man DIR`: writes the pages of `cli` (the whole command line) and prints their paths.
pub fn run(args: Args, cli: Command) -> Result<ExitCode> {
    super::to_stdout(|out| {
        for page in man_pages(cli, &args.dir)? {
            writeln!(out, "{}", page.display())?;
        }
        Ok(())
    })
}

/// Writes one page per command into `dir`: lb.1, and lb-attach.1 and friends (the names `man`
/// looks for, `man lb-attach`). Returns the files written, in command order. The pages carry no
/// date, so the same source gives the same pages.
fn man_pages(cmd: Command, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    collect(&cmd, &mut pages);
    let names: Vec<String> = pages.iter().map(|c| page_name(c)).collect();
    let mut written = Vec::new();
    for page in pages {
        let name = page_name(page);
        let path = dir.join(format!("{name}.1"));
        let mut text = Vec::new();
        clap_mangen::Man::new(page.clone())
            .source(format!("lb {}", env!("CARGO_PKG_VERSION")))
            .manual("lb manual")
            .render(&mut text)
            .with_context(|| format!("rendering {name}.1"))?;
        see_also(&mut text, &name, &names)?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// The command and its visible subcommands, depth first.
fn collect<'a>(cmd: &'a Command, out: &mut Vec<&'a Command>) {
    out.push(cmd);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect(sub, out);
    }
}

/// `lb`, `lb-attach`: clap names a built subcommand after its parents.
fn page_name(cmd: &Command) -> String {
    cmd.get_display_name().unwrap_or_else(|| cmd.get_name()).to_string()
}

/// A SEE ALSO section naming the other pages and the full documentation.
fn see_also(text: &mut Vec<u8>, this: &str, names: &[String]) -> Result<()> {
    let others: Vec<String> = names.iter().filter(|n| n.as_str() != this).map(|n| format!("\\fB{n}\\fR(1)")).collect();
    writeln!(text, ".SH \"SEE ALSO\"")?;
    writeln!(text, "{}", others.join(", "))?;
    writeln!(text, ".PP")?;
    writeln!(
        text,
        "The full documentation (configuration, operating, monitoring, restarts, encapsulation, fleets) is in /usr/share/doc/lb/ when lb is installed from its package, and under docs/ in its source."
    )?;
    Ok(())
}
