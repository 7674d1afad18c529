//! `lb push` and `lb fleet` against a real etcd (Debian's etcd-server, `scripts/setup.sh test`)
//! on loopback, and the errors of a store URL: no root needed. The fleet itself, with nodes,
//! routers and backends, is the end-to-end test (scripts/e2e/store.sh).

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// One etcd member on free loopback ports, killed and its data removed when dropped.
struct Etcd {
    child: Child,
    dir: std::path::PathBuf,
    url: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl Etcd {
    fn start(name: &str) -> Etcd {
        Etcd::start_with(name, "http", &[], &[])
    }

    /// `scheme` for its client URLs, `etcd_args` for etcd, `lb_args` for the `lb fleet` that
    /// waits until it answers.
    fn start_with(name: &str, scheme: &str, etcd_args: &[String], lb_args: &[&str]) -> Etcd {
        let (client, peer) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("lb-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(&dir)
            .args(etcd_args)
            .args(["--listen-client-urls", &format!("{scheme}://127.0.0.1:{client}"), "--advertise-client-urls", &format!("{scheme}://127.0.0.1:{client}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}"), "--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("t=http://127.0.0.1:{peer}"), "--log-level", "error", "--logger", "zap"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd is installed (scripts/setup.sh test installs etcd-server)");
        let etcd = Etcd { child, dir, url: format!("etcd://127.0.0.1:{client}/lb/pool") };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Listening is not serving yet: until a read answers.
        let mut args = vec!["fleet", etcd.url.as_str(), "--json"];
        args.extend_from_slice(lb_args);
        while !lb(&args).stdout.starts_with(b"{") {
            assert!(started.elapsed() < Duration::from_secs(20), "etcd did not answer");
            std::thread::sleep(Duration::from_millis(100));
        }
        etcd
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn lb(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lb")).args(args).output().expect("run lb")
}

fn pool(dir: &Path, name: &str, backends: &str) -> String {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).expect("create");
    writeln!(f, "services:\n  - {{name: web, vip: 10.99.0.100, port: 80, backends: [{backends}]}}").expect("write");
    path.to_str().expect("utf-8").to_string()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

#[test]
fn a_push_writes_the_pool_and_the_one_it_replaces_and_a_racing_push_writes_nothing() {
    let etcd = Etcd::start("push");
    let dir = etcd.dir.with_extension("pools");
    std::fs::create_dir_all(&dir).expect("dir");
    let p1 = pool(&dir, "p1.yaml", "10.1.0.1, 10.1.0.2");
    let first = json(&lb(&["push", &p1, "--to", &etcd.url, "--json"]));
    assert_eq!((first["base_revision"].as_u64(), first["conflict"].as_bool()), (Some(0), Some(false)), "{first}");
    let r1 = first["revision"].as_u64().expect("written");

    // A dry run writes nothing; the same pool again writes nothing (the previous pool stays).
    let p2 = pool(&dir, "p2.yaml", "10.1.0.1, 10.1.0.2, 10.1.0.3");
    let dry = json(&lb(&["push", &p2, "--to", &etcd.url, "--dry-run", "--json"]));
    assert_eq!((dry["base_revision"].as_u64(), dry["revision"].as_u64()), (Some(r1), None), "{dry}");
    assert!(dry["diff"]["services"][0]["moved"].as_u64().unwrap_or(0) > 0, "the dry run shows what moves: {dry}");
    let again = json(&lb(&["push", &p1, "--to", &etcd.url, "--json"]));
    assert_eq!((again["unchanged"].as_bool(), again["revision"].as_u64()), (Some(true), None), "{again}");
    assert_eq!(json(&lb(&["fleet", &etcd.url, "--json"]))["pool_revision"].as_u64(), Some(r1), "a dry run and an unchanged pool write nothing");

    // Many pushes from one base at once: exactly one lands each time.
    let mut base = r1;
    for round in 0..5 {
        let pools: Vec<String> = (0..3).map(|i| pool(&dir, &format!("r{round}-{i}.yaml"), &format!("10.1.0.1, 10.2.{round}.{i}"))).collect();
        let base_text = base.to_string();
        let outs: Vec<Output> = std::thread::scope(|s| {
            let handles: Vec<_> = pools.iter().map(|p| s.spawn(|| lb(&["push", p, "--to", &etcd.url, "--expect-revision", &base_text, "--json"]))).collect();
            handles.into_iter().map(|h| h.join().expect("push")).collect()
        });
        let landed: Vec<&Output> = outs.iter().filter(|o| o.status.success()).collect();
        assert_eq!(landed.len(), 1, "round {round}: {:?}", outs.iter().map(|o| String::from_utf8_lossy(&o.stderr).to_string()).collect::<Vec<_>>());
        for o in outs.iter().filter(|o| !o.status.success()) {
            assert!(String::from_utf8_lossy(&o.stderr).contains("conflict"), "{}", String::from_utf8_lossy(&o.stderr));
            assert_eq!(json(o)["conflict"].as_bool(), Some(true), "--json says so too");
        }
        base = json(landed[0])["revision"].as_u64().expect("written");
    }

    // The store holds the last pool and, beside it, the one it replaced.
    let fleet = json(&lb(&["fleet", &etcd.url, "--json"]));
    assert_eq!(fleet["pool_revision"].as_u64(), Some(base), "{fleet}");
    assert_eq!(fleet["agree"].as_bool(), Some(false), "no node is live: {fleet}");
    let endpoint = etcd.url.trim_start_matches("etcd://").trim_end_matches("/lb/pool").to_string();
    let get = |key: &str| {
        let o = Command::new("etcdctl").args(["--endpoints", &endpoint, "get", key, "--print-value-only"]).output().expect("etcdctl (etcd-client)");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let (now, before) = (get("/lb/pool"), get("/lb/pool/previous"));
    assert!(now.contains("10.2.4.") && before.contains("10.2.3."), "the last round's pool and the one before it: {now} / {before}");

    // A pool written by hand that no node could serve is no previous pool: the next push
    // replaces it, and the previous pool is the one before it, which nodes served.
    let mut put = Command::new("etcdctl").args(["--endpoints", &endpoint, "put", "/lb/pool"]).stdin(Stdio::piped()).stdout(Stdio::null()).spawn().expect("etcdctl");
    put.stdin.take().expect("stdin").write_all(b"services: [nonsense").expect("write");
    assert!(put.wait().expect("etcdctl").success());
    let o = lb(&["push", &p1, "--to", &etcd.url]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("is not valid (no node serves it)"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(get("/lb/pool/previous"), now, "the previous pool is the last one nodes could serve, not the hand-written one");
    assert_ne!(now, before);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pool_that_names_a_previous_file_is_refused_before_the_store_is_asked() {
    let dir = std::env::temp_dir().join(format!("lb-store-prev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let p = pool(&dir, "old.yaml", "10.1.0.1");
    let text = format!("previous: old.yaml\n{}", std::fs::read_to_string(&p).expect("read"));
    std::fs::write(dir.join("new.yaml"), text).expect("write");
    // Port 9 on loopback: nothing answers there, and nothing is asked.
    let o = lb(&["push", dir.join("new.yaml").to_str().expect("utf-8"), "--to", "etcd://127.0.0.1:9/lb/pool"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("new.yaml:1:11: previous: the store keeps the pool"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn store_urls_and_unreachable_stores_fail_clearly() {
    for (url, says) in [
        ("etcd://127.0.0.1:9", "no key"),
        ("etcd://127.0.0.1/lb", "is not HOST:PORT"),
        ("etcd://root:secret@127.0.0.1:9/lb", "client certificates"),
    ] {
        let o = lb(&["fleet", url]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{url}: {err}");
        assert!(err.contains(says) && !err.contains("secret"), "{url}: {err}");
    }
    let o = lb(&["fleet", "etcd://127.0.0.1:9,127.0.0.1:10/lb/pool"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("no member of the store answered (127.0.0.1:9: ") && err.contains("127.0.0.1:10: "), "{err}");
    // lb attach reads the URL before anything else: no root needed to see it refused.
    let o = lb(&["attach", "lo", "--config", "etcd://127.0.0.1:9"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--config: \"etcd://127.0.0.1:9\": no key"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = lb(&["fleet", "etcd://127.0.0.1:9/lb", "--store-cert", "/nonexistent"]);
    assert_eq!(o.status.code(), Some(2), "--store-cert needs --store-key: {}", String::from_utf8_lossy(&o.stderr));
}

/// openssl ARGS in `dir`.
fn openssl(dir: &Path, args: &str) {
    let o = Command::new("openssl").current_dir(dir).args(args.split_whitespace()).output().expect("openssl is installed (scripts/setup.sh test)");
    assert!(o.status.success(), "openssl {args}: {}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_store_that_wants_client_certificates_gets_them_and_nothing_secret_is_printed() {
    let dir = std::env::temp_dir().join(format!("lb-store-certs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    // A CA, the member's certificate for 127.0.0.1, a client's, and a CA nobody uses.
    openssl(&dir, "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=lb-test-ca -keyout ca.key -out ca.pem");
    openssl(&dir, "req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=other-ca -keyout other.key -out other.pem");
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n").expect("ext");
    for who in ["server", "client"] {
        openssl(&dir, &format!("req -newkey rsa:2048 -nodes -subj /CN={who} -keyout {who}.key -out {who}.csr"));
        openssl(&dir, &format!("x509 -req -in {who}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile san.ext -out {who}.pem"));
    }
    let path = |f: &str| dir.join(f).to_str().expect("utf-8").to_string();
    let (ca, cert, key) = (path("ca.pem"), path("client.pem"), path("client.key"));
    let tls = ["--store-cacert", ca.as_str(), "--store-cert", cert.as_str(), "--store-key", key.as_str()];
    let etcd_args: Vec<String> = ["--cert-file", &path("server.pem"), "--key-file", &path("server.key"), "--client-cert-auth", "--trusted-ca-file", &ca]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let etcd = Etcd::start_with("tls", "https", &etcd_args, &tls);
    let p = pool(&dir, "p.yaml", "10.1.0.1");

    let mut args = vec!["push", p.as_str(), "--to", etcd.url.as_str(), "--json"];
    args.extend_from_slice(&tls);
    let o = lb(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(json(&o)["revision"].as_u64().is_some());

    // Without a client certificate, over plain HTTP, and trusting another CA: refused, and said.
    let key_text = std::fs::read_to_string(dir.join("client.key")).expect("key");
    let secret = key_text.lines().nth(1).expect("a key line");
    for (what, extra) in [
        ("no client certificate", vec!["--store-cacert", ca.as_str()]),
        ("plain HTTP", vec![]),
        ("another CA", vec!["--store-cacert", path("other.pem").leak(), "--store-cert", cert.as_str(), "--store-key", key.as_str()]),
    ] {
        let mut args = vec!["fleet", etcd.url.as_str()];
        args.extend_from_slice(&extra);
        let o = lb(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("no member of the store answered"), "{what}: {err}");
        assert!(!err.contains(secret), "{what}: the key leaked: {err}");
    }
    // A key file that is not a key: named, its content never printed.
    std::fs::write(dir.join("bad.key"), "not a key but a secret-looking line\n").expect("write");
    let bad = path("bad.key");
    let o = lb(&["fleet", etcd.url.as_str(), "--store-cacert", ca.as_str(), "--store-cert", cert.as_str(), "--store-key", bad.as_str()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.key: not a PEM private key") && !err.contains("secret-looking"), "{err}");
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
}
