/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Health probes that take the data path (`health_check: {via: vip}`, docs/operating.md).
 *
 * lb's prober connects to the service's VIP and port from the host's own stack, its socket
 * bound to the attached interface and its address, and marked LB_PROBE_MARK | backend id. The
 * packets leave by that interface (a policy rule, crates/dataplane/src/probe_path.rs) or, when
 * the VIP is one of the host's own addresses there, by the loopback device. This program, on
 * the egress of both (TCX), sends each one to the backend its mark names exactly as lb_xdp()
 * sends a client's packet of the service: L2 to the backend's MAC, or wrapped in IPIP or GUE
 * towards its address; and out of the attached interface.
 * The backend answers from the VIP to the host's address by direct return, which lb_xdp()
 * passes (not a service's destination), so the probe succeeds only when the whole path a
 * client's connection takes works: the tunnel, the backend's decapsulation, the VIP on its
 * loopback, a listener on the VIP, its firewall, its way back.
 *
 * Unmarked packets are none of its business and leave untouched. A marked packet this program
 * cannot send as the service would (no such service any more, a backend of another service, the
 * backend's MAC unknown, no room for the outer headers) is dropped and counted with the reason
 * lb_xdp() would give. */
#ifndef LB_PROBE_H
#define LB_PROBE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lb.h"
#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "encap.h"
#include "route.h"

/* TCX verdicts (linux/bpf.h, enum tcx_action_base), not in vmlinux.h on every kernel. */
#define LB_TCX_NEXT (-1)
#define LB_TCX_PASS 0
#define LB_TCX_DROP 2

/* The attached interface's index, written by user space: a probe to a VIP that is one of the
 * host's own addresses leaves by the loopback device, and is sent on from there. Never read by
 * lb_xdp(), never pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} probe_out SEC(".maps");

/* The verdict for a probe made ready on the device it is on: on with it where that is the
 * attached interface, redirected there where it is the loopback. The mark is cleared either
 * way, so that the redirected packet passes the interface's own egress untouched. */
static __always_inline int probe_send(struct __sk_buff *skb)
{
	__u32 zero = 0, *out = bpf_map_lookup_elem(&probe_out, &zero);

	skb->mark = 0;
	if (!out || *out == 0)
		return count(LB_DROP_ENCAP, LB_TCX_DROP);
	if (skb->ifindex == *out)
		return LB_TCX_PASS;
	return bpf_redirect(*out, 0);
}

/* What the ethernet header needs once a marked packet is sent towards backend `be`. */
static __always_inline int probe_l2(struct __sk_buff *skb, const struct lb_backend *be, __be16 proto)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > end)
		return count(LB_DROP_ENCAP, LB_TCX_DROP);
	mac_copy(eth->h_dest, be->mac);
	mac_copy(eth->h_source, lb_settings.ifmac);
	eth->h_proto = proto;
	return LB_TCX_PASS;
}

/* Wraps the marked packet (an IP packet of `family`, `l3len` bytes, TOS `tos`) for backend `id`
 * of `svc`, as encap() does for a client's: IPIP, or GUE version 1 on the service's port. */
static __always_inline int probe_encap(struct __sk_buff *skb, const struct lb_service *svc, __u32 id,
				       const struct lb_backend *be, __u8 family, __u32 l3len, __u8 tos)
{
	struct lb_addr *to = bpf_map_lookup_elem(&backend_addrs, &id);
	__u32 gue = svc->forward == LB_FWD_GUE ? sizeof(struct udphdr) : 0, outer, overhead;
	__u8 proto = outer_proto(svc->forward, family);
	__u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO;
	__u16 sport = 0xc000 | (bpf_get_hash_recalc(skb) & 0x3fff);
	void *data, *end;

	if (!to || (to->family != LB_FAMILY_V4 && to->family != LB_FAMILY_V6))
		return count(LB_DROP_ENCAP, LB_TCX_DROP);
	outer = to->family == LB_FAMILY_V4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
	overhead = outer + gue;
	flags |= to->family == LB_FAMILY_V4 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 : BPF_F_ADJ_ROOM_ENCAP_L3_IPV6;
	if (gue)
		flags |= BPF_F_ADJ_ROOM_ENCAP_L4_UDP;
	if (bpf_skb_adjust_room(skb, overhead, BPF_ADJ_ROOM_MAC, flags))
		return count(LB_DROP_ENCAP, LB_TCX_DROP);
	if (probe_l2(skb, be, bpf_htons(to->family == LB_FAMILY_V4 ? ETH_P_IP : ETH_P_IPV6)) != LB_TCX_PASS)
		return LB_TCX_DROP;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (to->family == LB_FAMILY_V4) {
		struct iphdr *ip = data + sizeof(struct ethhdr);
		struct udphdr *udp = (void *)(ip + 1);

		if ((void *)(udp + 1) > end)
			return count(LB_DROP_ENCAP, LB_TCX_DROP);
		*(__u8 *)ip = 0x45;
		ip->tos = tos;
		ip->tot_len = bpf_htons(l3len + overhead);
		ip->id = 0;
		ip->frag_off = bpf_htons(IP_DF);
		ip->ttl = 64;
		ip->protocol = proto;
		ip->check = 0;
		ip->saddr = lb_settings.encap_src4 & ~lb_settings.encap_src4_vary;
		ip->daddr = to->addr[0];
		ip->check = ipv4_csum(ip);
		if (gue)
			gue_header(udp, sport, svc->gue_port, l3len);
	} else {
		struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
		struct udphdr *udp = (void *)(ip6 + 1);

		if ((void *)(udp + 1) > end)
			return count(LB_DROP_ENCAP, LB_TCX_DROP);
		*(__be32 *)ip6 = bpf_htonl(0x60000000 | (__u32)tos << 20 | sport);
		ip6->payload_len = bpf_htons(l3len + gue);
		ip6->nexthdr = proto;
		ip6->hop_limit = 64;
		__builtin_memcpy(&ip6->saddr, lb_settings.encap_src6, 12);
		ip6->saddr.in6_u.u6_addr32[3] = lb_settings.encap_src6[3] & ~lb_settings.encap_src6_vary;
		__builtin_memcpy(&ip6->daddr, to->addr, 16);
		if (gue)
			gue_header(udp, sport, svc->gue_port, l3len);
	}
	return LB_TCX_PASS;
}

/* Whether backend `id` belongs to `svc` (backend_meta names its service). */
static __always_inline int of_service(__u32 id, const struct lb_service *svc)
{
	struct lb_backend_meta *m = bpf_map_lookup_elem(&backend_meta, &id);
	const __u32 *a, *b;

	if (!m)
		return 0;
	a = (const __u32 *)&m->service;
	b = (const __u32 *)&svc->key;
	return ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) | (a[4] ^ b[4])) == 0;
}

SEC("tcx/egress")
int lb_probe_out(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	const struct lb_service *svc;
	struct lb_backend *be;
	__u32 dst[4] = {}, id, l3len;
	__u16 dport;
	__u8 family, tos;

	if ((skb->mark & LB_PROBE_MARK_MASK) != LB_PROBE_MARK)
		return LB_TCX_NEXT;
	id = skb->mark & LB_SLOT_ID_MASK;
	if ((void *)(eth + 1) > end)
		return count(LB_DROP_MALFORMED, LB_TCX_DROP);
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		struct tcphdr *th = (void *)(ip + 1);

		/* The host's own TCP: no options, never a fragment. */
		if ((void *)(th + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_TCP)
			return count(LB_DROP_MALFORMED, LB_TCX_DROP);
		dst[0] = ip->daddr;
		dport = th->dest;
		family = LB_FAMILY_V4;
		l3len = bpf_ntohs(ip->tot_len);
		tos = ip->tos;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		struct tcphdr *th = (void *)(ip6 + 1);

		if ((void *)(th + 1) > end || ip6->nexthdr != IPPROTO_TCP)
			return count(LB_DROP_MALFORMED, LB_TCX_DROP);
		__builtin_memcpy(dst, &ip6->daddr, 16);
		dport = th->dest;
		family = LB_FAMILY_V6;
		l3len = sizeof(*ip6) + bpf_ntohs(ip6->payload_len);
		tos = (bpf_ntohl(*(__be32 *)ip6) >> 20) & 0xff;
	} else {
		return count(LB_DROP_MALFORMED, LB_TCX_DROP);
	}
	svc = find_route(dst, key_tail(dport, IPPROTO_TCP, family));
	if (!svc)
		return count(LB_DROP_NO_BACKEND, LB_TCX_DROP);
	/* Only a backend of this very service: a mark never sends a packet anywhere else. */
	if (!of_service(id, svc))
		return count(LB_DROP_NO_BACKEND, LB_TCX_DROP);
	be = bpf_map_lookup_elem(&backends, &id);
	if (!be || !(be->flags & LB_BACKEND_MAC_KNOWN))
		return count(LB_DROP_NO_MAC, LB_TCX_DROP);
	if (svc->forward == LB_FWD_L2) {
		if (probe_l2(skb, be, eth->h_proto) != LB_TCX_PASS)
			return LB_TCX_DROP;
	} else if (probe_encap(skb, svc, id, be, family, l3len, tos) != LB_TCX_PASS) {
		return LB_TCX_DROP;
	}
	return probe_send(skb);
}

#endif /* LB_PROBE_H */
