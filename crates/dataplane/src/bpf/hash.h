/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
#ifndef LB_HASH_H
#define LB_HASH_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lb.h"

/* ---- hashing: the flow hash, documented in docs/data-plane.md ("Flow hash") and crates/core/src/flowhash.rs ----
 * The input is split into 8-byte little-endian lanes (a 4-byte input is one lane, zero-extended).
 * h = LB_HASH_SEED ^ (len * K); for each lane x: h = (h ^ x) * K; then MurmurHash3's 64-bit
 * finalizer (fmix64); the hash is the low 32 bits. K is 2^64 / golden ratio. One multiply per
 * lane plus two: on the 16 bytes of an IPv4 flow, a third of XXH64's dependent multiplies,
 * measured about 8 ns per packet less here. Lanes are read in native order: little-endian only. */

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the flow hash reads its lanes in native order, which must be little-endian"
#endif

#define LB_HASH_K 0x9E3779B97F4A7C15ull

static __always_inline __u64 hash_start(__u64 len)
{
	return LB_HASH_SEED ^ (len * LB_HASH_K);
}

static __always_inline __u64 hash_lane(__u64 h, __u64 x)
{
	return (h ^ x) * LB_HASH_K;
}

/* The whole 64 bits: the flow tables' tag and bucket (lb.h, struct lb_flow). */
static __always_inline __u64 hash_finish64(__u64 h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

static __always_inline __u32 hash_finish(__u64 h)
{
	return (__u32)hash_finish64(h);
}

/* 4 bytes: an IPv4 client address. */
static __always_inline __u32 hash4(__u32 w)
{
	return hash_finish(hash_lane(hash_start(4), w));
}

/* 16 bytes, all 64 bits. */
static __always_inline __u64 hash16_64(__u64 a, __u64 b)
{
	return hash_finish64(hash_lane(hash_lane(hash_start(16), a), b));
}

/* 40 bytes, all 64 bits. */
static __always_inline __u64 hash40_64(const __u64 *l)
{
	__u64 h = hash_start(40);

	h = hash_lane(h, l[0]);
	h = hash_lane(h, l[1]);
	h = hash_lane(h, l[2]);
	h = hash_lane(h, l[3]);
	h = hash_lane(h, l[4]);
	return hash_finish64(h);
}

/* 16 bytes: an IPv4 flow or an IPv6 client address. */
static __always_inline __u32 hash16(__u64 a, __u64 b)
{
	return (__u32)hash16_64(a, b);
}

/* 40 bytes: an IPv6 flow. */
static __always_inline __u32 hash40(const __u64 *l)
{
	return (__u32)hash40_64(l);
}

/* ---- the flow tables' tags: SipHash-1-3 (Aumasson and Bernstein) under a secret key ----
 * The flow hash above is documented and unkeyed, as every load balancer of a fleet must compute
 * it alike; its lanes are xor-then-multiply by odd constants, so anyone can solve for a 5-tuple
 * with a given hash. A tag that decides which flow-table entry a packet follows must not be
 * solvable, so it is a keyed pseudo-random function of the same lanes, with the key mixed in
 * before anything is compressed (any function of the unkeyed 64-bit hash would be as forgeable
 * as the hash). One compression round per lane and three to finish: the variant Rust's HashMap
 * uses against hash flooding. crates/core/src/flowhash.rs computes the same (flow_tag). */

static __always_inline __u64 sip_rotl(__u64 x, int b)
{
	return (x << b) | (x >> (64 - b));
}

struct sip {
	__u64 v0, v1, v2, v3;
};

static __always_inline void sip_round(struct sip *s)
{
	s->v0 += s->v1;
	s->v1 = sip_rotl(s->v1, 13);
	s->v1 ^= s->v0;
	s->v0 = sip_rotl(s->v0, 32);
	s->v2 += s->v3;
	s->v3 = sip_rotl(s->v3, 16);
	s->v3 ^= s->v2;
	s->v0 += s->v3;
	s->v3 = sip_rotl(s->v3, 21);
	s->v3 ^= s->v0;
	s->v2 += s->v1;
	s->v1 = sip_rotl(s->v1, 17);
	s->v1 ^= s->v2;
	s->v2 = sip_rotl(s->v2, 32);
}

static __always_inline struct sip sip_start(__u64 k0, __u64 k1)
{
	struct sip s = {
		.v0 = k0 ^ 0x736f6d6570736575ull,
		.v1 = k1 ^ 0x646f72616e646f6dull,
		.v2 = k0 ^ 0x6c7967656e657261ull,
		.v3 = k1 ^ 0x7465646279746573ull,
	};

	return s;
}

static __always_inline void sip_lane(struct sip *s, __u64 m)
{
	s->v3 ^= m;
	sip_round(s);
	s->v0 ^= m;
}

/* `len`: the input's length in bytes, a multiple of 8 here (no partial last lane). */
static __always_inline __u64 sip_finish(struct sip *s, __u64 len)
{
	sip_lane(s, len << 56);
	s->v2 ^= 0xff;
	sip_round(s);
	sip_round(s);
	sip_round(s);
	return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

/* The keyed tag of 16 bytes (an IPv4 flow's lanes). */
static __always_inline __u64 sip16(__u64 k0, __u64 k1, __u64 a, __u64 b)
{
	struct sip s = sip_start(k0, k1);

	sip_lane(&s, a);
	sip_lane(&s, b);
	return sip_finish(&s, 16);
}

/* The keyed tag of 40 bytes (an IPv6 flow's lanes). */
static __always_inline __u64 sip40(__u64 k0, __u64 k1, const __u64 *l)
{
	struct sip s = sip_start(k0, k1);

	sip_lane(&s, l[0]);
	sip_lane(&s, l[1]);
	sip_lane(&s, l[2]);
	sip_lane(&s, l[3]);
	sip_lane(&s, l[4]);
	return sip_finish(&s, 40);
}

#endif /* LB_HASH_H */
