/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* "Fragmentation needed" (ICMP type 3 code 4) and "packet too big" (ICMPv6 type 2), built in
 * place from a client's packet that would exceed the interface's MTU once encapsulated, and sent
 * back to the client from the VIP with XDP_TX. The client's stack then lowers its path MTU for
 * the VIP and sends smaller packets. Rare by nature (once per client and path), so these use a
 * checksum loop rather than anything clever. */
#ifndef LB_ICMP_H
#define LB_ICMP_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lb.h"
#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "icmp_map.h"

#define ICMP_DEST_UNREACH_ 3
#define ICMP_FRAG_NEEDED_ 4
#define ICMPV6_DEST_UNREACH_ 1
#define ICMPV6_PKT_TOOBIG_ 2

/* The smallest MTU an answer may advertise. IPv6: 1280, the minimum link MTU (RFC 8200); a
 * smaller one is ignored by the client (RFC 8201 section 4), so the answer would only cost a
 * packet. IPv4: 68, the size every IPv4 module must pass unfragmented (RFC 791; RFC 1191 says a
 * host never lowers its path MTU estimate below it). Not 576: that is what a host must accept
 * reassembled, not what a link must carry, and links below 576 exist (lb's own MTU path does not
 * reach 68 unless the interface's MTU is below 88, itself below IPv4's minimum). Below these
 * the packet is dropped, counted (too_big_below_min). */
#define LB_MIN_MTU4 68
#define LB_MIN_MTU6 1280

/* The too-big answers' rate limits. An attacker sending full-size packets with spoofed sources
 * would otherwise make lb send one ICMP error for each (to the spoofed victims) at line rate;
 * past a limit the packet is dropped, counted (too_big_limited). Two limits:
 * - per source prefix (an IPv4 /24, an IPv6 /48: what one client or one attacker is likely to
 *   hold whole): at most LB_TOO_BIG_SRC_BURST at once, refilled at LB_TOO_BIG_SRC_PER_SEC, so
 *   that one flooding prefix cannot use up the answers every real client needs (PMTUD would
 *   otherwise be a black hole for everyone);
 * - global, shared by every CPU (not one bucket each, which would scale the cap with the
 *   machine): at most LB_TOO_BIG_BURST at once, refilled at LB_TOO_BIG_PER_SEC, the bound on
 *   what many spoofed prefixes can reflect.
 * A client that meets a limit loses that packet and retransmits it, and is answered then. */
#ifndef LB_TOO_BIG_PER_SEC
#define LB_TOO_BIG_PER_SEC 1000
#endif
#ifndef LB_TOO_BIG_BURST
#define LB_TOO_BIG_BURST 100
#endif
#ifndef LB_TOO_BIG_SRC_PER_SEC
#define LB_TOO_BIG_SRC_PER_SEC 10
#endif
#ifndef LB_TOO_BIG_SRC_BURST
#define LB_TOO_BIG_SRC_BURST 8
#endif
#define LB_TOO_BIG_GAP_NS (1000000000ull / LB_TOO_BIG_PER_SEC)
#define LB_TOO_BIG_SRC_GAP_NS (1000000000ull / LB_TOO_BIG_SRC_PER_SEC)

/* Takes one answer from the bucket at `full_at`, shared by every CPU: a compare-and-swap, tried
 * a few times against other CPUs' updates (losing every time counts as limited). 0 if empty. */
static __always_inline int bucket_take(__u64 *full_at, __u64 now, __u64 gap, __u64 burst)
{
	for (int i = 0; i < 4; i++) {
		__u64 old = *(volatile __u64 *)full_at;
		__u64 at = old > now ? old : now;

		if (at - now > (burst - 1) * gap)
			return 0;
		if (__sync_val_compare_and_swap(full_at, old, at + gap) == old)
			return 1;
	}
	return 0;
}

/* Takes one answer for the packet's source prefix, then from the global bucket; 0 if either
 * is empty. */
static __always_inline int too_big_allowed(struct pkt *p)
{
	void *data = (void *)(long)p->ctx->data;
	void *end = (void *)(long)p->ctx->data_end;
	struct too_big_source key = { .family = p->family };
	__u64 now = bpf_ktime_get_ns(), *full_at;
	__u32 zero = 0;

	if (p->family == LB_FAMILY_V4) {
		struct iphdr *ip = data + (p->l2len == 18 ? 18 : 14);

		if ((void *)(ip + 1) > end)
			return 0;
		__builtin_memcpy(key.prefix, &ip->saddr, 3);
	} else {
		struct ipv6hdr *ip6 = data + (p->l2len == 18 ? 18 : 14);

		if ((void *)(ip6 + 1) > end)
			return 0;
		__builtin_memcpy(key.prefix, &ip6->saddr, 6);
	}
	full_at = bpf_map_lookup_elem(&too_big_sources, &key);
	if (!full_at) {
		/* First answer to this prefix: its bucket starts full, less this one. */
		__u64 first = now + LB_TOO_BIG_SRC_GAP_NS;

		if (bpf_map_update_elem(&too_big_sources, &key, &first, BPF_NOEXIST))
			full_at = bpf_map_lookup_elem(&too_big_sources, &key);
		if (full_at && !bucket_take(full_at, now, LB_TOO_BIG_SRC_GAP_NS, LB_TOO_BIG_SRC_BURST))
			return 0;
	} else if (!bucket_take(full_at, now, LB_TOO_BIG_SRC_GAP_NS, LB_TOO_BIG_SRC_BURST)) {
		return 0;
	}
	full_at = bpf_map_lookup_elem(&too_big_bucket, &zero);
	if (!full_at)
		return 0;
	return bucket_take(full_at, now, LB_TOO_BIG_GAP_NS, LB_TOO_BIG_BURST);
}

/* IPv6: how much of the client's packet the answer quotes (its headers, which is what the
 * client's stack needs to find the connection; RFC 4443 allows any amount up to 1280 bytes). */
#define LB_TOOBIG6_QUOTE 192

/* The L2 header of the frame: what an answer or an encapsulated frame keeps of it. */
struct l2_saved {
	__u8 peer[6]; /* the frame's source MAC */
	__u32 tag;    /* the 802.1Q/802.1ad tag (TPID and TCI, as in the frame), if l2len is 18 */
};

static __always_inline void l2_save(const struct pkt *p, struct l2_saved *s)
{
	void *data = (void *)(long)p->ctx->data;
	void *end = (void *)(long)p->ctx->data_end;

	if (data + 18 <= end && p->l2len == 18)
		s->tag = *(__u32 *)(data + 12);
	__builtin_memcpy(s->peer, p->eth->h_source, 6);
}

/* Writes the L2 header at the start of the frame: MACs, the tag kept, ethertype. Returns the
 * start of the L3 header, or NULL if the frame is shorter than `need` bytes past it. */
static __always_inline void *l2_write(struct xdp_md *ctx, __u32 l2len, const __u8 *dst, const __u8 *src,
				      __u32 tag, __u16 ethertype_be, __u32 need)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	void *l3;

	if (l2len == 18) {
		l3 = data + 18;
		if (l3 + need > end)
			return NULL;
		*(__u32 *)(data + 12) = tag;
		*(__u16 *)(data + 16) = ethertype_be;
	} else {
		l3 = data + 14;
		if (l3 + need > end)
			return NULL;
		*(__u16 *)(data + 12) = ethertype_be;
	}
	__builtin_memcpy(data, dst, 6);
	__builtin_memcpy(data + 6, src, 6);
	return l3;
}

/* IPv4: the client's packet (at p, DF set) becomes "fragmentation needed, next-hop MTU `mtu`",
 * from the VIP to the client, quoting the client's IP header and the first 8 bytes after it. */
static __always_inline int too_big4(struct pkt *p, __u32 mtu)
{
	struct xdp_md *ctx = p->ctx;
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 l2len = p->l2len == 18 ? 18 : 14;
	struct iphdr *in = data + l2len;
	struct l2_saved l2 = {};
	struct iphdr *ip;
	struct icmphdr *ic;
	__be32 client, vip;
	__u32 hlen, len;

	if ((void *)(in + 1) > end)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	hlen = in->ihl * 4;
	if (hlen < 20 || hlen > 60)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	client = in->saddr;
	vip = in->daddr;
	l2_save(p, &l2);
	/* Room for the new IP and ICMP headers in front: the client's IP header then lies right
	 * behind them, where the quote belongs. */
	if (bpf_xdp_adjust_head(ctx, -(int)(sizeof(struct iphdr) + sizeof(struct icmphdr))))
		return count(LB_DROP_ENCAP, XDP_DROP);
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	len = l2len + sizeof(struct iphdr) + sizeof(struct icmphdr) + hlen + 8;
	if (bpf_xdp_adjust_tail(ctx, (int)len - (int)(end - data)))
		return count(LB_DROP_ENCAP, XDP_DROP);
	ip = l2_write(ctx, l2len, l2.peer, lb_settings.ifmac, l2.tag, bpf_htons(ETH_P_IP),
		      sizeof(*ip) + sizeof(*ic));
	if (!ip)
		return count(LB_DROP_ENCAP, XDP_DROP);
	end = (void *)(long)ctx->data_end;
	ic = (void *)(ip + 1);
	*(__u8 *)ip = 0x45;
	ip->tos = 0;
	ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(*ic) + hlen + 8);
	ip->id = 0;
	ip->frag_off = 0;
	ip->ttl = 64;
	ip->protocol = IPPROTO_ICMP;
	ip->check = 0;
	ip->saddr = vip;
	ip->daddr = client;
	ip->check = ipv4_csum(ip);
	ic->type = ICMP_DEST_UNREACH_;
	ic->code = ICMP_FRAG_NEEDED_;
	ic->checksum = 0;
	ic->un.frag.__unused = 0;
	ic->un.frag.mtu = bpf_htons(mtu);
	ic->checksum = csum_fold(csum_add_region(0, ic, end, sizeof(*ic) + hlen + 8));
	return count(LB_STAT_TOO_BIG, XDP_TX);
}

/* IPv6: the client's packet becomes "packet too big, MTU `mtu`", from the VIP to the client,
 * quoting up to LB_TOOBIG6_QUOTE bytes of it. */
static __always_inline int too_big6(struct pkt *p, __u32 mtu)
{
	struct xdp_md *ctx = p->ctx;
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 l2len = p->l2len == 18 ? 18 : 14;
	struct ipv6hdr *in = data + l2len;
	struct l2_saved l2 = {};
	struct in6_addr client, vip;
	struct ipv6hdr *ip;
	struct icmp6hdr *ic;
	__u32 quote, len;
	__u64 sum = 0;

	if ((void *)(in + 1) > end)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	client = in->saddr;
	vip = in->daddr;
	quote = p->l3len < LB_TOOBIG6_QUOTE ? p->l3len & ~1u : LB_TOOBIG6_QUOTE;
	l2_save(p, &l2);
	if (bpf_xdp_adjust_head(ctx, -(int)(sizeof(struct ipv6hdr) + sizeof(struct icmp6hdr))))
		return count(LB_DROP_ENCAP, XDP_DROP);
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	len = l2len + sizeof(struct ipv6hdr) + sizeof(struct icmp6hdr) + quote;
	if (bpf_xdp_adjust_tail(ctx, (int)len - (int)(end - data)))
		return count(LB_DROP_ENCAP, XDP_DROP);
	ip = l2_write(ctx, l2len, l2.peer, lb_settings.ifmac, l2.tag, bpf_htons(ETH_P_IPV6),
		      sizeof(*ip) + sizeof(*ic));
	if (!ip)
		return count(LB_DROP_ENCAP, XDP_DROP);
	end = (void *)(long)ctx->data_end;
	ic = (void *)(ip + 1);
	*(__be32 *)ip = bpf_htonl(0x60000000);
	ip->payload_len = bpf_htons(sizeof(*ic) + quote);
	ip->nexthdr = IPPROTO_ICMPV6_;
	ip->hop_limit = 64;
	ip->saddr = vip;
	ip->daddr = client;
	ic->icmp6_type = ICMPV6_PKT_TOOBIG_;
	ic->icmp6_code = 0;
	ic->icmp6_cksum = 0;
	ic->icmp6_dataun.un_data32[0] = bpf_htonl(mtu);
	/* The pseudo-header: both addresses, the upper-layer length, the next header. */
	sum = csum_add_region(sum, &ip->saddr, end, 32);
	sum += bpf_htons(sizeof(*ic) + quote);
	sum += bpf_htons(IPPROTO_ICMPV6_);
	sum = csum_add_region(sum, ic, end, sizeof(*ic) + quote);
	ic->icmp6_cksum = csum_fold(sum);
	return count(LB_STAT_TOO_BIG, XDP_TX);
}

/* A packet that is too long for the interface once encapsulated: tell the client (IPv4 with
 * DF, IPv6), or drop it (IPv4 that routers may fragment; an ICMP error, never answered with
 * another; an MTU below the protocol's minimum; past the answers' rate limit). `mtu` is what the
 * client may send. */
static __always_inline int too_big(struct pkt *p, __u32 mtu)
{
	if (p->icmp || !p->df)
		return count(LB_DROP_OVERSIZE, XDP_DROP);
	if (mtu < (p->family == LB_FAMILY_V4 ? LB_MIN_MTU4 : LB_MIN_MTU6))
		return count(LB_DROP_TOO_BIG_BELOW_MIN, XDP_DROP);
	if (!too_big_allowed(p))
		return count(LB_DROP_TOO_BIG_LIMITED, XDP_DROP);
	if (p->family == LB_FAMILY_V4)
		return too_big4(p, mtu);
	return too_big6(p, mtu);
}

#endif /* LB_ICMP_H */
