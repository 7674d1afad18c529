//! `lb agent`'s connections, many at once. Over plain TCP a client gets the line as soon as it
//! is accepted; over HTTP it is kept until its GET has come, within [`DEADLINE`], and is then
//! answered. At most [`MAX_OPEN`] wait at once, the oldest given up first, so clients that
//! connect and say nothing (by accident or on purpose) cost a slot each for a fifth of a second
//! and never hold up lb's asks, which send their GET at once.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};

/// How long a client may take to send its HTTP request.
pub const DEADLINE: Duration = Duration::from_millis(200);
/// HTTP clients waiting for their request at once, at most.
pub const MAX_OPEN: usize = 256;
/// Connections accepted per wake of the loop, at most.
const ACCEPTS_PER_WAKE: usize = 64;
/// The most of a request that is read: its head is far shorter.
const MAX_REQUEST: usize = 4096;

struct Client {
    stream: TcpStream,
    got: Vec<u8>,
    deadline: Instant,
}

pub struct Clients {
    http: bool,
    /// Oldest first.
    waiting: VecDeque<Client>,
}

impl Clients {
    pub fn new(http: bool) -> Clients {
        Clients { http, waiting: VecDeque::new() }
    }

    /// What to poll for besides the listener: each waiting client's request.
    pub fn poll_fds(&self) -> Vec<PollFd<'_>> {
        self.waiting.iter().map(|c| PollFd::new(c.stream.as_fd(), PollFlags::POLLIN)).collect()
    }

    /// When the first waiting client's time is up, if any waits.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiting.iter().map(|c| c.deadline).min()
    }

    /// Accepts what `listener` has (a bounded number); returns how many were accepted. A TCP
    /// client gets `line` at once; an HTTP client waits for its request.
    pub fn accept(&mut self, listener: &TcpListener, line: &str) -> u64 {
        let mut accepted = 0;
        for _ in 0..ACCEPTS_PER_WAKE {
            let Ok((stream, _)) = listener.accept() else { break };
            accepted += 1;
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            if !self.http {
                // A fresh connection's send buffer has room for one line; what does not fit is
                // not waited for.
                let _ = (&stream).write_all(format!("{line}\n").as_bytes());
                continue;
            }
            if self.waiting.len() >= MAX_OPEN {
                self.waiting.pop_front();
            }
            self.waiting.push_back(Client { stream, got: Vec::new(), deadline: Instant::now() + DEADLINE });
        }
        accepted
    }

    /// Reads what the waiting clients sent; answers each whose request is complete (a GET gets
    /// `line` as a 200's body, anything else a 400) and gives up on those whose time is up.
    pub fn serve(&mut self, line: &str) {
        let now = Instant::now();
        self.waiting.retain_mut(|c| {
            let mut chunk = [0u8; 512];
            // The client's end of sending: its request is whatever came.
            let mut ended = false;
            loop {
                match c.stream.read(&mut chunk) {
                    Ok(0) => {
                        ended = true;
                        break;
                    }
                    Ok(n) => {
                        c.got.extend_from_slice(&chunk[..n]);
                        if c.got.len() >= MAX_REQUEST {
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
            // A head ends with an empty line (CRLF, or bare LF from a hand-typed request); a
            // client that stopped sending, or whose time is up, is answered by what it sent.
            let complete = c.got.windows(4).any(|w| w == b"\r\n\r\n") || c.got.windows(2).any(|w| w == b"\n\n") || c.got.len() >= MAX_REQUEST;
            if complete || ((ended || now >= c.deadline) && !c.got.is_empty()) {
                let _ = c.stream.write_all(answer(&c.got, line).as_bytes());
                return false;
            }
            !ended && now < c.deadline
        });
    }
}

/// The HTTP answer to `request`.
fn answer(request: &[u8], line: &str) -> String {
    if request.starts_with(b"GET ") {
        let body = format!("{line}\n");
        format!("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
    } else {
        "HTTP/1.0 400 Bad Request\r\nConnection: close\r\n\r\n".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A nonblocking loopback listener, its address, and HTTP clients to serve from it.
    fn http_clients() -> (TcpListener, std::net::SocketAddr, Clients) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        (listener, addr, Clients::new(true))
    }

    #[test]
    fn idle_clients_do_not_hold_up_one_that_asks() {
        let (listener, addr, mut clients) = http_clients();
        let idle: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(addr).expect("connect")).collect();
        let mut asking = TcpStream::connect(addr).expect("connect");
        asking.write_all(b"GET /load HTTP/1.0\r\n\r\n").expect("ask");
        let started = Instant::now();
        while clients.waiting.len() < 101 && started.elapsed() < Duration::from_secs(2) {
            clients.accept(&listener, "drain");
        }
        clients.serve("drain");
        asking.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
        let mut got = String::new();
        let _ = asking.read_to_string(&mut got);
        assert!(got.starts_with("HTTP/1.0 200 OK") && got.ends_with("\r\n\r\ndrain\n"), "{got:?}");
        assert_eq!(clients.waiting.len(), 100, "the idle ones wait, until their deadline");
        std::thread::sleep(DEADLINE);
        clients.serve("drain");
        assert!(clients.waiting.is_empty(), "given up after the deadline");
        drop(idle);
    }

    #[test]
    fn at_most_max_open_wait_and_the_oldest_go_first() {
        let (listener, addr, mut clients) = http_clients();
        // Accepted as they come (the listener's backlog is shorter than that).
        let mut idle = Vec::new();
        let mut accepted = 0;
        for _ in 0..MAX_OPEN + 10 {
            idle.push(TcpStream::connect(addr).expect("connect"));
            let started = Instant::now();
            while accepted < idle.len() as u64 && started.elapsed() < Duration::from_secs(2) {
                accepted += clients.accept(&listener, "50%");
            }
        }
        assert_eq!(accepted, (MAX_OPEN + 10) as u64);
        assert_eq!(clients.waiting.len(), MAX_OPEN);
        // The 10 oldest were closed; the newest waits still.
        let mut buf = [0u8; 16];
        idle[0].set_read_timeout(Some(Duration::from_millis(500))).expect("timeout");
        assert_eq!(idle[0].read(&mut buf).expect("closed: end of file"), 0, "the oldest was given up");
        let newest = idle.last_mut().expect("one");
        newest.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
        assert!(newest.read(&mut buf).is_err(), "the newest still waits for its answer");
        assert_eq!(answer(b"POST / HTTP/1.0\r\n\r\n", "50%"), "HTTP/1.0 400 Bad Request\r\nConnection: close\r\n\r\n");
    }

    #[test]
    fn a_request_is_answered_when_its_sender_stops_or_its_time_is_up() {
        let (listener, addr, mut clients) = http_clients();
        // A GET and the end of sending, together; a bare-LF head; a head never ended.
        let mut shut = TcpStream::connect(addr).expect("connect");
        shut.write_all(b"GET /load HTTP/1.0\r\n").expect("send");
        shut.shutdown(std::net::Shutdown::Write).expect("shutdown");
        let mut lf = TcpStream::connect(addr).expect("connect");
        lf.write_all(b"GET /\n\n").expect("send");
        let mut open = TcpStream::connect(addr).expect("connect");
        open.write_all(b"GET /load HTTP/1.0\r\n").expect("send");
        let started = Instant::now();
        while clients.waiting.len() < 3 && started.elapsed() < Duration::from_secs(2) {
            clients.accept(&listener, "drain");
        }
        std::thread::sleep(Duration::from_millis(20));
        clients.serve("drain");
        for (what, s) in [("ended", &mut shut), ("bare LF", &mut lf)] {
            s.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
            let mut got = String::new();
            let _ = s.read_to_string(&mut got);
            assert!(got.ends_with("\r\n\r\ndrain\n"), "{what}: {got:?}");
        }
        assert_eq!(clients.waiting.len(), 1, "the open one waits for the rest of its head");
        std::thread::sleep(DEADLINE);
        clients.serve("drain");
        open.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
        let mut got = String::new();
        let _ = open.read_to_string(&mut got);
        assert!(got.ends_with("\r\n\r\ndrain\n"), "at its deadline, by what it sent: {got:?}");
    }
}
