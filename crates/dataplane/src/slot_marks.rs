//! The kernel side of stable slots (crates/core/src/stable.rs): each table slot's unstable bit, written and
//! cleared through the table's memory mapping, and the flow tables' entries with their records,
//! read through theirs for the sweep. The verdict is the balancer's; this only reads and writes.

use anyhow::Result;
use libbpf_rs::MapCore;

use super::mapped::{FlowSlots, Words};
use super::{types, Dataplane};

/// A table slot's unstable bit (lb.h, enum lb_slot_bits).
pub const UNSTABLE: u32 = types::lb_slot_bits::LB_SLOT_UNSTABLE.0;
/// The backend id in a table slot's word.
pub const ID_MASK: u32 = types::lb_slot_bits::LB_SLOT_ID_MASK.0;

const GEN_MASK: u32 = types::lb_flow_gen_bits::LB_FLOW_GEN_MASK.0;
const UDP: u32 = types::lb_flow_gen_bits::LB_FLOW_UDP.0;
const RESET: u32 = types::lb_flow_gen_bits::LB_FLOW_RESET.0;

/// One flow-table entry as the sweep needs it, decoded from its word (lb.h, struct lb_flow) and
/// its record (struct lb_flow_record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowEntry {
    pub backend: u32,
    /// The low bits of its backend's generation when it was made.
    pub gen: u32,
    pub udp: bool,
    pub reset: bool,
    pub seen: u32,
    /// The table slot its record names, when the record is this entry's (same tag).
    pub slot: Option<u32>,
}

/// The flow tables and their records, mapped.
pub(super) struct FlowMaps {
    flows: FlowSlots,
    pending: FlowSlots,
    flow_records: Words,
    pending_records: Words,
}

impl FlowMaps {
    pub(super) fn new(skel: &super::skel::LbSkel<'static>) -> Result<FlowMaps> {
        let m = &skel.maps;
        let info = |map: &libbpf_rs::MapMut<'_>| -> Result<(u32, u32)> {
            let i = map.info()?.info;
            Ok((i.max_entries, i.value_size))
        };
        let ((fe, fv), (pe, pv)) = (info(&m.flows)?, info(&m.flow_pending)?);
        let (re, _) = info(&m.flow_records)?;
        let (pre, _) = info(&m.pending_records)?;
        anyhow::ensure!(re == fe && pre == pe, "the flow records ({re}, {pre}) do not match their flow tables ({fe}, {pe})");
        Ok(FlowMaps {
            flows: FlowSlots::new(&m.flows, fe, fv)?,
            pending: FlowSlots::new(&m.flow_pending, pe, pv)?,
            flow_records: Words::new(&m.flow_records, re)?,
            pending_records: Words::new(&m.pending_records, pre)?,
        })
    }
}

/// An entry from its tag, word and record.
fn decode(tag: u64, word: u64, record: u64) -> FlowEntry {
    let gen_flags = (word >> 16) as u32 & 0xffff;
    let slot = ((record as u32) == (tag as u32) && record >> 32 != 0).then(|| (record >> 32) as u32 - 1);
    FlowEntry {
        backend: word as u32 & 0xffff,
        gen: gen_flags & GEN_MASK,
        udp: gen_flags & UDP != 0,
        reset: gen_flags & RESET != 0,
        seen: (word >> 32) as u32,
        slot,
    }
}

impl Dataplane {
    /// Calls `f` with every entry of the half-open table, then of the flow table (the order the
    /// sweep needs: a flow promoted during the walk is then met in one table or the other).
    pub fn for_each_flow(&self, mut f: impl FnMut(FlowEntry)) {
        let m = &self.flow_maps;
        for (table, records) in [(&m.pending, &m.pending_records), (&m.flows, &m.flow_records)] {
            for i in 0..table.len() {
                if let Some((tag, word)) = table.word(i) {
                    f(decode(tag, word, records.read(i)));
                }
            }
        }
    }

    /// The low bits of backend id `id`'s generation now, as entries record it.
    pub fn flow_gen(&self, id: u32) -> u32 {
        self.gens.get(&id).copied().unwrap_or(0) & GEN_MASK
    }

    /// The tracked flows' timeouts in ms (TCP, UDP; 0: never).
    pub fn conntrack_timeouts_ms(&self) -> (u64, u64) {
        self.skel.maps.bss_data.as_deref().map_or((0, 0), |b| (b.lb_settings.ct_tcp_timeout_ms, b.lb_settings.ct_udp_timeout_ms))
    }

    /// Table entry `i`'s whole word: the backend id and the state bits (0 past the end).
    pub fn slot_word(&self, i: u32) -> u32 {
        self.slots.read(i)
    }

    /// Marks table entry `i` unstable, whatever owner it holds (one atomic or); nothing while
    /// the words may not carry marks (the program then counts every slot unstable).
    pub fn mark_unstable(&self, i: u32) {
        if !self.unmarked {
            self.slots.set_bits(i, UNSTABLE);
        }
    }

    /// The mark a slot written now gets: none while the words may not carry marks.
    pub(super) fn write_mark(&self) -> u32 {
        if self.unmarked {
            0
        } else {
            UNSTABLE
        }
    }

    /// Whether the table words may not carry marks yet: the plane came from a version before
    /// stable slots, whose program may still read them (lb_config.stable_off).
    pub fn unmarked(&self) -> bool {
        self.unmarked
    }

    /// Once this program has replaced the one that read the words as plain ids: marks the
    /// entries `unstable` in the words, then lets the program trust the words.
    pub fn finish_marks(&mut self, unstable: impl Iterator<Item = u32>) -> Result<()> {
        if !self.unmarked {
            return Ok(());
        }
        // A run of the replaced program that began before the switch may still be reading the
        // words on another CPU: it ends within microseconds.
        std::thread::sleep(std::time::Duration::from_millis(20));
        for i in unstable {
            self.slots.set_bits(i, UNSTABLE);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.set_stable_off(false)?;
        self.unmarked = false;
        Ok(())
    }

    /// Writes lb_config.stable_off.
    pub(super) fn set_stable_off(&mut self, on: bool) -> Result<()> {
        self.settings()?.stable_off = on as u32;
        self.commit_settings()
    }

    /// lb_config.stable_off as the program reads it.
    pub(super) fn stable_off(&mut self) -> Result<bool> {
        Ok(self.settings()?.stable_off != 0)
    }

    /// Marks entry `i` stable if it still holds `owner`, unstable; whether it did.
    pub fn mark_stable(&self, i: u32, owner: u32) -> bool {
        self.slots.swap_if(i, owner | UNSTABLE, owner)
    }
}

/// The data plane's clock now, in its ticks (flow.h: the kernel's coarse CLOCK_MONOTONIC, in
/// units of 2^24 ns).
pub fn now_ticks() -> Result<u32> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)?;
    Ok(((t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64) >> 24) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_decode_as_lb_h_lays_them_out() {
        let tag = 0x1234_5678_9abc_def1u64;
        let word = 7u64 | ((0x2000u64 | 0x8000 | 5) << 16) | (99u64 << 32);
        let rec = (42u64 + 1) << 32 | (tag as u32 as u64);
        let e = decode(tag, word, rec);
        assert_eq!(e, FlowEntry { backend: 7, gen: 5, udp: true, reset: false, seen: 99, slot: Some(42) });
        // Another flow's record, or none, is unknown.
        assert_eq!(decode(tag ^ 2, word, rec).slot, None);
        assert_eq!(decode(tag, word, tag as u32 as u64).slot, None);
    }
}
