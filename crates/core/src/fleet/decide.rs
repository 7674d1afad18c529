//! Decisions the fleet shares: each backend's state and capacity as a pure function of the live
//! nodes' views at one store revision, so that every node that has read the store up to that
//! revision builds the same table, whatever its own probes and agents told it.
//!
//! - Health: a backend is down when more than half of the live nodes (those whose views are in
//!   the store: their leases are alive) see it down with their own checks. One node that cannot
//!   reach a backend (a firewall, a broken path) changes nothing; a backend that really stops is
//!   seen down by every node and leaves every table at the revision of the view that made the
//!   majority.
//! - Agents: per backend and load epoch, the state is the median of the nodes' reports of that
//!   epoch (ready < drain < down; the lower median, so a tie stays the milder) and the capacity
//!   the lower median of the capacities reported. An agent that answers each node differently
//!   is read as one answer by all of them.

use std::collections::BTreeSet;

use super::view::NodeView;
use crate::load::{self, Report, State};

/// (service, backend identity)
pub type Key = (String, String);

/// The backends more than half of `views` see down.
pub fn down_by_majority<'a>(views: impl IntoIterator<Item = &'a NodeView>) -> BTreeSet<Key> {
    let views: Vec<&NodeView> = views.into_iter().collect();
    let mut seen: std::collections::BTreeMap<Key, usize> = Default::default();
    for v in &views {
        for (service, backends) in &v.down {
            // A view that names a backend twice counts once.
            let distinct: BTreeSet<&String> = backends.iter().collect();
            for b in distinct {
                *seen.entry((service.clone(), b.clone())).or_default() += 1;
            }
        }
    }
    seen.into_iter().filter(|(_, n)| 2 * n > views.len()).map(|(k, _)| k).collect()
}

/// What the nodes' agents said of `backend` of `service` in `epoch`, as one report: None when no
/// view holds that epoch's answer; Some(None) when some do and none was usable.
pub fn agent_report<'a>(views: impl IntoIterator<Item = &'a NodeView>, service: &str, backend: &str, epoch: u64) -> Option<Option<Report>> {
    let mut any = false;
    let mut usable = Vec::new();
    for v in views {
        let Some(seen) = v.agents.get(service).and_then(|b| b.get(backend)).filter(|s| s.epoch == epoch) else { continue };
        any = true;
        if let Some(r) = seen.report.as_deref().and_then(|line| load::parse(line).ok()) {
            usable.push(r);
        }
    }
    any.then(|| combine(&usable))
}

/// The median of several reports of one epoch (None when there is none).
pub fn combine(reports: &[Report]) -> Option<Report> {
    if reports.is_empty() {
        return None;
    }
    let rank = |s: Option<State>| match s.unwrap_or(State::Ready) {
        State::Ready => 0,
        State::Drain => 1,
        State::Down => 2,
    };
    let mut states: Vec<u8> = reports.iter().map(|r| rank(r.state)).collect();
    states.sort_unstable();
    let state = match states[(states.len() - 1) / 2] {
        0 => None,
        1 => Some(State::Drain),
        _ => Some(State::Down),
    };
    let mut capacities: Vec<u8> = reports.iter().filter_map(|r| r.capacity).collect();
    capacities.sort_unstable();
    let capacity = (!capacities.is_empty()).then(|| capacities[(capacities.len() - 1) / 2]);
    Some(Report { state, capacity })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::view::AgentSeen;

    fn view(node: &str, down: &[&str], agent: Option<(u64, Option<&str>)>) -> NodeView {
        let mut v = NodeView { node: node.into(), ..NodeView::default() };
        if !down.is_empty() {
            v.down.insert("web".into(), down.iter().map(|s| s.to_string()).collect());
        }
        if let Some((epoch, report)) = agent {
            v.agents.entry("web".into()).or_default().insert("b1".into(), AgentSeen { epoch, report: report.map(str::to_string) });
        }
        v
    }

    fn key(b: &str) -> Key {
        ("web".to_string(), b.to_string())
    }

    #[test]
    fn a_backend_is_down_only_when_most_live_nodes_see_it_down() {
        let one = [view("a", &["b2"], None), view("b", &[], None), view("c", &[], None)];
        assert!(down_by_majority(&one).is_empty(), "one node of three cut off from b2 takes it out of no table");
        let two = [view("a", &["b2"], None), view("b", &["b2", "b2"], None), view("c", &[], None)];
        assert_eq!(down_by_majority(&two), BTreeSet::from([key("b2")]));
        let half = [view("a", &["b2"], None), view("b", &[], None)];
        assert!(down_by_majority(&half).is_empty(), "a tie is not a majority");
        assert_eq!(down_by_majority(&[view("a", &["b1"], None)]), BTreeSet::from([key("b1")]), "alone, a node's own checks decide");
        // The same views in any order: the same decision.
        let mut rev = two.clone();
        rev.reverse();
        assert_eq!(down_by_majority(&rev), down_by_majority(&two));
    }

    #[test]
    fn agents_that_answer_each_node_differently_are_read_as_their_median() {
        let views = [view("a", &[], Some((9, Some("10%")))), view("b", &[], Some((9, Some("90%")))), view("c", &[], Some((9, Some("50%"))))];
        assert_eq!(agent_report(&views, "web", "b1", 9), Some(Some(Report { state: None, capacity: Some(50) })));
        assert_eq!(agent_report(&views, "web", "b1", 8), None, "no view holds epoch 8");
        let states = [view("a", &[], Some((9, Some("down")))), view("b", &[], Some((9, Some("ready 30%")))), view("c", &[], Some((9, None)))];
        assert_eq!(agent_report(&states, "web", "b1", 9), Some(Some(Report { state: None, capacity: Some(30) })), "a tie of down and ready stays ready");
        let garbage = [view("a", &[], Some((9, Some("nonsense")))), view("b", &[], Some((9, None)))];
        assert_eq!(agent_report(&garbage, "web", "b1", 9), Some(None));
        let drains = [view("a", &[], Some((9, Some("drain")))), view("b", &[], Some((9, Some("drain 20%")))), view("c", &[], Some((9, Some("80%"))))];
        assert_eq!(agent_report(&drains, "web", "b1", 9), Some(Some(Report { state: Some(State::Drain), capacity: Some(20) })));
    }
}
