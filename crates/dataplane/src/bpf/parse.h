/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Packet parsing in cursor style: each header is taken with one bounds check, and a header that
 * is not all there is never read. Also the ports and TCP flags of a TCP or UDP header, and the
 * parsed packet the forwarding steps share. Shared by the balancer (lb.bpf.c) and the
 * backend-side decapsulation program (decap.bpf.c). */
#ifndef LB_PARSE_H
#define LB_PARSE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lb.h"

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8
#define IP_OFFSET 0x1FFF
#define IP_MF 0x2000
#define IP_DF 0x4000
/* Protocol numbers vmlinux.h lacks or has as enum constants (the underscore avoids a clash). */
#define IPPROTO_ICMPV6_ 58
#define IPPROTO_IPIP_ 4
#define IPPROTO_IPV6_ 41
#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_ACK 0x10
/* IPv6 extension headers lb walks (RFC 8200 section 4), and the others it knows by number so
 * that it never mistakes one for an upper-layer protocol. */
#define IPV6_HOPOPTS 0
#define IPV6_ROUTING 43
#define IPV6_FRAGMENT 44
#define IPV6_DSTOPTS 60
#define IPV6_AH 51
#define IPV6_NONXT 59
#define IPV6_MOBILITY 135
#define IPV6_HIP 139
#define IPV6_SHIM6 140
/* At most this many extension headers are walked before the upper-layer header: enough for
 * the longest legal chain RFC 8200 section 4.1 orders (hop-by-hop, destination options,
 * routing, fragment, destination options), with one to spare. */
#define LB_IPV6_EXT_MAX 6

struct cursor {
	void *pos;
	void *end;
};

/* Returns a pointer to `len` bytes at the cursor and advances past them, or NULL. */
static __always_inline void *take(struct cursor *c, __u32 len)
{
	void *p = c->pos;

	if (p + len > c->end)
		return NULL;
	c->pos = p + len;
	return p;
}

/* What parse_ports() found. */
enum l4 {
	L4_PORTS,     /* TCP or UDP, ports read */
	L4_OTHER,     /* another protocol: not ours */
	L4_MALFORMED, /* a TCP or UDP header that is not all there */
};

/* The ports of a TCP or UDP header, as the packet's bytes (network order), in one word:
 * source port in the low half, destination port in the high half (memory order); a TCP
 * header's flags and acknowledgment number (as the packet's bytes) too. `left`: the
 * bytes of the IP datagram from the cursor on, by its own length fields. The header must lie
 * inside the datagram, not merely inside the frame: Ethernet padding behind a short datagram
 * is not part of it and never supplies ports. */
static __always_inline enum l4 parse_ports(struct cursor *c, __u8 proto, __u32 *ports, __u8 *tcp_flags, __u32 *ack, __u32 left)
{
	if (proto == IPPROTO_TCP) {
		struct tcphdr *th = take(c, sizeof(*th));

		if (!th || th->doff < 5 || left < sizeof(*th))
			return L4_MALFORMED;
		*ports = *(__u32 *)th;
		*tcp_flags = ((__u8 *)th)[13];
		*ack = th->ack_seq;
		return L4_PORTS;
	}
	if (proto == IPPROTO_UDP) {
		struct udphdr *uh = take(c, sizeof(*uh));

		if (!uh || left < sizeof(*uh))
			return L4_MALFORMED;
		*ports = *(__u32 *)uh;
		return L4_PORTS;
	}
	return L4_OTHER;
}

/* Whether `nh` names an IPv6 extension header (rather than an upper-layer protocol). */
static __always_inline int ipv6_ext(__u8 nh)
{
	return nh == IPV6_HOPOPTS || nh == IPV6_ROUTING || nh == IPV6_FRAGMENT || nh == IPV6_DSTOPTS ||
	       nh == IPV6_AH || nh == IPV6_MOBILITY || nh == IPV6_HIP || nh == IPV6_SHIM6;
}

/* What parse_ipv6_ext() found behind an IPv6 header. */
struct ipv6_ext {
	__u32 left;     /* bytes of the payload from the cursor on */
	__be32 id;      /* a fragment header's identification */
	__u8 nh;        /* the next header after the last one walked */
	__u8 fnh;       /* a fragment header's own next header: the first header of the
			 * fragmentable part, what every fragment of the datagram carries (the key's
			 * protocol), where `nh` of a first fragment may be further on */
	__u8 frag;      /* 0: no fragment header (or an atomic fragment), 1: a first fragment,
			 * 2: a later one (the cursor is then in the middle of the datagram) */
	__u8 odd;       /* headers lb must not balance behind (see handle_ipv6()) */
	__u8 malformed; /* a header cut short or longer than the payload */
};

/* Walks up to LB_IPV6_EXT_MAX extension headers from `nh` (hop-by-hop, destination options,
 * routing, fragment), `left` bytes of payload from the cursor on. Each header is bounded by the
 * frame (take()) and by the payload length. Stops at anything else, or after a later
 * fragment's header. */
static __always_inline struct ipv6_ext parse_ipv6_ext(struct cursor *c, __u8 nh, __u32 left)
{
	struct ipv6_ext x = { .nh = nh, .left = left };

#pragma unroll
	for (int i = 0; i < LB_IPV6_EXT_MAX; i++) {
		if (x.nh == IPV6_HOPOPTS || x.nh == IPV6_DSTOPTS || x.nh == IPV6_ROUTING) {
			__u8 *o = take(c, 8);
			__u32 len;

			if (!o)
				goto malformed;
			len = ((__u32)o[1] + 1) * 8;
			if (len > x.left || (len > 8 && !take(c, len - 8)))
				goto malformed;
			/* Type 0 is deprecated (RFC 5095); segments left: not the final destination.
			 * Hop-by-hop options only ever come first. */
			if ((x.nh == IPV6_ROUTING && (o[2] == 0 || o[3] != 0)) || (x.nh == IPV6_HOPOPTS && i != 0))
				x.odd = 1;
			x.left -= len;
			x.nh = o[0];
			continue;
		}
		if (x.nh == IPV6_FRAGMENT) {
			__u8 *o = take(c, 8);
			__u16 off;

			if (!o || x.left < 8)
				goto malformed;
			x.left -= 8;
			x.nh = o[0];
			x.fnh = o[0];
			off = bpf_ntohs(*(__be16 *)(o + 2));
			if (x.frag)
				x.odd = 1; /* two fragment headers */
			x.id = *(__be32 *)(o + 4);
			if (off & 0xfff8) {
				x.frag = 2;
				break;
			}
			if (off & 1)
				x.frag = 1;
			continue;
		}
		break;
	}
	return x;
malformed:
	x.malformed = 1;
	return x;
}

/* What every fragment of one datagram carries: its key in frag.h's frag_routes. IPv4
 * addresses in src[0] and dst[0], the rest zero; IPv4's 16-bit identification in the low half
 * of `id` (as read from the packet). */
struct lb_frag_key {
	__be32 src[4];
	__be32 dst[4];
	__be32 id;
	__u8 proto;  /* IPv4: the protocol, TCP or UDP; IPv6: the fragment header's next header
		      * (TCP, UDP, or an extension header in the fragmentable part) */
	__u8 family; /* enum lb_family */
	__u8 pad[2];
};

/* What the forwarding steps need to know of a packet once it is parsed. */
struct pkt {
	struct xdp_md *ctx;
	struct ethhdr *eth;
	__u64 bytes;  /* the frame's length as received: what the traffic counters add */
	__u32 l2len;  /* 14, or 18 with a VLAN tag */
	__u32 l3len;  /* the IP packet's length by its own header (padding may follow it) */
	__u32 hash;   /* the flow hash */
	__u8 family;  /* of the IP packet: LB_FAMILY_V4 or LB_FAMILY_V6 */
	__u8 tos;     /* IPv4 TOS or IPv6 traffic class: copied to an outer header */
	__u8 df;      /* IPv4: don't-fragment is set; IPv6: always 1 (routers never fragment it) */
	__u8 icmp;    /* an ICMP error being routed: never answered with another ICMP error */
	__u8 refuse;  /* 0, or the enum lb_stat drop reason of a frame lb never balances (not
		       * unicast to it, or from another VLAN): counted once it is for a service */
	__be16 dport; /* a first fragment's destination port */
	__u8 l4proto; /* a first fragment's upper-layer protocol (TCP or UDP) */
	__u8 sent;    /* set by send() and encap() once the frame goes to the backend (not a
		       * "too big" answer): only then is a first fragment's backend recorded */
	/* A first fragment's datagram (in the CPU's scratch room, frag.h): send() records the
	 * backend it goes to there for the later fragments. NULL for every other packet. */
	const struct lb_frag_key *frag;
	/* What a handler chose when it returns LB_SEND: the service and the backend id. */
	const struct lb_service *svc;
	__u32 id;
};

#endif /* LB_PARSE_H */
