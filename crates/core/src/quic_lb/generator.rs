//! A quinn connection-ID generator that issues QUIC-LB IDs (draft -21, §5.4 and §9.6), so that
//! a balancer in front of a quinn server routes every packet of a connection to it by server
//! ID, whatever the client's address and port.
//!
//! quinn asks an endpoint's generator once for every ID it issues (the server's first source
//! ID, each NEW_CONNECTION_ID, Retry and close packets), and parses every short header with one
//! fixed ID length: so every ID issued here, the unroutable ones included, has the
//! configuration's length.

use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use rand::Rng;

use super::codec::{decode_server_id, encode, Config, ConfigError, UNROUTABLE};
use super::server::ServerParams;

/// A [`ConnectionIdGenerator`] for one quinn endpoint whose IDs carry its server ID under one
/// QUIC-LB configuration. With a key, the nonce is a counter that starts at a random value and
/// goes up by one per ID (big-endian in the nonce's octets); once it would come back to where it
/// began, every nonce has been used under this key and the generator issues unroutable IDs
/// (config rotation 0b111, then random octets) instead, as the draft requires. Without a key the
/// nonce is fresh random octets each time, so that no ID can be linked to an earlier one (quinn
/// asks again on the rare collision with an ID it holds). Two endpoints sharing a server ID and a
/// key would draw their counters from the same space: give each endpoint its own server ID.
pub struct RoutableIds {
    config: Config,
    server_id: Vec<u8>,
    nonces: Nonces,
    /// Whether an unroutable ID was issued, which `validate` then accepts.
    issued_unroutable: bool,
}

enum Nonces {
    /// Unencrypted: random octets every time.
    Random,
    /// Encrypted: the next nonce and the one the counter started at.
    Counter { next: Vec<u8>, start: Vec<u8>, exhausted: bool },
}

impl RoutableIds {
    /// A generator for `params`, with a counter at a random start when they have a key; the
    /// codec's error when the draft forbids their lengths or rotation.
    pub fn new(params: &ServerParams) -> Result<RoutableIds, ConfigError> {
        Ok(RoutableIds::from_config(params.config()?, params))
    }

    fn from_config(config: Config, params: &ServerParams) -> RoutableIds {
        let nonces = if params.key.is_some() {
            let start = random(config.nonce_len);
            Nonces::Counter { next: start.clone(), start, exhausted: false }
        } else {
            Nonces::Random
        };
        RoutableIds { config, server_id: params.server_id.clone(), nonces, issued_unroutable: false }
    }

    /// What `quinn::EndpointConfig::cid_generator` takes: a maker of a fresh generator (each
    /// with its own random counter start) for `params`, whose configuration is checked here, once.
    pub fn factory(params: ServerParams) -> Result<impl Fn() -> Box<dyn ConnectionIdGenerator> + Send + Sync + 'static, ConfigError> {
        let config = params.config()?;
        Ok(move || Box::new(RoutableIds::from_config(config.clone(), &params)) as Box<dyn ConnectionIdGenerator>)
    }

    /// The next nonce, or None when the counter has used them all.
    fn next_nonce(&mut self) -> Option<Vec<u8>> {
        match &mut self.nonces {
            Nonces::Random => Some(random(self.config.nonce_len)),
            Nonces::Counter { exhausted: true, .. } => None,
            Nonces::Counter { next, start, exhausted } => {
                let nonce = next.clone();
                increment(next);
                *exhausted = next == start;
                Some(nonce)
            }
        }
    }

    /// An ID no balancer routes by server ID (§3.2): rotation 0b111 and the length in the first
    /// octet, random octets after it.
    fn unroutable(&mut self) -> ConnectionId {
        let len = self.config.cid_len();
        let mut cid = random(len);
        cid[0] = UNROUTABLE << 5 | (len as u8 - 1);
        self.issued_unroutable = true;
        ConnectionId::new(&cid)
    }
}

impl ConnectionIdGenerator for RoutableIds {
    fn generate_cid(&mut self) -> ConnectionId {
        match self.next_nonce() {
            Some(nonce) => ConnectionId::new(&encode(&self.config, &self.server_id, &nonce)),
            None => self.unroutable(),
        }
    }

    /// Accepts the IDs this generator may have issued: its length, the length in the first
    /// octet, and either its rotation and server ID or (once it has issued one) rotation 0b111.
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        let len = self.config.cid_len();
        let first = *cid.first().ok_or(InvalidCid)?;
        if cid.len() != len || usize::from(first & 0x1f) != len - 1 {
            return Err(InvalidCid);
        }
        if first >> 5 == UNROUTABLE {
            return if self.issued_unroutable { Ok(()) } else { Err(InvalidCid) };
        }
        match decode_server_id(&self.config, cid) {
            Some(sid) if sid == self.server_id => Ok(()),
            _ => Err(InvalidCid),
        }
    }

    fn cid_len(&self) -> usize {
        self.config.cid_len()
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}


fn random(len: usize) -> Vec<u8> {
    let mut octets = vec![0u8; len];
    rand::rng().fill_bytes(&mut octets);
    octets
}

/// Adds one to a big-endian number, wrapping to zero past its largest value.
fn increment(number: &mut [u8]) {
    for octet in number.iter_mut().rev() {
        let (sum, carry) = octet.overflowing_add(1);
        *octet = sum;
        if !carry {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// A generator whose counter began at `start` and is now at `next`: the IDs from `next` up
    /// to `start` (wrapping) are all it has left, which lets a test reach exhaustion quickly.
    fn counting(params: &ServerParams, start: Vec<u8>, next: Vec<u8>) -> RoutableIds {
        let mut ids = RoutableIds::new(params).expect("a valid config");
        ids.nonces = Nonces::Counter { next, start, exhausted: false };
        ids
    }

    const KEY: [u8; 16] = [
        0x8f, 0x95, 0xf0, 0x92, 0x45, 0x76, 0x5f, 0x80, 0x25, 0x69, 0x34, 0xe5, 0x0c, 0x66, 0x20, 0x7f,
    ];

    fn params(sid: &[u8], nonce_len: usize, key: Option<[u8; 16]>) -> ServerParams {
        ServerParams { rotation: 2, server_id: sid.to_vec(), nonce_len, key }
    }

    #[test]
    fn every_id_carries_our_server_id() {
        for (sid, nonce_len) in [(&[0x0a, 0x1b][..], 6), (&[0xed, 0x79, 0x3a][..], 4), (&[7; 8][..], 8), (&[1; 15][..], 4)] {
            for key in [None, Some(KEY)] {
                let p = params(sid, nonce_len, key);
                let config = p.config().expect("valid");
                let mut ids = RoutableIds::new(&p).expect("valid");
                assert_eq!(ids.cid_len(), 1 + sid.len() + nonce_len);
                assert_eq!(ids.cid_lifetime(), None);
                for _ in 0..100 {
                    let cid = ids.generate_cid();
                    assert_eq!(cid.len(), ids.cid_len());
                    assert_eq!(cid[0], 2 << 5 | (ids.cid_len() as u8 - 1), "{cid}");
                    assert_eq!(decode_server_id(&config, &cid).as_deref(), Some(sid), "{cid}");
                    assert!(ids.validate(&cid).is_ok(), "{cid}");
                }
            }
        }
    }

    #[test]
    fn a_thousand_ids_are_distinct() {
        for key in [None, Some(KEY)] {
            let mut ids = RoutableIds::new(&params(&[0x0a, 0x1b], 4, key)).expect("valid");
            let seen: HashSet<Vec<u8>> = (0..1000).map(|_| ids.generate_cid().to_vec()).collect();
            assert_eq!(seen.len(), 1000, "key {}", key.is_some());
        }
    }

    #[test]
    fn the_counter_counts_and_carries() {
        let mut n = vec![0x00, 0xfe, 0xff];
        increment(&mut n);
        assert_eq!(n, [0x00, 0xff, 0x00]);
        let mut n = vec![0x00, 0xff, 0xff];
        increment(&mut n);
        assert_eq!(n, [0x01, 0x00, 0x00]);
        let mut n = vec![0xff; 4];
        increment(&mut n);
        assert_eq!(n, [0; 4]);
    }

    #[test]
    fn used_up_nonces_give_unroutable_ids() {
        let p = params(&[0x0a, 0x1b], 4, Some(KEY));
        let config = p.config().expect("valid");
        // Three nonces left: fffffffd, fffffffe, ffffffff; then the counter is back at zero.
        let mut ids = counting(&p, vec![0; 4], vec![0xff, 0xff, 0xff, 0xfd]);
        let unroutable_before = ConnectionId::new(&[UNROUTABLE << 5 | 6, 1, 2, 3, 4, 5, 6]);
        assert!(ids.validate(&unroutable_before).is_err(), "no unroutable ID issued yet");
        let routable: Vec<ConnectionId> = (0..3).map(|_| ids.generate_cid()).collect();
        for cid in &routable {
            assert_eq!(decode_server_id(&config, cid), Some(vec![0x0a, 0x1b]), "{cid}");
        }
        let expected = encode(&config, &[0x0a, 0x1b], &[0xff, 0xff, 0xff, 0xfd]);
        assert_eq!(routable[0].to_vec(), expected, "the counter's value is the nonce");
        let mut seen = HashSet::new();
        for _ in 0..50 {
            let cid = ids.generate_cid();
            assert_eq!(cid.len(), 7, "the same length as routable IDs");
            assert_eq!(cid[0], 0b111 << 5 | 6, "{cid}");
            assert_eq!(decode_server_id(&config, &cid), None);
            assert!(ids.validate(&cid).is_ok(), "{cid}");
            seen.insert(cid.to_vec());
        }
        assert!(seen.len() > 45, "random after the first octet");
        assert!(ids.validate(&unroutable_before).is_ok(), "0b111 accepted once issued");
        assert!(ids.validate(&routable[1]).is_ok());
    }

    #[test]
    fn validate_refuses_other_servers_and_configs() {
        for key in [None, Some(KEY)] {
            let mut ours = RoutableIds::new(&params(&[0x0a, 0x1b], 6, key)).expect("valid");
            let cid = ours.generate_cid();
            assert!(ours.validate(&cid).is_ok());
            let mut other_server = RoutableIds::new(&params(&[0x0a, 0x1c], 6, key)).expect("valid");
            let mut other_rotation = RoutableIds::new(&ServerParams { rotation: 3, ..params(&[0x0a, 0x1b], 6, key) }).expect("valid");
            let mut other_length = RoutableIds::new(&params(&[0x0a, 0x1b], 7, key)).expect("valid");
            for _ in 0..20 {
                assert!(ours.validate(&other_server.generate_cid()).is_err());
                assert!(ours.validate(&other_rotation.generate_cid()).is_err());
                assert!(ours.validate(&other_length.generate_cid()).is_err());
            }
            let mut wrong_length_octet = cid.to_vec();
            wrong_length_octet[0] ^= 1;
            assert!(ours.validate(&ConnectionId::new(&wrong_length_octet)).is_err());
            assert!(ours.validate(&ConnectionId::new(&[])).is_err());
            assert!(ours.validate(&ConnectionId::new(&cid[..8])).is_err());
        }
        // Another key: the same server ID and rotation, yet the ID decodes to something else.
        let mut other_key = RoutableIds::new(&params(&[0x0a, 0x1b], 6, Some([9; 16]))).expect("valid");
        let ours = RoutableIds::new(&params(&[0x0a, 0x1b], 6, Some(KEY))).expect("valid");
        let refused = (0..50).filter(|_| ours.validate(&other_key.generate_cid()).is_err()).count();
        assert!(refused >= 49, "{refused} of 50");
    }

    #[test]
    fn the_factory_makes_generators_with_their_own_counters() {
        assert_eq!(RoutableIds::factory(params(&[0x0a], 3, None)).err(), Some(ConfigError::NonceLength(3)));
        let make = RoutableIds::factory(params(&[0x0a, 0x1b], 6, Some(KEY))).expect("valid");
        let (mut a, mut b) = (make(), make());
        assert_eq!(a.cid_len(), 9);
        let (x, y) = (a.generate_cid(), b.generate_cid());
        assert_ne!(x, y, "random counter starts");
        assert!(a.validate(&y).is_ok(), "the same server's IDs");
    }
}
