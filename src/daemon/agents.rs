//! Agent checks and slow start of `lb attach` (`agent:` and `slow_start:` in a service): when
//! each backend's agent is asked (once an epoch, at the same point of every node's wall clock),
//! what its answer is, and when each epoch's weights are decided. lb::load decides them; the
//! asking runs on the prober's threads (probe.rs). docs/load.md describes the protocol.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use anyhow::Result;

use lb::config::{AgentCheck, Pool};
use lb::fleet::decide::agent_report;
use lb::fleet::view::{AgentSeen, NodeView};
use lb::load::{self, decided_epoch, epoch_at, epoch_length, point_in, unix_ms, Adjustment, Key, Loads, DECIDE_AT, POLL_AT};

use super::describe::label_of;
use super::probe::{connect, read_until, send_get, status_code, Prober};
use crate::log::log;

/// Agents asked at once, at most: each ask may take its whole timeout (an agent that does not
/// answer), so this bounds how many silent agents the others can wait behind.
const AGENT_WORKERS: usize = 64;
/// The longest answer read from an agent.
const ANSWER_LIMIT: usize = 4096;
/// The result of an ask that waited for a worker until its epoch was decided.
const NOT_ASKED: &str = "not asked: every worker was busy until the interval's weights were decided";
/// The same change of one backend's agent is logged at most this often: an agent that flips
/// between garbage and good answers every interval is logged when it starts, then once a while
/// with how many times it came back since.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// When each backend's agent's changes of each kind were last logged, and how many have not been
/// since. A kind is an outcome, and for a failed ask its reason (a timeout and a refusal are
/// different news), never the agent's own words: garbage is one kind, whatever it said.
#[derive(Default)]
struct ChangeLog {
    last: HashMap<(Key, String), (Instant, u32)>,
}

impl ChangeLog {
    /// Whether a change of `kind` to `key`'s agent at `now` is logged: Some(n) when it is, n
    /// being how many of the same kind were not logged since the last that was.
    fn admit(&mut self, key: &Key, kind: &str, now: Instant) -> Option<u32> {
        match self.last.get_mut(&(key.clone(), kind.to_string())) {
            Some((at, skipped)) if now.saturating_duration_since(*at) < LOG_EVERY => {
                *skipped += 1;
                None
            }
            Some((at, skipped)) => {
                let n = *skipped;
                (*at, *skipped) = (now, 0);
                Some(n)
            }
            None => {
                self.last.insert((key.clone(), kind.to_string()), (now, 0));
                Some(0)
            }
        }
    }
}

/// One answer's outcome, for the metrics and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// A line lb read.
    Ok,
    /// A line lb could not read (counted; the last good report stands).
    Garbage,
    /// No line: refused, timed out, closed, or not an HTTP 2xx.
    Failed,
    /// An answer after its epoch's weights were decided: not used.
    Late,
}

impl Outcome {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Garbage => "garbage",
            Outcome::Failed => "failed",
            Outcome::Late => "late",
        }
    }
}

pub(super) struct Agents {
    loads: Loads,
    /// Each answer with the Unix milliseconds it was read at.
    prober: Prober<Result<(String, u64), String>>,
    /// Per service with an agent, the newest epoch its agents were asked in.
    asked_epoch: HashMap<String, u64>,
    /// Per backend, the epoch of the question in flight.
    asking: HashMap<Key, u64>,
    /// Per load-aware service, the newest epoch whose weights are served.
    applied_epoch: HashMap<String, u64>,
    /// What the served pool holds: each adjusted backend, and services failing open.
    adjustments: HashMap<Key, Adjustment>,
    failing_open: Vec<String>,
    /// Per backend, the outcome of its last answer, so that the log names changes only.
    last_outcome: HashMap<Key, Outcome>,
    /// How often each change was logged, so that an agent that flips does not fill the log.
    change_log: ChangeLog,
    /// The pool the last [`Agents::apply`] made, and whether it differed from the one before.
    last_pool: Option<Pool>,
    changed: bool,
    /// Per backend, the newest epoch asked and what its agent answered this node then (None:
    /// nothing usable), for the node's view in a fleet's store.
    seen: HashMap<Key, (u64, Option<load::Report>)>,
}

impl AsFd for Agents {
    /// Readable when answers arrived.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.prober.as_fd()
    }
}

impl Agents {
    pub(super) fn new(pool: &Pool) -> Result<Agents> {
        let mut loads = Loads::new();
        loads.renew(None, pool, unix_ms());
        Ok(Agents {
            loads,
            prober: Prober::new(AGENT_WORKERS)?,
            asked_epoch: HashMap::new(),
            asking: HashMap::new(),
            applied_epoch: HashMap::new(),
            adjustments: HashMap::new(),
            failing_open: Vec::new(),
            last_outcome: HashMap::new(),
            change_log: ChangeLog::default(),
            last_pool: None,
            changed: true,
            seen: HashMap::new(),
        })
    }

    /// Asks the agents whose epoch's question is due (not those of backends `down` says failed
    /// their health checks); returns when the next question or decision is (None: no service
    /// has an agent or slow start).
    pub(super) fn schedule(&mut self, pool: &Pool, down: impl Fn(&Key) -> bool) -> Option<Instant> {
        let now = unix_ms();
        let mut next: Option<u64> = None;
        for s in pool.services.iter().filter(|s| s.load_aware()) {
            let len = epoch_length(s);
            let epoch = epoch_at(now, len);
            if let Some(check) = &s.agent {
                let poll = point_in(epoch, POLL_AT, len);
                if now >= poll && self.asked_epoch.get(&s.name) != Some(&epoch) {
                    self.asked_epoch.insert(s.name.clone(), epoch);
                    for b in s.backends.iter().filter(|b| b.weight > 0) {
                        let key = (s.name.clone(), b.identity());
                        if down(&key) {
                            continue;
                        }
                        let (addr, check) = (SocketAddr::new(b.address, check.port), check.clone());
                        // An ask that waited for a worker past its epoch's decision is not made.
                        let decide = point_in(epoch, DECIDE_AT, len);
                        let work = move || {
                            if unix_ms() >= decide {
                                return Err(NOT_ASKED.to_string());
                            }
                            ask(addr, &check).map(|line| (line, unix_ms()))
                        };
                        // An ask still running keeps its own epoch: its answer is that epoch's.
                        if self.prober.submit(key.clone(), work) {
                            self.asking.insert(key, epoch);
                        }
                    }
                }
                let poll = if now >= poll { point_in(epoch + 1, POLL_AT, len) } else { poll };
                next = Some(next.map_or(poll, |n| n.min(poll)));
            }
            let decide = point_in(epoch, DECIDE_AT, len);
            let decide = if now >= decide { point_in(epoch + 1, DECIDE_AT, len) } else { decide };
            next = Some(next.map_or(decide, |n| n.min(decide)));
        }
        next.map(|at| Instant::now() + Duration::from_millis(at.saturating_sub(now)))
    }

    /// Takes the answers that arrived, each told to `seen` (service, backend, outcome, how long
    /// it took).
    pub(super) fn answers(&mut self, pool: &Pool, mut seen: impl FnMut(&str, &str, Outcome, Duration)) {
        for (key, result, took) in self.prober.drain() {
            let Some(epoch) = self.asking.remove(&key) else { continue };
            let Some(s) = pool.service(&key.0).filter(|s| s.agent.is_some()) else { continue };
            // Judged by when the line was read, not when this loop got to it: every node files
            // an answer under the same epoch, however busy it is.
            let len = epoch_length(s);
            let late = |read_at: u64| epoch_at(read_at, len) != epoch || read_at >= point_in(epoch, DECIDE_AT, len);
            let (outcome, report, problem) = match result.map(|(line, read_at)| (load::parse(&line).map_err(|e| (e, line)), read_at)) {
                Ok((Ok(_), read_at)) if late(read_at) => (Outcome::Late, None, Some("answered after the interval's weights were decided".to_string())),
                Ok((Ok(r), _)) => (Outcome::Ok, Some(r), None),
                Ok((Err((e, line)), _)) => (Outcome::Garbage, None, Some(format!("{e} in {:?}", line.chars().take(80).collect::<String>()))),
                Err(e) if e == NOT_ASKED => (Outcome::Late, None, Some(e)),
                Err(e) => (Outcome::Failed, None, Some(e)),
            };
            if outcome != Outcome::Late {
                self.loads.record(&key, epoch, len, report);
                self.seen.insert(key.clone(), (epoch, report));
            }
            seen(&key.0, &key.1, outcome, took);
            let before = self.last_outcome.insert(key.clone(), outcome);
            if before != Some(outcome) && (before.is_some() || outcome != Outcome::Ok) {
                let kind = match (&outcome, &problem) {
                    (Outcome::Failed, Some(p)) => format!("failed: {p}"),
                    _ => outcome.as_str().to_string(),
                };
                if let Some(skipped) = self.change_log.admit(&key, &kind, Instant::now()) {
                    let label = label_of(pool, &key.0, &key.1);
                    let since = match skipped {
                        0 => String::new(),
                        n => format!(" (and {n} more times since this was last logged)"),
                    };
                    match problem {
                        Some(p) => log(format!("load: {} backend {label}'s agent: {p} ({}); its last good report stands{since}", key.0, outcome.as_str())),
                        None => log(format!("load: {} backend {label}'s agent answers again{since}", key.0)),
                    }
                }
            }
        }
    }

    /// Whether a load-aware service has an epoch decided that is not served yet.
    pub(super) fn due(&self, pool: &Pool) -> bool {
        let now = unix_ms();
        pool.services
            .iter()
            .filter(|s| s.load_aware())
            .any(|s| self.applied_epoch.get(&s.name) != Some(&decided_epoch(now, epoch_length(s))))
    }

    /// `pool` (with health applied) with load applied, logging what changed since the last.
    pub(super) fn apply(&mut self, configured: &Pool, pool: &Pool) -> Pool {
        let now = unix_ms();
        let applied = self.loads.apply(pool, now);
        for s in pool.services.iter().filter(|s| s.load_aware()) {
            self.applied_epoch.insert(s.name.clone(), decided_epoch(now, epoch_length(s)));
        }
        // Logged when a backend's share or its reason changes (not its agent's every report).
        let told = |a: Option<&Adjustment>| a.map_or((100, String::new()), |a| (a.percent, a.why()));
        for (key, a) in &applied.adjustments {
            let now = told(Some(a));
            if told(self.adjustments.get(key)) != now {
                let label = label_of(configured, &key.0, &key.1);
                let what = match a.state {
                    Some(load::State::Drain) => format!("drains ({}): no new connections, its tracked ones stay", now.1),
                    Some(load::State::Down) => format!("is out ({}): its tracked connections go to the others", now.1),
                    _ if now.1.is_empty() => "is served at its full weight".to_string(),
                    _ => format!("is served at {}% of its weight ({})", now.0, now.1),
                };
                log(format!("load: {} backend {label} {what}", key.0));
            }
        }
        for (key, a) in &self.adjustments {
            let gone = !applied.adjustments.contains_key(key) && told(Some(a)) != told(None);
            if gone && configured.service(&key.0).is_some_and(|s| s.backends.iter().any(|b| b.identity() == key.1)) {
                log(format!("load: {} backend {} is served at its full weight again", key.0, label_of(configured, &key.0, &key.1)));
            }
        }
        for s in &applied.failing_open {
            if !self.failing_open.contains(s) {
                log(format!("load: the agents would leave {s} no backend; serving {s} at the weights configured (fail open) until one can serve"));
            }
        }
        for s in &self.failing_open {
            if !applied.failing_open.contains(s) && pool.service(s).is_some() {
                log(format!("load: {s} has a backend its agents let serve again; load applies again"));
            }
        }
        self.adjustments = applied.adjustments;
        self.failing_open = applied.failing_open;
        self.changed = self.last_pool.as_ref() != Some(&applied.pool);
        self.last_pool = Some(applied.pool.clone());
        applied.pool
    }

    /// In a fleet: the report each agent's backend is weighed by in the epoch being decided is
    /// the fleet's, the median of what the live nodes' views say their agents answered
    /// (lb_core::fleet::decide), in place of this node's own.
    pub(super) fn share(&mut self, pool: &Pool, views: &[&NodeView]) {
        let now = unix_ms();
        for s in pool.services.iter().filter(|s| s.agent.is_some()) {
            let len = epoch_length(s);
            let epoch = decided_epoch(now, len);
            for b in &s.backends {
                let id = b.identity();
                if let Some(report) = agent_report(views.iter().copied(), &s.name, &id, epoch) {
                    self.loads.record(&(s.name.clone(), id), epoch, len, report);
                }
            }
        }
    }

    /// What each agent answered this node in the newest epoch asked, for its view.
    pub(super) fn seen(&self, pool: &Pool) -> BTreeMap<String, BTreeMap<String, AgentSeen>> {
        let mut out: BTreeMap<String, BTreeMap<String, AgentSeen>> = BTreeMap::new();
        for ((service, backend), (epoch, report)) in &self.seen {
            if pool.service(service).is_some_and(|s| s.agent.is_some() && s.backends.iter().any(|b| b.identity() == *backend)) {
                out.entry(service.clone()).or_default().insert(backend.clone(), AgentSeen { epoch: *epoch, report: report.map(|r| r.text()) });
            }
        }
        out
    }

    /// Whether the last [`Agents::apply`] made another pool than the one before it.
    pub(super) fn changed(&self) -> bool {
        self.changed
    }

    /// A new pool replaces `old`: backends that begin to serve in it start their slow start.
    /// Returns the loads as they were, for [`Agents::restore`] when the pool is refused.
    pub(super) fn renew(&mut self, old: &Pool, new: &Pool) -> Loads {
        let kept = self.loads.clone();
        self.loads.renew(Some(old), new, unix_ms());
        self.asking.retain(|k, _| new.service(&k.0).is_some_and(|s| s.agent.is_some()));
        let in_pool = |k: &Key| new.service(&k.0).is_some_and(|s| s.backends.iter().any(|b| b.identity() == k.1));
        self.last_outcome.retain(|k, _| in_pool(k));
        self.seen.retain(|k, _| in_pool(k));
        self.change_log.last.retain(|(k, _), _| in_pool(k));
        kept
    }

    pub(super) fn restore(&mut self, kept: Loads) {
        self.loads = kept;
        self.last_pool = None;
    }

    /// The last pool was not installed: the next interval installs whatever it decides.
    pub(super) fn not_installed(&mut self) {
        self.last_pool = None;
    }

    /// At a restart that adopts a pinned data plane: each load-aware backend goes on from the
    /// capacity the plane serves it at (its weight in points over its configured weight), when
    /// the plane's weights of its service are in points at all (one above its configured
    /// weight; a plane written by a version without load-aware weights has none).
    pub(super) fn seed(&mut self, pool: &Pool, live: &[lb::plan::LiveService]) {
        for s in live {
            let Some(conf) = pool.service(&s.name).filter(|c| c.load_aware()) else { continue };
            let configured = |id: &str| conf.backends.iter().find(|b| b.identity() == id).map_or(0, |b| b.weight);
            if !s.backends.iter().any(|b| b.weight > configured(&b.identity)) {
                continue;
            }
            for b in s.backends.iter().filter(|b| b.state == lb::config::BackendState::Active) {
                let c = configured(&b.identity);
                if let Some(capacity) = (b.weight + c / 2).checked_div(c) {
                    self.loads.seed(&(s.name.clone(), b.identity.clone()), capacity);
                }
            }
        }
    }

    /// A backend of `pool` passed its health checks again: its slow start begins.
    pub(super) fn recovered(&mut self, pool: &Pool, key: &Key) {
        if let Some(s) = pool.service(&key.0).filter(|s| s.slow_start.is_some()) {
            let len = epoch_length(s);
            self.loads.joined(key, epoch_at(unix_ms(), len), len);
        }
    }

    /// Writes each load-aware backend's configured weight and, if adjusted, how it is served
    /// into a counter snapshot, for `--stats-interval` (the snapshot holds weights in points).
    pub(super) fn annotate(&self, pool: &Pool, snap: &mut lb::stats::Snapshot) {
        for s in snap.services.iter_mut() {
            let Some(conf) = pool.service(&s.name).filter(|c| c.load_aware()) else { continue };
            for b in s.backends.iter_mut() {
                if let Some(c) = conf.backends.iter().find(|c| c.identity() == b.label) {
                    b.weight = c.weight;
                }
                if let Some(a) = self.adjustments.get(&(s.name.clone(), b.label.clone())).filter(|a| !a.why().is_empty()) {
                    b.load = Some(format!("served at {}%: {}", a.percent, a.why()));
                }
            }
        }
    }

    /// Each adjusted backend's adjustment, for the metrics and the status page.
    pub(super) fn adjustments(&self) -> &HashMap<Key, Adjustment> {
        &self.adjustments
    }
}

/// Asks one agent for its line, within the check's timeout: over TCP the agent speaks first;
/// over HTTP the line is the first of a 2xx answer's body.
pub(super) fn ask(addr: SocketAddr, check: &AgentCheck) -> Result<String, String> {
    let (mut stream, deadline) = connect(addr, check.timeout)?;
    let text = match &check.path {
        None => {
            let got = read_until(&mut stream, deadline, ANSWER_LIMIT, |b| b.contains(&b'\n'))?;
            if got.len() >= ANSWER_LIMIT && !got.contains(&b'\n') {
                return Err(format!("a line longer than {ANSWER_LIMIT} bytes"));
            }
            String::from_utf8_lossy(&got).into_owned()
        }
        Some(path) => {
            send_get(&mut stream, addr, path, "lb-agent-check", deadline)?;
            let got = read_until(&mut stream, deadline, ANSWER_LIMIT, |_| false)?;
            if got.len() >= ANSWER_LIMIT {
                return Err(format!("an answer longer than {ANSWER_LIMIT} bytes"));
            }
            let code = status_code(&got)?;
            if !(200..300).contains(&code) {
                return Err(format!("HTTP {code}"));
            }
            let text = String::from_utf8_lossy(&got);
            match text.split_once("\r\n\r\n").or_else(|| text.split_once("\n\n")) {
                Some((_, body)) => body.to_string(),
                None => return Err("an HTTP answer without a body".to_string()),
            }
        }
    };
    if text.is_empty() {
        return Err("closed without a line".to_string());
    }
    Ok(text.lines().next().unwrap_or_default().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    fn check(path: Option<&str>) -> AgentCheck {
        AgentCheck { port: 0, path: path.map(str::to_string), interval: Duration::from_secs(1), timeout: Duration::from_millis(300) }
    }

    /// A one-shot server on loopback: reads the request first when `http`, then writes `answer`.
    fn once(answer: &'static str, http: bool) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            if http {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
            }
            let _ = s.write_all(answer.as_bytes());
        });
        addr
    }

    #[test]
    fn an_agent_is_read_over_tcp_and_http() {
        assert_eq!(ask(once("75%\nmore\n", false), &check(None)), Ok("75%".to_string()));
        assert_eq!(ask(once("drain", false), &check(None)), Ok("drain".to_string()), "a line without its newline, then EOF");
        let ok = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nready 40%\n";
        assert_eq!(ask(once(ok, true), &check(Some("/load"))), Ok("ready 40%".to_string()));
        assert_eq!(ask(once("HTTP/1.0 503 Busy\r\n\r\n10%\n", true), &check(Some("/load"))), Err("HTTP 503".to_string()));
        assert_eq!(ask(once("", false), &check(None)), Err("closed without a line".to_string()));
        let long: &'static str = Box::leak(format!("{}75%", "x".repeat(5000)).into_boxed_str());
        assert_eq!(ask(once(long, false), &check(None)), Err("a line longer than 4096 bytes".to_string()), "a cut line is not read as another");
    }

    #[test]
    fn an_agent_that_trickles_times_out_all_the_same() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            for _ in 0..200 {
                if s.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let started = Instant::now();
        assert_eq!(ask(addr, &check(None)), Err("timeout".to_string()));
        assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
    }

    #[test]
    fn a_silent_agent_times_out_within_the_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let started = Instant::now();
        assert_eq!(ask(l.local_addr().expect("addr"), &check(None)), Err("timeout".to_string()));
        assert!(started.elapsed() < Duration::from_millis(900), "{:?}", started.elapsed());
    }

    #[test]
    fn a_flipping_agent_is_logged_when_it_starts_then_once_a_while() {
        let mut log = ChangeLog::default();
        let b1: Key = ("web".to_string(), "b1".to_string());
        let b2: Key = ("web".to_string(), "b2".to_string());
        let t0 = Instant::now();
        // Garbage and good answers in turn, every second for three minutes.
        let mut logged = Vec::new();
        for s in 0..180u64 {
            let kind = if s % 2 == 0 { "garbage" } else { "ok" };
            if let Some(n) = log.admit(&b1, kind, t0 + Duration::from_secs(s)) {
                logged.push((s, kind, n));
            }
        }
        assert_eq!(logged, vec![(0, "garbage", 0), (1, "ok", 0), (60, "garbage", 29), (61, "ok", 29), (120, "garbage", 29), (121, "ok", 29)]);
        // Another backend, and another kind of the same one, are news of their own.
        assert_eq!(log.admit(&b2, "garbage", t0 + Duration::from_secs(150)), Some(0));
        assert_eq!(log.admit(&b1, "failed: timeout", t0 + Duration::from_secs(150)), Some(0));
        assert_eq!(log.admit(&b1, "failed: closed without a line", t0 + Duration::from_secs(151)), Some(0));
        assert_eq!(log.admit(&b1, "failed: timeout", t0 + Duration::from_secs(152)), None);
    }
}
