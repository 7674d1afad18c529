//! The only module that talks to the kernel: loads the XDP program's skeleton and sizes and sets
//! it up (here), executes the planner's operations on its maps (`write`), encodes what crosses
//! the boundary (`encode`), reuses a pinned plane's maps across upgrades (`reuse`), reads a
//! live or pinned plane back ([`live`]) and its counters ([`counters`]), attaches it ([`link`])
//! and asks the network stack about routes and neighbours ([`netlink`]).
//!
//! It uses the core's types as data (the operations to execute, the routes and live maps it
//! reads back) but never drives the core: building tables and planning a change is the job of
//! the balancer (`lb::balancer`, which holds a data plane), and it hands the operations here.

pub mod btf;
pub mod counters;
pub mod decap;
mod encode;
mod mapped;
pub mod link;
pub mod live;
pub mod identity;
pub mod netlink;
pub mod pin;
pub mod probe_path;
mod quic;
mod reuse;
pub mod slot_marks;
mod write;

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::MapCore;

#[allow(clippy::all, dead_code, non_camel_case_types, non_snake_case, non_upper_case_globals)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/lb.skel.rs"));
}

/// The benchmarks' floor program (crates/dataplane/src/bpf/floor.bpf.c): what the cheapest XDP program costs on
/// this machine, the baseline every benchmark's ratios are measured against.
#[allow(clippy::all, dead_code, non_camel_case_types, non_snake_case, non_upper_case_globals)]
pub mod floor {
    include!(concat!(env!("OUT_DIR"), "/floor.skel.rs"));
}

/// The end-to-end tests' traffic generator (crates/dataplane/src/bpf/trafgen.bpf.c): frames of many flows sent
/// from XDP, faster than any socket can.
#[allow(clippy::all, dead_code, non_camel_case_types, non_snake_case, non_upper_case_globals)]
pub mod trafgen {
    include!(concat!(env!("OUT_DIR"), "/trafgen.skel.rs"));
}

pub use counters::CounterMaps;
pub use encode::{addr_words, name_text, service_key_bytes, value_of, vip_index_of};
pub use live::{MapSource, PinnedMaps, Sizes};
pub use reuse::{layout_hash, program_hash, Reuse, LAYOUT_HASH, PINNED_MAPS, PROGRAM_HASH};
pub use skel::types;
use skel::{LbSkel, LbSkelBuilder};
use mapped::SlotsMapping;

/// The default size of the table_slots array: 4 Mi slots, 16 MiB (4 bytes a slot), room for 64 services at the
/// default 65537 slots (or 2 at the largest size) with as much again free for tables that are
/// being replaced.
pub const DEFAULT_TABLE_CAPACITY: u32 = 1 << 22;

/// What the verifier said of lb_xdp ([`Dataplane::verifier_steps`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifierStats {
    /// Instructions it walked (the kernel refuses a program past 1,000,000).
    pub steps: u64,
    /// Stack bytes of the program's own frame, then of each function it calls (the kernel
    /// refuses a call chain past 512 in all).
    pub stack: Vec<u32>,
}

/// The loaded program and its maps, and what writing them needs to know beyond what an
/// operation says: the neighbours' MACs and the backends' counter generations.
pub struct Dataplane {
    skel: LbSkel<'static>,
    /// The table_slots array, mapped into this process.
    slots: SlotsMapping,
    /// The table_hops array, likewise (a slot's two hops as one 4-byte word).
    hops: SlotsMapping,
    /// The flow tables and their records, mapped for the sweep of unstable slots.
    flow_maps: slot_marks::FlowMaps,
    /// Each neighbour's MAC, when known: a backend's own (l2, or encapsulated on the link) or
    /// its next hop's.
    macs: HashMap<IpAddr, [u8; 6]>,
    /// The neighbour that frames to a backend address go to, where it is not the backend itself
    /// (an encapsulated backend behind a router).
    via: HashMap<IpAddr, IpAddr>,
    /// Each backend id's generation (see lb.h, struct lb_flow).
    gens: HashMap<u32, u32>,
    /// The table words may not carry unstable marks yet (crates/dataplane/src/slot_marks.rs).
    unmarked: bool,
    /// The .bss map was reused from a pin: the skeleton's mapping of it is then a copy, not
    /// the map (libbpf maps only the maps it creates), and settings are written through.
    bss_reused: bool,
    /// The QUIC-LB key each service's AES context in quic_aes was made from, as this process
    /// installed it (the kernel never gives a key back): crates/dataplane/src/quic.rs.
    quic_keys: HashMap<lb_core::plan::RouteKey, [u8; 16]>,
    /// The last generation given to a QUIC-LB configuration (lb.h, struct lb_quic_config):
    /// each new one is the next, never one given before, so that no ID decoded under a
    /// configuration that is gone is found under another (crates/dataplane/src/quic.rs).
    quic_gen: u32,
}

/// Encrypted QUIC-LB IDs each CPU decodes a second at most by default (`--quic-decode-budget`).
pub const DEFAULT_QUIC_DECODES: u32 = types::lb_quic_budget::LB_QUIC_DECODES_PER_SEC.0;

/// Fills `buf` from the kernel's random source.
fn random_bytes(buf: &mut [u8]) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: the pointer and length name the unwritten rest of `buf`, which lives across
        // the call; getrandom writes at most that many bytes.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(())
}

/// Flow-table entries by default (`--conntrack-size`): 262,144, 4 MiB of kernel memory (and
/// 1 MiB for the half-open flows).
pub const DEFAULT_CONNTRACK_SIZE: u32 = 1 << 18;

/// The slots of the flow table for `--conntrack-size N`: N rounded up to a power of two (at
/// least one bucket), so that a flow's bucket is a mask of its hash.
pub fn flow_table_slots(conntrack_size: u32) -> u32 {
    conntrack_size.max(FLOW_WAYS).next_power_of_two()
}

/// The slots of the half-open table next to a flow table of `slots`: a quarter, at least 4096.
pub fn pending_table_slots(slots: u32) -> u32 {
    (slots / 4).max(4096)
}

const FLOW_WAYS: u32 = types::lb_flow_table_layout::LB_FLOW_WAYS.0;
/// A tracked TCP flow idle this long is forgotten.
pub const DEFAULT_CT_TCP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);
/// A tracked UDP flow idle this long is forgotten.
pub const DEFAULT_CT_UDP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether the program `prog_id` reads table words with their unstable marks (lb.h, enum
/// lb_slot_bits, in its BTF). When its BTF cannot be read it is taken for one that does not: its
/// words then get their marks only once this program has replaced it.
fn program_knows_marks(prog_id: u32) -> bool {
    libbpf_rs::btf::Btf::from_prog_id(prog_id)
        .is_ok_and(|btf| btf.type_by_name::<libbpf_rs::btf::types::Enum<'_>>("lb_slot_bits").is_some())
}

impl Dataplane {
    /// Loads the program (the verifier runs here); nothing is attached. With `reuse`, on the
    /// maps of a pinned data plane wherever their layout is this build's (see [`Reuse`]), so the
    /// new program shares its tables, flows and counters. Returns the names of the pinned maps
    /// that could not be reused (their layout changed).
    pub fn load_with(table_capacity: u32, conntrack_size: u32, reuse: Option<&Reuse>) -> Result<(Dataplane, Vec<&'static str>)> {
        // The skeleton borrows its object for its whole life; one per process, so leaking the
        // few bytes of the holder is simpler than a self-referential struct.
        let object = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = LbSkelBuilder::default().open(object).context("opening the BPF object")?;
        // Two slots per array element (see lb.h, struct lb_slot_pair).
        open.maps
            .table_slots
            .set_max_entries(table_capacity.div_ceil(2))
            .with_context(|| format!("sizing the destination tables to {table_capacity} slots"))?;
        let flow_slots = flow_table_slots(conntrack_size);
        open.maps
            .flows
            .set_max_entries(flow_slots)
            .with_context(|| format!("sizing the flow table to {flow_slots} entries"))?;
        open.maps
            .flow_pending
            .set_max_entries(pending_table_slots(flow_slots))
            .context("sizing the half-open flow table")?;
        let mut fresh = Vec::new();
        if let Some(r) = reuse {
            fresh = reuse::reuse_maps(&mut open, r)?;
        }
        // Each flow table's records sit at its entries' indexes: the same size as the table,
        // which a reused one keeps from its pin. Records are reused only with their table
        // (reuse::reuse_maps), and then have its size already.
        let reused = |records: &str, table: &str| {
            reuse.is_some_and(|r| r.dir.join(records).exists()) && !fresh.contains(&table) && !fresh.contains(&records)
        };
        if !reused("flow_records", "flows") {
            let entries = open.maps.flows.max_entries();
            open.maps.flow_records.set_max_entries(entries).context("sizing the flow records")?;
        }
        if !reused("pending_records", "flow_pending") {
            let entries = open.maps.flow_pending.max_entries();
            open.maps.pending_records.set_max_entries(entries).context("sizing the half-open flow records")?;
        }
        // The hops of every slot sit at the slot's index: the same size as the table array,
        // which a reused one keeps from its pin.
        if reuse.is_none() || fresh.contains(&"table_hops") {
            let entries = open.maps.table_slots.max_entries();
            open.maps.table_hops.set_max_entries(entries).context("sizing the second-chance hops")?;
        }
        let skel = open.load().context("loading the XDP program (is this root, with CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN?)")?;
        let capacity = skel.maps.table_slots.info()?.info.max_entries * 2;
        let slots = SlotsMapping::new(&skel.maps.table_slots, capacity)?;
        anyhow::ensure!(
            skel.maps.table_hops.info()?.info.max_entries * 2 == capacity,
            "the pinned second-chance hops do not match the table array's size"
        );
        let hops = SlotsMapping::new(&skel.maps.table_hops, capacity)?;
        let flow_maps = slot_marks::FlowMaps::new(&skel)?;
        let mut dp = Dataplane { skel, slots, hops, flow_maps, macs: HashMap::new(), via: HashMap::new(), gens: HashMap::new(), unmarked: false, bss_reused: reuse.is_some() && !fresh.contains(&"bss"), quic_keys: HashMap::new(), quic_gen: 0 };
        // The settings as the reused map holds them, so that what is written through from now
        // on starts from them.
        if dp.bss_reused {
            let v = dp.skel.maps.bss.lookup(&0u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY)?.context("the pinned .bss has no value")?;
            *dp.settings()? = encode::value_of::<types::lb_config>(&v);
        }
        // A plane whose running program is from before stable slots (its BTF has no
        // lb_slot_bits: decided by the program, not by the pins, which a controller that died
        // between its switch and its pinning leaves behind): its table words carry no unstable
        // bit, and its entries no record, so nothing says which slots changed under which flows: every slot
        // is unstable until a sweep finds otherwise (crates/core/src/stable.rs). Its program, still attached,
        // reads the same words as backend ids, so no mark may be written until this program
        // has replaced it: until then this program counts every slot as unstable
        // (lb_config.stable_off), and the balancer marks them once it has switched.
        if reuse.is_some_and(|r| !program_knows_marks(r.old_prog_id)) {
            dp.set_stable_off(true)?;
        }
        dp.unmarked = dp.stable_off()?;
        if reuse.is_none() || fresh.contains(&"bss") {
            dp.set_conntrack_timeouts(DEFAULT_CT_TCP_TIMEOUT, DEFAULT_CT_UDP_TIMEOUT)?;
            dp.set_conntrack_guard(true)?;
            dp.set_mtu(1500)?;
            dp.set_quic_decode_budget(DEFAULT_QUIC_DECODES)?;
        }
        dp.quic_gen = dp.first_quic_gen()?;
        // From the maps as loaded (a reused one keeps its pinned size).
        let buckets = |m: &libbpf_rs::MapMut<'_>| -> Result<u32> { Ok(m.info()?.info.max_entries / FLOW_WAYS) };
        let (ct, pending) = (buckets(&dp.skel.maps.flows)?, buckets(&dp.skel.maps.flow_pending)?);
        anyhow::ensure!(ct.is_power_of_two() && pending.is_power_of_two(), "the flow tables' sizes are not powers of two");
        let s = dp.settings()?;
        s.ct_mask = ct - 1;
        s.ct_pending_mask = pending - 1;
        dp.tick()?;
        dp.ensure_flow_key()?;
        Ok((dp, fresh))
    }

    /// How much the kernel's verifier had to walk to accept the XDP program: the instructions it
    /// processed, against its budget of 1,000,000 (past it, the program does not load at all),
    /// and the stack each of its frames takes, against the 512 bytes of a call chain.
    /// Loads the program once more, unattached, with the verifier's statistics asked for. The
    /// count is what a restart's load time follows, and what tests/root_program.rs keeps well
    /// inside the budget. It swaps libbpf's process-wide print callback while it loads: not for
    /// a process that loads other programs at the same time.
    pub fn verifier_steps() -> Result<VerifierStats> {
        static LOG: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
        fn keep(_: libbpf_rs::PrintLevel, line: String) {
            if let Ok(mut log) = LOG.lock() {
                log.push_str(&line);
            }
        }
        let mut object = MaybeUninit::uninit();
        let mut open = LbSkelBuilder::default().open(&mut object).context("opening the BPF object")?;
        // 4: the verifier's statistics only, which libbpf prints (at debug level) on success.
        open.progs.lb_xdp.set_log_level(4);
        if let Ok(mut log) = LOG.lock() {
            log.clear();
        }
        let previous = libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, keep)));
        let loaded = open.load();
        libbpf_rs::set_print(previous);
        let log = LOG.lock().map(|l| l.clone()).unwrap_or_default();
        // Refused (past the budget, say): the verifier's last lines say why and how far it got.
        let tail: String = log.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        drop(loaded.with_context(|| format!("loading the XDP program; the verifier's last words:\n{tail}"))?);
        let steps = log
            .split("processed ")
            .skip(1)
            .find_map(|rest| rest.split(' ').next()?.parse::<u64>().ok())
            .with_context(|| format!("no verifier statistics in libbpf's log: {log}"))?;
        // `stack depth 336+88+...`: the program's own frame, then each function's it calls.
        let stack = log
            .split("stack depth ")
            .nth(1)
            .map(|rest| rest.split(|c: char| !c.is_ascii_digit() && c != '+').next().unwrap_or("").split('+').filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_default();
        Ok(VerifierStats { steps, stack })
    }

    /// How large this plane's tables are, as loaded.
    pub fn sizes(&self) -> Result<Sizes> {
        live::sizes(self)
    }

    pub fn program_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.skel.progs.lb_xdp.as_fd()
    }

    /// Sends health probes through the data path out of interface `ifindex` (bpf/probe.h,
    /// [`probe_path`]).
    /// `local_vip`: a VIP is one of the host's own addresses (the interface then accepts
    /// packets from it, `accept_local`).
    pub fn open_probe_path(&self, ifindex: u32, ifname: &str, mac: [u8; 6], local_vip: bool) -> Result<probe_path::ProbePath> {
        self.set_probe_interface(ifindex)?;
        probe_path::ProbePath::open(self.skel.progs.lb_probe_out.as_fd(), ifindex, ifname, mac, local_vip)
    }

    /// Names the interface probes through the data path leave by (bpf/probe.h, probe_out).
    pub fn set_probe_interface(&self, ifindex: u32) -> Result<()> {
        self.skel.maps.probe_out.update(&0u32.to_ne_bytes(), &ifindex.to_ne_bytes(), libbpf_rs::MapFlags::ANY).context("writing probe_out")
    }

    /// Runs the probes' egress program once on `frame`, as a packet of the loopback device
    /// marked `mark`, through BPF_PROG_TEST_RUN: (its verdict, the frame as it left, its mark
    /// as it left).
    pub fn test_run_probe(&self, frame: &[u8], mark: u32) -> Result<(i32, Vec<u8>, u32)> {
        // struct __sk_buff up to its mark (len, pkt_type, mark); the kernel zeroes the rest.
        let mut ctx_in = [0u8; 12];
        ctx_in[8..12].copy_from_slice(&mark.to_ne_bytes());
        let mut ctx_out = [0u8; 256];
        let mut out = vec![0u8; frame.len() + 256];
        let input = libbpf_rs::ProgramInput {
            data_in: Some(frame),
            data_out: Some(&mut out),
            context_in: Some(&mut ctx_in),
            context_out: Some(&mut ctx_out),
            ..Default::default()
        };
        let output = self.skel.progs.lb_probe_out.test_run(input).context("BPF_PROG_TEST_RUN")?;
        let len = output.data.as_ref().map_or(0, |d| d.len());
        let verdict = output.return_value as i32;
        let mark_out = output.context.as_ref().and_then(|c| c.get(8..12)).map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        out.truncate(len);
        Ok((verdict, out, mark_out))
    }

    pub fn program_id(&self) -> Result<u32> {
        prog_id(&self.skel.progs.lb_xdp)
    }

    /// The program's settings (struct lb_config in its .bss), in the skeleton's mapping; every
    /// change is followed by [`Dataplane::commit_settings`].
    fn settings(&mut self) -> Result<&mut types::lb_config> {
        Ok(&mut self.skel.maps.bss_data.as_deref_mut().context("the program's .bss is not memory-mapped")?.lb_settings)
    }

    /// Makes the settings as changed reach the program. Where libbpf created the .bss map, its
    /// mapping is the map's memory and there is nothing to do; a .bss reused from a pin is not
    /// mapped (libbpf maps only the maps it creates), and its mapping is a copy: written there
    /// alone, a restarted controller's --conntrack-tcp-timeout, --conntrack-guard, MTU or MAC
    /// never reached the program (found in issue 24's review).
    fn commit_settings(&mut self) -> Result<()> {
        if !self.bss_reused {
            return Ok(());
        }
        let s = *self.settings()?;
        let m = &self.skel.maps.bss;
        let mut v = m.lookup(&0u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY)?.context("the program's .bss has no value")?;
        let n = std::mem::size_of::<types::lb_config>();
        anyhow::ensure!(v.len() >= n, "the program's .bss is smaller than its settings");
        v[..n].copy_from_slice(encode::bytes_of(&s));
        m.update(&0u32.to_ne_bytes(), &v, libbpf_rs::MapFlags::ANY)?;
        Ok(())
    }

    /// Sets the source MAC of forwarded frames (the attached interface's).
    pub fn set_ifmac(&mut self, ifmac: [u8; 6]) -> Result<()> {
        self.settings()?.ifmac = ifmac;
        self.commit_settings()
    }

    /// How long tracked flows may stay idle before they are forgotten (and re-hashed).
    pub fn set_conntrack_timeouts(&mut self, tcp: std::time::Duration, udp: std::time::Duration) -> Result<()> {
        let s = self.settings()?;
        s.ct_tcp_timeout_ms = tcp.as_millis() as u64;
        s.ct_udp_timeout_ms = udp.as_millis() as u64;
        self.commit_settings()
    }

    /// On (the default): a flow gets an established flow-table entry at its second packet, and
    /// its first waits in the half-open table, so that spoofed first packets (a SYN flood)
    /// never evict established flows. Off: at its first packet, as a plain LRU would.
    pub fn set_conntrack_guard(&mut self, on: bool) -> Result<()> {
        self.settings()?.ct_guard = on as u32;
        self.commit_settings()
    }

    /// At most `per_second` encrypted QUIC-LB connection IDs that were not decoded before are
    /// decoded by each CPU a second (and a tenth of a second's worth at once); past that, such a
    /// packet goes by the table, counted over_budget (lb.h, enum lb_quic_budget). 0: no bound.
    pub fn set_quic_decode_budget(&mut self, per_second: u32) -> Result<()> {
        self.settings()?.quic_decode_ns = match per_second {
            0 => 0,
            n => (1_000_000_000 / n).max(1),
        };
        self.commit_settings()
    }

    /// The interface's MTU: an encapsulated packet longer than this is answered with "too big"
    /// (or dropped) instead of sent.
    pub fn set_mtu(&mut self, mtu: u32) -> Result<()> {
        self.settings()?.mtu = mtu;
        self.commit_settings()
    }

    /// The outer source of encapsulated packets, per family: an address and how many of its
    /// leading bits stay fixed (the rest come from the flow hash; 32 or 128: one fixed address).
    /// For IPv6 at most the last 32 bits vary.
    pub fn set_encap_sources(&mut self, v4: Option<(std::net::Ipv4Addr, u8)>, v6: Option<(std::net::Ipv6Addr, u8)>) -> Result<()> {
        let s = self.settings()?;
        if let Some((a, len)) = v4 {
            s.encap_src4 = u32::from_ne_bytes(a.octets());
            s.encap_src4_vary = encode::host_mask_be(len, 32);
        }
        if let Some((a, len)) = v6 {
            for (i, c) in a.octets().chunks(4).enumerate() {
                s.encap_src6[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            }
            s.encap_src6_vary = encode::host_mask_be(len.max(96) - 96, 32);
        }
        self.commit_settings()
    }

    /// The secret key of the flow tags (lb.h, struct lb_flow_key): made once, from getrandom,
    /// by the first load of a data plane, and kept by every later one that reuses its pinned
    /// flow_key map (adoption, upgrades), so that the tags of its tracked flows stay valid.
    fn ensure_flow_key(&mut self) -> Result<()> {
        if self.flow_key()? != [0, 0] {
            return Ok(());
        }
        let mut bytes = [0u8; 16];
        random_bytes(&mut bytes).context("getrandom for the flow-tag key")?;
        let key = types::lb_flow_key { k: [u64::from_ne_bytes(bytes[..8].try_into()?), u64::from_ne_bytes(bytes[8..].try_into()?)] };
        anyhow::ensure!(key.k != [0, 0], "getrandom returned zeros for the flow-tag key");
        self.skel.maps.flow_key.update(&0u32.to_ne_bytes(), encode::bytes_of(&key), libbpf_rs::MapFlags::ANY).context("writing the flow-tag key")?;
        Ok(())
    }

    /// The secret key of the flow tags, for tests and tools that place or find flows
    /// ([`lb_core::flowhash::flow_tag`]).
    pub fn flow_key(&self) -> Result<[u64; 2]> {
        let v = self.skel.maps.flow_key.lookup(&0u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY)?.unwrap_or_default();
        Ok(value_of::<types::lb_flow_key>(&v).k)
    }

    /// Writes the controller's clock into lb_config.clock_ms, where `lb status` and tools can
    /// see when a controller last ran. The data plane no longer ages flows by it: the program
    /// reads the kernel's monotonic clock itself, so flows age alike with or without a
    /// controller. Kept, and still called several times a second, for that record.
    pub fn tick(&mut self) -> Result<()> {
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)?;
        let ms = now.tv_sec() as u64 * 1000 + now.tv_nsec() as u64 / 1_000_000;
        self.settings()?.clock_ms = ms;
        self.commit_settings()
    }

    /// The neighbour that frames for backend `addr` are sent to.
    pub fn neighbour_of(&self, addr: IpAddr) -> IpAddr {
        self.via.get(&addr).copied().unwrap_or(addr)
    }

    /// The MAC known for neighbour `addr`.
    pub fn mac(&self, addr: IpAddr) -> Option<[u8; 6]> {
        self.macs.get(&addr).copied()
    }

    /// Remembers that frames for backend `addr` go to `neighbour` (itself when on the link), for
    /// the backend records written from now on. Writes nothing: rewriting the records of the
    /// backends at `addr` takes knowing which ids are there, which the caller does. Returns
    /// whether the neighbour changed. For the balancer alone (see [`Dataplane::execute`]).
    pub fn remember_via(&mut self, addr: IpAddr, neighbour: IpAddr) -> bool {
        if self.neighbour_of(addr) == neighbour {
            return false;
        }
        if neighbour == addr {
            self.via.remove(&addr);
        } else {
            self.via.insert(addr, neighbour);
        }
        true
    }

    /// Remembers neighbour `addr`'s MAC (None: unknown), for the backend records written from now
    /// on. Writes nothing (see [`Dataplane::remember_via`]). Returns whether it changed.
    pub fn remember_mac(&mut self, addr: IpAddr, mac: Option<[u8; 6]>) -> bool {
        if self.mac(addr) == mac {
            return false;
        }
        match mac {
            Some(m) => self.macs.insert(addr, m),
            None => self.macs.remove(&addr),
        };
        true
    }

    /// Runs the program once on `frame` through BPF_PROG_TEST_RUN: (XDP action, output frame).
    pub fn test_run(&self, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
        test_run_once(&self.skel.progs.lb_xdp, frame)
    }

    /// Runs the program `repeat` times on `frame` in one BPF_PROG_TEST_RUN (the kernel reuses one
    /// buffer, so later runs see what earlier ones wrote): (last XDP action, mean time per run).
    pub fn test_run_repeat(&self, frame: &[u8], repeat: u32) -> Result<(u32, std::time::Duration)> {
        let input = libbpf_rs::ProgramInput { data_in: Some(frame), repeat, ..Default::default() };
        let output = self.skel.progs.lb_xdp.test_run(input).context("BPF_PROG_TEST_RUN")?;
        Ok((output.return_value, output.duration))
    }
}

impl MapSource for Dataplane {
    fn map(&self, name: &str) -> Result<&dyn MapCore> {
        reuse::loaded_maps(&self.skel).into_iter().find(|m| m.0 == name).map(|m| m.1 as &dyn MapCore).context("no such map")
    }
}

/// Runs an XDP program once on `frame` through BPF_PROG_TEST_RUN: (XDP action, output frame,
/// which may be longer or shorter than the input).
fn test_run_once(prog: &libbpf_rs::ProgramMut<'_>, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
    let mut out = vec![0u8; frame.len() + 256];
    let input = libbpf_rs::ProgramInput { data_in: Some(frame), data_out: Some(&mut out), ..Default::default() };
    let output = prog.test_run(input).context("BPF_PROG_TEST_RUN")?;
    let len = output.data.as_ref().map_or(0, |d| d.len());
    let action = output.return_value;
    out.truncate(len);
    Ok((action, out))
}

/// The kernel's id of a loaded program.
fn prog_id(prog: &libbpf_rs::ProgramMut<'_>) -> Result<u32> {
    let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_prog_info>() as u32;
    // SAFETY: `info` is a writable bpf_prog_info and `len` its size; the kernel writes at most len bytes.
    let rc = unsafe {
        libbpf_rs::libbpf_sys::bpf_obj_get_info_by_fd(prog.as_fd().as_raw_fd(), &mut info as *mut _ as *mut std::ffi::c_void, &mut len)
    };
    anyhow::ensure!(rc == 0, "asking the kernel for the program's id: {}", std::io::Error::from_raw_os_error(-rc));
    Ok(info.id)
}
