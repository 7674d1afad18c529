/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* lb decap's maps and settings (decap.bpf.c), and the lookups on them that its second chance
 * (second_chance.h) shares: this host's addresses, the allow-list, the unresolved next hops, the
 * counters. */
#ifndef LB_DECAP_MAPS_H
#define LB_DECAP_MAPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lb.h"

/* This host's addresses, the loopback's (where the VIPs are) included; user space keeps it in
 * step with the interfaces'. Only packets whose outer destination is one of them are
 * decapsulated (a router's transit traffic never is), and only inner packets whose destination
 * is one of them are handed on. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct lb_addr);
	__type(value, __u8);
} local_addrs SEC(".maps");

/* The prefixes encapsulated packets may come from (user space writes it before attaching and
 * never changes it while attached). `lb decap --allow-any` writes the two /0 prefixes. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lb_decap_src);
	__type(value, __u8);
} allow_from SEC(".maps");

/* Second chance: the next hops found on the link with no MAC known, each with when it was
 * first found so (bpf_ktime_get_ns()). lb decap reads it, has the kernel resolve each, and
 * deletes the entries it is done with. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 256);
	__type(key, struct lb_addr);
	__type(value, __u64);
} unresolved SEC(".maps");

/* How long packets to an unresolved next hop are dropped before they are delivered here. */
#define LB_DECAP_RESOLVE_NS (3ULL * 1000 * 1000 * 1000)

/* Counters, indexed by enum lb_decap_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_DECAP_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} decap_stats SEC(".maps");

/* The GUE port (network order), set by user space before loading. */
const volatile __be16 gue_port = 0;
/* 1: `--second-chance`, set by user space before loading. */
const volatile __u8 second_chance = 0;

const volatile enum lb_decap_stat lb_decap_stat_btf = LB_DECAP_STAT_MAX;

/* The kernel's clock rate (jiffies a second), for second chance's reading of the kernel's
 * SYN-cookie bookkeeping; measured by user space after loading (lb_decap_clock), before
 * attaching. Not the kernel's configuration: libbpf cannot read it on every host. */
volatile __u32 jiffies_hz = 0;
/* lb_decap_clock's readings, and whether this kernel has conntrack's lookup for XDP (resolved
 * when the program was loaded). */
volatile __u64 clock_jiffies = 0, clock_ns = 0;
volatile __u8 has_conntrack = 0;

static __always_inline int dcount(__u32 stat, int action)
{
	__u64 *v = bpf_map_lookup_elem(&decap_stats, &stat);

	if (v)
		*v += 1;
	return action;
}

static __always_inline int is_local(const __u32 a[4], __u8 family)
{
	struct lb_addr key = {};

	__builtin_memcpy(key.addr, a, 16);
	key.family = family;
	return bpf_map_lookup_elem(&local_addrs, &key) != NULL;
}

/* Whether an outer source address `a` of `family` lies in one of allow_from's prefixes. */
static __always_inline int is_allowed(const __u32 a[4], __u8 family)
{
	struct lb_decap_src key = {};

	key.prefixlen = 32 + 128;
	key.family = family;
	__builtin_memcpy(key.addr, a, 16);
	return bpf_map_lookup_elem(&allow_from, &key) != NULL;
}

#endif /* LB_DECAP_MAPS_H */
