//! `lb agent` as a backend runs it, asked over loopback as lb asks: with clients that connect
//! and say nothing beside lb's asks, and with override files that are not what they seem. No
//! root needed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What `lb agent` answers for an override file it refuses (src/commands/agent/mod.rs).
const REFUSED: &str = "override-file-refused";

/// A running `lb agent` (and the process it watches), both ended when dropped.
struct Agent {
    agent: Child,
    watched: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Agent {
    /// `lb agent --http` on a free loopback port, every 500 ms, with `--override-file DIR/override`.
    fn start(name: &str) -> Agent {
        let dir = std::env::temp_dir().join(format!("lb-agent-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let watched = Command::new("sleep").arg("60").spawn().expect("sleep");
        // A port free now (the agent binds it a moment later).
        let addr = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
        let agent = Command::new(env!("CARGO_BIN_EXE_lb"))
            .args(["agent", "--pid", &watched.id().to_string(), "--listen", &addr.to_string(), "--interval", "0.5", "--http"])
            .arg("--override-file")
            .arg(dir.join("override"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("lb agent");
        let a = Agent { agent, watched, addr, dir };
        let started = Instant::now();
        while TcpStream::connect(a.addr).is_err() {
            assert!(started.elapsed() < Duration::from_secs(5), "lb agent did not listen on {}", a.addr);
            std::thread::sleep(Duration::from_millis(20));
        }
        a
    }

    /// lb's ask: GET, then the body's first line, within lb's default agent timeout (1 s).
    fn ask(&self) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(1))).map_err(|e| e.to_string())?;
        s.write_all(b"GET /load HTTP/1.0\r\n\r\n").map_err(|e| format!("send: {e}"))?;
        let mut got = String::new();
        s.read_to_string(&mut got).map_err(|e| format!("read: {e}"))?;
        if Instant::now() > deadline {
            return Err(format!("answered after lb's 1 s: {got:?}"));
        }
        let body = got.split("\r\n\r\n").nth(1).ok_or_else(|| format!("no body: {got:?}"))?;
        Ok(body.lines().next().unwrap_or_default().to_string())
    }

    /// Asks until the answer is `want` (an interval or two after a change), for up to 3 s.
    fn until(&self, want: &str) {
        let started = Instant::now();
        loop {
            let got = self.ask();
            if got.as_deref() == Ok(want) {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(3), "the agent answers {got:?}, not {want:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
        let _ = self.watched.kill();
        let _ = self.watched.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// 100 clients connect and say nothing; lb's asks are answered all the same, every one within
/// its timeout, and the operator's `drain` reaches lb.
#[test]
fn idle_connections_do_not_keep_drain_from_lb() {
    let a = Agent::start("idle");
    std::fs::write(a.dir.join("override"), "drain\n").expect("write");
    a.until("drain");
    let idle: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(a.addr).expect("connect")).collect();
    let mut failed = Vec::new();
    for i in 0..8 {
        match a.ask() {
            Ok(l) if l == "drain" => {}
            other => failed.push(format!("ask {i}: {other:?}")),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(failed.is_empty(), "with 100 idle connections open: {failed:?}");
    drop(idle);
}

/// The override file is answered only when it is a regular file that says an agent answer, and
/// as lb reads it: a link (here to a file standing for one only root may read), a FIFO, or a
/// line that is no answer are answered `override-file-refused` (garbage to lb, which keeps the
/// last good report: not the measure, which would undo a drain), and nothing of the file is
/// repeated.
#[test]
fn an_override_file_that_is_not_what_it_seems_is_not_answered() {
    let a = Agent::start("override");
    let over = a.dir.join("override");
    a.until("100%");
    std::fs::write(&over, "DRAIN  # maintenance, ticket 42\n").expect("write");
    a.until("drain");

    let secret = a.dir.join("secret");
    // An answer lb would read, behind a link: followed, it would be answered.
    std::fs::write(&secret, "down # root:$6$not-for-anyone\n").expect("write");
    std::fs::remove_file(&over).expect("rm");
    std::os::unix::fs::symlink(&secret, &over).expect("symlink");
    a.until(REFUSED);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(a.ask(), Ok(REFUSED.to_string()), "a link is not followed");

    std::fs::remove_file(&over).expect("rm");
    nix::unistd::mkfifo(&over, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).expect("mkfifo");
    std::thread::sleep(Duration::from_millis(700));
    for _ in 0..5 {
        assert_eq!(a.ask(), Ok(REFUSED.to_string()), "a FIFO neither hangs the agent nor is answered");
    }

    std::fs::remove_file(&over).expect("rm");
    std::fs::write(&over, "root:x:0:0:root:/root:/bin/bash\n").expect("write");
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(a.ask(), Ok(REFUSED.to_string()), "a line that is no answer is not echoed");
    // Gone: the measure again.
    std::fs::remove_file(&over).expect("rm");
    a.until("100%");
}
