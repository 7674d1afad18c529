//! The data plane's counters: the plane-wide ones of enum lb_stat (drops by reason, connection
//! tracking), each backend's traffic, and the flow table's occupancy, summed over CPUs, read
//! from this process's maps, a pinned plane's, or handles opened for another thread.

use std::net::IpAddr;

use anyhow::Result;
use libbpf_rs::{MapCore, MapFlags};

use lb_core::counters::{self, Group};
use lb_core::health::signals::Signals;
use lb_core::stats::{BackendCounters, ServiceCounters, Snapshot, Traffic};

use super::encode::value_of;
use super::{types, Dataplane, MapSource};

/// The counter maps of a running data plane, opened again for another thread (the metrics
/// server reads them at scrape time without touching the serve loop's state).
#[derive(Debug)]
pub struct CounterMaps {
    stats: libbpf_rs::MapHandle,
    traffic: libbpf_rs::MapHandle,
    flows: libbpf_rs::MapHandle,
    signals: libbpf_rs::MapHandle,
}

impl Dataplane {
    pub fn counter_maps(&self) -> Result<CounterMaps> {
        let m = &self.skel.maps;
        Ok(CounterMaps {
            stats: libbpf_rs::MapHandle::try_from(&m.stats)?,
            traffic: libbpf_rs::MapHandle::try_from(&m.backend_traffic)?,
            flows: libbpf_rs::MapHandle::try_from(&m.flows)?,
            signals: libbpf_rs::MapHandle::try_from(&m.backend_signals)?,
        })
    }

    /// A counter of enum lb_stat, summed over CPUs.
    pub fn stat(&self, stat: types::lb_stat) -> Result<u64> {
        percpu_sum(&self.skel.maps.stats, stat.0)
    }

    /// The plane-wide counters, in a snapshot with no services yet (and so nothing forwarded).
    pub fn counters(&self) -> Result<Snapshot> {
        counters_of(&self.skel.maps.stats)
    }

    /// Backend `id`'s traffic, summed over CPUs.
    pub fn traffic(&self, id: u32) -> Result<Traffic> {
        traffic_of(&self.skel.maps.backend_traffic, id)
    }

    /// Backend `id`'s signals from real traffic (bpf/conntrack_map.h, backend_signals), summed
    /// over CPUs.
    pub fn signals(&self, id: u32) -> Result<Signals> {
        signals_of(&self.skel.maps.backend_signals, id)
    }

    /// The number of established flows in the flow table (walks it).
    pub fn flow_count(&self) -> Result<u64> {
        count_flows(&self.skel.maps.flows)
    }

    /// The established flows: (slot, tag, backend id), for tests and tools.
    pub fn flow_slots(&self) -> Result<Vec<(u32, u64, u32)>> {
        let mut out = Vec::new();
        for (k, v) in self.skel.maps.flows.lookup_batch(8192, MapFlags::ANY, MapFlags::ANY)? {
            let f = value_of::<types::lb_flow>(&v);
            if f.tag & 1 != 0 {
                out.push((value_of::<u32>(&k), f.tag, f.backend as u32));
            }
        }
        Ok(out)
    }

    /// Writes slot `slot` of the flow table whole, for tests that set up what another CPU would
    /// be doing (a slot claimed and being written: tag LB_FLOW_BUSY).
    pub fn write_flow_slot(&self, slot: u32, f: &types::lb_flow) -> Result<()> {
        self.skel.maps.flows.update(&slot.to_ne_bytes(), super::encode::bytes_of(f), MapFlags::ANY)?;
        Ok(())
    }

    /// Every slot of the flow table (or of the half-open table) that holds a flow, whole: for
    /// tests that look at an entry's state bits.
    pub fn flow_table(&self, pending: bool) -> Result<Vec<(u32, types::lb_flow)>> {
        let m = if pending { &self.skel.maps.flow_pending } else { &self.skel.maps.flows };
        let mut out = Vec::new();
        for (k, v) in m.lookup_batch(8192, MapFlags::ANY, MapFlags::ANY)? {
            let f = value_of::<types::lb_flow>(&v);
            if f.tag & 1 != 0 {
                out.push((value_of::<u32>(&k), f));
            }
        }
        Ok(out)
    }
}

impl CounterMaps {
    /// Backend `id`'s signals from real traffic, summed over CPUs.
    pub fn signals(&self, id: u32) -> Result<Signals> {
        signals_of(&self.signals, id)
    }

    /// Every counter, for the services and backends of `model` (by backend id).
    pub fn snapshot(&self, model: &lb_core::metrics::Model) -> Result<Snapshot> {
        let mut snap = counters_of(&self.stats)?;
        snap.services.reserve(model.services.len());
        for s in &model.services {
            let mut backends = Vec::with_capacity(s.backends.len());
            let mut total = Traffic::default();
            for b in &s.backends {
                let t = traffic_of(&self.traffic, b.id)?;
                total.packets += t.packets;
                total.bytes += t.bytes;
                backends.push(BackendCounters {
                    label: b.identity.clone(),
                    address: b.address.parse().unwrap_or(IpAddr::from([0, 0, 0, 0])),
                    weight: b.weight,
                    mac_known: b.mac_known,
                    health: None,
                    load: None,
                    traffic: t,
                });
            }
            snap.forwarded += total.packets;
            snap.services.push(ServiceCounters { name: s.name.clone(), endpoint: format!("{}:{}/{}", s.vip, s.port, s.protocol), traffic: total, backends });
        }
        Ok(snap)
    }

    /// Entries in the flow table, counted by walking it in batches.
    pub fn flow_entries(&self) -> Result<u64> {
        count_flows(&self.flows)
    }
}

/// The plane-wide counters of `src` (see [`Dataplane::counters`]).
pub fn plane_counters(src: &dyn MapSource) -> Result<Snapshot> {
    counters_of(src.map("stats")?)
}

/// Backend `id`'s traffic in `src`, summed over CPUs.
pub fn backend_traffic(src: &dyn MapSource, id: u32) -> Result<Traffic> {
    traffic_of(src.map("backend_traffic")?, id)
}

/// The established flows in the flow table of `src` (walks it).
pub fn flow_entries(src: &dyn MapSource) -> Result<u64> {
    count_flows(src.map("flows")?)
}

/// The counters of the stats map: passed, ICMP forwarded, drops and connection tracking, with
/// no services and nothing forwarded yet. Which entry is which is lb_core::counters' table.
fn counters_of(stats: &dyn MapCore) -> Result<Snapshot> {
    let of = |g: Group| Vec::with_capacity(counters::of(g).count());
    let mut snap = Snapshot {
        forwarded: 0,
        passed: 0,
        drops: of(Group::Drop),
        conntrack: of(Group::Conntrack),
        icmp_forwarded: 0,
        other_host: 0,
        fragments: of(Group::Fragment),
        quic: of(Group::Quic),
        quic_decoded: 0,
        services: Vec::new(),
    };
    for c in &counters::COUNTERS {
        let n = percpu_sum(stats, c.index)?;
        match c.group {
            Group::Passed => snap.passed = n,
            Group::IcmpForwarded => snap.icmp_forwarded = n,
            Group::OtherHost => snap.other_host = n,
            Group::Drop => snap.drops.push((c.name, n)),
            Group::Conntrack => snap.conntrack.push((c.name, n)),
            Group::Fragment => snap.fragments.push((c.name, n)),
            Group::Quic => snap.quic.push((c.name, n)),
            Group::QuicDecoded => snap.quic_decoded = n,
        }
    }
    Ok(snap)
}

/// Slots of a flow table (lb.h, struct lb_flow) that hold a flow: an odd tag (0 is free,
/// LB_FLOW_BUSY a slot being written).
fn count_flows(m: &dyn MapCore) -> Result<u64> {
    let mut n = 0;
    for (_, v) in m.lookup_batch(8192, MapFlags::ANY, MapFlags::ANY)? {
        let tag = v.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_ne_bytes);
        n += tag & 1;
    }
    Ok(n)
}

fn percpu_sum(m: &dyn MapCore, key: u32) -> Result<u64> {
    let per_cpu = m.lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
    Ok(per_cpu.iter().map(|v| value_of::<u64>(v)).sum())
}

/// One entry of a per-CPU map of `V` (a struct of lb.h), folded over the CPUs into an `A`.
fn percpu_fold<V: Copy + Default, A: Default>(map: &dyn MapCore, id: u32, add: impl Fn(&mut A, V)) -> Result<A> {
    let per_cpu = map.lookup_percpu(&id.to_ne_bytes(), MapFlags::ANY)?.unwrap_or_default();
    let mut sum = A::default();
    for v in per_cpu {
        add(&mut sum, value_of(&v));
    }
    Ok(sum)
}

/// One lb_signals entry of a per-CPU map, summed over CPUs.
fn signals_of(map: &dyn MapCore, id: u32) -> Result<Signals> {
    percpu_fold(map, id, |s: &mut Signals, cpu: types::lb_signals| {
        s.syns += cpu.syns;
        s.syn_again += cpu.syn_again;
        s.reset_early += cpu.reset_early;
        s.no_data += cpu.no_data;
        s.handshakes += cpu.handshakes;
    })
}

/// One lb_traffic entry of a per-CPU map, summed over CPUs.
fn traffic_of(map: &dyn MapCore, id: u32) -> Result<Traffic> {
    percpu_fold(map, id, |t: &mut Traffic, cpu: types::lb_traffic| {
        t.packets += cpu.packets;
        t.bytes += cpu.bytes;
    })
}

#[cfg(test)]
mod tests {
    use lb_core::counters::COUNTERS;

    /// The counter table names every member of the compiled program's `enum lb_stat`, at its
    /// value, and nothing else: a counter added to lb.h without a row (or a row left behind, or
    /// a member moved) fails here rather than exporting a silent 0.
    #[test]
    fn the_counter_table_is_the_programs_enum() {
        let members = crate::btf::enum_members("lb_stat").expect("the program's BTF");
        let counted: Vec<(String, u32)> = members.into_iter().filter(|(n, _)| n != "LB_STAT_MAX").collect();
        let table: Vec<(String, u32)> = COUNTERS.iter().map(|c| (c.member.to_string(), c.index)).collect();
        assert_eq!(table, counted);
    }
}
