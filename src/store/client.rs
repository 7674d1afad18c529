//! The calls lb makes to etcd, each tried on every member in turn from the last that answered:
//! a range read, the push transaction, a put, leases, and the watch's stream.

use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

use lb::fleet::StoreUrl;

/// etcd's TLS: its CA, and a client certificate and key when the cluster asks for one.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// The CA of an etcd that serves TLS (as etcdctl's --cacert); with it, lb speaks https to
    /// every member.
    #[arg(long, value_name = "FILE")]
    pub store_cacert: Option<PathBuf>,
    /// A client certificate for an etcd that asks for one (--client-cert-auth), with --store-key.
    #[arg(long, value_name = "FILE", requires = "store_key")]
    pub store_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "store_cert")]
    pub store_key: Option<PathBuf>,
}

/// One key's value as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub mod_revision: u64,
    /// The lease it is bound to (0: none).
    pub lease: i64,
}

/// A range read: the keys and the store's revision they were read at.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub revision: u64,
    pub kvs: Vec<Kv>,
}

impl Snapshot {
    pub fn get(&self, key: &str) -> Option<&Kv> {
        self.kvs.iter().find(|kv| kv.key == key)
    }
}

/// What a push transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    /// Written at this revision.
    Written(u64),
    /// The pool changed after the revision compared against: nothing was written.
    Conflict,
}

/// A client for one etcd cluster.
pub struct Client {
    endpoints: Vec<String>,
    scheme: &'static str,
    agent: ureq::Agent,
    /// The watch's agent: its reads wait as long as a watch may stay quiet.
    watch_agent: ureq::Agent,
    /// The member that answered last.
    preferred: AtomicUsize,
}

/// How long a watch may stay quiet before it is opened again (from the revision it reached).
pub const WATCH_IDLE: Duration = Duration::from_secs(30);

impl Client {
    /// `timeout` bounds each call to one member (connecting, sending and reading).
    pub fn new(url: &StoreUrl, tls: &TlsArgs, timeout: Duration) -> Result<Client> {
        let mut agent = ureq::AgentBuilder::new().timeout_connect(timeout.min(Duration::from_secs(2))).timeout(timeout);
        let mut watch_agent = ureq::AgentBuilder::new().timeout_connect(timeout.min(Duration::from_secs(2))).timeout_read(WATCH_IDLE);
        let scheme = match &tls.store_cacert {
            Some(ca) => {
                let config = super::tls::config(ca, tls.store_cert.as_deref(), tls.store_key.as_deref())?;
                agent = agent.tls_config(config.clone());
                watch_agent = watch_agent.tls_config(config);
                "https"
            }
            None if tls.store_cert.is_some() => bail!("--store-cert needs --store-cacert (etcd's CA)"),
            None => "http",
        };
        Ok(Client { endpoints: url.endpoints.clone(), scheme, agent: agent.build(), watch_agent: watch_agent.build(), preferred: AtomicUsize::new(0) })
    }

    /// POSTs `body` to `path` with `agent` on each member in turn, from the last that answered,
    /// until one answers; returns the answer and the member. An error answer of etcd's (a failed
    /// precondition, an unknown lease) is returned as it is, without trying others.
    fn post(&self, agent: &ureq::Agent, path: &str, body: &str) -> Result<(ureq::Response, &str)> {
        let mut errors = Vec::new();
        let first = self.preferred.load(Ordering::Relaxed);
        for i in 0..self.endpoints.len() {
            let at = (first + i) % self.endpoints.len();
            let member = self.endpoints[at].as_str();
            match agent.post(&format!("{}://{member}{path}", self.scheme)).set("content-type", "application/json").send_string(body) {
                Ok(resp) => {
                    self.preferred.store(at, Ordering::Relaxed);
                    return Ok((resp, member));
                }
                // 5xx, or 429 (too many requests): this member cannot serve now (no leader, a
                // timeout, overload): the next may.
                Err(ureq::Error::Status(code, resp)) if code < 500 && code != 429 => return Err(anyhow!("{member}: {}", etcd_error(code, resp))),
                Err(ureq::Error::Status(code, resp)) => errors.push(format!("{member}: {}", etcd_error(code, resp))),
                Err(ureq::Error::Transport(t)) => errors.push(format!("{member}: {}", transport_text(&t))),
            }
        }
        Err(anyhow!("no member of the store answered ({})", errors.join("; ")))
    }

    /// One call: `body` to `path`, the JSON answer.
    fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let (resp, member) = self.post(&self.agent, path, &body.to_string())?;
        let mut text = String::new();
        resp.into_reader().take(64 << 20).read_to_string(&mut text)?;
        serde_json::from_str(&text).map_err(|e| anyhow!("{member}: an answer that is not JSON: {e}"))
    }

    /// Every key from `key` up to `end` (exclusive), at one revision.
    pub fn range(&self, key: &str, end: &str) -> Result<Snapshot> {
        self.range_at(key, end, 0)
    }

    /// The same as the store held it at `revision` (0: now), from its history; an error when
    /// that revision is compacted away.
    pub fn range_at(&self, key: &str, end: &str, revision: u64) -> Result<Snapshot> {
        let mut body = json!({"key": B64.encode(key), "range_end": B64.encode(end)});
        if revision > 0 {
            body["revision"] = json!(revision.to_string());
        }
        let v = self.call("/v3/kv/range", &body)?;
        let revision = num(&v["header"]["revision"]);
        let kvs = v["kvs"].as_array().map(|a| a.iter().filter_map(kv_of).collect()).unwrap_or_default();
        Ok(Snapshot { revision, kvs })
    }

    /// Writes `pool` at the URL's key and, in the same transaction, what it replaces at the
    /// previous key (`replaced`: the pool read at `base`, or nothing when the key was empty,
    /// which deletes the previous key), only if the pool key is still as read: modified last
    /// at `base` (0: absent).
    pub fn push(&self, url: &StoreUrl, pool: &[u8], base: u64, replaced: Option<&[u8]>) -> Result<Pushed> {
        let key = B64.encode(&url.key);
        let compare = if base == 0 {
            json!({"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"})
        } else {
            json!({"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": base.to_string()})
        };
        let previous = B64.encode(url.previous_key());
        let second = match replaced {
            Some(old) => json!({"request_put": {"key": previous, "value": B64.encode(old)}}),
            None => json!({"request_delete_range": {"key": previous}}),
        };
        let v = self.call(
            "/v3/kv/txn",
            &json!({
                "compare": [compare],
                "success": [{"request_put": {"key": key, "value": B64.encode(pool)}}, second],
            }),
        )?;
        // proto3's JSON leaves out a false: no `succeeded` is a compare that failed.
        if v["succeeded"].as_bool() == Some(true) {
            Ok(Pushed::Written(num(&v["header"]["revision"])))
        } else {
            Ok(Pushed::Conflict)
        }
    }

    /// Puts `value` at `key`, bound to `lease` (0: none).
    pub fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<u64> {
        let mut body = json!({"key": B64.encode(key), "value": B64.encode(value)});
        if lease != 0 {
            body["lease"] = json!(lease.to_string());
        }
        let v = self.call("/v3/kv/put", &body)?;
        Ok(num(&v["header"]["revision"]))
    }

    /// A new lease of `ttl`; its ID.
    pub fn grant(&self, ttl: Duration) -> Result<i64> {
        let v = self.call("/v3/lease/grant", &json!({"TTL": ttl.as_secs().max(1).to_string()}))?;
        let id = v["ID"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
        if id == 0 {
            bail!("the store granted no lease: {v}");
        }
        Ok(id)
    }

    /// Keeps `lease` alive; false when it has expired (its keys are gone).
    pub fn keep_alive(&self, lease: i64) -> Result<bool> {
        let v = self.call("/v3/lease/keepalive", &json!({"ID": lease.to_string()}))?;
        Ok(num(&v["result"]["TTL"]) > 0)
    }

    /// Ends `lease` and deletes its keys.
    pub fn revoke(&self, lease: i64) -> Result<()> {
        self.call("/v3/lease/revoke", &json!({"ID": lease.to_string()})).map(|_| ())
    }

    /// Opens a watch on `key`..`end` from `revision`: the answers, one JSON object each, as the
    /// store sends them.
    pub fn watch(&self, key: &str, end: &str, revision: u64) -> Result<Watch> {
        let body = json!({"create_request": {"key": B64.encode(key), "range_end": B64.encode(end), "start_revision": revision.to_string()}});
        let (resp, member) = self.post(&self.watch_agent, "/v3/watch", &body.to_string())?;
        let stream = serde_json::Deserializer::from_reader(resp.into_reader()).into_iter::<Value>();
        Ok(Watch { stream: Box::new(stream), member: member.to_string() })
    }
}

/// One key's change, as a watch reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub key: String,
    /// None: deleted.
    pub value: Option<Vec<u8>>,
    pub revision: u64,
    pub lease: i64,
}

/// An open watch.
pub struct Watch {
    stream: Box<dyn Iterator<Item = serde_json::Result<Value>> + Send>,
    /// The member it reads from.
    pub member: String,
}

/// One answer of a watch.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchAnswer {
    /// The watch is open.
    Created,
    /// Changes, each a key with its new value (None: deleted), the revision that made it and
    /// the lease the key is bound to (0: none).
    Events(Vec<Change>),
    /// The store ended the watch (its start was compacted away, or it was cancelled): read the
    /// whole range again.
    Ended(String),
}

impl Watch {
    /// The next answer; an error when the stream broke or stayed quiet for WATCH_IDLE.
    pub fn next(&mut self) -> Result<WatchAnswer> {
        let v = match self.stream.next() {
            Some(Ok(v)) => v,
            Some(Err(e)) => bail!("{}: the watch broke: {e}", self.member),
            None => bail!("{}: the watch ended", self.member),
        };
        if let Some(e) = v.get("error") {
            bail!("{}: {}", self.member, e["message"].as_str().unwrap_or("an error"));
        }
        let r = &v["result"];
        if r["canceled"].as_bool() == Some(true) || num(&r["compact_revision"]) > 0 {
            let why = r["cancel_reason"].as_str().filter(|s| !s.is_empty()).map_or_else(|| format!("compacted at revision {}", num(&r["compact_revision"])), str::to_string);
            return Ok(WatchAnswer::Ended(why));
        }
        let events: Vec<_> = r["events"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| {
                        let kv = &e["kv"];
                        let key = String::from_utf8(B64.decode(kv["key"].as_str()?).ok()?).ok()?;
                        let deleted = e["type"].as_str() == Some("DELETE");
                        let value = if deleted { None } else { Some(kv["value"].as_str().map_or(Ok(Vec::new()), |s| B64.decode(s)).ok()?) };
                        Some(Change { key, value, revision: num(&kv["mod_revision"]), lease: num(&kv["lease"]) as i64 })
                    })
                    .collect()
            })
            .unwrap_or_default();
        if events.is_empty() {
            return Ok(WatchAnswer::Created);
        }
        Ok(WatchAnswer::Events(events))
    }
}

/// proto3's JSON writes 64-bit numbers as strings, and leaves zeros out.
fn num(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

fn kv_of(v: &Value) -> Option<Kv> {
    let key = String::from_utf8(B64.decode(v["key"].as_str()?).ok()?).ok()?;
    let value = v["value"].as_str().map_or(Ok(Vec::new()), |s| B64.decode(s)).ok()?;
    Some(Kv { key, value, mod_revision: num(&v["mod_revision"]), lease: num(&v["lease"]) as i64 })
}

/// etcd's own words for an error answer.
fn etcd_error(code: u16, resp: ureq::Response) -> String {
    let mut body = String::new();
    let _ = resp.into_reader().take(64 << 10).read_to_string(&mut body);
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    match v["message"].as_str().or(v["error"].as_str()) {
        Some(m) => format!("HTTP {code}: {m}"),
        None => format!("HTTP {code}"),
    }
}

/// A transport error without the URL ureq puts in it (the member is named already).
fn transport_text(t: &ureq::Transport) -> String {
    let kind = t.kind().to_string();
    match t.message() {
        Some(m) => format!("{kind}: {m}"),
        None => match std::error::Error::source(t) {
            Some(s) => format!("{kind}: {s}"),
            None => kind,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A real etcd on free loopback ports (scripts/setup.sh test installs it), for as long as
    /// the guard lives.
    struct Etcd(std::process::Child, std::path::PathBuf, u16);

    impl Drop for Etcd {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }

    fn etcd() -> Etcd {
        let port = || std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port");
        let (client, peer) = (port(), port());
        let dir = std::env::temp_dir().join(format!("lb-client-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(&dir)
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}"), "--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}"), "--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("t=http://127.0.0.1:{peer}"), "--log-level", "error", "--logger", "zap"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd is installed (scripts/setup.sh test installs etcd-server)");
        Etcd(child, dir, client)
    }

    #[test]
    fn the_push_transaction_holds_only_against_the_revision_it_read() {
        let e = etcd();
        let url = StoreUrl::parse(&format!("etcd://127.0.0.1:{}/lb/pool", e.2)).expect("url");
        let c = Client::new(&url, &TlsArgs::default(), Duration::from_secs(2)).expect("client");
        let started = std::time::Instant::now();
        while c.range(&url.key, &url.range_end()).is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "etcd did not answer");
            std::thread::sleep(Duration::from_millis(100));
        }
        // The first pool: only while the key is absent.
        let Pushed::Written(r1) = c.push(&url, b"one", 0, None).expect("push") else { panic!("the first push conflicted") };
        assert_eq!(c.push(&url, b"two", 0, None).expect("push"), Pushed::Conflict, "the key exists now");
        // Against the revision read: written with the pool it replaces; a stale base: nothing.
        let Pushed::Written(r2) = c.push(&url, b"two", r1, Some(b"one")).expect("push") else { panic!("conflict at the right base") };
        assert_eq!(c.push(&url, b"three", r1, Some(b"two")).expect("push"), Pushed::Conflict, "a push from a stale base");
        let snap = c.range(&url.key, &url.range_end()).expect("range");
        assert_eq!(snap.get(&url.key).map(|kv| (kv.value.as_slice(), kv.mod_revision)), Some((&b"two"[..], r2)));
        assert_eq!(snap.get(&url.previous_key()).map(|kv| kv.value.as_slice()), Some(&b"one"[..]), "the pool it replaced, in the same revision");
        assert_eq!(snap.get(&url.previous_key()).map(|kv| kv.mod_revision), Some(r2));
        // A view under a lease: gone once the lease is revoked.
        let lease = c.grant(Duration::from_secs(5)).expect("grant");
        c.put(&url.node_key("a"), b"{}", lease).expect("put");
        assert_eq!(c.range(&url.key, &url.range_end()).expect("range").get(&url.node_key("a")).map(|kv| kv.lease), Some(lease));
        assert!(c.keep_alive(lease).expect("keep alive"));
        c.revoke(lease).expect("revoke");
        assert!(c.range(&url.key, &url.range_end()).expect("range").get(&url.node_key("a")).is_none());
        assert!(!c.keep_alive(lease).unwrap_or(false), "a revoked lease is not alive");
        // The watch reports each change with its revision and lease, from where it is asked to.
        let mut w = c.watch(&url.key, &url.range_end(), r2).expect("watch");
        let mut seen = Vec::new();
        while seen.len() < 2 {
            match w.next().expect("watch answer") {
                WatchAnswer::Events(ev) => seen.extend(ev),
                WatchAnswer::Created => {}
                WatchAnswer::Ended(why) => panic!("ended: {why}"),
            }
        }
        assert_eq!((seen[0].key.as_str(), seen[0].revision, seen[0].value.as_deref()), ("/lb/pool", r2, Some(&b"two"[..])));
        assert_eq!((seen[1].key.as_str(), seen[1].revision), ("/lb/pool/previous", r2));
    }
}
