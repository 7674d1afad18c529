//! The pool configuration: the YAML model, its defaults, and validation.
//!
//! A file is read into a [`yaml::Node`] tree and then checked field by field into a [`Pool`].
//! Every error names the file, the line and column, and the field path
//! (`pool.yaml:14:9: services[0].backends[2].weight: expected an integer 0..=1000`).
//! A [`Pool`] that comes out of here is fully valid: tables can be built from it without
//! further checks, and nothing downstream reads the YAML again.

pub mod yaml;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use yaml::{Node, Seg};

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
}

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
}

impl Pool {
    pub fn service(&self, name: &str) -> Option<&Service> {
        self.services.iter().find(|s| s.name == name)
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
    Validator { file: path, doc: &doc }.pool()
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

/// A field path under construction, printed as `services[0].backends[2].weight`.
#[derive(Clone, Default)]
struct FieldPath(Vec<Seg>);

impl FieldPath {
    fn key(&self, k: &str) -> FieldPath {
        let mut p = self.0.clone();
        p.push(Seg::Key(k.to_string()));
        FieldPath(p)
    }
    fn index(&self, i: usize) -> FieldPath {
        let mut p = self.0.clone();
        p.push(Seg::Index(i));
        FieldPath(p)
    }
    fn key_at(&self, i: usize) -> FieldPath {
        let mut p = self.0.clone();
        p.push(Seg::KeyAt(i));
        FieldPath(p)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mut first = true;
        for seg in &self.0 {
            match seg {
                Seg::Key(k) => {
                    if !first {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Seg::Index(i) => write!(f, "[{i}]")?,
                // Errors about a key name the key itself, which Display shows via the caller.
                Seg::KeyAt(_) => {}
            }
            first = false;
        }
        Ok(())
    }
}

struct Validator<'a> {
    file: &'a Path,
    doc: &'a yaml::Document<'a>,
}

type Fields<'n> = &'n [(String, Node)];

impl Validator<'_> {
    fn err(&self, at: &FieldPath, message: impl Into<String>) -> ConfigError {
        self.err_located(at, at, message)
    }

    /// An error about field `shown`, positioned at the node `located` (a key rather than its
    /// value, for instance).
    fn err_located(&self, shown: &FieldPath, located: &FieldPath, message: impl Into<String>) -> ConfigError {
        // A field written in shorthand (a bare-string backend has no `address` key) is found at
        // its nearest enclosing node.
        let pos = (0..=located.0.len()).rev().find_map(|n| self.doc.locate(&located.0[..n]));
        ConfigError {
            file: self.file.to_path_buf(),
            line: pos.map(|p| p.0),
            column: pos.map(|p| p.1),
            field: shown.to_string(),
            message: message.into(),
        }
    }

    /// Checks that `node` is a mapping with only `allowed` keys, and returns its entries.
    fn mapping<'n>(&self, node: &'n Node, at: &FieldPath, allowed: &[&str]) -> Result<Fields<'n>, ConfigError> {
        let Node::Map(entries) = node else {
            return Err(self.err(at, format!("expected a mapping, found {}", node.kind())));
        };
        for (i, (k, _)) in entries.iter().enumerate() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.err_located(
                    &at.key(k),
                    &at.key_at(i),
                    format!("unknown key `{k}`; expected one of: {}", allowed.join(", ")),
                ));
            }
        }
        Ok(entries)
    }

    fn get<'n>(fields: Fields<'n>, key: &str) -> Option<&'n Node> {
        fields.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn required<'n>(&self, fields: Fields<'n>, at: &FieldPath, key: &str) -> Result<&'n Node, ConfigError> {
        Self::get(fields, key).ok_or_else(|| self.err(at, format!("missing required key `{key}`")))
    }

    fn string<'n>(&self, node: &'n Node, at: &FieldPath, what: &str) -> Result<&'n str, ConfigError> {
        match node {
            Node::Str(s) => Ok(s),
            other => Err(self.err(at, format!("expected {what}, found {}", other.kind()))),
        }
    }

    fn integer(&self, node: &Node, at: &FieldPath, lo: u32, hi: u32) -> Result<u32, ConfigError> {
        let msg = || format!("expected an integer {lo}..={hi}");
        match node {
            Node::Int(i) if (lo as i128..=hi as i128).contains(i) => Ok(*i as u32),
            Node::Int(i) => Err(self.err(at, format!("{}, found {i}", msg()))),
            other => Err(self.err(at, format!("{}, found {}", msg(), other.kind()))),
        }
    }

    fn choice<T: Copy>(&self, node: &Node, at: &FieldPath, options: &[(&str, T)]) -> Result<T, ConfigError> {
        let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
        let expected = names.join(" | ");
        let s = self.string(node, at, &format!("one of {expected}"))?;
        options
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, v)| *v)
            .ok_or_else(|| self.err(at, format!("expected one of {expected}, found `{s}`")))
    }

    fn address(&self, node: &Node, at: &FieldPath) -> Result<IpAddr, ConfigError> {
        let s = self.string(node, at, "an IPv4 or IPv6 address")?;
        let addr: IpAddr = s
            .trim()
            .parse()
            .map_err(|_| self.err(at, format!("`{s}` is not an IPv4 or IPv6 address")))?;
        if let Some(why) = not_unicast(addr) {
            return Err(self.err(at, format!("{addr} is {why}; expected a unicast address")));
        }
        Ok(addr)
    }

    fn pool(&self) -> Result<Pool, ConfigError> {
        let root = FieldPath::default();
        let fields = self.mapping(&self.doc.root, &root, &["services"])?;
        let services_path = root.key("services");
        let list = match Self::get(fields, "services") {
            None => return Err(self.err(&root, "missing required key `services`")),
            Some(Node::Null) => &[][..],
            Some(Node::Seq(items)) => &items[..],
            Some(other) => return Err(self.err(&services_path, format!("expected a list of services, found {}", other.kind()))),
        };
        if list.len() > MAX_SERVICES {
            return Err(self.err(&services_path, format!("{} services; at most {MAX_SERVICES} are supported", list.len())));
        }

        let mut services: Vec<Service> = Vec::with_capacity(list.len());
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut endpoints: HashMap<(IpAddr, u16, Protocol), usize> = HashMap::new();
        let mut total_backends = 0usize;
        for (i, node) in list.iter().enumerate() {
            let at = services_path.index(i);
            let svc = self.service(node, &at)?;
            if let Some(prev) = names.insert(svc.name.clone(), i) {
                return Err(self.err(
                    &at.key("name"),
                    format!("duplicate service name `{}` (also services[{prev}])", svc.name),
                ));
            }
            if let Some(prev) = endpoints.insert((svc.vip, svc.port, svc.protocol), i) {
                return Err(self.err(
                    &at.key("vip"),
                    format!("{} is already served by services[{prev}] (`{}`)", svc.endpoint(), services[prev].name),
                ));
            }
            total_backends += svc.backends.len();
            if total_backends > MAX_BACKENDS_TOTAL {
                return Err(self.err(
                    &at.key("backends"),
                    format!("the file has more than {MAX_BACKENDS_TOTAL} backends in all"),
                ));
            }
            services.push(svc);
        }
        Ok(Pool { services })
    }

    fn service(&self, node: &Node, at: &FieldPath) -> Result<Service, ConfigError> {
        const KEYS: &[&str] = &[
            "name",
            "vip",
            "port",
            "protocol",
            "algorithm",
            "slots",
            "vnodes_per_weight",
            "hash",
            "backends",
            "health_check",
            "conntrack",
            "forward",
            "gue_port",
            "load_bound",
        ];
        let f = self.mapping(node, at, KEYS)?;

        let name_at = at.key("name");
        let name = self.string(self.required(f, at, "name")?, &name_at, "a service name")?;
        if !valid_service_name(name) {
            return Err(self.err(
                &name_at,
                format!("`{name}` is not a valid service name: use 1..=63 characters from A-Z a-z 0-9 . _ -"),
            ));
        }
        let vip = self.address(self.required(f, at, "vip")?, &at.key("vip"))?;
        let port = self.integer(self.required(f, at, "port")?, &at.key("port"), 1, 65535)? as u16;
        let protocol = match Self::get(f, "protocol") {
            None => Protocol::Tcp,
            Some(n) => self.choice(n, &at.key("protocol"), &[("tcp", Protocol::Tcp), ("udp", Protocol::Udp)])?,
        };
        let algorithm = match Self::get(f, "algorithm") {
            None => Algorithm::Ring,
            Some(n) => self.choice(
                n,
                &at.key("algorithm"),
                &[("ring", Algorithm::Ring), ("maglev", Algorithm::Maglev), ("bounded", Algorithm::Bounded)],
            )?,
        };
        let slots = match Self::get(f, "slots") {
            None => DEFAULT_SLOTS,
            Some(n) => self.integer(n, &at.key("slots"), 1, MAX_SLOTS)?,
        };
        if algorithm == Algorithm::Maglev && !is_prime(slots) {
            return Err(self.err(
                &at.key("slots"),
                format!("maglev needs a prime table size, and {slots} is not prime (nearby primes: {})", nearby_primes(slots)),
            ));
        }
        let vnodes_per_weight = match Self::get(f, "vnodes_per_weight") {
            None => DEFAULT_VNODES_PER_WEIGHT,
            Some(_) if algorithm != Algorithm::Ring => {
                return Err(self.err(&at.key("vnodes_per_weight"), "applies to `algorithm: ring` only"));
            }
            Some(n) => self.integer(n, &at.key("vnodes_per_weight"), 1, MAX_VNODES_PER_WEIGHT)?,
        };
        let load_bound = match Self::get(f, "load_bound") {
            None => DEFAULT_LOAD_BOUND,
            Some(_) if algorithm != Algorithm::Bounded => {
                return Err(self.err(&at.key("load_bound"), "applies to `algorithm: bounded` only"));
            }
            Some(n) => self.load_bound(n, &at.key("load_bound"))?,
        };
        let hash = match Self::get(f, "hash") {
            None => HashMode::ClientIp,
            Some(n) => self.choice(n, &at.key("hash"), &[("client-ip", HashMode::ClientIp), ("flow", HashMode::Flow)])?,
        };

        let forward = match Self::get(f, "forward") {
            None => Forward::L2,
            Some(n) => self.choice(
                n,
                &at.key("forward"),
                &[("l2", Forward::L2), ("ipip", Forward::Ipip), ("gue", Forward::Gue)],
            )?,
        };
        let gue_port = match Self::get(f, "gue_port") {
            None => DEFAULT_GUE_PORT,
            Some(_) if forward != Forward::Gue => {
                return Err(self.err(&at.key("gue_port"), "applies to `forward: gue` only"));
            }
            Some(n) => self.integer(n, &at.key("gue_port"), 1, 65535)? as u16,
        };

        let backends_at = at.key("backends");
        let list = match self.required(f, at, "backends")? {
            Node::Null => &[][..],
            Node::Seq(items) => &items[..],
            other => return Err(self.err(&backends_at, format!("expected a list of backends, found {}", other.kind()))),
        };
        if list.len() > MAX_BACKENDS_PER_SERVICE {
            return Err(self.err(
                &backends_at,
                format!("{} backends; at most {MAX_BACKENDS_PER_SERVICE} per service are supported", list.len()),
            ));
        }
        let mut backends = Vec::with_capacity(list.len());
        let mut identities: HashMap<String, usize> = HashMap::new();
        let mut addresses: HashSet<IpAddr> = HashSet::new();
        for (j, bnode) in list.iter().enumerate() {
            let bat = backends_at.index(j);
            let b = self.backend(bnode, &bat)?;
            // Encapsulation carries either family in either (the backend's address is the outer
            // destination); L2 forwarding hands the backend the client's packet as it is.
            if b.address.is_ipv4() != vip.is_ipv4() && !forward.encapsulates() {
                let fam = |a: IpAddr| if a.is_ipv4() { "IPv4" } else { "IPv6" };
                return Err(self.err(
                    &bat.key("address"),
                    format!(
                        "{} is {} but the service's vip {vip} is {}; `forward: l2` needs one family (ipip and gue carry either)",
                        b.address,
                        fam(b.address),
                        fam(vip)
                    ),
                ));
            }
            if !addresses.insert(b.address) {
                return Err(self.err(&bat.key("address"), format!("duplicate backend address {}", b.address)));
            }
            let identity = b.identity();
            if let Some(prev) = identities.insert(identity.clone(), j) {
                let field = if b.name.is_some() { "name" } else { "address" };
                return Err(self.err(
                    &bat.key(field),
                    format!("duplicate backend identity `{identity}` (also backends[{prev}])"),
                ));
            }
            backends.push(b);
        }

        let conntrack = match Self::get(f, "conntrack") {
            None => true,
            // `on | off` as the docs write it; true/false mean the same.
            Some(Node::Bool(b)) => *b,
            Some(n) => self.choice(n, &at.key("conntrack"), &[("on", true), ("off", false)])?,
        };
        let health_check = match Self::get(f, "health_check") {
            None => None,
            Some(n) => self.health_check(n, &at.key("health_check"), port, protocol)?,
        };
        let svc = Service {
            name: name.to_string(),
            vip,
            port,
            protocol,
            algorithm,
            slots,
            vnodes_per_weight,
            load_bound,
            hash,
            backends,
            health_check,
            conntrack,
            forward,
            gue_port,
        };
        if algorithm == Algorithm::Ring {
            let tokens = svc.total_weight() * vnodes_per_weight as u64;
            if tokens > MAX_RING_TOKENS {
                return Err(self.err(
                    &backends_at,
                    format!(
                        "the ring would have {tokens} tokens (total weight {} x vnodes_per_weight {vnodes_per_weight}); \
                         the limit is {MAX_RING_TOKENS}: lower the weights or vnodes_per_weight",
                        svc.total_weight()
                    ),
                ));
            }
        }
        Ok(svc)
    }

    fn health_check(&self, node: &Node, at: &FieldPath, port: u16, protocol: Protocol) -> Result<Option<HealthCheck>, ConfigError> {
        let f = self.mapping(node, at, &["kind", "port", "path", "expect", "interval", "timeout", "rise", "fall"])?;
        let kind = match self.choice(self.required(f, at, "kind")?, &at.key("kind"), &[("tcp", Some(CheckKind::Tcp)), ("http", Some(CheckKind::Http)), ("none", None)])? {
            None => return Ok(None),
            Some(k) => k,
        };
        let check_port = match Self::get(f, "port") {
            Some(n) => self.integer(n, &at.key("port"), 1, 65535)? as u16,
            None if protocol == Protocol::Udp => {
                return Err(self.err(
                    &at.key("kind"),
                    format!("a UDP service's {} check connects over TCP: give the `port` to probe", kind.as_str()),
                ));
            }
            None => port,
        };
        let http_only = |key: &str| -> Result<(), ConfigError> {
            if kind != CheckKind::Http && Self::get(f, key).is_some() {
                return Err(self.err(&at.key(key), "applies to `kind: http` only"));
            }
            Ok(())
        };
        http_only("path")?;
        http_only("expect")?;
        let path = match Self::get(f, "path") {
            None => "/".to_string(),
            Some(n) => {
                let s = self.string(n, &at.key("path"), "a path such as /healthz")?;
                if !s.starts_with('/') || s.len() > 1024 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(self.err(&at.key("path"), format!("`{s}` is not a path: it must start with / and hold no spaces")));
                }
                s.to_string()
            }
        };
        let expect = match Self::get(f, "expect") {
            None => (200, 399),
            Some(n) => self.status_range(n, &at.key("expect"))?,
        };
        let interval = match Self::get(f, "interval") {
            None => std::time::Duration::from_secs(2),
            Some(n) => self.duration(n, &at.key("interval"), 0.1, 3600.0)?,
        };
        let timeout = match Self::get(f, "timeout") {
            None => std::time::Duration::from_secs(1).min(interval),
            Some(n) => self.duration(n, &at.key("timeout"), 0.01, 60.0)?,
        };
        if timeout > interval {
            return Err(self.err(
                &at.key("timeout"),
                format!("{:?} is longer than the interval ({:?}); a probe must end before the next one starts", timeout, interval),
            ));
        }
        let rise = match Self::get(f, "rise") {
            None => 2,
            Some(n) => self.integer(n, &at.key("rise"), 1, 100)?,
        };
        let fall = match Self::get(f, "fall") {
            None => 3,
            Some(n) => self.integer(n, &at.key("fall"), 1, 100)?,
        };
        Ok(Some(HealthCheck { kind, port: check_port, path, expect, interval, timeout, rise, fall }))
    }

    /// `1.02`: a number from 1.000 to 2.000 with at most three decimals, as thousandths.
    fn load_bound(&self, node: &Node, at: &FieldPath) -> Result<u32, ConfigError> {
        let bad = |what: String| self.err(at, format!("{what}: expected a number from 1.000 to 2.000 with at most three decimals"));
        let x = match node {
            Node::Int(i) => *i as f64,
            Node::Float(x) => *x,
            other => return Err(bad(other.kind().to_string())),
        };
        let milli = (x * 1000.0).round();
        if (x * 1000.0 - milli).abs() > 1e-6 {
            return Err(bad(format!("{x} has more than three decimals")));
        }
        if !(MIN_LOAD_BOUND as f64..=MAX_LOAD_BOUND as f64).contains(&milli) {
            return Err(bad(format!("{x}")));
        }
        Ok(milli as u32)
    }

    /// `2s`, `500ms`, `1.5s`, `1m`, or a number of seconds, within lo..=hi seconds.
    fn duration(&self, node: &Node, at: &FieldPath, lo: f64, hi: f64) -> Result<std::time::Duration, ConfigError> {
        let secs = match node {
            Node::Int(i) => *i as f64,
            Node::Float(x) => *x,
            Node::Str(s) => {
                let t = s.trim();
                let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
                    Some(i) => t.split_at(i),
                    None => (t, "s"),
                };
                let scale = match unit {
                    "ms" => 0.001,
                    "s" => 1.0,
                    "m" => 60.0,
                    _ => return Err(self.err(at, format!("`{s}` is not a duration: use a number with ms, s or m, such as 2s"))),
                };
                match num.trim().parse::<f64>() {
                    Ok(v) => v * scale,
                    Err(_) => return Err(self.err(at, format!("`{s}` is not a duration: use a number with ms, s or m, such as 2s"))),
                }
            }
            other => return Err(self.err(at, format!("expected a duration such as 2s, found {}", other.kind()))),
        };
        if !(lo..=hi).contains(&secs) {
            return Err(self.err(at, format!("expected a duration from {lo}s to {hi}s, found {secs}s")));
        }
        Ok(std::time::Duration::from_secs_f64(secs))
    }

    /// `200`, or `200-399`.
    fn status_range(&self, node: &Node, at: &FieldPath) -> Result<(u16, u16), ConfigError> {
        let bad = |what: String| self.err(at, format!("{what}: expected a status code or a range such as 200-399, within 100..=599"));
        let (lo, hi) = match node {
            Node::Int(i) => (*i, *i),
            Node::Str(s) => {
                let (a, b) = s.split_once('-').unwrap_or((s, s));
                match (a.trim().parse::<i128>(), b.trim().parse::<i128>()) {
                    (Ok(a), Ok(b)) => (a, b),
                    _ => return Err(bad(format!("`{s}`"))),
                }
            }
            other => return Err(bad(other.kind().to_string())),
        };
        if !(100..=599).contains(&lo) || !(100..=599).contains(&hi) || lo > hi {
            return Err(bad(format!("{lo}-{hi}")));
        }
        Ok((lo as u16, hi as u16))
    }

    fn backend(&self, node: &Node, at: &FieldPath) -> Result<Backend, ConfigError> {
        // A bare address is a handy shorthand: `- 10.0.0.1`.
        if let Node::Str(_) = node {
            return Ok(Backend { address: self.address(node, at)?, name: None, weight: 1, state: BackendState::Active });
        }
        let f = self.mapping(node, at, &["address", "name", "weight", "state"])?;
        let address = self.address(self.required(f, at, "address")?, &at.key("address"))?;
        let name = match Self::get(f, "name") {
            None => None,
            Some(n) => {
                let name_at = at.key("name");
                let s = self.string(n, &name_at, "a backend name")?;
                if s.is_empty() || s.len() > 255 || s.chars().any(|c| c.is_control()) {
                    return Err(self.err(&name_at, "expected a name of 1..=255 bytes without control characters"));
                }
                Some(s.to_string())
            }
        };
        let weight = match Self::get(f, "weight") {
            None => 1,
            Some(n) => self.integer(n, &at.key("weight"), 0, MAX_WEIGHT)?,
        };
        let state = match Self::get(f, "state") {
            None => BackendState::Active,
            Some(n) => self.choice(n, &at.key("state"), &[("active", BackendState::Active), ("drain", BackendState::Drain)])?,
        };
        Ok(Backend { address, name, weight, state })
    }
}

fn valid_service_name(name: &str) -> bool {
    (1..=63).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Why an address cannot be a VIP or a backend, if it cannot.
fn not_unicast(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(a) if a.is_unspecified() => Some("the unspecified address"),
        IpAddr::V4(a) if a.is_broadcast() => Some("the broadcast address"),
        IpAddr::V4(a) if a.is_multicast() => Some("a multicast address"),
        IpAddr::V4(a) if a.octets()[0] == 0 => Some("in 0.0.0.0/8 (\"this network\")"),
        IpAddr::V6(a) if a.is_unspecified() => Some("the unspecified address"),
        IpAddr::V6(a) if a.is_multicast() => Some("a multicast address"),
        IpAddr::V6(a) if a.to_ipv4_mapped().is_some() => Some("an IPv4-mapped IPv6 address (write the IPv4 form)"),
        _ => None,
    }
}

pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    if n % 2 == 0 {
        return n == 2;
    }
    let n = n as u64;
    let mut d = 3u64;
    while d * d <= n {
        if n % d == 0 {
            return false;
        }
        d += 2;
    }
    true
}

fn nearby_primes(n: u32) -> String {
    let below = (2..n).rev().find(|&k| is_prime(k));
    let above = (n + 1..=MAX_SLOTS).find(|&k| is_prime(k));
    match (below, above) {
        (Some(b), Some(a)) => format!("{b}, {a}"),
        (Some(b), None) => b.to_string(),
        (None, Some(a)) => a.to_string(),
        (None, None) => "none".to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn health_checks_parse_with_their_defaults() {
        let text = "services:\n  - name: web\n    vip: 10.0.0.1\n    port: 80\n    health_check: {kind: http, path: /healthz, expect: 200, interval: 500ms, rise: 1}\n    backends: [10.0.0.2]\n  - name: dns\n    vip: 10.0.0.1\n    port: 53\n    protocol: udp\n    health_check: {kind: tcp, port: 8053}\n    backends: [10.0.0.2]\n  - name: off\n    vip: 10.0.0.1\n    port: 81\n    health_check: {kind: none}\n    backends: [10.0.0.2]\n";
        let p = super::parse_str("p.yaml", text).expect("valid");
        let web = p.services[0].health_check.clone().expect("web is checked");
        assert_eq!(web.kind, super::CheckKind::Http);
        assert_eq!((web.port, web.path.as_str(), web.expect), (80, "/healthz", (200, 200)));
        assert_eq!((web.interval.as_millis(), web.timeout.as_millis(), web.rise, web.fall), (500, 500, 1, 3));
        let dns = p.services[1].health_check.clone().expect("dns is checked");
        assert_eq!((dns.kind, dns.port, dns.expect, dns.interval.as_secs(), dns.timeout.as_secs()), (super::CheckKind::Tcp, 8053, (200, 399), 2, 1));
        assert_eq!(p.services[2].health_check, None);
    }

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
    fn encapsulating_services_carry_either_family_and_default_to_l2() {
        let text = "services:\n  - name: a\n    vip: 10.0.0.1\n    port: 80\n    forward: ipip\n    backends: [10.1.0.1, 'fd00::1']\n  - name: b\n    vip: 'fd00::100'\n    port: 80\n    forward: gue\n    gue_port: 7000\n    backends: [10.1.0.1]\n  - name: c\n    vip: 10.0.0.1\n    port: 81\n    backends: [10.1.0.1]\n";
        let p = parse_str("p.yaml", text).expect("valid");
        assert_eq!((p.services[0].forward, p.services[0].gue_port), (Forward::Ipip, DEFAULT_GUE_PORT));
        assert_eq!((p.services[1].forward, p.services[1].gue_port), (Forward::Gue, 7000));
        assert_eq!(p.services[2].forward, Forward::L2);
    }

    #[test]
    fn bounded_takes_a_load_bound_in_thousandths() {
        let p = parse_str("p.yaml", "services:\n  - {name: a, vip: 10.0.0.1, port: 80, algorithm: bounded, slots: 1000, backends: [10.1.0.1]}\n  - {name: b, vip: 10.0.0.1, port: 81, algorithm: bounded, load_bound: 1.005, backends: [10.1.0.1]}\n  - {name: c, vip: 10.0.0.1, port: 82, algorithm: bounded, load_bound: 2, backends: [10.1.0.1]}\n").expect("valid");
        assert_eq!(p.services.iter().map(|s| s.load_bound).collect::<Vec<_>>(), [1020, 1005, 2000]);
        assert_eq!(p.services[0].algorithm, Algorithm::Bounded);
        let e = parse_str("p.yaml", "services:\n  - {name: a, vip: 10.0.0.1, port: 80, algorithm: bounded, vnodes_per_weight: 10, backends: [10.1.0.1]}\n").unwrap_err();
        assert!(e.to_string().contains("vnodes_per_weight: applies to `algorithm: ring` only"), "{e}");
    }

    #[test]
    fn primes() {
        let small: Vec<u32> = (0..30).filter(|&n| is_prime(n)).collect();
        assert_eq!(small, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert!(is_prime(65537));
        assert!(!is_prime(65536));
        assert!(is_prime(1_048_573));
        assert_eq!(nearby_primes(65536), "65521, 65537");
    }

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
