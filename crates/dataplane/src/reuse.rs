//! Reusing a pinned data plane's maps across an upgrade: which maps a plane pins, whether each
//! has this build's layout (compared through BTF), loading on those that do, carrying the flow
//! table over entry by entry when its layout changed, and the lb_meta record that says which
//! build and controller a pinned plane belongs to.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::AsFd;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::OpenSkel;
use libbpf_rs::{AsRawLibbpf, MapCore, MapFlags};

use super::encode::{bytes_of, value_of, LB_META_MAGIC};
use super::skel::{self, LbSkel};
use super::mapped::FlowSlots;
use super::{pin, prog_id, types, Dataplane, FLOW_WAYS};

/// The maps a data plane pins, by file name. The table maps come first: they must all be reused
/// for a controller to adopt a data plane in place.
pub const PINNED_MAPS: [&str; 22] = [
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
    "flow_key",
    "table_hops",
    "flow_records",
    "pending_records",
    "quic_configs",
    "quic_servers",
    "quic_aes",
];
/// Maps that a data plane of an earlier version does not pin: a reader of a pinned plane does
/// without them.
pub const OPTIONAL_MAPS: [&str; 7] =
    ["flow_key", "table_hops", "flow_records", "pending_records", "quic_configs", "quic_servers", "quic_aes"];
const TABLE_MAPS: usize = 10;
/// Maps whose size user space sets (a reused one keeps its pinned size).
const SIZED_MAPS: [&str; 6] = ["table_slots", "table_hops", "flows", "flow_pending", "flow_records", "pending_records"];

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

pub(super) fn open_maps<'a, 'o>(open: &'a mut skel::OpenLbSkel<'o>) -> Vec<(&'static str, &'a mut libbpf_rs::OpenMapMut<'o>)> {
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
        ("flow_key", &mut m.flow_key),
        ("table_hops", &mut m.table_hops),
        ("flow_records", &mut m.flow_records),
        ("pending_records", &mut m.pending_records),
        ("quic_configs", &mut m.quic_configs),
        ("quic_servers", &mut m.quic_servers),
        ("quic_aes", &mut m.quic_aes),
    ]
}

pub(super) fn loaded_maps<'a, 'o>(skel: &'a LbSkel<'o>) -> Vec<(&'static str, &'a libbpf_rs::MapMut<'o>)> {
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
        ("flow_key", &m.flow_key),
        ("table_hops", &m.table_hops),
        ("flow_records", &m.flow_records),
        ("pending_records", &m.pending_records),
        ("quic_configs", &m.quic_configs),
        ("quic_servers", &m.quic_servers),
        ("quic_aes", &m.quic_aes),
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
pub(super) fn reuse_maps(open: &mut skel::OpenLbSkel<'_>, r: &Reuse) -> Result<Vec<&'static str>> {
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
    // Which pinned maps this build can use as they are, and their sizes.
    let mut usable: Vec<(&'static str, u32)> = Vec::new();
    for (name, map) in open_maps(open) {
        let path = r.dir.join(name);
        if !path.exists() {
            continue;
        }
        let pinned = libbpf_rs::MapHandle::from_pinned_path(&path).with_context(|| format!("opening the pinned map {}", path.display()))?;
        let info = pinned.info()?.info;
        let sized = SIZED_MAPS.contains(&name);
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
            usable.push((name, info.max_entries));
        }
    }
    // The flow tables' tags are only worth keeping under the key they were made with: without
    // that key (a version before keyed tags, or a lost pin) this plane makes a new one, and
    // the old tables' entries could never be found again while they filled slots.
    if !usable.iter().any(|(n, _)| *n == "flow_key") {
        usable.retain(|(n, _)| *n != "flows" && *n != "flow_pending");
    }
    // A flow table's records sit at its entries' indexes: kept only with their table, and
    // made anew with it (not reported apart: the table is).
    let mut with_table: Vec<&str> = Vec::new();
    for (table, records) in [("flows", "flow_records"), ("flow_pending", "pending_records")] {
        if !usable.iter().any(|(n, _)| *n == table) && usable.iter().any(|(n, _)| *n == records) {
            usable.retain(|(n, _)| *n != records);
            with_table.push(records);
        }
    }
    let mut fresh: Vec<&'static str> = Vec::new();
    for (name, map) in open_maps(open) {
        let Some(&(_, entries)) = usable.iter().find(|(n, _)| *n == name) else {
            if !with_table.contains(&name) {
                fresh.push(name);
            }
            continue;
        };
        let path = r.dir.join(name);
        if SIZED_MAPS.contains(&name) {
            map.set_max_entries(entries)?;
        }
        map.reuse_pinned_map(&path).with_context(|| format!("reusing the pinned map {}", path.display()))?;
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
        let key = self.flow_key()?;
        // A set-associative table's tags are worth copying only under this plane's key: a
        // version before keyed tags held unkeyed hashes, and a plane whose key was lost holds
        // tags under another; no packet's tag will ever equal those again, and copied they
        // would only fill slots.
        let keyed = pinned_flow_key(&path.with_file_name("flow_key")) == Some(key);
        // The new tables through memory mappings: after the switch the new program writes
        // them too, so every slot is claimed as the program claims it. The old ones likewise
        // when they can be mapped, since before the switch the old program writes them: each
        // slot is read as the program reads one, never torn.
        let mut mapped = Vec::new();
        for (old, new, choices) in &tables {
            let info = new.info()?.info;
            let old_info = old.info()?.info;
            let old_mapped = if old_info.type_ == libbpf_rs::libbpf_sys::BPF_MAP_TYPE_ARRAY
                && old_info.map_flags & libbpf_rs::libbpf_sys::BPF_F_MMAPABLE != 0
            {
                Some(FlowSlots::new(old, old_info.max_entries, old_info.value_size)?)
            } else {
                None
            };
            mapped.push((old, new, *choices, FlowSlots::new(*new, info.max_entries, info.value_size)?, old_mapped));
        }
        // What the first pass wrote, per tag: the second may update it (the old program may
        // have refreshed or re-picked the flow meanwhile) as long as the new one has not.
        let mut wrote: Vec<HashMap<u64, Vec<u8>>> = vec![HashMap::new(); mapped.len()];
        let mut copy = || -> Result<u64> {
            let mut copied = 0;
            for ((old, new, choices, slots, old_mapped), wrote) in mapped.iter().zip(wrote.iter_mut()) {
                let info = old.info()?.info;
                let new_info = new.info()?.info;
                let convert_slot =
                    |v: &[u8]| convert(v, &old_btf, info.btf_value_type_id, &new_btf, new_info.btf_value_type_id, new_info.value_size as usize);
                let mut put = |slot: Vec<u8>| -> Result<()> {
                    copied += put_flow(slots, *choices, &slot, wrote)? as u64;
                    Ok(())
                };
                if info.type_ == libbpf_rs::libbpf_sys::BPF_MAP_TYPE_ARRAY {
                    if !keyed {
                        continue;
                    }
                    // Only flows' tags (odd): not a free slot (0), nor one the old program
                    // was writing (LB_FLOW_BUSY, 2), which copied would stay claimed for ever.
                    if let Some(m) = old_mapped {
                        for i in 0..m.len() {
                            if let Some(v) = m.read(i, info.value_size as usize) {
                                put(convert_slot(&v))?;
                            }
                        }
                    } else {
                        for (_, v) in old.lookup_batch(8192, MapFlags::ANY, MapFlags::ANY)? {
                            if v.len() >= 8 && v[0] & 1 == 1 {
                                put(convert_slot(&v))?;
                            }
                        }
                    }
                } else {
                    // A version before the set-associative table: an LRU hash keyed by the
                    // 5-tuple (lb_flow_key), valued {backend u32, gen u32, seen_ms u64}.
                    for k in old.keys() {
                        let Some(v) = old.lookup(&k, MapFlags::ANY)? else { continue };
                        if let Some(slot) = slot_from_keyed(key, &k, &v, new_info.value_size as usize) {
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

    /// Writes lb_meta: this build's identities, the controller, the sizes.
    pub fn write_meta(&self, attached_ms: u64, controller: Option<(u32, u64)>, ifindex: u32) -> Result<()> {
        let sizes = self.sizes()?;
        // The placement mark stays with the tables it describes.
        let placed = self.placed_mark()?.map_or(0, |t| t as u64 + 1);
        let meta = types::lb_meta {
            magic: LB_META_MAGIC,
            layout: layout_hash(),
            program: program_hash(),
            attached_ms,
            controller_since: controller.map_or(0, |c| c.1),
            controller_pid: controller.map_or(0, |c| c.0),
            ifindex,
            table_capacity: sizes.table_capacity,
            conntrack_size: sizes.flows,
            reserved: [0, placed],
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
}

impl Dataplane {
    /// When a table range was last placed or rehashed (the data plane's ticks), as lb_meta
    /// records it (`reserved[1]`, the tick + 1; 0: never recorded, a plane from before stable
    /// slots or a fresh one). See crates/core/src/stable.rs.
    pub fn placed_mark(&self) -> Result<Option<u32>> {
        let v = self.skel.maps.lb_meta.lookup(&0u32.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
        let meta: types::lb_meta = value_of(&v);
        // Without the magic too: a fresh plane's lb_meta is written whole only when it is
        // pinned, after its first tables.
        match meta.reserved[1] {
            0 => Ok(None),
            // A change was placing ranges when its controller stopped: as if placed now.
            PLACEMENT_UNDER_WAY => Ok(Some(super::slot_marks::now_ticks()?)),
            t => Ok(Some((t - 1) as u32)),
        }
    }

    /// Records that a change placing table ranges is under way (see placed_mark()).
    pub fn set_placement_under_way(&self) -> Result<()> {
        self.write_placed(PLACEMENT_UNDER_WAY)
    }

    /// Records that a table range was placed or rehashed at `tick`.
    pub fn set_placed_mark(&self, tick: u32) -> Result<()> {
        self.write_placed(tick as u64 + 1)
    }

    fn write_placed(&self, value: u64) -> Result<()> {
        let m = &self.skel.maps.lb_meta;
        let v = m.lookup(&0u32.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
        let mut meta: types::lb_meta = value_of(&v);
        meta.reserved[1] = value;
        m.update(&0u32.to_ne_bytes(), bytes_of(&meta), MapFlags::ANY)?;
        Ok(())
    }
}

/// lb_meta's `reserved[1]` while a change places table ranges.
const PLACEMENT_UNDER_WAY: u64 = u64::MAX;

/// Writes a flow-table slot (lb.h, struct lb_flow, as bytes) into the buckets its tag names
/// (two for the flow table, one for the half-open table), claimed as the program claims slots:
/// where the flow already is, if this carry wrote it there (`wrote`) and the new program has
/// not changed it since; else into a free slot. True when the flow was added.
fn put_flow(slots: &FlowSlots, choices: usize, slot: &[u8], wrote: &mut HashMap<u64, Vec<u8>>) -> Result<bool> {
    let tag = u64::from_ne_bytes(slot[..8].try_into()?);
    let buckets = slots.len() / FLOW_WAYS;
    let first = lb_core::flowhash::tag_bucket(tag, buckets) * FLOW_WAYS;
    let second = lb_core::flowhash::tag_bucket2(tag, buckets) * FLOW_WAYS;
    let candidates: Vec<u32> = [first..first + FLOW_WAYS, second..second + FLOW_WAYS].into_iter().take(choices).flatten().collect();
    if let Some(&i) = candidates.iter().find(|&&i| slots.tag(i) == tag) {
        if let Some(prev) = wrote.get(&tag).filter(|p| p.as_slice() != slot) {
            let prev_word = u64::from_ne_bytes(prev[8..16].try_into()?);
            if slots.put_if(i, tag, Some(prev_word), slot)? {
                wrote.insert(tag, slot.to_vec());
            }
        }
        return Ok(false);
    }
    for &i in &candidates {
        if slots.tag(i) == 0 && slots.put_if(i, 0, None, slot)? {
            wrote.insert(tag, slot.to_vec());
            return Ok(true);
        }
    }
    Ok(false)
}

/// The flow-tag key held by the pinned `flow_key` map at `path`, if there is one.
fn pinned_flow_key(path: &std::path::Path) -> Option<[u64; 2]> {
    let map = libbpf_rs::MapHandle::from_pinned_path(path).ok()?;
    let v = map.lookup(&0u32.to_ne_bytes(), MapFlags::ANY).ok()??;
    (v.len() >= 16).then(|| value_of::<types::lb_flow_key>(&v).k)
}

/// A slot for an entry of the flow table's earlier form (an LRU hash: key struct lb_flow_key
/// `{src[16], dst[16], sport, dport, proto, family, pad[2]}`; value `{backend u32, gen u32,
/// seen_ms u64}`), in a slot of `size` bytes, tagged under `key`. Such an entry was established
/// long enough to have been confirmed. (The set-associative tables of versions before the keyed
/// tags cannot be carried: their tags are the unkeyed hash, which no 5-tuple can be recovered
/// from; those flows then follow the table, see docs/restarts.md.)
fn slot_from_keyed(key: [u64; 2], k: &[u8], v: &[u8], size: usize) -> Option<Vec<u8>> {
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
    let tag = lb_core::flowhash::flow_tag(key, src, dst, port(32), port(34), k[36]);
    let backend = u32::from_ne_bytes(v[0..4].try_into().ok()?);
    let gen = u32::from_ne_bytes(v[4..8].try_into().ok()?);
    let seen_ms = u64::from_ne_bytes(v[8..16].try_into().ok()?);
    let mut slot = vec![0u8; size];
    slot[0..8].copy_from_slice(&tag.to_ne_bytes());
    slot[8..10].copy_from_slice(&(backend as u16).to_ne_bytes());
    use types::lb_flow_gen_bits as B;
    let udp = if k[36] == 17 { B::LB_FLOW_UDP.0 } else { 0 };
    let state = (gen & B::LB_FLOW_GEN_MASK.0) | udp | B::LB_FLOW_CONFIRMED.0;
    slot[10..12].copy_from_slice(&(state as u16).to_ne_bytes());
    // Both clocks are CLOCK_MONOTONIC: its milliseconds then, in the program's ticks of 2^24 ns.
    slot[12..16].copy_from_slice(&((seen_ms.saturating_mul(1_000_000) >> 24) as u32).to_ne_bytes());
    Some(slot)
}
