//! A QUIC echo server and client for the QUIC-LB end-to-end test: real quinn endpoints on plain
//! UDP sockets, inside the test's network namespaces. Not part of lb itself.
//!
//! - `serve --name NAME --listen ADDR:PORT [--quic-lb FILE]`: a backend bound to ADDR:PORT (the
//!   VIP on its loopback). With FILE (lb::quic_lb::ServerParams as YAML) every connection ID it
//!   issues is a routable QUIC-LB ID (lb::quic_lb::RoutableIds); without it, quinn's own IDs.
//!   Each line received on a bidirectional stream is answered with `NAME <line>`. Prints
//!   `listening ADDR:PORT cid-len N` once ready. With QUIC_ECHO_DEBUG set in its environment it
//!   prints the first IDs it issues, and the server IDs they carry, to stderr.
//! - `client --connect VIP:PORT --connections N --bind ADDR [--interval-ms MS]`: N connections,
//!   each from an endpoint (a UDP socket, so a source port) of its own on ADDR:0, as N client
//!   machines behind one NAT would be, each sending `c<i> <seq>` on one stream every MS milliseconds
//!   and noting which backend answered. Commands on stdin, one a line, while they run:
//!   `rebind` (every endpoint to a new source port on its address), `move ADDR` (every endpoint to
//!   a new source address),
//!   `mark LABEL` (a new phase), `report` (one JSON line on stdout), `quit` (or end of input).
//!   A connection that fails, or that has had no answer for 3 s, is broken and never replaced.
//!
//! TLS here is only what QUIC cannot do without: the server makes a self-signed certificate at
//! start and the client does not check it (signatures apart), since the test is about where
//! packets are routed, not whom to trust.

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::{Parser, Subcommand};
use lb::quic_lb::{decode_server_id, Config, RoutableIds, ServerParams};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::rustls;
use quinn::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use quinn::{ClientConfig, Connection, ConnectionId, ConnectionIdGenerator, Endpoint, EndpointConfig, IdleTimeout, ServerConfig, TokioRuntime, TransportConfig};
use quinn_proto::InvalidCid;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

const ALPN: &[u8] = b"lb-echo";
/// The name in the certificate, and the one the client asks for (not checked).
const SERVER_NAME: &str = "localhost";
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// No answer for this long breaks a client connection.
const ECHO_TIMEOUT: Duration = Duration::from_secs(3);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How many issued IDs QUIC_ECHO_DEBUG prints.
const DEBUG_IDS: usize = 12;

#[derive(Parser)]
#[command(about = "QUIC echo server and client for lb's QUIC-LB end-to-end test")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer every line on every stream with `NAME <line>`.
    Serve {
        /// The backend's name, first word of every answer.
        #[arg(long)]
        name: String,
        /// The address and port to bind (plainly: the address must be the host's).
        #[arg(long)]
        listen: SocketAddr,
        /// QUIC-LB server parameters (YAML, as `lb` writes them): issue routable connection IDs.
        #[arg(long = "quic-lb", value_name = "FILE")]
        quic_lb: Option<PathBuf>,
    },
    /// Long-lived echo connections driven by commands on stdin.
    Client {
        /// The server (or VIP) address and port.
        #[arg(long)]
        connect: SocketAddr,
        /// How many connections to open.
        #[arg(long)]
        connections: usize,
        /// The local address to send from (port chosen by the system).
        #[arg(long)]
        bind: IpAddr,
        /// Milliseconds between two lines on each connection.
        #[arg(long, default_value_t = 100)]
        interval_ms: u64,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("quic-echo: tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Serve { name, listen, quic_lb } => serve(name, listen, quic_lb).await,
            Command::Client { connect, connections, bind, interval_ms } => client(connect, connections, bind, Duration::from_millis(interval_ms)).await,
        }
    });
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quic-echo: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

// ---------------------------------------------------------------------------------------------
// Server

async fn serve(name: String, listen: SocketAddr, quic_lb: Option<PathBuf>) -> Result<()> {
    let mut endpoint_config = EndpointConfig::default();
    let cid_len = match &quic_lb {
        None => quinn_proto::HashedConnectionIdGenerator::default().cid_len(),
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let params = ServerParams::parse(&text).with_context(|| format!("{}", path.display()))?;
            let cid_len = params.cid_len();
            let config = params.config()?;
            let make = RoutableIds::factory(params)?;
            if std::env::var_os("QUIC_ECHO_DEBUG").is_some() {
                let printed = Arc::new(AtomicUsize::new(0));
                endpoint_config.cid_generator(move || {
                    Box::new(Printed { inner: make(), config: config.clone(), printed: printed.clone() }) as Box<dyn ConnectionIdGenerator>
                });
            } else {
                endpoint_config.cid_generator(make);
            }
            cid_len
        }
    };

    let key_pair = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()]).context("self-signed certificate")?;
    let cert = key_pair.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_pair.signing_key.serialize_der()));
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut server_config = ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls)?));
    let mut transport = TransportConfig::default();
    // Generous, and no keep-alive of its own: the client's keep-alives hold connections open.
    transport.max_idle_timeout(Some(IdleTimeout::try_from(IDLE_TIMEOUT)?));
    transport.keep_alive_interval(None);
    server_config.transport_config(Arc::new(transport));

    let socket = UdpSocket::bind(listen).with_context(|| format!("binding {listen}"))?;
    let endpoint = Endpoint::new(endpoint_config, Some(server_config), socket, Arc::new(TokioRuntime))?;
    let local = endpoint.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening {local} cid-len {cid_len}")?;
        out.flush()?;
    }
    let name: Arc<str> = name.into();
    while let Some(incoming) = endpoint.accept().await {
        let name = name.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            match incoming.await {
                Ok(conn) => serve_connection(conn, name).await,
                Err(e) => eprintln!("quic-echo serve: handshake from {remote}: {e}"),
            }
        });
    }
    Ok(())
}

async fn serve_connection(conn: Connection, name: Arc<str>) {
    loop {
        match conn.accept_bi().await {
            Ok((send, recv)) => {
                let name = name.clone();
                tokio::spawn(async move {
                    if let Err(e) = echo(send, recv, &name).await {
                        eprintln!("quic-echo serve: stream: {e}");
                    }
                });
            }
            // The client's own close is how every connection should end.
            Err(quinn::ConnectionError::ApplicationClosed(_)) => return,
            Err(e) => {
                eprintln!("quic-echo serve: connection from {}: {e}", conn.remote_address());
                return;
            }
        }
    }
}

/// Echoes until the client ends the stream. A lost connection is no stream error of its own:
/// `serve_connection` tells of it.
async fn echo(mut send: quinn::SendStream, recv: quinn::RecvStream, name: &str) -> Result<(), String> {
    let mut lines = BufReader::new(recv).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => match send.write_all(format!("{name} {line}\n").as_bytes()).await {
                Ok(()) => {}
                Err(quinn::WriteError::ConnectionLost(_)) => return Ok(()),
                Err(e) => return Err(format!("sending: {e}")),
            },
            Ok(None) => break,
            Err(e) => match e.downcast::<quinn::ReadError>() {
                Ok(quinn::ReadError::ConnectionLost(_)) => return Ok(()),
                Ok(e) => return Err(format!("receiving: {e}")),
                Err(e) => return Err(format!("receiving: {e}")),
            },
        }
    }
    send.finish().map_err(|e| format!("finishing: {e}"))
}

/// RoutableIds that also prints its first IDs, and the server ID each decodes to, on stderr.
struct Printed {
    inner: Box<dyn ConnectionIdGenerator>,
    config: Config,
    printed: Arc<AtomicUsize>,
}

impl ConnectionIdGenerator for Printed {
    fn generate_cid(&mut self) -> ConnectionId {
        let cid = self.inner.generate_cid();
        if self.printed.fetch_add(1, Ordering::Relaxed) < DEBUG_IDS {
            let sid = decode_server_id(&self.config, &cid).map(|s| s.iter().map(|b| format!("{b:02x}")).collect::<String>());
            eprintln!("quic-echo serve: issued cid {cid} server-id {}", sid.as_deref().unwrap_or("none"));
        }
        cid
    }

    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        self.inner.validate(cid)
    }

    fn cid_len(&self) -> usize {
        self.inner.cid_len()
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        self.inner.cid_lifetime()
    }
}

// ---------------------------------------------------------------------------------------------
// Client

/// What the client knows of one connection.
#[derive(Default)]
struct Stats {
    /// Distinct backends in order of first answer.
    backends: Vec<String>,
    last: Option<String>,
    ok_in_phase: u64,
    broken: bool,
    error: Option<String>,
}

#[derive(Default)]
struct Shared {
    phase: Option<String>,
    connections: Vec<Stats>,
}

type State = Arc<Mutex<Shared>>;

fn lock(state: &State) -> MutexGuard<'_, Shared> {
    // A task that panicked holding the lock left counters only: go on with them.
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn client(connect: SocketAddr, connections: usize, bind: IpAddr, interval: Duration) -> Result<()> {
    let state: State = Arc::new(Mutex::new(Shared { phase: None, connections: (0..connections).map(|_| Stats::default()).collect() }));

    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut client_config = ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?));
    let mut transport = TransportConfig::default();
    transport.max_idle_timeout(Some(IdleTimeout::try_from(IDLE_TIMEOUT)?));
    transport.keep_alive_interval(Some(Duration::from_secs(1)));
    client_config.transport_config(Arc::new(transport));

    let mut endpoints = Vec::with_capacity(connections);
    for _ in 0..connections {
        let socket = bind_any(bind)?;
        let mut endpoint = Endpoint::new(EndpointConfig::default(), None, socket, Arc::new(TokioRuntime))?;
        endpoint.set_default_client_config(client_config.clone());
        endpoints.push(endpoint);
    }

    let mut tasks = Vec::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let (endpoint, state) = (endpoint.clone(), state.clone());
        tasks.push(tokio::spawn(async move {
            let error = run_connection(&endpoint, connect, i, interval, &state).await;
            let mut shared = lock(&state);
            let stats = &mut shared.connections[i];
            stats.broken = true;
            stats.error = Some(format!("{error:#}"));
            eprintln!("quic-echo client: c{i} broken: {error:#}");
        }));
    }

    // stdin is read on a thread of its own; the channel closes at end of input.
    let (commands, mut received) = mpsc::channel::<String>(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(line) => {
                    if commands.blocking_send(line).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    eprintln!("quic-echo client: stdin: {e}");
                    return;
                }
            }
        }
    });

    while let Some(line) = received.recv().await {
        let line = line.trim();
        let (command, argument) = line.split_once(char::is_whitespace).map(|(c, a)| (c, a.trim())).unwrap_or((line, ""));
        let outcome = match command {
            "" => Ok(()),
            "rebind" => endpoints.iter().try_for_each(|e| e.local_addr().map_err(anyhow::Error::from).and_then(|local| rebind(e, local.ip()))),
            "move" => argument.parse::<IpAddr>().map_err(|e| anyhow!("move {argument:?}: {e}")).and_then(|ip| endpoints.iter().try_for_each(|e| rebind(e, ip))),
            "mark" if !argument.is_empty() => {
                let mut shared = lock(&state);
                shared.phase = Some(argument.to_string());
                shared.connections.iter_mut().for_each(|c| c.ok_in_phase = 0);
                Ok(())
            }
            "report" => report(&state, &endpoints),
            "quit" => break,
            _ => Err(anyhow!("unknown command {line:?} (rebind, move ADDR, mark LABEL, report, quit)")),
        };
        if let Err(e) = outcome {
            eprintln!("quic-echo client: {e:#}");
        }
    }

    for endpoint in &endpoints {
        endpoint.close(0u32.into(), b"quit");
    }
    for task in &tasks {
        task.abort();
    }
    // Lets the close frames go out; connections that cannot say goodbye time out on their own.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        for endpoint in &endpoints {
            endpoint.wait_idle().await;
        }
    })
    .await;
    Ok(())
}

fn bind_any(ip: IpAddr) -> Result<UdpSocket> {
    UdpSocket::bind(SocketAddr::new(ip, 0)).with_context(|| format!("binding {ip}:0"))
}

fn rebind(endpoint: &Endpoint, ip: IpAddr) -> Result<()> {
    let socket = bind_any(ip)?;
    let local = socket.local_addr()?;
    endpoint.rebind(socket).with_context(|| format!("rebinding to {local}"))
}

fn report(state: &State, endpoints: &[Endpoint]) -> Result<()> {
    let local: Vec<String> = endpoints.iter().map(|e| e.local_addr().map(|a| a.to_string())).collect::<std::io::Result<_>>()?;
    let line = {
        let shared = lock(state);
        let connections: Vec<_> = shared
            .connections
            .iter()
            .enumerate()
            .map(|(i, c)| json!({"id": i, "backends": c.backends, "last": c.last, "ok_in_phase": c.ok_in_phase, "broken": c.broken, "error": c.error, "local": local[i]}))
            .collect();
        json!({"phase": shared.phase, "connections": connections})
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// Connects, then echoes until something breaks; returns what broke it.
async fn run_connection(endpoint: &Endpoint, connect: SocketAddr, i: usize, interval: Duration, state: &State) -> anyhow::Error {
    let conn = match tokio::time::timeout(HANDSHAKE_TIMEOUT, async { endpoint.connect(connect, SERVER_NAME)?.await.map_err(anyhow::Error::from) }).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return e.context("handshake"),
        Err(_) => return anyhow!("handshake: no answer in {} s", HANDSHAKE_TIMEOUT.as_secs()),
    };
    let error = echo_loop(&conn, i, interval, state).await;
    conn.close(0u32.into(), b"broken");
    error
}

async fn echo_loop(conn: &Connection, i: usize, interval: Duration, state: &State) -> anyhow::Error {
    let (mut send, recv) = match conn.open_bi().await {
        Ok(streams) => streams,
        Err(e) => return anyhow!("opening a stream: {e}"),
    };
    let mut answers = BufReader::new(recv).lines();
    let mut tick = tokio::time::interval(interval);
    let silence = tokio::time::sleep(ECHO_TIMEOUT);
    tokio::pin!(silence);
    let mut seq: u64 = 0;
    let mut names = HashSet::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let line = format!("c{i} {seq}\n");
                seq += 1;
                match tokio::time::timeout(ECHO_TIMEOUT, send.write_all(line.as_bytes())).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return anyhow!("sending: {e}"),
                    Err(_) => return anyhow!("sending: blocked for {} s", ECHO_TIMEOUT.as_secs()),
                }
            }
            answer = answers.next_line() => {
                let answer = match answer {
                    Ok(Some(answer)) => answer,
                    Ok(None) => return anyhow!("the server ended the stream"),
                    Err(e) => return anyhow!("receiving: {e}"),
                };
                let Some((name, echoed)) = answer.split_once(' ') else {
                    return anyhow!("answer {answer:?} is not `NAME LINE`");
                };
                if !echoed.starts_with(&format!("c{i} ")) {
                    return anyhow!("answer {answer:?} echoes another connection's line");
                }
                silence.as_mut().reset(tokio::time::Instant::now() + ECHO_TIMEOUT);
                let mut shared = lock(state);
                let stats = &mut shared.connections[i];
                if names.insert(name.to_string()) {
                    stats.backends.push(name.to_string());
                }
                stats.last = Some(name.to_string());
                stats.ok_in_phase += 1;
            }
            () = &mut silence => return anyhow!("no answer for {} s", ECHO_TIMEOUT.as_secs()),
            reason = conn.closed() => return anyhow!("connection closed: {reason}"),
        }
    }
}

/// Accepts any certificate, checking only that the handshake is signed by its key: see the top
/// of this file for why.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
