/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The balancer's maps, one comment each, and the counters' helpers. The two flow tables' maps
 * (flows, flow_pending) are connection tracking's alone and live with it in flow.h. */
#ifndef LB_MAPS_H
#define LB_MAPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lb.h"

/* First lookup of every TCP/UDP packet: lb_vip_index(key) -> route id (see lb.h). An array,
 * so the verifier inlines the lookup: one load decides that most non-service traffic passes. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_VIP_INDEX_SIZE);
	__type(key, __u32);
	__type(value, __u32);
} vip_index SEC(".maps");

/* Route id -> route (id 0 unused). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_ROUTES + 1);
	__type(key, __u32);
	__type(value, struct lb_service);
} routes SEC(".maps");

/* Service key -> route, for keys that share a vip_index entry. A hash map, so each update
 * replaces a value whole. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_ROUTES);
	__type(key, struct lb_service_key);
	__type(value, struct lb_service);
} services SEC(".maps");

/* Every service's destination table, side by side: a route's table is the entries
 * [base, base + slots); each entry a backend id (0 = empty). One array rather than an array of
 * per-service maps: a lookup in a static array is inlined by the verifier, while a lookup in an
 * inner map is a helper call, which measured ~14 ns per packet here. User space sizes it before
 * loading (max_entries below is a placeholder). A table that changes size is written to a fresh
 * range and switched to by its route; one that keeps its size is rewritten in place, slot by
 * slot, each slot write whole. Array elements are 8-byte aligned, so each element holds two
 * slots (2k and 2k + 1) instead of wasting half of it; the mapping is memory-mappable, and user
 * space writes slots with plain 4-byte stores instead of a syscall per slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_slot_pair);
} table_slots SEC(".maps");

/* The second-chance hops of every slot of table_slots, at the same index (lb.h, struct
 * lb_hops): read only for a service with LB_SVC_SECOND_CHANCE. Sized and written like
 * table_slots (one aligned 4-byte store a slot). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_hop_pair);
} table_hops SEC(".maps");

/* Backend id -> its generation, bumped each time the id is given to a backend. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, __u32);
} backend_gen SEC(".maps");

/* Backend id -> where to send its frames: the MAC of the backend (l2) or of the next hop
 * towards it (encapsulation). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_backend);
} backends SEC(".maps");

/* Backend id -> its address: the outer destination of encapsulated packets. Written before any
 * slot names the id, like the backends record. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_addr);
} backend_addrs SEC(".maps");

/* Backend id -> whose it is (lb.h, struct lb_backend_meta). Read by a controller that adopts
 * a pinned data plane, and by the probes' egress program (probe.h), never by lb_xdp(). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_backend_meta);
} backend_meta SEC(".maps");

/* Service key -> the service's name (lb.h, struct lb_name), for lb status. Never read by the
 * program. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, LB_MAX_ROUTES);
	__type(key, struct lb_service_key);
	__type(value, struct lb_name);
} service_names SEC(".maps");

/* Which build made this data plane and who controls it (lb.h, struct lb_meta). Never read by
 * the program. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_meta);
} lb_meta SEC(".maps");

/* The attached interface's settings, written by user space through the skeleton's mapping of
 * .bss. A global rather than a map entry: the program reads it at a fixed address, with no
 * lookup on the packet path. */
struct lb_config lb_settings = {};

/* Packet counters and drop reasons, indexed by enum lb_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* Traffic forwarded per backend id. A backend id belongs to one service, so a service's traffic
 * is the sum over its backends: one counter update per packet instead of two. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_traffic);
} backend_traffic SEC(".maps");

/* Unused by the program: these make the counter and mode enums part of the object's BTF, so
 * that user space reads their values from the skeleton instead of keeping a copy. */
const volatile enum lb_stat lb_stat_btf = LB_STAT_MAX;
const volatile enum lb_hash_mode lb_hash_mode_btf = LB_HASH_CLIENT_IP;
const volatile enum lb_family lb_family_btf = LB_FAMILY_V4;
const volatile enum lb_backend_flags lb_backend_flags_btf = LB_BACKEND_MAC_KNOWN;
const volatile enum lb_vip_index_layout lb_vip_index_layout_btf = LB_VIP_INDEX_BITS;
const volatile enum lb_service_flags lb_service_flags_btf = LB_SVC_CONNTRACK;
const volatile enum lb_flow_table_layout lb_flow_table_layout_btf = LB_FLOW_WAYS;
const volatile enum lb_forward lb_forward_btf = LB_FWD_L2;
const volatile enum lb_gue_hops_layout lb_gue_hops_layout_btf = LB_GUE_HOPS_V4;
const volatile enum lb_slot_bits lb_slot_bits_btf = LB_SLOT_UNSTABLE;
const volatile enum lb_quic_budget lb_quic_budget_btf = LB_QUIC_DECODES_PER_SEC;
const volatile enum lb_probe_mark lb_probe_mark_btf = LB_PROBE_MARK;

static __always_inline int count(__u32 stat, int action)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &stat);

	if (v)
		*v += 1;
	return action;
}

static __always_inline void add_traffic(__u32 id, __u64 bytes)
{
	struct lb_traffic *t = bpf_map_lookup_elem(&backend_traffic, &id);

	if (t) {
		t->packets += 1;
		t->bytes += bytes;
	}
}

#endif /* LB_MAPS_H */
