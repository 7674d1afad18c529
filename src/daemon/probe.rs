//! Probes for `lb attach`: a few worker threads run blocking probes (health checks here: a TCP
//! connect, or an HTTP/1.0 GET; agents' load reports in agents.rs) with a timeout each, so the
//! serve loop never waits on a backend. Results come back on a channel, and a byte on a pipe
//! wakes the loop's poll.
//!
//! A failed step says why twice over ([`Failure`]): as an [`Outcome`] class for the metrics,
//! and in words for the log. The class comes from the error itself (its `io::ErrorKind`, or the
//! step that failed), never from reading the words back.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::fcntl::{fcntl, FcntlArg, OFlag};

use lb::config::{CheckKind, HealthCheck};
use lb::health::Outcome;

/// (service name, backend identity)
pub(super) type Key = (String, String);

/// One probe to run: the backend it is for, and the work.
type Job<T> = (Key, Box<dyn FnOnce() -> T + Send>);

/// Runs probes whose results are `T` (a health check's is `Result<(), Failure>`, an agent's its
/// line or why there is none).
pub(super) struct Prober<T> {
    jobs: Sender<Job<T>>,
    results: Receiver<(Key, T, Duration)>,
    wake_read: OwnedFd,
    in_flight: HashSet<Key>,
}

impl<T> AsFd for Prober<T> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.wake_read.as_fd()
    }
}

impl<T: Send + 'static> Prober<T> {
    /// At most `workers` probes run at once.
    pub(super) fn new(workers: usize) -> Result<Prober<T>> {
        let (jobs, job_rx) = channel::<Job<T>>();
        let (result_tx, results) = channel();
        let (wake_read, wake_write) = nix::unistd::pipe().context("creating the probes' wake-up pipe")?;
        fcntl(std::os::fd::AsRawFd::as_raw_fd(&wake_read), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
        let job_rx = Arc::new(Mutex::new(job_rx));
        let wake_write = Arc::new(wake_write);
        for _ in 0..workers.max(1) {
            let (job_rx, result_tx, wake_write) = (job_rx.clone(), result_tx.clone(), wake_write.clone());
            std::thread::spawn(move || loop {
                let (key, work) = match job_rx.lock() {
                    Ok(rx) => match rx.recv() {
                        Ok(j) => j,
                        Err(_) => return, // the prober is gone
                    },
                    Err(_) => return,
                };
                let started = Instant::now();
                let r = work();
                if result_tx.send((key, r, started.elapsed())).is_err() {
                    return;
                }
                let _ = nix::unistd::write(&*wake_write, &[1]);
            });
        }
        Ok(Prober { jobs, results, wake_read, in_flight: HashSet::new() })
    }

    /// Queues a probe unless one for the same backend is still running; says whether it did.
    pub(super) fn submit(&mut self, key: Key, work: impl FnOnce() -> T + Send + 'static) -> bool {
        if !self.in_flight.insert(key.clone()) {
            return false;
        }
        let _ = self.jobs.send((key, Box::new(work)));
        true
    }

    /// Every result that arrived, with how long its probe took.
    pub(super) fn drain(&mut self) -> Vec<(Key, T, Duration)> {
        let mut buf = [0u8; 256];
        while matches!(nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&self.wake_read), &mut buf), Ok(n) if n > 0) {}
        let out: Vec<_> = self.results.try_iter().collect();
        for (k, _, _) in &out {
            self.in_flight.remove(k);
        }
        out
    }
}

/// Why a probe failed: its class, for the metrics, and what happened in words, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failure {
    pub(super) outcome: Outcome,
    pub(super) reason: String,
    /// The host's own error before anything was sent (a socket option refused, no route, no
    /// such address): it says nothing of the backend.
    pub(super) local: bool,
}

impl Failure {
    pub(super) fn new(outcome: Outcome, reason: impl Into<String>) -> Failure {
        Failure { outcome, reason: reason.into(), local: false }
    }
}

/// Where only the words matter (an agent's answer has outcomes of its own).
impl From<Failure> for String {
    fn from(f: Failure) -> String {
        f.reason
    }
}

/// An I/O error as a probe's result says it: `connection refused`, `timeout`, ...
fn describe(e: std::io::Error) -> Failure {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => Failure::new(Outcome::Refused, "connection refused"),
        // A socket timeout shows as WouldBlock on Linux.
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => Failure::new(Outcome::Timeout, "timeout"),
        _ => Failure::new(Outcome::Error, e.to_string().split(" (os error").next().unwrap_or_default().to_lowercase()),
    }
}

/// A connection to `addr` within `timeout`, and a deadline for everything after.
pub(super) fn connect(addr: SocketAddr, timeout: Duration) -> Result<(TcpStream, Instant), Failure> {
    let deadline = Instant::now() + timeout;
    Ok((TcpStream::connect_timeout(&addr, timeout).map_err(describe)?, deadline))
}

/// Where a health probe connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// The backend's own address and the check's port.
    Backend(SocketAddr),
    /// The service's VIP and port, from a socket bound to the attached interface `ifname` and
    /// marked for backend `mark` (lb_dataplane::probe_path): the data plane sends it to that
    /// backend the way the service forwards.
    Vip { addr: SocketAddr, source: IpAddr, mark: u32, ifname: String },
}

impl Target {
    fn addr(&self) -> SocketAddr {
        match self {
            Target::Backend(a) | Target::Vip { addr: a, .. } => *a,
        }
    }
}

/// [`connect`], from a socket marked `mark` and bound to `ifname` and its address `source`.
fn connect_marked(addr: SocketAddr, source: IpAddr, mark: u32, ifname: &str, timeout: Duration) -> Result<(TcpStream, Instant), Failure> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage};
    let deadline = Instant::now() + timeout;
    // Anything that fails before the SYN leaves is the host's own doing.
    let os = |e: nix::errno::Errno| Failure { local: true, ..describe(std::io::Error::from(e)) };
    let family = if addr.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let fd = socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None).map_err(os)?;
    socket::setsockopt(&fd, sockopt::Mark, &mark).map_err(os)?;
    socket::setsockopt(&fd, sockopt::BindToDevice, &std::ffi::OsString::from(ifname)).map_err(os)?;
    socket::bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(SocketAddr::new(source, 0))).map_err(os)?;
    match socket::connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrStorage::from(addr)) {
        Ok(()) | Err(nix::errno::Errno::EINPROGRESS) => {}
        Err(e) => return Err(os(e)),
    }
    loop {
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
        match poll(&mut fds, PollTimeout::try_from(left(deadline)).unwrap_or(PollTimeout::MAX)) {
            Ok(0) => return Err(Failure::new(Outcome::Timeout, "timeout")),
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(os(e)),
        }
    }
    match socket::getsockopt(&fd, sockopt::SocketError).map_err(os)? {
        0 => {}
        code => return Err(describe(std::io::Error::from_raw_os_error(code))),
    }
    let stream = TcpStream::from(fd);
    stream.set_nonblocking(false).map_err(describe)?;
    Ok((stream, deadline))
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

/// Sends an HTTP/1.0 GET of `path` as `agent` (the User-Agent).
pub(super) fn send_get(stream: &mut TcpStream, addr: SocketAddr, path: &str, agent: &str, deadline: Instant) -> Result<(), Failure> {
    stream.set_write_timeout(Some(left(deadline))).map_err(describe)?;
    let host = match addr {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => format!("[{}]", a.ip()),
    };
    let request = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: {agent}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(describe)
}

/// Reads until `enough` says the bytes suffice, the peer closes, or `limit` bytes; a peer that
/// trickles bytes past the deadline times out all the same.
pub(super) fn read_until(stream: &mut TcpStream, deadline: Instant, limit: usize, enough: impl Fn(&[u8]) -> bool) -> Result<Vec<u8>, Failure> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 512];
    while !enough(&got) && got.len() < limit {
        if Instant::now() >= deadline {
            return Err(Failure::new(Outcome::Timeout, "timeout"));
        }
        stream.set_read_timeout(Some(left(deadline))).map_err(describe)?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(describe(e)),
        }
    }
    Ok(got)
}

/// The status code of an HTTP answer's status line.
pub(super) fn status_code(head: &[u8]) -> Result<u16, Failure> {
    let line = String::from_utf8_lossy(head);
    line.split_whitespace()
        .nth(1)
        .filter(|_| line.starts_with("HTTP/"))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| Failure::new(Outcome::Error, "no HTTP status line in the answer"))
}

/// One probe, bounded by the check's timeout in all; one through the VIP says so in its
/// failure's words.
pub(super) fn probe(target: &Target, check: &HealthCheck) -> Result<(), Failure> {
    let r = probe_once(target, check);
    match (target, r) {
        (Target::Vip { .. }, Err(f)) => Err(Failure { reason: format!("through the VIP: {}", f.reason), ..f }),
        (_, r) => r,
    }
}

fn probe_once(target: &Target, check: &HealthCheck) -> Result<(), Failure> {
    let addr = target.addr();
    let (mut stream, deadline) = match target {
        Target::Backend(a) => connect(*a, check.timeout)?,
        Target::Vip { addr, source, mark, ifname } => connect_marked(*addr, *source, *mark, ifname, check.timeout)?,
    };
    if check.kind == CheckKind::Tcp {
        return Ok(());
    }
    send_get(&mut stream, addr, &check.path, "lb-health", deadline)?;
    // The status line is all that is needed.
    let head = read_until(&mut stream, deadline, 4096, |b| b.contains(&b'\n'))?;
    let code = status_code(&head)?;
    if (check.expect.0..=check.expect.1).contains(&code) {
        Ok(())
    } else {
        Err(Failure::new(Outcome::BadStatus, format!("HTTP {code}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn check(kind: CheckKind, expect: (u16, u16)) -> HealthCheck {
        HealthCheck {
            kind,
            port: 0,
            path: "/healthz".into(),
            expect,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(300),
            rise: 2,
            fall: 3,
            via: lb::config::ProbeVia::Backend,
            signals: false,
        }
    }

    /// A one-shot HTTP server on loopback answering `status`; returns its address and the
    /// request it saw.
    fn http_once(status: &'static str) -> (SocketAddr, std::thread::JoinHandle<String>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap_or(0);
            let _ = s.write_all(format!("HTTP/1.0 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes());
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (addr, h)
    }

    fn failed(outcome: Outcome, reason: &str) -> Result<(), Failure> {
        Err(Failure::new(outcome, reason))
    }

    /// A one-shot server on loopback that accepts and hands the connection to `then`.
    fn serve_once(then: impl FnOnce(TcpStream) + Send + 'static) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            if let Ok((s, _)) = l.accept() {
                then(s);
            }
        });
        addr
    }

    #[test]
    fn tcp_probes_tell_open_from_refused() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let open = l.local_addr().expect("addr");
        assert_eq!(probe(&Target::Backend(open), &check(CheckKind::Tcp, (200, 399))), Ok(()));
        drop(l);
        let refused = probe(&Target::Backend(open), &check(CheckKind::Tcp, (200, 399)));
        assert_eq!(refused, failed(Outcome::Refused, "connection refused"));
        assert_eq!(refused.map_err(String::from), Err("connection refused".to_string()), "the log's words are the same as before");
        assert_eq!(probe(&Target::Backend(open), &check(CheckKind::Http, (200, 399))), failed(Outcome::Refused, "connection refused"));
    }

    #[test]
    fn http_probes_honour_the_status_range() {
        let (addr, h) = http_once("204 No Content");
        assert_eq!(probe(&Target::Backend(addr), &check(CheckKind::Http, (200, 399))), Ok(()));
        let request = h.join().expect("server");
        assert!(request.starts_with("GET /healthz HTTP/1.0\r\n"), "{request}");
        let (addr, _) = http_once("503 Service Unavailable");
        assert_eq!(probe(&Target::Backend(addr), &check(CheckKind::Http, (200, 399))), failed(Outcome::BadStatus, "HTTP 503"));
        let (addr, _) = http_once("500 Internal Server Error");
        assert_eq!(probe(&Target::Backend(addr), &check(CheckKind::Http, (200, 399))), failed(Outcome::BadStatus, "HTTP 500"));
        let (addr, _) = http_once("302 Found");
        assert_eq!(probe(&Target::Backend(addr), &check(CheckKind::Http, (200, 299))), failed(Outcome::BadStatus, "HTTP 302"));
        let (addr, _) = http_once("503 Service Unavailable");
        assert_eq!(probe(&Target::Backend(addr), &check(CheckKind::Http, (500, 503))), Ok(()), "the range is the operator's");
    }

    #[test]
    fn a_silent_server_times_out_within_the_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        // Accepts (the kernel does, from the backlog) but never answers.
        let started = Instant::now();
        assert_eq!(probe(&Target::Backend(addr), &check(CheckKind::Http, (200, 399))), failed(Outcome::Timeout, "timeout"));
        assert!(started.elapsed() < Duration::from_millis(900), "{:?}", started.elapsed());
        drop(l);
    }

    #[test]
    fn a_server_that_trickles_times_out_at_the_deadline() {
        // A byte every 100 ms, never a line: each read succeeds, the deadline ends it.
        let addr = serve_once(|mut s| {
            for _ in 0..20 {
                if s.write_all(b"H").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let started = Instant::now();
        assert_eq!(probe(&Target::Backend(addr), &check(CheckKind::Http, (200, 399))), failed(Outcome::Timeout, "timeout"));
        assert!(started.elapsed() < Duration::from_millis(900), "{:?}", started.elapsed());
    }

    #[test]
    fn anything_else_is_an_error() {
        // An answer that is not HTTP.
        let addr = serve_once(|mut s| {
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2\r\n");
            std::thread::sleep(Duration::from_millis(200));
        });
        assert_eq!(probe(&Target::Backend(addr), &check(CheckKind::Http, (200, 399))), failed(Outcome::Error, "no HTTP status line in the answer"));
        // Closed before a word (after reading the request: unread bytes would make it a reset).
        let addr = serve_once(|mut s| {
            let _ = s.read(&mut [0u8; 1024]);
        });
        assert_eq!(probe(&Target::Backend(addr), &check(CheckKind::Http, (200, 399))), failed(Outcome::Error, "no HTTP status line in the answer"));
        // Reset after the connection was made: a close with a zero linger sends RST.
        let addr = serve_once(|s| {
            let off = libc::linger { l_onoff: 1, l_linger: 0 };
            nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::Linger, &off).expect("SO_LINGER");
            // Once the request is in, so that the reset answers the read, not the write.
            std::thread::sleep(Duration::from_millis(50));
        });
        let r = probe(&Target::Backend(addr), &check(CheckKind::Http, (200, 399)));
        assert_eq!(r.as_ref().map_err(|f| f.outcome), Err(Outcome::Error), "{r:?}");
        // "connection reset by peer", or "broken pipe" on a machine slow enough to send late.
        assert!(r.as_ref().is_err_and(|f| f.reason.contains("reset") || f.reason.contains("broken pipe")), "{r:?}");
    }

    #[test]
    fn the_prober_runs_jobs_on_workers_and_wakes_the_loop() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let mut p = Prober::new(2).expect("prober");
        for i in 0..3 {
            let c = check(CheckKind::Tcp, (200, 399));
            assert!(p.submit(("web".into(), format!("b{i}")), move || probe(&Target::Backend(addr), &c)));
        }
        // A second job for a backend still in flight is not queued.
        let c = check(CheckKind::Tcp, (200, 399));
        assert!(!p.submit(("web".into(), "b0".into()), move || probe(&Target::Backend(addr), &c)));
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(5);
        while got.len() < 3 && Instant::now() < end {
            let mut fds = [nix::poll::PollFd::new(p.as_fd(), nix::poll::PollFlags::POLLIN)];
            let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16));
            got.extend(p.drain());
        }
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|(_, r, _)| r.is_ok()));
        std::thread::sleep(Duration::from_millis(100));
        assert!(p.drain().is_empty(), "the duplicate was not run");
    }
}
