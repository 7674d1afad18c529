//! `lb`: the command line and its dispatch, nothing else. Each subcommand is a room of its own
//! in src/commands/, with its arguments and its run; `lb attach`'s flags become one validated
//! [`settings::Settings`] value there, once, and src/daemon/ serves it.

use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};

mod commands;
mod daemon;
mod log;
mod settings;
mod store;
mod xdp;

/// `lb --version`: the crate's version, the commit it was built from (build.rs) and the layout
/// of the BPF maps it pins (the hash of crates/dataplane/src/bpf/lb.h, which decides whether a pinned data plane
/// is adopted or replaced). `lb_build_info` carries the same.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("LB_GIT_COMMIT"),
    ", BPF layout ",
    env!("LB_LAYOUT_HEX"),
    ")"
);

#[derive(Parser)]
#[command(name = "lb", version = VERSION, about = "An XDP Layer-4 load balancer with consistent-hash destination tables")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of the attach variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Validate a pool file and print one line per service.
    Check(commands::check::Args),
    /// Build each service's destination table and show how it shares the slots.
    Table(commands::table::Args),
    /// Load the XDP program, attach it to IFACE and serve the pool until Ctrl-C or SIGTERM.
    Attach(commands::attach::Args),
    /// Remove a pinned data plane: detach its program from IFACE and remove its pins.
    Detach(commands::detach::Args),
    /// Show a pinned data plane from its maps: program, controller, services, backends, counters.
    Status(commands::status::Args),
    /// On IFACE, strip lb's IPIP and GUE encapsulation from packets an allowed source sends to
    /// this host, when the packet inside is for this host too: the backend side of
    /// `forward: ipip | gue`, for hosts without the kernel's tunnel drivers.
    Decap(commands::decap::Args),
    /// Report a process's load to lb's agent checks (`agent:` in a service): a reference agent
    /// that answers each connection with the process's capacity in percent.
    Agent(commands::agent::Args),
    /// Print what a backend's QUIC server needs to issue connection IDs that lb routes to it
    /// (QUIC-LB, `quic_lb:` services): its server ID and the service's parameters, key included,
    /// as the text lb::quic_lb::ServerParams reads (YAML, keys named as in the draft's model).
    QuicLb(commands::quic_lb::Args),
    /// Write lb's man pages (lb.1, lb-attach.1, ...) into DIR, made from these help texts.
    Man(commands::man::Args),
    /// Print the completion script for SHELL (bash: `source <(lb completions bash)`).
    Completions(commands::completions::Args),
    /// Show which slots a change from OLD to NEW would move, before applying it.
    Diff(commands::diff::Args),
    /// Push a pool file to a fleet's store (etcd): validate it, show what it moves against the
    /// stored pool, then write it and the pool it replaces in one transaction that fails if
    /// the stored pool changed meanwhile.
    Push(commands::push::Args),
    /// Show the nodes that serve a pool from the store: the revision and digests each applied,
    /// how far each lags, and any disagreement (exit status 1).
    Fleet(commands::fleet::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        // A closed pipe (`lb table --json | head`) is the reader's choice, not an error.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lb: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>().is_some_and(|j| j.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe))
    })
}

/// Each command's own run: main only dispatches.
fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Check(args) => commands::check::run(args),
        Command::Table(args) => commands::table::run(args),
        Command::Attach(args) => commands::attach::run(args),
        Command::Detach(args) => commands::detach::run(args),
        Command::Status(args) => commands::status::run(args),
        Command::Decap(args) => commands::decap::run(args),
        Command::Agent(args) => commands::agent::run(args),
        Command::QuicLb(args) => commands::quic_lb::run(args),
        Command::Man(args) => commands::man::run(args, Cli::command()),
        Command::Completions(args) => commands::completions::run(args, Cli::command()),
        Command::Diff(args) => commands::diff::run(args),
        Command::Push(args) => commands::push::run(args),
        Command::Fleet(args) => commands::fleet::run(args),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;


    /// Every command and argument says what it is for: `lb help`, the man pages and the shell
    /// completions are all made from these texts.
    #[test]
    fn every_command_and_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() == "help" {
                    continue;
                }
                let p = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(p.clone());
                }
                walk(sub, &p, missing);
            }
        }
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&cmd, "lb", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:?}");
    }
}
