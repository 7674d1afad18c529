//! `lb`: command-line entry point. Raw flags become a validated plan here, once; nothing
//! downstream reads flags or YAML again.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use lb::config::{self, Pool, Service};
use lb::{diff, report, table};

mod announce;
mod attach;
mod decap;
mod log;
mod persist;
mod probe;
mod serve_metrics;
mod watch;
mod xdp;

#[derive(Parser)]
#[command(name = "lb", version, about = "An XDP Layer-4 load balancer with consistent-hash destination tables")]
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
    Attach {
        /// The interface clients' traffic arrives on; backends must be on its link.
        #[arg(value_name = "IFACE")]
        iface: String,
        #[arg(long, short = 'c', value_name = "FILE")]
        config: PathBuf,
        /// Where the program runs: native (driver), generic (any interface, slower), or auto
        /// (native, falling back to generic with a warning).
        #[arg(long, value_enum, default_value = "auto", value_name = "MODE")]
        xdp_mode: xdp::ModeArg,
        /// Print per-service and per-backend counters and drop reasons every SECS seconds.
        #[arg(long, value_name = "SECS", value_parser = seconds)]
        stats_interval: Option<std::time::Duration>,
        /// Size of the data plane's destination-table array, in slots (4 bytes each): the sum of
        /// every service's `slots`, with room for tables being replaced.
        #[arg(long, value_name = "SLOTS", default_value_t = lb::dataplane::DEFAULT_TABLE_CAPACITY,
              value_parser = clap::value_parser!(u32).range(1..=1 << 28))]
        table_capacity: u32,
        /// Slots of the connection-tracking flow table, rounded up to a power of two (16 bytes
        /// each; when both buckets a new flow may use are full, the flow seen longest ago there
        /// is forgotten).
        #[arg(long, value_name = "FLOWS", default_value_t = lb::dataplane::DEFAULT_CONNTRACK_SIZE,
              value_parser = clap::value_parser!(u32).range(1..=1 << 26))]
        conntrack_size: u32,
        /// A tracked TCP flow idle this long is forgotten.
        #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "3600")]
        conntrack_tcp_timeout: std::time::Duration,
        /// A tracked UDP flow idle this long is forgotten.
        #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "30")]
        conntrack_udp_timeout: std::time::Duration,
        /// on: a flow gets its flow-table entry at its second packet (a TCP flow's first after
        /// the SYN); its first waits in a separate half-open table, so a flood of spoofed SYNs
        /// (or first UDP datagrams) can never evict established flows. off: at its first
        /// packet, evicting the flow seen longest ago when the table is full.
        #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
        conntrack_guard: bool,
        /// At start, wait at most SECS seconds for backends' MACs before attaching anyway.
        #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "2")]
        resolve_timeout: std::time::Duration,
        /// Reload this long after the config file stops changing (bursts of writes become one
        /// reload).
        #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "0.05")]
        reload_delay: std::time::Duration,
        /// Re-read the config file this often even when no change was signalled.
        #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "10")]
        recheck_interval: std::time::Duration,
        /// Outer source address of encapsulated (ipip, gue) packets, once per family. With a
        /// prefix length (10.1.0.0/24), the host bits vary with the flow hash, so that backends'
        /// receive-side scaling spreads IPIP flows. Default: the interface's first address of the
        /// family that is not a VIP, fixed.
        #[arg(long, value_name = "ADDR[/LEN]", value_parser = address_prefix)]
        encap_source: Vec<(std::net::IpAddr, u8)>,
        /// Pin the XDP link and every map under --pin-dir, so the data plane keeps forwarding
        /// after this process exits; a later `lb attach --pin` adopts it (or upgrades it).
        #[arg(long)]
        pin: bool,
        /// The bpffs directory for pins (mounted if it is an empty directory of another
        /// filesystem); one subdirectory per network namespace and interface.
        #[arg(long, value_name = "DIR", default_value = lb::dataplane::pin::DEFAULT_PIN_DIR)]
        pin_dir: PathBuf,
        /// Serve Prometheus metrics at http://ADDR:PORT/metrics and a status page at / (a
        /// loopback address is recommended: there is no authentication).
        #[arg(long, value_name = "ADDR:PORT")]
        metrics: Option<std::net::SocketAddr>,
        /// Keep every VIP as a host address on DEV (created as a dummy device if missing and
        /// the kernel has them), for a routing daemon to announce by BGP; withdrawn before the
        /// program goes.
        #[arg(long, value_name = "DEV")]
        announce: Option<String>,
    },
    /// Remove a pinned data plane: detach its program from IFACE and remove its pins.
    Detach {
        #[arg(value_name = "IFACE")]
        iface: String,
        #[arg(long, value_name = "DIR", default_value = lb::dataplane::pin::DEFAULT_PIN_DIR)]
        pin_dir: PathBuf,
    },
    /// Show a pinned data plane from its maps: program, controller, services, backends, counters.
    Status {
        #[arg(value_name = "IFACE")]
        iface: String,
        #[arg(long)]
        json: bool,
        #[arg(long, value_name = "DIR", default_value = lb::dataplane::pin::DEFAULT_PIN_DIR)]
        pin_dir: PathBuf,
    },
    /// Strip lb's IPIP and GUE encapsulation from packets addressed to this host, on IFACE: the
    /// backend side of `forward: ipip | gue`, for hosts without the kernel's tunnel drivers.
    Decap {
        /// The interface encapsulated packets arrive on.
        #[arg(value_name = "IFACE")]
        iface: String,
        /// The UDP port GUE packets are sent to (the services' `gue_port`).
        #[arg(long, value_name = "PORT", default_value_t = lb::config::DEFAULT_GUE_PORT,
              value_parser = clap::value_parser!(u16).range(1..))]
        gue_port: u16,
        #[arg(long, value_enum, default_value = "auto", value_name = "MODE")]
        xdp_mode: xdp::ModeArg,
        /// Print the counters every SECS seconds.
        #[arg(long, value_name = "SECS", value_parser = seconds)]
        stats_interval: Option<std::time::Duration>,
    },
    /// Show which slots a change from OLD to NEW would move, before applying it.
    Diff {
        #[arg(value_name = "OLD")]
        old: PathBuf,
        #[arg(value_name = "NEW")]
        new: PathBuf,
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

/// `10.0.0.1`, `10.1.0.0/24`, `fd00::1`, `fd00:1::/96`: an address and how many leading bits
/// stay fixed (all of them without a length).
fn address_prefix(s: &str) -> Result<(std::net::IpAddr, u8), String> {
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: std::net::IpAddr = a.trim().parse().map_err(|_| format!("`{a}` is not an IPv4 or IPv6 address"))?;
    let full = if addr.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => full,
        Some(l) => match l.trim().parse::<u8>() {
            Ok(n) if n <= full && n >= full - 32 => n,
            _ => return Err(format!("`/{l}`: expected a prefix length from {} to {full} (at most 32 bits vary)", full - 32)),
        },
    };
    if addr.is_unspecified() || addr.is_multicast() {
        return Err(format!("{addr} is not a unicast address"));
    }
    Ok((addr, len))
}

/// A duration in seconds, such as `5` or `0.5`.
fn seconds(s: &str) -> Result<std::time::Duration, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(v > 0.0 && v <= 86400.0) {
        return Err(format!("{s} seconds is out of range (0, 86400]"));
    }
    Ok(std::time::Duration::from_secs_f64(v))
}

fn load(path: &Path) -> Result<Pool> {
    // The ConfigError already names file, line, column and field.
    config::load(path).map_err(anyhow::Error::new)
}

fn run(cli: Cli) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Attach {
            iface,
            config,
            xdp_mode,
            stats_interval,
            table_capacity,
            conntrack_size,
            conntrack_tcp_timeout,
            conntrack_udp_timeout,
            conntrack_guard,
            resolve_timeout,
            reload_delay,
            recheck_interval,
            encap_source,
            pin,
            pin_dir,
            metrics,
            announce,
        } => {
            drop(out);
            let v4 = encap_source.iter().filter(|a| a.0.is_ipv4()).count();
            if v4 > 1 || encap_source.len() - v4 > 1 {
                bail!("--encap-source: give at most one address per family");
            }
            // The whole pool is validated before the first syscall.
            let (pool, content) = config::load_bytes(&config).map_err(anyhow::Error::new)?;
            let needed: u64 = pool.services.iter().map(|s| s.slots as u64).sum();
            if needed > table_capacity as u64 {
                bail!(
                    "{}: the services' tables need {needed} slots in all, more than --table-capacity {table_capacity}",
                    config.display()
                );
            }
            let plan = attach::Plan {
                iface,
                config,
                mode: xdp_mode,
                stats_interval,
                table_capacity,
                conntrack_size,
                conntrack_timeouts: (conntrack_tcp_timeout, conntrack_udp_timeout),
                conntrack_guard,
                resolve_timeout,
                reload_delay,
                recheck_interval,
                encap_sources: encap_source,
                pin: pin.then_some(pin_dir),
                metrics,
                announce,
            };
            return attach::run(plan, pool, &content);
        }
        Command::Detach { iface, pin_dir } => {
            drop(out);
            return persist::detach(&iface, &pin_dir);
        }
        Command::Status { iface, json, pin_dir } => {
            drop(out);
            return persist::status(&iface, &pin_dir, json);
        }
        Command::Decap { iface, gue_port, xdp_mode, stats_interval } => {
            drop(out);
            return decap::run(&iface, gue_port, xdp_mode, stats_interval);
        }
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
            if json {
                let services: Vec<serde_json::Value> =
                    selected.iter().map(|s| report::table_json(s, &table::build_service(s))).collect();
                serde_json::to_writer(&mut out, &serde_json::json!({ "services": services }))
                    .context("writing JSON")?;
                writeln!(out)?;
            } else {
                for (i, s) in selected.iter().enumerate() {
                    if i > 0 {
                        writeln!(out)?;
                    }
                    write!(out, "{}", report::table_text(s, &table::build_service(s)))?;
                }
            }
        }
        Command::Diff { old, new, json } => {
            let (a, b) = (load(&old)?, load(&new)?);
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

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?} is neither on nor off")),
    }
}
