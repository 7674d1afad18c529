//! Every plane-wide counter of the data plane, named once: the members of `enum lb_stat`
//! (crates/dataplane/src/bpf/lb.h), each with the name the snapshot, `lb status`, the stats line,
//! the status page and Prometheus give it, its group, its index in the `stats` map and what it
//! counts. A new counter or drop reason is a member in lb.h, its increment, and a row here;
//! lb-dataplane's test reads `enum lb_stat` from the compiled program's BTF and fails when a
//! member has no row, or a row's index is not its member's.

/// Where a counter is shown: the groups of [`crate::stats::Snapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// `passed`: not for a service, handed to the kernel.
    Passed,
    /// `icmp_forwarded`: ICMP errors sent to their flow's backend.
    IcmpForwarded,
    /// `other_host`: frames for another host's MAC.
    OtherHost,
    /// `drops`, by reason (`lb_dropped_packets{reason}`).
    Drop,
    /// `conntrack`: the flow tables' outcomes (`lb_flow_table_lookups{event}`).
    Conntrack,
    /// `fragments`: the fragment table's events (`lb_fragment_lookups{event}`).
    Fragment,
    /// `quic_lb`: QUIC-LB's outcomes (`lb_quic_lb_packets{outcome}`).
    Quic,
    /// `quic_lb_decoded`: encrypted connection IDs decoded by the cipher
    /// (`lb_quic_lb_decoded_ids`); not an outcome, each packet's is counted in `Quic` too.
    QuicDecoded,
}

/// One member of `enum lb_stat`.
#[derive(Clone, Copy, Debug)]
pub struct Counter {
    /// The member's name in lb.h.
    pub member: &'static str,
    /// Its value: the key of its entry in the `stats` map.
    pub index: u32,
    pub group: Group,
    /// Its name in the snapshot's lists, `lb status`, the stats line and the metric's label.
    pub name: &'static str,
    /// What it counts, in a line (the status page shows the drops' help).
    pub help: &'static str,
}

const fn c(member: &'static str, index: u32, group: Group, name: &'static str, help: &'static str) -> Counter {
    Counter { member, index, group, name, help }
}

use Group::*;

/// Every counter, in the enum's order (so in each group the order lb.h gives them).
pub const COUNTERS: [Counter; 39] = [
    c("LB_STAT_PASSED", 0, Passed, "passed", "not for a service: handed to the kernel unchanged"),
    c("LB_DROP_MALFORMED", 1, Drop, "malformed", "a header cut short or inconsistent"),
    c("LB_DROP_NO_BACKEND", 2, Drop, "no_backend", "the slot is empty"),
    c("LB_DROP_NO_MAC", 3, Drop, "no_mac", "the backend's (or next hop's) MAC is not resolved"),
    c("LB_DROP_FRAGMENT", 4, Drop, "fragment", "a non-first fragment that cannot be routed"),
    c("LB_DROP_NO_TABLE", 5, Drop, "no_table", "a route outside the table array"),
    c("LB_CT_HIT", 6, Conntrack, "hit", "a tracked flow went to its own backend"),
    c("LB_CT_MISS", 7, Conntrack, "miss", "no entry: the table decided"),
    c("LB_CT_NEW", 8, Conntrack, "new", "an established entry was made (or remade, for a stale one)"),
    c("LB_CT_STALE", 9, Conntrack, "stale", "an entry whose backend is gone, unhealthy or expired: re-hashed"),
    c("LB_STAT_TOO_BIG", 10, Drop, "too_big", "too long once encapsulated: answered with ICMP"),
    c("LB_DROP_OVERSIZE", 11, Drop, "oversize", "too long once encapsulated, fragmentation allowed"),
    c("LB_DROP_ENCAP", 12, Drop, "encap", "the frame could not be encapsulated"),
    c("LB_ICMP_FORWARDED", 13, IcmpForwarded, "icmp_forwarded", "an ICMP error about a service's flow, sent to that flow's backend"),
    c("LB_CT_PENDING", 14, Conntrack, "pending", "a flow's first packet was recorded in flow_pending"),
    c("LB_CT_EVICTED", 15, Conntrack, "evicted", "an established flow was forgotten to make room for another"),
    c("LB_DROP_TOO_BIG_LIMITED", 16, Drop, "too_big_limited", "too long once encapsulated, past the too-big answers' rate limit"),
    c("LB_DROP_TOO_BIG_BELOW_MIN", 17, Drop, "too_big_below_min", "too long once encapsulated, and the MTU left is below the protocol's minimum"),
    c("LB_STAT_OTHER_HOST", 18, OtherHost, "other_host", "a frame addressed to another host's MAC: handed to the kernel unchanged"),
    c("LB_DROP_NOT_UNICAST", 19, Drop, "not_unicast", "a broadcast or multicast frame for a service"),
    c("LB_DROP_VLAN", 20, Drop, "vlan", "a frame for a service tagged with a VLAN other than 0"),
    c("LB_DROP_EXT_HEADER", 21, Drop, "ext_header", "IPv6 for a VIP behind extension headers lb does not follow"),
    c("LB_FRAG_RECORDED", 22, Fragment, "recorded", "a first fragment's backend recorded for its later fragments"),
    c("LB_FRAG_FOLLOWED", 23, Fragment, "followed", "a later fragment sent to the backend its first fragment went to"),
    c("LB_FRAG_UNMATCHED", 24, Fragment, "unmatched", "a later fragment without a record: the fragment route decided"),
    c("LB_CT_NO_ROOM", 25, Conntrack, "no_room", "a flow's buckets were full of live flows: it stays half-open"),
    c("LB_FRAG_CONFLICT", 26, Fragment, "conflict", "a first fragment disagreed with its datagram's record: the record was deleted"),
    c("LB_CT_ADOPTED", 27, Conntrack, "adopted", "a TCP packet in mid-connection of a flow with no entry: recorded like a first packet"),
    c("LB_CT_STABLE", 28, Conntrack, "stable", "a tracked packet on a stable slot: sent by the table without a lookup"),
    c("LB_QUIC_ROUTED", 29, Quic, "routed", "sent to the backend whose server ID its connection ID carries"),
    c("LB_QUIC_CLIENT_ID", 30, Quic, "client_id", "an Initial or 0-RTT packet: its ID was chosen by the client"),
    c("LB_QUIC_UNROUTABLE", 31, Quic, "unroutable", "config rotation bits 0b111: a server without a configuration chose it"),
    c("LB_QUIC_OTHER_CONFIG", 32, Quic, "other_config", "rotation bits of no configuration of this service"),
    c("LB_QUIC_SHORT", 33, Quic, "short", "too short for a QUIC packet carrying this configuration's IDs"),
    c("LB_QUIC_UNKNOWN_SERVER", 34, Quic, "unknown_server", "a server ID no backend of the pool has"),
    c("LB_QUIC_UNUSABLE", 35, Quic, "unusable", "the server ID of a backend that is down (unhealthy or removed)"),
    c("LB_QUIC_NO_KEY", 36, Quic, "no_key", "encrypted, and the kernel's AES context is missing or failed"),
    c("LB_QUIC_OVER_BUDGET", 37, Quic, "over_budget", "encrypted, not kept decoded, and this CPU decoded all its budget allows"),
    c("LB_QUIC_DECODED", 38, QuicDecoded, "decoded", "an encrypted connection ID decoded by the cipher (not among those decoded before)"),
];

/// The counters of `group`, in order.
pub fn of(group: Group) -> impl Iterator<Item = &'static Counter> {
    COUNTERS.iter().filter(move |c| c.group == group)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows are in the enum's order, each index once, and no two rows of a group share a name
    /// (a label or a JSON key would hide one). That the indexes are lb.h's is lb-dataplane's
    /// test, which reads the compiled program.
    #[test]
    fn indexes_run_in_order_and_names_are_unique_in_a_group() {
        for (i, c) in COUNTERS.iter().enumerate() {
            assert_eq!(c.index as usize, i, "{}", c.member);
            assert!(!c.help.is_empty() && !c.name.is_empty(), "{}", c.member);
            assert_eq!(COUNTERS.iter().filter(|o| o.group == c.group && o.name == c.name).count(), 1, "{}", c.name);
        }
        assert_eq!(of(Group::Drop).count(), 13);
    }
}
