use super::*;
use crate::config::parse_str;

/// web: three backends asked by an agent every second, with a 10 s slow start.
fn pool(extra: &str) -> Pool {
    parse_str(
        "p.yaml",
        &format!(
            "services:\n  - name: web\n    vip: 10.99.0.100\n    port: 80\n    agent: {{port: 4050, interval: 1s}}\n    slow_start: 10s\n    backends: [{{name: b1, address: 10.0.0.1}}, {{name: b2, address: 10.0.0.2}}, {{name: b3, address: 10.0.0.3, weight: 2}}{extra}]\n"
        ),
    )
    .expect("valid")
}

fn key(b: &str) -> Key {
    ("web".to_string(), b.to_string())
}

/// Unix ms at which epoch `e` (1 s) is decided.
fn at(e: u64) -> u64 {
    e * 1000 + 950
}

fn report(line: &str) -> Option<Report> {
    Some(parse(line).expect(line))
}

fn weights(p: &Pool) -> Vec<(u32, BackendState)> {
    p.services[0].backends.iter().map(|b| (b.weight, b.state)).collect()
}

#[test]
fn weights_follow_the_reports_in_steps_and_a_slower_backend_gets_less() {
    let p = pool("");
    let mut l = Loads::new();
    l.renew(None, &p, at(100));
    assert_eq!(weights(&l.apply(&p, at(100)).pool), vec![(100, BackendState::Active), (100, BackendState::Active), (200, BackendState::Active)]);
    for e in 100..120 {
        l.record(&key("b1"), e, report("100%"));
        l.record(&key("b2"), e, report("33%"));
        l.record(&key("b3"), e, report("ready"));
    }
    let applied = l.apply(&p, at(119));
    assert_eq!(weights(&applied.pool), vec![(100, BackendState::Active), (33, BackendState::Active), (200, BackendState::Active)]);
    assert_eq!(applied.adjustments[&key("b2")].why(), "agent 33%");
    assert_eq!(applied.adjustments[&key("b2")].reported, Some(33));
    assert!(applied.failing_open.is_empty());
}

#[test]
fn a_falling_capacity_moves_at_most_max_change_an_epoch() {
    let p = pool("");
    let mut l = Loads::new();
    for e in 0..10 {
        l.record(&key("b2"), e, report("100%"));
    }
    let mut seen = Vec::new();
    for e in 10..20 {
        l.record(&key("b2"), e, report("10%"));
        seen.push(l.apply(&p, at(e)).pool.services[0].backends[1].weight);
    }
    // The median needs three epochs of 10%, then 25 points an epoch: 100, 75, 50, 25, 10.
    assert_eq!(seen, vec![100, 100, 75, 50, 25, 10, 10, 10, 10, 10]);
}

#[test]
fn nodes_that_read_the_same_reports_agree_whatever_they_read_before() {
    let p = pool("");
    let (mut a, mut b) = (Loads::new(), Loads::new());
    // a has run for a minute on other reports; b starts now.
    for e in 40..100 {
        a.record(&key("b1"), e, report(if e % 7 == 0 { "down" } else { "60%" }));
        a.record(&key("b2"), e, None);
    }
    for e in 100..112 {
        for (k, line) in [("b1", "45%"), ("b2", "80%"), ("b3", "drain")] {
            a.record(&key(k), e, report(line));
            b.record(&key(k), e, report(line));
        }
    }
    assert_eq!(a.apply(&p, at(111)).pool, b.apply(&p, at(111)).pool);
    assert_ne!(a.apply(&p, at(101)).pool, b.apply(&p, at(101)).pool, "before a shared history they may differ");
}

#[test]
fn garbage_and_silence_leave_the_last_good_report_standing() {
    let p = pool("");
    let mut l = Loads::new();
    for e in 0..10 {
        l.record(&key("b2"), e, report("40%"));
    }
    let before = l.apply(&p, at(9)).pool;
    // Garbage is recorded as no report (the poller counts it); silence records nothing.
    for e in 10..30 {
        if e % 2 == 0 {
            l.record(&key("b2"), e, None);
        }
    }
    assert_eq!(l.apply(&p, at(29)).pool, before);
    assert_eq!(weights(&before)[1], (40, BackendState::Active));
}

#[test]
fn drain_drains_down_takes_out_and_all_down_fails_open() {
    let p = pool("");
    let mut l = Loads::new();
    l.record(&key("b1"), 5, report("drain"));
    l.record(&key("b2"), 5, report("down"));
    let applied = l.apply(&p, at(5));
    assert_eq!(weights(&applied.pool), vec![(100, BackendState::Drain), (100, BackendState::Down), (200, BackendState::Active)]);
    assert_eq!(applied.adjustments[&key("b1")].why(), "agent says drain");
    assert_eq!(applied.adjustments[&key("b2")].why(), "agent says down");
    for e in 0..=5 {
        l.record(&key("b3"), e, report("0%"));
    }
    let applied = l.apply(&p, at(5));
    assert_eq!(applied.failing_open, vec!["web".to_string()]);
    assert_eq!(weights(&applied.pool), vec![(100, BackendState::Active), (100, BackendState::Active), (200, BackendState::Active)]);
    // A report for an epoch not decided yet is not used.
    l.record(&key("b1"), 6, report("ready"));
    assert_eq!(l.apply(&p, at(5)).failing_open, vec!["web".to_string()]);
    assert!(l.apply(&p, at(6)).failing_open.is_empty());
}

#[test]
fn a_backend_added_ramps_up_without_overshoot_but_not_at_start() {
    let old = pool("");
    let new = pool(", {name: b4, address: 10.0.0.4}");
    let mut l = Loads::new();
    l.renew(None, &old, at(0));
    assert!(l.apply(&old, at(0)).adjustments.is_empty(), "nothing ramps at start");
    l.renew(Some(&old), &new, 50_500);
    let mut last = 0;
    let mut ramp = Vec::new();
    for e in 50..64 {
        let w = l.apply(&new, at(e)).pool.services[0].backends[3].weight;
        assert!(w >= last && w <= 100, "epoch {e}: {w} after {last}");
        last = w;
        ramp.push(w);
    }
    assert_eq!(ramp, vec![10, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 100, 100, 100]);
    assert_eq!(l.apply(&new, at(52)).adjustments[&key("b4")].why(), "slow start 20%");
}

#[test]
fn a_backend_back_from_an_agents_down_ramps_up() {
    let p = pool("");
    let mut l = Loads::new();
    l.record(&key("b1"), 10, report("down"));
    l.record(&key("b1"), 11, report("ready"));
    assert_eq!(weights(&l.apply(&p, at(11)).pool)[0], (10, BackendState::Active));
    assert_eq!(weights(&l.apply(&p, at(16)).pool)[0], (50, BackendState::Active));
    assert_eq!(weights(&l.apply(&p, at(21)).pool)[0], (100, BackendState::Active));
}

#[test]
fn epochs_are_read_off_the_wall_clock() {
    let len = Duration::from_secs(2);
    assert_eq!(epoch_at(10_999, len), 5);
    assert_eq!(point_in(5, POLL_AT, len), 10_600);
    assert_eq!(decided_epoch(11_799, len), 4);
    assert_eq!(decided_epoch(11_800, len), 5);
}
