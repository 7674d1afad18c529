//! QUIC-LB's maps (src/bpf/quic.h): each `quic_lb:` service's parameters (quic_configs), its
//! AES context (quic_aes, made in the kernel from the key by the syscall program quic_set_key),
//! and which backend id has each server ID (quic_servers). Keyed by service key, not route id,
//! so they are brought to the pool after each change's plan rather than inside it: a route that
//! carries LB_SVC_QUIC_LB before its service's entries are in sends its QUIC packets by the
//! table (counted as a fallback) for that moment, and a removed backend's server ID is forgotten
//! before its id can be given to another backend (ids are quarantined).

use std::collections::{HashMap, HashSet};

use anyhow::{bail, Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use crate::config::Pool;
use crate::plan::{self, LiveService};

use super::encode::{bytes_of, service_key_of, value_of};
use super::{types, Dataplane};

impl Dataplane {
    /// Brings the QUIC-LB maps to what `pool` says, for the backend ids `services` (the state
    /// just applied) gives its backends.
    pub(crate) fn sync_quic(&mut self, pool: &Pool, services: &[LiveService]) -> Result<()> {
        let mut configs: HashMap<Vec<u8>, types::lb_quic_config> = HashMap::new();
        let mut keys: HashMap<plan::RouteKey, [u8; 16]> = HashMap::new();
        let mut servers: HashMap<Vec<u8>, u32> = HashMap::new();
        for s in &pool.services {
            let Some(q) = &s.quic_lb else { continue };
            let rk = plan::RouteKey { addr: s.vip, port: s.port, proto: s.protocol };
            let sk = service_key_of(&rk);
            let mut mask = [0u8; 16];
            mask[..q.server_id_len as usize].fill(0xff);
            let config = types::lb_quic_config {
                rotation: q.rotation,
                sid_len: q.server_id_len,
                nonce_len: q.nonce_len,
                encrypted: q.key.is_some() as u8,
                sid_mask: std::array::from_fn(|i| u32::from_ne_bytes([mask[4 * i], mask[4 * i + 1], mask[4 * i + 2], mask[4 * i + 3]])),
            };
            configs.insert(bytes_of(&sk).to_vec(), config);
            if let Some(k) = q.key {
                keys.insert(rk, k);
            }
            let Some(live) = services.iter().find(|l| l.key == rk) else { continue };
            let ids: HashMap<&str, u32> = live.backends.iter().map(|b| (b.identity.as_str(), b.id)).collect();
            for b in &s.backends {
                let (Some(sid), Some(&id)) = (&b.server_id, ids.get(b.identity().as_str())) else { continue };
                let mut key = types::lb_quic_server { service: sk, ..Default::default() };
                key.sid[..sid.len()].copy_from_slice(sid);
                servers.insert(bytes_of(&key).to_vec(), id);
            }
        }
        let maps = &self.skel.maps;
        // Parameters and keys first, then server IDs; what the pool no longer names last.
        for (k, v) in &configs {
            if maps.quic_configs.lookup(k, MapFlags::ANY)?.as_deref() != Some(bytes_of(v)) {
                maps.quic_configs.update(k, bytes_of(v), MapFlags::ANY).context("writing a QUIC-LB configuration")?;
            }
        }
        for (rk, key) in &keys {
            if self.quic_keys.get(rk) != Some(key) {
                self.set_quic_key(rk, Some(key))?;
            }
        }
        let maps = &self.skel.maps;
        for (k, id) in &servers {
            if maps.quic_servers.lookup(k, MapFlags::ANY)?.as_deref() != Some(&id.to_ne_bytes()[..]) {
                maps.quic_servers.update(k, &id.to_ne_bytes(), MapFlags::ANY).context("writing a QUIC-LB server ID")?;
            }
        }
        for k in maps.quic_servers.keys().collect::<Vec<_>>() {
            if !servers.contains_key(&k) {
                let _ = maps.quic_servers.delete(&k);
            }
        }
        let encrypted: HashSet<Vec<u8>> = keys.keys().map(|rk| bytes_of(&service_key_of(rk)).to_vec()).collect();
        for k in maps.quic_aes.keys().collect::<Vec<_>>() {
            if !encrypted.contains(&k) {
                let _ = maps.quic_aes.delete(&k);
            }
        }
        self.quic_keys.retain(|rk, _| keys.contains_key(rk));
        for k in maps.quic_configs.keys().collect::<Vec<_>>() {
            if !configs.contains_key(&k) {
                let _ = maps.quic_configs.delete(&k);
            }
        }
        Ok(())
    }

    /// Makes (or, with None, forgets) the kernel's AES-128 context of the service at `rk` from
    /// `key`, through the syscall program quic_set_key.
    fn set_quic_key(&mut self, rk: &plan::RouteKey, key: Option<&[u8; 16]>) -> Result<()> {
        let mut arg = types::lb_quic_key_arg {
            service: service_key_of(rk),
            key: key.copied().unwrap_or_default(),
            remove: key.is_none() as u32,
        };
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
        match key {
            Some(k) => self.quic_keys.insert(*rk, *k),
            None => self.quic_keys.remove(rk),
        };
        Ok(())
    }

    /// The QUIC-LB server IDs the data plane holds, with the backend id of each, by service key
    /// (for the tests and `lb status`).
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
