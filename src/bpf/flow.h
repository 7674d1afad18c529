/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Connection tracking: the flow table (`flows`) and the half-open table (`flow_pending`), both
 * laid out as lb.h's struct lb_flow describes. Here: time in ticks, a slot's packed word, the
 * two buckets a flow's tag may live in, lookup, insert and end, whether an entry still leads to
 * a live backend, and the policy on top (tracked(): which packets make, keep, promote or remake
 * an entry, with or without the ct_guard; route_icmp(): an ICMP error to its flow's backend).
 * Its own header, as conntrack is its own concern beside routing: route.h decides for a flow
 * that has no usable entry, this file decides whether it has one. The two maps are defined here
 * because no other part of the program touches them. Included by lb.bpf.c after maps.h
 * (lb_settings, backends, backend_gen, count()), parse.h (the TCP flags) and route.h (pick(),
 * send()). */
#ifndef LB_FLOW_H
#define LB_FLOW_H

/* Established flows -> the backend each started on (lb.h, struct lb_flow): buckets of
 * LB_FLOW_WAYS consecutive slots. Memory-mappable, so its values start on a page and every
 * bucket is one aligned cache line. One table shared by all CPUs: the packets of one flow can
 * arrive on different CPUs (RSS re-steering, a different receive queue after a link change).
 * Several load balancers behind ECMP do not share it at all; there the table, which they all
 * compute alike, keeps new flows consistent. User space sizes it (--conntrack-size). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, LB_FLOW_WAYS);
	__type(key, __u32);
	__type(value, struct lb_flow);
} flows SEC(".maps");

/* Flows seen once (half-open), the same way; user space sizes it too. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, LB_FLOW_WAYS);
	__type(key, __u32);
	__type(value, struct lb_flow);
} flow_pending SEC(".maps");

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

#endif /* LB_FLOW_H */
