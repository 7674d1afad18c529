//! From reports to weights: a backend's effective capacity and state as pure functions of a
//! bounded history of epochs, and the slow-start ramp (docs/load.md says why each rule is what
//! it is).
//!
//! The capacity of epoch `e` is the end of a chain that starts [`LEAD`] epochs before the block of
//! [`BLOCK`] epochs that `e` falls in (blocks are counted from epoch 0, so every node cuts them
//! alike) and walks to `e`. It starts at that epoch's median, and at each later epoch:
//! - the median of the last [`WINDOW`] epochs' reports is taken (a report that lasts one or two
//!   epochs changes nothing);
//! - it replaces the held value only once it has differed by [`BAND`] points or more, on the same
//!   side, for [`PERSIST`] epochs in a row (hysteresis: reports that wander within the band, or
//!   flap across it, leave the weight where it is);
//! - and it moves the held value at most [`MAX_CHANGE`] points an epoch; a move, once begun,
//!   goes on to the median.
//!
//! Everything is a function of the reports of the last [`HISTORY`] epochs (and the last good
//! report before them), never of a running state, so nodes that read the same reports hold the
//! same capacity. The hysteresis holds within a block; the restart at a block's start can move a
//! held value by less than the band, once per block.

use super::State;

/// Epochs whose reports one median takes.
pub const WINDOW: usize = 5;
/// The resolution of capacities and weights, in percent.
pub const STEP: u32 = 1;
/// A new median replaces the held capacity only if it differs by this many points or more...
pub const BAND: u32 = 5;
/// ...in the same direction for this many epochs in a row.
pub const PERSIST: usize = 3;
/// The most an effective capacity moves from one epoch to the next, in points.
pub const MAX_CHANGE: u32 = 25;
/// Epochs over which the change is bounded before a chain's held value counts: enough for
/// MAX_CHANGE to cross the whole range.
pub const SETTLE: usize = (100 / MAX_CHANGE) as usize;
/// Epochs a chain starts before its block: its start median settles in that many steps.
pub const LEAD: usize = SETTLE + WINDOW;
/// Epochs in a block of hysteresis.
pub const BLOCK: u64 = 10;
/// Epochs of reports an effective capacity depends on, at most.
pub const HISTORY: usize = BLOCK as usize + LEAD + WINDOW;
/// Slow-start shares are quantized to this many percent, so that nodes agree on them.
pub const RAMP_STEP: u32 = 5;
/// Intervals in a row that an agent's `drain` or `down` needs before it takes effect, and that
/// another state needs before it ends.
pub const RUN: usize = 3;

/// The state held at the newest of `states` (oldest first; None: no usable answer that
/// interval): the state of the newest run of RUN answers in a row (intervals without one are
/// skipped, not filled, so a missed answer never completes a run) that agree: all `down` is
/// down, all `drain` or `down` is drain, all ready is ready; ready if there is none. A flapping
/// agent changes nothing; a lasting answer takes effect in RUN intervals.
pub fn held_state(states: &[Option<State>]) -> State {
    let answers: Vec<State> = states.iter().flatten().copied().collect();
    for end in (RUN..=answers.len()).rev() {
        let run = &answers[end - RUN..end];
        if run.iter().all(|s| *s == State::Down) {
            return State::Down;
        }
        if run.iter().all(|s| *s != State::Ready) {
            return State::Drain;
        }
        if run.iter().all(|s| *s == State::Ready) {
            return State::Ready;
        }
    }
    State::Ready
}

/// The median of the capacities in `window` (oldest first; None: no usable report that epoch,
/// which carries the last good one before it, `carried` before the window); 100 when there is
/// no good report at all.
fn median_capacity(carried: Option<u8>, window: &[Option<u8>]) -> u32 {
    let mut last = carried;
    let mut filled: Vec<u32> = Vec::with_capacity(window.len());
    for r in window {
        if r.is_some() {
            last = *r;
        }
        if let Some(c) = last {
            filled.push(c.min(100) as u32);
        }
    }
    if filled.is_empty() {
        return 100;
    }
    filled.sort_unstable();
    filled[filled.len() / 2]
}

/// The effective capacity in percent of epoch `epoch`, the newest of `reports` (oldest first,
/// one per epoch; earlier epochs than the chain needs only carry their last good report).
pub fn effective_capacity(reports: &[Option<u8>], epoch: u64) -> u32 {
    let n = reports.len();
    let median_at = |end: usize| {
        let start = end.saturating_sub(WINDOW);
        let carried = reports[..start].iter().rev().find_map(|r| *r);
        median_capacity(carried, &reports[start..end])
    };
    // The chain's length: from LEAD epochs before this epoch's block to this epoch; a node that
    // has not read that far back starts at its first answer (not at the full capacity that no
    // answer means).
    let walk = (epoch % BLOCK) as usize + LEAD;
    let first = n.saturating_sub(walk);
    let first = match reports.iter().position(|r| r.is_some()) {
        Some(p) if p >= first => p + 1,
        _ => first,
    };
    let mut held = median_at(first);
    // A move begins once PERSIST medians in a row lie beyond the band on one side (a capacity
    // that flaps moves nothing), and, once begun, goes all the way to the median, however close
    // the last step lands.
    let mut moving = false;
    let mut beyond: Vec<std::cmp::Ordering> = Vec::new();
    for end in first + 1..=n {
        let m = median_at(end);
        beyond.push(if m.abs_diff(held) < BAND { std::cmp::Ordering::Equal } else { m.cmp(&held) });
        let lasting = beyond.len() >= PERSIST && {
            let last = &beyond[beyond.len() - PERSIST..];
            last[0] != std::cmp::Ordering::Equal && last.iter().all(|o| *o == last[0])
        };
        if moving || lasting {
            held = m.clamp(held.saturating_sub(MAX_CHANGE), (held + MAX_CHANGE).min(100));
            moving = held != m;
            beyond.clear();
        }
    }
    held
}

/// The share of its configured weight a backend is served with, in percent: its capacity times
/// its slow-start share, rounded; never 0 unless one of them is (a backend with capacity left
/// keeps at least one point).
pub fn combined(capacity: u32, ramp: u32) -> u32 {
    if capacity == 0 || ramp == 0 {
        return 0;
    }
    ((capacity.min(100) * ramp.min(100) + 50) / 100).max(STEP)
}

/// The weight written to the table for a configured `weight` served at `percent`: in units of
/// one STEP, so a backend at full capacity is written with WEIGHT_STEPS times its weight.
pub fn table_weight(weight: u32, percent: u32) -> u32 {
    weight * (percent.min(100) / STEP)
}

const _: () = assert!(STEP * crate::config::WEIGHT_STEPS == 100);

/// Slow start: the share of its weight a backend gets `elapsed` epochs after it became usable,
/// in a window of `window` epochs, in percent quantized down to RAMP_STEP: Envoy's curve,
/// `max(min, (elapsed / window)^(1 / aggression))`, which with aggression 1 is a straight ramp and
/// above 1 rises faster at first. 100 from the window's end on.
pub fn slow_start_share(elapsed: u32, window: u32, min_percent: u32, aggression: f64) -> u32 {
    if window == 0 || elapsed >= window {
        return 100;
    }
    let a = if aggression > 0.0 { aggression } else { 1.0 };
    let share = ((elapsed as f64 / window as f64).powf(1.0 / a) * 100.0) as u32;
    let share = share.min(100);
    (share - share % RAMP_STEP).max(min_percent.min(100))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The capacity of an epoch in the middle of a block.
    fn mid(reports: &[Option<u8>]) -> u32 {
        effective_capacity(reports, 15)
    }

    #[test]
    fn a_report_of_one_or_two_epochs_changes_nothing() {
        assert_eq!(mid(&[Some(80); 6]), 80);
        let blip = [Some(80), Some(80), Some(80), Some(10), Some(10), Some(80)];
        assert_eq!(mid(&blip), 80);
        let lasting = [Some(80), Some(80), Some(80), Some(30), Some(30), Some(30)];
        assert_eq!(mid(&lasting), 80, "the median moved to 30 on the last: not yet three in a row");
        let mut longer = lasting.to_vec();
        longer.extend([Some(30), Some(30)]);
        assert_eq!(mid(&longer), 55, "the third median beyond the band: at most 25 an epoch");
        longer.push(Some(30));
        assert_eq!(mid(&longer), 30, "and on the next");
        let fall: Vec<Option<u8>> = [Some(100); 20].into_iter().chain([Some(0); 8]).collect();
        let seen: Vec<u32> = (20..=28).map(|n| mid(&fall[..n])).collect();
        // The median moves on the third answer; three medians beyond the band begin the move.
        assert_eq!(seen, vec![100, 100, 100, 100, 100, 75, 50, 25, 0], "25 points an epoch from any start");
    }

    #[test]
    fn reports_that_wander_within_the_band_leave_the_capacity_held() {
        // Reports indexed by epoch: a steady 35, then 34 and 38 in turn (4 apart: within the band).
        let mut r: Vec<Option<u8>> = vec![Some(35); 20];
        r.extend((0..30).map(|i| Some(if i % 2 == 0 { 34 } else { 38 })));
        // Within a block (epochs 40 to 49) the held capacity does not move.
        let held: Vec<u32> = (40..50).map(|e| effective_capacity(&r[..e + 1], e as u64)).collect();
        assert!(held.iter().all(|&h| h == held[0]) && [34, 38].contains(&held[0]), "{held:?}");
        // While it stays steady, a block's restart moves nothing either.
        let steady: Vec<Option<u8>> = vec![Some(35); 60];
        assert!((20..60).all(|e| effective_capacity(&steady[..e + 1], e as u64) == 35));
        // A lasting move beyond the band is followed.
        r.extend([Some(28); 6]);
        assert_eq!(effective_capacity(&r, 55), 28);
        // The restart at a block's start is the only place a held value may move by less than
        // the band.
        let r: Vec<Option<u8>> = [Some(35); 10].into_iter().chain([Some(33); 40]).collect();
        assert_eq!(effective_capacity(&r, 60 + BLOCK), 33);
    }

    #[test]
    fn drain_and_down_take_three_intervals_in_a_row_and_flapping_changes_nothing() {
        use State::*;
        let s = |v: &[State]| v.iter().map(|x| Some(*x)).collect::<Vec<_>>();
        assert_eq!(held_state(&s(&[Ready, Down, Down])), Ready);
        assert_eq!(held_state(&s(&[Ready, Down, Down, Down])), Down);
        assert_eq!(held_state(&s(&[Down, Down, Down, Ready, Ready])), Down, "two ready intervals do not end it");
        assert_eq!(held_state(&s(&[Down, Down, Down, Ready, Ready, Ready])), Ready);
        let flap: Vec<State> = (0..40).map(|i| if i % 2 == 0 { Down } else { Ready }).collect();
        assert_eq!(held_state(&s(&flap)), Ready, "down and ready in turn never take it out");
        let mut held = s(&[Down; 3]);
        held.extend((0..20).map(|i| Some(if i % 3 == 2 { Ready } else { Down })));
        assert_eq!(held_state(&held), Down, "and a down backend that blinks ready stays down");
        assert_eq!(held_state(&s(&[Down, Drain, Down, Drain])), Drain, "down and drain in turn drain");
        // A missed answer does not complete a run: down, ready, (none), down is no run.
        assert_eq!(held_state(&[Some(Ready), Some(Down), Some(Ready), None, Some(Down), Some(Ready)]), Ready);
        assert_eq!(held_state(&[Some(Down), None, Some(Down), None, Some(Down)]), Down, "silence between answers does not break one");
        assert_eq!(held_state(&[]), Ready);
    }

    #[test]
    fn a_capacity_that_flaps_moves_nothing() {
        for pattern in [vec![0u8, 100], vec![0, 0, 100, 100], vec![20, 100, 100], vec![30, 30, 100, 100, 100]] {
            let r: Vec<Option<u8>> = (0..60).map(|i| Some(pattern[i % pattern.len()])).collect();
            let held: Vec<u32> = (30..60).map(|e| effective_capacity(&r[..e + 1], e as u64)).collect();
            let changes = held.windows(2).filter(|w| w[0] != w[1]).count();
            assert!(changes <= 3, "{pattern:?}: {held:?}");
        }
    }

    #[test]
    fn a_node_that_starts_late_starts_at_its_first_answer() {
        // An old node held 97 from a long history; a new one reads only the last few answers.
        let old: Vec<Option<u8>> = [Some(97u8); 40].into_iter().collect();
        for n in 1..=8 {
            assert_eq!(effective_capacity(&old[40 - n..], 15), 97, "{n} answers");
        }
        assert_eq!(effective_capacity(&old, 15), 97);
    }

    #[test]
    fn capacities_keep_their_points() {
        assert_eq!(mid(&[Some(33); 10]), 33);
        assert_eq!(mid(&[Some(74); 10]), 74);
    }

    #[test]
    fn silence_carries_the_last_good_report_and_no_report_is_full_capacity() {
        assert_eq!(mid(&[Some(40), None, None, None, None, None]), 40);
        assert_eq!(mid(&[None; 6]), 100);
    }

    #[test]
    fn two_nodes_with_different_histories_agree_once_they_share_one() {
        let shared: Vec<Option<u8>> = (0..HISTORY).map(|i| Some([60u8, 45, 47, 20, 22, 90][i / 4 % 6])).collect();
        for epoch in [10 * 7, 10 * 7 + 3, 10 * 7 + 9] {
            let mut a: Vec<Option<u8>> = (0..50).map(|i| Some((i * 7 % 100) as u8)).collect();
            a.extend_from_slice(&shared);
            assert_eq!(effective_capacity(&a, epoch), effective_capacity(&shared, epoch), "epoch {epoch}");
        }
    }

    #[test]
    fn weights_scale_in_points_and_keep_a_share() {
        assert_eq!(combined(35, 100), 35);
        assert_eq!(combined(33, 50), 17);
        assert_eq!(combined(1, 10), 1, "capacity left keeps one point");
        assert_eq!(combined(0, 100), 0);
        assert_eq!(table_weight(1, 100), 100);
        assert_eq!(table_weight(3, 35), 105);
        assert_eq!(table_weight(3, 0), 0);
    }

    #[test]
    fn slow_start_rises_to_the_full_weight_and_never_overshoots() {
        let mut last = 0;
        for t in 0..=30 {
            let s = slow_start_share(t, 30, 10, 1.0);
            assert!(s >= last && s <= 100, "{t}: {s} after {last}");
            last = s;
        }
        assert_eq!(slow_start_share(0, 30, 10, 1.0), 10);
        assert_eq!(slow_start_share(15, 30, 10, 1.0), 50);
        assert_eq!(slow_start_share(30, 30, 10, 1.0), 100);
        assert!(slow_start_share(5, 30, 10, 2.0) > slow_start_share(5, 30, 10, 1.0), "aggression rises faster at first");
    }
}
