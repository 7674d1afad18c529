/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* From a parsed packet to a backend, without connection tracking: which service its destination
 * address, port and protocol name (vip_index, then routes or services), which slot of that
 * service's destination table its flow hash selects, which backend that slot holds, and sending
 * the frame there in the service's forwarding mode. Kept apart from the flow table (flow.h, conntrack.h),
 * which only decides which backend a flow keeps. Handlers return LB_SEND with their choice, and
 * lb_xdp() calls send() once. */
#ifndef LB_ROUTE_H
#define LB_ROUTE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lb.h"
#include "maps.h"
#include "parse.h"
#include "encap.h"
#include "frag_map.h"

/* The last 4 bytes of a service key (port, protocol, family) as one word in memory order. */
static __always_inline __u32 key_tail(__u16 port_be, __u8 proto, __u8 family)
{
	return (__u32)port_be | (__u32)proto << 16 | (__u32)family << 24;
}

/* The vip_index entry of a key, from the XOR of its five 32-bit words (in memory order).
 * Mirrored in crates/dataplane/src/lib.rs (vip_index()); the packet fixtures fail if the two disagree,
 * since a service would then never be found. */
static __always_inline __u32 lb_vip_index(__u32 words_xor)
{
	__u32 h = words_xor;

	h ^= h >> 16;
	h *= 0x9e3779b1u;
	return h >> (32 - LB_VIP_INDEX_BITS);
}

/* The route of a key, or NULL: one array read for most packets, a hash lookup only for keys
 * that share their index entry. `a` is the destination address (a[1..3] zero for IPv4). */
static __always_inline const struct lb_service *find_route(const __u32 a[4], __u32 tail)
{
	__u32 idx = lb_vip_index(a[0] ^ a[1] ^ a[2] ^ a[3] ^ tail);
	const struct lb_service *r;
	__u32 *id;

	id = bpf_map_lookup_elem(&vip_index, &idx);
	if (!id || *id == 0)
		return NULL;
	if (*id == LB_VIP_INDEX_SHARED) {
		struct lb_service_key key;

		__builtin_memcpy(key.addr, a, 16);
		__builtin_memcpy(&key.port, &tail, 4);
		return bpf_map_lookup_elem(&services, &key);
	}
	r = bpf_map_lookup_elem(&routes, id);
	if (!r)
		return NULL;
	/* The one route with this index: is it this packet's key? One branch for the five words,
	 * not one each. */
	if ((r->key.addr[0] ^ a[0]) | (r->key.addr[1] ^ a[1]) | (r->key.addr[2] ^ a[2]) | (r->key.addr[3] ^ a[3]) |
	    (*(const __u32 *)&r->key.port ^ tail))
		return NULL;
	return r;
}

/* Whether an address has any service of `family` (it has a fragment route, port 0, per
 * protocol): a packet for it whose port lb cannot read is dropped rather than passed. */
static __always_inline int has_services(const __u32 a[4], __u8 family)
{
	return find_route(a, key_tail(0, IPPROTO_TCP, family)) || find_route(a, key_tail(0, IPPROTO_UDP, family));
}

/* The backend id in entry `slot` of table_slots, for a table of `slots` slots (0: none), or 0
 * with the drop already counted; pick_in(): the entry that the table at `base` gives `hash`. */
static __always_inline __u32 pick_slot(__u32 slots, __u32 slot)
{
	struct lb_slot_pair *pair;
	__u32 half, id;

	if (slots == 0) {
		count(LB_DROP_NO_BACKEND, XDP_DROP);
		return 0;
	}
	half = slot >> 1;
	pair = bpf_map_lookup_elem(&table_slots, &half);
	if (!pair) {
		count(LB_DROP_NO_TABLE, XDP_DROP);
		return 0;
	}
	id = pair->id[slot & 1] & LB_SLOT_ID_MASK;
	if (id == 0)
		count(LB_DROP_NO_BACKEND, XDP_DROP);
	return id;
}

static __always_inline __u32 pick_in(__u32 base, __u32 slots, __u32 hash)
{
	return pick_slot(slots, slots ? base + hash % slots : 0);
}

/* The backend id the route's table gives `hash`, or 0 with the drop already counted. */
static __always_inline __u32 pick(const struct lb_service *svc, __u32 hash)
{
	return pick_in(svc->base, svc->slots, hash);
}

/* Copies a MAC address in two stores (4 and 2 bytes) rather than six: `src` is a MAC in a map
 * value or .bss, `dst` in the frame (x86 has no alignment requirement, and the verifier checks
 * none for packet access without BPF_F_STRICT_ALIGNMENT). */
static __always_inline void mac_copy(__u8 *dst, const __u8 *src)
{
	*(__u32 *)dst = *(const __u32 *)src;
	*(__u16 *)(dst + 4) = *(const __u16 *)(src + 4);
}

/* Sends the packet to backend `id` in the service's forwarding mode. */
static __always_inline int send(struct pkt *p, const struct lb_service *svc, __u32 id)
{
	struct lb_backend *be = bpf_map_lookup_elem(&backends, &id);

	if (!be || !(be->flags & LB_BACKEND_MAC_KNOWN))
		return count(LB_DROP_NO_MAC, XDP_DROP);
	int act;

	if (svc->forward != LB_FWD_L2) {
		act = encap(p, svc, id, be);
	} else {
		mac_copy(p->eth->h_dest, be->mac);
		mac_copy(p->eth->h_source, lb_settings.ifmac);
		/* Forwarded packets are counted per backend only; their total is the sum. */
		add_traffic(id, p->bytes);
		p->sent = 1;
		act = XDP_TX;
	}
	/* Whoever chose the backend (the flow table or the destination table), a first fragment's
	 * later fragments go where it went: recorded once it did go there, never for a first
	 * fragment dropped or answered "too big" (its sender sends the datagram again, smaller). */
	if (p->frag && p->sent)
		frag_record(p->frag, p->dport, p->l4proto, id, p->hash);
	return act;
}

/* Not an XDP action: what a handler returns once it has chosen a backend, which lb_xdp() then
 * sends to. One place in the program sends (send() and the encapsulation and "too big" code
 * below it are inlined once, not at every decision), which keeps the program small enough for
 * the verifier to walk quickly. */
#define LB_SEND 0x100

/* The handler's decision: backend `id` of `svc` (0: dropped, the reason already counted). */
static __always_inline int to_backend(struct pkt *p, const struct lb_service *svc, __u32 id)
{
	if (id == 0)
		return XDP_DROP;
	p->svc = svc;
	p->id = id;
	return LB_SEND;
}

/* The route of a packet has been found and hashed: pick the slot and the backend. */
static __always_inline int forward(struct pkt *p, const struct lb_service *svc)
{
	return to_backend(p, svc, pick(svc, p->hash));
}

#endif /* LB_ROUTE_H */
