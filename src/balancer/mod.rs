//! The balancer: a loaded [`Dataplane`] and the controller's mirror of what its maps hold. It is
//! where the core meets the kernel: it builds each service's table ([`table`]), plans the change
//! from what the maps hold to a pool ([`plan`]), and hands the planned operations to the data
//! plane to execute. Taking over a pinned plane works the same way round: the data plane reads
//! its maps back, the balancer rebuilds its state from the reading.
//!
//! Everything the data plane does on its own (settings, the clock, counters, pinning, reuse
//! across upgrades, test runs) is reached through [`Deref`] to [`Dataplane`]: a balancer *is*
//! the data plane plus the mirror, so wrapping each of those calls would add names, not meaning.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::ops::{Deref, DerefMut};
use std::time::Instant;

use anyhow::Result;

use crate::config::{BackendState, Pool};
use crate::dataplane::{self, counters, live, Dataplane, PinnedMaps, Reuse, Sizes, DEFAULT_CONNTRACK_SIZE};
use crate::plan;
use crate::stats::{BackendCounters, BackendStatus, PlaneStatus, ServiceCounters, ServiceStatus, Snapshot, Traffic};
use crate::table;

mod sweep;

/// A data plane and what the controller knows of it.
pub struct Balancer {
    dp: Dataplane,
    /// What the planner may allocate in the data plane's maps.
    limits: plan::Limits,
    /// A mirror of what the maps hold, and the allocators: what the next change starts from.
    state: plan::State,
    /// Reuses ring tokens from one change to the next.
    builder: table::Builder,
    /// Which slots are marked unstable (crates/core/src/stable.rs).
    marks: sweep::Marks,
}

/// What one [`Balancer::apply`] did.
#[derive(Debug, Clone)]
pub struct Applied {
    /// Services added, removed or changed, with the table entries written for each.
    pub touched: Vec<plan::Touched>,
    /// Table entries written in all.
    pub slots_written: u64,
    /// Map writes in all.
    pub writes: usize,
    /// QUIC-LB server IDs or forgotten entries that could not be written once the tables were
    /// live (crates/dataplane/src/quic.rs); the next change tries again.
    pub quic_incomplete: Option<String>,
}

// The kernel-only calls (settings, clock, counters, pinning, test runs) go straight to the data
// plane; see the module's comment for why this is a Deref and not a wrapper per call.
impl Deref for Balancer {
    type Target = Dataplane;

    fn deref(&self) -> &Dataplane {
        &self.dp
    }
}

impl DerefMut for Balancer {
    fn deref_mut(&mut self) -> &mut Dataplane {
        &mut self.dp
    }
}

/// The planner's limits in maps of `sizes`: ids start at 1, so the highest id is one less than
/// the entries of its array.
fn limits_of(sizes: Sizes) -> plan::Limits {
    plan::Limits { capacity: sizes.table_capacity, max_backend_id: sizes.backends - 1, max_route_id: sizes.routes - 1 }
}

/// Where the data plane looks a service key up in its VIP index.
fn index_of(k: &plan::RouteKey) -> u32 {
    dataplane::vip_index_of(k.addr, k.port, k.proto)
}

impl Balancer {
    /// Opens and loads the program (the verifier runs here). Nothing is attached.
    pub fn load(table_capacity: u32) -> Result<Balancer> {
        Self::load_sized(table_capacity, DEFAULT_CONNTRACK_SIZE)
    }

    /// [`Balancer::load`], with the flow table sized to `conntrack_size` entries.
    pub fn load_sized(table_capacity: u32, conntrack_size: u32) -> Result<Balancer> {
        Ok(Self::load_with(table_capacity, conntrack_size, None)?.0)
    }

    /// Loads the program; with `reuse`, on the maps of a pinned data plane wherever their layout
    /// is this build's (see [`Reuse`]), so the new program shares its tables, flows and counters.
    /// Returns the names of the pinned maps that could not be reused (their layout changed).
    pub fn load_with(table_capacity: u32, conntrack_size: u32, reuse: Option<&Reuse>) -> Result<(Balancer, Vec<&'static str>)> {
        let (dp, fresh) = Dataplane::load_with(table_capacity, conntrack_size, reuse)?;
        let limits = limits_of(dp.sizes()?);
        Ok((Balancer { dp, limits, state: plan::State::default(), builder: Default::default(), marks: Default::default() }, fresh))
    }

    /// Installs `pool` on fresh maps: the interface's MAC, each backend's neighbour's MAC from
    /// `mac_of` (None: unknown; the neighbour is the backend itself unless [`Balancer::set_via`]
    /// said otherwise), then [`Balancer::apply`].
    pub fn install(&mut self, pool: &Pool, ifmac: [u8; 6], mac_of: &dyn Fn(IpAddr) -> Option<[u8; 6]>) -> Result<Applied> {
        self.dp.set_ifmac(ifmac)?;
        for b in pool.services.iter().flat_map(|s| &s.backends) {
            let n = self.dp.neighbour_of(b.address);
            if let Some(mac) = mac_of(n) {
                self.dp.remember_mac(n, Some(mac));
            }
        }
        self.apply(pool)
    }

    /// Changes the maps from what they hold to `pool`, writing only what differs, in an order
    /// in which no packet meets a half-applied change (see [`plan`]). If `pool` does not fit,
    /// nothing is written. The program stays attached throughout.
    pub fn apply(&mut self, pool: &Pool) -> Result<Applied> {
        let tables: Vec<table::Table> = pool
            .services
            .iter()
            .map(|s| {
                let t = self.builder.build_service(s);
                self.builder.with_hops(s, t, pool.previous_of(s))
            })
            .collect();
        self.builder.retain(&pool.services.iter().map(|s| s.name.as_str()).collect::<Vec<_>>());
        let mut attempt = 0;
        let plan = loop {
            match plan::plan(&self.state, pool, &tables, &self.limits, &index_of, Instant::now()) {
                Ok(p) => break p,
                // Ranges retired by the last change come back in a moment: wait for them.
                Err(plan::PlanError::CapacityAt { until }) if attempt == 0 => {
                    attempt += 1;
                    std::thread::sleep(until.saturating_duration_since(Instant::now()));
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.dp.quic_before(pool, &self.state.services)?;
        let mut applied = Applied {
            touched: plan.touched.clone(),
            slots_written: plan.slots_written(),
            writes: plan.ops.len(),
            quic_incomplete: None,
        };
        self.marks.before(&self.dp, &self.state.services, &plan.state.services)?;
        for (i, op) in plan.ops.iter().enumerate() {
            if let Err(e) = self.dp.execute(op) {
                // The maps hold part of this change, each part consistent. Remember that the
                // mirror cannot be trusted for anything this change touched, so that the next
                // change rewrites it all.
                let mut state = plan.state;
                state.taint(&plan.ops[..=i]);
                self.state = state;
                self.marks.note_written(&plan.ops[..=i]);
                self.marks.placed_now(&self.dp)?;
                return Err(e.context(format!("applying the new tables (write {} of {})", i + 1, plan.ops.len())));
            }
        }
        self.state = plan.state;
        self.marks.after(&self.dp, &self.state.services, &plan.ops)?;
        let failed = self.dp.quic_after(pool, &self.state.services);
        applied.quic_incomplete = (!failed.is_empty()).then(|| failed.join("; "));
        Ok(applied)
    }

    /// Rebuilds the state from the data plane's (adopted) maps, names it after `pool`, and
    /// retires ids that an interrupted change left claiming a backend twice. The next
    /// [`Balancer::apply`] then writes only what differs from what the maps hold.
    pub fn adopt(&mut self, pool: &Pool) -> Result<()> {
        let live = live::read_live(&self.dp)?;
        let dp = &self.dp;
        let (mut state, retire) = plan::State::rebuild(&live, pool, &self.limits, &index_of, &|i| dp.slot(i));
        // What the file no longer names goes by the names the maps kept (for the reload log),
        // unless another service has the name now.
        let taken: HashSet<String> = state.services.iter().map(|s| s.name.clone()).collect();
        for s in &mut state.services {
            if s.name.starts_with('(') {
                if let Some(name) = live::service_name(dp, &s.key)? {
                    if !taken.contains(&name) {
                        s.name = name;
                    }
                }
            }
            for b in s.backends.iter_mut().filter(|b| b.identity.starts_with('#')) {
                if let Some(name) = live::backend_name(dp, b.id)? {
                    b.identity = name;
                }
            }
        }
        // The hops the program reads now, so that the next apply writes only what differs.
        for s in state.services.iter_mut().filter(|s| s.spec.second_chance()) {
            s.hops = (0..s.slots).map(|i| dp.hops_at(s.base + i)).collect();
        }
        self.dp.recall(&live)?;
        self.marks.adopt(&self.dp, &state.services)?;
        self.state = state;
        for (id, address) in retire {
            self.dp.write_backend(id, address, false, false)?;
        }
        Ok(())
    }

    /// Sends frames for backend `addr` to `neighbour` (its next hop; itself when on the link).
    /// Rewrites the records of the backends at `addr` when that changes their MAC. Returns
    /// whether the neighbour changed.
    pub fn set_via(&mut self, addr: IpAddr, neighbour: IpAddr) -> Result<bool> {
        if !self.dp.remember_via(addr, neighbour) {
            return Ok(false);
        }
        for (id, alive) in self.ids_at(|a| a == addr) {
            self.dp.write_backend(id, addr, alive, true)?;
        }
        Ok(true)
    }

    /// Points every backend whose frames go to neighbour `addr` to `mac` (None: unknown, its
    /// packets are dropped as `no_mac`). Returns whether anything changed. One 8-byte value per
    /// backend id, so a packet sees the old MAC or the new one.
    pub fn set_mac(&mut self, addr: IpAddr, mac: Option<[u8; 6]>) -> Result<bool> {
        if !self.dp.remember_mac(addr, mac) {
            return Ok(false);
        }
        for (id, alive) in self.ids_at(|a| self.dp.neighbour_of(a) == addr) {
            let address = self.state.services.iter().flat_map(|s| &s.backends).find(|b| b.id == id).map(|b| b.address);
            if let Some(address) = address {
                self.dp.write_backend(id, address, alive, true)?;
            }
        }
        Ok(true)
    }

    /// The installed backend ids whose address satisfies `at`, with whether each is alive.
    fn ids_at(&self, at: impl Fn(IpAddr) -> bool) -> Vec<(u32, bool)> {
        self.state
            .services
            .iter()
            .flat_map(|s| &s.backends)
            .filter(|b| at(b.address))
            .map(|b| (b.id, b.state != BackendState::Down))
            .collect()
    }

    /// Marks stable every unstable slot that no tracked flow elsewhere can hash to any more
    /// (crates/core/src/stable.rs): from then on its established TCP flows go by the table without a
    /// flow-table lookup. The daemon calls it every second; it reads the flow tables whole
    /// (through their mappings) only while some slot is unstable. Returns how many slots it
    /// marked stable.
    pub fn sweep(&mut self) -> Result<usize> {
        self.marks.sweep(&self.dp, &self.state.services)
    }

    /// After this program replaced a pinned plane's older one (the pinned link now runs it):
    /// a plane from before stable slots gets its marks in the table words only now, since its
    /// program read the words as plain backend ids (see [`crate::dataplane::Dataplane::unmarked`]).
    pub fn switched(&mut self) -> Result<()> {
        self.marks.switched(&mut self.dp)
    }

    /// Marks every slot stable WITHOUT the sweep's check: tracked flows whose slot changed then
    /// follow the table. Only for the tests that show what the sweep's check protects.
    #[doc(hidden)]
    pub fn mark_all_stable_unchecked(&mut self) {
        self.marks.forget_all(&self.dp);
    }

    /// How many slots are marked unstable now.
    pub fn unstable_slots(&self) -> usize {
        self.marks.count()
    }

    /// Whether table entry `i` is marked unstable.
    pub fn is_unstable(&self, i: u32) -> bool {
        self.marks.is_unstable(i)
    }

    /// The installed services, as the maps hold them.
    pub fn installed(&self) -> &[plan::LiveService] {
        &self.state.services
    }

    /// Every counter of the data plane, summed over CPUs.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let mut snap = self.dp.counters()?;
        snap.services.reserve(self.state.services.len());
        for s in &self.state.services {
            let mut backends = Vec::with_capacity(s.backends.len());
            for b in &s.backends {
                backends.push(BackendCounters {
                    label: b.identity.clone(),
                    address: b.address,
                    weight: b.weight,
                    mac_known: self.dp.mac(self.dp.neighbour_of(b.address)).is_some(),
                    health: None,
                    load: None,
                    traffic: self.dp.traffic(b.id)?,
                });
            }
            // Backend ids are per service, so the service's traffic is its backends' sum.
            let traffic = backends.iter().fold(Traffic::default(), |t, b| Traffic {
                packets: t.packets + b.traffic.packets,
                bytes: t.bytes + b.traffic.bytes,
            });
            snap.forwarded += traffic.packets;
            snap.services.push(ServiceCounters { name: s.name.clone(), endpoint: s.endpoint.clone(), traffic, backends });
        }
        Ok(snap)
    }

    /// Packets forwarded to any backend so far (the sum of the per-backend counters).
    pub fn forwarded(&self) -> Result<u64> {
        let mut total = 0;
        for b in self.state.services.iter().flat_map(|s| &s.backends) {
            total += self.dp.traffic(b.id)?.packets;
        }
        Ok(total)
    }
}

/// `lb status`: a pinned data plane's services, backends and counters as its maps hold them.
/// The services are rebuilt from the maps the way [`Balancer::adopt`] rebuilds them, against an
/// empty pool, so each goes by the name its maps kept.
pub fn status(maps: &PinnedMaps) -> Result<PlaneStatus> {
    let live = live::read_live(maps)?;
    let sizes = live::sizes(maps)?;
    let slot_at = maps.slot_reader()?;
    let (mut state, _) = plan::State::rebuild(&live, &Pool::default(), &limits_of(sizes), &index_of, &slot_at);
    // The hops the program reads, for the digest: a rebuilt state leaves them unknown.
    let hop_at = maps.hop_reader()?;
    for s in state.services.iter_mut().filter(|s| s.spec.second_chance()) {
        s.hops = (0..s.slots).map(|i| hop_at(s.base + i)).collect();
    }
    let counters = counters::plane_counters(maps)?;
    let mut out = PlaneStatus {
        passed: counters.passed,
        icmp_forwarded: counters.icmp_forwarded,
        drops: counters.drops,
        conntrack: counters.conntrack,
        other_host: counters.other_host,
        fragments: counters.fragments,
        quic: counters.quic,
        quic_decoded: counters.quic_decoded,
        flows: counters::flow_entries(maps)?,
        flow_capacity: sizes.flows,
        ..Default::default()
    };
    let hash_of: HashMap<u32, u64> = live.backends.iter().map(|b| (b.0, b.3.identity)).collect();
    for s in &state.services {
        let name = live::service_name(maps, &s.key)?.unwrap_or_else(|| s.name.clone());
        let of = |o: &u32| hash_of.get(o).copied().unwrap_or(0);
        let digest = table::digest_of_hashes(s.owners.iter().map(of).chain(s.hops.iter().flat_map(|h| [of(&h[0]), of(&h[1])])));
        let mut svc = ServiceStatus {
            name,
            vip: s.key.addr,
            digest,
            endpoint: s.endpoint.clone(),
            hash: s.spec.hash.as_str(),
            forward: s.spec.forward.as_str(),
            conntrack: s.spec.conntrack(),
            slots: s.slots,
            traffic: Traffic::default(),
            backends: Vec::new(),
        };
        let mut owned: HashMap<u32, u32> = HashMap::new();
        for &o in &s.owners {
            *owned.entry(o).or_default() += 1;
        }
        for b in &s.backends {
            let identity = live::backend_name(maps, b.id)?.unwrap_or_else(|| b.identity.clone());
            let t = counters::backend_traffic(maps, b.id)?;
            svc.traffic.packets += t.packets;
            svc.traffic.bytes += t.bytes;
            svc.backends.push(BackendStatus {
                identity,
                address: b.address,
                weight: b.weight,
                state: b.state.as_str(),
                mac_known: live::recorded_mac(maps, b.id)?.is_some(),
                slots: owned.get(&b.id).copied().unwrap_or(0),
                traffic: t,
            });
        }
        out.forwarded += svc.traffic.packets;
        out.services.push(svc);
    }
    Ok(out)
}
