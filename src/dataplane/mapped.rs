//! BPF_F_MMAPABLE array maps mapped into this process, for the writes the program must see as
//! one atomic step: the destination table's slots (an aligned 4-byte store each) and flow-table
//! slots, which user space claims with the program's own protocol (lb.h, struct lb_flow: a
//! compare-and-swap of the tag to LB_FLOW_BUSY, the rest written, then the tag).

use std::os::fd::AsFd;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use anyhow::{Context, Result};

use super::types;

/// A shared, writable mapping of a whole array map's values, unmapped on drop.
struct Mapping {
    base: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
}

impl Mapping {
    /// Maps the first `bytes` bytes of `map` (rounded up to whole pages).
    fn new(map: &impl AsFd, bytes: usize) -> Result<Mapping> {
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096) as usize;
        let len = bytes.div_ceil(page) * page;
        let size = std::num::NonZeroUsize::new(len).context("an empty array map")?;
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
        .context("mapping an array map into memory")?;
        Ok(Mapping { base, len })
    }

    /// The aligned 4-byte word at byte `offset`, shared with the kernel.
    fn u32_at(&self, offset: usize) -> Option<&AtomicU32> {
        if offset % 4 != 0 || offset + 4 > self.len {
            return None;
        }
        // SAFETY: the word is 4-aligned (page-aligned base) and inside the live mapping, which
        // lives as long as the returned borrow; the kernel side accesses it only with single
        // loads, stores and atomics, so sharing it as an atomic is sound.
        Some(unsafe { AtomicU32::from_ptr((self.base.as_ptr() as *mut u8).add(offset).cast()) })
    }

    /// The aligned 8-byte word at byte `offset`, likewise.
    fn u64_at(&self, offset: usize) -> Option<&AtomicU64> {
        if offset % 8 != 0 || offset + 8 > self.len {
            return None;
        }
        // SAFETY: as in u32_at, for an 8-aligned word inside the mapping.
        Some(unsafe { AtomicU64::from_ptr((self.base.as_ptr() as *mut u8).add(offset).cast()) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base and len are exactly what mmap returned and nothing uses them after this.
        let _ = unsafe { nix::sys::mman::munmap(self.base, self.len) };
    }
}

/// The table_slots array mapped into this process (the map is BPF_F_MMAPABLE). Its elements are
/// pairs of slots, laid out back to back, so the mapping is one array of 4-byte slots: writing
/// a slot is one aligned 4-byte store, which the program reads whole, old or new.
pub(super) struct SlotsMapping {
    map: Mapping,
    entries: u32,
}

impl SlotsMapping {
    pub(super) fn new(map: &impl AsFd, entries: u32) -> Result<SlotsMapping> {
        let bytes = entries.div_ceil(2) as usize * std::mem::size_of::<types::lb_slot_pair>();
        Ok(SlotsMapping { map: Mapping::new(map, bytes).context("mapping the table array")?, entries })
    }

    /// Entry `i` of the table array (0 past its end).
    pub(super) fn read(&self, i: u32) -> u32 {
        if i >= self.entries {
            return 0;
        }
        self.map.u32_at(i as usize * 4).map_or(0, |w| w.load(Ordering::Relaxed))
    }

    pub(super) fn write(&self, entries: &[(u32, u32)]) -> Result<()> {
        for &(i, id) in entries {
            anyhow::ensure!(i < self.entries, "table entry {i} is outside the array of {}", self.entries);
            self.map.u32_at(i as usize * 4).context("a table entry outside the mapping")?.store(id, Ordering::Relaxed);
        }
        // Everything written here is visible before whatever map write comes next makes it
        // reachable.
        fence(Ordering::SeqCst);
        Ok(())
    }
}

/// A flow table (`flows` or `flow_pending`) mapped into this process, written as the program
/// writes it: a slot is claimed by a compare-and-swap of its tag, so a CPU running the program
/// and this process never write one slot at once.
pub(super) struct FlowSlots {
    map: Mapping,
    slots: u32,
    /// Bytes per slot in the array (the value size rounded up to 8, as the kernel lays it out).
    stride: usize,
}

/// The tag of a slot being written (lb.h).
const BUSY: u64 = types::lb_flow_table_layout::LB_FLOW_BUSY.0 as u64;

impl FlowSlots {
    pub(super) fn new(map: &impl AsFd, slots: u32, value_size: u32) -> Result<FlowSlots> {
        let stride = (value_size as usize).div_ceil(8) * 8;
        anyhow::ensure!(stride >= 16, "a flow-table slot of {value_size} bytes is too small");
        Ok(FlowSlots { map: Mapping::new(map, slots as usize * stride).context("mapping a flow table")?, slots, stride })
    }

    /// Slot `i`'s tag (0 past the end).
    pub(super) fn tag(&self, i: u32) -> u64 {
        if i >= self.slots {
            return 0;
        }
        self.map.u64_at(i as usize * self.stride).map_or(0, |t| t.load(Ordering::Acquire))
    }

    /// Writes `value` (a whole slot, tag first) into slot `i` if its tag is still `expect`:
    /// claims the slot (tag -> LB_FLOW_BUSY), writes everything after the tag, then publishes
    /// the tag. False when the slot held another tag (the program, or another writer, got there
    /// first).
    pub(super) fn put_if(&self, i: u32, expect: u64, value: &[u8]) -> Result<bool> {
        anyhow::ensure!(i < self.slots && value.len() >= 16 && value.len() <= self.stride, "flow slot {i} out of range");
        let at = i as usize * self.stride;
        let tag_word = self.map.u64_at(at).context("a flow slot outside the mapping")?;
        let tag = u64::from_ne_bytes(value[..8].try_into()?);
        if expect == BUSY || tag_word.compare_exchange(expect, BUSY, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return Ok(false);
        }
        // The slot is ours: no reader uses a slot tagged LB_FLOW_BUSY, and no CPU claims it.
        // The backend, generation and seen are one 8-byte word, as the program reads them.
        for (k, chunk) in value[8..].chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.map.u64_at(at + 8 + k * 8).context("a flow slot outside the mapping")?.store(u64::from_ne_bytes(word), Ordering::Relaxed);
        }
        // Release: the words above are visible before the tag that makes them a flow's.
        tag_word.swap(tag, Ordering::AcqRel);
        Ok(true)
    }

    pub(super) fn len(&self) -> u32 {
        self.slots
    }
}
