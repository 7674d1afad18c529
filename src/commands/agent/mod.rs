//! `lb agent`: a reference load agent for `agent:` checks (docs/load.md). It watches one process
//! (`--pid`) and answers every connection with one line: the process's capacity in percent, or
//! what an override file says. Its figure is measured once per interval, at the interval's
//! boundaries on the wall clock (as lb asks), so every lb node that asks within an interval reads
//! the same line.
//!
//! Two measures, both from /proc:
//! - with `--request-cpu SECS` (the CPU time a request takes on a server at full speed), the
//!   process's speed: CPU time it used (its CPU clock: every thread, those that exited too) per
//!   connection this network namespace accepted over the interval, against that figure. A server three times slower reports 33%, however loaded,
//!   so a pool's weights follow the servers' speeds (its share of new connections, a third).
//! - without it, what is left: 100% less the process's CPU use over the interval, of `--cpus`.
//!
//! It answers over plain TCP (the line at once), or with `--http` over HTTP (a GET gets the line
//! as a 200's body), many clients at once (clients.rs). A process that is gone (or whose PID
//! another process now has) is `down`. The override file is read with care (override_file.rs).

mod clients;
mod override_file;

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use lb::load::unix_ms;

use anyhow::{bail, Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::log::log;
use super::values::seconds;

/// `lb agent`'s flags.
#[derive(clap::Args)]
pub struct Args {
    /// The process whose load is reported (its CPU clock: all its threads' CPU time).
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
    /// The figure is measured over the last SECS (at least an interval), so that one interval's
    /// few requests do not make it wander; it is still answered anew each interval.
    #[arg(long, value_name = "SECS", value_parser = seconds, default_value = "10")]
    window: Duration,
    /// Without --request-cpu: the CPUs the process may use, against which its CPU use counts.
    #[arg(long, value_name = "N", default_value = "1", value_parser = clap::value_parser!(u32).range(1..=4096))]
    cpus: u32,
    /// While FILE exists, answer its first line instead (`drain`, `down`, `50%`): how an
    /// operator takes a backend out by hand. Read at each interval's start, like the measure.
    #[arg(long, value_name = "FILE")]
    override_file: Option<PathBuf>,
    /// Answer HTTP (a GET gets the line as a 200's body; `agent: {path: ...}` in the pool)
    /// instead of plain TCP (the line as soon as the connection opens).
    #[arg(long)]
    http: bool,
}

/// One reading: the process's CPU seconds and the namespace's accepted connections (less the
/// agent's own, counted since it started), and when, in milliseconds of the monotonic clock
/// (a wall clock that steps would stretch or shrink the span).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reading {
    cpu: f64,
    accepted: u64,
    at_ms: u64,
}

/// Tcp PassiveOpens of a /proc/net/snmp text.
fn passive_opens(snmp: &str) -> Option<u64> {
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next()?, tcp.next()?);
    let at = names.split_whitespace().position(|n| n == "PassiveOpens")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// The capacity in percent between two readings: by speed against `request_cpu`, else idle
/// CPU. None: nothing to judge by (no connection accepted, for speed).
fn capacity(before: Reading, after: Reading, request_cpu: Option<f64>, cpus: u32) -> Option<u32> {
    let used = (after.cpu - before.cpu).max(0.0);
    let seconds = (after.at_ms.saturating_sub(before.at_ms) as f64 / 1e3).max(1e-3);
    match request_cpu {
        Some(full) => {
            let served = after.accepted.saturating_sub(before.accepted);
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

/// Why a reading failed: the process is gone (answer `down`), or a read that may work next time.
enum Failed {
    Gone,
    Transient(anyhow::Error),
}

struct Meter {
    pid: u32,
    /// The process's start time (field 22 of its stat): a PID reused by another process is not
    /// measured as if it were the same one.
    started: u64,
    clock: nix::time::ClockId,
    /// The zero of the readings' times.
    zero: Instant,
}

/// Field 22 of a /proc/PID/stat text: the start time, in clock ticks after boot.
fn start_time(stat: &str) -> Option<u64> {
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(19)?.parse().ok()
}

impl Meter {
    fn new(pid: u32) -> Result<Meter> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("no process {pid}"))?;
        let started = start_time(&stat).with_context(|| format!("cannot read /proc/{pid}/stat"))?;
        // The process's CPU clock: all its threads, those that exited included, in nanoseconds.
        let clock = nix::time::clock_getcpuclockid(nix::unistd::Pid::from_raw(pid as i32)).with_context(|| format!("the CPU clock of process {pid}"))?;
        Ok(Meter { pid, started, clock, zero: Instant::now() })
    }

    fn read(&self) -> Result<Reading, Failed> {
        match std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
            Ok(stat) if start_time(&stat) == Some(self.started) => {}
            Ok(_) => return Err(Failed::Gone),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Failed::Gone),
            Err(e) => return Err(Failed::Transient(e.into())),
        }
        let cpu = match nix::time::clock_gettime(self.clock) {
            Ok(t) => t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9,
            Err(nix::errno::Errno::EINVAL) => return Err(Failed::Gone),
            Err(e) => return Err(Failed::Transient(e.into())),
        };
        let snmp = std::fs::read_to_string("/proc/net/snmp").map_err(|e| Failed::Transient(e.into()))?;
        let accepted = passive_opens(&snmp).ok_or_else(|| Failed::Transient(anyhow::anyhow!("no Tcp PassiveOpens in /proc/net/snmp")))?;
        Ok(Reading { cpu, accepted, at_ms: self.zero.elapsed().as_millis() as u64 })
    }
}

/// What a refused override file is answered as: a word lb reads as garbage, so that lb counts it
/// and keeps the backend's last good report. Not the measure, which would put a backend the
/// operator meant to drain (`drian`, a file being rewritten, a link) back at full weight.
const REFUSED: &str = "override-file-refused";

/// What the override file says now (None: no file, or none given). A refusal is logged when it
/// is new (`refused` holds the last one logged) and answered as [`REFUSED`].
fn override_line(file: Option<&PathBuf>, refused: &mut Option<String>) -> Option<String> {
    let file = file?;
    match override_file::read(file) {
        override_file::Override::Answer(line) => {
            *refused = None;
            Some(line)
        }
        override_file::Override::Absent => {
            *refused = None;
            None
        }
        override_file::Override::Refused(why) => {
            if refused.as_ref() != Some(&why) {
                log(format!("agent: the override file {} is refused: {why}; answering {REFUSED:?}, which lb counts as garbage, keeping the last good report", file.display()));
                *refused = Some(why);
            }
            Some(REFUSED.to_string())
        }
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let meter = Meter::new(args.pid)?;
    let first = meter.read().map_err(|e| match e {
        Failed::Gone => anyhow::anyhow!("process {} is gone", args.pid),
        Failed::Transient(e) => e,
    })?;
    // The readings of the last --window, oldest first: the figure is measured over all of it.
    let mut readings = std::collections::VecDeque::from([first]);
    let window_ms = (args.window.max(args.interval).as_millis() as u64).max(1);
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
    // The agent's own connections, which /proc/net/snmp counts too.
    let mut own = 0u64;
    let mut refused = None;
    let mut line = override_line(args.override_file.as_ref(), &mut refused).unwrap_or_else(|| "100%".to_string());
    let mut clients = clients::Clients::new(args.http);
    log(format!(
        "agent: reporting process {}'s {} on {} every {:?}{}",
        args.pid,
        match args.request_cpu {
            Some(c) => format!("speed against {:?} of CPU a request", c),
            None => format!("idle CPU of {}", args.cpus),
        },
        args.listen,
        args.interval,
        if args.http { ", over HTTP" } else { "" }
    ));
    loop {
        // A new interval: measure the one that ended, before answering anyone.
        let now = unix_ms();
        if now / len > epoch {
            epoch = now / len;
            let measured = match meter.read() {
                Ok(mut after) => {
                    after.accepted = after.accepted.saturating_sub(own);
                    while readings.len() > 1 && readings.get(1).is_some_and(|r| after.at_ms.saturating_sub(r.at_ms) >= window_ms) {
                        readings.pop_front();
                    }
                    if let Some(c) = readings.front().and_then(|&b| capacity(b, after, args.request_cpu.map(|d| d.as_secs_f64()), args.cpus)) {
                        capacity_now = c;
                    }
                    readings.push_back(after);
                    Some(format!("{capacity_now}%"))
                }
                Err(Failed::Gone) => Some("down".to_string()),
                // The last line stands for a read that failed for once.
                Err(Failed::Transient(e)) => {
                    log(format!("agent: measuring process {}: {e:#}; the last figure stands", args.pid));
                    None
                }
            };
            // The override is read with the measure: every node that asks within an interval
            // reads the same line.
            if let Some(l) = override_line(args.override_file.as_ref(), &mut refused).or(measured) {
                line = l;
            }
        } else if now / len < epoch {
            // The clock went back: measure from the interval it is in now.
            epoch = now / len;
        }
        // Until the interval ends, or the first waiting client's time is up.
        let mut wait = Duration::from_millis((epoch + 1) * len - unix_ms().clamp(epoch * len, (epoch + 1) * len));
        if let Some(d) = clients.next_deadline() {
            wait = wait.min(d.saturating_duration_since(Instant::now()));
        }
        let mut fds = vec![PollFd::new(signals.as_fd(), PollFlags::POLLIN), PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        fds.extend(clients.poll_fds());
        match poll(&mut fds, PollTimeout::try_from(wait.max(Duration::from_millis(1))).unwrap_or(PollTimeout::MAX)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => bail!("waiting for connections: {e}"),
        }
        drop(fds);
        if let Ok(Some(sig)) = signals.read_signal() {
            log(format!("agent: stopped by {}", Signal::try_from(sig.ssi_signo as i32).map_or("a signal", |s| s.as_str())));
            return Ok(ExitCode::SUCCESS);
        }
        // A bounded number per wake, so that an interval's boundary is never late by much.
        own += clients.accept(&listener, &line);
        clients.serve(&line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_texts_are_read() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 350 25 0 0 20 0 3 0 1000 0 0";
        assert_eq!(start_time(stat), Some(1000));
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails\nTcp: 1 200 120000 -1 10 1234 0\nUdp: InDatagrams\nUdp: 5\n";
        assert_eq!(passive_opens(snmp), Some(1234));
    }

    #[test]
    fn a_process_is_measured_by_its_cpu_clock_and_is_down_once_gone() {
        let mut busy = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exec sleep 30"])
            .spawn()
            .expect("sh");
        let meter = Meter::new(busy.id()).expect("a meter");
        std::thread::sleep(Duration::from_millis(400));
        let Ok(r) = meter.read() else { panic!("a live process reads") };
        assert!(r.cpu > 0.05, "{} s of CPU", r.cpu);
        let _ = busy.kill();
        let _ = busy.wait();
        assert!(matches!(meter.read(), Err(Failed::Gone)), "a reaped process is gone");
    }

    #[test]
    fn capacity_is_speed_against_the_full_speed_figure_or_idle_cpu() {
        let r = |cpu, accepted, at_ms| Reading { cpu, accepted, at_ms };
        // 100 requests at 6 ms each against 2 ms at full speed: a third.
        assert_eq!(capacity(r(1.0, 10, 0), r(1.6, 110, 2000), Some(0.002), 1), Some(33));
        assert_eq!(capacity(r(1.0, 10, 0), r(1.2, 110, 2000), Some(0.002), 1), Some(100), "faster than full speed is 100%");
        assert_eq!(capacity(r(1.0, 10, 0), r(1.0, 10, 2000), Some(0.002), 1), None, "no connection: nothing to judge by");
        assert_eq!(capacity(r(1.0, 0, 0), r(1.5, 0, 2000), None, 1), Some(75));
        assert_eq!(capacity(r(1.0, 0, 0), r(4.0, 0, 2000), None, 1), Some(0));
        assert_eq!(capacity(r(1.0, 0, 0), r(4.0, 0, 2000), None, 2), Some(25));
    }
}
