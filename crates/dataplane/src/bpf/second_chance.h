/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Second chance on a backend (`lb decap --second-chance`, docs/fleet.md "Second chance"): where
 * a GUE packet's hop list is, whether this host holds the connection a packet belongs to (its
 * socket, a SYN cookie of its own, or for an ICMP error the connection it quotes), and sending a
 * packet it does not hold on to the next hop of its list. Its maps and
 * lookups (dcount(), is_local()) are decap_maps.h's; the rules it keeps are in decap.bpf.c's
 * head. */
#ifndef LB_SECOND_CHANCE_H
#define LB_SECOND_CHANCE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lb.h"
#include "parse.h"
#include "csum.h"
#include "decap_maps.h"

/* A second-chance hop list found in a GUE version 0 header: where its block (struct
 * lb_gue_hops) starts, as an offset from the frame's start (0: none). */
struct hops_at {
	__u32 off;
	__u8 next;
	__u8 count;
};

/* Address families as bpf_fib_lookup() takes them. */
#define AF_INET_ 2
#define AF_INET6_ 10

/* The kernel's conntrack, where this kernel has it (lb decap runs on kernels without it too). */
extern struct nf_conn *bpf_xdp_ct_lookup(struct xdp_md *ctx, struct bpf_sock_tuple *tuple, __u32 tuple__sz,
					 struct bpf_ct_opts *opts, __u32 opts__sz) __ksym __weak;
extern void bpf_ct_release(struct nf_conn *ct) __ksym __weak;

/* bpf_ct_opts as kernels since 6.1 take it (netns, error, protocol, direction); later ones
 * accept this size as well as their longer one. */
#define CT_OPTS_SIZE 12

/* Whether this host's conntrack follows the connection of tuple `t` (the client's direction)
 * as one still open: the only trace a connection leaves here when the host rewrites its
 * destination (a REDIRECT or DNAT from VIP:port to a local port, as kube-proxy, Istio or a
 * proxy on 8080 do), for then no socket has the VIP's tuple. Conntrack's own TIME_WAIT and CLOSE
 * are over: like a TIME_WAIT socket (below), they hold no live peer. */
static __always_inline int tracked_here(struct xdp_md *ctx, struct bpf_sock_tuple *t, __u32 tlen)
{
	struct bpf_ct_opts opts = {};
	struct nf_conn *ct;
	__u8 state;

	if (!bpf_ksym_exists(bpf_xdp_ct_lookup))
		return 0;
	opts.netns_id = BPF_F_CURRENT_NETNS;
	opts.l4proto = IPPROTO_TCP;
	ct = bpf_xdp_ct_lookup(ctx, t, tlen, &opts, CT_OPTS_SIZE);
	if (!ct)
		return 0;
	state = ct->proto.tcp.state;
	bpf_ct_release(ct);
	return state >= TCP_CONNTRACK_SYN_SENT && state <= TCP_CONNTRACK_LAST_ACK;
}

/* Whether sequence number `seq` lies within `win` (at least 64 KiB) either side of `next`, the
 * next byte a closing connection expects: its peer sends nothing farther (late data, a FIN, an
 * ACK, a retransmission of what was received), and a new connection that reuses the tuple
 * starts at a random number, which lands there about once in 2^32 / (2 win). */
static __always_inline int near(__u32 seq, __u32 next, __u32 win)
{
	if (win < 65535)
		win = 65535;
	if (win > 1U << 30)
		win = 1U << 30;
	return seq - (next - win) <= 2 * win;
}

/* near() for the closing socket `sk`: the window is the largest it may have offered (its clamp),
 * not what it offers now, which an application that stopped reading has shrunk to nothing while
 * its peer may still retransmit what came before. */
static __always_inline int in_window(struct bpf_sock *sk, struct tcphdr *th)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	__u32 win;

	if (!tp)
		return 1;
	win = tp->window_clamp > tp->rcv_wnd ? tp->window_clamp : tp->rcv_wnd;
	return near(bpf_ntohl(th->seq), tp->rcv_nxt, win);
}

/* For a socket in the kernel's TIME_WAIT table: an orphaned FIN_WAIT2 (this host closed, its
 * application is gone, the peer may still send) holds the segments near its window; a true
 * TIME_WAIT only its peer's FIN sent again (its ACK was lost), which it answers. */
static __always_inline int timewait_holds(struct bpf_sock *sk, struct tcphdr *th)
{
	struct tcp_timewait_sock *tw = bpf_skc_to_tcp_timewait_sock(sk);
	__u32 seq = bpf_ntohl(th->seq), next;

	if (!tw)
		return 0;
	next = tw->tw_sk.__tw_common.skc_tw_rcv_nxt;
	if (tw->tw_sk.tw_substate == BPF_TCP_FIN_WAIT2)
		return near(seq, next, tw->tw_rcv_wnd);
	return th->fin && seq + 1 == next;
}

/* Whether the listener `sk` sent a SYN cookie lately: the kernel takes a cookie's ACK for a
 * listener only within two minutes of its last cookie (tcp_synq_no_recent_overflow(), from a
 * second before), noted per listener or per SO_REUSEPORT group. The secret that signs cookies
 * is one per kernel, not per network namespace: without this, a backend in a container would
 * take as its own the cookie another container on the same host sent. */
static __always_inline int sent_cookies_lately(struct bpf_sock *sk)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	struct sock_reuseport *group;
	__u32 hz = jiffies_hz, last, now;

	/* Not measured (never by lb decap, which measures before attaching): as before. */
	if (!hz)
		return 1;
	if (!tp)
		return 0;
	group = tp->inet_conn.icsk_inet.sk.sk_reuseport_cb;
	last = group ? group->synq_overflow_ts : (__u32)tp->rx_opt.ts_recent_stamp;
	now = (__u32)bpf_jiffies64();
	return now - (last - hz) <= 121 * hz;
}

/* Whether this host holds the connection of the TCP segment `th` in the inner packet `iph` (of
 * `family`), by the state of the socket its tuple finds (docs/fleet.md, "Second chance"):
 * - open or opening (a handshake under way, established): yes;
 * - closing (FIN_WAIT1/2, CLOSING, CLOSE_WAIT, LAST_ACK): if the segment's sequence number is
 *   near the socket's window (in_window()); else it belongs to a new connection elsewhere that
 *   reuses the tuple;
 * - TIME_WAIT: only the peer's FIN sent again; the connection is over, and any other packet of
 *   its tuple is a new connection's (delivered here, the kernel would answer it with a stale ACK
 *   and keep the live one hanging). An orphaned FIN_WAIT2, which the kernel keeps in the same
 *   table, as a closing socket (timewait_holds());
 * - a listener: the ACK that completes a handshake answered with one of this listener's SYN
 *   cookies, or a connection this host's conntrack follows (a listener on the VIP's port beside
 *   a REDIRECT to another);
 * - none: a connection this host's conntrack follows (a REDIRECT or DNAT). */
static __always_inline int holds(struct xdp_md *ctx, void *iph, struct tcphdr *th, __u8 family)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 tlen;
	int mine = 0, ask_conntrack = 0;

	if (family == LB_FAMILY_V4) {
		struct iphdr *in = iph;

		t.ipv4.saddr = in->saddr;
		t.ipv4.daddr = in->daddr;
		t.ipv4.sport = th->source;
		t.ipv4.dport = th->dest;
		tlen = sizeof(t.ipv4);
	} else {
		struct ipv6hdr *in = iph;

		__builtin_memcpy(t.ipv6.saddr, &in->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, &in->daddr, 16);
		t.ipv6.sport = th->source;
		t.ipv6.dport = th->dest;
		tlen = sizeof(t.ipv6);
	}
	sk = bpf_skc_lookup_tcp(ctx, &t, tlen, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return tracked_here(ctx, &t, tlen);
	switch (sk->state) {
	case BPF_TCP_TIME_WAIT:
		mine = timewait_holds(sk, th);
		break;
	case BPF_TCP_LISTEN:
		if (th->ack && !th->syn && !th->rst &&
		    (family == LB_FAMILY_V4 ? bpf_tcp_raw_check_syncookie_ipv4(iph, th)
					    : bpf_tcp_raw_check_syncookie_ipv6(iph, th)) == 0)
			mine = sent_cookies_lately(sk);
		ask_conntrack = !mine;
		break;
	case BPF_TCP_FIN_WAIT1:
	case BPF_TCP_FIN_WAIT2:
	case BPF_TCP_CLOSE:
	case BPF_TCP_CLOSE_WAIT:
	case BPF_TCP_LAST_ACK:
	case BPF_TCP_CLOSING:
		mine = in_window(sk, th);
		break;
	default:
		mine = 1;
	}
	bpf_sk_release(sk);
	return mine || (ask_conntrack && tracked_here(ctx, &t, tlen));
}

/* Whether this host holds the connection an ICMP error at `ic` (in an inner packet of `family`)
 * is about: a destination unreachable (or IPv6 packet too big) quoting a TCP segment this host
 * sent from a VIP to a client, whose connection is found by the quote's addresses and ports
 * turned round, as the client's own packets carry them. An error about anything else is for
 * this host. */
static __always_inline int holds_quoted(struct xdp_md *ctx, void *ic, void *end, __u8 family)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__be16 *ports;
	__u32 tlen = family == LB_FAMILY_V4 ? sizeof(t.ipv4) : sizeof(t.ipv6);
	int mine, ask_conntrack;

	if (family == LB_FAMILY_V4) {
		struct icmphdr *h = ic;
		struct iphdr *q = (void *)(h + 1);

		if ((void *)(q + 1) > end || h->type != 3 || q->protocol != IPPROTO_TCP || q->ihl < 5)
			return 1;
		ports = (void *)q + q->ihl * 4;
		if ((void *)(ports + 2) > end)
			return 1;
		t.ipv4.saddr = q->daddr;
		t.ipv4.daddr = q->saddr;
		t.ipv4.sport = ports[1];
		t.ipv4.dport = ports[0];
	} else {
		struct icmp6hdr *h = ic;
		struct ipv6hdr *q = (void *)(h + 1);

		if ((void *)(q + 1) > end || (h->icmp6_type != 1 && h->icmp6_type != 2) || q->nexthdr != IPPROTO_TCP)
			return 1;
		ports = (void *)(q + 1);
		if ((void *)(ports + 2) > end)
			return 1;
		__builtin_memcpy(t.ipv6.saddr, &q->daddr, 16);
		__builtin_memcpy(t.ipv6.daddr, &q->saddr, 16);
		t.ipv6.sport = ports[1];
		t.ipv6.dport = ports[0];
	}
	sk = bpf_skc_lookup_tcp(ctx, &t, tlen, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return tracked_here(ctx, &t, tlen);
	mine = sk->state != BPF_TCP_LISTEN && sk->state != BPF_TCP_TIME_WAIT;
	ask_conntrack = sk->state == BPF_TCP_LISTEN;
	bpf_sk_release(sk);
	return mine || (ask_conntrack && tracked_here(ctx, &t, tlen));
}

/* Whether the packet inside (`inner`, of `family`) stays on this host rather than going on to
 * the next hop: a fragment, anything not TCP, a SYN, a connection or SYN cookie of this host,
 * an ICMP error about one of its connections (each counted as kept here), or a packet cut short
 * (not counted: the stack judges it). Part of second_chance_for(). */
static __always_inline int stays_here(struct xdp_md *ctx, void *inner, void *end, __u8 family)
{
	struct tcphdr *th;
	__u8 nh;

	if (family == LB_FAMILY_V4) {
		struct iphdr *in = inner;

		if ((void *)(in + 1) > end)
			return 1;
		/* A fragment: its ports, if any, are not where a header says; the stack reassembles
		 * it here (an IPv6 fragment header is not TCP, below). */
		if (in->frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return dcount(LB_DECAP_HOP_LOCAL, 1);
		nh = in->protocol;
		th = inner + in->ihl * 4;
	} else {
		struct ipv6hdr *in = inner;

		if ((void *)(in + 1) > end)
			return 1;
		nh = in->nexthdr;
		th = (void *)(in + 1);
	}
	if (family == LB_FAMILY_V4 ? (void *)((struct iphdr *)inner + 1) > end : (void *)((struct ipv6hdr *)inner + 1) > end)
		return 1;
	/* An ICMP error about a connection (path MTU discovery's "too big") goes where the
	 * connection is, like the connection's own packets. */
	if (nh == (family == LB_FAMILY_V4 ? IPPROTO_ICMP : IPPROTO_ICMPV6_)) {
		if ((void *)th + 8 > end || holds_quoted(ctx, th, end, family))
			return dcount(LB_DECAP_HOP_LOCAL, 1);
		return 0;
	}
	/* Not TCP (UDP has no connection to look for), or a SYN: here. */
	if (nh != IPPROTO_TCP || (void *)(th + 1) > end || (th->syn && !th->ack))
		return dcount(LB_DECAP_HOP_LOCAL, 1);
	if (holds(ctx, inner, th, family))
		return dcount(LB_DECAP_HOP_LOCAL, 1);
	return 0;
}

/* The route lookup for sending the packet on to `hop`, from the address it came to (the outer
 * header at `l3`): 0 when it cannot go on (cut short, or its hop limit spent: counted as
 * exhausted). Routed as if this host sent it (from the loopback, ifindex 1 in every namespace):
 * the helper answers only for an input device with forwarding on, and lb decap turns it on for
 * the loopback, which no packet from outside arrives on, rather than for the interface, which
 * would make the backend a router for whoever reaches it. Part of second_chance_for(). */
static __always_inline int fib_from_here(void *l3, void *end, __u8 outer, const __u32 hop[4], struct bpf_fib_lookup *fib)
{
	fib->ifindex = 1;
	fib->l4_protocol = IPPROTO_UDP;
	if (outer == LB_FAMILY_V4) {
		struct iphdr *ip = l3;

		if ((void *)(ip + 1) > end)
			return 0;
		if (ip->ttl <= 1)
			return dcount(LB_DECAP_HOP_EXHAUSTED, 0);
		fib->family = AF_INET_;
		fib->tos = ip->tos;
		fib->tot_len = bpf_ntohs(ip->tot_len);
		fib->ipv4_src = ip->daddr;
		fib->ipv4_dst = hop[0];
	} else {
		struct ipv6hdr *ip6 = l3;

		if ((void *)(ip6 + 1) > end)
			return 0;
		if (ip6->hop_limit <= 1)
			return dcount(LB_DECAP_HOP_EXHAUSTED, 0);
		fib->family = AF_INET6_;
		fib->tot_len = sizeof(*ip6) + bpf_ntohs(ip6->payload_len);
		__builtin_memcpy(fib->ipv6_src, &ip6->daddr, 16);
		__builtin_memcpy(fib->ipv6_dst, hop, 16);
	}
	return 1;
}

/* Sends the packet on: from this host (the address the packet came to) to `hop`, one hop fewer
 * to live, the list's index past it, to the MACs the route lookup gave. The UDP checksum is
 * zero, as lb sends it. Part of second_chance_for(). */
static __always_inline int send_on(struct xdp_md *ctx, __u32 l2len, const struct hops_at *h, const __u32 hop[4], __u8 outer,
				   const struct bpf_fib_lookup *fib)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	void *l3 = data + l2len;
	struct lb_gue_hops *gh = data + (h->off & 0xff);
	__u32 here[4];

	if ((void *)(gh + 1) > end || data + 14 > end)
		return -1;
	gh->next = h->next + 1;
	if (outer == LB_FAMILY_V4) {
		struct iphdr *ip = l3;
		struct udphdr *udp = (void *)(ip + 1);

		if ((void *)(udp + 1) > end)
			return -1;
		ip->saddr = ip->daddr;
		ip->daddr = hop[0];
		ip->ttl--;
		ip->check = 0;
		ip->check = ipv4_csum(ip);
		udp->check = 0;
	} else {
		struct ipv6hdr *ip6 = l3;
		struct udphdr *udp = (void *)(ip6 + 1);

		if ((void *)(udp + 1) > end)
			return -1;
		__builtin_memcpy(here, &ip6->daddr, 16);
		__builtin_memcpy(&ip6->saddr, here, 16);
		__builtin_memcpy(&ip6->daddr, hop, 16);
		ip6->hop_limit--;
		udp->check = 0;
	}
	__builtin_memcpy(data, fib->dmac, 6);
	__builtin_memcpy(data + 6, fib->smac, 6);
	return dcount(LB_DECAP_HOP_SENT_ON, XDP_TX);
}

/* Second chance for a packet whose hop list is at `h` and whose inner packet (of `family`) is
 * at l3 + strip, the outer header (of `outer`) at l3: an XDP action when the packet was sent on
 * (or dropped), -1 when it is for this host. */
static __always_inline int second_chance_for(struct xdp_md *ctx, __u32 l2len, __u32 strip, __u8 family, __u8 outer,
					      const struct hops_at *h)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct bpf_fib_lookup fib = {};
	struct lb_gue_hops *gh;
	__u32 hop[4] = {};
	int rc;

	if (stays_here(ctx, data + l2len + strip, end, family))
		return -1;
	if (h->next >= h->count || h->next >= LB_GUE_MAX_HOPS)
		return dcount(LB_DECAP_HOP_EXHAUSTED, -1);
	gh = data + (h->off & 0xff);
	if ((void *)(gh + 1) > end)
		return -1;
	if (outer == LB_FAMILY_V4) {
		__be32 *a = (void *)(gh + 1) + (h->next & 3) * 4;

		if ((void *)(a + 1) > end)
			return -1;
		hop[0] = *a;
	} else {
		__be32 *a = (void *)(gh + 1) + (h->next & 3) * 16;

		if ((void *)(a + 4) > end)
			return -1;
		__builtin_memcpy(hop, a, 16);
	}
	/* The next hop is this host: the list led back here (never by lb's hand). */
	if (is_local(hop, outer))
		return dcount(LB_DECAP_HOP_EXHAUSTED, -1);
	/* A frame that came tagged goes back out tagged: only where the route is the untagged
	 * interface itself, which a tag says it is not. Delivered here. */
	if (l2len != sizeof(struct ethhdr))
		return dcount(LB_DECAP_HOP_NO_ROUTE, -1);
	/* Only to a host this one trusts (the load balancers and backends --allow-from names):
	 * else whoever may send it GUE could have it send packets anywhere, from its address. */
	if (!is_allowed(hop, outer))
		return dcount(LB_DECAP_HOP_REFUSED, -1);
	if (!fib_from_here(data + l2len, end, outer, hop, &fib))
		return -1;
	rc = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);
	/* Out of the interface it came in on, to the next hop's MAC (XDP_TX): a route by another
	 * interface (a VLAN device, a bond, another NIC) would need a redirect that drops the
	 * packet unseen wherever that device takes no XDP frames. Delivered here instead. */
	if ((rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) || fib.ifindex != ctx->ingress_ifindex)
		return dcount(LB_DECAP_HOP_NO_ROUTE, -1);
	/* A next hop on the link whose MAC this host has not learnt: backends on one segment that
	 * never talked to each other. Dropped (TCP sends it again) while lb decap, which finds the
	 * hop in `unresolved`, has the kernel resolve it; a hop that stays unresolved past
	 * LB_DECAP_RESOLVE_NS (gone, or not answering) gets the packet delivered here, as with no
	 * route. */
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct lb_addr key = {};
		__u64 now = bpf_ktime_get_ns(), *since;

		__builtin_memcpy(key.addr, hop, 16);
		key.family = outer;
		since = bpf_map_lookup_elem(&unresolved, &key);
		if (!since)
			bpf_map_update_elem(&unresolved, &key, &now, BPF_NOEXIST);
		/* Signed: another CPU may have noted the hop after this one read the clock. */
		else if ((__s64)(now - *since) > (__s64)LB_DECAP_RESOLVE_NS)
			return dcount(LB_DECAP_HOP_NO_ROUTE, -1);
		return dcount(LB_DECAP_HOP_UNRESOLVED, XDP_DROP);
	}
	return send_on(ctx, l2len, h, hop, outer, &fib);
}

#endif /* LB_SECOND_CHANCE_H */
