//! QUIC-LB's maps (crates/dataplane/src/bpf/quic.h): each `quic_lb:` service's parameters (quic_configs), its
//! AES context (quic_aes, made in the kernel from the key by the syscall program quic_set_key),
//! and which backend id has each server ID (quic_servers). Keyed by service key, not route id,
//! so they are brought to the pool around each change's plan rather than inside it: parameters
//! and keys before the table writes (a route never carries LB_SVC_QUIC_LB without them, and a
//! key the kernel refuses refuses the change before it is written), server IDs after them (a new
//! backend's id exists only then), and stale server IDs forgotten before any id is given out.

use std::collections::{HashMap, HashSet};

use anyhow::{bail, Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use lb_core::config::Pool;
use lb_core::plan::{self, LiveService};

use super::encode::{bytes_of, service_key_of, value_of};
use super::{types, Dataplane};

impl Dataplane {
    /// Before a change's table writes: forgets server IDs whose backend id is no longer its
    /// service's in `installed` (what the maps hold now; left by a controller that stopped, or a
    /// change that could not finish), so that no id is given to another backend while an ID
    /// still leads to it; then writes the parameters and keys of `pool`'s services. A key the
    /// kernel cannot make an AES context of fails the change here, before anything of it is
    /// written.
    pub fn quic_before(&mut self, pool: &Pool, installed: &[LiveService]) -> Result<()> {
        let ids: HashSet<(Vec<u8>, u32)> = installed
            .iter()
            .flat_map(|s| {
                let sk = bytes_of(&service_key_of(&s.key)).to_vec();
                s.backends.iter().map(move |b| (sk.clone(), b.id))
            })
            .collect();
        let maps = &self.skel.maps;
        for k in maps.quic_servers.keys().collect::<Vec<_>>() {
            let key = value_of::<types::lb_quic_server>(&k);
            let id = maps.quic_servers.lookup(&k, MapFlags::ANY)?.map_or(0, |v| value_of::<u32>(&v));
            if !ids.contains(&(bytes_of(&key.service).to_vec(), id)) {
                maps.quic_servers.delete(&k).context("forgetting a stale QUIC-LB server ID")?;
            }
        }
        let written = self.written_quic_configs()?;
        for (rk, mut v, key) in wanted(pool) {
            let k = bytes_of(&service_key_of(&rk)).to_vec();
            let rekey = key.filter(|key| self.quic_keys.get(&rk) != Some(key));
            // A configuration decodes IDs as before while its key and lengths stay: it keeps its
            // generation, and the IDs decoded under it (quic_cids). Otherwise it takes a new one
            // (given before the key is made, so that nothing can fail between the two but the
            // configuration's write).
            let old = written.get(&k);
            v.gen = match old {
                Some(o) if rekey.is_none() && (o.sid_len, o.nonce_len, o.encrypted, o.rotation) == (v.sid_len, v.nonce_len, v.encrypted, v.rotation) => o.gen,
                _ => self.next_quic_gen()?,
            };
            let previous = self.quic_keys.get(&rk).copied();
            if let Some(key) = &rekey {
                self.set_quic_key(&rk, key)?;
            }
            if old.map(bytes_of) != Some(bytes_of(&v)) {
                if let Err(e) = self.skel.maps.quic_configs.update(&k, bytes_of(&v), MapFlags::ANY) {
                    if rekey.is_some() {
                        self.undo_quic_key(&rk, &k, previous, old.copied());
                    }
                    return Err(e).context("writing a QUIC-LB configuration");
                }
            }
        }
        Ok(())
    }

    /// After a change's table writes: which backend id has each server ID (the ids `services`,
    /// the state just applied, gives the pool's backends), and forgetting what the pool no
    /// longer names. Each write is tried whatever the others do; what failed is returned (the
    /// tables are live by now: the caller reports it, and the next change tries again).
    pub fn quic_after(&mut self, pool: &Pool, services: &[LiveService]) -> Vec<String> {
        let mut failed = Vec::new();
        let mut note = |what: &str, r: Result<()>| {
            if let Err(e) = r {
                failed.push(format!("{what}: {e:#}"));
            }
        };
        let wanted = wanted(pool);
        let configs: HashMap<Vec<u8>, types::lb_quic_config> = wanted.iter().map(|(rk, c, _)| (bytes_of(&service_key_of(rk)).to_vec(), *c)).collect();
        let keys: HashMap<plan::RouteKey, [u8; 16]> = wanted.iter().filter_map(|(rk, _, key)| Some((*rk, (*key)?))).collect();
        let mut servers: HashMap<Vec<u8>, u32> = HashMap::new();
        for s in pool.services.iter().filter(|s| s.quic_lb.is_some()) {
            let rk = plan::service_key(s);
            let Some(live) = services.iter().find(|l| l.key == rk) else { continue };
            let ids: HashMap<&str, u32> = live.backends.iter().map(|b| (b.identity.as_str(), b.id)).collect();
            for b in &s.backends {
                let (Some(sid), Some(&id)) = (&b.server_id, ids.get(b.identity().as_str())) else { continue };
                let mut key = types::lb_quic_server { service: service_key_of(&rk), ..Default::default() };
                key.sid[..sid.len()].copy_from_slice(sid);
                servers.insert(bytes_of(&key).to_vec(), id);
            }
        }
        let maps = &self.skel.maps;
        // Forgotten first, so that a change of every server ID never needs room for both.
        for k in maps.quic_servers.keys().collect::<Vec<_>>() {
            if !servers.contains_key(&k) {
                note("forgetting a server ID", maps.quic_servers.delete(&k).map_err(Into::into));
            }
        }
        for (k, id) in &servers {
            let same = matches!(maps.quic_servers.lookup(k, MapFlags::ANY), Ok(Some(v)) if v[..] == id.to_ne_bytes());
            if !same {
                note("writing a server ID", maps.quic_servers.update(k, &id.to_ne_bytes(), MapFlags::ANY).map_err(Into::into));
            }
        }
        let encrypted: HashSet<Vec<u8>> = keys.keys().map(|rk| bytes_of(&service_key_of(rk)).to_vec()).collect();
        for k in maps.quic_aes.keys().collect::<Vec<_>>() {
            if !encrypted.contains(&k) {
                note("forgetting an AES context", maps.quic_aes.delete(&k).map_err(Into::into));
            }
        }
        self.quic_keys.retain(|rk, _| keys.contains_key(rk));
        let maps = &self.skel.maps;
        for k in maps.quic_configs.keys().collect::<Vec<_>>() {
            if !configs.contains_key(&k) {
                note("forgetting a configuration", maps.quic_configs.delete(&k).map_err(Into::into));
            }
        }
        failed
    }

    /// The generation to count on from for this plane's QUIC-LB configurations: past every one
    /// its maps hold, and past them by a random step (up to 2^24), so that a controller that adopts a plane
    /// does not give out again, by chance, what the one before gave to a configuration since
    /// deleted (whose IDs the old program, attached until the switch, may still hold decoded).
    pub(super) fn first_quic_gen(&self) -> Result<u32> {
        let top = self.written_quic_configs()?.values().map(|c| c.gen).max().unwrap_or(0);
        let mut step = [0u8; 4];
        super::random_bytes(&mut step).context("getrandom for the QUIC-LB generations")?;
        Ok(top.saturating_add(u32::from_ne_bytes(step) >> 8))
    }

    /// What quic_configs holds now, by service key.
    fn written_quic_configs(&self) -> Result<HashMap<Vec<u8>, types::lb_quic_config>> {
        let map = &self.skel.maps.quic_configs;
        let mut out = HashMap::new();
        for k in map.keys() {
            if let Some(v) = map.lookup(&k, MapFlags::ANY)? {
                out.insert(k, value_of(&v));
            }
        }
        Ok(out)
    }

    /// After a configuration's write failed behind its new key: the kernel has decoded IDs with
    /// the new key under the old configuration's generation, and may have kept them. The old key
    /// goes back (or, failing that, the next change makes the key again), and the old
    /// configuration is written again under a new generation, so that nothing kept meanwhile is
    /// found; failing that too, the configuration goes (its packets go by the table, counted,
    /// until a change writes it), rather than leave those IDs to be found.
    fn undo_quic_key(&mut self, rk: &plan::RouteKey, k: &[u8], previous: Option<[u8; 16]>, old: Option<types::lb_quic_config>) {
        if previous.is_none_or(|p| self.set_quic_key(rk, &p).is_err()) {
            self.quic_keys.remove(rk);
        }
        let Some(mut o) = old else { return };
        let again = self.next_quic_gen().and_then(|g| {
            o.gen = g;
            Ok(self.skel.maps.quic_configs.update(k, bytes_of(&o), MapFlags::ANY)?)
        });
        if again.is_err() {
            let _ = self.skel.maps.quic_configs.delete(k);
        }
    }

    /// A generation no configuration of this plane has had since it was loaded.
    fn next_quic_gen(&mut self) -> Result<u32> {
        self.quic_gen = self.quic_gen.checked_add(1).context("QUIC-LB configuration generations ran out (detach the data plane, lb detach, and attach again)")?;
        Ok(self.quic_gen)
    }

    /// Makes the kernel's AES-128 context of the service at `rk` from `key`, through the syscall
    /// program quic_set_key, and keeps it in quic_aes (replacing the one there).
    fn set_quic_key(&mut self, rk: &plan::RouteKey, key: &[u8; 16]) -> Result<()> {
        let mut arg = types::lb_quic_key_arg { service: service_key_of(rk), key: *key };
        // SAFETY: lb_quic_key_arg is plain old data (the skeleton's copy of lb.h's struct); the
        // slice covers exactly its bytes and lives as long as `arg`.
        let ctx = unsafe {
            std::slice::from_raw_parts_mut(&mut arg as *mut _ as *mut u8, std::mem::size_of::<types::lb_quic_key_arg>())
        };
        let input = libbpf_rs::ProgramInput { context_in: Some(ctx), ..Default::default() };
        let out = self.skel.progs.quic_set_key.test_run(input).context("running quic_set_key (BPF_PROG_TEST_RUN)")?;
        let rc = out.return_value as i32;
        if rc != 0 {
            let err = std::io::Error::from_raw_os_error(-rc);
            if rc == -95 {
                bail!("this kernel has no BPF crypto (bpf_crypto_ctx_create; Linux 6.10 or later): encrypted QUIC-LB IDs cannot be decoded here ({err})");
            }
            bail!("making the kernel's AES-128 context for a QUIC-LB key: {err}");
        }
        self.quic_keys.insert(*rk, *key);
        Ok(())
    }

    /// The QUIC-LB server IDs the data plane holds, with the backend id of each, by service key
    /// (for the tests).
    pub fn quic_servers(&self) -> Result<Vec<(plan::RouteKey, Vec<u8>, u32)>> {
        let maps = &self.skel.maps;
        let mut out = Vec::new();
        for k in maps.quic_servers.keys() {
            let key = value_of::<types::lb_quic_server>(&k);
            let Some(rk) = super::encode::key_of(&key.service) else { continue };
            let len = value_of::<types::lb_quic_config>(&maps.quic_configs.lookup(bytes_of(&key.service), MapFlags::ANY)?.unwrap_or_default()).sid_len;
            let Some(id) = maps.quic_servers.lookup(&k, MapFlags::ANY)? else { continue };
            out.push((rk, key.sid[..len as usize].to_vec(), u32::from_ne_bytes(id[..4].try_into()?)));
        }
        out.sort();
        Ok(out)
    }
}

/// Each quic_lb service of `pool`: its key, its parameters (generation 0: quic_before gives
/// it) and its AES key if it has one.
fn wanted(pool: &Pool) -> Vec<(plan::RouteKey, types::lb_quic_config, Option<[u8; 16]>)> {
    let mut out = Vec::new();
    for s in &pool.services {
        let Some(q) = &s.quic_lb else { continue };
        let rk = plan::service_key(s);
        let mut mask = [0u8; 16];
        mask[..q.server_id_len as usize].fill(0xff);
        let mut cid_mask = [0u8; 20];
        cid_mask[..1 + q.server_id_len as usize + q.nonce_len as usize].fill(0xff);
        let words = |m: &[u8]| -> Vec<u32> { m.chunks(4).map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect() };
        let (sid_mask, cid_mask) = (words(&mask), words(&cid_mask));
        let config = types::lb_quic_config {
            rotation: q.rotation,
            sid_len: q.server_id_len,
            nonce_len: q.nonce_len,
            encrypted: q.key.is_some() as u8,
            sid_mask: std::array::from_fn(|i| sid_mask[i]),
            cid_mask: std::array::from_fn(|i| cid_mask[i]),
            // Set by quic_before, which knows what the map holds.
            gen: 0,
        };
        out.push((rk, config, q.key));
    }
    out
}
