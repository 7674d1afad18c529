//! Helpers for the root tests: network namespaces that remove themselves, and `lb attach`
//! processes that are always stopped. Every name carries the test process's id, so parallel tests
//! and parallel runs never meet.
#![allow(dead_code)]

pub mod packet;
pub mod rng;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

pub fn require_root() {
    assert!(nix::unistd::geteuid().is_root(), "root_* tests need root (CAP_BPF, CAP_NET_ADMIN)");
}

/// Runs a command, failing the test with its output if it fails.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().expect("spawn");
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A network namespace, deleted (with every link inside it) when dropped.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(role: &str) -> Netns {
        let name = format!("lbt{}-{}-{role}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n NAME ...`
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// A command inside the namespace.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Whether `dev` has an XDP program attached.
    pub fn has_xdp(&self, dev: &str) -> bool {
        let out = self.ip(&["-d", "link", "show", "dev", dev]);
        out.contains("prog/xdp") || out.contains(" xdp")
    }

    pub fn mac(&self, dev: &str) -> String {
        let out = self.ip(&["link", "show", "dev", dev]);
        out.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).unwrap_or_default().to_string()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// The load balancer's namespace with `lbv0` (10.77.0.1/24, and the VIP 10.77.0.100) wired to a
/// backend namespace's `lbv1` (10.77.0.11/24, and fd77::11/64 on fd77::1/64).
pub struct Pair {
    pub lb: Netns,
    pub be: Netns,
}

pub fn pair() -> Pair {
    require_root();
    let lb = Netns::new("lb");
    let be = Netns::new("be");
    sh(&["ip", "link", "add", "lbv0", "netns", &lb.name, "type", "veth", "peer", "name", "lbv1", "netns", &be.name]);
    // lb balances only frames addressed to its interface: the test frames (packet::IFMAC) are.
    lb.ip(&["link", "set", "lbv0", "address", "02:00:00:00:00:01"]);
    lb.ip(&["addr", "add", "10.77.0.1/24", "dev", "lbv0"]);
    lb.ip(&["addr", "add", "10.77.0.100/32", "dev", "lbv0"]);
    lb.ip(&["addr", "add", "fd77::1/64", "dev", "lbv0", "nodad"]);
    lb.ip(&["link", "set", "lbv0", "up"]);
    be.ip(&["addr", "add", "10.77.0.11/24", "dev", "lbv1"]);
    be.ip(&["addr", "add", "fd77::11/64", "dev", "lbv1", "nodad"]);
    be.ip(&["link", "set", "lbv1", "up"]);
    Pair { lb, be }
}

/// Gives the backends 10.77.0.21..=39 static neighbour entries in `p`'s load balancer
/// namespace, with MAC 02:00:00:00:00:NN ([`static_backend_mac`]).
pub fn static_backends(p: &Pair) {
    for n in 21..=39 {
        p.lb.ip(&["neigh", "replace", &format!("10.77.0.{n}"), "lladdr", &format!("02:00:00:00:00:{n}"), "dev", "lbv0", "nud", "permanent"]);
    }
}

/// The MAC [`static_backends`] gives a backend: 02:00:00:00:00:NN, NN its last octet's decimal
/// digits read as hex.
pub fn static_backend_mac(addr: std::net::IpAddr) -> [u8; 6] {
    match addr {
        std::net::IpAddr::V4(a) => [2, 0, 0, 0, 0, u8::from_str_radix(&a.octets()[3].to_string(), 16).unwrap_or(0)],
        std::net::IpAddr::V6(_) => [0; 6],
    }
}

pub fn write_config(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write config");
    p
}

/// A scratch directory, removed when dropped (a failing test included).
pub struct TempDir(std::path::PathBuf);

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn temp_dir() -> TempDir {
    let d = std::env::temp_dir().join(format!("lbt{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&d).expect("temp dir");
    TempDir(d)
}

pub const LB: &str = env!("CARGO_BIN_EXE_lb");

/// `lb ...` inside a namespace, run to completion with a time bound.
pub fn lb_run(ns: &Netns, args: &[&str]) -> Output {
    let mut child = ns.cmd(LB).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn lb");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("lb {args:?} did not finish in 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `lb attach`, killed when dropped. Its stderr and stdout lines arrive on channels.
pub struct Running {
    pub child: Child,
    pub stderr: Receiver<String>,
    pub stdout: Receiver<String>,
    pub seen: Vec<String>,
}

fn lines(r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Running {
    pub fn start(ns: &Netns, args: &[&str]) -> Running {
        let mut child = ns.cmd(LB).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn lb");
        let stderr = lines(child.stderr.take().expect("stderr"));
        let stdout = lines(child.stdout.take().expect("stdout"));
        Running { child, stderr, stdout, seen: Vec::new() }
    }

    /// Waits for a stderr line containing `needle`; returns it. Panics with everything seen.
    pub fn wait_for(&mut self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        panic!("no stderr line containing {needle:?} within {within:?}; saw:\n{}", self.seen.join("\n"));
    }

    /// Waits for a stdout line containing `needle`.
    pub fn wait_stdout(&mut self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.stdout.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => seen.push(line),
                Err(_) => break,
            }
        }
        panic!("no stdout line containing {needle:?} within {within:?}; saw:\n{}", seen.join("\n"));
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        // `ip netns exec` execs lb, so the child's pid is lb's.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig);
    }

    /// Waits for the process to end, within a bound.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                // Collect what it said last.
                while let Ok(line) = self.stderr.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(line);
                }
                return st;
            }
            assert!(Instant::now() < deadline, "lb did not exit within {within:?}; saw:\n{}", self.seen.join("\n"));
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The XDP program id from the "attached to" line.
    pub fn prog_id(line: &str) -> u32 {
        line.split("program id ").nth(1).and_then(|r| r.split(',').next()).and_then(|n| n.trim().parse().ok()).expect("program id in line")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running program, seen from outside the process that loaded it: its maps by name, and
/// BPF_PROG_TEST_RUN on it.
pub struct Live {
    prog: libbpf_rs::ProgramHandle,
    maps: std::collections::HashMap<String, libbpf_rs::MapHandle>,
}

impl Live {
    pub fn new(prog_id: u32) -> Live {
        use libbpf_rs::MapCore;
        use std::os::fd::{AsFd, AsRawFd};
        let prog = libbpf_rs::ProgramHandle::from_prog_id(prog_id).expect("program by id");
        // The program's map ids, asked of the kernel (twice: how many, then which).
        let fd = prog.as_fd().as_raw_fd();
        let info_of = |info: &mut libbpf_rs::libbpf_sys::bpf_prog_info| {
            let mut len = std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_prog_info>() as u32;
            // SAFETY: `info` is a writable bpf_prog_info of `len` bytes; of its pointers, only
            // map_ids is set (null, or a buffer of nr_map_ids u32s that outlives the call); the
            // others are zero, which the kernel reads as "not asked for".
            let rc = unsafe { libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(fd, info, &mut len) };
            assert_eq!(rc, 0, "bpf_prog_get_info_by_fd: {}", std::io::Error::last_os_error());
        };
        let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
        info_of(&mut info);
        let mut ids = vec![0u32; info.nr_map_ids as usize];
        info = libbpf_rs::libbpf_sys::bpf_prog_info { nr_map_ids: ids.len() as u32, map_ids: ids.as_mut_ptr() as u64, ..Default::default() };
        info_of(&mut info);
        ids.truncate(info.nr_map_ids as usize);
        let mut maps = std::collections::HashMap::new();
        for id in ids {
            let m = libbpf_rs::MapHandle::from_map_id(id).expect("map by id");
            maps.insert(m.name().to_string_lossy().into_owned(), m);
        }
        Live { prog, maps }
    }

    /// The values of keys `first` to `first + n - 1` of the array map `name`, read in one batch:
    /// one system call, where a lookup a key takes one each (the reload soak reads its tables
    /// after every one of thousands of reloads).
    pub fn array_range(&self, name: &str, first: u32, n: u32) -> Vec<u8> {
        use libbpf_rs::MapCore;
        use std::os::fd::{AsFd, AsRawFd};
        let map = self.map(name);
        assert!(
            map.map_type() == libbpf_rs::MapType::Array && map.key_size() == 4,
            "{name}: array_range reads arrays (u32 keys), not a {:?} with {}-octet keys",
            map.map_type(),
            map.key_size()
        );
        let size = map.value_size() as usize;
        let mut keys = vec![0u32; n as usize];
        let mut values = vec![0u8; n as usize * size];
        let mut count = n;
        // A batch starts after the key in_batch names (none: at the first).
        let mut after = first.wrapping_sub(1);
        let mut next = 0u32;
        let opts = libbpf_rs::libbpf_sys::bpf_map_batch_opts { sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_batch_opts>() as _, ..Default::default() };
        // SAFETY: the map is an array (checked above), so its keys are u32: keys and values have
        // room for `count` keys and values of the map's value size; in_batch is null or a u32
        // key, out_batch a u32 the kernel writes. Everything outlives the call.
        let rc = unsafe {
            libbpf_rs::libbpf_sys::bpf_map_lookup_batch(
                map.as_fd().as_raw_fd(),
                if first == 0 { std::ptr::null_mut() } else { (&mut after as *mut u32).cast() },
                (&mut next as *mut u32).cast(),
                keys.as_mut_ptr().cast(),
                values.as_mut_ptr().cast(),
                &mut count,
                &opts,
            )
        };
        // A batch that reaches the array's end answers ENOENT, with what there was.
        let err = std::io::Error::last_os_error();
        assert!(rc == 0 || err.raw_os_error() == Some(libc::ENOENT), "bpf_map_lookup_batch of {name}: {err}");
        assert_eq!(count, n, "{name}: {count} of {n} values read from key {first}");
        assert_eq!(keys.first().copied().unwrap_or(first), first, "{name}: the batch began elsewhere");
        values
    }

    fn map(&self, name: &str) -> &libbpf_rs::MapHandle {
        self.maps.get(name).unwrap_or_else(|| panic!("no map {name}"))
    }

    /// Every value of map `name`.
    pub fn values(&self, name: &str) -> Vec<Vec<u8>> {
        use libbpf_rs::{MapCore, MapFlags};
        let map = self.map(name);
        map.keys().filter_map(|k| map.lookup(&k, MapFlags::ANY).expect("lookup")).collect()
    }

    /// One BPF_PROG_TEST_RUN: (XDP action, output frame).
    pub fn run(&self, frame: &[u8]) -> (u32, Vec<u8>) {
        use std::os::fd::{AsFd, AsRawFd};
        let mut out = vec![0u8; frame.len() + 256];
        let mut opts = libbpf_rs::libbpf_sys::bpf_test_run_opts {
            sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_test_run_opts>() as _,
            data_in: frame.as_ptr() as *const _,
            data_size_in: frame.len() as u32,
            data_out: out.as_mut_ptr() as *mut _,
            data_size_out: out.len() as u32,
            repeat: 1,
            ..Default::default()
        };
        // SAFETY: data_in/data_out point to live buffers of the sizes given, which outlive the
        // call; the kernel writes at most data_size_out bytes.
        let rc = unsafe { libbpf_rs::libbpf_sys::bpf_prog_test_run_opts(self.prog.as_fd().as_raw_fd(), &mut opts) };
        assert_eq!(rc, 0, "BPF_PROG_TEST_RUN failed");
        out.truncate(opts.data_size_out as usize);
        (opts.retval, out)
    }

    /// The route the program finds for (vip, port, proto): (base, slots, hash mode).
    pub fn route(&self, vip: std::net::IpAddr, port: u16, proto: lb::config::Protocol) -> Option<(u32, u32, u32)> {
        use lb::dataplane::{service_key_bytes, types, value_of, vip_index_of};
        use libbpf_rs::{MapCore, MapFlags};
        let idx = vip_index_of(vip, port, proto);
        let entry = self.map("vip_index").lookup(&idx.to_ne_bytes(), MapFlags::ANY).expect("lookup")?;
        let id = u32::from_ne_bytes(entry[..4].try_into().expect("u32"));
        let key = service_key_bytes(vip, port, proto);
        let value = match id {
            0 => return None,
            id if id == types::lb_vip_index_layout::LB_VIP_INDEX_SHARED.0 => self.map("services").lookup(&key, MapFlags::ANY).expect("lookup")?,
            id => self.map("routes").lookup(&id.to_ne_bytes(), MapFlags::ANY).expect("lookup")?,
        };
        let r: types::lb_service = value_of(&value);
        let rkey: types::lb_service_key = value_of(&key);
        if (r.key.addr, r.key.port, r.key.proto, r.key.family) != (rkey.addr, rkey.port, rkey.proto, rkey.family) {
            return None;
        }
        Some((r.base, r.slots, r.hash_mode))
    }

    /// The backend MAC of every slot of the table the program uses for (vip, port, proto).
    pub fn table(&self, vip: std::net::IpAddr, port: u16, proto: lb::config::Protocol) -> Option<Vec<Option<[u8; 6]>>> {
        use libbpf_rs::{MapCore, MapFlags};
        let (base, slots, _) = self.route(vip, port, proto)?;
        let mut macs = std::collections::HashMap::new();
        let mut out = Vec::with_capacity(slots as usize);
        // The slots, 4 bytes each, two to a value of table_slots.
        let words = if slots == 0 { Vec::new() } else { self.array_range("table_slots", base / 2, (base + slots - 1) / 2 - base / 2 + 1) };
        for s in base..base + slots {
            let at = (s - base / 2 * 2) as usize * 4;
            // A slot's word: the backend id, and its state bits above (lb.h, lb_slot_bits).
            let id = u32::from_ne_bytes(words[at..at + 4].try_into().expect("u32")) & lb::dataplane::types::lb_slot_bits::LB_SLOT_ID_MASK.0;
            let mac = *macs.entry(id).or_insert_with(|| {
                let rec = self.map("backends").lookup(&id.to_ne_bytes(), MapFlags::ANY).expect("lookup").expect("record");
                (id != 0 && rec[6] & 1 == 1).then(|| rec[..6].try_into().expect("mac"))
            });
            out.push(mac);
        }
        Some(out)
    }
}

/// Whether the program `prog_id` serves exactly `pool`, table by table, slot by slot, as the
/// builder computes it (`mac` gives each backend's MAC); services named in `skip` are not checked.
pub fn serves(prog_id: u32, pool: &lb::config::Pool, mac: &dyn Fn(std::net::IpAddr) -> [u8; 6], skip: &[&str]) -> Result<(), String> {
    serves_live(&Live::new(prog_id), pool, mac, skip)
}

/// `serves`, on a program already opened: for a test that asks again and again of one program.
pub fn serves_live(live: &Live, pool: &lb::config::Pool, mac: &dyn Fn(std::net::IpAddr) -> [u8; 6], skip: &[&str]) -> Result<(), String> {
    use lb::table;
    for s in pool.services.iter().filter(|s| !skip.contains(&s.name.as_str())) {
        let t = table::build_service(s);
        let want: Vec<Option<[u8; 6]>> = t.owners().iter().map(|&o| (o != table::EMPTY).then(|| mac(s.backends[o as usize].address))).collect();
        if want.iter().all(Option::is_none) {
            // No backend with weight: the route says 0 slots and its packets are dropped.
            match live.route(s.vip, s.port, s.protocol) {
                Some((_, 0, _)) => continue,
                other => return Err(format!("{}: an empty service's route is {other:?}", s.name)),
            }
        }
        match live.table(s.vip, s.port, s.protocol) {
            Some(got) if got == want => {}
            Some(got) => {
                let diff = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                return Err(format!("{}: {diff} of {} slots differ from the builder's", s.name, want.len()));
            }
            None => return Err(format!("{}: no route", s.name)),
        }
    }
    Ok(())
}

/// A data plane for BPF_PROG_TEST_RUN with `pool` installed (lb's MAC: packet::IFMAC), a flow
/// table of `conntrack_size` slots with the guard on or off, and MACs (`mac`) known for
/// 10.99.0.11 to .16, the backends later pools add: the connection-tracking tests' start.
pub fn tracked_plane(pool: &lb::config::Pool, conntrack_size: u32, guard: bool, mac: fn(std::net::IpAddr) -> [u8; 6]) -> lb::balancer::Balancer {
    require_root();
    let mut dp = lb::balancer::Balancer::load_sized(1 << 20, conntrack_size).expect("load");
    dp.set_conntrack_guard(guard).expect("guard");
    let macs = |a: std::net::IpAddr| Some(mac(a));
    dp.install(pool, packet::IFMAC, &macs).expect("install");
    for a in 11..=16u8 {
        let addr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 99, 0, a));
        dp.set_mac(addr, Some(mac(addr))).expect("mac");
    }
    dp
}

/// The MAC the conntrack tests give a backend: 02:cc:00:00:00:<last octet> (IPv6: 02:cc:00:00:06:<last
/// octet>), so a frame's destination MAC names the backend it was sent to.
pub fn backend_mac(a: std::net::IpAddr) -> [u8; 6] {
    match a {
        std::net::IpAddr::V4(v) => [2, 0xcc, 0, 0, 0, v.octets()[3]],
        std::net::IpAddr::V6(v) => [2, 0xcc, 0, 0, 6, v.octets()[15]],
    }
}

/// A pool from YAML text the test knows to be valid.
pub fn pool(text: &str) -> lb::config::Pool {
    lb::config::parse_str("p.yaml", text).expect("valid")
}

/// A bpffs of the test's own at /run/<prefix>-<pid>-<n>, for pins that must outlive one
/// `ip netns exec` (see docs/restarts.md); unmounted and removed when dropped.
pub struct Bpffs(pub std::path::PathBuf);

impl Bpffs {
    pub fn new(prefix: &str) -> Bpffs {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let d = std::path::PathBuf::from(format!("/run/{prefix}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&d).expect("mkdir");
        let fs = Bpffs(d);
        sh(&["mount", "-t", "bpf", "bpf", fs.0.to_str().expect("utf-8")]);
        fs
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}
