//! The only module that talks to the kernel: loads the XDP program's skeleton, writes the tables
//! that the kernel-free core built into its maps, attaches it ([`link`]) and asks the network
//! stack about routes and neighbours ([`netlink`]).

pub mod decap;
pub mod link;
pub mod netlink;

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::time::Instant;

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

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

/// Flow-table entries by default (`--conntrack-size`): 262,144, about 30 MiB of kernel memory.
pub const DEFAULT_CONNTRACK_SIZE: u32 = 1 << 18;
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
        // The skeleton borrows its object for its whole life; one per process, so leaking the
        // few bytes of the holder is simpler than a self-referential struct.
        let object = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = LbSkelBuilder::default().open(object).context("opening the BPF object")?;
        // Two slots per array element (see lb.h, struct lb_slot_pair).
        open.maps
            .table_slots
            .set_max_entries(table_capacity.div_ceil(2))
            .with_context(|| format!("sizing the destination tables to {table_capacity} slots"))?;
        open.maps
            .flows
            .set_max_entries(conntrack_size.max(1))
            .with_context(|| format!("sizing the flow table to {conntrack_size} entries"))?;
        let skel = open.load().context("loading the XDP program (is this root, with CAP_BPF and CAP_NET_ADMIN?)")?;
        let slots = SlotsMapping::new(&skel.maps.table_slots, table_capacity)?;
        let limits = plan::Limits {
            capacity: table_capacity,
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
        dp.set_conntrack_timeouts(DEFAULT_CT_TCP_TIMEOUT, DEFAULT_CT_UDP_TIMEOUT)?;
        dp.set_mtu(1500)?;
        dp.tick()?;
        Ok(dp)
    }

    pub fn program_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.skel.progs.lb_xdp.as_fd()
    }

    /// Sets the source MAC of forwarded frames (the attached interface's).
    pub fn set_ifmac(&mut self, ifmac: [u8; 6]) -> Result<()> {
        let bss = self.skel.maps.bss_data.as_deref_mut().context("the program's .bss is not memory-mapped")?;
        bss.lb_settings.ifmac = ifmac;
        Ok(())
    }

    /// How long tracked flows may stay idle before they are forgotten (and re-hashed).
    pub fn set_conntrack_timeouts(&mut self, tcp: std::time::Duration, udp: std::time::Duration) -> Result<()> {
        let bss = self.skel.maps.bss_data.as_deref_mut().context("the program's .bss is not memory-mapped")?;
        bss.lb_settings.ct_tcp_timeout_ms = tcp.as_millis() as u64;
        bss.lb_settings.ct_udp_timeout_ms = udp.as_millis() as u64;
        Ok(())
    }

    /// The interface's MTU: an encapsulated packet longer than this is answered with "too big"
    /// (or dropped) instead of sent.
    pub fn set_mtu(&mut self, mtu: u32) -> Result<()> {
        let bss = self.skel.maps.bss_data.as_deref_mut().context("the program's .bss is not memory-mapped")?;
        bss.lb_settings.mtu = mtu;
        Ok(())
    }

    /// The outer source of encapsulated packets, per family: an address and how many of its
    /// leading bits stay fixed (the rest come from the flow hash; 32 or 128: one fixed address).
    /// For IPv6 at most the last 32 bits vary.
    pub fn set_encap_sources(&mut self, v4: Option<(std::net::Ipv4Addr, u8)>, v6: Option<(std::net::Ipv6Addr, u8)>) -> Result<()> {
        let bss = self.skel.maps.bss_data.as_deref_mut().context("the program's .bss is not memory-mapped")?;
        let s = &mut bss.lb_settings;
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
        let bss = self.skel.maps.bss_data.as_deref_mut().context("the program's .bss is not memory-mapped")?;
        bss.lb_settings.clock_ms = ms;
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
            self.write_backend(id, addr, alive)?;
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
            plan::Op::Backend { id, address, alive } => self.write_backend(*id, *address, *alive)?,
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
    fn write_backend(&self, id: u32, address: IpAddr, alive: bool) -> Result<()> {
        let mac = self.macs.get(&self.neighbour_of(address)).copied();
        let (addr, family) = addr_words(address);
        let to = types::lb_addr { addr, family, ..Default::default() };
        self.skel.maps.backend_addrs.update(&id.to_ne_bytes(), bytes_of(&to), MapFlags::ANY)?;
        let rec = types::lb_backend {
            mac: mac.unwrap_or([0; 6]),
            flags: if mac.is_some() { LB_BACKEND_MAC_KNOWN } else { 0 } | if alive { LB_BACKEND_ALIVE } else { 0 },
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
                self.write_backend(id, address, alive)?;
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
        let drops = [
            ("malformed", S::LB_DROP_MALFORMED),
            ("no_backend", S::LB_DROP_NO_BACKEND),
            ("no_mac", S::LB_DROP_NO_MAC),
            ("fragment", S::LB_DROP_FRAGMENT),
            ("no_table", S::LB_DROP_NO_TABLE),
            ("too_big", S::LB_STAT_TOO_BIG),
            ("oversize", S::LB_DROP_OVERSIZE),
            ("encap", S::LB_DROP_ENCAP),
        ];
        let mut snap = Snapshot {
            forwarded: 0,
            passed: self.stat(S::LB_STAT_PASSED)?,
            drops: Vec::with_capacity(drops.len()),
            conntrack: Vec::with_capacity(4),
            icmp_forwarded: self.stat(S::LB_ICMP_FORWARDED)?,
            services: Vec::with_capacity(self.state.services.len()),
        };
        for (name, stat) in drops {
            snap.drops.push((name, self.stat(stat)?));
        }
        for (name, stat) in [("hit", S::LB_CT_HIT), ("miss", S::LB_CT_MISS), ("new", S::LB_CT_NEW), ("stale", S::LB_CT_STALE)] {
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
                    traffic: traffic(&self.skel.maps.backend_traffic, b.id)?,
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
            total += traffic(&self.skel.maps.backend_traffic, b.id)?.packets;
        }
        Ok(total)
    }

    /// A counter of enum lb_stat, summed over CPUs.
    pub fn stat(&self, stat: types::lb_stat) -> Result<u64> {
        let per_cpu = self.skel.maps.stats.lookup_percpu(&stat.0.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
        Ok(per_cpu.iter().map(|v| value_of::<u64>(v)).sum())
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

/// One lb_traffic entry of a per-CPU map, summed over CPUs.
fn traffic(map: &impl MapCore, id: u32) -> Result<Traffic> {
    let per_cpu = map.lookup_percpu(&id.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
    let mut t = Traffic::default();
    for v in per_cpu {
        let cpu: types::lb_traffic = value_of(&v);
        t.packets += cpu.packets;
        t.bytes += cpu.bytes;
    }
    Ok(t)
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
