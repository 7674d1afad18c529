//! Executing the planner's operations on the maps: backend records, metadata and names, routes,
//! the services hash and the VIP index, counter resets with their generations, and the table
//! slots through a memory mapping. Each operation is one consistent step; the planner orders them
//! so that no packet meets a half-written change.

use std::net::IpAddr;

use anyhow::Result;
use libbpf_rs::{MapCore, MapFlags};

use lb_core::plan;

use super::encode::{addr_words, bytes_of, name_bytes, route_value, service_key_of, LB_BACKEND_ALIVE, LB_BACKEND_IN_POOL, LB_BACKEND_MAC_KNOWN};
use super::{types, Dataplane};

impl Dataplane {
    /// Writes one operation of a plan to the maps. For the balancer alone, like every write that
    /// its mirror must know of: others reach the data plane through the balancer's Deref and
    /// must not change the maps behind its back. Public only because the balancer is another
    /// crate; tests/layout.rs fails any call from the binary outside src/balancer/.
    pub fn execute(&mut self, op: &plan::Op) -> Result<()> {
        let maps = &self.skel.maps;
        match op {
            plan::Op::Backend { id, address, alive, in_pool } => self.write_backend(*id, *address, *alive, *in_pool)?,
            plan::Op::Meta { id, meta, name } => {
                let value = types::lb_backend_meta {
                    service: service_key_of(&meta.service),
                    identity: meta.identity,
                    weight: meta.weight,
                    state: match meta.state {
                        lb_core::config::BackendState::Active => 0,
                        lb_core::config::BackendState::Drain => 1,
                        lb_core::config::BackendState::Down => 2,
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
                let zero = vec![vec![0u8; std::mem::size_of::<types::lb_signals>()]; libbpf_rs::num_possible_cpus()?];
                maps.backend_signals.update_percpu(&id.to_ne_bytes(), &zero, MapFlags::ANY)?;
                // The mirror follows the map only once the map has it: the sweep of stable
                // slots judges entries by it.
                let gen = self.gens.get(id).copied().unwrap_or(0).wrapping_add(1);
                maps.backend_gen.update(&id.to_ne_bytes(), &gen.to_ne_bytes(), MapFlags::ANY)?;
                self.gens.insert(*id, gen);
            }
            // Every slot written gets a new owner (or a new range): unstable until swept.
            plan::Op::Slots(entries) => self.slots.write_marked(entries, self.write_mark())?,
            plan::Op::Hops(entries) => {
                // struct lb_hops: two 16-bit ids (below LB_MAX_BACKENDS) in one aligned word.
                let words: Vec<(u32, u32)> = entries
                    .iter()
                    .map(|&(i, [a, b])| {
                        let (a, b) = ((a as u16).to_ne_bytes(), (b as u16).to_ne_bytes());
                        (i, u32::from_ne_bytes([a[0], a[1], b[0], b[1]]))
                    })
                    .collect();
                self.hops.write(&words)?
            }
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
    pub fn write_backend(&self, id: u32, address: IpAddr, alive: bool, in_pool: bool) -> Result<()> {
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

    /// The backend id of entry `i` of the table array (0 past its end), read through the
    /// mapping, without its state bits.
    pub fn slot(&self, i: u32) -> u32 {
        self.slots.read(i) & super::slot_marks::ID_MASK
    }

    /// The second-chance hops of entry `i` of the table array ([0, 0] past its end).
    pub fn hops_at(&self, i: u32) -> [u32; 2] {
        let b = self.hops.read(i).to_ne_bytes();
        [u16::from_ne_bytes([b[0], b[1]]) as u32, u16::from_ne_bytes([b[2], b[3]]) as u32]
    }
}
