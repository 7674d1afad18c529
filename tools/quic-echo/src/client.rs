//! `quic-echo client`: N connections, each from an endpoint of its own, echoing until told to
//! quit, rebinding and moving on command, reporting per connection which backends answered.

use std::collections::HashSet;
use std::io::{BufRead, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use quinn::crypto::rustls::QuicClientConfig;
use quinn::rustls;
use quinn::{ClientConfig, Connection, Endpoint, EndpointConfig, IdleTimeout, TokioRuntime, TransportConfig};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

use crate::{provider, AnyCertificate, ALPN, ECHO_TIMEOUT, HANDSHAKE_TIMEOUT, IDLE_TIMEOUT, SERVER_NAME};

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

pub async fn client(connect: SocketAddr, connections: usize, bind: IpAddr, interval: Duration) -> Result<()> {
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

