//! The balancer's side of stable slots (crates/core/src/stable.rs): which slots it has marked unstable, when
//! each service's range was placed, marking after each change and on adoption, and the sweep
//! that marks slots stable again.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::Result;

use crate::config::{Forward, HashMode};
use crate::dataplane::{slot_marks as marks, Dataplane};
use crate::plan::{LiveService, Op, RouteKey};
use crate::stable::{self, Entry};

/// The unstable slots and what judging them needs.
#[derive(Debug, Default)]
pub(super) struct Marks {
    /// The slots marked unstable in the table array.
    unstable: BTreeSet<u32>,
    /// Per table range (by its base), when it was placed or its service rehashed: data-plane
    /// ticks. A range not listed was placed before `before`.
    placed: HashMap<u32, u32>,
    /// What is known of ranges placed before this controller (lb_meta's mark; None: nothing,
    /// then they count as placed when it took over).
    before: Option<u32>,
    /// The ranges (by base) the change being executed places: their placement is stamped
    /// again once it has run (`placed_now`), since the route that moves their flows switches
    /// somewhere in it.
    placing: Vec<u32>,
    /// When a slot was last marked: no slot is made stable sooner than PLACED_MARGIN after it,
    /// so that a packet that read a slot's old owner and wrote its entry a moment later has
    /// written it before the sweep reads the tables.
    last_marked: Option<u32>,
}

/// What of a service decides which flows hash where in its range: a change of any moves them
/// all (a key swapped with another service's keeps the range, and brings other flows).
fn placement(s: &LiveService) -> (&RouteKey, u32, u32, HashMode) {
    (&s.key, s.base, s.slots, s.spec.hash)
}

impl Marks {
    /// After a change from `old` to `new` services whose executed operations were `ops`: every
    /// slot written is unstable (the data plane marked it as it wrote it); a service placed anew,
    /// resized or rehashed has every slot unstable, marked here where its owner did not change,
    /// and its placement recorded; a second-chance slot whose first hop differs from its owner
    /// is unstable too (crates/core/src/stable.rs, pinned()).
    pub(super) fn after(&mut self, dp: &Dataplane, new: &[LiveService], ops: &[Op]) -> Result<()> {
        self.note_written(ops);
        self.placed_now(dp)?;
        for s in new.iter().filter(|s| s.spec.second_chance() && s.spec.forward == Forward::Gue) {
            self.mark(dp, s, |i| stable::pinned(s.owners[i], s.hops.get(i)));
        }
        // Ranges no service holds any more: a later placement writes them anew.
        let bases: BTreeSet<u32> = new.iter().map(|s| s.base).collect();
        self.placed.retain(|b, _| bases.contains(b));
        Ok(())
    }

    /// Before a change from `old` to `new` services is executed: each service placed anew,
    /// resized, rehashed or given another key has its placement recorded now (here and in
    /// lb_meta, before anything is written, so that a change that fails or a controller that
    /// dies half way leaves it known), and one that keeps its range has that range marked
    /// unstable before its route changes how flows hash into it. A new range is marked as
    /// the plan writes it, before any route leads to it.
    pub(super) fn before(&mut self, dp: &Dataplane, old: &[LiveService], new: &[LiveService]) -> Result<()> {
        let now = marks::now_ticks()?;
        let was: HashMap<&str, &LiveService> = old.iter().map(|s| (s.name.as_str(), s)).collect();
        let mut placed = false;
        for s in new {
            let o = was.get(s.name.as_str()).copied();
            if o.is_some_and(|o| placement(o) == placement(s)) {
                continue;
            }
            placed = true;
            self.placed.insert(s.base, now);
            self.placing.push(s.base);
            if let Some(o) = o.filter(|o| o.base == s.base && o.slots == s.slots) {
                self.mark(dp, o, |_| true);
            }
        }
        if placed {
            // Until the change has run, an adopting controller takes every range for placed
            // when it takes over.
            dp.set_placement_under_way()?;
        }
        self.last_marked = Some(now);
        Ok(())
    }

    /// Once a change has run, whole or in part: the ranges it placed count as placed now (their
    /// routes switched somewhere in it, and an entry written before that may record where its
    /// flow hashed before), in lb_meta too, and no slot is judged for a margin from now.
    pub(super) fn placed_now(&mut self, dp: &Dataplane) -> Result<()> {
        let now = marks::now_ticks()?;
        if !self.placing.is_empty() {
            for b in std::mem::take(&mut self.placing) {
                self.placed.insert(b, now);
            }
            dp.set_placed_mark(now)?;
        }
        self.last_marked = Some(now);
        Ok(())
    }

    /// Marks unstable the slots `which` selects (by index in the service's table) that are not
    /// yet, and hold a backend.
    fn mark(&mut self, dp: &Dataplane, s: &LiveService, which: impl Fn(usize) -> bool) {
        for i in (0..s.owners.len()).filter(|&i| s.owners[i] != 0 && which(i)) {
            let at = s.base + i as u32;
            if self.unstable.insert(at) {
                dp.mark_unstable(at);
            }
        }
    }

    /// After a change that failed part way, of which `ops` were executed: the slots written are
    /// unstable (the mirror cannot say more until the next change rewrites what it touched).
    pub(super) fn note_written(&mut self, ops: &[Op]) {
        for op in ops {
            if let Op::Slots(entries) = op {
                self.unstable.extend(entries.iter().filter(|e| e.1 != 0).map(|e| e.0));
            }
        }
    }

    /// On adopting a live plane: its unstable slots are those whose words say so; its ranges
    /// count as placed at lb_meta's mark (or now, when it has none).
    pub(super) fn adopt(&mut self, dp: &Dataplane, services: &[LiveService]) -> Result<()> {
        self.unstable.clear();
        self.placed.clear();
        let now = marks::now_ticks()?;
        self.before = Some(dp.placed_mark()?.unwrap_or(now));
        self.last_marked = Some(now);
        for s in services {
            if dp.unmarked() {
                // A plane from before stable slots: every slot, marked once this program runs.
                self.unstable.extend((s.base..s.base + s.slots).filter(|&i| dp.slot_word(i) & marks::ID_MASK != 0));
            } else {
                self.unstable.extend((s.base..s.base + s.slots).filter(|&i| dp.slot_word(i) & marks::UNSTABLE != 0));
            }
        }
        Ok(())
    }

    /// Once the program has replaced an older one: the unstable slots are marked in the words.
    pub(super) fn switched(&self, dp: &mut Dataplane) -> Result<()> {
        dp.finish_marks(self.unstable.iter().copied())
    }

    /// Marks every unstable slot stable, unchecked (Balancer::mark_all_stable_unchecked).
    pub(super) fn forget_all(&mut self, dp: &Dataplane) {
        for i in std::mem::take(&mut self.unstable) {
            dp.mark_stable(i, dp.slot_word(i) & marks::ID_MASK);
        }
    }

    /// How many slots are unstable.
    pub(super) fn count(&self) -> usize {
        self.unstable.len()
    }

    /// Whether slot `i` is marked unstable.
    pub(super) fn is_unstable(&self, i: u32) -> bool {
        self.unstable.contains(&i)
    }

    /// Marks stable every unstable slot that the flow tables allow (crates/core/src/stable.rs), and forgets
    /// those no service holds. Returns how many became stable.
    pub(super) fn sweep(&mut self, dp: &Dataplane, services: &[LiveService]) -> Result<usize> {
        let now = marks::now_ticks()?;
        if self.unstable.is_empty() || dp.unmarked() || self.last_marked.is_some_and(|t| (now.wrapping_sub(t) as i32) < stable::PLACED_MARGIN as i32) {
            return Ok(0);
        }
        let mut ranges: Vec<&LiveService> = services.iter().collect();
        ranges.sort_by_key(|s| s.base);
        let service_at = |i: u32| -> Option<(&LiveService, usize)> {
            let k = ranges.partition_point(|s| s.base <= i).checked_sub(1)?;
            let s = ranges[k];
            (i < s.base + s.owners.len() as u32).then(|| (s, (i - s.base) as usize))
        };
        self.unstable.retain(|&i| service_at(i).is_some());
        let mut judged: BTreeMap<u32, Option<u32>> = BTreeMap::new();
        for &i in &self.unstable {
            if let Some((s, k)) = service_at(i) {
                if s.spec.second_chance() && s.spec.forward == Forward::Gue && stable::pinned(s.owners[k], s.hops.get(k)) {
                    continue;
                }
                judged.insert(i, self.placed.get(&s.base).copied().or(self.before));
            }
        }
        if judged.is_empty() {
            return Ok(0);
        }
        let (tcp, udp) = dp.conntrack_timeouts_ms();
        let (tcp, udp) = (stable::ticks(tcp), stable::ticks(udp));
        let mut entries = Vec::new();
        dp.for_each_flow(|e| {
            let life = stable::life(if e.udp { udp } else { tcp }, e.reset);
            // An entry whose id went to another backend since never counts again; one whose
            // backend is down now may count again when it returns, so it is kept (and no
            // promotion takes it either: flow.h, ct_held()).
            if e.backend != 0 && e.gen == dp.flow_gen(e.backend) && stable::alive(e.seen, now, life) {
                entries.push(Entry { backend: e.backend, seen: e.seen, slot: e.slot });
            }
        });
        let cleared = stable::sweep(&judged, entries, now, |i| service_at(i).map(|(s, k)| s.owners[k]));
        let mut n = 0;
        for s in cleared {
            if dp.mark_stable(s.index, s.owner) {
                self.unstable.remove(&s.index);
                n += 1;
            }
        }
        Ok(n)
    }
}
