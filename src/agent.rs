//! `lb agent`: a reference load agent for `agent:` checks (docs/load.md). It watches one process
//! (`--pid`) and answers every connection with one line: the process's capacity in percent, or
//! what an override file says. Its figure is measured once per interval, at the interval's
//! boundaries on the wall clock (as lb asks), so every lb node that asks within an interval reads
//! the same line.
//!
//! Two measures, both from /proc:
//! - with `--request-cpu SECS` (the CPU time a request takes on a server at full speed), the
//!   process's speed: CPU time it used per connection this network namespace accepted over the
//!   interval, against that figure. A server three times slower reports 33%, however loaded,
//!   so a pool's weights follow the servers' speeds (its share of new connections, a third).
//! - without it, what is left: 100% less the process's CPU use over the interval, of `--cpus`.
//!
//! It answers over plain TCP (the line at once) and HTTP (a GET gets the line as a 200's body).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::log::log;
use crate::settings::seconds;

/// How long a client may take to send an HTTP request, or to be told its line.
const CLIENT_DEADLINE: Duration = Duration::from_millis(200);
/// How long a connection is watched for the start of an HTTP request before it is given the
/// plain line.
const HTTP_GRACE: Duration = Duration::from_millis(20);

/// `lb agent`'s flags.
#[derive(clap::Args)]
pub struct AgentArgs {
    /// The process whose load is reported (its threads' CPU time, from /proc/PID/task).
    #[arg(long, value_name = "PID")]
    pid: u32,
    /// Where to answer lb's agent checks.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:4050")]
    listen: SocketAddr,
    /// The interval of the service's `agent:` check: the figure is measured over each interval
    /// of the wall clock and answered through the next.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "2")]
    interval: Duration,
    /// The CPU time one request (connection) takes on a server at full speed: report the
    /// process's speed against it instead of its idle CPU.
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    request_cpu: Option<Duration>,
    /// Without --request-cpu: the CPUs the process may use, against which its CPU use counts.
    #[arg(long, value_name = "N", default_value = "1", value_parser = clap::value_parser!(u32).range(1..=4096))]
    cpus: u32,
    /// While FILE exists, answer its first line instead (`drain`, `down`, `50%`): how an
    /// operator takes a backend out by hand. Read at each interval's start, like the measure.
    #[arg(long, value_name = "FILE")]
    override_file: Option<PathBuf>,
}

/// One reading: the process's CPU seconds and the namespace's accepted connections.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reading {
    cpu: f64,
    accepted: u64,
}

/// utime + stime of a /proc/PID/stat text, in clock ticks.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // The command name may hold spaces and parentheses: fields count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14 and stime 15 (1-based, man 5 proc).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Tcp PassiveOpens of a /proc/net/snmp text.
fn passive_opens(snmp: &str) -> Option<u64> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let at = names.split_whitespace().position(|n| n == "PassiveOpens")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// The capacity in percent over one interval: by speed against `request_cpu`, else idle CPU.
/// None: nothing to judge by (no connection accepted, for speed).
fn capacity(before: Reading, after: Reading, own: u64, seconds: f64, request_cpu: Option<f64>, cpus: u32) -> Option<u32> {
    let used = (after.cpu - before.cpu).max(0.0);
    match request_cpu {
        Some(full) => {
            let served = after.accepted.saturating_sub(before.accepted).saturating_sub(own);
            if served == 0 {
                return None;
            }
            let per = used / served as f64;
            Some(if per <= full { 100 } else { (100.0 * full / per).round() as u32 })
        }
        None => {
            let busy = used / (seconds * cpus as f64);
            Some((100.0 * (1.0 - busy)).round().clamp(0.0, 100.0) as u32)
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

struct Meter {
    pid: u32,
    tick: f64,
}

impl Meter {
    /// The process's CPU seconds: its threads' run time in nanoseconds from schedstat where the
    /// kernel keeps it, else utime + stime in clock ticks.
    fn cpu(&self) -> Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).with_context(|| format!("process {} is gone", self.pid))?;
        let precise = std::fs::read_dir(format!("/proc/{}/task", self.pid)).ok().and_then(|tasks| {
            let mut ns = 0u64;
            for t in tasks.flatten() {
                let text = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
                ns += text.split_whitespace().next()?.parse::<u64>().ok()?;
            }
            Some(ns as f64 / 1e9)
        });
        match precise {
            Some(s) => Ok(s),
            None => Ok(cpu_ticks(&stat).with_context(|| format!("cannot read /proc/{}/stat", self.pid))? as f64 / self.tick),
        }
    }

    fn read(&self) -> Result<Reading> {
        let cpu = self.cpu()?;
        let snmp = std::fs::read_to_string("/proc/net/snmp").context("reading /proc/net/snmp")?;
        let accepted = passive_opens(&snmp).context("no Tcp PassiveOpens in /proc/net/snmp")?;
        Ok(Reading { cpu, accepted })
    }
}

pub fn run(args: AgentArgs) -> Result<ExitCode> {
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let meter = Meter { pid: args.pid, tick };
    let mut before = meter.read()?;
    let listener = TcpListener::bind(args.listen).with_context(|| format!("listening on {}", args.listen))?;
    listener.set_nonblocking(true)?;
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGINT);
    mask.add(Signal::SIGTERM);
    mask.thread_block()?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK)?;
    let len = (args.interval.as_millis() as u64).max(1);
    let mut epoch = unix_ms() / len;
    let mut capacity_now: u32 = 100;
    let mut own = 0u64;
    let mut line = args.override_file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()).map_or("100%".to_string(), |t| t.lines().next().unwrap_or_default().to_string());
    log(format!(
        "agent: reporting process {}'s {} on {} every {:?}",
        args.pid,
        match args.request_cpu {
            Some(c) => format!("speed against {:?} of CPU a request", c),
            None => format!("idle CPU of {}", args.cpus),
        },
        args.listen,
        args.interval
    ));
    loop {
        let now = unix_ms();
        if now / len != epoch {
            // A new interval: measure the one that ended.
            let seconds = (now / len - epoch) as f64 * args.interval.as_secs_f64();
            epoch = now / len;
            let measured = match meter.read() {
                Ok(after) => {
                    if let Some(c) = capacity(before, after, own, seconds, args.request_cpu.map(|d| d.as_secs_f64()), args.cpus) {
                        capacity_now = c;
                    }
                    before = after;
                    format!("{capacity_now}%")
                }
                Err(_) => "down".to_string(),
            };
            // The override is read with the measure: every node that asks within an interval
            // reads the same line.
            line = match args.override_file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()) {
                Some(text) => text.lines().next().unwrap_or_default().to_string(),
                None => measured,
            };
            own = 0;
        }
        let wait = Duration::from_millis((epoch + 1) * len - unix_ms().min((epoch + 1) * len));
        let mut fds = [PollFd::new(signals.as_fd(), PollFlags::POLLIN), PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::try_from(wait.max(Duration::from_millis(1))).unwrap_or(PollTimeout::MAX)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => bail!("waiting for connections: {e}"),
        }
        if let Ok(Some(sig)) = signals.read_signal() {
            log(format!("agent: stopped by {}", Signal::try_from(sig.ssi_signo as i32).map_or("a signal", |s| s.as_str())));
            return Ok(ExitCode::SUCCESS);
        }
        while let Ok((stream, _)) = listener.accept() {
            own += 1;
            answer_one(stream, &line);
        }
    }
}

/// Gives one client the line: as an HTTP answer if it starts a GET within a moment, else at once.
fn answer_one(mut stream: TcpStream, line: &str) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(CLIENT_DEADLINE));
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLIN)];
    let asked = matches!(poll(&mut fds, PollTimeout::try_from(HTTP_GRACE).unwrap_or(PollTimeout::ZERO)), Ok(n) if n > 0);
    if !asked {
        let _ = stream.write_all(format!("{line}\n").as_bytes());
        return;
    }
    let deadline = Instant::now() + CLIENT_DEADLINE;
    let mut got = Vec::new();
    let mut chunk = [0u8; 512];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 4096 && Instant::now() < deadline {
        let _ = stream.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))));
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
    }
    let answer = if got.starts_with(b"GET ") {
        let body = format!("{line}\n");
        format!("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
    } else {
        "HTTP/1.0 400 Bad Request\r\nConnection: close\r\n\r\n".to_string()
    };
    let _ = stream.write_all(answer.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_texts_are_read() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 350 25 0 0 20 0 3 0 1000 0 0";
        assert_eq!(cpu_ticks(stat), Some(375));
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails\nTcp: 1 200 120000 -1 10 1234 0\nUdp: InDatagrams\nUdp: 5\n";
        assert_eq!(passive_opens(snmp), Some(1234));
    }

    #[test]
    fn capacity_is_speed_against_the_full_speed_figure_or_idle_cpu() {
        let r = |cpu, accepted| Reading { cpu, accepted };
        // 100 requests at 6 ms each against 2 ms at full speed: a third.
        assert_eq!(capacity(r(1.0, 10), r(1.6, 112), 2, 2.0, Some(0.002), 1), Some(33));
        assert_eq!(capacity(r(1.0, 10), r(1.2, 112), 2, 2.0, Some(0.002), 1), Some(100), "faster than full speed is 100%");
        assert_eq!(capacity(r(1.0, 10), r(1.0, 12), 2, 2.0, Some(0.002), 1), None, "only the agent's own connections");
        assert_eq!(capacity(r(1.0, 0), r(1.5, 0), 0, 2.0, None, 1), Some(75));
        assert_eq!(capacity(r(1.0, 0), r(4.0, 0), 0, 2.0, None, 1), Some(0));
    }
}
