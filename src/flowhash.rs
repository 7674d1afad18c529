//! The data plane's flow hash, computed in user space too, so that tests and tools can predict
//! which slot (and so which backend) a packet reaches. It must agree bit for bit with
//! `flow_hash()` in src/bpf/lb.bpf.c; the root packet tests check that it does.
//!
//! The hash is jhash2 (Bob Jenkins' lookup3 over 32-bit words, as in the Linux kernel) with
//! initial value `0x4c42` over these words, each address word being the big-endian reading of
//! 4 address bytes:
//! - `client-ip`: the source address (1 word for IPv4, 4 for IPv6);
//! - `flow`: source address, destination address, `(sport << 16) | dport`, protocol number.
//!
//! The slot is `hash % slots`.

use std::net::IpAddr;

use crate::config::HashMode;

pub const SEED: u32 = 0x4c42;

fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

fn finish(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

/// jhash2 over `words` with the data plane's initial value.
pub fn jhash_words(words: &[u32]) -> u32 {
    let init = 0xdeadbeefu32.wrapping_add((words.len() as u32) << 2).wrapping_add(SEED);
    let (mut a, mut b, mut c) = (init, init, init);
    let mut k = words;
    while k.len() > 3 {
        a = a.wrapping_add(k[0]);
        b = b.wrapping_add(k[1]);
        c = c.wrapping_add(k[2]);
        mix(&mut a, &mut b, &mut c);
        k = &k[3..];
    }
    if k.is_empty() {
        return c;
    }
    if k.len() == 3 {
        c = c.wrapping_add(k[2]);
    }
    if k.len() >= 2 {
        b = b.wrapping_add(k[1]);
    }
    a = a.wrapping_add(k[0]);
    finish(&mut a, &mut b, &mut c);
    c
}

fn words(addr: IpAddr) -> Vec<u32> {
    match addr {
        IpAddr::V4(a) => vec![u32::from_be_bytes(a.octets())],
        IpAddr::V6(a) => a.octets().chunks(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]])).collect(),
    }
}

/// The hash of a packet from `src:sport` to `dst:dport` with IP protocol `proto`.
pub fn flow_hash(mode: HashMode, src: IpAddr, dst: IpAddr, sport: u16, dport: u16, proto: u8) -> u32 {
    match mode {
        HashMode::ClientIp => jhash_words(&words(src)),
        HashMode::Flow => {
            let mut w = words(src);
            w.extend(words(dst));
            w.push(((sport as u32) << 16) | dport as u32);
            w.push(proto as u32);
            jhash_words(&w)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ip_ignores_ports_and_flow_does_not() {
        let (c, v) = ("10.0.0.1".parse().unwrap(), "10.99.0.100".parse().unwrap());
        assert_eq!(flow_hash(HashMode::ClientIp, c, v, 1, 80, 6), flow_hash(HashMode::ClientIp, c, v, 2, 80, 6));
        assert_ne!(flow_hash(HashMode::Flow, c, v, 1, 80, 6), flow_hash(HashMode::Flow, c, v, 2, 80, 6));
    }

    #[test]
    fn lengths_take_their_own_tail_paths() {
        // 1, 4 and 10 words are the lengths the data plane uses; each must differ from its
        // neighbours so that no word is ignored.
        for n in [1usize, 4, 10] {
            let w: Vec<u32> = (1..=n as u32).collect();
            let mut changed = w.clone();
            changed[n - 1] ^= 1;
            assert_ne!(jhash_words(&w), jhash_words(&changed), "n={n}");
        }
    }
}
