// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* The backend side of encapsulated forwarding (`lb decap IFACE`), for hosts whose kernel has no
 * ipip/ip6tnl/fou driver: an IPIP (protocol 4 or 41) or GUE (UDP to the configured port, version
 * 0 with inner protocol 4 or 41, or version 1 "direct IP") packet addressed to one of this host's
 * addresses loses its outer headers here and goes on to the kernel's stack as the inner packet,
 * unchanged. Everything else passes untouched. An encapsulated packet for this host that is cut
 * short or inconsistent (bad outer checksum or lengths, inner header missing) is dropped and
 * counted: decapsulating it would hand the stack something the outer checks did not vouch for.
 *
 * Unwrapping happens before netfilter sees the packet, so no firewall rule can stand between a
 * tunnel and the stack: this program is the only gate. Two checks make it one. The outer source
 * must be in allow_from (the load balancers' encapsulation sources), else anyone who reaches the
 * host could hand it a packet with any inner source; and the inner destination must be one of
 * this host's addresses (a VIP on its loopback), else a host that forwards would route the
 * inner packet on into the network behind it. Either failure is dropped and counted apart.
 *
 * The outer header's ECN field is not thrown away with it (RFC 6040, section 4.2): lb copies a
 * packet's ECN field to the outer header it adds, so a router between lb and this host that is
 * congested marks the outer header CE, and that mark must reach the inner packet's receiver.
 *
 * Second chance (`lb decap --second-chance`): a GUE packet from lb may carry a hop list (lb.h,
 * struct lb_gue_hops), the other backends that may hold its connection. A TCP packet that is
 * not a SYN, for which this host has no socket and which is not the ACK of one of its SYN
 * cookies, goes on to the next hop instead of being unwrapped: the outer header re-addressed
 * from this host to the hop, the list's index advanced, out through the route to it
 * (bpf_fib_lookup) to its next hop's MAC. The list only shrinks, so a packet cannot loop; the
 * last backend delivers it whatever it finds. Only packets that passed the checks above are
 * sent on, so the allow-list guards them too. The code is second_chance.h's. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lb.h"
#include "parse.h"
#include "csum.h"
#include "decap_maps.h"

#include "second_chance.h"

/* ECN codepoints (the low two bits of the IPv4 TOS and of the IPv6 traffic class). */
#define ECN_NOT_ECT 0
#define ECN_ECT1 1
#define ECN_ECT0 2
#define ECN_CE 3

/* RFC 6040, section 4.2 (the table in figure 4): the ECN field the inner header leaves with,
 * given the arriving outer and inner fields; -1: drop. A CE mark on the outer header is copied
 * in; a CE mark on a packet whose sender does not do ECN (inner Not-ECT) cannot be passed on and
 * means congestion, so the packet is dropped, as a router would have dropped it; ECT(1) outside
 * ECT(0) inside becomes ECT(1). Everything else keeps the inner field. */
static __always_inline int ecn_decap(__u8 outer, __u8 inner)
{
	if (outer == ECN_CE)
		return inner == ECN_NOT_ECT ? -1 : ECN_CE;
	if (outer == ECN_ECT1 && inner == ECN_ECT0)
		return ECN_ECT1;
	return inner;
}

/* Whether the fields are a combination the RFC marks "(!!!)" and asks to be logged (its CE over
 * Not-ECT is ecn_decap()'s drop): decapsulated as the table says, and counted. */
static __always_inline int ecn_anomalous(__u8 outer, __u8 inner)
{
	return (inner == ECN_NOT_ECT && (outer == ECN_ECT0 || outer == ECN_ECT1)) || (inner == ECN_CE && outer == ECN_ECT1);
}

/* What follows the outer IP header: how many more bytes to strip and the inner family.
 * Returns 1 (decapsulate), 0 (not ours: pass) or -1 (ours but malformed: drop). */
static __always_inline int inner_of(struct cursor *c, __u8 proto, __u32 *strip, __u8 *family, __u8 outer, void *data, struct hops_at *hops)
{
	if (proto == IPPROTO_IPIP_ || proto == IPPROTO_IPV6_) {
		*family = proto == IPPROTO_IPIP_ ? LB_FAMILY_V4 : LB_FAMILY_V6;
		return 1;
	}
	if (proto == IPPROTO_UDP) {
		struct udphdr *udp = take(c, sizeof(*udp));
		__u8 *first;

		if (!udp)
			return 0;
		if (udp->dest != gue_port)
			return 0;
		if (bpf_ntohs(udp->len) < sizeof(*udp) + 1 || bpf_ntohs(udp->len) > (__u32)(c->end - (void *)udp))
			return -1;
		*strip += sizeof(*udp);
		first = take(c, 1);
		if (!first)
			return -1;
		c->pos = first;
		switch (*first >> 6) {
		case 1: /* version 1: the inner IP packet itself; its version nibble says which */
			if ((*first >> 4) == 4)
				*family = LB_FAMILY_V4;
			else if ((*first >> 4) == 6)
				*family = LB_FAMILY_V6;
			else
				return -1;
			return 1;
		case 0: { /* version 0: a 4-byte header, hlen words of options, inner protocol */
			__u8 *h = take(c, 4);
			__u32 hlen;

			if (!h)
				return -1;
			if (h[0] & 0x20) /* a control message: for the stack, not a packet to unwrap */
				return 0;
			if (h[1] == IPPROTO_IPIP_)
				*family = LB_FAMILY_V4;
			else if (h[1] == IPPROTO_IPV6_)
				*family = LB_FAMILY_V6;
			else
				return 0;
			hlen = (h[0] & 0x1f) * 4;
			if (hlen && !take(c, hlen))
				return -1;
			*strip += 4 + hlen;
			/* No flags: the options are all private data, which may be a hop list whose
			 * size is exactly the header's; anything else is skipped. */
			if (second_chance && hlen >= sizeof(struct lb_gue_hops) && h[2] == 0 && h[3] == 0) {
				struct lb_gue_hops *gh = (void *)(h + 4);
				__u32 each = outer == LB_FAMILY_V4 ? 4 : 16;
				__u16 type = outer == LB_FAMILY_V4 ? LB_GUE_HOPS_V4 : LB_GUE_HOPS_V6;

				if ((void *)(gh + 1) > c->end)
					return -1;
				if (bpf_ntohs(gh->type) == type && gh->count <= LB_GUE_MAX_HOPS &&
				    hlen == sizeof(*gh) + gh->count * each) {
					hops->off = (void *)gh - data;
					hops->next = gh->next;
					hops->count = gh->count;
				}
			}
			return 1;
		}
		default:
			return -1;
		}
	}
	return 0;
}

/* Whether the inner packet (at `inner`, of `family`) may be unwrapped: its header all there, of
 * the family the outer headers promised, and for this host. -1 when so; else the XDP action,
 * counted. */
static __always_inline int inner_for_here(void *inner, void *end, __u8 family)
{
	if (family == LB_FAMILY_V4) {
		struct iphdr *in = inner;
		__u32 d[4] = {};

		if ((void *)(in + 1) > end || in->version != 4 || in->ihl < 5)
			return dcount(LB_DECAP_MALFORMED, XDP_DROP);
		d[0] = in->daddr;
		if (!is_local(d, LB_FAMILY_V4))
			return dcount(LB_DECAP_NOT_LOCAL, XDP_DROP);
	} else {
		struct ipv6hdr *in = inner;
		__u32 d[4];

		if ((void *)(in + 1) > end || in->version != 6)
			return dcount(LB_DECAP_MALFORMED, XDP_DROP);
		__builtin_memcpy(d, &in->daddr, 16);
		if (!is_local(d, LB_FAMILY_V6))
			return dcount(LB_DECAP_NOT_LOCAL, XDP_DROP);
	}
	return -1;
}

/* The inner header's ECN field as RFC 6040 leaves it (an IPv4 header's checksum updated):
 * -1 when the packet goes on, *anomaly set for a combination to log; else the XDP action
 * (dropped, counted: CE over Not-ECT, or the header cut short). */
static __always_inline int ecn_leave(void *inner, void *end, __u8 family, __u8 outer_ecn, int *anomaly)
{
	int ecn;

	if (family == LB_FAMILY_V4) {
		struct iphdr *in = inner;

		if ((void *)(in + 1) > end)
			return dcount(LB_DECAP_MALFORMED, XDP_DROP);
		*anomaly = ecn_anomalous(outer_ecn, in->tos & 3);
		ecn = ecn_decap(outer_ecn, in->tos & 3);
		if (ecn < 0)
			return dcount(LB_DECAP_CE_NOT_ECT, XDP_DROP);
		if (ecn != (in->tos & 3)) {
			/* The checksum covers the TOS: RFC 1624's update for the one 16-bit word that
			 * changes (version and header length, TOS). */
			__u16 old = bpf_ntohs(*(__be16 *)in), new = (old & ~3) | ecn;
			__u32 sum = (__u16)~bpf_ntohs(in->check) + (__u16)~old + new;

			sum = (sum & 0xffff) + (sum >> 16);
			sum = (sum & 0xffff) + (sum >> 16);
			in->tos = (in->tos & ~3) | ecn;
			in->check = bpf_htons(~sum & 0xffff);
		}
	} else {
		struct ipv6hdr *in = inner;

		if ((void *)(in + 1) > end)
			return dcount(LB_DECAP_MALFORMED, XDP_DROP);
		*anomaly = ecn_anomalous(outer_ecn, (((__u8 *)in)[1] >> 4) & 3);
		ecn = ecn_decap(outer_ecn, (((__u8 *)in)[1] >> 4) & 3);
		if (ecn < 0)
			return dcount(LB_DECAP_CE_NOT_ECT, XDP_DROP);
		((__u8 *)in)[1] = (((__u8 *)in)[1] & ~0x30) | (ecn << 4);
	}
	return -1;
}

/* Strips the `strip` bytes of outer headers that follow the frame's L2 header (`l2len` bytes:
 * 14, or 18 with the VLAN tag `tag`), keeps its MACs and tag, names the inner family in it, and
 * hands the inner packet to the stack. */
static __always_inline int unwrap(struct xdp_md *ctx, __u32 l2len, __u32 strip, __u8 family, __u32 tag, int anomaly)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	__u8 macs[12];
	__u16 proto;

	if (data + 12 > end)
		return dcount(LB_DECAP_MALFORMED, XDP_DROP);
	__builtin_memcpy(macs, data, 12);
	if (bpf_xdp_adjust_head(ctx, (int)strip))
		return dcount(LB_DECAP_MALFORMED, XDP_DROP);
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (data + 18 > end)
		return dcount(LB_DECAP_MALFORMED, XDP_DROP);
	__builtin_memcpy(data, macs, 12);
	proto = family == LB_FAMILY_V4 ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);
	if (l2len == 18) {
		*(__u32 *)(data + 12) = tag;
		*(__u16 *)(data + 16) = proto;
	} else {
		*(__u16 *)(data + 12) = proto;
	}
	if (anomaly)
		dcount(LB_DECAP_ECN_ANOMALY, 0);
	return dcount(LB_DECAP_DONE, XDP_PASS);
}

SEC("xdp")
int lb_decap(struct xdp_md *ctx)
{
	struct cursor c = { .pos = (void *)(long)ctx->data, .end = (void *)(long)ctx->data_end };
	__u32 l2len = sizeof(struct ethhdr), strip, a[4] = {}, tag = 0;
	__u8 family = 0, outer = 0, outer_ecn;
	struct hops_at hops = {};
	struct ethhdr *eth;
	void *l3;
	__u16 proto;
	int verdict, anomaly = 0;

	eth = take(&c, sizeof(*eth));
	if (!eth)
		return dcount(LB_DECAP_PASSED, XDP_PASS);
	proto = eth->h_proto;
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		struct vlan_hdr *vh = take(&c, sizeof(*vh));

		if (!vh)
			return dcount(LB_DECAP_PASSED, XDP_PASS);
		tag = *(__u32 *)((void *)eth + 12);
		proto = vh->h_vlan_encapsulated_proto;
		l2len += sizeof(*vh);
	}
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = take(&c, sizeof(*ip));
		__u32 hlen;

		if (!ip || ip->version != 4 || ip->ihl != 5)
			return dcount(LB_DECAP_PASSED, XDP_PASS); /* options: never ours, lb sends none */
		if (ip->protocol != IPPROTO_IPIP_ && ip->protocol != IPPROTO_IPV6_ && ip->protocol != IPPROTO_UDP)
			return dcount(LB_DECAP_PASSED, XDP_PASS);
		/* Fragments go to the stack, which reassembles (and, with no tunnel driver, drops). */
		if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return dcount(LB_DECAP_PASSED, XDP_PASS);
		a[0] = ip->daddr;
		if (!is_local(a, LB_FAMILY_V4))
			return dcount(LB_DECAP_PASSED, XDP_PASS);
		hlen = sizeof(*ip);
		strip = hlen;
		outer = LB_FAMILY_V4;
		verdict = inner_of(&c, ip->protocol, &strip, &family, outer, (void *)eth, &hops);
		if (verdict == 0)
			return dcount(LB_DECAP_PASSED, XDP_PASS);
		a[0] = ip->saddr;
		if (!is_allowed(a, LB_FAMILY_V4))
			return dcount(LB_DECAP_NOT_ALLOWED, XDP_DROP);
		if (verdict < 0 || ipv4_csum_ok(ip) == 0 || bpf_ntohs(ip->tot_len) > (__u32)(c.end - (void *)ip) ||
		    bpf_ntohs(ip->tot_len) < strip)
			return dcount(LB_DECAP_MALFORMED, XDP_DROP);
		outer_ecn = ip->tos & 3;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = take(&c, sizeof(*ip6));

		if (!ip6 || ip6->version != 6)
			return dcount(LB_DECAP_PASSED, XDP_PASS);
		if (ip6->nexthdr != IPPROTO_IPIP_ && ip6->nexthdr != IPPROTO_IPV6_ && ip6->nexthdr != IPPROTO_UDP)
			return dcount(LB_DECAP_PASSED, XDP_PASS);
		__builtin_memcpy(a, &ip6->daddr, 16);
		if (!is_local(a, LB_FAMILY_V6))
			return dcount(LB_DECAP_PASSED, XDP_PASS);
		strip = sizeof(*ip6);
		outer = LB_FAMILY_V6;
		verdict = inner_of(&c, ip6->nexthdr, &strip, &family, outer, (void *)eth, &hops);
		if (verdict == 0)
			return dcount(LB_DECAP_PASSED, XDP_PASS);
		__builtin_memcpy(a, &ip6->saddr, 16);
		if (!is_allowed(a, LB_FAMILY_V6))
			return dcount(LB_DECAP_NOT_ALLOWED, XDP_DROP);
		if (verdict < 0 || sizeof(*ip6) + bpf_ntohs(ip6->payload_len) > (__u32)(c.end - (void *)ip6) ||
		    sizeof(*ip6) + bpf_ntohs(ip6->payload_len) < strip)
			return dcount(LB_DECAP_MALFORMED, XDP_DROP);
		/* The traffic class straddles the first two bytes; its ECN bits are 0x30 of the second. */
		outer_ecn = (((__u8 *)ip6)[1] >> 4) & 3;
	} else {
		return dcount(LB_DECAP_PASSED, XDP_PASS);
	}

	/* The inner header must be all there, and of the family the outer headers promised; and it
	 * must be for this host: unwrapped, it is not checked again before routing. */
	l3 = (void *)(long)ctx->data + l2len;
	verdict = inner_for_here(l3 + strip, c.end, family);
	if (verdict >= 0)
		return verdict;
	/* Second chance: a packet of no connection here goes on to the next hop of its list. */
	if (hops.off) {
		int act = second_chance_for(ctx, l2len, strip, family, outer, &hops);

		if (act >= 0)
			return act;
	}
	/* Read again: second chance may have looked the packet's socket up. */
	l3 = (void *)(long)ctx->data + l2len;
	verdict = ecn_leave(l3 + strip, (void *)(long)ctx->data_end, family, outer_ecn, &anomaly);
	if (verdict >= 0)
		return verdict;
	return unwrap(ctx, l2len, strip, family, tag, anomaly);
}

/* Run by user space through BPF_PROG_TEST_RUN, never attached: the kernel's jiffies and
 * monotonic clock at one moment (two runs apart give jiffies_hz), and whether conntrack's
 * lookup resolved. */
SEC("xdp")
int lb_decap_clock(struct xdp_md *ctx)
{
	clock_jiffies = bpf_jiffies64();
	clock_ns = bpf_ktime_get_ns();
	has_conntrack = bpf_ksym_exists(bpf_xdp_ct_lookup);
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
