//! The pool configuration: the YAML model, its defaults, and validation.
//!
//! A file is read into a [`yaml::Node`] tree and then checked field by field into a [`Pool`].
//! Every error names the file, the line and column, and the field path
//! (`pool.yaml:14:9: services[0].backends[2].weight: expected an integer 0..=1000`).
//! A [`Pool`] that comes out of here is fully valid: tables can be built from it without
//! further checks, and nothing downstream reads the YAML again.
//!
//! This file holds the model, its limits and the entry points; `yaml` reads the text, and
//! `validate` checks it, one file per group of keys.

mod validate;
pub mod yaml;

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use yaml::Seg;

pub use validate::is_prime;

/// Default destination-table size: a prime, so it suits both algorithms.
pub const DEFAULT_SLOTS: u32 = 65537;
/// Largest destination table a service may ask for.
pub const MAX_SLOTS: u32 = 1 << 20;
/// Default number of ring tokens per unit of weight (seed 000).
pub const DEFAULT_VNODES_PER_WEIGHT: u32 = 150;
pub const MAX_VNODES_PER_WEIGHT: u32 = 10_000;
pub const MAX_WEIGHT: u32 = 1000;
/// Largest number of backends in one service.
pub const MAX_BACKENDS_PER_SERVICE: usize = 16_384;
/// Largest number of backends in one file (the data plane's backend map holds them all).
pub const MAX_BACKENDS_TOTAL: usize = 65_536;
/// Largest number of services in one file.
pub const MAX_SERVICES: usize = 1024;
/// Largest ring one service may build: each token is 16 bytes while the table is computed, so
/// this bounds that transient memory to 64 MiB.
pub const MAX_RING_TOKENS: u64 = 1 << 22;
/// The default `load_bound` of `algorithm: bounded`, in thousandths (1.02).
pub const DEFAULT_LOAD_BOUND: u32 = 1020;
/// The range of `load_bound`, in thousandths (1.000 to 2.000). The limits live here, with the
/// other limits of the file format; the bounded table builder reads them from here.
pub const MIN_LOAD_BOUND: u32 = 1000;
pub const MAX_LOAD_BOUND: u32 = 2000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    Ring,
    Maglev,
    /// A stable matching with a cap per backend (table/bounded.rs).
    Bounded,
}

impl Algorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Maglev => "maglev",
            Algorithm::Bounded => "bounded",
        }
    }
}

/// Which packet fields pick the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashMode {
    /// Source address only: every connection of a client lands on the same backend.
    ClientIp,
    /// The 5-tuple.
    Flow,
}

impl HashMode {
    pub fn as_str(self) -> &'static str {
        match self {
            HashMode::ClientIp => "client-ip",
            HashMode::Flow => "flow",
        }
    }
}

/// How a service's packets reach its backends (`forward:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Forward {
    /// L2 direct server return: only the Ethernet addresses change; backends on the link.
    L2,
    /// IP in IP: an outer IPv4 or IPv6 header to the backend, anywhere routable.
    Ipip,
    /// GUE (version 1, "direct IP"): outer IP and UDP to the backend's `gue_port`.
    Gue,
}

impl Forward {
    pub fn as_str(self) -> &'static str {
        match self {
            Forward::L2 => "l2",
            Forward::Ipip => "ipip",
            Forward::Gue => "gue",
        }
    }

    /// Whether packets travel inside an outer IP header.
    pub fn encapsulates(self) -> bool {
        self != Forward::L2
    }
}

/// The default destination port of GUE packets (`gue_port:`).
pub const DEFAULT_GUE_PORT: u16 = 6080;

#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    pub address: IpAddr,
    pub name: Option<String>,
    pub weight: u32,
    pub state: BackendState,
    /// The QUIC-LB server ID its connection IDs carry (`quic_lb:` services only): the file's
    /// `server_id`, or derived from the identity ([`crate::quic_lb::derived_server_id`]).
    pub server_id: Option<Vec<u8>>,
}

/// `state:` of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendState {
    /// Owns slots by its weight (the default).
    Active,
    /// Owns no slots, so new flows go elsewhere, but flows already tracked to it keep going:
    /// how a server is taken out without cutting its users off.
    Drain,
    /// Failing its health checks (never written in a file): owns no slots, and tracked flows
    /// leave it too.
    Down,
}

impl BackendState {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendState::Active => "active",
            BackendState::Drain => "drain",
            BackendState::Down => "down",
        }
    }
}

impl Backend {
    /// The weight the tables use: 0 unless active.
    pub fn serving_weight(&self) -> u32 {
        if self.state == BackendState::Active {
            self.weight
        } else {
            0
        }
    }

    /// The stable identity that the table algorithms hash: the name if set, else the canonical
    /// text of the address (IPv6 in RFC 5952 form, which is what `Ipv6Addr`'s Display prints).
    pub fn identity(&self) -> String {
        match &self.name {
            Some(n) => n.clone(),
            None => self.address.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    pub name: String,
    pub vip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    pub algorithm: Algorithm,
    pub slots: u32,
    pub vnodes_per_weight: u32,
    /// `algorithm: bounded` only: the cap on each backend's slots over its fair share, in
    /// thousandths (1020: 1.02).
    pub load_bound: u32,
    pub hash: HashMode,
    pub backends: Vec<Backend>,
    /// None: no health checking (every backend counts as healthy).
    pub health_check: Option<HealthCheck>,
    /// Established flows keep their backend through the data plane's flow table (default on).
    pub conntrack: bool,
    /// How packets reach the backends (default l2).
    pub forward: Forward,
    /// The outer UDP destination port under `forward: gue`.
    pub gue_port: u16,
    /// `second_chance: on` (GUE, TCP): packets carry a hop list of the other backends that may
    /// hold their connection, for the backends' `lb decap --second-chance`.
    pub second_chance: bool,
    /// `agent:`: each backend is asked for its load, which scales its weight (crates/core/src/load/).
    pub agent: Option<AgentCheck>,
    /// `slow_start:`: a backend that joins or comes back ramps up to its weight.
    pub slow_start: Option<SlowStart>,
    /// `quic_lb:` (UDP): QUIC packets go to the backend whose server ID their connection ID
    /// carries (crates/core/src/quic_lb/, crates/dataplane/src/bpf/quic.h, docs/quic-lb.md).
    pub quic_lb: Option<QuicLb>,
}

/// `quic_lb:`: the QUIC-LB configuration (draft-ietf-quic-load-balancers-21) its backends
/// issue connection IDs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicLb {
    /// The config rotation bits (0..=6) in the first octet of every ID.
    pub rotation: u8,
    pub server_id_len: u8,
    pub nonce_len: u8,
    /// The AES-128 key of encrypted IDs; None: the server ID is in plain sight.
    pub key: Option<[u8; 16]>,
}

/// How a service's backends are asked for their load (`agent:`; docs/load.md).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentCheck {
    /// The backend port the agent answers on.
    pub port: u16,
    /// Some: an HTTP/1.0 GET of this path, whose body's first line is the report; None: the
    /// agent writes its line as soon as the connection opens.
    pub path: Option<String>,
    /// One report per backend per interval, at the same point of every node's wall clock.
    pub interval: std::time::Duration,
    pub timeout: std::time::Duration,
}

/// `slow_start:`: the ramp of a backend that joins the pool or comes back from down.
#[derive(Debug, Clone, PartialEq)]
pub struct SlowStart {
    pub window: std::time::Duration,
    /// The share of its weight it starts with, in percent.
    pub min_percent: u32,
    /// The curve's shape: 1 is a straight ramp, more rises faster at first.
    pub aggression: f64,
}

/// Weights of services whose weights lb scales (agent or slow start) are written to the tables
/// in units of 1/WEIGHT_STEPS of the configured weight: points of a percent.
pub const WEIGHT_STEPS: u32 = 100;

/// How a service's backends are probed (`health_check:`).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheck {
    pub kind: CheckKind,
    /// The backend port probed (default: the service port).
    pub port: u16,
    /// HTTP only: the path requested with GET.
    pub path: String,
    /// HTTP only: the status codes that count as healthy, inclusive (default 200-399).
    pub expect: (u16, u16),
    pub interval: std::time::Duration,
    pub timeout: std::time::Duration,
    /// Consecutive successes that make an unhealthy backend healthy.
    pub rise: u32,
    /// Consecutive failures that make a healthy backend unhealthy.
    pub fall: u32,
    /// Where the probe goes: the backend's own address, or the VIP by the service's forwarding.
    pub via: ProbeVia,
    /// Signals from real traffic (crates/core/src/health/signals.rs): an outlier among the
    /// service's backends is probed through the VIP and taken out if that fails too.
    pub signals: bool,
}

/// `via:` of a health check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeVia {
    /// To the backend's own address and the check's port (the default).
    Backend,
    /// To the service's VIP and port, sent to the backend as the service forwards a client's
    /// packet (L2, IPIP or GUE) and answered from the VIP: the path real connections take.
    Vip,
}

impl ProbeVia {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeVia::Backend => "backend",
            ProbeVia::Vip => "vip",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckKind {
    /// A TCP connect.
    Tcp,
    /// An HTTP/1.0 GET whose status must fall in `expect`.
    Http,
}

impl CheckKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckKind::Tcp => "tcp",
            CheckKind::Http => "http",
        }
    }
}

impl Service {
    /// Whether lb scales this service's weights at run time (an agent check or slow start).
    pub fn load_aware(&self) -> bool {
        self.agent.is_some() || self.slow_start.is_some()
    }

    pub fn total_weight(&self) -> u64 {
        self.backends.iter().map(|b| b.weight as u64).sum()
    }

    /// `10.99.0.100:80/tcp`, or `[fd00::1]:80/tcp`.
    pub fn endpoint(&self) -> String {
        match self.vip {
            IpAddr::V4(a) => format!("{a}:{}/{}", self.port, self.protocol.as_str()),
            IpAddr::V6(a) => format!("[{a}]:{}/{}", self.port, self.protocol.as_str()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pool {
    pub services: Vec<Service>,
    /// `previous:`, the pool the fleet served before this one, as its file says (relative to
    /// this file's directory), and that pool: where second-chance services find which backend
    /// held each slot before (its own `previous:` is not followed).
    pub previous_file: Option<PathBuf>,
    pub previous: Option<Box<Pool>>,
}

impl Pool {
    pub fn service(&self, name: &str) -> Option<&Service> {
        self.services.iter().find(|s| s.name == name)
    }

    /// The service named like `s` in the previous pool, if there is one.
    pub fn previous_of(&self, s: &Service) -> Option<&Service> {
        self.previous.as_deref().and_then(|p| p.service(&s.name))
    }
}

/// A configuration error, with as much of its position as is known.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub column: Option<usize>,
    /// The field path, such as `services[0].backends[2].weight`; empty for whole-file errors.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.column {
                write!(f, ":{col}")?;
            }
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Reads and validates a pool file.
pub fn load(path: &Path) -> Result<Pool, ConfigError> {
    load_bytes(path).map(|(pool, _)| pool)
}

/// Reads and validates a pool file; also returns the bytes that were validated.
pub fn load_bytes(path: &Path) -> Result<(Pool, Vec<u8>), ConfigError> {
    let whole = |message: String| ConfigError {
        file: path.to_path_buf(),
        line: None,
        column: None,
        field: String::new(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| whole(io_message(&e)))?;
    if meta.is_dir() {
        return Err(whole("is a directory, expected a YAML file".to_string()));
    }
    let bytes = std::fs::read(path).map_err(|e| whole(io_message(&e)))?;
    let pool = parse_bytes(path, &bytes)?;
    Ok((pool, bytes))
}

pub fn io_message(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => format!("cannot read: {e}"),
    }
}

/// Validates file contents; `path` is only used in error messages.
pub fn parse_bytes(path: &Path, bytes: &[u8]) -> Result<Pool, ConfigError> {
    let (mut pool, text) = parse_alone(path, bytes)?;
    if let Some(file) = &pool.previous_file {
        let at = path.parent().unwrap_or(Path::new("")).join(file);
        let field = |message: String| field_error(path, text, "previous", message);
        let meta = std::fs::metadata(&at).map_err(|e| field(format!("{}: {}", at.display(), io_message(&e))))?;
        if meta.is_dir() {
            return Err(field(format!("{}: is a directory, expected a YAML file", at.display())));
        }
        if !meta.is_file() {
            return Err(field(format!("{}: is not a regular file, expected a YAML file", at.display())));
        }
        let bytes = std::fs::read(&at).map_err(|e| field(format!("{}: {}", at.display(), io_message(&e))))?;
        std::str::from_utf8(&bytes).map_err(|_| field(format!("{}: the file is not valid UTF-8", at.display())))?;
        pool.previous = Some(Box::new(previous_pool(&at, &bytes)?));
    }
    Ok(pool)
}

/// Validates a pool kept in a fleet store (lb_core::fleet): `bytes` named `name` in errors (the
/// store's URL and the revision), with the pool it replaced, also from the store, as its
/// previous pool (one step back, as a previous file is). The store keeps the previous pool
/// itself, so a `previous:` key is refused.
pub fn parse_stored(name: &Path, bytes: &[u8], previous: Option<(&Path, &[u8])>) -> Result<Pool, ConfigError> {
    let (mut pool, text) = parse_alone(name, bytes)?;
    if pool.previous_file.is_some() {
        return Err(field_error(name, text, "previous", "a pool in the store names no previous file: the store keeps the pool it replaced (lb push writes both); remove this line"));
    }
    if let Some((at, bytes)) = previous {
        pool.previous = Some(Box::new(previous_pool(at, bytes)?));
    }
    Ok(pool)
}

/// A previous pool's bytes, validated; its own `previous:` is read but not followed.
fn previous_pool(at: &Path, bytes: &[u8]) -> Result<Pool, ConfigError> {
    let whole = |message: String| ConfigError { file: at.to_path_buf(), line: None, column: None, field: String::new(), message };
    let text = std::str::from_utf8(bytes).map_err(|_| whole("the file is not valid UTF-8".to_string()))?;
    let doc = yaml::parse(text).map_err(|e| ConfigError {
        file: at.to_path_buf(),
        line: e.line,
        column: e.column,
        field: String::new(),
        message: format!("invalid YAML: {}", e.message),
    })?;
    let previous = validate::pool(at, &doc)?;
    Ok(Pool { services: previous.services, previous_file: None, previous: None })
}

/// Validates a pool's own text, without reading the previous pool it names.
fn parse_alone<'b>(path: &Path, bytes: &'b [u8]) -> Result<(Pool, &'b str), ConfigError> {
    let whole = |line: Option<usize>, column: Option<usize>, message: String| ConfigError {
        file: path.to_path_buf(),
        line,
        column,
        field: String::new(),
        message,
    };
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let before = &bytes[..e.valid_up_to()];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = before.len() - before.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1) + 1;
            return Err(whole(Some(line), Some(column), "the file is not valid UTF-8".to_string()));
        }
    };
    if text.trim().is_empty() || text.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#')) {
        return Err(whole(None, None, "the file is empty; expected a mapping with a `services` list".to_string()));
    }
    let doc = yaml::parse(text).map_err(|e| whole(e.line, e.column, format!("invalid YAML: {}", e.message)))?;
    Ok((validate::pool(path, &doc)?, text))
}

/// The digest of what a pool's bytes make lb serve: the bytes, and the previous pool's when it
/// names or has one (second chance's hops come from it), so that a change of either is a change.
/// A reloader reads a pool again only when this changes (a file's, or a store's).
pub fn pool_digest(bytes: &[u8], previous: Option<&[u8]>) -> u64 {
    let mut h = xxhash_rust::xxh64::Xxh64::new(0);
    h.update(bytes);
    if let Some(p) = previous {
        h.update(b"\0previous\0");
        h.update(p);
    }
    h.digest()
}

/// The previous pool file a pool file's text names (`previous:`, resolved against the pool
/// file's directory), if it names one; None for text that does not parse. For a reloader that
/// must see a change of either file as a change.
pub fn previous_file_of(path: &Path, bytes: &[u8]) -> Option<PathBuf> {
    let doc = yaml::parse(std::str::from_utf8(bytes).ok()?).ok()?;
    let yaml::Node::Map(fields) = &doc.root else { return None };
    match fields.iter().find(|(k, _)| k == "previous") {
        Some((_, yaml::Node::Str(file))) => Some(path.parent().unwrap_or(Path::new("")).join(file)),
        _ => None,
    }
}

/// Validates a string (handy for tests and for error messages about in-memory text).
pub fn parse_str(name: &str, text: &str) -> Result<Pool, ConfigError> {
    parse_bytes(Path::new(name), text.as_bytes())
}

/// An error about a field of a file that did validate, positioned like validation errors: for
/// facts only known later, such as a backend that the attached interface cannot reach. `field`
/// is a path as errors print it, `services[0].backends[2].address`.
pub fn field_error(file: &Path, text: &str, field: &str, message: impl Into<String>) -> ConfigError {
    let mut segs = Vec::new();
    for part in field.split('.') {
        let mut pieces = part.split('[');
        if let Some(key) = pieces.next().filter(|k| !k.is_empty()) {
            segs.push(Seg::Key(key.to_string()));
        }
        for idx in pieces {
            if let Ok(i) = idx.trim_end_matches(']').parse() {
                segs.push(Seg::Index(i));
            }
        }
    }
    // A field written in shorthand (a bare-string backend has no `address` key) is found at
    // its nearest enclosing node.
    let pos = yaml::parse(text).ok().and_then(|doc| (0..=segs.len()).rev().find_map(|n| doc.locate(&segs[..n])));
    ConfigError {
        file: file.to_path_buf(),
        line: pos.map(|p| p.0),
        column: pos.map(|p| p.1),
        field: field.to_string(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn field_error_positions_a_later_fact_at_its_field() {
        let text = "services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    backends:\n      - address: 10.0.0.1\n      - address: 10.0.0.2\n";
        let e = super::field_error(std::path::Path::new("p.yaml"), text, "services[0].backends[1].address", "not on eth0");
        assert_eq!(e.to_string(), "p.yaml:7:18: services[0].backends[1].address: not on eth0");
        let short = "services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    backends: [10.0.0.1, 10.0.0.2]\n";
        let e = super::field_error(std::path::Path::new("p.yaml"), short, "services[0].backends[1].address", "not on eth0");
        assert_eq!(e.to_string(), "p.yaml:5:26: services[0].backends[1].address: not on eth0");
    }

    use super::*;

    #[test]
    fn defaults_apply() {
        let pool = parse_str(
            "t.yaml",
            "services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    backends:\n      - address: 10.99.0.11\n",
        )
        .unwrap();
        let s = &pool.services[0];
        assert_eq!(s.protocol, Protocol::Tcp);
        assert_eq!(s.algorithm, Algorithm::Ring);
        assert_eq!(s.slots, DEFAULT_SLOTS);
        assert_eq!(s.vnodes_per_weight, DEFAULT_VNODES_PER_WEIGHT);
        assert_eq!(s.hash, HashMode::ClientIp);
        assert_eq!(s.backends[0].weight, 1);
        assert_eq!(s.backends[0].identity(), "10.99.0.11");
    }

    #[test]
    fn a_stored_pool_takes_its_previous_pool_from_the_store_and_names_no_file() {
        let body = "services:\n  - {name: web, vip: 10.0.0.1, port: 80, backends: [10.1.0.1, 10.1.0.2]}\n";
        let old = body.replace(", 10.1.0.2", "");
        let name = Path::new("etcd://h:2379/lb/pool@7");
        let pool = parse_stored(name, body.as_bytes(), Some((Path::new("etcd://h:2379/lb/pool/previous@7"), old.as_bytes()))).unwrap();
        assert_eq!(pool.previous.as_deref().map(|p| p.services[0].backends.len()), Some(1));
        assert!(parse_stored(name, body.as_bytes(), None).unwrap().previous.is_none());
        let e = parse_stored(name, format!("previous: old.yaml\n{body}").as_bytes(), None).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (Some(1), "previous"));
        assert!(e.to_string().starts_with("etcd://h:2379/lb/pool@7:1:11: previous: "), "{e}");
        let e = parse_stored(name, body.as_bytes(), Some((Path::new("etcd://h:2379/lb/pool/previous@7"), b"services: [x"))).unwrap_err();
        assert!(e.to_string().starts_with("etcd://h:2379/lb/pool/previous@7:"), "{e}");
    }

    #[test]
    fn a_previous_pool_is_read_beside_the_file_one_step_back() {
        let dir = std::env::temp_dir().join(format!("lb-previous-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let body = "services:\n  - {name: web, vip: 10.99.0.100, port: 80, forward: gue, second_chance: on, backends: [10.1.0.1, 10.1.0.2]}\n";
        // Made the way operators will: a copy of the pool, `previous:` line and all.
        let old = format!("previous: pool.prev.yaml\n{}", body.replace(", 10.1.0.2", ""));
        std::fs::write(dir.join("pool.prev.yaml"), &old).unwrap();
        std::fs::write(dir.join("pool.yaml"), format!("previous: pool.prev.yaml\n{body}")).unwrap();
        let pool = load(&dir.join("pool.yaml")).expect("valid");
        let prev = pool.previous.as_deref().expect("the previous pool");
        assert_eq!(prev.services[0].backends.len(), 1);
        assert!(prev.previous.is_none(), "its own previous: is not followed");
        assert_eq!(pool.previous_of(&pool.services[0]).map(|s| s.name.as_str()), Some("web"));
        // A FIFO (or any file that is not a regular one) is refused, not read: it would block.
        std::fs::remove_file(dir.join("pool.prev.yaml")).unwrap();
        // coreutils' mkfifo: the core crate has no nix to make one with.
        let made = std::process::Command::new("mkfifo").arg(dir.join("pool.prev.yaml")).status().unwrap();
        assert!(made.success(), "mkfifo failed");
        let e = load(&dir.join("pool.yaml")).expect_err("a FIFO");
        assert!(e.to_string().ends_with("pool.prev.yaml: is not a regular file, expected a YAML file"), "{e}");
        assert_eq!((e.line, e.field.as_str()), (Some(1), "previous"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ipv6_identity_is_rfc5952() {
        let pool = parse_str(
            "t.yaml",
            "services:\n  - name: v6\n    vip: 'fd00:0:0:0::100'\n    port: 443\n    backends: ['FD00:0000::0B']\n",
        )
        .unwrap();
        assert_eq!(pool.services[0].backends[0].identity(), "fd00::b");
    }

    #[test]
    fn error_display_names_file_line_column_and_field() {
        let e = parse_str(
            "pool.yaml",
            "services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    backends:\n      - address: 10.0.0.1\n        weight: 1001\n",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "pool.yaml:7:17: services[0].backends[0].weight: expected an integer 0..=1000, found 1001");
    }
}
