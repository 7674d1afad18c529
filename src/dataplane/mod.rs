//! The only module that talks to the kernel: loads the XDP program's skeleton, writes the tables
//! that the kernel-free core built into its maps, attaches it ([`link`]) and asks the network
//! stack about routes and neighbours ([`netlink`]).

pub mod decap;
pub mod link;
pub mod netlink;
pub mod pin;

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{AsRawLibbpf, MapCore, MapFlags};

use crate::config::{Forward, HashMode, Pool, Protocol};
use crate::plan;
use crate::stats::{BackendCounters, ServiceCounters, Snapshot, Traffic};
use crate::table;

#[allow(clippy::all, dead_code, non_camel_case_types, non_snake_case, non_upper_case_globals)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/lb.skel.rs"));
}

pub use skel::types;
use skel::{LbSkel, LbSkelBuilder};

/// Views a map key or value from the skeleton's types as bytes.
fn bytes_of<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: only used with the skeleton's #[repr(C)] types from lb.h, whose fields are
    // integers and byte arrays with explicit padding, so every byte is initialized; the slice
    // borrows `v` and cannot outlive it.
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
}

/// The default size of the table_slots array: 4 Mi slots, 16 MiB (4 bytes a slot), room for 64 services at the
/// default 65537 slots (or 2 at the largest size) with as much again free for tables that are
/// being replaced.
pub const DEFAULT_TABLE_CAPACITY: u32 = 1 << 22;

pub struct Dataplane {
    skel: LbSkel<'static>,
    /// The table_slots array, mapped into this process.
    slots: SlotsMapping,
    limits: plan::Limits,
    /// A mirror of what the maps hold, and the allocators: what the next change starts from.
    state: plan::State,
    /// Each neighbour's MAC, when known: a backend's own (l2, or encapsulated on the link) or
    /// its next hop's.
    macs: HashMap<IpAddr, [u8; 6]>,
    /// The neighbour that frames to a backend address go to, where it is not the backend itself
    /// (an encapsulated backend behind a router).
    via: HashMap<IpAddr, IpAddr>,
    /// Reuses ring tokens from one change to the next.
    builder: table::Builder,
    /// Each backend id's generation (see lb.h, struct lb_flow).
    gens: HashMap<u32, u32>,
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

/// What one [`Dataplane::apply`] did.
#[derive(Debug, Clone)]
pub struct Applied {
    /// Services added, removed or changed, with the table entries written for each.
    pub touched: Vec<plan::Touched>,
    /// Table entries written in all.
    pub slots_written: u64,
    /// Map writes in all.
    pub writes: usize,
}

impl Dataplane {
    /// Opens and loads the program (the verifier runs here). Nothing is attached.
    pub fn load(table_capacity: u32) -> Result<Dataplane> {
        Self::load_sized(table_capacity, DEFAULT_CONNTRACK_SIZE)
    }

    /// [`Dataplane::load`], with the flow table sized to `conntrack_size` entries.
    pub fn load_sized(table_capacity: u32, conntrack_size: u32) -> Result<Dataplane> {
        Ok(Self::load_with(table_capacity, conntrack_size, None)?.0)
    }

    /// Loads the program; with `reuse`, on the maps of a pinned data plane wherever their layout
    /// is this build's (see [`Reuse`]), so the new program shares its tables, flows and counters.
    /// Returns the names of the pinned maps that could not be reused (their layout changed).
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
            fresh = reuse_maps(&mut open, r)?;
        }
        let skel = open.load().context("loading the XDP program (is this root, with CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN?)")?;
        let capacity = skel.maps.table_slots.info()?.info.max_entries * 2;
        let slots = SlotsMapping::new(&skel.maps.table_slots, capacity)?;
        let limits = plan::Limits {
            capacity,
            max_backend_id: skel.maps.backends.info()?.info.max_entries - 1,
            max_route_id: skel.maps.routes.info()?.info.max_entries - 1,
        };
        let mut dp = Dataplane {
            skel,
            slots,
            limits,
            state: plan::State::default(),
            macs: HashMap::new(),
            via: HashMap::new(),
            builder: Default::default(),
            gens: HashMap::new(),
        };
        if reuse.is_none() || fresh.contains(&"bss") {
            dp.set_conntrack_timeouts(DEFAULT_CT_TCP_TIMEOUT, DEFAULT_CT_UDP_TIMEOUT)?;
            dp.set_conntrack_guard(true)?;
            dp.set_mtu(1500)?;
        }
        // From the maps as loaded (a reused one keeps its pinned size).
        let buckets = |m: &libbpf_rs::MapMut<'_>| -> Result<u32> { Ok(m.info()?.info.max_entries / FLOW_WAYS) };
        let (ct, pending) = (buckets(&dp.skel.maps.flows)?, buckets(&dp.skel.maps.flow_pending)?);
        anyhow::ensure!(ct.is_power_of_two() && pending.is_power_of_two(), "the flow tables' sizes are not powers of two");
        let s = dp.settings()?;
        s.ct_mask = ct - 1;
        s.ct_pending_mask = pending - 1;
        dp.tick()?;
        Ok((dp, fresh))
    }

    pub fn program_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.skel.progs.lb_xdp.as_fd()
    }

    /// The program's settings (struct lb_config in its .bss), written in place.
    fn settings(&mut self) -> Result<&mut types::lb_config> {
        Ok(&mut self.skel.maps.bss_data.as_deref_mut().context("the program's .bss is not memory-mapped")?.lb_settings)
    }

    /// Sets the source MAC of forwarded frames (the attached interface's).
    pub fn set_ifmac(&mut self, ifmac: [u8; 6]) -> Result<()> {
        self.settings()?.ifmac = ifmac;
        Ok(())
    }

    /// How long tracked flows may stay idle before they are forgotten (and re-hashed).
    pub fn set_conntrack_timeouts(&mut self, tcp: std::time::Duration, udp: std::time::Duration) -> Result<()> {
        let s = self.settings()?;
        s.ct_tcp_timeout_ms = tcp.as_millis() as u64;
        s.ct_udp_timeout_ms = udp.as_millis() as u64;
        Ok(())
    }

    /// On (the default): a flow gets an established flow-table entry at its second packet, and
    /// its first waits in the half-open table, so that spoofed first packets (a SYN flood)
    /// never evict established flows. Off: at its first packet, as a plain LRU would.
    pub fn set_conntrack_guard(&mut self, on: bool) -> Result<()> {
        self.settings()?.ct_guard = on as u32;
        Ok(())
    }

    /// The interface's MTU: an encapsulated packet longer than this is answered with "too big"
    /// (or dropped) instead of sent.
    pub fn set_mtu(&mut self, mtu: u32) -> Result<()> {
        self.settings()?.mtu = mtu;
        Ok(())
    }

    /// The outer source of encapsulated packets, per family: an address and how many of its
    /// leading bits stay fixed (the rest come from the flow hash; 32 or 128: one fixed address).
    /// For IPv6 at most the last 32 bits vary.
    pub fn set_encap_sources(&mut self, v4: Option<(std::net::Ipv4Addr, u8)>, v6: Option<(std::net::Ipv6Addr, u8)>) -> Result<()> {
        let s = self.settings()?;
        if let Some((a, len)) = v4 {
            s.encap_src4 = u32::from_ne_bytes(a.octets());
            s.encap_src4_vary = host_mask_be(len, 32);
        }
        if let Some((a, len)) = v6 {
            for (i, c) in a.octets().chunks(4).enumerate() {
                s.encap_src6[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            }
            s.encap_src6_vary = host_mask_be(len.max(96) - 96, 32);
        }
        Ok(())
    }

    /// Advances the data plane's clock (lb_config.clock_ms) to now. Connection tracking ages
    /// flows by it, so whoever runs the data plane calls this several times a second.
    pub fn tick(&mut self) -> Result<()> {
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)?;
        let ms = now.tv_sec() as u64 * 1000 + now.tv_nsec() as u64 / 1_000_000;
        self.settings()?.clock_ms = ms;
        Ok(())
    }

    /// Installs `pool` on fresh maps: the interface's MAC, each backend's neighbour's MAC from
    /// `mac_of` (None: unknown; the neighbour is the backend itself unless [`Dataplane::set_via`]
    /// said otherwise), then [`Dataplane::apply`].
    pub fn install(&mut self, pool: &Pool, ifmac: [u8; 6], mac_of: &dyn Fn(IpAddr) -> Option<[u8; 6]>) -> Result<Applied> {
        self.set_ifmac(ifmac)?;
        for b in pool.services.iter().flat_map(|s| &s.backends) {
            let n = self.neighbour_of(b.address);
            if let Some(mac) = mac_of(n) {
                self.macs.insert(n, mac);
            }
        }
        self.apply(pool)
    }

    /// The neighbour that frames for backend `addr` are sent to.
    pub fn neighbour_of(&self, addr: IpAddr) -> IpAddr {
        self.via.get(&addr).copied().unwrap_or(addr)
    }

    /// Sends frames for backend `addr` to `neighbour` (its next hop; itself when on the link).
    /// Rewrites the records of the backends at `addr` when that changes their MAC. Returns
    /// whether the neighbour changed.
    pub fn set_via(&mut self, addr: IpAddr, neighbour: IpAddr) -> Result<bool> {
        if self.neighbour_of(addr) == neighbour {
            return Ok(false);
        }
        if neighbour == addr {
            self.via.remove(&addr);
        } else {
            self.via.insert(addr, neighbour);
        }
        for (id, alive) in self.ids_at(|a| a == addr) {
            self.write_backend(id, addr, alive, true)?;
        }
        Ok(true)
    }

    /// Changes the maps from what they hold to `pool`, writing only what differs, in an order
    /// in which no packet meets a half-applied change (see [`plan`]). If `pool` does not fit,
    /// nothing is written. The program stays attached throughout.
    pub fn apply(&mut self, pool: &Pool) -> Result<Applied> {
        let tables: Vec<table::Table> = pool.services.iter().map(|s| self.builder.build_service(s)).collect();
        self.builder.retain(&pool.services.iter().map(|s| s.name.as_str()).collect::<Vec<_>>());
        let index_of = |k: &plan::RouteKey| vip_index(&service_key(k.addr, k.port, k.proto));
        let mut attempt = 0;
        let plan = loop {
            match plan::plan(&self.state, pool, &tables, &self.limits, &index_of, Instant::now()) {
                Ok(p) => break p,
                // Ranges retired by the last change come back in a moment: wait for them.
                Err(plan::PlanError::CapacityAt { until }) if attempt == 0 => {
                    attempt += 1;
                    std::thread::sleep(until.saturating_duration_since(Instant::now()));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let applied =
            Applied { touched: plan.touched.clone(), slots_written: plan.slots_written(), writes: plan.ops.len() };
        for (i, op) in plan.ops.iter().enumerate() {
            if let Err(e) = self.execute(op) {
                // The maps hold part of this change, each part consistent. Remember that the
                // mirror cannot be trusted for anything this change touched, so that the next
                // change rewrites it all.
                let mut state = plan.state;
                state.taint(&plan.ops[..=i]);
                self.state = state;
                return Err(e.context(format!("applying the new tables (write {} of {})", i + 1, plan.ops.len())));
            }
        }
        self.state = plan.state;
        Ok(applied)
    }

    fn execute(&mut self, op: &plan::Op) -> Result<()> {
        let maps = &self.skel.maps;
        match op {
            plan::Op::Backend { id, address, alive, in_pool } => self.write_backend(*id, *address, *alive, *in_pool)?,
            plan::Op::Meta { id, meta, name } => {
                let value = types::lb_backend_meta {
                    service: service_key(meta.service.addr, meta.service.port, meta.service.proto),
                    identity: meta.identity,
                    weight: meta.weight,
                    state: match meta.state {
                        crate::config::BackendState::Active => 0,
                        crate::config::BackendState::Drain => 1,
                        crate::config::BackendState::Down => 2,
                    },
                    name: name_bytes(name),
                    ..Default::default()
                };
                maps.backend_meta.update(&id.to_ne_bytes(), bytes_of(&value), MapFlags::ANY)?;
            }
            plan::Op::ServiceName { key, name } => {
                let k = service_key(key.addr, key.port, key.proto);
                match name {
                    Some(n) => maps.service_names.update(bytes_of(&k), bytes_of(&types::lb_name { name: name_bytes(n) }), MapFlags::ANY)?,
                    None => {
                        let _ = maps.service_names.delete(bytes_of(&k));
                    }
                }
            }
            plan::Op::ResetCounters { id } => {
                let zero = vec![vec![0u8; std::mem::size_of::<types::lb_traffic>()]; libbpf_rs::num_possible_cpus()?];
                maps.backend_traffic.update_percpu(&id.to_ne_bytes(), &zero, MapFlags::ANY)?;
                let gen = self.gens.entry(*id).or_insert(0);
                *gen = gen.wrapping_add(1);
                maps.backend_gen.update(&id.to_ne_bytes(), &gen.to_ne_bytes(), MapFlags::ANY)?;
            }
            plan::Op::Slots(entries) => self.slots.write(entries)?,
            plan::Op::Route { id, route } => {
                maps.routes.update(&id.to_ne_bytes(), bytes_of(&route_value(route)), MapFlags::ANY)?;
            }
            plan::Op::HashPut { key, route } => {
                let k = service_key(key.addr, key.port, key.proto);
                maps.services.update(bytes_of(&k), bytes_of(&route_value(route)), MapFlags::ANY)?;
            }
            plan::Op::HashDelete { key } => {
                let k = service_key(key.addr, key.port, key.proto);
                // Absent already (after an interrupted change) is as good as deleted.
                if let Err(e) = maps.services.delete(bytes_of(&k)) {
                    if e.kind() != libbpf_rs::ErrorKind::NotFound {
                        return Err(e.into());
                    }
                }
            }
            plan::Op::Index { index, entry } => {
                let value = match entry {
                    None => 0,
                    Some(plan::IndexEntry::Route(id)) => *id,
                    Some(plan::IndexEntry::Shared) => types::lb_vip_index_layout::LB_VIP_INDEX_SHARED.0,
                };
                maps.vip_index.update(&index.to_ne_bytes(), &value.to_ne_bytes(), MapFlags::ANY)?;
            }
        }
        Ok(())
    }

    /// Writes backend `id`'s address (the outer destination of encapsulated packets), then its
    /// record: its neighbour's MAC as known now.
    fn write_backend(&self, id: u32, address: IpAddr, alive: bool, in_pool: bool) -> Result<()> {
        let mac = self.macs.get(&self.neighbour_of(address)).copied();
        let (addr, family) = addr_words(address);
        let to = types::lb_addr { addr, family, ..Default::default() };
        self.skel.maps.backend_addrs.update(&id.to_ne_bytes(), bytes_of(&to), MapFlags::ANY)?;
        let rec = types::lb_backend {
            mac: mac.unwrap_or([0; 6]),
            flags: if mac.is_some() { LB_BACKEND_MAC_KNOWN } else { 0 }
                | if alive { LB_BACKEND_ALIVE } else { 0 }
                | if in_pool { LB_BACKEND_IN_POOL } else { 0 },
            pad: 0,
        };
        self.skel.maps.backends.update(&id.to_ne_bytes(), bytes_of(&rec), MapFlags::ANY)?;
        Ok(())
    }

    /// Points every backend whose frames go to neighbour `addr` to `mac` (None: unknown, its
    /// packets are dropped as `no_mac`). Returns whether anything changed. One 8-byte value per
    /// backend id, so a packet sees the old MAC or the new one.
    pub fn set_mac(&mut self, addr: IpAddr, mac: Option<[u8; 6]>) -> Result<bool> {
        if self.macs.get(&addr).copied() == mac {
            return Ok(false);
        }
        match mac {
            Some(m) => self.macs.insert(addr, m),
            None => self.macs.remove(&addr),
        };
        for (id, alive) in self.ids_at(|a| self.neighbour_of(a) == addr) {
            let address = self.state.services.iter().flat_map(|s| &s.backends).find(|b| b.id == id).map(|b| b.address);
            if let Some(address) = address {
                self.write_backend(id, address, alive, true)?;
            }
        }
        Ok(true)
    }

    /// The installed backend ids whose address satisfies `at`, with whether each is alive.
    fn ids_at(&self, at: impl Fn(IpAddr) -> bool) -> Vec<(u32, bool)> {
        self.state
            .services
            .iter()
            .flat_map(|s| &s.backends)
            .filter(|b| at(b.address))
            .map(|b| (b.id, b.state != crate::config::BackendState::Down))
            .collect()
    }

    /// The MAC known for neighbour `addr`.
    pub fn mac(&self, addr: IpAddr) -> Option<[u8; 6]> {
        self.macs.get(&addr).copied()
    }

    /// The installed services, as the maps hold them.
    pub fn installed(&self) -> &[plan::LiveService] {
        &self.state.services
    }

    /// Every counter of the data plane, summed over CPUs.
    pub fn snapshot(&self) -> Result<Snapshot> {
        use types::lb_stat as S;
        let mut snap = Snapshot {
            forwarded: 0,
            passed: self.stat(S::LB_STAT_PASSED)?,
            drops: Vec::with_capacity(8),
            conntrack: Vec::with_capacity(4),
            icmp_forwarded: self.stat(S::LB_ICMP_FORWARDED)?,
            services: Vec::with_capacity(self.state.services.len()),
        };
        for (name, stat) in drop_counters() {
            snap.drops.push((name, self.stat(stat)?));
        }
        for (name, stat) in ct_counters() {
            snap.conntrack.push((name, self.stat(stat)?));
        }
        for s in &self.state.services {
            let mut backends = Vec::with_capacity(s.backends.len());
            for b in &s.backends {
                backends.push(BackendCounters {
                    label: b.identity.clone(),
                    address: b.address,
                    weight: b.weight,
                    mac_known: self.macs.contains_key(&self.neighbour_of(b.address)),
                    health: None,
                    traffic: traffic_of(&self.skel.maps.backend_traffic, b.id)?,
                });
            }
            // Backend ids are per service, so the service's traffic is its backends' sum.
            let traffic = backends.iter().fold(Traffic::default(), |t, b| Traffic {
                packets: t.packets + b.traffic.packets,
                bytes: t.bytes + b.traffic.bytes,
            });
            snap.forwarded += traffic.packets;
            snap.services.push(ServiceCounters { name: s.name.clone(), endpoint: s.endpoint.clone(), traffic, backends });
        }
        Ok(snap)
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

    /// Packets forwarded to any backend so far (the sum of the per-backend counters).
    pub fn forwarded(&self) -> Result<u64> {
        let mut total = 0;
        for b in self.state.services.iter().flat_map(|s| &s.backends) {
            total += traffic_of(&self.skel.maps.backend_traffic, b.id)?.packets;
        }
        Ok(total)
    }

    /// A counter of enum lb_stat, summed over CPUs.
    pub fn stat(&self, stat: types::lb_stat) -> Result<u64> {
        percpu_sum(&self.skel.maps.stats, stat.0)
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

/// The table_slots array mapped into this process (the map is BPF_F_MMAPABLE). Its elements are
/// pairs of slots, laid out back to back, so the mapping is one array of 4-byte slots: writing
/// a slot is one aligned 4-byte store, which the program reads whole, old or new.
struct SlotsMapping {
    base: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
    entries: u32,
}

impl SlotsMapping {
    fn new(map: &impl AsFd, entries: u32) -> Result<SlotsMapping> {
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096) as usize;
        let len = (entries.div_ceil(2) as usize * std::mem::size_of::<types::lb_slot_pair>()).div_ceil(page) * page;
        let size = std::num::NonZeroUsize::new(len).context("an empty table array")?;
        // SAFETY: a fresh shared mapping of the map's descriptor, at an address the kernel
        // picks; nothing else in this process aliases it, and it is unmapped only in Drop.
        let base = unsafe {
            nix::sys::mman::mmap(
                None,
                size,
                nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
                nix::sys::mman::MapFlags::MAP_SHARED,
                map.as_fd(),
                0,
            )
        }
        .context("mapping the table array into memory")?;
        Ok(SlotsMapping { base, len, entries })
    }

    /// Entry `i` of the table array (0 past its end).
    fn read(&self, i: u32) -> u32 {
        use std::sync::atomic::{AtomicU32, Ordering};
        if i >= self.entries {
            return 0;
        }
        // SAFETY: i < entries, so the aligned 4-byte word is inside the live mapping; the
        // program only loads it, user space stores it atomically.
        let slot = unsafe { AtomicU32::from_ptr((self.base.as_ptr() as *mut u32).add(i as usize)) };
        slot.load(Ordering::Relaxed)
    }

    fn write(&self, entries: &[(u32, u32)]) -> Result<()> {
        use std::sync::atomic::{AtomicU32, Ordering};
        for &(i, id) in entries {
            anyhow::ensure!(i < self.entries, "table entry {i} is outside the array of {}", self.entries);
            // SAFETY: i < entries, so the 4-byte, 4-aligned word is inside the live mapping
            // (page-aligned base); the kernel's readers only load it, so an atomic store is the
            // right way to share it.
            let slot = unsafe { AtomicU32::from_ptr((self.base.as_ptr() as *mut u32).add(i as usize)) };
            slot.store(id, Ordering::Relaxed);
        }
        // Everything written here is visible before whatever map write comes next makes it
        // reachable.
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for SlotsMapping {
    fn drop(&mut self) {
        // SAFETY: base and len are exactly what mmap returned and nothing uses them after this.
        let _ = unsafe { nix::sys::mman::munmap(self.base, self.len) };
    }
}

const LB_BACKEND_MAC_KNOWN: u8 = types::lb_backend_flags::LB_BACKEND_MAC_KNOWN.0 as u8;
const LB_BACKEND_ALIVE: u8 = types::lb_backend_flags::LB_BACKEND_ALIVE.0 as u8;
const LB_BACKEND_IN_POOL: u8 = types::lb_backend_flags::LB_BACKEND_IN_POOL.0 as u8;

/// A name as the maps keep it: at most 63 bytes, NUL-padded.
fn name_bytes(name: &str) -> [std::ffi::c_char; 64] {
    let mut out = [0 as std::ffi::c_char; 64];
    for (o, b) in out.iter_mut().zip(name.bytes().take(63)) {
        *o = b as std::ffi::c_char;
    }
    out
}

/// A name the maps kept.
pub fn name_text(name: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = name.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Reads a map value of one of the skeleton's plain types (or an integer) from the bytes the kernel returned
/// (for tools and tests that read a running program's maps).
pub fn value_of<T: Copy + Default>(bytes: &[u8]) -> T {
    if bytes.len() < std::mem::size_of::<T>() {
        return T::default();
    }
    // SAFETY: the length was checked above; `T` is a #[repr(C)] skeleton type made of integers
    // and byte arrays, for which every bit pattern is a valid value; read_unaligned copes with
    // any alignment of the kernel's buffer.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) }
}


/// The routes-array (and services-map) value of a route.
fn route_value(r: &plan::Route) -> types::lb_service {
    types::lb_service {
        key: service_key(r.key.addr, r.key.port, r.key.proto),
        base: r.base,
        slots: r.slots,
        hash_mode: match r.hash {
            HashMode::ClientIp => types::lb_hash_mode::LB_HASH_CLIENT_IP.0,
            HashMode::Flow => types::lb_hash_mode::LB_HASH_FLOW.0,
        },
        flags: if r.conntrack { types::lb_service_flags::LB_SVC_CONNTRACK.0 } else { 0 },
        forward: match r.forward {
            Forward::L2 => types::lb_forward::LB_FWD_L2.0,
            Forward::Ipip => types::lb_forward::LB_FWD_IPIP.0,
            Forward::Gue => types::lb_forward::LB_FWD_GUE.0,
        },
        gue_port: r.gue_port.to_be(),
        pad: [0; 2],
        table_len: r.table_len,
    }
}

/// The bits of a 32-bit word past its first `fixed` bits, as a mask in network order.
fn host_mask_be(fixed: u8, width: u8) -> u32 {
    let fixed = fixed.min(width) as u32;
    let host = if fixed == 0 { u32::MAX } else { u32::MAX.checked_shr(fixed).unwrap_or(0) };
    host.to_be()
}

/// An address as the data plane's four words (network order) and family.
pub fn addr_words(a: IpAddr) -> ([u32; 4], u8) {
    let mut addr = [0u32; 4];
    match a {
        IpAddr::V4(a) => {
            addr[0] = u32::from_ne_bytes(a.octets());
            (addr, types::lb_family::LB_FAMILY_V4.0 as u8)
        }
        IpAddr::V6(a) => {
            for (i, c) in a.octets().chunks(4).enumerate() {
                addr[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            }
            (addr, types::lb_family::LB_FAMILY_V6.0 as u8)
        }
    }
}

/// The vip_index entry that the service key (vip, port, protocol) uses: for tests that need keys
/// which share an entry.
pub fn vip_index_of(vip: IpAddr, port: u16, proto: Protocol) -> u32 {
    vip_index(&service_key(vip, port, proto))
}

/// The services-map key of (vip, port, protocol), as bytes.
pub fn service_key_bytes(vip: IpAddr, port: u16, proto: Protocol) -> Vec<u8> {
    bytes_of(&service_key(vip, port, proto)).to_vec()
}

/// The vip_index entry of a key: the same function as lb_vip_index() in lb.bpf.c, on the same
/// raw (network-order) words. If the two disagreed, no service would ever be found, which every
/// forwarding packet fixture would catch.
fn vip_index(k: &types::lb_service_key) -> u32 {
    let bits = types::lb_vip_index_layout::LB_VIP_INDEX_BITS.0;
    // The key's last word (port, protocol, family) as its bytes read in native order, like
    // every address word.
    let port = k.port.to_ne_bytes();
    let tail = u32::from_ne_bytes([port[0], port[1], k.proto, k.family]);
    let mut h = k.addr[0] ^ k.addr[1] ^ k.addr[2] ^ k.addr[3] ^ tail;
    h ^= h >> 16;
    h = h.wrapping_mul(0x9e37_79b1);
    h >> (32 - bits)
}

fn service_key(vip: IpAddr, port: u16, proto: Protocol) -> types::lb_service_key {
    let (addr, family) = addr_words(vip);
    types::lb_service_key {
        addr,
        port: port.to_be(),
        proto: match proto {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
        },
        family,
    }
}

/// The maps a data plane pins, by file name. The table maps come first: they must all be reused
/// for a controller to adopt a data plane in place.
pub const PINNED_MAPS: [&str; 15] = [
    "vip_index",
    "routes",
    "services",
    "table_slots",
    "backend_gen",
    "backends",
    "backend_addrs",
    "backend_meta",
    "service_names",
    "lb_meta",
    "bss",
    "flows",
    "flow_pending",
    "stats",
    "backend_traffic",
];
const TABLE_MAPS: usize = 10;

/// This build's layout and program identities (build.rs).
pub const LAYOUT_HASH: &str = env!("LB_LAYOUT_HASH");
pub const PROGRAM_HASH: &str = env!("LB_PROGRAM_HASH");

pub fn layout_hash() -> u64 {
    LAYOUT_HASH.parse().unwrap_or(0)
}

pub fn program_hash() -> u64 {
    PROGRAM_HASH.parse().unwrap_or(0)
}

/// How to load on a pinned data plane's maps.
pub struct Reuse {
    /// Its directory (pin::plane_dir).
    pub dir: std::path::PathBuf,
    /// Its lb_meta says it has this build's layout: every map is reused as it is.
    pub same_layout: bool,
    /// Its program, whose BTF describes its maps when the layout differs.
    pub old_prog_id: u32,
}

fn open_maps<'a, 'o>(open: &'a mut skel::OpenLbSkel<'o>) -> Vec<(&'static str, &'a mut libbpf_rs::OpenMapMut<'o>)> {
    let m = &mut open.maps;
    vec![
        ("vip_index", &mut m.vip_index),
        ("routes", &mut m.routes),
        ("services", &mut m.services),
        ("table_slots", &mut m.table_slots),
        ("backend_gen", &mut m.backend_gen),
        ("backends", &mut m.backends),
        ("backend_addrs", &mut m.backend_addrs),
        ("backend_meta", &mut m.backend_meta),
        ("service_names", &mut m.service_names),
        ("lb_meta", &mut m.lb_meta),
        ("bss", &mut m.bss),
        ("flows", &mut m.flows),
        ("flow_pending", &mut m.flow_pending),
        ("stats", &mut m.stats),
        ("backend_traffic", &mut m.backend_traffic),
    ]
}

fn loaded_maps<'a, 'o>(skel: &'a LbSkel<'o>) -> Vec<(&'static str, &'a libbpf_rs::MapMut<'o>)> {
    let m = &skel.maps;
    vec![
        ("vip_index", &m.vip_index),
        ("routes", &m.routes),
        ("services", &m.services),
        ("table_slots", &m.table_slots),
        ("backend_gen", &m.backend_gen),
        ("backends", &m.backends),
        ("backend_addrs", &m.backend_addrs),
        ("backend_meta", &m.backend_meta),
        ("service_names", &m.service_names),
        ("lb_meta", &m.lb_meta),
        ("bss", &m.bss),
        ("flows", &m.flows),
        ("flow_pending", &m.flow_pending),
        ("stats", &m.stats),
        ("backend_traffic", &m.backend_traffic),
    ]
}

/// A type's structure as BTF describes it, for comparing one build's map layout with another's:
/// member names, offsets and types, recursively; sizes of arrays; variables of data sections.
fn signature(btf: &libbpf_rs::btf::Btf<'_>, id: libbpf_rs::btf::TypeId, depth: u32) -> String {
    use libbpf_rs::btf::{types, BtfKind, BtfType};
    let Some(t) = btf.type_by_id::<BtfType<'_>>(id) else { return "?".to_string() };
    let t = t.skip_mods_and_typedefs();
    let name = t.name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if depth > 8 {
        return name;
    }
    if let Ok(c) = types::Composite::try_from(t) {
        let members: Vec<String> = c
            .iter()
            .map(|m| {
                let n = m.name.map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                format!("{n}@{:?}:{}", m.attr, signature(btf, m.ty, depth + 1))
            })
            .collect();
        return format!("{name}{{{}}}", members.join(";"));
    }
    if let Ok(a) = types::Array::try_from(t) {
        return format!("[{}; {}]", signature(btf, a.contained_type().type_id(), depth + 1), a.capacity());
    }
    if t.kind() == BtfKind::DataSec {
        if let Ok(d) = types::DataSec::try_from(t) {
            let vars: Vec<String> = d
                .iter()
                .map(|v| {
                    let var = btf.type_by_id::<BtfType<'_>>(v.ty);
                    let vname = var.and_then(|x| x.name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    let inner = var.and_then(|x| x.next_type()).map_or("?".to_string(), |x| signature(btf, x.type_id(), depth + 1));
                    format!("{vname}@{}+{}:{inner}", v.offset, v.size)
                })
                .collect();
            return format!("{name}{{{}}}", vars.join(";"));
        }
    }
    format!("{:?}:{name}", t.kind())
}

/// Points the open skeleton's maps at a pinned data plane's wherever their layout allows, and
/// returns the names of those that could not be (created fresh). Fails when a table map cannot
/// be reused: then the data plane cannot be adopted in place.
fn reuse_maps(open: &mut skel::OpenLbSkel<'_>, r: &Reuse) -> Result<Vec<&'static str>> {
    // BTF only when the layouts differ: the old program's, and this object's.
    let btfs = if r.same_layout {
        None
    } else {
        let old = libbpf_rs::btf::Btf::from_prog_id(r.old_prog_id).context("reading the pinned program's BTF")?;
        // SAFETY: the open object lives as long as `open`, which outlives this borrow.
        let obj = unsafe { open.open_object().as_libbpf_object().as_ref() };
        let new = libbpf_rs::btf::Btf::from_bpf_object(obj)?.context("this build's BPF object has no BTF")?;
        Some((old, new))
    };
    let mut fresh: Vec<&'static str> = Vec::new();
    for (name, map) in open_maps(open) {
        let path = r.dir.join(name);
        if !path.exists() {
            fresh.push(name);
            continue;
        }
        let pinned = libbpf_rs::MapHandle::from_pinned_path(&path).with_context(|| format!("opening the pinned map {}", path.display()))?;
        let info = pinned.info()?.info;
        let sized = name == "table_slots" || name == "flows" || name == "flow_pending";
        let same_shape = info.type_ == map.map_type() as u32
            && info.key_size == map.key_size()
            && info.value_size == map.value_size()
            && (sized || info.max_entries == map.max_entries());
        let same_layout = match &btfs {
            None => true,
            Some((old, new)) => {
                // SAFETY: the map pointer comes from the open object and is valid for this call.
                let (k, v) = unsafe {
                    let p = map.as_libbpf_object().as_ptr();
                    (libbpf_sys_btf_key(p), libbpf_sys_btf_value(p))
                };
                signature(old, info.btf_key_type_id.into(), 0) == signature(new, k.into(), 0)
                    && signature(old, info.btf_value_type_id.into(), 0) == signature(new, v.into(), 0)
            }
        };
        if same_shape && same_layout {
            if sized {
                map.set_max_entries(info.max_entries)?;
            }
            map.reuse_pinned_map(&path).with_context(|| format!("reusing the pinned map {}", path.display()))?;
        } else {
            fresh.push(name);
        }
    }
    let tables: Vec<&str> = fresh.iter().copied().filter(|n| PINNED_MAPS[..TABLE_MAPS].contains(n)).collect();
    if !tables.is_empty() {
        bail!(
            "the pinned data plane's table maps have another layout than this version's ({}); it cannot be \
             adopted in place: remove it with `lb detach` (an outage) and attach anew",
            tables.join(", ")
        );
    }
    Ok(fresh)
}

/// # Safety
/// `map` must point to a live `bpf_map` of an open or loaded object.
unsafe fn libbpf_sys_btf_key(map: *const libbpf_rs::libbpf_sys::bpf_map) -> u32 {
    libbpf_rs::libbpf_sys::bpf_map__btf_key_type_id(map)
}

/// # Safety
/// `map` must point to a live `bpf_map` of an open or loaded object.
unsafe fn libbpf_sys_btf_value(map: *const libbpf_rs::libbpf_sys::bpf_map) -> u32 {
    libbpf_rs::libbpf_sys::bpf_map__btf_value_type_id(map)
}

/// Copies the bytes of `old` (a value of type `old_ty` in `old_btf`) into a value of type
/// `new_ty` in `new_btf` of `new_size` bytes, member by member by name; members the old layout
/// does not have are zero.
fn convert(old: &[u8], old_btf: &libbpf_rs::btf::Btf<'_>, old_ty: u32, new_btf: &libbpf_rs::btf::Btf<'_>, new_ty: u32, new_size: usize) -> Vec<u8> {
    use libbpf_rs::btf::{types, types::MemberAttr, BtfType};
    let members = |btf: &libbpf_rs::btf::Btf<'_>, ty: u32, total: usize| -> Vec<(String, usize, usize)> {
        let Some(t) = btf.type_by_id::<BtfType<'_>>(ty.into()) else { return Vec::new() };
        let Ok(c) = types::Composite::try_from(t.skip_mods_and_typedefs()) else { return Vec::new() };
        let mut out: Vec<(String, usize)> = c
            .iter()
            .filter_map(|m| match m.attr {
                MemberAttr::Normal { offset } => Some((m.name.map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), offset as usize / 8)),
                _ => None,
            })
            .collect();
        out.sort_by_key(|m| m.1);
        let ends: Vec<usize> = out.iter().skip(1).map(|m| m.1).chain(std::iter::once(total)).collect();
        out.into_iter().zip(ends).map(|((n, off), end)| (n, off, end.saturating_sub(off))).collect()
    };
    let mut value = vec![0u8; new_size];
    let olds = members(old_btf, old_ty, old.len());
    for (name, off, size) in members(new_btf, new_ty, new_size) {
        if let Some((_, o_off, o_size)) = olds.iter().find(|m| m.0 == name) {
            let n = size.min(*o_size).min(old.len().saturating_sub(*o_off)).min(new_size.saturating_sub(off));
            value[off..off + n].copy_from_slice(&old[*o_off..*o_off + n]);
        }
    }
    value
}

impl Dataplane {
    /// Pins the maps named in `names` (all when None) under `dir`, replacing pins that are there.
    pub fn pin_maps(&self, dir: &std::path::Path, names: Option<&[&str]>) -> Result<()> {
        for (name, map) in loaded_maps(&self.skel) {
            if names.is_some_and(|n| !n.contains(&name)) {
                continue;
            }
            let path = dir.join(name);
            let _ = std::fs::remove_file(&path);
            pin::pin_fd(&map.as_fd(), &path)?;
        }
        Ok(())
    }

    /// Copies every flow of the pinned flow table at `path` (another build's layout, described
    /// by the BTF of program `old_prog_id`) into this data plane's, converting each entry by
    /// member names, once before `switch` (which replaces the old program) and once after it,
    /// for the flows the old program made in between. Entries already present are left alone.
    /// Returns how many were copied.
    pub fn carry_flows(&self, path: &std::path::Path, old_prog_id: u32, switch: impl FnOnce() -> Result<()>) -> Result<u64> {
        // Read before the switch: the old program, and its BTF's last holder, goes with it.
        let old_btf = libbpf_rs::btf::Btf::from_prog_id(old_prog_id).context("reading the pinned program's BTF")?;
        let new_btf = libbpf_rs::btf::Btf::from_prog_id(prog_id(&self.skel.progs.lb_xdp)?).context("reading this program's BTF")?;
        let mut tables = vec![(libbpf_rs::MapHandle::from_pinned_path(path)?, &self.skel.maps.flows, 2)];
        // The half-open flows too, when the old version had them.
        if let Ok(old) = libbpf_rs::MapHandle::from_pinned_path(path.with_file_name("flow_pending")) {
            tables.push((old, &self.skel.maps.flow_pending, 1));
        }
        let copy = || -> Result<u64> {
            let mut copied = 0;
            for (old, new, choices) in &tables {
                let info = old.info()?.info;
                let new_info = new.info()?.info;
                let convert_slot =
                    |v: &[u8]| convert(v, &old_btf, info.btf_value_type_id, &new_btf, new_info.btf_value_type_id, new_info.value_size as usize);
                let mut put = |slot: Vec<u8>| -> Result<()> {
                    copied += put_flow(*new, new_info.max_entries / FLOW_WAYS, *choices, &slot)? as u64;
                    Ok(())
                };
                if info.type_ == libbpf_rs::libbpf_sys::BPF_MAP_TYPE_ARRAY {
                    for (_, v) in old.lookup_batch(8192, MapFlags::ANY, MapFlags::ANY)? {
                        if v.len() >= 8 && v[..8] != [0; 8] {
                            put(convert_slot(&v))?;
                        }
                    }
                } else {
                    // A version before the set-associative table: an LRU hash keyed by the
                    // 5-tuple (lb_flow_key), valued {backend u32, gen u32, seen_ms u64}.
                    for k in old.keys() {
                        let Some(v) = old.lookup(&k, MapFlags::ANY)? else { continue };
                        if let Some(slot) = slot_from_keyed(&k, &v, new_info.value_size as usize) {
                            put(slot)?;
                        }
                    }
                }
            }
            Ok(copied)
        };
        let before = copy()?;
        switch()?;
        Ok(before + copy()?)
    }

    /// The number of established flows in the flow table (walks it).
    pub fn flow_count(&self) -> Result<u64> {
        count_flows(&self.skel.maps.flows)
    }

    /// The established flows: (slot, tag, backend id), for tests and tools.
    pub fn flow_slots(&self) -> Result<Vec<(u32, u64, u32)>> {
        let mut out = Vec::new();
        for (k, v) in self.skel.maps.flows.lookup_batch(8192, MapFlags::ANY, MapFlags::ANY)? {
            let f = value_of::<types::lb_flow>(&v);
            if f.tag != 0 {
                out.push((value_of::<u32>(&k), f.tag, f.backend as u32));
            }
        }
        Ok(out)
    }

    pub fn program_id(&self) -> Result<u32> {
        prog_id(&self.skel.progs.lb_xdp)
    }

    /// Writes lb_meta: this build's identities, the controller, the sizes.
    pub fn write_meta(&self, attached_ms: u64, controller: Option<(u32, u64)>, ifindex: u32) -> Result<()> {
        let meta = types::lb_meta {
            magic: LB_META_MAGIC,
            layout: layout_hash(),
            program: program_hash(),
            attached_ms,
            controller_since: controller.map_or(0, |c| c.1),
            controller_pid: controller.map_or(0, |c| c.0),
            ifindex,
            table_capacity: self.limits.capacity,
            conntrack_size: self.skel.maps.flows.info()?.info.max_entries,
            reserved: [0; 2],
        };
        self.skel.maps.lb_meta.update(&0u32.to_ne_bytes(), bytes_of(&meta), MapFlags::ANY)?;
        Ok(())
    }

    /// Records in lb_meta the interface that holds the VIPs (--announce; 0: none), so that
    /// `lb detach` can withdraw them.
    pub fn set_announce_ifindex(&self, ifindex: u32) -> Result<()> {
        let m = &self.skel.maps.lb_meta;
        let v = m.lookup(&0u32.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
        let mut meta: types::lb_meta = value_of(&v);
        meta.reserved[0] = ifindex as u64;
        m.update(&0u32.to_ne_bytes(), bytes_of(&meta), MapFlags::ANY)?;
        Ok(())
    }

    /// Rebuilds this data plane's state from its (adopted) maps, names it after `pool`, and
    /// retires ids that an interrupted change left claiming a backend twice. The next
    /// [`Dataplane::apply`] then writes only what differs from what the maps hold.
    pub fn adopt(&mut self, pool: &Pool) -> Result<()> {
        let live = read_live(&self.skel)?;
        let index_of = |k: &plan::RouteKey| vip_index(&service_key(k.addr, k.port, k.proto));
        let slots = &self.slots;
        let (mut state, retire) = plan::State::rebuild(&live, pool, &self.limits, &index_of, &|i| slots.read(i));
        // What the file no longer names goes by the names the maps kept (for the reload log),
        // unless another service has the name now.
        let taken: std::collections::HashSet<String> = state.services.iter().map(|s| s.name.clone()).collect();
        for s in &mut state.services {
            if s.name.starts_with('(') {
                let k = service_key(s.key.addr, s.key.port, s.key.proto);
                if let Some(v) = self.skel.maps.service_names.lookup(bytes_of(&k), MapFlags::ANY)? {
                    let name = name_text(&value_of::<types::lb_name>(&v).name);
                    if !taken.contains(&name) {
                        s.name = name;
                    }
                }
            }
            for b in s.backends.iter_mut().filter(|b| b.identity.starts_with('#')) {
                if let Some(v) = self.skel.maps.backend_meta.lookup(&b.id.to_ne_bytes(), MapFlags::ANY)? {
                    b.identity = name_text(&value_of::<types::lb_backend_meta>(&v).name);
                }
            }
        }
        for id in 1..=self.limits.max_backend_id.min(state_highest(&live)) {
            if let Some(v) = self.skel.maps.backend_gen.lookup(&id.to_ne_bytes(), MapFlags::ANY)? {
                self.gens.insert(id, value_of::<u32>(&v));
            }
        }
        // The MACs the records hold stand until the neighbour table says otherwise.
        for (id, address, ..) in &live.backends {
            let rec = self.skel.maps.backends.lookup(&id.to_ne_bytes(), MapFlags::ANY)?.map(|v| value_of::<types::lb_backend>(&v));
            if let Some(rec) = rec.filter(|b| b.flags & LB_BACKEND_MAC_KNOWN != 0) {
                self.macs.entry(self.neighbour_of(*address)).or_insert(rec.mac);
            }
        }
        self.state = state;
        for (id, address) in retire {
            self.write_backend(id, address, false, false)?;
        }
        Ok(())
    }
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

fn state_highest(live: &plan::LiveMaps) -> u32 {
    live.backends.iter().map(|b| b.0).max().unwrap_or(0)
}

/// The counter maps of a running data plane, opened again for another thread (the metrics
/// server reads them at scrape time without touching the serve loop's state).
#[derive(Debug)]
pub struct CounterMaps {
    stats: libbpf_rs::MapHandle,
    traffic: libbpf_rs::MapHandle,
    flows: libbpf_rs::MapHandle,
}

impl Dataplane {
    pub fn counter_maps(&self) -> Result<CounterMaps> {
        let m = &self.skel.maps;
        Ok(CounterMaps {
            stats: libbpf_rs::MapHandle::try_from(&m.stats)?,
            traffic: libbpf_rs::MapHandle::try_from(&m.backend_traffic)?,
            flows: libbpf_rs::MapHandle::try_from(&m.flows)?,
        })
    }
}

impl CounterMaps {
    /// Every counter, for the services and backends of `model` (by backend id).
    pub fn snapshot(&self, model: &crate::metrics::Model) -> Result<Snapshot> {
        use types::lb_stat as S;
        let mut snap = Snapshot {
            forwarded: 0,
            passed: percpu_sum(&self.stats, S::LB_STAT_PASSED.0)?,
            drops: Vec::with_capacity(8),
            conntrack: Vec::with_capacity(4),
            icmp_forwarded: percpu_sum(&self.stats, S::LB_ICMP_FORWARDED.0)?,
            services: Vec::with_capacity(model.services.len()),
        };
        for (name, stat) in drop_counters() {
            snap.drops.push((name, percpu_sum(&self.stats, stat.0)?));
        }
        for (name, stat) in ct_counters() {
            snap.conntrack.push((name, percpu_sum(&self.stats, stat.0)?));
        }
        for s in &model.services {
            let mut backends = Vec::with_capacity(s.backends.len());
            let mut total = Traffic::default();
            for b in &s.backends {
                let t = traffic_of(&self.traffic, b.id)?;
                total.packets += t.packets;
                total.bytes += t.bytes;
                backends.push(BackendCounters {
                    label: b.identity.clone(),
                    address: b.address.parse().unwrap_or(IpAddr::from([0, 0, 0, 0])),
                    weight: b.weight,
                    mac_known: b.mac_known,
                    health: None,
                    traffic: t,
                });
            }
            snap.forwarded += total.packets;
            snap.services.push(ServiceCounters { name: s.name.clone(), endpoint: format!("{}:{}/{}", s.vip, s.port, s.protocol), traffic: total, backends });
        }
        Ok(snap)
    }

    /// Entries in the flow table, counted by walking it in batches.
    pub fn flow_entries(&self) -> Result<u64> {
        count_flows(&self.flows)
    }
}

/// The maps of a data plane by pin name: this process's own, or a pinned one's.
pub trait MapSource {
    fn map(&self, name: &str) -> Result<&dyn MapCore>;
}

impl MapSource for LbSkel<'_> {
    fn map(&self, name: &str) -> Result<&dyn MapCore> {
        loaded_maps(self).into_iter().find(|m| m.0 == name).map(|m| m.1 as &dyn MapCore).context("no such map")
    }
}

/// A pinned data plane's maps, opened by path.
pub struct PinnedMaps(HashMap<&'static str, libbpf_rs::MapHandle>);

impl PinnedMaps {
    pub fn open(dir: &std::path::Path) -> Result<PinnedMaps> {
        let mut maps = HashMap::new();
        for name in PINNED_MAPS {
            let path = dir.join(name);
            let m = libbpf_rs::MapHandle::from_pinned_path(&path).with_context(|| format!("opening the pinned map {}", path.display()))?;
            maps.insert(name, m);
        }
        Ok(PinnedMaps(maps))
    }

    /// lb_meta's one value, if it has the magic number this build knows.
    pub fn meta(&self) -> Result<Option<types::lb_meta>> {
        let m = self.map("lb_meta")?;
        let v = m.lookup(&0u32.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
        let meta: types::lb_meta = value_of(&v);
        Ok((meta.magic == LB_META_MAGIC).then_some(meta))
    }

    /// Writes lb_meta's controller fields (None: no controller).
    pub fn set_controller(&self, controller: Option<(u32, u64)>) -> Result<()> {
        let m = self.map("lb_meta")?;
        let v = m.lookup(&0u32.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
        let mut meta: types::lb_meta = value_of(&v);
        meta.controller_pid = controller.map_or(0, |c| c.0);
        meta.controller_since = controller.map_or(0, |c| c.1);
        m.update(&0u32.to_ne_bytes(), bytes_of(&meta), MapFlags::ANY)?;
        Ok(())
    }

    /// The interface lb_meta says holds the VIPs (--announce), if any.
    pub fn announce_ifindex(&self) -> Result<Option<u32>> {
        Ok(self.meta()?.map(|m| m.reserved[0] as u32).filter(|&i| i != 0))
    }

    /// Everything `lb status` shows, read from the maps.
    pub fn status(&self) -> Result<crate::stats::PlaneStatus> {
        plane_status(self)
    }
}

impl MapSource for PinnedMaps {
    fn map(&self, name: &str) -> Result<&dyn MapCore> {
        self.0.get(name).map(|m| m as &dyn MapCore).with_context(|| format!("no pinned map {name}"))
    }
}

/// Reads what the maps hold, for [`plan::State::rebuild`] and `lb status`.
fn read_live(src: &dyn MapSource) -> Result<plan::LiveMaps> {
    struct Maps<'a> {
        vip_index: &'a dyn MapCore,
        routes: &'a dyn MapCore,
        services: &'a dyn MapCore,
        backend_meta: &'a dyn MapCore,
        backends: &'a dyn MapCore,
        backend_addrs: &'a dyn MapCore,
    }
    let m = Maps {
        vip_index: src.map("vip_index")?,
        routes: src.map("routes")?,
        services: src.map("services")?,
        backend_meta: src.map("backend_meta")?,
        backends: src.map("backends")?,
        backend_addrs: src.map("backend_addrs")?,
    };
    let skel = SkelLike { maps: m };
    let mut live = plan::LiveMaps::default();
    let shared = types::lb_vip_index_layout::LB_VIP_INDEX_SHARED.0;
    // Whole arrays in batches of 4096 entries: 16 system calls for the index instead of 65,536.
    for (k, v) in skel.maps.vip_index.lookup_batch(4096, MapFlags::ANY, MapFlags::ANY)? {
        let idx: u32 = value_of(&k);
        match value_of::<u32>(&v) {
            0 => {}
            x if x == shared => live.index.push((idx, plan::IndexEntry::Shared)),
            id => live.index.push((idx, plan::IndexEntry::Route(id))),
        }
    }
    for (k, v) in skel.maps.routes.lookup_batch(4096, MapFlags::ANY, MapFlags::ANY)? {
        let id: u32 = value_of(&k);
        if id == 0 {
            continue;
        }
        if let Some(r) = route_of(&value_of(&v)) {
            live.routes.push((id, r));
        }
    }
    for k in skel.maps.services.keys() {
        if let Some(v) = skel.maps.services.lookup(&k, MapFlags::ANY)? {
            if let Some(r) = route_of(&value_of(&v)) {
                live.hashed.push(r);
            }
        }
    }
    for k in skel.maps.backend_meta.keys() {
        let id: u32 = value_of(&k);
        let Some(m) = skel.maps.backend_meta.lookup(&k, MapFlags::ANY)? else { continue };
        let Some(rec) = skel.maps.backends.lookup(&k, MapFlags::ANY)? else { continue };
        let rec: types::lb_backend = value_of(&rec);
        if rec.flags & LB_BACKEND_IN_POOL == 0 {
            continue;
        }
        let Some(a) = skel.maps.backend_addrs.lookup(&k, MapFlags::ANY)? else { continue };
        let (m, a): (types::lb_backend_meta, types::lb_addr) = (value_of(&m), value_of(&a));
        let (Some(service), Some(address)) = (key_of(&m.service), addr_of(&a.addr, a.family)) else { continue };
        let state = match m.state {
            1 => crate::config::BackendState::Drain,
            2 => crate::config::BackendState::Down,
            _ => crate::config::BackendState::Active,
        };
        live.backends.push((
            id,
            address,
            rec.flags & LB_BACKEND_ALIVE != 0,
            plan::BackendMeta { service, identity: m.identity, weight: m.weight, state },
        ));
    }
    live.backends.sort_by_key(|b| b.0);
    Ok(live)
}

struct SkelLike<M> {
    maps: M,
}

fn map_info(m: &dyn MapCore) -> Result<libbpf_rs::libbpf_sys::bpf_map_info> {
    Ok(libbpf_rs::MapInfo::new(m.as_fd())?.info)
}

fn addr_of(words: &[u32; 4], family: u8) -> Option<IpAddr> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    match family {
        f if f == types::lb_family::LB_FAMILY_V4.0 as u8 => Some(IpAddr::from([bytes[0], bytes[1], bytes[2], bytes[3]])),
        f if f == types::lb_family::LB_FAMILY_V6.0 as u8 => <[u8; 16]>::try_from(bytes).ok().map(IpAddr::from),
        _ => None,
    }
}

fn key_of(k: &types::lb_service_key) -> Option<plan::RouteKey> {
    let proto = match k.proto {
        6 => Protocol::Tcp,
        17 => Protocol::Udp,
        _ => return None,
    };
    Some(plan::RouteKey { addr: addr_of(&k.addr, k.family)?, port: u16::from_be(k.port), proto })
}

fn route_of(r: &types::lb_service) -> Option<plan::Route> {
    Some(plan::Route {
        key: key_of(&r.key)?,
        base: r.base,
        slots: r.slots,
        hash: if r.hash_mode == types::lb_hash_mode::LB_HASH_FLOW.0 { HashMode::Flow } else { HashMode::ClientIp },
        conntrack: r.flags & types::lb_service_flags::LB_SVC_CONNTRACK.0 != 0,
        forward: match r.forward {
            x if x == types::lb_forward::LB_FWD_IPIP.0 => Forward::Ipip,
            x if x == types::lb_forward::LB_FWD_GUE.0 => Forward::Gue,
            _ => Forward::L2,
        },
        gue_port: u16::from_be(r.gue_port),
        table_len: r.table_len,
    })
}

const LB_META_MAGIC: u64 = 0x3130_4154_454d_424c;

/// Counter names and their enum lb_stat values, in the data plane's order.
fn drop_counters() -> [(&'static str, types::lb_stat); 8] {
    use types::lb_stat as S;
    [
        ("malformed", S::LB_DROP_MALFORMED),
        ("no_backend", S::LB_DROP_NO_BACKEND),
        ("no_mac", S::LB_DROP_NO_MAC),
        ("fragment", S::LB_DROP_FRAGMENT),
        ("no_table", S::LB_DROP_NO_TABLE),
        ("too_big", S::LB_STAT_TOO_BIG),
        ("oversize", S::LB_DROP_OVERSIZE),
        ("encap", S::LB_DROP_ENCAP),
    ]
}

fn ct_counters() -> [(&'static str, types::lb_stat); 6] {
    use types::lb_stat as S;
    [
        ("hit", S::LB_CT_HIT),
        ("miss", S::LB_CT_MISS),
        ("new", S::LB_CT_NEW),
        ("stale", S::LB_CT_STALE),
        ("pending", S::LB_CT_PENDING),
        ("evicted", S::LB_CT_EVICTED),
    ]
}

/// Writes a flow-table slot (lb.h, struct lb_flow, as bytes) into a free slot of the buckets its
/// tag names (two for the flow table, one for the half-open table); false when the flow is there
/// already or the buckets are full.
fn put_flow(map: &dyn MapCore, buckets: u32, choices: usize, slot: &[u8]) -> Result<bool> {
    let tag = u64::from_ne_bytes(slot[..8].try_into()?);
    let first = crate::flowhash::tag_bucket(tag, buckets) * FLOW_WAYS;
    let second = crate::flowhash::tag_bucket2(tag, buckets) * FLOW_WAYS;
    for i in [first..first + FLOW_WAYS, second..second + FLOW_WAYS].into_iter().take(choices).flatten() {
        let cur = map.lookup(&i.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
        let cur_tag = cur.get(..8).map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or_default()));
        if cur_tag == tag {
            return Ok(false);
        }
        if cur_tag == 0 {
            map.update(&i.to_ne_bytes(), slot, MapFlags::ANY)?;
            return Ok(true);
        }
    }
    Ok(false)
}

/// A slot for an entry of the flow table's earlier form (an LRU hash: key struct lb_flow_key
/// {src[16], dst[16], sport, dport, proto, family, pad[2]}; value {backend u32, gen u32,
/// seen_ms u64}), in a slot of `size` bytes.
fn slot_from_keyed(k: &[u8], v: &[u8], size: usize) -> Option<Vec<u8>> {
    if k.len() < 38 || v.len() < 16 || size < 16 {
        return None;
    }
    let addr = |b: &[u8]| -> Option<IpAddr> {
        match k[37] {
            4 => Some(IpAddr::from(<[u8; 4]>::try_from(&b[..4]).ok()?)),
            6 => Some(IpAddr::from(<[u8; 16]>::try_from(&b[..16]).ok()?)),
            _ => None,
        }
    };
    let (src, dst) = (addr(&k[0..16])?, addr(&k[16..32])?);
    let port = |i: usize| u16::from_be_bytes([k[i], k[i + 1]]);
    let tag = crate::flowhash::flow_tag(src, dst, port(32), port(34), k[36]);
    let backend = u32::from_ne_bytes(v[0..4].try_into().ok()?);
    let gen = u32::from_ne_bytes(v[4..8].try_into().ok()?);
    let seen_ms = u64::from_ne_bytes(v[8..16].try_into().ok()?);
    let mut slot = vec![0u8; size];
    slot[0..8].copy_from_slice(&tag.to_ne_bytes());
    slot[8..10].copy_from_slice(&(backend as u16).to_ne_bytes());
    slot[10..12].copy_from_slice(&(gen as u16).to_ne_bytes());
    slot[12..16].copy_from_slice(&((seen_ms >> 4) as u32).to_ne_bytes());
    Some(slot)
}

/// Slots of a flow table (lb.h, struct lb_flow) that hold a flow: a nonzero tag.
fn count_flows(m: &dyn MapCore) -> Result<u64> {
    let mut n = 0;
    for (_, v) in m.lookup_batch(8192, MapFlags::ANY, MapFlags::ANY)? {
        n += (v.len() >= 8 && v[..8] != [0; 8]) as u64;
    }
    Ok(n)
}

fn percpu_sum(m: &dyn MapCore, key: u32) -> Result<u64> {
    let per_cpu = m.lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
    Ok(per_cpu.iter().map(|v| value_of::<u64>(v)).sum())
}

/// `lb status`: the data plane's services, backends and counters as its maps hold them.
fn plane_status(src: &dyn MapSource) -> Result<crate::stats::PlaneStatus> {
    use crate::stats::{BackendStatus, PlaneStatus, ServiceStatus};
    let live = read_live(src)?;
    let slots_map = src.map("table_slots")?;
    let capacity = map_info(slots_map)?.max_entries * 2;
    let limits = plan::Limits {
        capacity,
        max_backend_id: map_info(src.map("backends")?)?.max_entries - 1,
        max_route_id: map_info(src.map("routes")?)?.max_entries - 1,
    };
    let index_of = |k: &plan::RouteKey| vip_index(&service_key(k.addr, k.port, k.proto));
    let pairs = std::cell::RefCell::new(HashMap::<u32, [u32; 2]>::new());
    let slot_at = |i: u32| -> u32 {
        let mut cache = pairs.borrow_mut();
        let pair = *cache.entry(i / 2).or_insert_with(|| {
            slots_map.lookup(&(i / 2).to_ne_bytes(), MapFlags::ANY).ok().flatten().map_or([0, 0], |v| value_of::<types::lb_slot_pair>(&v).id)
        });
        pair[(i % 2) as usize]
    };
    let (state, _) = plan::State::rebuild(&live, &Pool::default(), &limits, &index_of, &slot_at);
    let stats = src.map("stats")?;
    let traffic = src.map("backend_traffic")?;
    let names = src.map("service_names")?;
    let meta = src.map("backend_meta")?;
    let backends = src.map("backends")?;
    let mut out = PlaneStatus {
        passed: percpu_sum(stats, types::lb_stat::LB_STAT_PASSED.0)?,
        icmp_forwarded: percpu_sum(stats, types::lb_stat::LB_ICMP_FORWARDED.0)?,
        flows: count_flows(src.map("flows")?)?,
        flow_capacity: map_info(src.map("flows")?)?.max_entries,
        ..Default::default()
    };
    for (n, st) in drop_counters() {
        out.drops.push((n, percpu_sum(stats, st.0)?));
    }
    for (n, st) in ct_counters() {
        out.conntrack.push((n, percpu_sum(stats, st.0)?));
    }
    for s in &state.services {
        let k = service_key(s.key.addr, s.key.port, s.key.proto);
        let name = names
            .lookup(bytes_of(&k), MapFlags::ANY)?
            .map_or_else(|| s.name.clone(), |v| name_text(&value_of::<types::lb_name>(&v).name));
        let hash_of: HashMap<u32, u64> = live.backends.iter().map(|b| (b.0, b.3.identity)).collect();
        let digest = crate::table::digest_of_hashes(s.owners.iter().map(|o| hash_of.get(o).copied().unwrap_or(0)));
        let mut svc = ServiceStatus {
            name,
            vip: s.key.addr,
            digest,
            endpoint: s.endpoint.clone(),
            hash: s.hash.as_str(),
            forward: s.forward.as_str(),
            conntrack: s.conntrack,
            slots: s.slots,
            traffic: Traffic::default(),
            backends: Vec::new(),
        };
        let mut owned: HashMap<u32, u32> = HashMap::new();
        for &o in &s.owners {
            *owned.entry(o).or_default() += 1;
        }
        for b in &s.backends {
            let identity = meta
                .lookup(&b.id.to_ne_bytes(), MapFlags::ANY)?
                .map_or_else(|| b.identity.clone(), |v| name_text(&value_of::<types::lb_backend_meta>(&v).name));
            let rec: types::lb_backend = value_of(&backends.lookup(&b.id.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default());
            let t = traffic_of(traffic, b.id)?;
            svc.traffic.packets += t.packets;
            svc.traffic.bytes += t.bytes;
            svc.backends.push(BackendStatus {
                identity,
                address: b.address,
                weight: b.weight,
                state: b.state.as_str(),
                mac_known: rec.flags & LB_BACKEND_MAC_KNOWN != 0,
                slots: owned.get(&b.id).copied().unwrap_or(0),
                traffic: t,
            });
        }
        out.forwarded += svc.traffic.packets;
        out.services.push(svc);
    }
    Ok(out)
}

/// One lb_traffic entry of a per-CPU map, summed over CPUs.
fn traffic_of(map: &dyn MapCore, id: u32) -> Result<Traffic> {
    let per_cpu = map.lookup_percpu(&id.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
    let mut t = Traffic::default();
    for v in per_cpu {
        let cpu: types::lb_traffic = value_of(&v);
        t.packets += cpu.packets;
        t.bytes += cpu.bytes;
    }
    Ok(t)
}
