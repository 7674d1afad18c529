//! The only module that talks to the kernel: loads the XDP program's skeleton, writes the tables
//! that the kernel-free core built into its maps, attaches it ([`link`]) and asks the network
//! stack about routes and neighbours ([`netlink`]).

pub mod link;
pub mod netlink;

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::os::fd::AsFd;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use crate::config::{HashMode, Pool, Protocol, Service};
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

/// The default size of the table_slots array: 4 Mi slots, 16 MiB, room for 64 services at the
/// default 65537 slots (or 2 at the largest size) with as much again free for tables that are
/// being replaced.
pub const DEFAULT_TABLE_CAPACITY: u32 = 1 << 22;

pub struct Dataplane {
    skel: LbSkel<'static>,
    /// Entries of the table_slots array.
    capacity: u32,
    /// The next unused entry of table_slots.
    next_base: u32,
    /// What is installed, by id: for counters and MAC updates.
    services: Vec<InstalledService>,
}

/// A service as installed: its id is its index in the pool.
#[derive(Debug, Clone)]
struct InstalledService {
    name: String,
    endpoint: String,
    backends: Vec<InstalledBackend>,
}

#[derive(Debug, Clone)]
struct InstalledBackend {
    id: u32,
    label: String,
    address: IpAddr,
    weight: u32,
    mac: Option<[u8; 6]>,
}

/// Backend ids handed out by [`Dataplane::install`]: (service name, backend identity) -> id.
pub type BackendIds = HashMap<(String, String), u32>;

impl Dataplane {
    /// Opens and loads the program (the verifier runs here). Nothing is attached.
    pub fn load(table_capacity: u32) -> Result<Dataplane> {
        // The skeleton borrows its object for its whole life; one per process, so leaking the
        // few bytes of the holder is simpler than a self-referential struct.
        let object = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = LbSkelBuilder::default().open(object).context("opening the BPF object")?;
        open.maps
            .table_slots
            .set_max_entries(table_capacity)
            .with_context(|| format!("sizing the destination tables to {table_capacity} slots"))?;
        let skel = open.load().context("loading the XDP program (is this root, with CAP_BPF and CAP_NET_ADMIN?)")?;
        Ok(Dataplane { skel, capacity: table_capacity, next_base: 0, services: Vec::new() })
    }

    pub fn program_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.skel.progs.lb_xdp.as_fd()
    }

    /// Writes every service of `pool`: backends first, then each table, then the service entry
    /// that makes the table reachable, so no packet can meet a slot whose backend is unwritten.
    /// `mac_of` gives each backend's MAC when known.
    pub fn install(&mut self, pool: &Pool, ifmac: [u8; 6], mac_of: &dyn Fn(IpAddr) -> Option<[u8; 6]>) -> Result<BackendIds> {
        let bss = self.skel.maps.bss_data.as_deref_mut().context("the program's .bss is not memory-mapped")?;
        bss.lb_settings = types::lb_config { ifmac, pad: [0; 2] };

        let needed: u64 = pool.services.iter().map(|s| s.slots as u64).sum();
        if needed > (self.capacity - self.next_base) as u64 {
            bail!(
                "the pool's tables need {needed} slots, more than the {} left of the table capacity ({}); raise --table-capacity",
                self.capacity - self.next_base,
                self.capacity
            );
        }
        let mut ids = BackendIds::new();
        let mut next_id = 1u32;
        // Route id i + 1 is routes[i]: every service, then the fragment routes.
        let mut routes: Vec<types::lb_service> = Vec::new();
        // (vip, protocol) -> services on it, for the fragment routes.
        let mut per_vip: HashMap<(IpAddr, Protocol), Vec<usize>> = HashMap::new();
        // Where each service's table starts in table_slots.
        let mut bases = Vec::with_capacity(pool.services.len());
        for (i, s) in pool.services.iter().enumerate() {
            let mut backend_ids = Vec::with_capacity(s.backends.len());
            let mut installed = Vec::with_capacity(s.backends.len());
            for b in &s.backends {
                let id = next_id;
                next_id += 1;
                let mac = mac_of(b.address);
                self.write_backend(id, mac)?;
                ids.insert((s.name.clone(), b.identity()), id);
                backend_ids.push(id);
                installed.push(InstalledBackend { id, label: b.identity(), address: b.address, weight: b.weight, mac });
            }
            self.services.push(InstalledService { name: s.name.clone(), endpoint: s.endpoint(), backends: installed });

            let t = table::build_service(s);
            let base = self.next_base;
            self.next_base += s.slots;
            let keys: Vec<u8> = (base..base + s.slots).flat_map(|i| i.to_ne_bytes()).collect();
            let values: Vec<u8> = t
                .owners()
                .iter()
                .flat_map(|&o| if o == table::EMPTY { 0u32 } else { backend_ids[o as usize] }.to_ne_bytes())
                .collect();
            self.skel
                .maps
                .table_slots
                .update_batch(&keys, &values, s.slots, MapFlags::ANY, MapFlags::ANY)
                .with_context(|| format!("writing the table of service {}", s.name))?;

            routes.push(route(service_key(s.vip, s.port, s.protocol), base, s, s.hash));
            per_vip.entry((s.vip, s.protocol)).or_default().push(i);
            bases.push(base);
        }

        // Non-first IPv4 fragments carry no ports. They can follow the client's address when
        // exactly one service on that (vip, protocol) hashes by client address; otherwise
        // they are dropped and counted (the route says "flow").
        let mut per_vip: Vec<_> = per_vip.into_iter().collect();
        per_vip.sort_by_key(|(_, services)| services[0]);
        for ((vip, proto), services) in per_vip {
            let s = &pool.services[services[0]];
            let routable = services.len() == 1 && s.hash == HashMode::ClientIp;
            let mode = if routable { HashMode::ClientIp } else { HashMode::Flow };
            routes.push(route(service_key(vip, 0, proto), bases[services[0]], s, mode));
        }

        // Routes before anything points at them; the index entries, which make them
        // reachable, last.
        let mut by_index: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
        for (i, r) in routes.iter().enumerate() {
            let id = i as u32 + 1;
            self.skel.maps.routes.update(&id.to_ne_bytes(), bytes_of(r), MapFlags::ANY)?;
            self.skel.maps.services.update(bytes_of(&r.key), bytes_of(r), MapFlags::ANY)?;
            by_index.entry(vip_index(&r.key)).or_default().push(id);
        }
        for (index, ids) in by_index {
            let entry = if ids.len() == 1 { ids[0] } else { types::lb_vip_index_layout::LB_VIP_INDEX_SHARED.0 };
            self.skel.maps.vip_index.update(&index.to_ne_bytes(), &entry.to_ne_bytes(), MapFlags::ANY)?;
        }
        Ok(ids)
    }

    fn write_backend(&self, id: u32, mac: Option<[u8; 6]>) -> Result<()> {
        let rec = types::lb_backend {
            mac: mac.unwrap_or([0; 6]),
            flags: if mac.is_some() { LB_BACKEND_MAC_KNOWN } else { 0 },
            pad: 0,
        };
        self.skel.maps.backends.update(&id.to_ne_bytes(), bytes_of(&rec), MapFlags::ANY)?;
        Ok(())
    }

    /// The distinct backend addresses of the installed pool.
    pub fn backend_addresses(&self) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = Vec::new();
        for b in self.services.iter().flat_map(|s| &s.backends) {
            if !out.contains(&b.address) {
                out.push(b.address);
            }
        }
        out
    }

    /// Points every backend at `addr` to `mac` (None: unknown, its packets are dropped as
    /// `no_mac`). Returns whether anything changed. One 8-byte value per backend id, so a packet
    /// sees the old MAC or the new one.
    pub fn set_mac(&mut self, addr: IpAddr, mac: Option<[u8; 6]>) -> Result<bool> {
        let mut changed = Vec::new();
        for b in self.services.iter_mut().flat_map(|s| s.backends.iter_mut()) {
            if b.address == addr && b.mac != mac {
                b.mac = mac;
                changed.push(b.id);
            }
        }
        for id in &changed {
            self.write_backend(*id, mac)?;
        }
        Ok(!changed.is_empty())
    }

    /// The MAC installed for `addr`, if any backend has that address and it is known.
    pub fn mac(&self, addr: IpAddr) -> Option<[u8; 6]> {
        self.services.iter().flat_map(|s| &s.backends).find(|b| b.address == addr).and_then(|b| b.mac)
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
        ];
        let mut snap = Snapshot {
            forwarded: 0,
            passed: self.stat(S::LB_STAT_PASSED)?,
            drops: Vec::with_capacity(drops.len()),
            services: Vec::with_capacity(self.services.len()),
        };
        for (name, stat) in drops {
            snap.drops.push((name, self.stat(stat)?));
        }
        for s in &self.services {
            let mut backends = Vec::with_capacity(s.backends.len());
            for b in &s.backends {
                backends.push(BackendCounters {
                    label: b.label.clone(),
                    address: b.address,
                    weight: b.weight,
                    mac_known: b.mac.is_some(),
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
        let mut out = vec![0u8; frame.len() + 256];
        let input = libbpf_rs::ProgramInput { data_in: Some(frame), data_out: Some(&mut out), ..Default::default() };
        let output = self.skel.progs.lb_xdp.test_run(input).context("BPF_PROG_TEST_RUN")?;
        let len = output.data.as_ref().map_or(0, |d| d.len());
        let action = output.return_value;
        out.truncate(len);
        Ok((action, out))
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
        for b in self.services.iter().flat_map(|s| &s.backends) {
            total += traffic(&self.skel.maps.backend_traffic, b.id)?.packets;
        }
        Ok(total)
    }

    /// A counter of enum lb_stat, summed over CPUs.
    pub fn stat(&self, stat: types::lb_stat) -> Result<u64> {
        let per_cpu = self.skel.maps.stats.lookup_percpu(&stat.0.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
        Ok(per_cpu.iter().map(|v| u64_at(v, 0)).sum())
    }
}

const LB_BACKEND_MAC_KNOWN: u8 = types::lb_backend_flags::LB_BACKEND_MAC_KNOWN.0 as u8;

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes.get(at..at + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_ne_bytes)
}

/// Reads a map value of one of the skeleton's plain types from the bytes the kernel returned.
fn value_of<T: Copy + Default>(bytes: &[u8]) -> T {
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

/// The route of `key` to service `s`'s table at `base`. A service without any weighted backend
/// gets 0 slots, which the program drops as "no backend".
fn route(key: types::lb_service_key, base: u32, s: &Service, hash: HashMode) -> types::lb_service {
    let live = s.backends.iter().any(|b| b.weight > 0);
    types::lb_service {
        key,
        base,
        slots: if live { s.slots } else { 0 },
        hash_mode: match hash {
            HashMode::ClientIp => types::lb_hash_mode::LB_HASH_CLIENT_IP.0,
            HashMode::Flow => types::lb_hash_mode::LB_HASH_FLOW.0,
        },
    }
}

/// The vip_index entry that the service key (vip, port, protocol) uses: for tests that need keys
/// which share an entry.
pub fn vip_index_of(vip: IpAddr, port: u16, proto: Protocol) -> u32 {
    vip_index(&service_key(vip, port, proto))
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
    let mut addr = [0u32; 4];
    let family = match vip {
        IpAddr::V4(a) => {
            addr[0] = u32::from_ne_bytes(a.octets());
            types::lb_family::LB_FAMILY_V4.0 as u8
        }
        IpAddr::V6(a) => {
            for (i, c) in a.octets().chunks(4).enumerate() {
                addr[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            }
            types::lb_family::LB_FAMILY_V6.0 as u8
        }
    };
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
