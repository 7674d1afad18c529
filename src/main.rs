//! `lb`: command-line entry point and dispatch. `lb attach`'s flags become one validated
//! [`settings::Settings`] value, once (src/settings.rs); nothing downstream reads flags or YAML
//! again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, Parser, Subcommand};

use lb::config::{self, Pool, Service};
use lb::{diff, report, table};

use settings::Settings;

mod agent;
mod daemon;
mod decap;
mod log;
mod manual;
mod pinned;
mod plane;
mod settings;
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
    Check {
        /// The pool YAML file.
        #[arg(long, short = 'c', value_name = "FILE")]
        config: PathBuf,
    },
    /// Build each service's destination table and show how it shares the slots.
    Table {
        /// The pool YAML file.
        #[arg(long, short = 'c', value_name = "FILE")]
        config: PathBuf,
        /// Only this service.
        #[arg(long, short = 's', value_name = "NAME")]
        service: Option<String>,
        /// Print JSON, including every slot's owner.
        #[arg(long)]
        json: bool,
    },
    /// Load the XDP program, attach it to IFACE and serve the pool until Ctrl-C or SIGTERM.
    Attach(settings::AttachArgs),
    /// Remove a pinned data plane: detach its program from IFACE and remove its pins.
    Detach {
        /// The interface the pinned program is attached to.
        #[arg(value_name = "IFACE")]
        iface: String,
        /// The bpffs directory `lb attach --pin` pinned under (its --pin-dir) [default:
        /// /sys/fs/bpf/lb, then lb.service's /sys/fs/bpf/lb-unit]
        #[arg(long, value_name = "DIR")]
        pin_dir: Option<PathBuf>,
    },
    /// Show a pinned data plane from its maps: program, controller, services, backends, counters.
    Status {
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
    },
    /// On IFACE, strip lb's IPIP and GUE encapsulation from packets an allowed source sends to
    /// this host, when the packet inside is for this host too: the backend side of
    /// `forward: ipip | gue`, for hosts without the kernel's tunnel drivers.
    Decap(decap::DecapArgs),
    /// Report a process's load to lb's agent checks (`agent:` in a service): a reference agent
    /// that answers each connection with the process's capacity in percent.
    Agent(agent::AgentArgs),
    /// Print what a backend's QUIC server needs to issue connection IDs that lb routes to it
    /// (QUIC-LB, `quic_lb:` services): its server ID and the service's parameters, key included,
    /// as the text lb::quic_lb::ServerParams reads (YAML, keys named as in the draft's model).
    QuicLb {
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
    },
    /// Write lb's man pages (lb.1, lb-attach.1, ...) into DIR, made from these help texts.
    Man {
        /// The directory to write them into (created if missing).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Print the completion script for SHELL (bash: `source <(lb completions bash)`).
    Completions {
        /// The shell to complete for.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Show which slots a change from OLD to NEW would move, before applying it.
    Diff {
        /// The pool file as it is served now.
        #[arg(value_name = "OLD")]
        old: PathBuf,
        /// The pool file as it would be.
        #[arg(value_name = "NEW")]
        new: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
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

fn load(path: &Path) -> Result<Pool> {
    // The ConfigError already names file, line, column and field.
    config::load(path).map_err(anyhow::Error::new)
}

fn run(cli: Cli) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Attach(args) => {
            drop(out);
            let (settings, pool, content) = Settings::from_args(args)?;
            return daemon::run(settings, pool, &content);
        }
        Command::Detach { iface, pin_dir } => {
            drop(out);
            return pinned::detach(&iface, pin_dir.as_deref());
        }
        Command::Status { iface, json, pin_dir } => {
            drop(out);
            return pinned::status(&iface, pin_dir.as_deref(), json);
        }
        Command::Decap(args) => {
            drop(out);
            return decap::run(args);
        }
        Command::Agent(args) => {
            drop(out);
            return agent::run(args);
        }
        Command::Man { dir } => {
            for page in manual::man_pages(Cli::command(), &dir)? {
                writeln!(out, "{}", page.display())?;
            }
        }
        Command::Completions { shell } => manual::completions(Cli::command(), shell, &mut out)?,
        Command::Check { config } => {
            let pool = load(&config)?;
            for s in &pool.services {
                writeln!(out, "{}", report::service_summary(s))?;
            }
            writeln!(out, "{}: ok, {} service(s)", config.display(), pool.services.len())?;
        }
        Command::Table { config, service, json } => {
            let pool = load(&config)?;
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
            if json {
                let services: Vec<serde_json::Value> = selected.iter().map(|s| report::table_json(s, &build(s))).collect();
                serde_json::to_writer(&mut out, &serde_json::json!({ "services": services }))
                    .context("writing JSON")?;
                writeln!(out)?;
            } else {
                for (i, s) in selected.iter().enumerate() {
                    if i > 0 {
                        writeln!(out)?;
                    }
                    write!(out, "{}", report::table_text(s, &build(s)))?;
                }
            }
        }
        Command::QuicLb { config, backend, service, json } => {
            let pool = load(&config)?;
            let (s, params) = report::quic_lb_params(&pool, &backend, service.as_deref())
                .map_err(|e| anyhow::anyhow!("{}: {e}", config.display()))?;
            if json {
                serde_json::to_writer(&mut out, &report::quic_lb_json(s, &backend, &params)).context("writing JSON")?;
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
        }
        Command::Diff { old, new, json } => {
            let (a, b) = (lb::load::at_full_capacity(&load(&old)?), lb::load::at_full_capacity(&load(&new)?));
            let diffs = diff::diff(&a, &b);
            if json {
                serde_json::to_writer(&mut out, &report::diff_json(&diffs)).context("writing JSON")?;
                writeln!(out)?;
            } else {
                write!(out, "{}", report::diff_text(&diffs))?;
            }
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
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
