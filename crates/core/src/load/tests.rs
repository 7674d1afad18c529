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

const SEC: Duration = Duration::from_secs(1);

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
        l.record(&key("b1"), e, SEC, report("100%"));
        l.record(&key("b2"), e, SEC, report("33%"));
        l.record(&key("b3"), e, SEC, report("ready"));
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
        l.record(&key("b2"), e, SEC, report("100%"));
    }
    let mut seen = Vec::new();
    for e in 10..20 {
        l.record(&key("b2"), e, SEC, report("10%"));
        seen.push(l.apply(&p, at(e)).pool.services[0].backends[1].weight);
    }
    // The median needs three epochs of 10%, the move three medians beyond the band, then 25
    // points an epoch: 100, 75, 50, 25, 10.
    assert_eq!(seen, vec![100, 100, 100, 100, 75, 50, 25, 10, 10, 10]);
}

#[test]
fn nodes_that_read_the_same_reports_agree_whatever_they_read_before() {
    let p = pool("");
    // Answers that wander within the band (as an idle-CPU measure does), a drain, a capacity
    // that falls: a has read them for a minute, b starts at epoch 100.
    let answer = |k: &str, e: u64| -> String {
        match k {
            "b1" => format!("{}%", 58 + (e * 3 % 7)),
            "b2" if (120..126).contains(&e) => "drain".to_string(),
            "b2" => "97%".to_string(),
            _ => format!("{}%", if e < 130 { 80 } else { 40 }),
        }
    };
    let (mut a, mut b) = (Loads::new(), Loads::new());
    for e in 40..200 {
        for k in ["b1", "b2", "b3"] {
            let r = report(&answer(k, e));
            a.record(&key(k), e, SEC, r);
            if e >= 100 {
                b.record(&key(k), e, SEC, r);
            }
        }
        if e >= 100 + HISTORY as u64 {
            assert_eq!(a.apply(&p, at(e)).pool, b.apply(&p, at(e)).pool, "epoch {e}");
        }
    }
}

#[test]
fn a_node_that_starts_late_agrees_at_once_on_steady_answers() {
    let p = pool("");
    let (mut a, mut b) = (Loads::new(), Loads::new());
    for e in 0..60 {
        a.record(&key("b2"), e, SEC, report("97%"));
        if e >= 50 {
            b.record(&key("b2"), e, SEC, report("97%"));
            assert_eq!(a.apply(&p, at(e)).pool, b.apply(&p, at(e)).pool, "epoch {e}");
        }
    }
}

#[test]
fn a_restarted_node_seeded_from_its_data_plane_goes_on_from_there() {
    let p = pool("");
    let (mut a, mut b) = (Loads::new(), Loads::new());
    for e in 0..40 {
        a.record(&key("b2"), e, SEC, report(if e % 2 == 0 { "60%" } else { "63%" }));
    }
    let held = a.apply(&p, at(39)).pool.services[0].backends[1].weight;
    b.seed(&key("b2"), held);
    for e in 40..48 {
        let r = report(if e % 2 == 0 { "60%" } else { "63%" });
        a.record(&key("b2"), e, SEC, r);
        b.record(&key("b2"), e, SEC, r);
        assert_eq!(a.apply(&p, at(e)).pool.services[0].backends[1].weight, b.apply(&p, at(e)).pool.services[0].backends[1].weight, "epoch {e}");
    }
}

#[test]
fn garbage_and_silence_leave_the_last_good_report_standing() {
    let p = pool("");
    let mut l = Loads::new();
    for e in 0..10 {
        l.record(&key("b2"), e, SEC, report("40%"));
    }
    let before = l.apply(&p, at(9)).pool;
    // Garbage is recorded as no report (the poller counts it); silence records nothing.
    for e in 10..30 {
        if e % 2 == 0 {
            l.record(&key("b2"), e, SEC, None);
        }
    }
    assert_eq!(l.apply(&p, at(29)).pool, before);
    assert_eq!(weights(&before)[1], (40, BackendState::Active));
}

#[test]
fn drain_and_down_take_three_intervals_and_a_flapping_agent_changes_nothing() {
    let p = pool("");
    let mut l = Loads::new();
    for e in 0..40 {
        l.record(&key("b1"), e, SEC, report(if e % 2 == 0 { "down" } else { "ready" }));
        assert_eq!(weights(&l.apply(&p, at(e)).pool)[0], (100, BackendState::Active), "epoch {e}: a flapping agent");
    }
    for e in 40..43 {
        l.record(&key("b1"), e, SEC, report("drain"));
        l.record(&key("b2"), e, SEC, report("down"));
    }
    assert_eq!(weights(&l.apply(&p, at(41)).pool)[..2], [(100, BackendState::Active), (100, BackendState::Active)], "two intervals are not enough");
    let applied = l.apply(&p, at(42));
    assert_eq!(weights(&applied.pool), vec![(100, BackendState::Drain), (100, BackendState::Down), (200, BackendState::Active)]);
    assert_eq!(applied.adjustments[&key("b1")].why(), "agent says drain");
    assert_eq!(applied.adjustments[&key("b2")].why(), "agent says down");
    // A report for an epoch not decided yet is not used.
    l.record(&key("b3"), 43, SEC, report("0%"));
    assert_eq!(l.apply(&p, at(42)).pool, applied.pool);
}

#[test]
fn fail_open_keeps_drain_and_down_while_it_can() {
    let p = pool("");
    let mut l = Loads::new();
    for e in 0..10 {
        l.record(&key("b1"), e, SEC, report("down"));
        l.record(&key("b2"), e, SEC, report("0%"));
        l.record(&key("b3"), e, SEC, report("0%"));
    }
    let applied = l.apply(&p, at(9));
    assert_eq!(applied.failing_open, vec!["web".to_string()]);
    assert_eq!(weights(&applied.pool), vec![(100, BackendState::Down), (100, BackendState::Active), (200, BackendState::Active)], "capacities are dropped, down is kept");
    assert_eq!(applied.adjustments[&key("b2")].why(), "", "and the adjustments say so");
    assert_eq!(applied.adjustments[&key("b1")].why(), "agent says down");
    for e in 10..20 {
        l.record(&key("b2"), e, SEC, report("down"));
        l.record(&key("b3"), e, SEC, report("drain"));
    }
    let applied = l.apply(&p, at(19));
    assert_eq!(weights(&applied.pool), vec![(100, BackendState::Active), (100, BackendState::Active), (200, BackendState::Active)], "nothing left: as configured");
}

#[test]
fn a_backend_added_ramps_up_without_overshoot_but_not_at_start() {
    let old = pool("");
    let new = pool(", {name: b4, address: 10.0.0.4}");
    let mut l = Loads::new();
    l.renew(None, &old, at(0));
    assert!(l.apply(&old, at(0)).adjustments.is_empty(), "nothing ramps at start");
    l.renew(Some(&old), &new, 50_000);
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
    for e in 10..13 {
        l.record(&key("b1"), e, SEC, report("down"));
    }
    for e in 13..16 {
        l.record(&key("b1"), e, SEC, report("ready"));
    }
    assert_eq!(weights(&l.apply(&p, at(14)).pool)[0], (100, BackendState::Down), "still down after two ready intervals");
    assert_eq!(weights(&l.apply(&p, at(15)).pool)[0], (10, BackendState::Active));
    assert_eq!(weights(&l.apply(&p, at(20)).pool)[0], (50, BackendState::Active));
    assert_eq!(weights(&l.apply(&p, at(25)).pool)[0], (100, BackendState::Active));
}

#[test]
fn ramps_begin_on_a_shared_boundary_and_a_clock_that_went_back_ramps_nothing() {
    let old = pool("");
    let new = pool(", {name: b4, address: 10.0.0.4}");
    let (mut a, mut b) = (Loads::new(), Loads::new());
    // Two nodes reload 1.5 s apart, within one 5 s alignment.
    a.renew(Some(&old), &new, 51_200);
    b.renew(Some(&old), &new, 52_700);
    for e in 50..70 {
        assert_eq!(a.apply(&new, at(e)).pool, b.apply(&new, at(e)).pool, "epoch {e}");
    }
    assert_eq!(a.apply(&new, at(55)).pool.services[0].backends[3].weight, 10, "the ramp begins at 55");
    assert_eq!(a.apply(&new, at(20)).pool.services[0].backends[3].weight, 100, "an hour... a minute earlier: no ramp");
}

#[test]
fn epochs_are_read_off_the_wall_clock() {
    let len = Duration::from_secs(2);
    assert_eq!(epoch_at(10_999, len), 5);
    assert_eq!(point_in(5, POLL_AT, len), 10_600);
    assert_eq!(decided_epoch(11_799, len), 4);
    assert_eq!(decided_epoch(11_800, len), 5);
}

#[test]
fn the_previous_pool_is_served_in_points_too() {
    let dir = std::env::temp_dir().join(format!("lb-load-previous-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let body = "services:\n  - {name: web, vip: 10.99.0.100, port: 80, forward: gue, second_chance: on, algorithm: ring, slow_start: 10s, backends: [10.1.0.1, 10.1.0.2]}\n";
    std::fs::write(dir.join("prev.yaml"), body.replace(", 10.1.0.2", "")).expect("write");
    std::fs::write(dir.join("pool.yaml"), format!("previous: prev.yaml\n{body}")).expect("write");
    let pool = crate::config::load(&dir.join("pool.yaml")).expect("valid");
    let served = at_full_capacity(&pool);
    let prev = served.previous.as_deref().expect("the previous pool");
    assert_eq!(prev.services[0].backends[0].weight, 100, "hop lists are built from the previous table as it was served");
    assert_eq!(served.services[0].backends[1].weight, 100);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
