//! A service's settings as the data plane acts on them, in one value: [`RouteSpec`]. The planner
//! makes it from the pool ([`RouteSpec::of`]), keeps it in what is installed, compares it whole,
//! and the data plane encodes it whole (its `flags` word is lb.h's `enum lb_service_flags`,
//! bit for bit, as Katran's per-VIP flags are one word).
//!
//! A new per-service on/off key that the program acts on is: its field in config/mod.rs and its
//! check in config/validate/service.rs, a bit in [`Flags`] and a line in [`RouteSpec::of`] here,
//! the bit in lb.h's `enum lb_service_flags` and the code that reads it (docs/architecture.md,
//! "Adding a per-service key"). Nothing else changes: the planner, the state rebuilt from the
//! maps, the reload notes and the encoder all handle the word; lb-dataplane's test reads the enum
//! from the compiled program's BTF and fails when a bit here and there disagree.

use bitflags::bitflags;

use crate::config::{Forward, HashMode, Service};

bitflags! {
    /// The on/off settings of a route: lb.h's `enum lb_service_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Flags: u32 {
        /// `conntrack: on`: established flows keep their backend through the flow table.
        const CONNTRACK = 1;
        /// `second_chance: on`: packets carry their slot's other hops (table_hops).
        const SECOND_CHANCE = 2;
        /// `quic_lb:` is set: QUIC packets go by the server ID in their connection ID.
        const QUIC_LB = 4;
    }
}

impl Flags {
    /// Each flag with the pool key it comes from (the reload notes' word) and its member of
    /// `enum lb_service_flags` in lb.h, in bit order.
    pub const NAMED: [(Flags, &'static str, &'static str); 3] = [
        (Flags::CONNTRACK, "conntrack", "LB_SVC_CONNTRACK"),
        (Flags::SECOND_CHANCE, "second_chance", "LB_SVC_SECOND_CHANCE"),
        (Flags::QUIC_LB, "quic_lb", "LB_SVC_QUIC_LB"),
    ];
}

/// What a route tells the program about its service, besides where its table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteSpec {
    pub hash: HashMode,
    /// How packets reach the backends.
    pub forward: Forward,
    /// The outer UDP destination port of `forward: gue`.
    pub gue_port: u16,
    pub flags: Flags,
}

impl RouteSpec {
    /// Service `s`'s settings as its own route carries them.
    pub fn of(s: &Service) -> RouteSpec {
        let mut flags = Flags::empty();
        flags.set(Flags::CONNTRACK, s.conntrack);
        flags.set(Flags::SECOND_CHANCE, s.second_chance);
        flags.set(Flags::QUIC_LB, s.quic_lb.is_some());
        RouteSpec { hash: s.hash, forward: s.forward, gue_port: s.gue_port, flags }
    }

    pub fn conntrack(&self) -> bool {
        self.flags.contains(Flags::CONNTRACK)
    }

    pub fn second_chance(&self) -> bool {
        self.flags.contains(Flags::SECOND_CHANCE)
    }

    pub fn quic_lb(&self) -> bool {
        self.flags.contains(Flags::QUIC_LB)
    }

    /// The same spec with `flag` set or cleared.
    pub fn with(mut self, flag: Flags, on: bool) -> RouteSpec {
        self.flags.set(flag, on);
        self
    }

    /// The flags among `among` that differ from `old`, in the reload notes' words
    /// (`conntrack on -> off`), in bit order.
    pub fn flag_notes(&self, old: &RouteSpec, among: Flags) -> Vec<String> {
        let on_off = |b: bool| if b { "on" } else { "off" };
        Flags::NAMED
            .iter()
            .filter(|(f, _, _)| among.contains(*f) && old.flags.contains(*f) != self.flags.contains(*f))
            .map(|(f, name, _)| format!("{name} {} -> {}", on_off(old.flags.contains(*f)), on_off(self.flags.contains(*f))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_becomes_one_spec_and_its_flags_are_named_in_bit_order() {
        let pool = crate::config::parse_str(
            "t.yaml",
            "services:\n  - {name: w, vip: 10.0.0.1, port: 80, forward: gue, gue_port: 6080, second_chance: on, conntrack: off, backends: [10.0.1.1]}\n",
        )
        .expect("valid");
        let spec = RouteSpec::of(&pool.services[0]);
        assert_eq!((spec.hash, spec.forward, spec.gue_port), (HashMode::ClientIp, Forward::Gue, 6080));
        assert_eq!(spec.flags, Flags::SECOND_CHANCE);
        assert!(!spec.conntrack() && spec.second_chance() && !spec.quic_lb());
        let changed = spec.with(Flags::CONNTRACK, true).with(Flags::SECOND_CHANCE, false);
        assert_eq!(changed.flag_notes(&spec, Flags::all()), ["conntrack off -> on", "second_chance on -> off"]);
        assert_eq!(changed.flag_notes(&spec, Flags::SECOND_CHANCE), ["second_chance on -> off"]);
        let mut all = Flags::empty();
        for (i, (f, _, _)) in Flags::NAMED.iter().enumerate() {
            assert_eq!(f.bits(), 1 << i);
            all |= *f;
        }
        assert_eq!(all, Flags::all(), "every flag is named");
    }
}
