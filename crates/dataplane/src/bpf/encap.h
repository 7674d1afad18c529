/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Encapsulation: IP in IP, or GUE, towards a backend anywhere routable. The frame grows at the
 * front by the outer headers (bpf_xdp_adjust_head), the inner packet stays byte for byte what
 * the client sent, and the frame goes back out of the interface to the next hop's MAC.
 *
 * Outer IPv4: header checksum computed, DF copied from the inner packet (always set for an
 * inner IPv6 packet, which routers never fragment), TTL 64, TOS copied. Outer IPv6: traffic
 * class copied, the flow label from the flow hash, hop limit 64. The outer source is the
 * configured encapsulation source with the bits lb_config says vary taken from the flow hash.
 * GUE is version 1 ("direct IP", RFC draft-ietf-intarea-gue section 4): the UDP payload is the
 * inner IP packet itself, which Linux's fou in gue mode decapsulates; its UDP source port comes
 * from the flow hash and its checksum is zero (no payload to cover but the inner packet, whose
 * own checksums stand). A second-chance service's packet whose slot has other live backends
 * that may hold its connection is GUE version 0 instead, carrying them as a hop list in its
 * private data (lb.h, struct lb_gue_hops) for the backend's `lb decap --second-chance`. */
#ifndef LB_ENCAP_H
#define LB_ENCAP_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lb.h"
#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "icmp.h"

/* The outer protocol for an inner packet of `family` when the service uses `forward`. */
static __always_inline __u8 outer_proto(__u32 forward, __u8 family)
{
	if (forward == LB_FWD_GUE)
		return IPPROTO_UDP;
	return family == LB_FAMILY_V4 ? IPPROTO_IPIP_ : IPPROTO_IPV6_;
}

/* A GUE header (a UDP header without checksum) at `udp`: from port `sport` to `port` (network
 * order), `len` bytes behind it. lb_xdp's (write_gue()) and lb_probe_out's (probe.h). */
static __always_inline void gue_header(struct udphdr *udp, __u16 sport, __be16 port, __u32 len)
{
	udp->source = bpf_htons(sport);
	udp->dest = port;
	udp->len = bpf_htons(sizeof(*udp) + len);
	udp->check = 0;
}

/* The GUE header behind the outer IP header at `udp`; `extra`: the bytes of a GUE version 0
 * header and hop list between it and the inner packet. */
static __always_inline void write_gue(struct udphdr *udp, const struct pkt *p, __be16 port, __u32 extra)
{
	/* Ephemeral range (49152..65535), 14 bits from the hash's upper half. */
	gue_header(udp, 0xc000 | ((p->hash >> 16) & 0x3fff), port, extra + p->l3len);
}

/* Second chance: the backends besides `id` that may hold the packet's connection, whose outer
 * address is of `family` (a hop of the other family cannot be reached in this outer header and
 * is left out): its slot's owner (when a flow entry sends the packet elsewhere), then the
 * slot's hops from table_hops, each once, each still alive. Returned packed, the count in the
 * low 16 bits and up to three 16-bit ids above it (ids are below LB_MAX_BACKENDS), so that the
 * list lives in a register and not on the program's stack, which is at the verifier's limit. */
static __always_inline int hop_usable(__u32 c, __u32 id, __u8 family)
{
	struct lb_backend *be;
	struct lb_addr *a;

	if (c == 0 || c == id)
		return 0;
	be = bpf_map_lookup_elem(&backends, &c);
	a = bpf_map_lookup_elem(&backend_addrs, &c);
	return be && (be->flags & LB_BACKEND_ALIVE) && a && a->family == family;
}

static __always_inline __u64 hop_add(__u64 list, __u32 c)
{
	__u32 n = list & 0xffff;

	return (list + 1) | (__u64)(c & 0xffff) << (16 * (n + 1));
}

static __noinline __u64 hop_list(__u32 slot, __u32 id, __u32 family)
{
	__u32 half = slot >> 1, owner = 0, first = 0, second = 0;
	struct lb_slot_pair *pair = bpf_map_lookup_elem(&table_slots, &half);
	struct lb_hop_pair *hp = bpf_map_lookup_elem(&table_hops, &half);
	__u64 list = 0;

	if (pair)
		owner = pair->id[slot & 1] & LB_SLOT_ID_MASK;
	if (hp) {
		first = hp->slot[slot & 1].id[0];
		second = hp->slot[slot & 1].id[1];
	}
	if (hop_usable(owner, id, family))
		list = hop_add(list, owner);
	if (first != owner && hop_usable(first, id, family))
		list = hop_add(list, first);
	if (second != owner && second != first && hop_usable(second, id, family))
		list = hop_add(list, second);
	return list;
}

/* The bytes a hop list of `n` hops takes behind the UDP header: the GUE version 0 header, the
 * private block's header and the hops. 0 without hops: the packet is then GUE version 1. */
static __always_inline __u32 hops_len(__u32 n, __u8 family)
{
	if (n == 0)
		return 0;
	return 4 + sizeof(struct lb_gue_hops) + n * (family == LB_FAMILY_V4 ? 4 : 16);
}

/* Writes the GUE version 0 header and the hop list `list` (hop_list()) at `at`, right behind
 * the UDP header. */
static __always_inline int write_hops(struct xdp_md *ctx, __u8 *at, __u64 list, __u8 family, __u8 inner_family)
{
	void *end = (void *)(long)ctx->data_end;
	struct lb_gue_hops *gh = (void *)(at + 4);
	__u32 n = list & 0xffff, len = hops_len(n, family);

	if ((void *)(gh + 1) > end)
		return -1;
	at[0] = (len - 4) / 4; /* version 0, C 0, header length in words past the first */
	at[1] = inner_family == LB_FAMILY_V4 ? IPPROTO_IPIP_ : IPPROTO_IPV6_;
	at[2] = 0;
	at[3] = 0;
	gh->type = bpf_htons(family == LB_FAMILY_V4 ? LB_GUE_HOPS_V4 : LB_GUE_HOPS_V6);
	gh->next = 0;
	gh->count = n;
#pragma unroll
	for (__u32 i = 0; i < LB_GUE_MAX_HOPS; i++) {
		__u32 c = (list >> (16 * (i + 1))) & 0xffff;
		struct lb_addr *a;

		if (i >= n)
			break;
		a = bpf_map_lookup_elem(&backend_addrs, &c);
		if (!a)
			return -1;
		if (family == LB_FAMILY_V4) {
			__be32 *to = (void *)(gh + 1) + i * 4;

			if ((void *)(to + 1) > end)
				return -1;
			*to = a->addr[0];
		} else {
			__be32 *to = (void *)(gh + 1) + i * 16;

			if ((void *)(to + 4) > end)
				return -1;
			__builtin_memcpy(to, a->addr, 16);
		}
	}
	return 0;
}

/* Sends the packet at p to backend `id` (record `be`: the next hop's MAC) inside an outer
 * header of the backend's family. */
static __always_inline int encap(struct pkt *p, const struct lb_service *svc, __u32 id, const struct lb_backend *be)
{
	struct xdp_md *ctx = p->ctx;
	struct lb_addr *to = bpf_map_lookup_elem(&backend_addrs, &id);
	__u32 l2len = p->l2len == 18 ? 18 : 14;
	__u32 gue = svc->forward == LB_FWD_GUE ? sizeof(struct udphdr) : 0;
	__be16 gue_port = svc->gue_port;
	struct l2_saved l2 = {};
	__u64 hops = 0;
	__u32 overhead, frame, extra = 0;
	__u8 proto, mac[6];
	void *data, *end;

	if (!to || (to->family != LB_FAMILY_V4 && to->family != LB_FAMILY_V6))
		return count(LB_DROP_ENCAP, XDP_DROP);
	if (gue && (svc->flags & LB_SVC_SECOND_CHANCE) && svc->slots) {
		hops = hop_list(svc->base + p->hash % svc->slots, id, to->family);
		extra = hops_len(hops & 0xffff, to->family);
	}
	overhead = (to->family == LB_FAMILY_V4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr)) + gue + extra;
	/* An MTU smaller than the overhead leaves the client no room at all (and must not wrap). */
	if (lb_settings.mtu && p->l3len + overhead > lb_settings.mtu)
		return too_big(p, lb_settings.mtu > overhead ? lb_settings.mtu - overhead : 0);
	proto = outer_proto(svc->forward, p->family);
	__builtin_memcpy(mac, be->mac, 6);

	l2_save(p, &l2);
	/* Ethernet padding behind a short IP packet would end up inside the tunnel: cut it. */
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	frame = end - data;
	if (frame > l2len + p->l3len && bpf_xdp_adjust_tail(ctx, (int)(l2len + p->l3len) - (int)frame))
		return count(LB_DROP_ENCAP, XDP_DROP);
	if (bpf_xdp_adjust_head(ctx, -(int)overhead))
		return count(LB_DROP_ENCAP, XDP_DROP);

	if (to->family == LB_FAMILY_V4) {
		struct iphdr *ip = l2_write(ctx, l2len, mac, lb_settings.ifmac, l2.tag, bpf_htons(ETH_P_IP),
					    sizeof(struct iphdr) + sizeof(struct udphdr));
		__be32 vary = lb_settings.encap_src4_vary;

		if (!ip)
			return count(LB_DROP_ENCAP, XDP_DROP);
		*(__u8 *)ip = 0x45;
		ip->tos = p->tos;
		ip->tot_len = bpf_htons(p->l3len + overhead);
		/* With DF the id means nothing (RFC 6864); without it, fragments of different
		 * packets must not share one. */
		ip->id = p->df ? 0 : (__u16)bpf_get_prandom_u32();
		ip->frag_off = p->df ? bpf_htons(IP_DF) : 0;
		ip->ttl = 64;
		ip->protocol = proto;
		ip->check = 0;
		ip->saddr = (lb_settings.encap_src4 & ~vary) | (p->hash & vary);
		ip->daddr = to->addr[0];
		ip->check = ipv4_csum(ip);
		if (gue)
			write_gue((void *)(ip + 1), p, gue_port, extra);
		if (extra && write_hops(ctx, (void *)(ip + 1) + sizeof(struct udphdr), hops, LB_FAMILY_V4, p->family))
			return count(LB_DROP_ENCAP, XDP_DROP);
	} else {
		struct ipv6hdr *ip6 = l2_write(ctx, l2len, mac, lb_settings.ifmac, l2.tag, bpf_htons(ETH_P_IPV6),
					       sizeof(struct ipv6hdr) + sizeof(struct udphdr));
		__be32 vary = lb_settings.encap_src6_vary;

		if (!ip6)
			return count(LB_DROP_ENCAP, XDP_DROP);
		*(__be32 *)ip6 = bpf_htonl(0x60000000 | (__u32)p->tos << 20 | (p->hash & 0xfffff));
		ip6->payload_len = bpf_htons(p->l3len + gue + extra);
		ip6->nexthdr = proto;
		ip6->hop_limit = 64;
		__builtin_memcpy(&ip6->saddr, lb_settings.encap_src6, 12);
		ip6->saddr.in6_u.u6_addr32[3] = (lb_settings.encap_src6[3] & ~vary) | (p->hash & vary);
		__builtin_memcpy(&ip6->daddr, to->addr, 16);
		if (gue)
			write_gue((void *)(ip6 + 1), p, gue_port, extra);
		if (extra && write_hops(ctx, (void *)(ip6 + 1) + sizeof(struct udphdr), hops, LB_FAMILY_V6, p->family))
			return count(LB_DROP_ENCAP, XDP_DROP);
	}
	add_traffic(id, p->bytes);
	p->sent = 1;
	return XDP_TX;
}

#endif /* LB_ENCAP_H */
