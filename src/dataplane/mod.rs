//! The only module that talks to the kernel: loads the XDP program's skeleton, writes the tables
//! that the kernel-free core built into its maps, attaches it ([`link`]) and asks the network
//! stack about routes and neighbours ([`netlink`]).

pub mod link;
pub mod netlink;

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::os::fd::AsFd;

use anyhow::{Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, MapHandle, MapType};

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

pub struct Dataplane {
    skel: LbSkel<'static>,
    /// One inner table map per service id, kept open while it is installed.
    tables: HashMap<u32, MapHandle>,
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
    pub fn load() -> Result<Dataplane> {
        // The skeleton borrows its object for its whole life; one per process, so leaking the
        // few bytes of the holder is simpler than a self-referential struct.
        let object = Box::leak(Box::new(MaybeUninit::uninit()));
        let open = LbSkelBuilder::default().open(object).context("opening the BPF object")?;
        let skel = open.load().context("loading the XDP program (is this root, with CAP_BPF and CAP_NET_ADMIN?)")?;
        Ok(Dataplane { skel, tables: HashMap::new(), services: Vec::new() })
    }

    pub fn program_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.skel.progs.lb_xdp.as_fd()
    }

    /// Writes every service of `pool`: backends first, then each table, then the service entry
    /// that makes the table reachable, so no packet can meet a slot whose backend is unwritten.
    /// `mac_of` gives each backend's MAC when known.
    pub fn install(&mut self, pool: &Pool, ifmac: [u8; 6], mac_of: &dyn Fn(IpAddr) -> Option<[u8; 6]>) -> Result<BackendIds> {
        let settings = types::lb_config { ifmac, pad: [0; 2] };
        self.skel.maps.settings.update(&0u32.to_ne_bytes(), bytes_of(&settings), MapFlags::ANY)?;

        let mut ids = BackendIds::new();
        let mut next_id = 1u32;
        // (vip, protocol) -> services on it, for the fragment routes.
        let mut per_vip: HashMap<(IpAddr, Protocol), Vec<usize>> = HashMap::new();
        for (sid, s) in pool.services.iter().enumerate() {
            let sid = sid as u32;
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
            let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
                sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>() as _,
                map_flags: libbpf_rs::libbpf_sys::BPF_F_INNER_MAP,
                ..Default::default()
            };
            let inner = MapHandle::create(MapType::Array, Some(format!("lb_t{sid}")), 4, 4, s.slots, &opts)
                .with_context(|| format!("creating the table of service {}", s.name))?;
            let keys: Vec<u8> = (0..s.slots).flat_map(|i| i.to_ne_bytes()).collect();
            let values: Vec<u8> = t
                .owners()
                .iter()
                .flat_map(|&o| if o == table::EMPTY { 0u32 } else { backend_ids[o as usize] }.to_ne_bytes())
                .collect();
            inner.update_batch(&keys, &values, s.slots, MapFlags::ANY, MapFlags::ANY)?;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&inner.as_fd()) as u32;
            self.skel.maps.tables.update(&sid.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)?;
            self.tables.insert(sid, inner);

            let svc = service_value(sid, s, s.hash);
            let key = service_key(s.vip, s.port, s.protocol);
            self.skel.maps.services.update(bytes_of(&key), bytes_of(&svc), MapFlags::ANY)?;
            per_vip.entry((s.vip, s.protocol)).or_default().push(sid as usize);
        }

        // Non-first IPv4 fragments carry no ports. They can follow the client's address when
        // exactly one service on that (vip, protocol) hashes by client address; otherwise
        // they are dropped and counted (the route says "flow").
        for ((vip, proto), sids) in per_vip {
            let s = &pool.services[sids[0]];
            let routable = sids.len() == 1 && s.hash == HashMode::ClientIp;
            let svc = service_value(sids[0] as u32, s, if routable { HashMode::ClientIp } else { HashMode::Flow });
            let key = service_key(vip, 0, proto);
            self.skel.maps.services.update(bytes_of(&key), bytes_of(&svc), MapFlags::ANY)?;
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
            forwarded: self.stat(S::LB_STAT_FORWARDED)?,
            passed: self.stat(S::LB_STAT_PASSED)?,
            drops: Vec::with_capacity(drops.len()),
            services: Vec::with_capacity(self.services.len()),
        };
        for (name, stat) in drops {
            snap.drops.push((name, self.stat(stat)?));
        }
        for (sid, s) in self.services.iter().enumerate() {
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
            snap.services.push(ServiceCounters {
                name: s.name.clone(),
                endpoint: s.endpoint.clone(),
                traffic: traffic(&self.skel.maps.service_traffic, sid as u32)?,
                backends,
            });
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

/// The services-map value of service `id`. A service without any weighted backend gets 0 slots,
/// which the program drops as "no backend".
fn service_value(id: u32, s: &Service, hash: HashMode) -> types::lb_service {
    let live = s.backends.iter().any(|b| b.weight > 0);
    types::lb_service {
        id,
        slots: if live { s.slots } else { 0 },
        hash_mode: match hash {
            HashMode::ClientIp => types::lb_hash_mode::LB_HASH_CLIENT_IP.0,
            HashMode::Flow => types::lb_hash_mode::LB_HASH_FLOW.0,
        },
        pad: 0,
    }
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
