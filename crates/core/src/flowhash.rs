//! The data plane's flow hash, computed in user space too, so that tests and tools can predict
//! which slot (and so which backend) a packet reaches. It must agree bit for bit with the
//! hash in crates/dataplane/src/bpf/hash.h; the root packet tests check that it does on every path.
//!
//! The input is these bytes (addresses and ports in network byte order, exactly as they appear
//! in the packet):
//! - `client-ip`: the source address (4 bytes for IPv4, 16 for IPv6);
//! - `flow`: source address, destination address, source port (2), destination port (2),
//!   protocol number (1), then 3 zero bytes: 16 bytes for IPv4, 40 for IPv6.
//!
//! It is split into 8-byte little-endian lanes (a 4-byte input is one lane, zero-extended), and
//! with `K = 0x9E3779B97F4A7C15` (2^64 / golden ratio):
//! `h = SEED ^ (len * K)`; for each lane `x`: `h = (h ^ x) * K`; then MurmurHash3's 64-bit
//! finalizer (`fmix64`). The hash is the low 32 bits of `h`; the slot is `hash % slots`.
//!
//! Why not jhash or XXH64: in the XDP program their chains of dependent operations cost 20 and
//! 8 ns per packet more than this on the machine we measured, against a 2x-the-floor budget.
//! The finalizer gives full avalanche; the tests below check it and the balance of structured
//! inputs (one client's consecutive ports, consecutive client addresses).

use std::net::IpAddr;

use crate::config::HashMode;

/// The seed of every flow hash ("LB"). Changing it moves every flow.
pub const SEED: u64 = 0x4c42;

const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// The documented hash of `bytes` (any length; the data plane uses 4, 16 and 40).
pub fn hash_bytes(bytes: &[u8]) -> u32 {
    hash_bytes64(bytes) as u32
}

/// All 64 bits of the hash, before it is cut to 32. (The flow tables' tags are not made from it
/// but from a keyed hash of the same input: [`flow_tag`].)
pub fn hash_bytes64(bytes: &[u8]) -> u64 {
    let mut h = SEED ^ (bytes.len() as u64).wrapping_mul(K);
    for lane in bytes.chunks(8) {
        let mut b = [0u8; 8];
        b[..lane.len()].copy_from_slice(lane);
        h = (h ^ u64::from_le_bytes(b)).wrapping_mul(K);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

fn push_addr(out: &mut Vec<u8>, addr: IpAddr) {
    match addr {
        IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
        IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
    }
}

/// The bytes the hash of a packet covers (see the module documentation).
pub fn hash_input(mode: HashMode, src: IpAddr, dst: IpAddr, sport: u16, dport: u16, proto: u8) -> Vec<u8> {
    let mut b = Vec::with_capacity(40);
    push_addr(&mut b, src);
    if mode == HashMode::Flow {
        push_addr(&mut b, dst);
        b.extend_from_slice(&sport.to_be_bytes());
        b.extend_from_slice(&dport.to_be_bytes());
        b.extend_from_slice(&[proto, 0, 0, 0]);
    }
    b
}

/// The flow-table tag of a flow from `src:sport` to `dst:dport` under the data plane's secret
/// `key` (lb.h, struct lb_flow_key): SipHash-1-3 of the `flow` input's lanes, with bit 0 set
/// (crates/dataplane/src/bpf/hash.h says why a keyed function and not the flow hash); [`tag_bucket`] and
/// [`tag_bucket2`] are the two buckets, among `buckets` (a power of two), where it may live.
pub fn flow_tag(key: [u64; 2], src: IpAddr, dst: IpAddr, sport: u16, dport: u16, proto: u8) -> u64 {
    siphash::<1, 3>(key, &hash_input(HashMode::Flow, src, dst, sport, dport, proto)) | 1
}

/// SipHash-C-D (Aumasson and Bernstein) of `bytes` under `key`, as crates/dataplane/src/bpf/hash.h computes it for
/// C = 1, D = 3 (its inputs are whole lanes; a partial last lane is handled here as the
/// reference does, so that the tests can check this against SipHash-2-4 test vectors).
pub fn siphash<const C: usize, const D: usize>(key: [u64; 2], bytes: &[u8]) -> u64 {
    let mut v = [
        key[0] ^ 0x736f_6d65_7073_6575,
        key[1] ^ 0x646f_7261_6e64_6f6d,
        key[0] ^ 0x6c79_6765_6e65_7261,
        key[1] ^ 0x7465_6462_7974_6573,
    ];
    let round = |v: &mut [u64; 4]| {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    };
    let lane = |v: &mut [u64; 4], m: u64| {
        v[3] ^= m;
        for _ in 0..C {
            round(v);
        }
        v[0] ^= m;
    };
    let whole = bytes.len() / 8 * 8;
    for l in bytes[..whole].chunks(8) {
        lane(&mut v, u64::from_le_bytes([l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7]]));
    }
    let mut last = [0u8; 8];
    last[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
    last[7] = bytes.len() as u8;
    lane(&mut v, u64::from_le_bytes(last));
    v[2] ^= 0xff;
    for _ in 0..D {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

pub fn tag_bucket(tag: u64, buckets: u32) -> u32 {
    (tag >> 32) as u32 & (buckets - 1)
}

/// The flow's second bucket: where it goes when the first is full.
pub fn tag_bucket2(tag: u64, buckets: u32) -> u32 {
    (tag as u32 >> 8) & (buckets - 1)
}

/// The hash of a packet from `src:sport` to `dst:dport` with IP protocol `proto`.
pub fn flow_hash(mode: HashMode, src: IpAddr, dst: IpAddr, sport: u16, dport: u16, proto: u8) -> u32 {
    hash_bytes(&hash_input(mode, src, dst, sport, dport, proto))
}

// The integration tests' seeded generator, shared rather than copied: the same seed gives the
// same inputs here and there.
#[cfg(test)]
#[path = "../../../tests/common/rng.rs"]
mod test_rng;

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("literal")
    }

    #[test]
    fn client_ip_ignores_ports_and_destination_and_flow_does_not() {
        let (c, v) = (ip("10.0.0.1"), ip("10.99.0.100"));
        assert_eq!(flow_hash(HashMode::ClientIp, c, v, 1, 80, 6), flow_hash(HashMode::ClientIp, c, ip("10.0.0.9"), 2, 81, 17));
        assert_ne!(flow_hash(HashMode::Flow, c, v, 1, 80, 6), flow_hash(HashMode::Flow, c, v, 2, 80, 6));
        assert_ne!(flow_hash(HashMode::Flow, c, v, 1, 80, 6), flow_hash(HashMode::Flow, c, v, 1, 80, 17));
    }

    #[test]
    fn inputs_have_the_documented_layout() {
        let b = hash_input(HashMode::Flow, ip("10.0.0.1"), ip("10.99.0.100"), 0x1234, 80, 6);
        assert_eq!(b, [10, 0, 0, 1, 10, 99, 0, 100, 0x12, 0x34, 0, 80, 6, 0, 0, 0]);
        assert_eq!(hash_input(HashMode::Flow, ip("fd00::1"), ip("fd00::2"), 1, 2, 17).len(), 40);
        assert_eq!(hash_input(HashMode::ClientIp, ip("fd00::1"), ip("fd00::2"), 1, 2, 17).len(), 16);
    }

    #[test]
    fn pinned_values_catch_an_accidental_change_of_encoding_or_seed() {
        // If one of these changes, every deployed flow would move: change them only on purpose.
        let got = [
            flow_hash(HashMode::ClientIp, ip("192.0.2.7"), ip("10.99.0.100"), 0, 0, 0),
            flow_hash(HashMode::Flow, ip("192.0.2.7"), ip("10.99.0.100"), 40000, 80, 6),
            flow_hash(HashMode::ClientIp, ip("2001:db8::7"), ip("fd00::100"), 0, 0, 0),
            flow_hash(HashMode::Flow, ip("2001:db8::7"), ip("fd00::100"), 40001, 443, 6),
        ];
        assert_eq!(got, [0xbb05b28e, 0x376bb508, 0x3806141a, 0xc018f2f1]);
    }

    #[test]
    #[allow(deprecated)]
    fn siphash_2_4_is_the_reference_and_the_tag_depends_on_the_key() {
        use std::hash::Hasher;
        // std's SipHasher is SipHash-2-4: the same rounds, so SipHash-1-3 is right too.
        for len in [0usize, 7, 8, 15, 16, 40, 63] {
            let bytes: Vec<u8> = (0..len as u8).collect();
            let mut h = std::hash::SipHasher::new_with_keys(0x0706050403020100, 0x0f0e0d0c0b0a0908);
            h.write(&bytes);
            assert_eq!(siphash::<2, 4>([0x0706050403020100, 0x0f0e0d0c0b0a0908], &bytes), h.finish(), "len {len}");
        }
        // The paper's test vector: 15 bytes 00..0e under key 00..0f.
        let bytes: Vec<u8> = (0..15u8).collect();
        assert_eq!(siphash::<2, 4>([0x0706050403020100, 0x0f0e0d0c0b0a0908], &bytes), 0xa129ca6149be45e5);
        let (c, v) = (ip("192.0.2.7"), ip("10.99.0.100"));
        let a = flow_tag([1, 2], c, v, 40000, 80, 6);
        assert_eq!(a & 1, 1);
        assert_ne!(a, flow_tag([1, 3], c, v, 40000, 80, 6));
        assert_ne!(a, flow_tag([1, 2], c, v, 40000, 81, 6));
        assert_ne!(a, flow_tag([1, 2], c, v, 40000, 80, 17));
    }

    /// Reproducible random inputs, from the tests' one seeded generator.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut r = super::test_rng::Rng(seed);
        move || r.next()
    }

    #[test]
    fn every_input_bit_flips_every_output_bit_about_half_the_time() {
        let mut next = rng(1);
        for len in [4usize, 16, 40] {
            let samples = 2000;
            let mut flips = vec![vec![0u32; 32]; len * 8];
            for _ in 0..samples {
                let input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                let h = hash_bytes(&input);
                for bit in 0..len * 8 {
                    let mut changed = input.clone();
                    changed[bit / 8] ^= 1 << (bit % 8);
                    let d = h ^ hash_bytes(&changed);
                    for (o, count) in flips[bit].iter_mut().enumerate() {
                        *count += (d >> o) & 1;
                    }
                }
            }
            for (bit, outs) in flips.iter().enumerate() {
                for (o, &count) in outs.iter().enumerate() {
                    let p = count as f64 / samples as f64;
                    // 2000 samples: sd 0.011; 0.42..0.58 is over 7 sd.
                    assert!((0.42..0.58).contains(&p), "len {len}: input bit {bit} flips output bit {o} with p={p}");
                }
            }
        }
    }

    /// Chi-square of `n` structured keys over `m` buckets is within 6 sd of its expectation.
    fn assert_balanced(what: &str, m: u32, keys: impl Iterator<Item = u32>) {
        let mut counts = vec![0u64; m as usize];
        let mut n = 0u64;
        for h in keys {
            counts[(h % m) as usize] += 1;
            n += 1;
        }
        let e = n as f64 / m as f64;
        let chi2: f64 = counts.iter().map(|&c| (c as f64 - e).powi(2) / e).sum();
        let df = (m - 1) as f64;
        assert!((chi2 - df).abs() < 6.0 * (2.0 * df).sqrt(), "{what}: chi2 {chi2:.0} for {df} degrees of freedom");
    }

    #[test]
    fn structured_inputs_spread_evenly() {
        let vip = ip("10.99.0.100");
        // One client, every source port: 65535 flows over 251 buckets.
        assert_balanced("one client's ports", 251, (1..=65535u16).map(|p| flow_hash(HashMode::Flow, ip("192.0.2.7"), vip, p, 80, 6)));
        // Consecutive client addresses, one port each.
        assert_balanced(
            "consecutive IPv4 clients",
            251,
            (0..65536u32).map(|i| flow_hash(HashMode::ClientIp, IpAddr::V4((0x0a00_0000 + i).into()), vip, 0, 0, 0)),
        );
        assert_balanced(
            "consecutive IPv6 clients",
            251,
            (0..65536u128).map(|i| flow_hash(HashMode::ClientIp, IpAddr::V6((0x2001_0db8_u128 << 96 | i).into()), vip, 0, 0, 0)),
        );
        // Many clients behind one port range, as a NAT shows them.
        assert_balanced(
            "NATed clients",
            65537,
            (0..16u32).flat_map(|c| (1024..17408u16).map(move |p| (c, p))).map(|(c, p)| {
                flow_hash(HashMode::Flow, IpAddr::V4((0xc000_0200 + c).into()), vip, p, 443, 6)
            }),
        );
    }
}
