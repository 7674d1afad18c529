//! The connection ID of QUIC-LB (draft -21, §3 and §5): a first octet whose top three bits name
//! the configuration ("config rotation", 0b111 reserved for unroutable IDs) and whose low five
//! bits here encode the ID's length less one, then the server ID and a nonce: in the clear, or
//! encrypted with AES-128 in one pass when they are 16 octets together and in four passes of a
//! Feistel network otherwise.

use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use aes::Aes128;

/// The config rotation bits of IDs issued without a configuration: never routable.
pub const UNROUTABLE: u8 = 0b111;

/// One QUIC-LB configuration, as a balancer and its servers share it.
#[derive(Clone)]
pub struct Config {
    /// 0..=6.
    pub rotation: u8,
    pub server_id_len: usize,
    pub nonce_len: usize,
    cipher: Option<Aes128>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The config rotation bits are 0b111, or do not fit three bits.
    Rotation(u8),
    ServerIdLength(usize),
    NonceLength(usize),
    /// Server ID and nonce longer than 19 octets together (a QUIC v1 ID is at most 20).
    TooLong(usize),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            ConfigError::Rotation(r) => write!(f, "config rotation {r} is not one of 0 to 6 (7, 0b111, marks unroutable IDs)"),
            ConfigError::ServerIdLength(n) => write!(f, "a server ID of {n} octets: at least 1"),
            ConfigError::NonceLength(n) => write!(f, "a nonce of {n} octets: at least 4"),
            ConfigError::TooLong(n) => write!(f, "server ID and nonce are {n} octets together: at most 19 (a connection ID is at most 20)"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    pub fn new(rotation: u8, server_id_len: usize, nonce_len: usize, key: Option<[u8; 16]>) -> Result<Config, ConfigError> {
        if rotation >= UNROUTABLE {
            return Err(ConfigError::Rotation(rotation));
        }
        if server_id_len < 1 {
            return Err(ConfigError::ServerIdLength(server_id_len));
        }
        if nonce_len < 4 {
            return Err(ConfigError::NonceLength(nonce_len));
        }
        if server_id_len + nonce_len > 19 {
            return Err(ConfigError::TooLong(server_id_len + nonce_len));
        }
        let cipher = key.map(|k| Aes128::new(GenericArray::from_slice(&k)));
        Ok(Config { rotation, server_id_len, nonce_len, cipher })
    }

    /// Octets after the first: server ID and nonce.
    pub fn plaintext_len(&self) -> usize {
        self.server_id_len + self.nonce_len
    }

    /// The whole connection ID's length.
    pub fn cid_len(&self) -> usize {
        1 + self.plaintext_len()
    }
}

/// The connection ID of `server_id` and `nonce` under `config` (their lengths must be the
/// config's), its first octet encoding its length.
pub fn encode(config: &Config, server_id: &[u8], nonce: &[u8]) -> Vec<u8> {
    debug_assert_eq!((server_id.len(), nonce.len()), (config.server_id_len, config.nonce_len));
    let mut plain: Vec<u8> = server_id.iter().chain(nonce).copied().collect();
    let len = plain.len();
    match &config.cipher {
        None => {}
        Some(aes) if len == 16 => {
            let block = GenericArray::from_mut_slice(&mut plain);
            aes.encrypt_block(block);
        }
        Some(aes) => {
            let mut f = Feistel::split(&plain);
            f.right_pass(aes, 1);
            f.left_pass(aes, 2);
            f.right_pass(aes, 3);
            f.left_pass(aes, 4);
            plain = f.join();
        }
    }
    let mut cid = Vec::with_capacity(1 + len);
    cid.push(config.rotation << 5 | (len as u8 & 0x1f));
    cid.extend_from_slice(&plain);
    cid
}

/// The server ID a connection ID carries under `config`; None when it is not that config's or
/// too short. (A balancer first picks the config by the ID's top three bits.)
pub fn decode_server_id(config: &Config, cid: &[u8]) -> Option<Vec<u8>> {
    let len = config.plaintext_len();
    if cid.first()? >> 5 != config.rotation || cid.len() < 1 + len {
        return None;
    }
    let body = &cid[1..1 + len];
    let sid = config.server_id_len;
    match &config.cipher {
        None => Some(body[..sid].to_vec()),
        Some(aes) if len == 16 => {
            let mut block = GenericArray::clone_from_slice(body);
            aes.decrypt_block(&mut block);
            Some(block[..sid].to_vec())
        }
        Some(aes) => {
            let mut f = Feistel::split(body);
            f.left_pass(aes, 4);
            f.right_pass(aes, 3);
            f.left_pass(aes, 2);
            if sid <= config.nonce_len {
                // The server ID lies wholly in the left half: three passes suffice.
                return Some(f.left[..sid].to_vec());
            }
            f.right_pass(aes, 1);
            Some(f.join()[..sid].to_vec())
        }
    }
}

/// The two halves of the four-pass construction (§5.4.2): for an odd length the middle octet's
/// high nibble is the left half's and its low nibble the right half's.
struct Feistel {
    left: Vec<u8>,
    right: Vec<u8>,
    len: usize,
}

impl Feistel {
    fn half(&self) -> usize {
        self.len.div_ceil(2)
    }

    fn odd(&self) -> bool {
        self.len % 2 == 1
    }

    fn split(plain: &[u8]) -> Feistel {
        let len = plain.len();
        let half = len.div_ceil(2);
        let mut f = Feistel { left: plain[..half].to_vec(), right: plain[len / 2..len / 2 + half].to_vec(), len };
        f.mask();
        f
    }

    fn mask(&mut self) {
        if self.odd() {
            let h = self.half();
            self.left[h - 1] &= 0xf0;
            self.right[0] &= 0x0f;
        }
    }

    /// AES of `half` expanded to a block: the half, zeros, the plaintext length, the pass.
    fn round(&self, aes: &Aes128, pass: u8, half: &[u8]) -> Vec<u8> {
        let mut block = GenericArray::clone_from_slice(&[0u8; 16]);
        block[..half.len()].copy_from_slice(half);
        block[14] = self.len as u8;
        block[15] = pass;
        aes.encrypt_block(&mut block);
        block[..self.half()].to_vec()
    }

    fn right_pass(&mut self, aes: &Aes128, pass: u8) {
        let mix = self.round(aes, pass, &self.left);
        self.right.iter_mut().zip(mix).for_each(|(r, m)| *r ^= m);
        self.mask();
    }

    fn left_pass(&mut self, aes: &Aes128, pass: u8) {
        let mix = self.round(aes, pass, &self.right);
        self.left.iter_mut().zip(mix).for_each(|(l, m)| *l ^= m);
        self.mask();
    }

    fn join(&self) -> Vec<u8> {
        let h = self.half();
        if !self.odd() {
            return [&self.left[..], &self.right[..]].concat();
        }
        let mut out = self.left[..h - 1].to_vec();
        out.push(self.left[h - 1] | self.right[0]);
        out.extend_from_slice(&self.right[1..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        crate::quic_lb::parse_hex(s).expect("hex")
    }

    fn key(s: &str) -> Option<[u8; 16]> {
        hex(s).try_into().ok()
    }

    #[test]
    fn the_drafts_vectors_encode_and_decode() {
        for &(rotation, sid, nonce, k, cid) in crate::quic_lb::DRAFT_VECTORS {
            let (sid, nonce) = (hex(sid), hex(nonce));
            let config = Config::new(rotation, sid.len(), nonce.len(), k.and_then(key)).expect("a valid config");
            assert_eq!(encode(&config, &sid, &nonce), hex(cid), "{cid}");
            assert_eq!(decode_server_id(&config, &hex(cid)), Some(sid), "{cid}");
        }
    }

    #[test]
    fn every_length_round_trips() {
        let k = key("8f95f09245765f80256934e50c66207f");
        for sid_len in 1..=15 {
            for nonce_len in 4..=(19 - sid_len) {
                for k in [None, k] {
                    let config = Config::new(3, sid_len, nonce_len, k).expect("valid");
                    let sid: Vec<u8> = (0..sid_len as u8).map(|i| i.wrapping_mul(37).wrapping_add(11)).collect();
                    let nonce: Vec<u8> = (0..nonce_len as u8).map(|i| i.wrapping_mul(91).wrapping_add(5)).collect();
                    let cid = encode(&config, &sid, &nonce);
                    assert_eq!(cid.len(), config.cid_len());
                    assert_eq!(cid[0] >> 5, 3);
                    assert_eq!(decode_server_id(&config, &cid), Some(sid), "{sid_len}+{nonce_len}");
                    let mut longer = cid.clone();
                    longer.extend_from_slice(&[0xaa, 0xbb]);
                    assert!(decode_server_id(&config, &longer).is_some(), "appended octets are ignored");
                    assert_eq!(decode_server_id(&config, &cid[..cid.len() - 1]), None, "too short");
                }
            }
        }
    }

    #[test]
    fn forbidden_configs_are_refused() {
        assert_eq!(Config::new(7, 3, 4, None).err(), Some(ConfigError::Rotation(7)));
        assert_eq!(Config::new(0, 0, 4, None).err(), Some(ConfigError::ServerIdLength(0)));
        assert_eq!(Config::new(0, 3, 3, None).err(), Some(ConfigError::NonceLength(3)));
        assert_eq!(Config::new(0, 2, 18, None).err(), Some(ConfigError::TooLong(20)));
        assert!(Config::new(0, 1, 18, None).is_ok(), "nonces up to 18 octets");
        let c = Config::new(1, 3, 4, None).expect("valid");
        assert_eq!(decode_server_id(&c, &hex("07c4605e4504cc4f")), None, "another config's rotation bits");
        assert_eq!(decode_server_id(&c, &hex("e7c4605e4504cc4f")), None, "0b111: unroutable");
    }
}
