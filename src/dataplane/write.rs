//! Executing the planner's operations on the maps: backend records, metadata and names, routes,
//! the services hash and the VIP index, counter resets with their generations, and the table
//! slots through a memory mapping. Each operation is one consistent step; the planner orders them
//! so that no packet meets a half-written change.

use std::net::IpAddr;
use std::os::fd::AsFd;

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use crate::plan;

use super::encode::{addr_words, bytes_of, name_bytes, route_value, service_key_of, LB_BACKEND_ALIVE, LB_BACKEND_IN_POOL, LB_BACKEND_MAC_KNOWN};
use super::{types, Dataplane};

impl Dataplane {
    /// Writes one operation of a plan to the maps. Crate-private, like every write that the
    /// balancer's mirror must know of: a caller outside the crate reaches the data plane through
    /// the balancer's Deref, and must not change the maps behind its back.
    pub(crate) fn execute(&mut self, op: &plan::Op) -> Result<()> {
        let maps = &self.skel.maps;
        match op {
            plan::Op::Backend { id, address, alive, in_pool } => self.write_backend(*id, *address, *alive, *in_pool)?,
            plan::Op::Meta { id, meta, name } => {
                let value = types::lb_backend_meta {
                    service: service_key_of(&meta.service),
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
                let k = service_key_of(key);
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
                let k = service_key_of(key);
                maps.services.update(bytes_of(&k), bytes_of(&route_value(route)), MapFlags::ANY)?;
            }
            plan::Op::HashDelete { key } => {
                let k = service_key_of(key);
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
    pub(crate) fn write_backend(&self, id: u32, address: IpAddr, alive: bool, in_pool: bool) -> Result<()> {
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

    /// Entry `i` of the table array (0 past its end), read through the mapping.
    pub fn slot(&self, i: u32) -> u32 {
        self.slots.read(i)
    }
}

/// The table_slots array mapped into this process (the map is BPF_F_MMAPABLE). Its elements are
/// pairs of slots, laid out back to back, so the mapping is one array of 4-byte slots: writing
/// a slot is one aligned 4-byte store, which the program reads whole, old or new.
pub(super) struct SlotsMapping {
    base: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
    entries: u32,
}

impl SlotsMapping {
    pub(super) fn new(map: &impl AsFd, entries: u32) -> Result<SlotsMapping> {
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
