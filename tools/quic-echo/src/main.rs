//! A QUIC echo server and client for the QUIC-LB end-to-end test: real quinn endpoints on plain
//! UDP sockets, inside the test's network namespaces. Not part of lb itself.
//!
//! - `serve --name NAME --listen ADDR:PORT [--quic-lb FILE]`: a backend bound to ADDR:PORT (the
//!   VIP on its loopback). With FILE (lb_core::quic_lb::ServerParams as YAML) every connection ID it
//!   issues is a routable QUIC-LB ID (lb_core::quic_lb::RoutableIds); without it, quinn's own IDs.
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

mod client;
mod serve;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use quinn::rustls;
use quinn::rustls::pki_types::{CertificateDer, ServerName, UnixTime};

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
            Command::Serve { name, listen, quic_lb } => serve::serve(name, listen, quic_lb).await,
            Command::Client { connect, connections, bind, interval_ms } => client::client(connect, connections, bind, Duration::from_millis(interval_ms)).await,
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

