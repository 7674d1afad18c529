//! What `lb attach` holds while it serves: the data plane and the kernel handles, the pool as
//! configured, and each room's own state. The few moves that cross rooms are here: installing
//! the pool with health applied (health, data plane, metrics) and the periodic refresh of
//! routes and neighbours. Rooms never import this module; it imports them.

use anyhow::Result;

use lb::config::Pool;
use lb::fleet::NodeView;
use lb::dataplane::link::{self, mac_text, Interface};
use lb::dataplane::netlink;
use lb::plan::Touched;

use super::agents::Agents;
use super::announce::Announcer;
use super::describe::describe_touched;
use super::describe::label_of;
use super::encap::Encap;
use super::fleet::Fleet;
use super::health::HealthChecks;
use super::metrics_http::Publisher;
use super::neighbours::Neighbours;
use crate::log::log;
use lb::balancer::Balancer;
use crate::settings::Settings;

pub(super) struct Daemon<'a> {
    pub(super) settings: &'a Settings,
    pub(super) ifc: Interface,
    pub(super) dp: Balancer,
    /// For queries (routes, neighbours) and address changes.
    pub(super) nl: netlink::Socket,
    /// The pool as the file says; what is installed is this with health applied.
    pub(super) configured: Pool,
    pub(super) neighbours: Neighbours,
    pub(super) encap: Encap,
    pub(super) health: HealthChecks,
    pub(super) agents: Agents,
    pub(super) announcer: Option<Announcer>,
    pub(super) metrics: Publisher,
    /// With --config etcd://...: the fleet's store and its shared decisions.
    pub(super) fleet: Option<Fleet>,
}

/// What asks for the pool with health and load applied to be installed: a reload's answer is
/// its caller's to give; a health or load change that fails is logged and the tables stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Install {
    Reload,
    Health,
    Load,
}

impl std::fmt::Display for Install {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Install::Reload => "reload",
            Install::Health => "health",
            Install::Load => "load",
        })
    }
}

impl Daemon<'_> {
    /// Installs the configured pool with health and load applied; returns what that changed.
    /// A failure to apply a health or load change is logged and leaves the tables being served
    /// (None); any other failure (a reload's) is the caller's.
    pub(super) fn install_effective(&mut self, why: Install) -> Result<Option<Vec<Touched>>> {
        // In a fleet that answers, the fleet's decisions; alone, this node's own.
        let shared = self.fleet.as_ref().filter(|f| !f.alone());
        let pool = self.health.effective(&self.configured, shared.map(|f| f.down()));
        if let Some(f) = shared {
            self.agents.share(&self.configured, &f.views());
        }
        let pool = self.agents.apply(&self.configured, &pool);
        if why == Install::Load && !self.agents.changed() {
            // An interval decided nothing new: the tables stand; the reports may have moved.
            self.publish();
            return Ok(Some(Vec::new()));
        }
        let applying = std::time::Instant::now();
        let automatic = why != Install::Reload;
        match self.dp.apply(&pool) {
            Ok(applied) => {
                self.publish();
                self.refresh_digests();
                if let Some(q) = &applied.quic_incomplete {
                    log(format!("{why}: the tables are applied, but QUIC-LB's maps are not all written ({q}); the next change tries again"));
                }
                if automatic && (why == Install::Health || !applied.touched.is_empty()) {
                    log(format!("{why}: applied in {:.1} ms: {}", applying.elapsed().as_secs_f64() * 1e3, describe_touched(&applied.touched)));
                }
                Ok(Some(applied.touched))
            }
            Err(e) if automatic => {
                log(format!("{why}: could not apply ({e:#}); the current tables keep serving"));
                self.agents.not_installed();
                Ok(None)
            }
            Err(e) => {
                self.agents.not_installed();
                Err(e)
            }
        }
    }

    /// Publishes what is configured and served to the metrics thread.
    pub(super) fn publish(&self) {
        self.metrics.publish(&self.dp, &self.configured, self.health.map(), &|k| self.health.signals_of(k), self.agents.adjustments());
    }

    /// Takes the probe results that arrived, and installs the pool again if a backend changed
    /// (in a fleet, tells the fleet, whose decision comes back through the store).
    pub(super) fn on_probe_results(&mut self) -> Result<()> {
        let metrics = &self.metrics;
        let shared = self.fleet.as_ref().is_some_and(|f| !f.alone());
        if self.health.results(&self.configured, shared, |(service, backend), record| metrics.probe(service, backend, record)) {
            if shared {
                self.health.take_recovered();
                self.publish_view();
                return Ok(());
            }
            for key in self.health.take_recovered() {
                self.agents.recovered(&self.configured, &key);
            }
            self.install_effective(Install::Health)?;
        }
        Ok(())
    }

    /// The fleet's health decision at store revision `revision` (or, alone, this node's own),
    /// installed when it changed.
    pub(super) fn decide(&mut self, revision: u64) -> Result<()> {
        let own = self.health.down_set(&self.configured);
        let Some(f) = self.fleet.as_mut() else { return Ok(()) };
        let Some((left, back)) = f.decide(revision, own) else { return Ok(()) };
        let alone = f.alone();
        for (k, went) in left.iter().map(|k| (k, true)).chain(back.iter().map(|k| (k, false))) {
            let (n, of) = f.count_down(k);
            let who = if alone { "this node's own checks, alone".to_string() } else { format!("{n} of {of} live nodes see it down") };
            let label = label_of(&self.configured, &k.0, &k.1);
            let what = if went { "is down" } else { "is up again" };
            let then = if went { "its slots go to the others" } else { "its slots come back" };
            log(format!("fleet: at revision {revision}, {} backend {label} {what} ({who}); {then}", k.0));
        }
        for k in &back {
            self.agents.recovered(&self.configured, k);
        }
        self.install_effective(Install::Health)?;
        Ok(())
    }

    /// In a fleet: each installed service's table digest, for the node's view (computed once an
    /// install, not every time the view is looked at).
    pub(super) fn refresh_digests(&mut self) {
        let digests = self.dp.installed().iter().map(|s| (s.name.clone(), format!("{:016x}", s.digest()))).collect();
        if let Some(f) = self.fleet.as_mut() {
            f.digests = digests;
        }
    }

    /// This node's view, handed to the store's thread when it changed; and the store's state
    /// to the metrics and to `lb status`.
    pub(super) fn publish_view(&mut self) {
        let own = self.health.down_set(&self.configured);
        let agents = self.agents.seen(&self.configured);
        let Some(f) = self.fleet.as_mut() else { return };
        let mut down: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (svc, b) in own {
            down.entry(svc).or_default().push(b);
        }
        let view = NodeView {
            node: f.node.clone(),
            interface: self.ifc.name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            pool_revision: f.pool_revision,
            revision: f.decided.max(f.pool_revision),
            applied_ms: f.applied_ms,
            services: f.digests.clone(),
            down,
            agents,
            refused: f.refused.clone(),
            alone: f.alone(),
        };
        self.metrics.store(f.connected(), view.revision, f.pool_revision);
        f.write_status(&self.ifc.name, &view);
        f.publish(view);
    }

    /// Takes the load agents' answers, and installs the pool again once an interval's weights
    /// are decided.
    pub(super) fn on_agent_answers(&mut self) -> Result<()> {
        let metrics = &self.metrics;
        self.agents.answers(&self.configured, |service, backend, outcome, _| metrics.agent(service, backend, outcome.as_str()));
        if self.agents.due(&self.configured) {
            self.install_effective(Install::Load)?;
        }
        Ok(())
    }

    /// Takes the neighbour changes the kernel sent.
    pub(super) fn on_neighbour_events(&mut self) -> Result<()> {
        self.neighbours.on_events(&mut self.dp, &self.ifc, &mut self.nl)
    }

    /// Follows the interface's MAC. The program balances only frames sent to the MAC it was
    /// told, and sends from it: after `ip link set DEV address`, a bond's fail_over_mac or any
    /// other change, every frame would count as `other_host` and reach the host, so a change
    /// is written to the data plane at once, and logged.
    pub(super) fn follow_mac(&mut self) -> Result<()> {
        let Some(mac) = link::current_mac(self.ifc.ifindex) else { return Ok(()) };
        if mac != self.ifc.mac {
            self.dp.set_ifmac(mac)?;
            log(format!("{}'s MAC changed from {} to {}: lb now balances frames sent to the new one", self.ifc.name, mac_text(&self.ifc.mac), mac_text(&mac)));
            self.ifc.mac = mac;
        }
        Ok(())
    }

    /// Follows the interface's MTU and the routes to encapsulated backends, re-reads the
    /// neighbour table, and publishes the result.
    pub(super) fn refresh(&mut self) -> Result<()> {
        self.encap.refresh_mtu(&mut self.dp, &self.ifc)?;
        self.neighbours.follow_routes(&mut self.dp, &self.ifc, &mut self.nl, &self.configured)?;
        self.neighbours.refresh(&mut self.dp, &self.ifc, &mut self.nl)?;
        self.publish();
        Ok(())
    }
}
