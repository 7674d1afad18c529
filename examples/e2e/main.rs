//! The end-to-end suite's client and server (scripts/e2e.sh, scripts/demo.sh): real TCP and UDP
//! sockets in the namespaces of the demo topology, and the checks that compare what clients
//! saw with what the tables say. Not part of lb itself.
//!
//! - `serve NAME --tcp PORT --udp PORT`: a backend. Every TCP connection gets `NAME\n` at once
//!   and again for every line it sends; every UDP datagram gets `NAME\n` back.
//! - `probe`: one short connection (or datagram) per (source address, source port) pair, each
//!   from a fixed source port so that the same flows can be replayed; prints `src sport backend`
//!   lines (or `src sport FAIL reason`).
//! - `check`: compares probe output with the table `lb table` builds: every flow on its predicted
//!   backend, and per-backend counts against the table's shares.
//! - `compare`: two probe outputs of the same flows around a pool change: which flows moved, and
//!   whether only the flows that had to move did.
//! - `hold`: long-lived connections (with `--udp`, UDP flows) that keep talking; fails if any breaks
//!   or changes backend.
//! - `work-serve` and `load` (work.rs): a backend whose requests cost real CPU work, and an
//!   open-loop client that records each request's backend and latency.
//! - `xdp-pass IFACE`: attaches a two-instruction XDP_PASS program to IFACE in driver mode (what a
//!   veth peer needs for native XDP_TX frames to arrive).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

mod work;
use clap::{Parser, Subcommand};
use nix::sys::socket::{setsockopt, sockopt};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Serve {
        name: String,
        #[arg(long)]
        tcp: Vec<u16>,
        #[arg(long)]
        udp: Vec<u16>,
        /// Bind the UDP ports to these addresses (the VIPs), so that answers leave from the
        /// address they were sent to, as direct server return needs; default: every address.
        #[arg(long)]
        udp_address: Vec<IpAddr>,
        /// An HTTP port whose every GET is answered with the status code in --status-file
        /// (200 when the file is missing): a health endpoint the tests can turn bad.
        #[arg(long)]
        http: Option<u16>,
        #[arg(long)]
        status_file: Option<PathBuf>,
        /// A TCP port for bulk transfers: `GET N` is answered with the name line and N bytes;
        /// `PUT N` followed by N bytes with `NAME N` once all arrived.
        #[arg(long)]
        bulk: Option<u16>,
    },
    /// One bulk transfer to a `serve --bulk` port through the VIP: downloads or uploads BYTES;
    /// prints `backend bytes seconds`. Fails if it does not complete within the timeout.
    Transfer {
        #[arg(long)]
        vip: IpAddr,
        #[arg(long)]
        port: u16,
        #[arg(long)]
        download: Option<usize>,
        #[arg(long)]
        upload: Option<usize>,
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
        /// The client address to connect from (default: the kernel's choice).
        #[arg(long)]
        source: Option<IpAddr>,
    },
    Probe {
        #[arg(long)]
        vip: IpAddr,
        #[arg(long)]
        port: u16,
        #[arg(long)]
        udp: bool,
        /// Comma-separated source addresses (held by this namespace).
        #[arg(long, value_delimiter = ',')]
        sources: Vec<IpAddr>,
        /// Source ports FIRST..FIRST+COUNT for every source address.
        #[arg(long, default_value_t = 20000)]
        first_port: u16,
        #[arg(long)]
        count: u16,
        #[arg(long, default_value_t = 16)]
        workers: usize,
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
    Check {
        /// The pool file the load balancer serves.
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        service: String,
        /// Probe output.
        flows: PathBuf,
        /// NAME=IDENTITY: a server that answers NAME is the backend with this identity (for
        /// backends without a `name` in the pool, whose identity is their address).
        #[arg(long, value_delimiter = ',')]
        alias: Vec<String>,
    },
    Compare {
        before: PathBuf,
        after: PathBuf,
        /// The backend that was removed (its flows must move, no other may).
        #[arg(long)]
        removed: Option<String>,
        /// The backend that was added (flows may only move to it).
        #[arg(long)]
        added: Option<String>,
        /// AFTER was probed while the change was being applied: a flow of the removed backend
        /// may still reach it, move, or fail once; every other flow must keep its backend.
        #[arg(long)]
        transition: bool,
    },
    Hold {
        #[arg(long)]
        vip: IpAddr,
        #[arg(long)]
        port: u16,
        #[arg(long, value_delimiter = ',')]
        sources: Vec<IpAddr>,
        #[arg(long)]
        connections: usize,
        /// How long to keep them open, talking every 100 ms.
        #[arg(long)]
        seconds: f64,
        /// Created once every connection is open.
        #[arg(long)]
        ready_file: Option<PathBuf>,
        /// Connections on this backend may break (it is being removed); they are counted apart.
        #[arg(long)]
        allow_broken_on: Option<String>,
        /// UDP flows instead of connections: each source port sends a datagram every 100 ms and
        /// must be answered by the same backend throughout (see `hold_udp`).
        #[arg(long)]
        udp: bool,
        /// How long an exchange may wait for its answer before the flow counts as broken, in
        /// seconds. A segment lost on the way is retransmitted by TCP after 0.2, 0.6, 1.4, 3.0,
        /// 6.2 s: under a flood that fills the test's own queues, a few seconds is a stall,
        /// not a break (a connection sent to another backend is reset at once).
        #[arg(long, default_value_t = 3.0)]
        patience: f64,
        /// Source ports FIRST, FIRST+1, ... (a second holder in one test takes other flows).
        #[arg(long, default_value_t = 40000)]
        first_port: u16,
        /// Go on to the end after a connection broke, and count every one that does (a control
        /// run that must show how many break); without it the first round with a break ends it.
        #[arg(long)]
        keep_going: bool,
    },
    XdpPass {
        iface: String,
    },
    /// Attaches the benchmark floor (swap MACs, XDP_TX) to IFACE in driver mode.
    XdpFloor {
        iface: String,
    },
    /// An HTTP/1.0 server on PORT that does KILO_ROUNDS thousand rounds of work per request, one
    /// request at a time, and answers `NAME CHECKSUM`.
    WorkServe {
        name: String,
        #[arg(long)]
        port: u16,
        #[arg(long)]
        kilo_rounds: u64,
    },
    /// RATE new connections a second to VIP:PORT for SECONDS (a GET each); one line per
    /// request to OUT: `START_MS BACKEND LATENCY_MS`.
    Load {
        #[arg(long)]
        vip: IpAddr,
        #[arg(long)]
        port: u16,
        /// The source address (default: the kernel's choice).
        #[arg(long)]
        source: Option<IpAddr>,
        #[arg(long)]
        rate: f64,
        #[arg(long)]
        seconds: f64,
        #[arg(long, default_value_t = 256)]
        workers: usize,
        #[arg(long, default_value_t = 5.0)]
        timeout: f64,
        #[arg(long)]
        out: PathBuf,
    },
    /// Sends frames out of IFACE as fast as BPF_PROG_TEST_RUN's live-frame mode can, for
    /// SECONDS; prints the packets sent per second. Identical UDP frames, or with --flows or
    /// --new-every, TCP frames of many flows (crates/dataplane/src/bpf/trafgen.bpf.c).
    Trafgen {
        iface: String,
        #[arg(long)]
        dst_mac: String,
        #[arg(long)]
        src: std::net::Ipv4Addr,
        #[arg(long)]
        dst: std::net::Ipv4Addr,
        #[arg(long)]
        dport: u16,
        #[arg(long)]
        seconds: f64,
        /// Print the number of frames sent after the rate.
        #[arg(long)]
        total: bool,
        /// A working set of this many TCP flows, round-robin.
        #[arg(long, default_value_t = 0)]
        flows: u32,
        /// Every N-th packet a SYN of a never-seen flow (1: all of them: a spoofed SYN flood).
        #[arg(long, default_value_t = 0)]
        new_every: u32,
        /// Send each working-set flow's SYN and ACK once (2 x --flows packets per CPU), then stop.
        #[arg(long)]
        warmup: bool,
        /// With --new-every 1: two packets per new flow, back to back: its SYN and then its
        /// bare ACK (a handshake as a connection tracker that never sees the SYN-ACK takes it),
        /// or with --udp two datagrams.
        #[arg(long)]
        pairs: bool,
        /// With --new-every: UDP datagrams (with a wrong checksum, so that receivers drop them
        /// early) instead of TCP segments.
        #[arg(long)]
        udp: bool,
        /// Generate on these CPUs, one thread each (default: the CPU it starts on).
        #[arg(long, value_delimiter = ',')]
        cpus: Vec<usize>,
        /// Frames per BPF_PROG_TEST_RUN call (each call also costs about 30 ms of setup and
        /// teardown, during which nothing is sent).
        #[arg(long, default_value_t = 1 << 22)]
        batch: u32,
        /// Stop after the batch during which this file appears (--seconds is then the longest
        /// the generator runs): a test can flood until the receiver has seen enough.
        #[arg(long)]
        stop_file: Option<PathBuf>,
    },
}

use lb::dataplane::trafgen as trafgen_skel;

use lb::dataplane::floor;

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("e2e: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<bool> {
    match cli.cmd {
        Cmd::Serve { name, tcp, udp, udp_address, http, status_file, bulk } => {
            if let Some(port) = http {
                let listener = dual_stack_listener(port).with_context(|| format!("listening on http {port}"))?;
                let name = name.clone();
                std::thread::spawn(move || http_status(listener, &name, status_file));
            }
            if let Some(port) = bulk {
                let listener = dual_stack_listener(port).with_context(|| format!("listening on bulk {port}"))?;
                let name = name.clone();
                std::thread::spawn(move || bulk_serve(listener, name));
            }
            serve(&name, &tcp, &udp, &udp_address)
        }
        Cmd::Transfer { vip, port, download, upload, timeout, source } => {
            transfer(vip, port, source, download, upload, Duration::from_secs_f64(timeout))
        }
        Cmd::Probe { vip, port, udp, sources, first_port, count, workers, timeout_ms } => {
            probe(vip, port, udp, &sources, first_port, count, workers, Duration::from_millis(timeout_ms))
        }
        Cmd::Check { config, service, flows, alias } => check(&config, &service, &flows, &alias),
        Cmd::Compare { before, after, removed, added, transition } => {
            compare(&before, &after, removed.as_deref(), added.as_deref(), transition)
        }
        Cmd::Hold { vip, port, sources, connections, seconds, ready_file, allow_broken_on: _, udp: true, patience, keep_going: _, first_port: _ } => {
            hold_udp(vip, port, &sources, connections, Duration::from_secs_f64(seconds), ready_file, Duration::from_secs_f64(patience))
        }
        Cmd::Hold { vip, port, sources, connections, seconds, ready_file, allow_broken_on, udp: false, patience, keep_going, first_port } => {
            let patience = Duration::from_secs_f64(patience);
            let until = Until { seconds: Duration::from_secs_f64(seconds), keep_going, first_port };
            hold(vip, port, &sources, connections, until, ready_file, allow_broken_on.as_deref(), patience)
        }
        Cmd::XdpPass { iface } => xdp_pass(&iface),
        Cmd::XdpFloor { iface } => xdp_floor(&iface),
        Cmd::WorkServe { name, port, kilo_rounds } => {
            let listener = dual_stack_listener(port).with_context(|| format!("listening on {port}"))?;
            work::work_serve(listener, &name, kilo_rounds)
        }
        Cmd::Load { vip, port, source, rate, seconds, workers, timeout, out } => work::load(vip, port, source, rate, seconds, workers, Duration::from_secs_f64(timeout), &out),
        Cmd::Trafgen { iface, dst_mac, src, dst, dport, seconds, total, flows, new_every, warmup, pairs, udp, cpus, batch, stop_file } => {
            let gen = Gen { flows, new_every, warmup, pairs, udp, cpus, batch, stop_file };
            trafgen(&iface, &dst_mac, src, dst, dport, seconds, total, gen)
        }
    }
}

fn dual_stack_listener(port: u16) -> Result<TcpListener> {
    let sock = socket2_like_v6(nix::sys::socket::SockType::Stream)?;
    setsockopt(&sock, sockopt::ReuseAddr, &true)?;
    setsockopt(&sock, sockopt::Ipv6V6Only, &false)?;
    let addr = nix::sys::socket::SockaddrIn6::from(std::net::SocketAddrV6::new(std::net::Ipv6Addr::UNSPECIFIED, port, 0, 0));
    nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&sock), &addr)?;
    nix::sys::socket::listen(&sock, nix::sys::socket::Backlog::new(1024)?)?;
    Ok(TcpListener::from(sock))
}

fn socket2_like_v6(ty: nix::sys::socket::SockType) -> Result<std::os::fd::OwnedFd> {
    Ok(nix::sys::socket::socket(nix::sys::socket::AddressFamily::Inet6, ty, nix::sys::socket::SockFlag::SOCK_CLOEXEC, None)?)
}

fn serve(name: &str, tcp: &[u16], udp: &[u16], udp_addresses: &[IpAddr]) -> Result<bool> {
    let reply = format!("{name}\n");
    let mut threads = Vec::new();
    for &port in tcp {
        let listener = dual_stack_listener(port).with_context(|| format!("listening on tcp {port}"))?;
        let reply = reply.clone();
        threads.push(std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let reply = reply.clone();
                std::thread::spawn(move || {
                    let mut conn = conn;
                    if conn.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                    let Ok(reader) = conn.try_clone() else { return };
                    let mut lines = BufReader::new(reader);
                    let mut line = String::new();
                    while lines.read_line(&mut line).is_ok_and(|n| n > 0) {
                        if conn.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                        line.clear();
                    }
                });
            }
        }));
    }
    let mut udp_sockets = Vec::new();
    for &port in udp {
        if udp_addresses.is_empty() {
            let sock = socket2_like_v6(nix::sys::socket::SockType::Datagram)?;
            setsockopt(&sock, sockopt::Ipv6V6Only, &false)?;
            let addr = nix::sys::socket::SockaddrIn6::from(std::net::SocketAddrV6::new(std::net::Ipv6Addr::UNSPECIFIED, port, 0, 0));
            nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&sock), &addr).with_context(|| format!("binding udp {port}"))?;
            udp_sockets.push(UdpSocket::from(sock));
        }
        for &a in udp_addresses {
            udp_sockets.push(UdpSocket::bind((a, port)).with_context(|| format!("binding udp {a}:{port}"))?);
        }
    }
    for sock in udp_sockets {
        let reply = reply.clone();
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while let Ok((_, from)) = sock.recv_from(&mut buf) {
                let _ = sock.send_to(reply.as_bytes(), from);
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    Ok(true)
}

/// `GET N`: the name line, then N bytes. `PUT N`: reads N bytes, then answers `NAME N`.
fn bulk_serve(listener: TcpListener, name: String) {
    for conn in listener.incoming().map_while(Result::ok) {
        let name = name.clone();
        std::thread::spawn(move || -> Result<()> {
            let mut conn = conn;
            conn.set_read_timeout(Some(Duration::from_secs(30)))?;
            let mut reader = BufReader::new(conn.try_clone()?);
            let mut line = String::new();
            reader.read_line(&mut line)?;
            let mut words = line.split_whitespace();
            let (verb, n) = (words.next().unwrap_or(""), words.next().and_then(|w| w.parse::<usize>().ok()).unwrap_or(0));
            match verb {
                "GET" => {
                    conn.write_all(format!("{name}\n").as_bytes())?;
                    let chunk = vec![b'x'; 64 * 1024];
                    let mut left = n;
                    while left > 0 {
                        let k = left.min(chunk.len());
                        conn.write_all(&chunk[..k])?;
                        left -= k;
                    }
                }
                "PUT" => {
                    let mut got = 0usize;
                    let mut buf = vec![0u8; 64 * 1024];
                    while got < n {
                        let k = reader.read(&mut buf)?;
                        if k == 0 {
                            break;
                        }
                        got += k;
                    }
                    conn.write_all(format!("{name} {got}\n").as_bytes())?;
                }
                _ => {}
            }
            Ok(())
        });
    }
}

fn transfer(vip: IpAddr, port: u16, source: Option<IpAddr>, download: Option<usize>, upload: Option<usize>, timeout: Duration) -> Result<bool> {
    let started = Instant::now();
    let to = SocketAddr::new(vip, port);
    let mut conn = match source {
        Some(src) => connect_timeout(bound(src, 0, nix::sys::socket::SockType::Stream)?, to, timeout)?,
        None => TcpStream::connect_timeout(&to, timeout).context("connecting")?,
    };
    // Short socket timeouts, so that the overall deadline below is kept.
    conn.set_read_timeout(Some(Duration::from_millis(200).min(timeout)))?;
    conn.set_write_timeout(Some(Duration::from_millis(200).min(timeout)))?;
    let (name, bytes) = match (download, upload) {
        (Some(n), None) => {
            conn.write_all(format!("GET {n}\n").as_bytes())?;
            conn.set_read_timeout(Some(timeout))?;
            let name = read_name(&mut conn)?;
            conn.set_read_timeout(Some(Duration::from_millis(200).min(timeout)))?;
            let mut got = 0usize;
            let mut buf = vec![0u8; 64 * 1024];
            while got < n {
                if started.elapsed() > timeout {
                    bail!("download stalled at {got} of {n} bytes after {timeout:?}");
                }
                match conn.read(&mut buf) {
                    Ok(0) => bail!("closed at {got} of {n} bytes"),
                    Ok(k) => got += k,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(e) => bail!("download failed at {got} of {n} bytes: {e}"),
                }
            }
            (name, got)
        }
        (None, Some(n)) => {
            conn.write_all(format!("PUT {n}\n").as_bytes())?;
            let chunk = vec![b'y'; 64 * 1024];
            let mut left = n;
            while left > 0 {
                if started.elapsed() > timeout {
                    bail!("upload stalled with {left} of {n} bytes to send after {timeout:?}");
                }
                let k = left.min(chunk.len());
                match conn.write(&chunk[..k]) {
                    Ok(w) => left -= w,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(e) => bail!("upload failed with {left} of {n} bytes to send: {e}"),
                }
            }
            conn.set_read_timeout(Some(timeout.saturating_sub(started.elapsed()).max(Duration::from_millis(1))))?;
            let reply = read_name(&mut conn).context("waiting for the upload's receipt")?;
            let mut w = reply.split_whitespace();
            let name = w.next().unwrap_or("").to_string();
            let got: usize = w.next().and_then(|x| x.parse().ok()).unwrap_or(0);
            if got != n {
                bail!("{name} received {got} of {n} bytes");
            }
            (name, got)
        }
        _ => bail!("give --download BYTES or --upload BYTES"),
    };
    println!("{name} {bytes} {:.3}", started.elapsed().as_secs_f64());
    Ok(true)
}

/// Answers every GET with the status in `status_file`, and the backend's name as the body (what
/// `e2e load` reports); `flap` there alternates 200 and 503 from one request to the next.
fn http_status(listener: TcpListener, name: &str, status_file: Option<PathBuf>) {
    let mut answered = 0u64;
    for conn in listener.incoming().map_while(Result::ok) {
        answered += 1;
        let mut conn = conn;
        let mut buf = [0u8; 1024];
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = conn.read(&mut buf);
        let text = status_file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()).unwrap_or_default();
        let code: u16 = match text.trim() {
            "flap" => [200, 503][(answered % 2) as usize],
            t => t.parse().unwrap_or(200),
        };
        let _ = conn.write_all(format!("HTTP/1.0 {code} Status\r\nContent-Length: {}\r\n\r\n{name}\n", name.len() + 1).as_bytes());
    }
}

/// A socket bound to (src, sport), not yet connected.
fn bound(src: IpAddr, sport: u16, ty: nix::sys::socket::SockType) -> Result<std::os::fd::OwnedFd> {
    use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockaddrIn, SockaddrIn6};
    let family = if src.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let sock = socket(family, ty, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&sock, sockopt::ReuseAddr, &true)?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    match SocketAddr::new(src, sport) {
        SocketAddr::V4(a) => bind(fd, &SockaddrIn::from(a))?,
        SocketAddr::V6(a) => bind(fd, &SockaddrIn6::from(a))?,
    }
    Ok(sock)
}

/// Connects a bound socket with a timeout.
fn connect_timeout(sock: std::os::fd::OwnedFd, to: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    use nix::sys::socket::{connect, SockaddrIn, SockaddrIn6};
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let r = match to {
        SocketAddr::V4(a) => connect(fd, &SockaddrIn::from(a)),
        SocketAddr::V6(a) => connect(fd, &SockaddrIn6::from(a)),
    };
    match r {
        Ok(()) | Err(nix::errno::Errno::EINPROGRESS) => {}
        Err(e) => bail!("connect: {e}"),
    }
    let mut fds = [nix::poll::PollFd::new(std::os::fd::AsFd::as_fd(&sock), nix::poll::PollFlags::POLLOUT)];
    let n = nix::poll::poll(&mut fds, nix::poll::PollTimeout::try_from(timeout).unwrap_or(nix::poll::PollTimeout::MAX))?;
    if n == 0 {
        bail!("connect timed out");
    }
    let err = nix::sys::socket::getsockopt(&sock, sockopt::SocketError)?;
    if err != 0 {
        bail!("connect: {}", nix::errno::Errno::from_raw(err).desc());
    }
    fcntl(fd, FcntlArg::F_SETFL(OFlag::empty()))?;
    let stream = TcpStream::from(sock);
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(stream)
}

fn read_name(stream: &mut TcpStream) -> Result<String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while buf.len() < 64 {
        match stream.read(&mut byte)? {
            0 => bail!("closed before a reply"),
            _ if byte[0] == b'\n' => return Ok(String::from_utf8_lossy(&buf).into_owned()),
            _ => buf.push(byte[0]),
        }
    }
    bail!("no newline in reply")
}

fn one_flow(vip: IpAddr, port: u16, udp: bool, src: IpAddr, sport: u16, timeout: Duration) -> Result<String> {
    let to = SocketAddr::new(vip, port);
    if udp {
        let sock = UdpSocket::from(bound(src, sport, nix::sys::socket::SockType::Datagram)?);
        sock.set_read_timeout(Some(timeout))?;
        sock.send_to(b"who\n", to)?;
        let mut buf = [0u8; 128];
        let (n, from) = sock.recv_from(&mut buf)?;
        // Direct server return: the reply must come from the VIP itself.
        if from != to {
            bail!("reply from {from}, not the VIP");
        }
        return Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string());
    }
    let mut stream = connect_timeout(bound(src, sport, nix::sys::socket::SockType::Stream)?, to, timeout)?;
    // Closed with a reset whatever happens next, so that no TIME_WAIT or FIN_WAIT keeps this
    // 4-tuple from being used again (by the retry below, or a later round): set before the
    // reply is read, since a failed read drops the stream too.
    setsockopt(&stream, sockopt::Linger, &nix::libc::linger { l_onoff: 1, l_linger: 0 })?;
    // A TCP connection to the VIP only completes if the replies come from the VIP.
    let name = read_name(&mut stream)?;
    let _ = stream.shutdown(Shutdown::Both);
    Ok(name)
}

#[allow(clippy::too_many_arguments)]
fn probe(vip: IpAddr, port: u16, udp: bool, sources: &[IpAddr], first: u16, count: u16, workers: usize, timeout: Duration) -> Result<bool> {
    let flows: Vec<(IpAddr, u16)> = sources.iter().flat_map(|&s| (0..count).map(move |i| (s, first + i))).collect();
    let flows = Arc::new(flows);
    let next = Arc::new(AtomicUsize::new(0));
    let results = Arc::new(std::sync::Mutex::new(vec![String::new(); flows.len()]));
    let handles: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let (flows, next, results) = (flows.clone(), next.clone(), results.clone());
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(src, sport)) = flows.get(i) else { return };
                // One retry: a SYN can meet a backend whose neighbour entry is being refreshed.
                let r = one_flow(vip, port, udp, src, sport, timeout)
                    .or_else(|first| one_flow(vip, port, udp, src, sport, timeout).map_err(|again| anyhow::anyhow!("{first:#}; again: {again:#}")));
                let line = match r {
                    Ok(name) => format!("{src} {sport} {name}"),
                    Err(e) => format!("{src} {sport} FAIL {}", e.to_string().replace(' ', "_")),
                };
                if let Ok(mut r) = results.lock() {
                    r[i] = line;
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    let results = results.lock().map_err(|_| anyhow::anyhow!("a worker panicked"))?;
    let mut out = std::io::stdout().lock();
    let mut failed = 0;
    for line in results.iter() {
        writeln!(out, "{line}")?;
        failed += line.contains(" FAIL ") as usize;
    }
    eprintln!("probe: {} flows to {vip}:{port}/{}, {failed} failed", results.len(), if udp { "udp" } else { "tcp" });
    Ok(failed == 0)
}

type Flows = BTreeMap<(IpAddr, u16), String>;

fn read_flows(path: &Path) -> Result<Flows> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Flows::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut f = line.split_whitespace();
        let (Some(src), Some(sport), Some(backend)) = (f.next(), f.next(), f.next()) else { bail!("bad line {line:?}") };
        let backend = if backend == "FAIL" { format!("FAIL {}", f.next().unwrap_or("")) } else { backend.to_string() };
        out.insert((src.parse()?, sport.parse()?), backend);
    }
    Ok(out)
}

fn check(config: &Path, service: &str, flows: &Path, aliases: &[String]) -> Result<bool> {
    let alias: HashMap<&str, &str> = aliases.iter().filter_map(|a| a.split_once('=')).collect();
    let pool = lb::config::load(config)?;
    let s = pool.service(service).with_context(|| format!("no service {service}"))?;
    let t = lb::table::build_service(s);
    let shares = lb::table::shares(s, &t);
    let flows = read_flows(flows)?;
    let proto = if s.protocol == lb::config::Protocol::Tcp { 6 } else { 17 };
    let mut counts: HashMap<String, usize> = HashMap::new();
    let (mut wrong, mut failed) = (0, 0);
    for ((src, sport), got) in &flows {
        if got.starts_with("FAIL") {
            failed += 1;
            continue;
        }
        let got = &alias.get(got.as_str()).map_or(got.clone(), |s| s.to_string());
        let h = lb::flowhash::flow_hash(s.hash, *src, s.vip, *sport, s.port, proto);
        let want = t.owner((h % s.slots) as usize).map(|i| s.backends[i].identity()).unwrap_or_default();
        if *got != want {
            if wrong < 5 {
                println!("  flow {src}:{sport} reached {got}, the table says {want}");
            }
            wrong += 1;
        }
        *counts.entry(got.clone()).or_default() += 1;
    }
    let n = (flows.len() - failed) as f64;
    // Shares can only be compared over many independent hash inputs: under client-ip, one per
    // client address, however many connections each makes.
    let inputs = if s.hash == lb::config::HashMode::ClientIp {
        flows.keys().map(|k| k.0).collect::<std::collections::BTreeSet<_>>().len()
    } else {
        flows.len()
    };
    let compare_shares = inputs >= 200;
    let mut within = true;
    println!("  {:<12} {:>8} {:>10} {:>10}", "backend", "flows", "share", "table");
    for (b, sh) in s.backends.iter().zip(&shares) {
        let c = counts.get(&b.identity()).copied().unwrap_or(0);
        // Flows of one hash input move together: the spread is that of the inputs, scaled.
        let per_input = n / inputs.max(1) as f64;
        let sigma = ((inputs as f64 * sh.share * (1.0 - sh.share)).sqrt() * per_input).max(1.0);
        let ok = !compare_shares || (c as f64 - n * sh.share).abs() <= 5.0 * sigma;
        within &= ok;
        println!(
            "  {:<12} {:>8} {:>9.1}% {:>9.1}%{}",
            b.identity(),
            c,
            100.0 * c as f64 / n.max(1.0),
            100.0 * sh.share,
            if ok { "" } else { "  <- outside 5 standard deviations" }
        );
    }
    if !compare_shares {
        println!("  ({inputs} distinct hash inputs: too few to compare shares; every flow is checked against the table)");
    }
    println!(
        "  {} flows: {} on the backend the table predicts, {wrong} elsewhere, {failed} failed",
        flows.len(),
        flows.len() - wrong - failed
    );
    Ok(wrong == 0 && failed == 0 && within)
}

fn compare(before: &Path, after: &Path, removed: Option<&str>, added: Option<&str>, transition: bool) -> Result<bool> {
    let (a, b) = (read_flows(before)?, read_flows(after)?);
    let mut moved: BTreeMap<(String, String), usize> = BTreeMap::new();
    let (mut stayed, mut failed, mut wrong, mut caught) = (0, 0, 0, 0);
    for (flow, was) in &a {
        let Some(now) = b.get(flow) else { continue };
        let on_removed = Some(was.as_str()) == removed;
        if transition && on_removed {
            // Caught in the switch: old backend, new one, or one failed attempt are all fine.
            caught += 1;
            continue;
        }
        if was.starts_with("FAIL") || now.starts_with("FAIL") {
            failed += 1;
            continue;
        }
        if was == now {
            if Some(was.as_str()) == removed {
                wrong += 1; // still on the removed backend
            }
            stayed += 1;
            continue;
        }
        *moved.entry((was.clone(), now.clone())).or_default() += 1;
        let allowed = Some(was.as_str()) == removed || Some(now.as_str()) == added;
        if !allowed {
            wrong += 1;
        }
    }
    let total_moved: usize = moved.values().sum();
    println!("  {} flows compared: {stayed} kept their backend, {total_moved} moved, {failed} failed", a.len());
    if transition {
        println!("  {caught} flows of {} were in transition (any outcome allowed)", removed.unwrap_or("-"));
    }
    for ((from, to), n) in &moved {
        println!("    {from} -> {to}: {n}");
    }
    match (removed, added) {
        (Some(r), _) => println!("  flows that moved and were not on {r}: {wrong}"),
        (_, Some(ad)) => println!("  flows that moved somewhere other than {ad}: {wrong}"),
        _ => {}
    }
    Ok(wrong == 0 && failed == 0)
}

/// How long `hold` goes on: `seconds`, or until the first round with a break unless `keep_going`.
struct Until {
    seconds: Duration,
    keep_going: bool,
    first_port: u16,
}

#[allow(clippy::too_many_arguments)]
fn hold(
    vip: IpAddr,
    port: u16,
    sources: &[IpAddr],
    n: usize,
    until: Until,
    ready: Option<PathBuf>,
    allowed: Option<&str>,
    patience: Duration,
) -> Result<bool> {
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let src = sources[i % sources.len()];
        let sport = until.first_port + i as u16;
        let mut s = connect_timeout(bound(src, sport, nix::sys::socket::SockType::Stream)?, SocketAddr::new(vip, port), Duration::from_secs(3))
            .with_context(|| format!("opening connection {i} from {src}:{sport}"))?;
        let name = read_name(&mut s)?;
        s.set_read_timeout(Some(patience))?;
        s.set_write_timeout(Some(patience))?;
        conns.push((src, sport, s, name));
    }
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    for c in &conns {
        *per.entry(c.3.clone()).or_default() += 1;
    }
    eprintln!("hold: {n} connections open: {per:?}");
    if let Some(p) = ready {
        std::fs::write(p, "ready\n")?;
    }
    let end = Instant::now() + until.seconds;
    let (mut broken, mut broken_allowed) = (0, 0);
    let mut alive = vec![true; conns.len()];
    let mut rounds = 0;
    let mut longest = Duration::ZERO;
    while Instant::now() < end && (broken == 0 || until.keep_going) {
        rounds += 1;
        for (i, (src, sport, s, name)) in conns.iter_mut().enumerate() {
            if !alive[i] {
                continue;
            }
            let asked = Instant::now();
            let r = s.write_all(b"more\n").map_err(anyhow::Error::from).and_then(|_| read_name(s));
            longest = longest.max(asked.elapsed());
            let failure = match r {
                Ok(got) if got == *name => continue,
                Ok(got) => format!("now answered by {got}"),
                Err(e) => format!("broke: {e}"),
            };
            alive[i] = false;
            if Some(name.as_str()) == allowed {
                broken_allowed += 1;
            } else {
                eprintln!("hold: {src}:{sport} (on {name}) {failure}");
                broken += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let on = allowed.map_or(String::new(), |a| format!(", and {broken_allowed} on {a}, which was removed"));
    eprintln!("hold: {rounds} rounds over {n} connections, {broken} broken{on}; the longest answer took {:.2} s", longest.as_secs_f64());
    Ok(broken == 0)
}

/// Long-lived UDP flows: `n` sockets, each bound to its own source port, send a datagram to the
/// VIP every 100 ms for `seconds`. A flow is "on" the backend that answered its first datagram
/// and breaks when another backend answers it (its tracked entry was lost and the table sent it
/// elsewhere), or when it is not answered at all for longer than `patience`. An unanswered round
/// is counted apart, not as a break: UDP has no retransmission, and the test's own switch may
/// drop a datagram under a flood without lb being at fault.
fn hold_udp(vip: IpAddr, port: u16, sources: &[IpAddr], n: usize, seconds: Duration, ready: Option<PathBuf>, patience: Duration) -> Result<bool> {
    let to = SocketAddr::new(vip, port);
    // Reads every answer waiting on `s` without blocking: the backends' names, or an error for
    // an answer that did not come from the VIP.
    let answers = |s: &UdpSocket| -> Result<Vec<String>> {
        let mut out = Vec::new();
        let mut buf = [0u8; 128];
        loop {
            match s.recv_from(&mut buf) {
                Ok((k, from)) if from == to => out.push(String::from_utf8_lossy(&buf[..k]).trim().to_string()),
                Ok((_, from)) => bail!("an answer from {from}, not the VIP"),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(out),
                Err(e) => bail!("receiving: {e}"),
            }
        }
    };
    let mut flows = Vec::with_capacity(n);
    for i in 0..n {
        let src = sources[i % sources.len()];
        let sport = 41000 + i as u16;
        let s = UdpSocket::from(bound(src, sport, nix::sys::socket::SockType::Datagram)?);
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        // Five tries: the first datagram of a flow can meet a backend's neighbour entry being
        // made, and the first flows a backend's UDP server still starting (on a busy machine).
        let mut name = None;
        for _ in 0..5 {
            s.send_to(b"who\n", to)?;
            let mut buf = [0u8; 128];
            if let Ok((k, from)) = s.recv_from(&mut buf) {
                anyhow::ensure!(from == to, "flow {i} from {src}:{sport}: an answer from {from}, not the VIP");
                name = Some(String::from_utf8_lossy(&buf[..k]).trim().to_string());
                break;
            }
        }
        let name = name.with_context(|| format!("opening UDP flow {i} from {src}:{sport}: no answer"))?;
        s.set_nonblocking(true)?;
        flows.push((src, sport, s, name));
    }
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    for f in &flows {
        *per.entry(f.3.clone()).or_default() += 1;
    }
    eprintln!("hold: {n} UDP flows answered: {per:?}");
    if let Some(p) = ready {
        std::fs::write(p, "ready\n")?;
    }
    let end = Instant::now() + seconds;
    // Per flow: when it was last answered, and whether it broke.
    let mut last = vec![Instant::now(); n];
    let mut broken = vec![false; n];
    let (mut rounds, mut sent, mut answered, mut unanswered_rounds) = (0u64, 0u64, 0u64, 0u64);
    while Instant::now() < end && !broken.contains(&true) {
        rounds += 1;
        for (_, _, s, _) in &flows {
            // A full socket buffer (the switch is slow) is a lost datagram, not an error.
            sent += s.send_to(b"who\n", to).is_ok() as u64;
        }
        std::thread::sleep(Duration::from_millis(100));
        for (i, (src, sport, s, name)) in flows.iter().enumerate() {
            let got = answers(s).with_context(|| format!("flow {src}:{sport}"))?;
            answered += got.len() as u64;
            if let Some(other) = got.iter().find(|g| *g != name) {
                eprintln!("hold: {src}:{sport} (on {name}) now answered by {other}");
                broken[i] = true;
            } else if !got.is_empty() {
                last[i] = Instant::now();
            } else {
                unanswered_rounds += 1;
                if last[i].elapsed() > patience {
                    eprintln!("hold: {src}:{sport} (on {name}) not answered for {:?}", last[i].elapsed());
                    broken[i] = true;
                }
            }
        }
    }
    let broken = broken.iter().filter(|&&b| b).count();
    eprintln!(
        "hold: {rounds} rounds over {n} UDP flows, {broken} broken ({sent} datagrams sent, {answered} answered, {unanswered_rounds} flow-rounds unanswered)"
    );
    Ok(broken == 0)
}

/// Loads `r0 = action; exit` as an XDP program; returns its descriptor.
fn return_program(action: i32) -> Result<i32> {
    use libbpf_rs::libbpf_sys;
    let insns = [
        libbpf_sys::bpf_insn { code: 0xb7, _bitfield_align_1: [], _bitfield_1: libbpf_sys::bpf_insn::new_bitfield_1(0, 0), off: 0, imm: action },
        libbpf_sys::bpf_insn { code: 0x95, _bitfield_align_1: [], _bitfield_1: libbpf_sys::bpf_insn::new_bitfield_1(0, 0), off: 0, imm: 0 },
    ];
    let name = std::ffi::CString::new("xdp_pass")?;
    let license = std::ffi::CString::new("GPL")?;
    // SAFETY: the instruction array and the strings outlive the call; a null options pointer
    // asks for defaults.
    let fd = unsafe {
        libbpf_sys::bpf_prog_load(libbpf_sys::BPF_PROG_TYPE_XDP, name.as_ptr(), license.as_ptr(), insns.as_ptr(), insns.len() as _, std::ptr::null_mut())
    };
    if fd < 0 {
        bail!("loading an XDP program: {}", std::io::Error::from_raw_os_error(-fd));
    }
    Ok(fd)
}

fn attach_driver_mode(iface: &str, fd: i32) -> Result<bool> {
    use libbpf_rs::libbpf_sys;
    let ifindex = nix::net::if_::if_nametoindex(iface).with_context(|| format!("no interface {iface}"))?;
    // SAFETY: a plain descriptor and flags; the attachment outlives this process by design.
    let rc = unsafe { libbpf_sys::bpf_xdp_attach(ifindex as i32, fd, libbpf_sys::XDP_FLAGS_DRV_MODE, std::ptr::null()) };
    if rc < 0 {
        bail!("attaching an XDP program to {iface}: {}", std::io::Error::from_raw_os_error(-rc));
    }
    Ok(true)
}

fn xdp_pass(iface: &str) -> Result<bool> {
    attach_driver_mode(iface, return_program(2)?)
}

fn xdp_floor(iface: &str) -> Result<bool> {
    use libbpf_rs::skel::{OpenSkel, SkelBuilder};
    let mut object = std::mem::MaybeUninit::uninit();
    let skel = floor::FloorSkelBuilder::default().open(&mut object)?.load()?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(&skel.progs.floor_xdp));
    attach_driver_mode(iface, fd)
}

/// The many-flow settings of `trafgen`.
struct Gen {
    flows: u32,
    new_every: u32,
    warmup: bool,
    pairs: bool,
    udp: bool,
    cpus: Vec<usize>,
    batch: u32,
    stop_file: Option<PathBuf>,
}

#[allow(clippy::too_many_arguments)]
fn trafgen(iface: &str, dst_mac: &str, src: std::net::Ipv4Addr, dst: std::net::Ipv4Addr, dport: u16, seconds: f64, total: bool, gen: Gen) -> Result<bool> {
    use libbpf_rs::libbpf_sys;
    let ifindex = nix::net::if_::if_nametoindex(iface).with_context(|| format!("no interface {iface}"))?;
    let mac: Vec<u8> = dst_mac.split(':').map(|h| u8::from_str_radix(h, 16)).collect::<Result<_, _>>()?;
    anyhow::ensure!(mac.len() == 6, "bad MAC {dst_mac}");
    anyhow::ensure!(!gen.pairs || (gen.new_every == 1 && gen.flows == 0), "--pairs needs --new-every 1 and no --flows");
    anyhow::ensure!(!gen.udp || (gen.new_every != 0 && gen.flows == 0), "--udp needs --new-every and no --flows");
    let tcp = (gen.flows != 0 || gen.new_every != 0) && !gen.udp;
    // Ethernet + IPv4 + UDP + 18 bytes (or TCP + 6): a 64-byte frame on the wire (without FCS: 60).
    let mut f = mac.clone();
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x77, 0x08, 0x00]);
    let mut ip = vec![0x45, 0, 0, 46, 0, 1, 0x40, 0, 64, if tcp { 6 } else { 17 }, 0, 0];
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let mut sum: u32 = ip.chunks(2).map(|c| u16::from_be_bytes([c[0], c[1]]) as u32).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&4242u16.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    if tcp {
        // Sequence and acknowledgement numbers, data offset 5, flags (set per packet), window.
        f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
        f.extend_from_slice(&[0x42; 6]);
    } else {
        f.extend_from_slice(&26u16.to_be_bytes());
        // No checksum (0) for identical frames; a wrong one for a flood of many sources.
        f.extend_from_slice(if gen.udp { &[0x42, 0x42] } else { &[0, 0] });
        f.extend_from_slice(&[0x42; 18]);
    }
    // In live-frame mode the program runs on frames built from this one and XDP_TX sends
    // each out of the interface named in the context; the program writes the frame afresh
    // each time (crates/dataplane/src/bpf/trafgen.bpf.c says why).
    use libbpf_rs::skel::{OpenSkel, SkelBuilder};
    let mut object = std::mem::MaybeUninit::uninit();
    let mut open = trafgen_skel::TrafgenSkelBuilder::default().open(&mut object)?;
    anyhow::ensure!(f.len() == 60, "the generator's frame is {} bytes, not 60", f.len());
    let ro = open.maps.rodata_data.as_deref_mut().context("trafgen .rodata")?;
    for (w, c) in ro.frame.iter_mut().zip(f.chunks(4)) {
        *w = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
    }
    ro.flows = gen.flows;
    ro.new_every = gen.new_every;
    ro.warmup = gen.warmup as u32;
    ro.pairs = gen.pairs as u32;
    let skel = open.load()?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(&skel.progs.trafgen_xdp));
    let ctx = libbpf_sys::xdp_md { data: 0, data_end: f.len() as u32, data_meta: 0, ingress_ifindex: ifindex, rx_queue_index: 0, egress_ifindex: 0 };
    let run = |repeat: i32| -> Result<()> {
        let mut opts = libbpf_sys::bpf_test_run_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_test_run_opts>() as _,
            data_in: f.as_ptr() as *const _,
            data_size_in: f.len() as u32,
            ctx_in: &ctx as *const _ as *const _,
            ctx_size_in: std::mem::size_of::<libbpf_sys::xdp_md>() as u32,
            repeat,
            flags: libbpf_sys::BPF_F_TEST_XDP_LIVE_FRAMES,
            ..Default::default()
        };
        // SAFETY: data_in and ctx_in point to live buffers of the sizes given, which outlive
        // the call; nothing is written back in live-frame mode.
        let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(fd, &mut opts) };
        if rc != 0 {
            bail!("BPF_PROG_TEST_RUN live frames: {}", std::io::Error::last_os_error());
        }
        Ok(())
    };
    let start = Instant::now();
    let cpus: Vec<Option<usize>> = if gen.cpus.is_empty() {
        vec![None]
    } else {
        gen.cpus.iter().map(|&c| Some(c)).collect()
    };
    let stop_file = gen.stop_file.as_deref();
    let sent: Vec<u64> = std::thread::scope(|s| -> Result<Vec<u64>> {
        let threads: Vec<_> = cpus
            .iter()
            .map(|&cpu| {
                let run = &run;
                s.spawn(move || -> Result<u64> {
                    if let Some(c) = cpu {
                        let mut set = nix::sched::CpuSet::new();
                        set.set(c)?;
                        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
                            .with_context(|| format!("pinning to CPU {c}"))?;
                    }
                    if gen.warmup {
                        // One call: each BPF_PROG_TEST_RUN in live-frame mode costs about 30 ms
                        // of setup and teardown, and the receiving veth keeps up with a batch
                        // (lb's counters see every handshake).
                        let n = 2 * gen.flows as u64;
                        run(i32::try_from(n).context("too many flows")?)?;
                        return Ok(n);
                    }
                    let batch = i32::try_from(gen.batch).context("--batch is too large")?;
                    let mut sent = 0;
                    let stopped = || stop_file.is_some_and(|f| f.exists());
                    while start.elapsed().as_secs_f64() < seconds && !stopped() {
                        run(batch)?;
                        sent += batch as u64;
                    }
                    Ok(sent)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| anyhow::anyhow!("a generator thread panicked"))?
            })
            .collect()
    })?;
    let sent: u64 = sent.iter().sum();
    let secs = start.elapsed().as_secs_f64();
    if total {
        println!("{:.0} {sent}", sent as f64 / secs);
    } else {
        println!("{:.0}", sent as f64 / secs);
    }
    Ok(true)
}
