//! Load-aware weights' end-to-end pieces: a backend whose every request costs real CPU work, and
//! a client that opens new connections at a steady rate whatever the backends do (open loop, so
//! a slow backend's queue shows in the latencies instead of slowing the client down).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// `ROUNDS` thousand rounds of xorshift: work no balancer can see through.
fn work(kilo_rounds: u64) -> u64 {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..kilo_rounds * 1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = x.wrapping_add(i);
    }
    std::hint::black_box(x)
}

/// Serves HTTP/1.0 on `listener`, one request at a time: reads the request, works, answers
/// `NAME CHECKSUM`.
pub fn work_serve(listener: TcpListener, name: &str, kilo_rounds: u64) -> Result<bool> {
    loop {
        let Ok((mut s, _)) = listener.accept() else { continue };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        let mut got = Vec::new();
        let mut chunk = [0u8; 1024];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 8192 {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
        if !got.starts_with(b"GET ") {
            continue;
        }
        let body = format!("{name} {:x}\n", work(kilo_rounds));
        let _ = s.write_all(format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).as_bytes());
    }
}

/// One request: the backend's name, or why it failed. An HTTP server's answer is read to its
/// end; a line server's (`e2e serve`, which speaks first) to its first line.
fn request(to: SocketAddr, source: Option<(IpAddr, u16)>, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let mut s = match source {
        None => TcpStream::connect_timeout(&to, timeout).map_err(|e| format!("connect: {}", e.kind()))?,
        Some((src, sport)) => {
            let sock = crate::bound(src, sport, nix::sys::socket::SockType::Stream).map_err(|e| format!("bind: {e}"))?;
            crate::connect_timeout(sock, to, timeout).map_err(|e| format!("connect: {e}"))?
        }
    };
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let _ = s.set_write_timeout(Some(left()));
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").map_err(|e| format!("send: {}", e.kind()))?;
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if !got.is_empty() && !got.starts_with(b"HTTP/") && got.contains(&b'\n') {
            break;
        }
        let _ = s.set_read_timeout(Some(left()));
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("read: {}", e.kind())),
        }
    }
    let text = String::from_utf8_lossy(&got);
    let body = if text.starts_with("HTTP/") { text.split_once("\r\n\r\n").map(|(_, b)| b).ok_or("no answer")? } else { &text };
    body.split_whitespace().next().map(str::to_string).ok_or_else(|| "an empty answer".to_string())
}

/// Opens `rate` connections a second to VIP:PORT for `seconds`, each from its own ephemeral
/// port, or with `source` from that address and ports in turn from 10000 up (bind() picks
/// ephemeral ports at random, and a 5-tuple reused within lb's 30 s follows its old entry), on
/// `workers` threads; writes `START_MS BACKEND LATENCY_MS` (or `START_MS FAIL REASON
/// LATENCY_MS`) per request to `out`, the latency counted from when the request was due.
#[allow(clippy::too_many_arguments)]
pub fn load(vip: IpAddr, port: u16, source: Option<IpAddr>, rate: f64, seconds: f64, workers: usize, timeout: Duration, out: &Path) -> Result<bool> {
    let to = SocketAddr::new(vip, port);
    let (tx, rx) = channel::<(Instant, u16)>();
    let rx = Arc::new(Mutex::new(rx));
    let lines = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut threads = Vec::new();
    for _ in 0..workers.max(1) {
        let (rx, lines) = (rx.clone(), lines.clone());
        threads.push(std::thread::spawn(move || loop {
            let (due, sport) = match rx.lock().map(|r| r.recv()) {
                Ok(Ok(d)) => d,
                _ => return,
            };
            let r = request(to, source.map(|s| (s, sport)), timeout);
            let took = due.elapsed().as_secs_f64() * 1e3;
            let at = (due - start).as_secs_f64() * 1e3;
            let line = match r {
                Ok(name) => format!("{at:.0} {name} {took:.1}"),
                Err(e) => format!("{at:.0} FAIL {} {took:.1}", e.replace(' ', "_")),
            };
            if let Ok(mut l) = lines.lock() {
                l.push(line);
            }
        }));
    }
    let total = (rate * seconds) as u64;
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let _ = tx.send((due, 10000 + (i % 50000) as u16));
    }
    drop(tx);
    for t in threads {
        let _ = t.join();
    }
    let lines = lines.lock().map(|l| l.clone()).unwrap_or_default();
    let failed = lines.iter().filter(|l| l.contains(" FAIL ")).count();
    std::fs::write(out, lines.join("\n") + "\n").with_context(|| format!("writing {}", out.display()))?;
    println!("load: {} requests, {failed} failed", lines.len());
    Ok(true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn work_is_deterministic() {
        assert_eq!(super::work(2), super::work(2));
    }
}
