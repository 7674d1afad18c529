//! `lb attach`: its flags, and the one validated [`Settings`] value they become before the daemon
//! (src/daemon/) serves it.
//!
//! clap parses the flags into [`Args`]; [`settings`] checks what clap cannot
//! (one `--encap-source` per family, the pool's tables against `--table-capacity`) and loads the
//! pool, all before the first syscall that touches the network or BPF. Nothing after it reads a
//! raw flag.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use std::process::ExitCode;

use anyhow::{bail, Result};

use lb::config::{self, Pool};
use lb::dataplane::{DEFAULT_CONNTRACK_SIZE, DEFAULT_QUIC_DECODES, DEFAULT_TABLE_CAPACITY};

use super::values::{address_prefix, on_off, seconds};
use crate::daemon;
use crate::settings::{Settings, StoreSettings};
use crate::store::{Client, FirstRead};
use lb::fleet::StoreUrl;
use crate::xdp::ModeArg;

// No doc comment here: on a flattened struct it would replace the subcommand's own about text.
#[derive(clap::Args)]
pub struct Args {
    /// The interface clients' traffic arrives on. Backends on its link are reached by MAC
    /// (forward: l2); others through a router, encapsulated (forward: ipip | gue).
    #[arg(value_name = "IFACE")]
    iface: String,
    /// The pool YAML file: services and their backends (docs/configuration.md). Re-read when
    /// it changes, on SIGHUP, and every --recheck-interval. Or a fleet's store,
    /// etcd://HOST:PORT[,HOST:PORT...]/KEY (docs/fleet.md): the pool `lb push` wrote there,
    /// followed revision by revision, with this node's view published beside it.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: PathBuf,
    /// With --config etcd://...: this node's name in the store (its view's key) [default: the
    /// host's name].
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    #[command(flatten)]
    store_tls: crate::store::TlsArgs,
    /// Where the program runs: native (driver), generic (any interface, slower), or auto
    /// (native, falling back to generic with a warning).
    #[arg(long, value_enum, default_value = "auto", value_name = "MODE")]
    xdp_mode: ModeArg,
    /// Print per-service and per-backend counters and drop reasons every SECS seconds.
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    stats_interval: Option<Duration>,
    /// Size of the data plane's destination-table array, in slots (4 bytes each): the sum of
    /// every service's `slots`, with room for tables being replaced.
    #[arg(long, value_name = "SLOTS", default_value_t = DEFAULT_TABLE_CAPACITY,
          value_parser = clap::value_parser!(u32).range(1..=1 << 28))]
    table_capacity: u32,
    /// Slots of the connection-tracking flow table, rounded up to a power of two (16 bytes
    /// each; when both buckets a new flow may use are full, the flow seen longest ago there
    /// is forgotten).
    #[arg(long, value_name = "FLOWS", default_value_t = DEFAULT_CONNTRACK_SIZE,
          value_parser = clap::value_parser!(u32).range(1..=1 << 26))]
    conntrack_size: u32,
    /// A tracked TCP flow idle this long is forgotten.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "3600")]
    conntrack_tcp_timeout: Duration,
    /// A tracked UDP flow idle this long is forgotten.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "30")]
    conntrack_udp_timeout: Duration,
    /// on: a flow gets its flow-table entry at its second packet (a TCP flow's first after
    /// the SYN); its first waits in a separate half-open table, so a flood of spoofed SYNs
    /// (or first UDP datagrams) can never evict established flows. off: at its first
    /// packet, evicting the flow seen longest ago when the table is full.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    conntrack_guard: bool,
    /// Encrypted QUIC-LB connection IDs each CPU decodes a second at most, of those not decoded
    /// before (a tenth of a second's worth at once after a quiet moment); past that, a packet
    /// with such an ID goes by the table, counted over_budget, so that a flood of made-up IDs
    /// cannot take the CPUs. 0: no bound.
    #[arg(long, value_name = "IDS", default_value_t = DEFAULT_QUIC_DECODES)]
    quic_decode_budget: u32,
    /// At start, wait at most SECS seconds for backends' MACs before attaching anyway.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "2")]
    resolve_timeout: Duration,
    /// Reload this long after the config file stops changing (bursts of writes become one
    /// reload).
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "0.05")]
    reload_delay: Duration,
    /// Re-read the config file this often even when no change was signalled.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "10")]
    recheck_interval: Duration,
    /// Outer source address of encapsulated (ipip, gue) packets, once per family. With a
    /// prefix length (10.1.0.0/24), the host bits vary with the flow hash, so that backends'
    /// receive-side scaling spreads IPIP flows. Default: the interface's first address of the
    /// family that is not a VIP, fixed.
    #[arg(long, value_name = "ADDR[/LEN]", value_parser = address_prefix)]
    encap_source: Vec<(IpAddr, u8)>,
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
    metrics: Option<SocketAddr>,
    /// Keep every VIP as a host address on DEV (created as a dummy device if missing and
    /// the kernel has them), for a routing daemon to announce by BGP; withdrawn before the
    /// program goes.
    #[arg(long, value_name = "DEV")]
    announce: Option<String>,
}

/// `lb attach`: the flags become one validated [`Settings`] value, and the daemon serves it.
pub fn run(args: Args) -> Result<ExitCode> {
    let (settings, pool, content, first) = settings(args)?;
    daemon::run(settings, pool, &content, first)
}

/// How long `lb attach --config etcd://...` waits for the store at start.
const STORE_WAIT: Duration = Duration::from_secs(10);

/// The pool from the store at start: read whole (every member tried, again for STORE_WAIT),
/// validated with the pool it replaced.
fn from_store(url: &StoreUrl, tls: &crate::store::TlsArgs) -> Result<(Pool, Vec<u8>, FirstRead)> {
    let client = Client::new(url, tls, crate::store::CALL_TIMEOUT)?;
    let started = std::time::Instant::now();
    let snap = loop {
        match client.range(&url.key, &url.range_end()) {
            Ok(s) => break s,
            Err(e) if started.elapsed() >= STORE_WAIT => {
                bail!("{url}: {e:#}; nothing was attached (a pinned data plane keeps serving what it has)")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    };
    let Some(kv) = snap.get(&url.key) else {
        bail!("{url}: no pool at {} (push one with `lb push FILE --to {url}`); nothing was attached", url.key);
    };
    let previous = snap.get(&url.previous_key()).map(|p| p.value.as_slice());
    let pool = lb::fleet::parse_pool(url, kv.mod_revision, &kv.value, previous).map_err(anyhow::Error::new)?;
    let bytes = kv.value.clone();
    Ok((pool, bytes, (client, snap)))
}

/// The flags checked against each other and against the pool they name, which is loaded and
/// validated here whole; returns the settings, the pool, the file's bytes and, from a store, the
/// store's first read.
fn settings(a: Args) -> Result<(Settings, Pool, Vec<u8>, Option<FirstRead>)> {
    let v4 = a.encap_source.iter().filter(|s| s.0.is_ipv4()).count();
    if v4 > 1 || a.encap_source.len() - v4 > 1 {
        bail!("--encap-source: give at most one address per family");
    }
    // The whole pool is validated before the first syscall.
    let text = a.config.to_string_lossy();
    let (pool, content, first, store) = if StoreUrl::is_store(&text) {
        let url = StoreUrl::parse(&text).map_err(|e| anyhow::anyhow!("--config: {e}"))?;
        let node = match a.node_name.clone() {
            Some(n) => n,
            None => std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default(),
        };
        if node.is_empty() || node.contains('/') || node.chars().any(|c| c.is_control() || c.is_whitespace()) {
            bail!("--node-name {node:?}: a node's name is not empty and has no '/', space or control character");
        }
        let (pool, content, first) = from_store(&url, &a.store_tls)?;
        (pool, content, Some(first), Some(StoreSettings { url, node }))
    } else {
        if a.node_name.is_some() || a.store_tls.store_cacert.is_some() || a.store_tls.store_cert.is_some() {
            bail!("--node-name and --store-* go with --config etcd://...");
        }
        let (pool, content) = config::load_bytes(&a.config).map_err(anyhow::Error::new)?;
        (pool, content, None, None)
    };
    let needed: u64 = pool.services.iter().map(|s| s.slots as u64).sum();
    if needed > a.table_capacity as u64 {
        bail!(
            "{}: the services' tables need {needed} slots in all, more than --table-capacity {}",
            a.config.display(),
            a.table_capacity
        );
    }
    let settings = Settings {
        iface: a.iface,
        config: a.config,
        mode: a.xdp_mode,
        stats_interval: a.stats_interval,
        table_capacity: a.table_capacity,
        conntrack_size: a.conntrack_size,
        conntrack_timeouts: (a.conntrack_tcp_timeout, a.conntrack_udp_timeout),
        conntrack_guard: a.conntrack_guard,
        quic_decode_budget: a.quic_decode_budget,
        resolve_timeout: a.resolve_timeout,
        reload_delay: a.reload_delay,
        recheck_interval: a.recheck_interval,
        encap_sources: a.encap_source,
        pin: a.pin.then_some(a.pin_dir),
        metrics: a.metrics,
        announce: a.announce,
        store,
    };
    Ok((settings, pool, content, first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn pool() -> String {
        format!("{}/configs/pool.yaml", env!("CARGO_MANIFEST_DIR"))
    }

    fn settings(extra: &[&str]) -> Result<(Settings, Pool, Vec<u8>)> {
        let pool = pool();
        let mut argv = vec!["lb", "eth9", "--config", pool.as_str()];
        argv.extend_from_slice(extra);
        super::settings(Cli::try_parse_from(argv)?.args).map(|(s, p, c, _)| (s, p, c))
    }

    #[test]
    fn the_flags_become_one_value_with_the_pool_loaded() {
        let (s, pool, content) = settings(&["--conntrack-tcp-timeout", "60", "--pin-dir", "/tmp/x"]).expect("valid");
        assert_eq!(s.iface, "eth9");
        assert_eq!(s.mode, ModeArg::Auto);
        assert_eq!(s.table_capacity, DEFAULT_TABLE_CAPACITY);
        assert_eq!(s.conntrack_timeouts, (Duration::from_secs(60), Duration::from_secs(30)));
        assert!(s.conntrack_guard);
        assert_eq!(s.reload_delay, Duration::from_millis(50));
        assert_eq!(s.pin, None, "--pin-dir alone pins nothing");
        assert_eq!(pool.services.len(), 2);
        assert_eq!(content, std::fs::read(self::pool()).expect("read"));
        let (s, _, _) = settings(&["--pin", "--pin-dir", "/tmp/x", "--conntrack-guard", "off"]).expect("valid");
        assert_eq!(s.pin, Some(PathBuf::from("/tmp/x")));
        assert!(!s.conntrack_guard);
    }

    #[test]
    fn the_quic_decode_budget_is_a_count_and_zero_lifts_it() {
        let (s, _, _) = settings(&[]).expect("valid");
        assert_eq!(s.quic_decode_budget, DEFAULT_QUIC_DECODES);
        assert_eq!(DEFAULT_QUIC_DECODES, 50_000);
        let (s, _, _) = settings(&["--quic-decode-budget", "0"]).expect("valid");
        assert_eq!(s.quic_decode_budget, 0);
        for bad in ["-1", "4e9", "lots", "5000000000"] {
            assert!(settings(&["--quic-decode-budget", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn one_encap_source_per_family_and_tables_that_fit() {
        let (s, _, _) = settings(&["--encap-source", "10.1.0.0/24", "--encap-source", "fd00::1"]).expect("one per family");
        assert_eq!(s.encap_sources, vec![("10.1.0.0".parse().expect("v4"), 24), ("fd00::1".parse().expect("v6"), 128)]);
        for two in [["10.0.0.1", "10.0.0.2"], ["fd00::1", "fd00::2"]] {
            let e = settings(&["--encap-source", two[0], "--encap-source", two[1]]).err().expect("two of a family");
            assert_eq!(e.to_string(), "--encap-source: give at most one address per family");
        }
        let e = settings(&["--table-capacity", "100000"]).err().expect("too small");
        assert!(e.to_string().ends_with("the services' tables need 131074 slots in all, more than --table-capacity 100000"), "{e}");
    }
}
