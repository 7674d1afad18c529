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
 * service's destination table.
 *
 * This file holds the entry and the per-family handlers; each step lives in the header of its
 * concern: parse.h (headers and ports), route.h (service, slot, backend, send), hash.h (the flow
 * hash), flow.h (connection tracking), encap.h (IPIP/GUE), icmp.h ("too big" answers), csum.h,
 * and maps.h (the maps and counters). They are included in the order their names are used. */
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
#include "route.h"
#include "flow.h"

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
	/* The client's own packets: its port first, then the service's. */
	cports = qports >> 16 | qports << 16;
	l[0] = (__u64)q->daddr | (__u64)q->saddr << 32;
	l[1] = (__u64)cports | (__u64)q->protocol << 32;
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash4(q->daddr) : hash16(l[0], l[1]);
	return route_icmp(p, svc, flow_tag16(l[0], l[1]), q->protocol);
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
	cports = qports >> 16 | qports << 16;
	/* Lanes as the client's packets hash them: client, then VIP, then ports and protocol. */
	__builtin_memcpy(l, &q->daddr, 16);
	__builtin_memcpy(&l[2], dst, 16);
	l[4] = (__u64)cports | (__u64)q->nexthdr << 32;
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash16(l[0], l[1]) : hash40(l);
	return route_icmp(p, svc, flow_tag40(l), q->nexthdr);
}

/* IPv4: any header length (options skipped), the whole datagram present, TCP or UDP.
 * The flow hash input is documented in docs/data-plane.md ("Flow hash") and src/flowhash.rs. */
static __always_inline int handle_ipv4(struct cursor *c, struct pkt *p)
{
	struct iphdr *iph = take(c, sizeof(*iph));
	const struct lb_service *svc;
	__u32 hlen, ports = 0, dst[4] = {};
	__u8 tcp_flags = 0;
	int fragment;
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
	if (!fragment) {
		l[0] = (__u64)iph->saddr | (__u64)iph->daddr << 32;
		l[1] = (__u64)ports | (__u64)iph->protocol << 32;
	}
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash4(iph->saddr) : hash16(l[0], l[1]);
	if ((svc->flags & LB_SVC_CONNTRACK) && !fragment)
		return tracked(p, svc, flow_tag16(l[0], l[1]), iph->protocol, tcp_flags);
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
	__u64 l[5];
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
	l[4] = (__u64)ports | (__u64)ip6->nexthdr << 32;
	p->hash = svc->hash_mode == LB_HASH_CLIENT_IP ? hash16(l[0], l[1]) : hash40(l);
	if (svc->flags & LB_SVC_CONNTRACK)
		return tracked(p, svc, flow_tag40(l), ip6->nexthdr, tcp_flags);
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
