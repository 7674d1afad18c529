//! Every name the binary takes from the library's kernel side, in one place.
//!
//! `lb attach` drives the data plane through `Plane`, the balancer ([`lb::balancer::Balancer`]:
//! the data plane plus the controller's mirror of its maps, which builds tables and plans each
//! change), and calls only its methods and associated functions. The few other names it cannot
//! do without (a plane's reuse on load, its counter maps, its sizes) are here too, so that a
//! move on the library side changes this file alone. What stays where it is is used directly: `lb::dataplane::{pin,
//! link, netlink, decap}` and `PinnedMaps`.
//!
//! A module of its own, below every command, rather than in daemon/mod.rs: `lb status` and the
//! flag defaults use some of these names too, and the daemon's rooms import it without
//! importing their parent (no cycle).

/// The data plane `lb attach` drives.
pub(crate) type Plane = lb::balancer::Balancer;

/// Which pinned maps a new load reuses, for `Plane::load_with`.
pub(crate) type Reuse = lb::dataplane::Reuse;

/// Descriptors of the counter maps of their own, for the metrics thread's reads.
pub(crate) type Counters = lb::dataplane::CounterMaps;

pub(crate) use lb::dataplane::{flow_table_slots, layout_hash, DEFAULT_CONNTRACK_SIZE, DEFAULT_TABLE_CAPACITY};
