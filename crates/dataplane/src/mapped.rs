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
        self.write_marked(entries, 0)
    }

    /// Writes each entry's value with the bits `mark` set (each one aligned 4-byte store).
    pub(super) fn write_marked(&self, entries: &[(u32, u32)], mark: u32) -> Result<()> {
        for &(i, id) in entries {
            anyhow::ensure!(i < self.entries, "table entry {i} is outside the array of {}", self.entries);
            self.map.u32_at(i as usize * 4).context("a table entry outside the mapping")?.store(id | mark, Ordering::Relaxed);
        }
        // Everything written here is visible before whatever map write comes next makes it
        // reachable.
        fence(Ordering::SeqCst);
        Ok(())
    }
}

impl SlotsMapping {
    /// Sets the bits `mark` in entry `i` (whatever it holds) and returns what it held.
    pub(super) fn set_bits(&self, i: u32, mark: u32) -> u32 {
        if i >= self.entries {
            return 0;
        }
        self.map.u32_at(i as usize * 4).map_or(0, |w| w.fetch_or(mark, Ordering::AcqRel))
    }

    /// Entry `i` becomes `new` if it still holds `old`; whether it did.
    pub(super) fn swap_if(&self, i: u32, old: u32, new: u32) -> bool {
        i < self.entries && self.map.u32_at(i as usize * 4).is_some_and(|w| w.compare_exchange(old, new, Ordering::AcqRel, Ordering::Relaxed).is_ok())
    }
}

/// An array map of 8-byte values mapped into this process, read only (the flow records, lb.h
/// struct lb_flow_record: each written by the program as one 8-byte store).
pub(super) struct Words {
    map: Mapping,
    entries: u32,
}

impl Words {
    pub(super) fn new(map: &impl AsFd, entries: u32) -> Result<Words> {
        Ok(Words { map: Mapping::new(map, entries as usize * 8).context("mapping the flow records")?, entries })
    }

    /// Entry `i` (0 past the end).
    pub(super) fn read(&self, i: u32) -> u64 {
        if i >= self.entries {
            return 0;
        }
        self.map.u64_at(i as usize * 8).map_or(0, |w| w.load(Ordering::Acquire))
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

    /// Slot `i` whole (its value's `value_size` bytes), if it holds a flow: read as the program
    /// reads a slot, the tag, then the rest, then the tag again, so a slot that a CPU claimed
    /// or rewrote meanwhile is skipped rather than read torn. None for a free slot, one being
    /// written, or one that changed during the read.
    pub(super) fn read(&self, i: u32, value_size: usize) -> Option<Vec<u8>> {
        if i >= self.slots || value_size < 16 || value_size > self.stride {
            return None;
        }
        let (at, tag_word, tag) = self.held(i)?;
        let mut out = Vec::with_capacity(self.stride);
        out.extend_from_slice(&tag.to_ne_bytes());
        for k in 1..self.stride / 8 {
            out.extend_from_slice(&self.map.u64_at(at + k * 8)?.load(Ordering::Acquire).to_ne_bytes());
        }
        (tag_word.load(Ordering::Acquire) == tag).then(|| {
            out.truncate(value_size);
            out
        })
    }

    /// Writes `value` (a whole slot, tag first) into slot `i` if its tag is still `expect_tag`
    /// and, when `expect_word` is given, its backend-and-state word still that: claims the slot
    /// (tag -> LB_FLOW_BUSY), swaps the word from what was expected (a CPU may have refreshed or
    /// re-picked the flow meanwhile: then the slot is given its tag back untouched), writes the
    /// rest, then publishes the tag. False when nothing was written.
    pub(super) fn put_if(&self, i: u32, expect_tag: u64, expect_word: Option<u64>, value: &[u8]) -> Result<bool> {
        anyhow::ensure!(i < self.slots && value.len() >= 16 && value.len() <= self.stride, "flow slot {i} out of range");
        let at = i as usize * self.stride;
        let tag_word = self.map.u64_at(at).context("a flow slot outside the mapping")?;
        let word = self.map.u64_at(at + 8).context("a flow slot outside the mapping")?;
        let tag = u64::from_ne_bytes(value[..8].try_into()?);
        let new_word = u64::from_ne_bytes(value[8..16].try_into()?);
        if expect_tag == BUSY || tag_word.compare_exchange(expect_tag, BUSY, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return Ok(false);
        }
        // The slot is ours: no reader uses a slot tagged LB_FLOW_BUSY, and no CPU claims it;
        // but a CPU that read the tag before the claim may still swap the word it read.
        let expected = expect_word.unwrap_or_else(|| word.load(Ordering::Acquire));
        if word.compare_exchange(expected, new_word, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            tag_word.swap(expect_tag, Ordering::AcqRel);
            return Ok(false);
        }
        for (k, chunk) in value[16..].chunks(8).enumerate() {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.map.u64_at(at + 16 + k * 8).context("a flow slot outside the mapping")?.store(u64::from_ne_bytes(w), Ordering::Relaxed);
        }
        // Release: the words above are visible before the tag that makes them a flow's.
        tag_word.swap(tag, Ordering::AcqRel);
        Ok(true)
    }

    pub(super) fn len(&self) -> u32 {
        self.slots
    }

    /// The first step of reading slot `i` as the program does: its byte offset, its tag word
    /// and the tag read, if the slot holds a flow (an odd tag); the caller reads the rest, then
    /// the tag again.
    fn held(&self, i: u32) -> Option<(usize, &AtomicU64, u64)> {
        if i >= self.slots {
            return None;
        }
        let at = i as usize * self.stride;
        let tag_word = self.map.u64_at(at)?;
        let tag = tag_word.load(Ordering::Acquire);
        (tag & 1 == 1).then_some((at, tag_word, tag))
    }

    /// Slot `i`'s tag and its backend-and-state word, read as the program reads them (tag,
    /// word, tag again); None for a free slot, one being written or one that changed meanwhile.
    pub(super) fn word(&self, i: u32) -> Option<(u64, u64)> {
        let (at, tag_word, tag) = self.held(i)?;
        let word = self.map.u64_at(at + 8)?.load(Ordering::Acquire);
        (tag_word.load(Ordering::Acquire) == tag).then_some((tag, word))
    }
}
