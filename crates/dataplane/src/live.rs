//! Reading a data plane back: this process's own (after adopting pinned maps) or a pinned one
//! by path (`lb status`). Everything here reads; what the readings mean for the next change
//! (rebuilding the planner's state from them) is the caller's business.

use std::cell::RefCell;
use std::collections::HashMap;

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use lb_core::plan;

use super::encode::{addr_of, bytes_of, key_of, name_text, route_of, service_key_of, value_of, LB_BACKEND_ALIVE, LB_BACKEND_IN_POOL, LB_BACKEND_MAC_KNOWN, LB_META_MAGIC};
use super::{types, Dataplane, PINNED_MAPS};

/// The maps of a data plane by pin name: this process's own, or a pinned one's.
pub trait MapSource {
    fn map(&self, name: &str) -> Result<&dyn MapCore>;
}

/// A pinned data plane's maps, opened by path.
pub struct PinnedMaps(HashMap<&'static str, libbpf_rs::MapHandle>);

impl PinnedMaps {
    pub fn open(dir: &std::path::Path) -> Result<PinnedMaps> {
        let mut maps = HashMap::new();
        for name in PINNED_MAPS {
            let path = dir.join(name);
            if super::reuse::OPTIONAL_MAPS.contains(&name) && !path.exists() {
                continue;
            }
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

    /// A reader of the table array's entries by index (0 past its end), which reads each pair
    /// of slots from the kernel once.
    pub fn slot_reader(&self) -> Result<impl Fn(u32) -> u32 + '_> {
        let slots = self.map("table_slots")?;
        let pairs = RefCell::new(HashMap::<u32, [u32; 2]>::new());
        Ok(move |i: u32| -> u32 {
            let mut cache = pairs.borrow_mut();
            let pair = *cache.entry(i / 2).or_insert_with(|| {
                slots.lookup(&(i / 2).to_ne_bytes(), MapFlags::ANY).ok().flatten().map_or([0, 0], |v| value_of::<types::lb_slot_pair>(&v).id)
            });
            pair[(i % 2) as usize] & super::slot_marks::ID_MASK
        })
    }
}

impl PinnedMaps {
    /// A reader of each slot's second-chance hops by index ([0, 0] past its end, or where the
    /// plane has no table_hops: a version before second chance).
    pub fn hop_reader(&self) -> Result<impl Fn(u32) -> [u32; 2] + '_> {
        let hops = self.0.get("table_hops");
        let pairs = RefCell::new(HashMap::<u32, types::lb_hop_pair>::new());
        Ok(move |i: u32| -> [u32; 2] {
            let Some(map) = hops else { return [0, 0] };
            let mut cache = pairs.borrow_mut();
            let pair = *cache.entry(i / 2).or_insert_with(|| {
                map.lookup(&(i / 2).to_ne_bytes(), MapFlags::ANY).ok().flatten().map_or_else(Default::default, |v| value_of::<types::lb_hop_pair>(&v))
            });
            let h = pair.slot[(i % 2) as usize].id;
            [h[0] as u32, h[1] as u32]
        })
    }
}

impl MapSource for PinnedMaps {
    fn map(&self, name: &str) -> Result<&dyn MapCore> {
        self.0.get(name).map(|m| m as &dyn MapCore).with_context(|| format!("no pinned map {name}"))
    }
}

/// How large a plane's maps are: what a planner may allocate in them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Slots in the table array.
    pub table_capacity: u32,
    /// Entries of the backend arrays (id 0 included, which no backend gets).
    pub backends: u32,
    /// Entries of the routes array (id 0 included, which no route gets).
    pub routes: u32,
    /// Slots of the flow table.
    pub flows: u32,
}

/// The sizes of the maps of `src`.
pub fn sizes(src: &dyn MapSource) -> Result<Sizes> {
    Ok(Sizes {
        // Two slots per array element (see lb.h, struct lb_slot_pair).
        table_capacity: map_info(src.map("table_slots")?)?.max_entries * 2,
        backends: map_info(src.map("backends")?)?.max_entries,
        routes: map_info(src.map("routes")?)?.max_entries,
        flows: map_info(src.map("flows")?)?.max_entries,
    })
}

fn map_info(m: &dyn MapCore) -> Result<libbpf_rs::libbpf_sys::bpf_map_info> {
    Ok(libbpf_rs::MapInfo::new(m.as_fd())?.info)
}

/// Reads what the maps hold: the VIP index, the routes, the services hash and the backends in
/// the pool (for rebuilding the planner's state, and `lb status`).
pub fn read_live(src: &dyn MapSource) -> Result<plan::LiveMaps> {
    let (vip_index, routes, services) = (src.map("vip_index")?, src.map("routes")?, src.map("services")?);
    let (backend_meta, backends, backend_addrs) = (src.map("backend_meta")?, src.map("backends")?, src.map("backend_addrs")?);
    let mut live = plan::LiveMaps::default();
    let shared = types::lb_vip_index_layout::LB_VIP_INDEX_SHARED.0;
    // Whole arrays in batches of 4096 entries: 16 system calls for the index instead of 65,536.
    for (k, v) in vip_index.lookup_batch(4096, MapFlags::ANY, MapFlags::ANY)? {
        let idx: u32 = value_of(&k);
        match value_of::<u32>(&v) {
            0 => {}
            x if x == shared => live.index.push((idx, plan::IndexEntry::Shared)),
            id => live.index.push((idx, plan::IndexEntry::Route(id))),
        }
    }
    for (k, v) in routes.lookup_batch(4096, MapFlags::ANY, MapFlags::ANY)? {
        let id: u32 = value_of(&k);
        if id == 0 {
            continue;
        }
        if let Some(r) = route_of(&value_of(&v)) {
            live.routes.push((id, r));
        }
    }
    for k in services.keys() {
        if let Some(v) = services.lookup(&k, MapFlags::ANY)? {
            if let Some(r) = route_of(&value_of(&v)) {
                live.hashed.push(r);
            }
        }
    }
    for k in backend_meta.keys() {
        let id: u32 = value_of(&k);
        let Some(m) = backend_meta.lookup(&k, MapFlags::ANY)? else { continue };
        let Some(rec) = backends.lookup(&k, MapFlags::ANY)? else { continue };
        let rec: types::lb_backend = value_of(&rec);
        if rec.flags & LB_BACKEND_IN_POOL == 0 {
            continue;
        }
        let Some(a) = backend_addrs.lookup(&k, MapFlags::ANY)? else { continue };
        let (m, a): (types::lb_backend_meta, types::lb_addr) = (value_of(&m), value_of(&a));
        let (Some(service), Some(address)) = (key_of(&m.service), addr_of(&a.addr, a.family)) else { continue };
        let state = match m.state {
            1 => lb_core::config::BackendState::Drain,
            2 => lb_core::config::BackendState::Down,
            _ => lb_core::config::BackendState::Active,
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

/// The name the maps kept for the service at `key`, if any.
pub fn service_name(src: &dyn MapSource, key: &plan::RouteKey) -> Result<Option<String>> {
    let k = service_key_of(key);
    Ok(src.map("service_names")?.lookup(bytes_of(&k), MapFlags::ANY)?.map(|v| name_text(&value_of::<types::lb_name>(&v).name)))
}

/// The name the maps kept for backend `id`, if any.
pub fn backend_name(src: &dyn MapSource, id: u32) -> Result<Option<String>> {
    Ok(src.map("backend_meta")?.lookup(&id.to_ne_bytes(), MapFlags::ANY)?.map(|v| name_text(&value_of::<types::lb_backend_meta>(&v).name)))
}

/// The MAC that backend `id`'s record holds, if it says it knows one.
pub fn recorded_mac(src: &dyn MapSource, id: u32) -> Result<Option<[u8; 6]>> {
    let rec: types::lb_backend = value_of(&src.map("backends")?.lookup(&id.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default());
    Ok((rec.flags & LB_BACKEND_MAC_KNOWN != 0).then_some(rec.mac))
}

impl Dataplane {
    /// Takes over what this plane's (adopted) maps say beyond `live`: the counter generation of
    /// every backend id, and the MACs the backend records hold, which stand until the neighbour
    /// table says otherwise.
    ///
    /// Every id's generation, not only those up to the highest in use: an id above it was
    /// retired by an earlier controller, and the flow table may still hold entries of its last
    /// owner. Reissued from generation 0, it would count up to the one those entries carry and
    /// make them usable again, sending their flows to a backend they never had.
    pub fn recall(&mut self, live: &plan::LiveMaps) -> Result<()> {
        // In batches (65,536 single lookups cost the adoption about 0.4 s); an id never issued
        // reads 0, which is what a missing entry means here too.
        for (k, v) in self.skel.maps.backend_gen.lookup_batch(8192, MapFlags::ANY, MapFlags::ANY)? {
            let (id, gen) = (value_of::<u32>(&k), value_of::<u32>(&v));
            if id != 0 && gen != 0 {
                self.gens.insert(id, gen);
            }
        }
        for (id, address, ..) in &live.backends {
            if let Some(mac) = recorded_mac(&*self, *id)? {
                self.macs.entry(self.neighbour_of(*address)).or_insert(mac);
            }
        }
        Ok(())
    }
}
