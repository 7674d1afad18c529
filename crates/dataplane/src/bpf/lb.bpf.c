// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* The XDP data plane: parse -> service -> hash -> slot -> backend -> forward.
 *
 * Forwarding is direct server return, per service: L2 (only the Ethernet addresses change) or
 * encapsulated (IPIP or GUE, encap.h) to a backend anywhere routable; either way the frame goes
 * back out of the interface it came in on (XDP_TX). Backends hold the VIP on their loopback and
 * answer clients directly. ICMP errors about a service's flows (a router on the way back to the
 * client saying "fragmentation needed") reach the backend that owns the flow. Well-formed traffic that is not for a service
 * leaves unchanged (XDP_PASS); malformed IP is dropped wherever it goes; everything that is for a
 * service but cannot be forwarded is dropped for a named, counted reason.
 * There are no rings, weights or searches here: the control plane compiled them into each
 * service's destination table.
 *
 * This file holds the entry and the per-family handlers; each step lives in the header of its
 * concern: parse.h (headers and ports), route.h (service, slot, backend, send), hash.h (the flow
 * hash), frag.h (fragments), flow.h (the flow tables), conntrack.h (connection tracking's
 * policy), quic.h (QUIC-LB connection-ID routing), probe.h (health probes through the data path), encap.h (IPIP/GUE), icmp.h ("too big"
 * answers), csum.h, and maps.h (the maps and counters); a concern's own maps are in its
 * *_map.h. Each header includes what it uses (crates/dataplane/tests/headers.rs compiles each
 * alone), so the order below is only for the reader. */
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
#include "frag.h"
#include "route.h"
#include "quic.h"
#include "flow.h"
#include "conntrack.h"
#include "probe.h"

/* ICMPv4 destination unreachable (any code) addressed to a VIP, quoting a packet that the VIP
 * sent to a client (a backend's reply): routed to that flow's backend. Anything else is passed. */
static __always_inline int handle_icmp4(struct cursor *c, struct pkt *p, __be32 outer_dst)
{
	struct icmphdr *ic = take(c, sizeof(*ic));
	const struct lb_service *svc;
	__u32 hlen, qports, cports, dst[4] = {};
	struct iphdr *q;
	__u64 l[2];
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
	if (p->refuse)
		return count(p->refuse, XDP_DROP);
	/* The client's own packets: its port first, then the service's. */
	cports = qports >> 16 | qports << 16;
	l[0] = (__u64)q->daddr | (__u64)q->saddr << 32;
	l[1] = (__u64)cports | (__u64)q->protocol << 32;
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash4(q->daddr) : hash16(l[0], l[1]);
	return to_backend(p, svc, route_icmp(p, svc, flow_tag16(l[0], l[1]), q->protocol));
}

/* ICMPv6 destination unreachable or packet too big, likewise. */
static __always_inline int handle_icmp6(struct cursor *c, struct pkt *p, const struct in6_addr *outer_dst)
{
	struct icmp6hdr *ic = take(c, sizeof(*ic));
	const struct lb_service *svc;
	__u32 qports, cports, dst[4];
	struct ipv6hdr *q;
	__u32 *ports;
	__u64 l[5];

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
	if (p->refuse)
		return count(p->refuse, XDP_DROP);
	cports = qports >> 16 | qports << 16;
	/* Lanes as the client's packets hash them: client, then VIP, then ports and protocol. */
	__builtin_memcpy(l, &q->daddr, 16);
	__builtin_memcpy(&l[2], dst, 16);
	l[4] = (__u64)cports | (__u64)q->nexthdr << 32;
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash16(l[0], l[1]) : hash40(l);
	return to_backend(p, svc, route_icmp(p, svc, flow_tag40(l), q->nexthdr));
}

/* IPv4: any header length (options skipped), the whole datagram present, TCP or UDP.
 * The flow hash input is documented in docs/data-plane.md ("Flow hash") and crates/core/src/flowhash.rs. */
static __always_inline int handle_ipv4(struct cursor *c, struct pkt *p)
{
	struct iphdr *iph = take(c, sizeof(*iph));
	const struct lb_service *svc;
	struct lb_frag_key *k;
	__u32 hlen, tot, ports = 0, ack = 0, dst[4] = {};
	__u8 tcp_flags = 0;
	int later, first;
	__u64 l[2] = {};

	if (!iph)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	hlen = iph->ihl * 4;
	if (iph->version != 4 || hlen < sizeof(*iph))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	/* Options: skip them, bounded once. */
	if (hlen > sizeof(*iph) && !take(c, hlen - sizeof(*iph)))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	/* The datagram must be all here: a truncated one is never forwarded. */
	tot = bpf_ntohs(iph->tot_len);
	if (tot < hlen || tot > (__u32)(c->end - (void *)iph))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	p->family = LB_FAMILY_V4;
	p->l3len = tot;
	p->tos = iph->tos;
	p->df = (iph->frag_off & bpf_htons(IP_DF)) != 0;
	later = (iph->frag_off & bpf_htons(IP_OFFSET)) != 0;
	first = !later && (iph->frag_off & bpf_htons(IP_MF));
	if (iph->protocol == IPPROTO_ICMP && !later && !first)
		return handle_icmp4(c, p, iph->daddr);
	if (iph->protocol != IPPROTO_TCP && iph->protocol != IPPROTO_UDP)
		return count(LB_STAT_PASSED, XDP_PASS);
	dst[0] = iph->daddr;
	/* A later fragment carries no ports. */
	if (later) {
		k = frag_key(&iph->saddr, dst, iph->id, iph->protocol, LB_FAMILY_V4);
		if (!k)
			return count(LB_DROP_FRAGMENT, XDP_DROP);
		return later_fragment(p, k, hash4(iph->saddr));
	}
	if (parse_ports(c, iph->protocol, &ports, &tcp_flags, &ack, tot - hlen) == L4_MALFORMED)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	/* Port 0 names a fragment route: only later fragments, which have no port, take it. */
	if ((ports >> 16) == 0)
		return count(LB_STAT_PASSED, XDP_PASS);
	svc = find_route(dst, key_tail(ports >> 16, iph->protocol, LB_FAMILY_V4));
	if (!svc)
		return count(LB_STAT_PASSED, XDP_PASS);
	if (p->refuse)
		return count(p->refuse, XDP_DROP);
	if (first) {
		p->frag = frag_key(&iph->saddr, dst, iph->id, iph->protocol, LB_FAMILY_V4);
		if (!p->frag)
			return count(LB_DROP_FRAGMENT, XDP_DROP);
		p->dport = ports >> 16;
		p->l4proto = iph->protocol;
	}
	l[0] = (__u64)iph->saddr | (__u64)iph->daddr << 32;
	l[1] = (__u64)ports | (__u64)iph->protocol << 32;
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash4(iph->saddr) : hash16(l[0], l[1]);
	if ((svc->flags & LB_SVC_QUIC_LB) && iph->protocol == IPPROTO_UDP) {
		__u32 id = quic_route(p->ctx, &svc->key, c->pos - (void *)(long)p->ctx->data, tot - hlen - sizeof(struct udphdr));

		if (id)
			return to_backend(p, svc, id);
	}
	if (svc->flags & LB_SVC_CONNTRACK) {
		__u32 id;

		if ((tcp_flags & TCP_FLAG_ACK) && (tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
			ct_quiet_end(p->hash, ack);
		id = by_stable_slot(p, svc, iph->protocol, tcp_flags);
		return to_backend(p, svc, id ? id : tracked(p, svc, flow_tag16(l[0], l[1]), iph->protocol, tcp_flags, ack));
	}
	return forward(p, svc);
}

/* IPv6: the fixed header, then up to LB_IPV6_EXT_MAX extension headers (hop-by-hop,
 * destination options, routing, fragment), then TCP, UDP or ICMPv6. A packet whose upper layer
 * lb cannot reach or must not balance (a routing header of type 0, or with segments left: the
 * destination is not the final one; AH; a longer chain) is dropped when its destination has
 * services, since its port is unknown, and passed otherwise. */
static __always_inline int handle_ipv6(struct cursor *c, struct pkt *p)
{
	struct ipv6hdr *ip6 = take(c, sizeof(*ip6));
	const struct lb_service *svc;
	struct lb_frag_key *k;
	__u32 ports = 0, ack = 0, dst[4], left;
	__u8 tcp_flags = 0, nh;
	struct ipv6_ext x;
	__u64 l[5];
	enum l4 l4;

	if (!ip6)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	left = bpf_ntohs(ip6->payload_len);
	if (ip6->version != 6 || left > (__u32)(c->end - c->pos))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	p->family = LB_FAMILY_V6;
	p->l3len = sizeof(*ip6) + left;
	p->tos = bpf_ntohl(*(__be32 *)ip6) >> 20;
	p->df = 1;
	x = parse_ipv6_ext(c, ip6->nexthdr, left);
	if (x.malformed)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	nh = x.nh;
	left = x.left;
	__builtin_memcpy(dst, &ip6->daddr, 16);
	if (x.odd) {
		if (!has_services(dst, LB_FAMILY_V6))
			return count(LB_STAT_PASSED, XDP_PASS);
		return count(p->refuse ? p->refuse : LB_DROP_EXT_HEADER, XDP_DROP);
	}
	__builtin_memcpy(l, &ip6->saddr, 32); /* source, then destination: lanes 0-3 */
	/* A later fragment, whatever its fragment header names next (TCP, UDP, or the first
	 * extension header of the fragmentable part): keyed by that, as its first fragment is. */
	if (x.frag == 2) {
		if (x.fnh != IPPROTO_TCP && x.fnh != IPPROTO_UDP && !ipv6_ext(x.fnh))
			return count(LB_STAT_PASSED, XDP_PASS);
		k = frag_key(&ip6->saddr, dst, x.id, x.fnh, LB_FAMILY_V6);
		if (!k)
			return count(LB_DROP_FRAGMENT, XDP_DROP);
		return later_fragment(p, k, hash16(l[0], l[1]));
	}
	if (ipv6_ext(nh)) {
		if (!has_services(dst, LB_FAMILY_V6))
			return count(LB_STAT_PASSED, XDP_PASS);
		return count(p->refuse ? p->refuse : LB_DROP_EXT_HEADER, XDP_DROP);
	}
	if (nh == IPPROTO_ICMPV6_ && x.frag == 0)
		return handle_icmp6(c, p, &ip6->daddr);
	if (nh != IPPROTO_TCP && nh != IPPROTO_UDP)
		return count(LB_STAT_PASSED, XDP_PASS);
	l4 = parse_ports(c, nh, &ports, &tcp_flags, &ack, left);
	if (l4 == L4_MALFORMED)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	if ((ports >> 16) == 0)
		return count(LB_STAT_PASSED, XDP_PASS);
	svc = find_route(dst, key_tail(ports >> 16, nh, LB_FAMILY_V6));
	if (!svc)
		return count(LB_STAT_PASSED, XDP_PASS);
	if (p->refuse)
		return count(p->refuse, XDP_DROP);
	if (x.frag == 1) {
		p->frag = frag_key(&ip6->saddr, dst, x.id, x.fnh, LB_FAMILY_V6);
		if (!p->frag)
			return count(LB_DROP_FRAGMENT, XDP_DROP);
		p->dport = ports >> 16;
		p->l4proto = nh;
	}
	l[4] = (__u64)ports | (__u64)nh << 32;
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash16(l[0], l[1]) : hash40(l);
	if ((svc->flags & LB_SVC_QUIC_LB) && nh == IPPROTO_UDP) {
		__u32 id = quic_route(p->ctx, &svc->key, c->pos - (void *)(long)p->ctx->data, left - sizeof(struct udphdr));

		if (id)
			return to_backend(p, svc, id);
	}
	if (svc->flags & LB_SVC_CONNTRACK) {
		__u32 id;

		if ((tcp_flags & TCP_FLAG_ACK) && (tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
			ct_quiet_end(p->hash, ack);
		id = by_stable_slot(p, svc, nh, tcp_flags);
		return to_backend(p, svc, id ? id : tracked(p, svc, flow_tag40(l), nh, tcp_flags, ack));
	}
	return forward(p, svc);
}

/* Whether the frame's destination MAC is `mac`. */
static __always_inline int mac_is(const __u8 *a, const __u8 *mac)
{
	return *(const __u32 *)a == *(const __u32 *)mac && *(const __u16 *)(a + 4) == *(const __u16 *)(mac + 4);
}

/* Frames: lb balances only what is sent to it, on its own segment. A frame for another host's
 * MAC (seen in promiscuous mode, on a bridge member) is passed unchanged, counted: that host, or
 * the bridge, deals with it. A broadcast or multicast frame, and a frame tagged with a VLAN
 * other than 0 (a priority tag keeps the frame on the untagged segment, as Linux has it), is
 * parsed like any other, passed when it is not for a service, and dropped for its reason when
 * it is: everything lb sends goes to neighbours resolved on this untagged interface. */
SEC("xdp")
int lb_xdp(struct xdp_md *ctx)
{
	struct cursor c = { .pos = (void *)(long)ctx->data, .end = (void *)(long)ctx->data_end };
	struct pkt p = { .ctx = ctx, .bytes = c.end - c.pos, .l2len = sizeof(struct ethhdr) };
	__u16 proto;
	int act;

	p.eth = take(&c, sizeof(*p.eth));
	if (!p.eth)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	if (!mac_is(p.eth->h_dest, lb_settings.ifmac)) {
		if (!(p.eth->h_dest[0] & 1))
			return count(LB_STAT_OTHER_HOST, XDP_PASS);
		p.refuse = LB_DROP_NOT_UNICAST;
	}
	proto = p.eth->h_proto;
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		struct vlan_hdr *vh = take(&c, sizeof(*vh));

		if (!vh)
			return count(LB_DROP_MALFORMED, XDP_DROP);
		if ((vh->h_vlan_TCI & bpf_htons(0x0fff)) && !p.refuse)
			p.refuse = LB_DROP_VLAN;
		proto = vh->h_vlan_encapsulated_proto;
		p.l2len += sizeof(*vh);
		/* A second tag (802.1ad in front of 802.1Q): never lb's segment, whatever its ids,
		 * but parsed, so that a packet for a service in it is dropped rather than passed. */
		if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
			vh = take(&c, sizeof(*vh));
			if (!vh)
				return count(LB_DROP_MALFORMED, XDP_DROP);
			if (!p.refuse)
				p.refuse = LB_DROP_VLAN;
			proto = vh->h_vlan_encapsulated_proto;
			p.l2len += sizeof(*vh);
		}
	}
	if (proto == bpf_htons(ETH_P_IP))
		act = handle_ipv4(&c, &p);
	else if (proto == bpf_htons(ETH_P_IPV6))
		act = handle_ipv6(&c, &p);
	else
		return count(LB_STAT_PASSED, XDP_PASS);
	if (act != LB_SEND)
		return act;
	return send(&p, p.svc, p.id);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
