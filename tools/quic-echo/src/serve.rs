//! `quic-echo serve`: a backend's QUIC echo server, issuing lb's QUIC-LB IDs when given its
//! parameters.

use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use lb_core::quic_lb::{decode_server_id, Config, RoutableIds, ServerParams};
use quinn::crypto::rustls::QuicServerConfig;
use quinn::rustls;
use quinn::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use quinn::{Connection, ConnectionId, ConnectionIdGenerator, Endpoint, EndpointConfig, IdleTimeout, ServerConfig, TokioRuntime, TransportConfig};
use quinn_proto::InvalidCid;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{provider, ALPN, DEBUG_IDS, IDLE_TIMEOUT, SERVER_NAME};


pub async fn serve(name: String, listen: SocketAddr, quic_lb: Option<PathBuf>) -> Result<()> {
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
