//! A small HTTP/1 server that no client address can wedge, for `--metrics`: one request per
//! connection, a deadline to send the request and one to take the answer (which the client must
//! also keep taking: [`PROGRESS`]), a bound on the connections served at once, which is a bound on
//! threads (one each), and a smaller bound per client address ([`MAX_PER_PEER`]), so that one
//! address holds at most a quarter of the threads. When every thread is busy, the oldest
//! connection still sending its request is closed for the new one, once it has had a short
//! grace; a connection being answered is never closed from outside (its deadlines end it).
//!
//! Why not a server crate: the synchronous one lb used (tiny_http 0.12) accepts on a thread of its
//! own with a thread per connection and no limit, sets no socket timeouts and offers no way to,
//! and leaves writing the answer to the caller, so one client that never read a large /metrics
//! stopped every other answer; the others are asynchronous, and lb has no async runtime. Parsing
//! the request head is a solved problem, left to `httparse`; what is here is the part that must
//! be lb's own: deadlines, the bound, closing.

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Connections served at once. Each has a thread, so this is the bound on threads too (plus the
/// one that accepts); a connection past it waits in the listen queue for a thread to be free.
pub(super) const MAX_CONNECTIONS: usize = 16;
/// The whole request head must arrive within this after the connection is accepted.
const READ_DEADLINE: Duration = Duration::from_secs(5);
/// The whole answer must be taken by the client within this.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// A client that takes less than [`MIN_PROGRESS`] of its answer in this long is closed: a client
/// that asks and never reads holds its thread about twice this long (what the socket buffers take
/// counts in the first window), not the whole [`WRITE_DEADLINE`].
const PROGRESS: Duration = Duration::from_millis(1500);
/// Bytes a client must take per [`PROGRESS`] window: about 170 kbit/s, far below any scraper.
const MIN_PROGRESS: usize = 32 * 1024;
/// Connections of one client address served at once (IPv6: one /64). Below [`MAX_CONNECTIONS`]
/// so that one address, however many connections it opens, leaves threads for the others.
pub(super) const MAX_PER_PEER: usize = 4;
/// After the answer, how long lb reads what the client still sends (a pipelined request) before
/// closing: closing with unread bytes makes the kernel reset the connection, which can cut the
/// tail of the answer before the client has read it.
const LINGER: Duration = Duration::from_millis(500);
/// While every thread is busy, a connection still sending its request after this long is closed
/// for a newer one. A scraper sends its request as it connects, so it is read long before this;
/// a shorter grace would let a flood of connections close scrapers' before their request is read.
const GRACE: Duration = Duration::from_millis(250);
/// A longer request head is refused (a GET needs a few hundred bytes).
const MAX_HEAD: usize = 16 * 1024;
/// Headers read, at most; a request with more is refused as too large.
const MAX_HEADERS: usize = 64;

/// What lb reads of a request: its method, path (without the query) and Accept headers.
#[derive(Debug, PartialEq)]
pub(super) struct Request {
    pub(super) method: String,
    pub(super) path: String,
    /// Every Accept header's value, joined by commas.
    pub(super) accept: String,
}

/// An answer: status, content type, body.
pub(super) type Answer = (u16, &'static str, String);

/// What answers requests; called on the connection's thread.
pub(super) type Handler = Arc<dyn Fn(&Request) -> Answer + Send + Sync>;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Phase {
    /// Waiting for the request: may be closed for a newer connection after [`GRACE`].
    Reading,
    /// Being answered: never closed from here (its write deadline ends it).
    Answering,
    /// Closed for a newer connection; its thread is on its way out.
    Closing,
}

struct Conn {
    id: u64,
    /// The client's address, as [`peer_key`] groups it.
    peer: IpAddr,
    accepted: Instant,
    phase: Phase,
    /// A second handle on the socket, to close it from the accepting thread.
    handle: TcpStream,
}

/// The connections that have a thread, and a signal for when one leaves.
#[derive(Default)]
struct Threads {
    open: Mutex<(u64, Vec<Conn>)>,
    left: Condvar,
}

impl Threads {
    /// Waits until `handle`'s connection may have a thread, closing the oldest connection still
    /// sending its request once it has had its grace. Err(true) if its address has
    /// [`MAX_PER_PEER`] connections already, none of them an idle one past its grace (the caller
    /// closes it); Err(false) if the lock is poisoned.
    fn admit(&self, handle: TcpStream, peer: IpAddr) -> Result<u64, bool> {
        let peer = peer_key(peer);
        let mut open = self.open.lock().map_err(|_| false)?;
        // The address's own bound first, and never waited for: the accepting thread must not
        // stall on one address while the others' connections queue behind it.
        let now = Instant::now();
        let mine = open.1.iter().filter(|c| c.peer == peer && c.phase != Phase::Closing).count();
        if mine >= MAX_PER_PEER {
            let idle = open.1.iter_mut().filter(|c| c.peer == peer && c.phase == Phase::Reading).min_by_key(|c| c.accepted);
            match idle {
                Some(c) if now.duration_since(c.accepted) >= GRACE => {
                    let _ = c.handle.shutdown(Shutdown::Both);
                    c.phase = Phase::Closing;
                }
                _ => return Err(true),
            }
        }
        loop {
            if open.1.len() < MAX_CONNECTIONS {
                open.0 += 1;
                let id = open.0;
                open.1.push(Conn { id, peer, accepted: Instant::now(), phase: Phase::Reading, handle });
                return Ok(id);
            }
            let now = Instant::now();
            let oldest = open.1.iter_mut().filter(|c| c.phase == Phase::Reading).min_by_key(|c| c.accepted);
            let wait = match oldest {
                Some(c) if now.duration_since(c.accepted) >= GRACE => {
                    // Its thread's blocked read returns at once, and the thread leaves.
                    let _ = c.handle.shutdown(Shutdown::Both);
                    c.phase = Phase::Closing;
                    READ_DEADLINE
                }
                Some(c) => GRACE - now.duration_since(c.accepted),
                // Every thread is answering or leaving; each ends within PROGRESS unless its
                // client keeps taking data, and then by its deadline.
                None => PROGRESS,
            };
            open = self.left.wait_timeout(open, wait).map_err(|_| false)?.0;
        }
    }

    /// Connection `id` has its request: from now on it is not closed for a newer one. False if
    /// it was closed already.
    fn answering(&self, id: u64) -> bool {
        let Ok(mut open) = self.open.lock() else { return false };
        match open.1.iter_mut().find(|c| c.id == id) {
            Some(c) if c.phase == Phase::Reading => {
                c.phase = Phase::Answering;
                true
            }
            _ => false,
        }
    }

    fn leave(&self, id: u64) {
        if let Ok(mut open) = self.open.lock() {
            open.1.retain(|c| c.id != id);
        }
        self.left.notify_all();
    }
}

/// Accepts connections until the listener fails, each answered on a thread of its own, at most
/// [`MAX_CONNECTIONS`] at once.
pub(super) fn serve(listener: TcpListener, handler: Handler) {
    let threads = Arc::new(Threads::default());
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            // Out of descriptors or memory: wait for connections to end rather than spin.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let Ok(handle) = stream.try_clone() else { continue };
        let Ok(peer) = stream.peer_addr() else { continue };
        let id = match threads.admit(handle, peer.ip()) {
            Ok(id) => id,
            // Its address has its share: closed (dropped) at once.
            Err(true) => continue,
            Err(false) => return,
        };
        let (handler, mine) = (handler.clone(), threads.clone());
        let spawned = std::thread::Builder::new().name("lb-metrics-conn".to_string()).spawn(move || {
            serve_one(stream, &*handler, || mine.answering(id));
            mine.leave(id);
        });
        if spawned.is_err() {
            // The stream went with the closure: closed.
            threads.leave(id);
        }
    }
}

/// Reads one request, answers it, closes the connection. `answering` says whether the
/// connection may still be answered, and makes sure it will not be closed from outside.
fn serve_one(mut stream: TcpStream, handler: &(dyn Fn(&Request) -> Answer + Send + Sync), answering: impl FnOnce() -> bool) {
    let request = read_request(&mut stream, Instant::now() + READ_DEADLINE);
    if matches!(request, Err(Refused::Gone)) || !answering() {
        // Closed, timed out or failed: nobody to answer.
        return;
    }
    let (status, ctype, body) = match request {
        Ok(req) => handler(&req),
        Err(Refused::TooLarge) => (431, "text/plain; charset=utf-8", "request header too long\n".to_string()),
        Err(Refused::Malformed | Refused::Gone) => (400, "text/plain; charset=utf-8", "bad request\n".to_string()),
    };
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason(status),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    if write_by(&mut stream, &out, Instant::now() + WRITE_DEADLINE).is_ok() {
        let _ = stream.shutdown(Shutdown::Write);
        linger(&mut stream, Instant::now() + LINGER);
    }
}

/// Reads and discards what the client still sends until it closes or `deadline`, so that the
/// close that follows does not reset a connection whose answer the client is still reading.
fn linger(stream: &mut TcpStream, deadline: Instant) {
    let mut chunk = [0u8; 2048];
    let mut left_to_read = MAX_HEAD;
    while left_to_read > 0 {
        let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else { return };
        if stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => left_to_read = left_to_read.saturating_sub(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The part of a client's address that [`MAX_PER_PEER`] counts: an IPv4 address (also when
/// mapped into IPv6), or an IPv6 address's /64, which one client usually has whole.
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        431 => "Request Header Fields Too Large",
        _ => "Internal Server Error",
    }
}

#[derive(Debug, PartialEq)]
enum Refused {
    TooLarge,
    Malformed,
    Gone,
}

/// The request head, read before `deadline`.
fn read_request(stream: &mut TcpStream, deadline: Instant) -> Result<Request, Refused> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(req) = parse(&buf)? {
            return Ok(req);
        }
        if buf.len() > MAX_HEAD {
            return Err(Refused::TooLarge);
        }
        let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or(Refused::Gone)?;
        stream.set_read_timeout(Some(left)).map_err(|_| Refused::Gone)?;
        match stream.read(&mut chunk) {
            Ok(0) => return Err(Refused::Gone),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Refused::Gone),
        }
    }
}

/// A complete request head in `buf` (None: not complete yet).
fn parse(buf: &[u8]) -> Result<Option<Request>, Refused> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(_)) => {
            let accept: Vec<&str> = req
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("accept"))
                .map(|h| std::str::from_utf8(h.value).map(str::trim).unwrap_or(""))
                .collect();
            let target = req.path.unwrap_or("");
            Ok(Some(Request {
                method: req.method.unwrap_or("").to_string(),
                path: target.split('?').next().unwrap_or("").to_string(),
                accept: accept.join(","),
            }))
        }
        Err(httparse::Error::TooManyHeaders) => Err(Refused::TooLarge),
        Err(_) => Err(Refused::Malformed),
    }
}

/// Writes all of `data` before `deadline`, or gives up; also gives up when the client has taken
/// less than [`MIN_PROGRESS`] bytes (or the rest of the answer, when shorter) in a [`PROGRESS`]
/// window. Not simply "a send that took nothing": the kernel of a client that never reads still
/// accepts a trickle now and then (as it compacts its receive queue), enough to keep a send from
/// ever timing out empty-handed.
fn write_by(stream: &mut TcpStream, mut data: &[u8], deadline: Instant) -> std::io::Result<()> {
    let mut window = (Instant::now(), 0usize, data.len());
    while !data.is_empty() {
        let now = Instant::now();
        let left = deadline.checked_duration_since(now).filter(|d| !d.is_zero()).ok_or(std::io::ErrorKind::TimedOut)?;
        let in_window = now.duration_since(window.0);
        if in_window >= PROGRESS {
            if window.1 < MIN_PROGRESS.min(window.2) {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            window = (now, 0, data.len());
            continue;
        }
        stream.set_write_timeout(Some(left.min(PROGRESS - in_window)))?;
        match stream.write(data) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                data = &data[n..];
                window.1 += n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Nothing taken for the rest of the window: judged at the top of the loop.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_full_the_oldest_connection_still_reading_is_closed_and_one_being_answered_never() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let threads = Arc::new(Threads::default());
        let mut clients = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            clients.push(TcpStream::connect(addr).expect("connect"));
            let (s, _) = listener.accept().expect("accept");
            let peer = std::net::Ipv4Addr::from(0x0a00_0000 + ids.len() as u32).into();
            ids.push(threads.admit(s, peer).expect("a free thread"));
        }
        // The oldest has sent its request and is being answered; the next oldest never sends one.
        assert!(threads.answering(ids[0]));
        std::thread::sleep(GRACE);
        let (first, second) = (clients.remove(0), clients.remove(0));
        let (closed_id, leaving) = (ids[1], threads.clone());
        let watcher = std::thread::spawn(move || {
            // What the connection's thread does when its socket is closed under it: leaves.
            let mut second = second;
            let mut b = [0u8; 1];
            let eof = matches!(second.read(&mut b), Ok(0));
            leaving.leave(closed_id);
            eof
        });
        let _newest = TcpStream::connect(addr).expect("connect");
        let (s, _) = listener.accept().expect("accept");
        let started = Instant::now();
        assert!(threads.admit(s, "10.1.0.0".parse().expect("ip")).is_ok());
        assert!(started.elapsed() < Duration::from_secs(2), "admitted after {:?}", started.elapsed());
        assert!(watcher.join().expect("watcher"), "the silent connection was closed");
        // The one being answered was not: a read finds nothing yet, not the end.
        first.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
        let mut b = [0u8; 1];
        assert!((&first).read(&mut b).is_err(), "the connection being answered was closed");
        assert!(threads.answering(ids[2]), "the other silent ones are untouched");
    }

    #[test]
    fn one_address_gets_at_most_its_share_and_the_others_still_get_in() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let threads = Threads::default();
        let mut clients = Vec::new();
        let accept = |clients: &mut Vec<TcpStream>| {
            clients.push(TcpStream::connect(addr).expect("connect"));
            listener.accept().expect("accept").0
        };
        let greedy: IpAddr = "192.0.2.1".parse().expect("ip");
        for _ in 0..MAX_PER_PEER {
            let id = threads.admit(accept(&mut clients), greedy).expect("within the address's share");
            assert!(threads.answering(id));
        }
        // Its share is taken by connections being answered: its next ones are refused at once,
        // and another address is admitted.
        for _ in 0..3 * MAX_CONNECTIONS {
            let started = Instant::now();
            assert_eq!(threads.admit(accept(&mut clients), greedy), Err(true));
            assert!(started.elapsed() < Duration::from_millis(100));
        }
        assert!(threads.admit(accept(&mut clients), "192.0.2.2".parse().expect("ip")).is_ok());
        // An IPv6 /64 is one address; a v4-mapped address is the IPv4 one.
        assert_eq!(peer_key("2001:db8:1:2:aaaa::1".parse().expect("ip")), peer_key("2001:db8:1:2:bbbb::2".parse().expect("ip")));
        assert_ne!(peer_key("2001:db8:1:2::1".parse().expect("ip")), peer_key("2001:db8:1:3::1".parse().expect("ip")));
        assert_eq!(peer_key("::ffff:192.0.2.1".parse().expect("ip")), greedy);
    }

    #[test]
    fn a_request_head_gives_method_path_and_accept() {
        let r = parse(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\naccept: application/openmetrics-text;version=1.0.0\r\n\r\n")
            .expect("valid")
            .expect("complete");
        assert_eq!((r.method.as_str(), r.path.as_str()), ("GET", "/metrics"));
        assert!(r.accept.contains("application/openmetrics-text"));
        let r = parse(b"GET / HTTP/1.0\nUser-Agent: x\n\n").expect("bare LF").expect("complete");
        assert_eq!((r.path.as_str(), r.accept.as_str()), ("/", ""));
    }

    #[test]
    fn an_unfinished_head_waits_and_a_broken_one_is_refused() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\nA: b\r\n"), Ok(None));
        assert_eq!(parse(b"GET /"), Ok(None));
        assert_eq!(parse(b"GET / SPDY/3\r\n\r\n"), Err(Refused::Malformed));
        assert_eq!(parse(b"GET / HTTP/1.1\r\nno colon\r\n\r\n"), Err(Refused::Malformed));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: y\r\n")).collect();
        assert_eq!(parse(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()), Err(Refused::TooLarge));
    }
}
