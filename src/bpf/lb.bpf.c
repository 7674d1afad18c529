// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* The XDP data plane: parse -> service -> hash -> slot -> backend -> forward.
 *
 * Forwarding is direct server return, per service: L2 (only the Ethernet addresses change) or
 * encapsulated (IPIP or GUE, encap.h) to a backend anywhere routable; either way the frame goes
 * back out of the interface it came in on (XDP_TX). Backends hold the VIP on their loopback and
 * answer clients directly. ICMP errors about a service's flows (a router on the way back to the
 * client saying "fragmentation needed") reach the backend that owns the flow. Everything that is not for a service leaves unchanged (XDP_PASS);
 * everything that is for a service but cannot be forwarded is dropped for a named, counted reason.
 * There are no rings, weights or searches here: the control plane compiled them into each
 * service's destination table. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lb.h"
#include "parse.h"
#include "maps.h"
#include "csum.h"
#include "hash.h"
#include "icmp.h"
#include "encap.h"

/* The last 4 bytes of a service key (port, protocol, family) as one word in memory order. */
static __always_inline __u32 key_tail(__u16 port_be, __u8 proto, __u8 family)
{
	return (__u32)port_be | (__u32)proto << 16 | (__u32)family << 24;
}

/* The vip_index entry of a key, from the XOR of its five 32-bit words (in memory order).
 * Mirrored in src/dataplane/mod.rs (vip_index()); the packet fixtures fail if the two disagree,
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
	/* The one route with this index: is it this packet's key? */
	if (r->key.addr[0] != a[0] || r->key.addr[1] != a[1] || r->key.addr[2] != a[2] ||
	    r->key.addr[3] != a[3] || *(const __u32 *)&r->key.port != tail)
		return NULL;
	return r;
}

/* What parse_ports() found. */
enum l4 {
	L4_PORTS,     /* TCP or UDP, ports read */
	L4_OTHER,     /* another protocol: not ours */
	L4_MALFORMED, /* a TCP or UDP header that is not all there */
};

/* The ports of a TCP or UDP header, as the packet's bytes (network order), in one word:
 * source port in the low half, destination port in the high half (memory order). */
static __always_inline enum l4 parse_ports(struct cursor *c, __u8 proto, __u32 *ports, __u8 *tcp_flags)
{
	if (proto == IPPROTO_TCP) {
		struct tcphdr *th = take(c, sizeof(*th));

		if (!th || th->doff < 5)
			return L4_MALFORMED;
		*ports = *(__u32 *)th;
		*tcp_flags = ((__u8 *)th)[13];
		return L4_PORTS;
	}
	if (proto == IPPROTO_UDP) {
		struct udphdr *uh = take(c, sizeof(*uh));

		if (!uh)
			return L4_MALFORMED;
		*ports = *(__u32 *)uh;
		return L4_PORTS;
	}
	return L4_OTHER;
}

/* ---- forwarding ---- */

#define TCP_FLAG_RST 0x04
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_ACK 0x10

/* The backend id the route's table gives `hash`, or 0 with the drop already counted. */
static __always_inline __u32 pick(const struct lb_service *svc, __u32 hash)
{
	struct lb_slot_pair *pair;
	__u32 slot, half, id;

	if (svc->slots == 0) {
		count(LB_DROP_NO_BACKEND, XDP_DROP);
		return 0;
	}
	slot = svc->base + hash % svc->slots;
	half = slot >> 1;
	pair = bpf_map_lookup_elem(&table_slots, &half);
	if (!pair) {
		count(LB_DROP_NO_TABLE, XDP_DROP);
		return 0;
	}
	id = pair->id[slot & 1];
	if (id == 0)
		count(LB_DROP_NO_BACKEND, XDP_DROP);
	return id;
}

/* Sends the packet to backend `id` in the service's forwarding mode. */
static __always_inline int send(struct pkt *p, const struct lb_service *svc, __u32 id)
{
	struct lb_backend *be = bpf_map_lookup_elem(&backends, &id);

	if (!be || !(be->flags & LB_BACKEND_MAC_KNOWN))
		return count(LB_DROP_NO_MAC, XDP_DROP);
	if (svc->forward != LB_FWD_L2)
		return encap(p, svc, id, be);
	__builtin_memcpy(p->eth->h_dest, be->mac, 6);
	__builtin_memcpy(p->eth->h_source, lb_settings.ifmac, 6);
	/* Forwarded packets are counted per backend only; their total is the sum. */
	add_traffic(id, p->bytes);
	return XDP_TX;
}

/* The route of a packet has been found and hashed: pick the slot, the backend, and send. */
static __always_inline int forward(struct pkt *p, const struct lb_service *svc)
{
	__u32 id = pick(svc, p->hash);

	if (id == 0)
		return XDP_DROP;
	return send(p, svc, id);
}

/* ---- connection tracking (lb.h, struct lb_flow) ---- */

/* Flow tables count time in ticks of 2^LB_CT_TICK_SHIFT ms (16 ms): a 32-bit `seen` lasts two
 * years, and timeouts keep a precision far finer than a second. */
#define LB_CT_TICK_SHIFT 4
/* A tracked flow's `seen` is rewritten at most every 64 ticks (about a second), or a quarter of
 * its timeout if that is shorter: a hit rarely writes. */
#define LB_CT_REFRESH_TICKS 64

static __always_inline __u32 ct_timeout_ticks(__u8 proto)
{
	__u64 ms = proto == IPPROTO_TCP ? lb_settings.ct_tcp_timeout_ms : lb_settings.ct_udp_timeout_ms;

	return (ms + (1 << LB_CT_TICK_SHIFT) - 1) >> LB_CT_TICK_SHIFT;
}

/* A slot's backend, gen and seen, read as one word (lb.h says why). */
struct flow_word {
	__u32 backend;
	__u32 gen;
	__u32 seen;
};

static __always_inline __u64 flow_pack(__u32 backend, __u32 gen, __u32 seen)
{
	return (__u64)(backend & 0xffff) | (__u64)(gen & 0xffff) << 16 | (__u64)seen << 32;
}

static __always_inline struct flow_word flow_unpack(__u64 w)
{
	struct flow_word f = { .backend = w & 0xffff, .gen = (w >> 16) & 0xffff, .seen = w >> 32 };

	return f;
}

static __always_inline __u64 *flow_word_of(struct lb_flow *e)
{
	return (__u64 *)&e->backend;
}

/* The k-th of the 2 * LB_FLOW_WAYS slots where a flow may live: the slots of its first bucket
 * (from the tag's high half), then those of its second (from its low half), so that a bucket
 * that fills up spills into another instead of forgetting flows. */
static __always_inline __u32 flow_slot(__u64 tag, __u32 mask, __u32 k)
{
	__u32 bucket = k < LB_FLOW_WAYS ? (__u32)(tag >> 32) & mask : ((__u32)tag >> 8) & mask;

	return bucket * LB_FLOW_WAYS + (k & (LB_FLOW_WAYS - 1));
}

/* The slot of `map` holding `tag`, with its word read consistently, or NULL. `choices`: 2 for
 * the flow table (the second bucket's cache line is read only when the first does not hold the
 * flow), 1 for the half-open table, which a flood churns anyway. */
static __always_inline struct lb_flow *flow_find(void *map, __u32 mask, __u32 choices, __u64 tag, struct flow_word *out)
{
#pragma unroll
	for (__u32 i = 0; i < 2 * LB_FLOW_WAYS; i++) {
		__u32 k = flow_slot(tag, mask, i);
		struct lb_flow *e;
		__u64 w;

		if (i >= choices * LB_FLOW_WAYS)
			break;
		e = bpf_map_lookup_elem(map, &k);
		if (!e || *(volatile __u64 *)&e->tag != tag)
			continue;
		w = *(volatile __u64 *)flow_word_of(e);
		/* Still this flow's after the read: a writer replacing it would have zeroed the tag
		 * before writing the word. */
		if (*(volatile __u64 *)&e->tag != tag)
			continue;
		*out = flow_unpack(w);
		return e;
	}
	return NULL;
}

/* Writes a flow into `map`: into the slot that already has its tag (`have`), else a free one of
 * its two buckets, else the one of them seen longest ago. Returns 1 when that forgot another
 * flow. A slot another CPU is writing at the same instant is left to it (the flow is then not
 * recorded). */
static __always_inline int flow_put(void *map, __u32 mask, __u32 choices, __u64 tag, struct lb_flow *have, __u64 word)
{
	struct lb_flow *victim = have;
	__u64 old, oldest = ~0ull;

	if (!victim) {
#pragma unroll
		for (__u32 i = 0; i < 2 * LB_FLOW_WAYS; i++) {
			__u32 k = flow_slot(tag, mask, i);
			struct lb_flow *e;
			__u64 seen;

			if (i >= choices * LB_FLOW_WAYS)
				break;
			e = bpf_map_lookup_elem(map, &k);
			if (!e)
				continue;
			if (e->tag == 0) {
				victim = e;
				break;
			}
			seen = 1 + (__u64)e->seen;
			if (seen < oldest) {
				oldest = seen;
				victim = e;
			}
		}
		if (!victim)
			return 0;
	}
	old = *(volatile __u64 *)&victim->tag;
	if (old != 0 && __sync_val_compare_and_swap(&victim->tag, old, 0) != old)
		return 0;
	*(volatile __u64 *)flow_word_of(victim) = word;
	*(volatile __u64 *)&victim->tag = tag;
	return old != 0 && old != tag;
}

/* Ends a flow's entry (a reset), unless another flow took the slot meanwhile. */
static __always_inline void flow_end(struct lb_flow *e, __u64 tag)
{
	__sync_val_compare_and_swap(&e->tag, tag, 0);
}

/* Whether a tracked entry still leads somewhere: its backend alive, the id not given to
 * another backend since, and the flow not idle past its protocol's `timeout` (ticks; 0: never). */
static __always_inline int usable(const struct flow_word *f, __u32 timeout, __u32 now)
{
	__u32 id = f->backend;
	struct lb_backend *be = bpf_map_lookup_elem(&backends, &id);
	__u32 *gen = bpf_map_lookup_elem(&backend_gen, &id);

	if (!be || !gen || !(be->flags & LB_BACKEND_ALIVE) || (*gen & 0xffff) != f->gen)
		return 0;
	return timeout == 0 || now - f->seen < timeout;
}

/* Keeps a used entry from ageing out: rewrites `seen` once it is older than the refresh interval. */
static __always_inline void refresh(struct lb_flow *e, const struct flow_word *f, __u32 timeout, __u32 now)
{
	__u32 every = timeout / 4;

	if (every == 0 || every > LB_CT_REFRESH_TICKS)
		every = LB_CT_REFRESH_TICKS;
	if (now - f->seen >= every)
		e->seen = now;
}

/* Connection tracking: a flow with a usable entry goes to its backend whatever the table says
 * now; otherwise the table decides. A flow's first packet (a TCP SYN without ACK, any UDP
 * datagram) is recorded in flow_pending with the backend it went to; its next packet moves that
 * record into `flows`, where it may take the place of the established flow seen longest ago.
 * A stale entry (its backend gone, down, or the flow idle too long) is remade from the table by
 * any packet. With ct_guard off, a first packet goes straight into `flows`. `h` is the flow's
 * 64-bit hash over its 5-tuple. */
static __always_inline int tracked(struct pkt *p, const struct lb_service *svc, __u64 h, __u8 proto, __u8 tcp_flags)
{
	__u32 now = lb_settings.clock_ms >> LB_CT_TICK_SHIFT, timeout = ct_timeout_ticks(proto);
	__u64 tag = h | 1;
	__u32 mask = lb_settings.ct_mask, pmask = lb_settings.ct_pending_mask, id, *gen;
	int syn = proto == IPPROTO_TCP && (tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
	/* A packet that may start a flow: a SYN, or any UDP datagram without an entry. */
	int first = syn || proto == IPPROTO_UDP;
	struct lb_flow *e, *pe;
	struct flow_word f;

	e = flow_find(&flows, mask, 2, tag, &f);
	if (e) {
		if (usable(&f, timeout, now)) {
			refresh(e, &f, timeout, now);
			/* The client reset the connection: it is over, and the next one with these
			 * ports is a new flow. (Only the client's direction passes here.) */
			if (tcp_flags & TCP_FLAG_RST)
				flow_end(e, tag);
			count(LB_CT_HIT, 0);
			return send(p, svc, f.backend);
		}
		count(LB_CT_STALE, 0);
		id = pick(svc, p->hash);
		if (id == 0)
			return XDP_DROP;
		gen = bpf_map_lookup_elem(&backend_gen, &id);
		flow_put(&flows, mask, 2, tag, e, flow_pack(id, gen ? *gen : 0, now));
		count(LB_CT_NEW, 0);
		return send(p, svc, id);
	}
	count(LB_CT_MISS, 0);
	if (lb_settings.ct_guard) {
		pe = flow_find(&flow_pending, pmask, 1, tag, &f);
		if (pe) {
			int stale = !usable(&f, timeout, now);

			if (stale) {
				/* Its first packet went to a backend that is gone or down (or long
				 * ago): the table decides again. */
				count(LB_CT_STALE, 0);
				id = pick(svc, p->hash);
				if (id == 0)
					return XDP_DROP;
				gen = bpf_map_lookup_elem(&backend_gen, &id);
				f.backend = id;
				f.gen = gen ? *gen : 0;
			}
			if (syn) {
				/* A SYN sent again: where the first one went. */
				if (stale)
					flow_put(&flow_pending, pmask, 1, tag, pe, flow_pack(f.backend, f.gen, now));
				else
					count(LB_CT_HIT, 0);
				return send(p, svc, f.backend);
			}
			/* The flow's next packet: established, with the backend its first went to. */
			if (!(tcp_flags & TCP_FLAG_RST)) {
				if (flow_put(&flows, mask, 2, tag, NULL, flow_pack(f.backend, f.gen, now)))
					count(LB_CT_EVICTED, 0);
				count(LB_CT_NEW, 0);
			}
			flow_end(pe, tag);
			if (!stale)
				count(LB_CT_HIT, 0);
			return send(p, svc, f.backend);
		}
		id = pick(svc, p->hash);
		if (id == 0)
			return XDP_DROP;
		if (first) {
			gen = bpf_map_lookup_elem(&backend_gen, &id);
			flow_put(&flow_pending, pmask, 1, tag, pe, flow_pack(id, gen ? *gen : 0, now));
			count(LB_CT_PENDING, 0);
		}
		return send(p, svc, id);
	}
	id = pick(svc, p->hash);
	if (id == 0)
		return XDP_DROP;
	if (first) {
		gen = bpf_map_lookup_elem(&backend_gen, &id);
		if (flow_put(&flows, mask, 2, tag, NULL, flow_pack(id, gen ? *gen : 0, now)))
			count(LB_CT_EVICTED, 0);
		count(LB_CT_NEW, 0);
	}
	return send(p, svc, id);
}

/* An ICMP error about a service's flow (p->hash already the flow's hash for the table, h its
 * 64-bit hash as the client's own packets have it): to the backend that owns the flow, by the
 * flow's entry (looked up, never made or refreshed) or else the same slot as the client's
 * packets. */
static __always_inline int route_icmp(struct pkt *p, const struct lb_service *svc, __u64 h, __u8 proto)
{
	__u32 now = lb_settings.clock_ms >> LB_CT_TICK_SHIFT;
	__u64 tag = h | 1;
	struct flow_word f;
	__u32 id = 0;

	if (svc->flags & LB_SVC_CONNTRACK) {
		if ((flow_find(&flows, lb_settings.ct_mask, 2, tag, &f) ||
		     flow_find(&flow_pending, lb_settings.ct_pending_mask, 1, tag, &f)) &&
		    usable(&f, ct_timeout_ticks(proto), now))
			id = f.backend;
	}
	if (id == 0)
		id = pick(svc, p->hash);
	if (id == 0)
		return XDP_DROP;
	p->icmp = 1;
	count(LB_ICMP_FORWARDED, 0);
	return send(p, svc, id);
}

/* ICMPv4 destination unreachable (any code) addressed to a VIP, quoting a packet that the VIP
 * sent to a client (a backend's reply): routed to that flow's backend. Anything else is passed. */
static __always_inline int handle_icmp4(struct cursor *c, struct pkt *p, __be32 outer_dst)
{
	struct icmphdr *ic = take(c, sizeof(*ic));
	const struct lb_service *svc;
	__u32 hlen, qports, cports, dst[4] = {};
	struct iphdr *q;
	__u64 h;
	__u32 *ports;

	if (!ic || ic->type != ICMP_DEST_UNREACH_)
		return count(LB_STAT_PASSED, XDP_PASS);
	q = take(c, sizeof(*q));
	if (!q || q->version != 4 || q->ihl < 5)
		return count(LB_STAT_PASSED, XDP_PASS);
	hlen = q->ihl * 4;
	if (hlen > sizeof(*q) && !take(c, hlen - sizeof(*q)))
		return count(LB_STAT_PASSED, XDP_PASS);
	if ((q->protocol != IPPROTO_TCP && q->protocol != IPPROTO_UDP) || q->saddr != outer_dst ||
	    (q->frag_off & bpf_htons(IP_OFFSET)))
		return count(LB_STAT_PASSED, XDP_PASS);
	ports = take(c, sizeof(*ports));
	if (!ports)
		return count(LB_STAT_PASSED, XDP_PASS);
	/* Quoted: source = the VIP and service port, destination = the client. */
	qports = *ports;
	dst[0] = q->saddr;
	svc = find_route(dst, key_tail(qports & 0xffff, q->protocol, LB_FAMILY_V4));
	if (!svc)
		return count(LB_STAT_PASSED, XDP_PASS);
	/* The client's own packets: its port first, then the service's. */
	cports = qports >> 16 | qports << 16;
	h = hash16_64((__u64)q->daddr | (__u64)q->saddr << 32, (__u64)cports | (__u64)q->protocol << 32);
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash4(q->daddr) : (__u32)h;
	return route_icmp(p, svc, h, q->protocol);
}

/* ICMPv6 destination unreachable or packet too big, likewise. */
static __always_inline int handle_icmp6(struct cursor *c, struct pkt *p, const struct in6_addr *outer_dst)
{
	struct icmp6hdr *ic = take(c, sizeof(*ic));
	const struct lb_service *svc;
	__u32 qports, cports, dst[4];
	struct ipv6hdr *q;
	__u32 *ports;
	__u64 l[5], h;

	if (!ic || (ic->icmp6_type != ICMPV6_DEST_UNREACH_ && ic->icmp6_type != ICMPV6_PKT_TOOBIG_))
		return count(LB_STAT_PASSED, XDP_PASS);
	q = take(c, sizeof(*q));
	if (!q || q->version != 6 || (q->nexthdr != IPPROTO_TCP && q->nexthdr != IPPROTO_UDP))
		return count(LB_STAT_PASSED, XDP_PASS);
	ports = take(c, sizeof(*ports));
	if (!ports)
		return count(LB_STAT_PASSED, XDP_PASS);
	__builtin_memcpy(dst, &q->saddr, 16);
	if (dst[0] != outer_dst->in6_u.u6_addr32[0] || dst[1] != outer_dst->in6_u.u6_addr32[1] ||
	    dst[2] != outer_dst->in6_u.u6_addr32[2] || dst[3] != outer_dst->in6_u.u6_addr32[3])
		return count(LB_STAT_PASSED, XDP_PASS);
	qports = *ports;
	svc = find_route(dst, key_tail(qports & 0xffff, q->nexthdr, LB_FAMILY_V6));
	if (!svc)
		return count(LB_STAT_PASSED, XDP_PASS);
	cports = qports >> 16 | qports << 16;
	/* Lanes as the client's packets hash them: client, then VIP, then ports and protocol. */
	__builtin_memcpy(l, &q->daddr, 16);
	__builtin_memcpy(&l[2], dst, 16);
	l[4] = (__u64)cports | (__u64)q->nexthdr << 32;
	h = hash40_64(l);
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash16(l[0], l[1]) : (__u32)h;
	return route_icmp(p, svc, h, q->nexthdr);
}

/* IPv4: any header length (options skipped), the whole datagram present, TCP or UDP.
 * The flow hash input is documented in README.md ("Flow hash") and src/flowhash.rs. */
static __always_inline int handle_ipv4(struct cursor *c, struct pkt *p)
{
	struct iphdr *iph = take(c, sizeof(*iph));
	const struct lb_service *svc;
	__u32 hlen, ports = 0, dst[4] = {};
	__u8 tcp_flags = 0;
	int fragment;
	__u64 h = 0;

	if (!iph)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	hlen = iph->ihl * 4;
	if (iph->version != 4 || hlen < sizeof(*iph))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	/* Options: skip them, bounded once. */
	if (hlen > sizeof(*iph) && !take(c, hlen - sizeof(*iph)))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	/* The datagram must be all here: a truncated one is never forwarded. */
	if (bpf_ntohs(iph->tot_len) < hlen || bpf_ntohs(iph->tot_len) > (__u32)(c->end - (void *)iph))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	p->family = LB_FAMILY_V4;
	p->l3len = bpf_ntohs(iph->tot_len);
	p->tos = iph->tos;
	p->df = (iph->frag_off & bpf_htons(IP_DF)) != 0;
	/* A non-first fragment carries no ports: it is looked up as port 0, its fragment route. */
	fragment = (iph->frag_off & bpf_htons(IP_OFFSET)) != 0;
	if (iph->protocol == IPPROTO_ICMP && !fragment && !(iph->frag_off & bpf_htons(IP_MF)))
		return handle_icmp4(c, p, iph->daddr);
	if (iph->protocol != IPPROTO_TCP && iph->protocol != IPPROTO_UDP)
		return count(LB_STAT_PASSED, XDP_PASS);
	if (!fragment && parse_ports(c, iph->protocol, &ports, &tcp_flags) == L4_MALFORMED)
		return count(LB_DROP_MALFORMED, XDP_DROP);

	dst[0] = iph->daddr;
	svc = find_route(dst, key_tail(ports >> 16, iph->protocol, LB_FAMILY_V4));
	if (!svc)
		return count(LB_STAT_PASSED, XDP_PASS);
	/* Without ports, a fragment can only follow its client's address. */
	if (svc->hash_mode != LB_HASH_CLIENT_IP && fragment)
		return count(LB_DROP_FRAGMENT, XDP_DROP);
	/* A fragment without ports cannot be told apart from its flow's others: the table. */
	if (!fragment && (svc->hash_mode == LB_HASH_FLOW || (svc->flags & LB_SVC_CONNTRACK)))
		h = hash16_64((__u64)iph->saddr | (__u64)iph->daddr << 32, (__u64)ports | (__u64)iph->protocol << 32);
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash4(iph->saddr) : (__u32)h;
	if ((svc->flags & LB_SVC_CONNTRACK) && !fragment)
		return tracked(p, svc, h, iph->protocol, tcp_flags);
	return forward(p, svc);
}

/* IPv6: a fixed header followed directly by TCP, UDP or ICMPv6. Extension headers are not
 * parsed: such packets are not matched and pass to the kernel unchanged. */
static __always_inline int handle_ipv6(struct cursor *c, struct pkt *p)
{
	struct ipv6hdr *ip6 = take(c, sizeof(*ip6));
	const struct lb_service *svc;
	__u32 ports = 0, dst[4];
	__u8 tcp_flags = 0;
	__u64 l[5], h = 0;
	enum l4 l4;

	if (!ip6)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	if (ip6->version != 6 || bpf_ntohs(ip6->payload_len) > (__u32)(c->end - c->pos))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	p->family = LB_FAMILY_V6;
	p->l3len = sizeof(*ip6) + bpf_ntohs(ip6->payload_len);
	p->tos = bpf_ntohl(*(__be32 *)ip6) >> 20;
	p->df = 1;
	if (ip6->nexthdr == IPPROTO_ICMPV6_)
		return handle_icmp6(c, p, &ip6->daddr);
	l4 = parse_ports(c, ip6->nexthdr, &ports, &tcp_flags);
	if (l4 == L4_MALFORMED)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	if (l4 == L4_OTHER)
		return count(LB_STAT_PASSED, XDP_PASS);

	__builtin_memcpy(dst, &ip6->daddr, 16);
	svc = find_route(dst, key_tail(ports >> 16, ip6->nexthdr, LB_FAMILY_V6));
	if (!svc)
		return count(LB_STAT_PASSED, XDP_PASS);
	__builtin_memcpy(l, &ip6->saddr, 32); /* source, then destination: lanes 0-3 */
	if (svc->hash_mode == LB_HASH_FLOW || (svc->flags & LB_SVC_CONNTRACK)) {
		l[4] = (__u64)ports | (__u64)ip6->nexthdr << 32;
		h = hash40_64(l);
	}
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash16(l[0], l[1]) : (__u32)h;
	if (svc->flags & LB_SVC_CONNTRACK)
		return tracked(p, svc, h, ip6->nexthdr, tcp_flags);
	return forward(p, svc);
}

SEC("xdp")
int lb_xdp(struct xdp_md *ctx)
{
	struct cursor c = { .pos = (void *)(long)ctx->data, .end = (void *)(long)ctx->data_end };
	struct pkt p = { .ctx = ctx, .bytes = c.end - c.pos, .l2len = sizeof(struct ethhdr) };
	__u16 proto;

	p.eth = take(&c, sizeof(*p.eth));
	if (!p.eth)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	proto = p.eth->h_proto;
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		struct vlan_hdr *vh = take(&c, sizeof(*vh));

		if (!vh)
			return count(LB_DROP_MALFORMED, XDP_DROP);
		proto = vh->h_vlan_encapsulated_proto;
		p.l2len += sizeof(*vh);
	}
	if (proto == bpf_htons(ETH_P_IP))
		return handle_ipv4(&c, &p);
	if (proto == bpf_htons(ETH_P_IPV6))
		return handle_ipv6(&c, &p);
	return count(LB_STAT_PASSED, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
