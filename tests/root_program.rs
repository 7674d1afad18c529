//! The XDP program stays well inside the verifier's budget. The kernel refuses a program whose
//! verification walks more than 1,000,000 instructions, and the walk is what a restart waits
//! for: when the flow table's code was inlined on every parsing path, the program grew to
//! 31,000 instructions and 717,000 steps (4.4 s to load), and one more change took it past the
//! budget, so that nothing loaded. The count is exact for a given kernel and object; a change
//! that nears the budget fails here, with the figure, long before the program stops loading.

mod common;

/// Well inside the budget: room for a change or a kernel whose verifier walks more.
const CEILING: u64 = 600_000;

#[test]
fn root_the_program_stays_well_inside_the_verifiers_budget() {
    common::require_root();
    let steps = lb::dataplane::Dataplane::verifier_steps().expect("load with the verifier's statistics");
    println!("the verifier processed {steps} instructions (budget 1,000,000; this test's ceiling {CEILING})");
    assert!(steps > 10_000, "{steps}: not a real count");
    assert!(steps <= CEILING, "the verifier processed {steps} instructions for lb_xdp: keep it under {CEILING} (move code out of the inlined paths: docs/architecture.md)");
}
