/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Connection tracking: the flow table (`flows`) and the half-open table (`flow_pending`), both
 * laid out as lb.h's struct lb_flow describes, and the secret key of their tags (`flow_key`).
 * Here: a flow's keyed tag, time in ticks of the kernel's clock, a slot's packed word and state
 * bits, the two buckets a flow's tag may live in, lookup, claim-and-insert and end, whether an
 * entry still leads to a live backend and whether a promotion may take its slot, and the policy
 * on top (ct_choose(): which packets make, keep, confirm, promote, reset or remake an entry, with
 * or without the ct_guard; route_icmp(): an ICMP error to its flow's backend). Its own header,
 * as conntrack is its own concern beside routing: route.h decides for a flow that has no usable
 * entry, this file decides whether it has one. The three maps are defined here because no other
 * part of the program touches them. Included by lb.bpf.c after maps.h (lb_settings, backends,
 * backend_gen, count()), parse.h (the TCP flags), hash.h (SipHash) and route.h (pick_in(),
 * pick()); it returns backend ids, and lb.bpf.c sends. docs/data-plane.md ("Connection tracking against crafted packets") and
 * docs/security.md say what each rule defends against. */
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

/* The secret key of the flow tags (lb.h, struct lb_flow_key): written by user space before the
 * program is attached, pinned, and never changed while the data plane lives. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_flow_key);
} flow_key SEC(".maps");

/* Makes lb.h's bit names part of the object's BTF, for user space (see maps.h). */
const volatile enum lb_flow_gen_bits lb_flow_gen_bits_btf = LB_FLOW_GEN_MASK;

/* A flow's tag from its flow-hash lanes (hash.h): 2 lanes for IPv4, 5 for IPv6. */
static __always_inline __u64 flow_tag16(__u64 a, __u64 b)
{
	__u32 zero = 0;
	const struct lb_flow_key *k = bpf_map_lookup_elem(&flow_key, &zero);

	return k ? sip16(k->k[0], k->k[1], a, b) : 0;
}

static __always_inline __u64 flow_tag40(const __u64 *l)
{
	__u32 zero = 0;
	const struct lb_flow_key *k = bpf_map_lookup_elem(&flow_key, &zero);

	return k ? sip40(k->k[0], k->k[1], l) : 0;
}

/* Flow tables count time in ticks of 2^LB_CT_TICK_SHIFT ns (about 16.8 ms) of the kernel's
 * CLOCK_MONOTONIC, read by the program itself: it keeps running while no controller does (a
 * clock that only a controller advanced stood still through a restart, then jumped, and every
 * flow looked idle for the whole gap). The coarse clock: a tick of precision is all it needs,
 * and it costs a few loads. A 32-bit `seen` lasts two years. */
#define LB_CT_TICK_SHIFT 24
/* A tracked flow's `seen` is rewritten at most every 64 ticks (about a second), or a quarter of
 * its timeout if that is shorter: a hit rarely writes. */
#define LB_CT_REFRESH_TICKS 64
/* What is left of an entry's life after the client's RST (about 4 s), unless a later packet of
 * the flow without RST shows it goes on (an RST can be spoofed; its sequence number cannot be
 * checked here). */
#define LB_CT_RESET_TICKS 240

static __always_inline __u32 ct_refresh_every(__u32 timeout)
{
	__u32 every = timeout / 4;

	return every == 0 || every > LB_CT_REFRESH_TICKS ? LB_CT_REFRESH_TICKS : every;
}

static __always_inline __u32 ct_now(void)
{
	return bpf_ktime_get_coarse_ns() >> LB_CT_TICK_SHIFT;
}

static __always_inline __u32 ct_ticks(__u64 ms)
{
	return (ms * 1000000 + (1 << LB_CT_TICK_SHIFT) - 1) >> LB_CT_TICK_SHIFT;
}

static __always_inline __u32 ct_timeout_ticks(__u8 proto)
{
	return ct_ticks(proto == IPPROTO_TCP ? lb_settings.ct_tcp_timeout_ms : lb_settings.ct_udp_timeout_ms);
}

/* A slot's backend, gen_flags (split into generation and state bits) and seen, read as one
 * word (lb.h says why). */
struct flow_word {
	__u32 backend;
	__u32 gen;   /* LB_FLOW_GEN_MASK bits */
	__u32 flags; /* the other bits of lb_flow.gen_flags */
	__u32 seen;
};

static __always_inline __u64 flow_pack(__u32 backend, __u32 gen, __u32 flags, __u32 seen)
{
	return (__u64)(backend & 0xffff) | (__u64)((gen & LB_FLOW_GEN_MASK) | (flags & ~LB_FLOW_GEN_MASK & 0xffff)) << 16 |
	       (__u64)seen << 32;
}

static __always_inline struct flow_word flow_unpack(__u64 w)
{
	struct flow_word f = {
		.backend = w & 0xffff,
		.gen = (w >> 16) & LB_FLOW_GEN_MASK,
		.flags = (w >> 16) & 0xffff & ~LB_FLOW_GEN_MASK,
		.seen = w >> 32,
	};

	return f;
}

static __always_inline __u64 flow_repack(const struct flow_word *f)
{
	return flow_pack(f->backend, f->gen, f->flags, f->seen);
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
 * flow), 1 for the half-open table, which a flood churns anyway. A slot being written holds
 * LB_FLOW_BUSY, which is no flow's tag. */
static __always_inline struct lb_flow *flow_find(void *map, __u32 mask, __u32 choices, __u64 tag, struct flow_word *out, __u64 *word)
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
		/* Still this flow's after the read: a writer replacing it would have swapped the
		 * tag for LB_FLOW_BUSY before writing the word. */
		if (*(volatile __u64 *)&e->tag != tag)
			continue;
		*out = flow_unpack(w);
		*word = w;
		return e;
	}
	return NULL;
}

/* Whether a tracked entry still leads somewhere: its backend alive, the id not given to
 * another backend since, and the flow not idle past `timeout` (ticks; 0: never), or past
 * LB_CT_RESET_TICKS once reset. */
static __always_inline int usable(const struct flow_word *f, __u32 timeout, __u32 now)
{
	__u32 id = f->backend;
	struct lb_backend *be = bpf_map_lookup_elem(&backends, &id);
	__u32 *gen = bpf_map_lookup_elem(&backend_gen, &id);

	if (!be || !gen || !(be->flags & LB_BACKEND_ALIVE) || (*gen & LB_FLOW_GEN_MASK) != f->gen)
		return 0;
	if ((f->flags & LB_FLOW_RESET) && (timeout == 0 || timeout > LB_CT_RESET_TICKS))
		timeout = LB_CT_RESET_TICKS;
	return timeout == 0 || now - f->seen < timeout;
}

/* How long a tracked flow must have been silent before a pure SYN on its 5-tuple is taken for
 * a new connection and picks afresh (about 30 s, or half the flow's timeout if that is
 * shorter): a client reuses a 5-tuple only once its old connection has ended, and a real
 * connection is rarely silent that long; while the flow is active a SYN follows the entry (the
 * backend answers an in-window SYN with a challenge ACK), so a blind spoofed SYN cannot move
 * it. */
#define LB_CT_SYN_IDLE_TICKS 1788

static __always_inline __u32 ct_syn_idle(__u32 timeout)
{
	return timeout != 0 && timeout / 2 < LB_CT_SYN_IDLE_TICKS ? timeout / 2 : LB_CT_SYN_IDLE_TICKS;
}

/* Which slot a promotion (`guarded`) or a first packet (not) takes, as a rank: the smallest
 * wins; ~0: none. Free first; then an entry that no longer leads anywhere (expired, reset past
 * its life, its backend gone), the one seen longest ago; then an unconfirmed one, the one seen
 * LAST (a flood's own young entries go before a real flow that showed its handshake and has
 * been quiet since), never a confirmed one that still leads somewhere. Without the guard
 * (`guarded` 0: a flow's first packet in `flows`, or a record in `flow_pending`), any, the one
 * seen longest ago. A slot being written is another CPU's. */
static __always_inline __u64 evict_rank(__u64 tag, __u64 w, int guarded, __u32 now)
{
	struct flow_word f = flow_unpack(w);
	__u64 age = (__u32)(now - f.seen);
	__u32 timeout;

	if (tag == 0)
		return 0;
	if (tag == LB_FLOW_BUSY)
		return ~0ull;
	if (!guarded)
		return (2ull << 33) | (0xffffffffull - age);
	timeout = ct_timeout_ticks(f.flags & LB_FLOW_UDP ? IPPROTO_UDP : IPPROTO_TCP);
	/* An unconfirmed entry is judged by its age alone (whether its backend still lives is
	 * looked up only for a confirmed one: fewer paths for the verifier). */
	if (!(f.flags & LB_FLOW_CONFIRMED)) {
		if ((f.flags & LB_FLOW_RESET) && (timeout == 0 || timeout > LB_CT_RESET_TICKS))
			timeout = LB_CT_RESET_TICKS;
		return timeout != 0 && age >= timeout ? (1ull << 33) | (0xffffffffull - age) : (2ull << 33) | age;
	}
	return usable(&f, timeout, now) ? ~0ull : (1ull << 33) | (0xffffffffull - age);
}

/* Writes a flow into `map`: into `have` (the slot that already has its tag), else the slot of
 * its buckets evict_rank() ranks first. Every claim is a compare-and-swap of the tag from the
 * value judged to LB_FLOW_BUSY, so two CPUs never write one slot at once: the one that loses
 * leaves the flow unrecorded. After the claim the word is written by a compare-and-swap from
 * the word judged (a packet may have confirmed the flow between the judgement and the claim);
 * if that fails, the slot gets its tag back untouched. Returns 1 when
 * that forgot another flow, 0 when written, -1 when not. */
static __always_inline int flow_put(void *map, __u32 mask, __u32 choices, __u64 tag, struct lb_flow *have, __u64 word, int guarded, __u32 now)
{
	struct lb_flow *victim = have;
	__u64 old = tag, best = ~0ull, w = 0;
	__u32 slot = 0;

	if (!victim) {
		/* The slot's number, not its pointer, is kept through the loop: scalars let the
		 * verifier prune its paths. */
#pragma unroll
		for (__u32 i = 0; i < 2 * LB_FLOW_WAYS; i++) {
			__u32 k = flow_slot(tag, mask, i);
			struct lb_flow *e;
			__u64 t, r, cur;

			if (i >= choices * LB_FLOW_WAYS)
				break;
			e = bpf_map_lookup_elem(map, &k);
			if (!e)
				continue;
			t = *(volatile __u64 *)&e->tag;
			cur = *(volatile __u64 *)flow_word_of(e);
			r = evict_rank(t, cur, guarded, now);
			if (r < best) {
				best = r;
				slot = k;
				old = t;
				w = cur;
				if (r == 0)
					break;
			}
		}
		if (best == ~0ull)
			return -1;
		victim = bpf_map_lookup_elem(map, &slot);
		if (!victim)
			return -1;
	}
	if (old == LB_FLOW_BUSY || __sync_val_compare_and_swap(&victim->tag, old, LB_FLOW_BUSY) != old)
		return -1;
	if (have)
		w = *(volatile __u64 *)flow_word_of(victim);
	/* From the word judged: if it changed meanwhile (a packet confirmed or refreshed the
	 * flow), the judgement no longer holds, and the slot is left as it is. */
	if (__sync_val_compare_and_swap(flow_word_of(victim), w, word) != w) {
		__sync_lock_test_and_set(&victim->tag, old);
		return -1;
	}
	/* An exchange rather than a plain store: a full barrier, so no CPU sees the tag before
	 * the word. */
	__sync_lock_test_and_set(&victim->tag, tag);
	return old != 0 && old != tag;
}

/* Forgets a half-open entry once its flow is established, unless another flow took the slot
 * meanwhile. */
static __always_inline void flow_end(struct lb_flow *e, __u64 tag)
{
	__sync_val_compare_and_swap(&e->tag, tag, 0);
}

/* An RST's effect on `seen`: the entry then lives LB_CT_RESET_TICKS from `seen` (usable()),
 * so this makes it end about 4 s from now, or when it would have ended anyway if that is sooner
 * (an RST never extends an entry). An unconfirmed entry keeps its `seen`: its flow's first packets
 * set it, and the packet that confirms it must come a refresh interval after them, spoofed RSTs
 * in between or not. */
static __always_inline __u32 reset_seen(const struct flow_word *f, __u32 timeout, __u32 now)
{
	__u32 last;

	if (!(f->flags & LB_FLOW_CONFIRMED) || (timeout != 0 && timeout <= LB_CT_RESET_TICKS))
		return f->seen;
	if (timeout == 0)
		return now;
	last = f->seen + timeout - LB_CT_RESET_TICKS;
	return (__s32)(last - now) >= 0 ? now : last;
}

/* A hit's bookkeeping, one compare-and-swap of the word when anything changes (lost to a
 * writer that replaced the slot meanwhile, which is harmless). Never for a pure SYN, which
 * proves nothing (a retransmitted or spoofed SYN): it neither refreshes nor confirms. An RST
 * leaves the entry LB_CT_RESET_TICKS to live (reset_seen()), counted from the first RST (more
 * RSTs do not extend it, so an RST spray cannot keep a flow looking alive). Any other packet
 * rewrites `seen` once it is older than the refresh interval, and confirms the entry then; a
 * packet sooner than that after an RST clears the reset (the flow goes on: RSTs can be spoofed)
 * and changes nothing else, so RSTs neither confirm an entry nor keep one from being
 * confirmed. */
static __always_inline void refresh(struct lb_flow *e, struct flow_word f, __u64 w, __u32 timeout, __u32 now, int rst)
{
	__u32 every = ct_refresh_every(timeout);

	if (rst) {
		if (f.flags & LB_FLOW_RESET)
			return;
		f.seen = reset_seen(&f, timeout, now);
		f.flags |= LB_FLOW_RESET;
	} else if (now - f.seen >= every) {
		f.flags = (f.flags & ~LB_FLOW_RESET) | LB_FLOW_CONFIRMED;
		f.seen = now;
	} else if (f.flags & LB_FLOW_RESET) {
		f.flags &= ~LB_FLOW_RESET;
	} else {
		return;
	}
	__sync_val_compare_and_swap(flow_word_of(e), w, flow_repack(&f));
}

/* The backend a second-chance service's flow picked up in mid-connection is tracked to, when
 * not the table's: its slot's first hop (the slot's owner in the previous pool) while that
 * backend lives, else 0. A connection this node has never seen, on a slot that changed owner,
 * most likely began before the change; its packets carry the slot's owner in their hop list in
 * case it did not, and there the backend's second chance sends them on. Passed to ct_choose()
 * in the high half of `proto_flags`. */
static __always_inline __u32 adopt_hop(const struct lb_service *svc, __u32 hash)
{
	__u32 slot, half, hop;
	struct lb_hop_pair *hp;
	struct lb_backend *be;

	if (svc->slots == 0 || svc->forward != LB_FWD_GUE || !(svc->flags & LB_SVC_SECOND_CHANCE))
		return 0;
	slot = svc->base + hash % svc->slots;
	half = slot >> 1;
	hp = bpf_map_lookup_elem(&table_hops, &half);
	if (!hp)
		return 0;
	hop = hp->slot[slot & 1].id[0];
	if (hop == 0)
		return 0;
	be = bpf_map_lookup_elem(&backends, &hop);
	return be && (be->flags & LB_BACKEND_ALIVE) && (be->flags & LB_BACKEND_MAC_KNOWN) ? hop : 0;
}

/* Connection tracking, for a flow with keyed tag `tag` and flow hash `hash` of a service whose
 * destination table is `table` (its base in the high half, its size in the low one), `proto`
 * and the TCP flags in `proto_flags`' low two bytes: the backend id the packet goes to, or 0
 * (dropped, counted). A global function, so the verifier checks it once, on its own, with
 * scalar arguments, rather than again on every parsing path that reaches it: inlined into the
 * IPv4 and IPv6 paths it took the program past the verifier's million-instruction budget.
 *
 * A flow with a usable entry goes to its backend whatever the table says now; otherwise the
 * table decides. With ct_guard on, a flow's first packet (a TCP SYN without
 * ACK, any UDP datagram) is recorded in flow_pending with the backend it went to; its next
 * packet makes it an entry of `flows`, taking a free slot or one whose flow is not confirmed or
 * no longer leads anywhere, never a confirmed flow's (else it stays half-open, counted
 * no_room); a packet of the flow a refresh interval later confirms it. So spoofed packets,
 * which lb cannot tell from real ones (it never sees the backend's answers), can only displace
 * unconfirmed flows, the youngest first (evict_rank()). A stale entry (its backend gone, down,
 * the flow idle too long or past its reset life) is remade from the table by any packet, and so
 * is an entry silent for ct_syn_idle() when a pure SYN comes: a new connection on the same
 * ports; on an active entry a SYN follows it. With ct_guard
 * off, a first packet goes straight into `flows`, in place of the flow seen longest ago. `tag`
 * is the flow's keyed tag (flow_tag16/flow_tag40). */
__noinline __u32 ct_choose(__u64 tag, __u32 hash, __u64 table, __u32 proto_flags)
{
	__u8 proto = proto_flags, tcp_flags = proto_flags >> 8;
	__u32 now = ct_now(), timeout = ct_timeout_ticks(proto);
	__u32 mask = lb_settings.ct_mask, pmask = lb_settings.ct_pending_mask, id, *gen;
	int syn = proto == IPPROTO_TCP && (tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
	int rst = proto == IPPROTO_TCP && (tcp_flags & TCP_FLAG_RST);
	/* A packet that may start a flow: a SYN, or any UDP datagram without an entry. */
	int first = syn || proto == IPPROTO_UDP;
	/* A TCP packet in mid-connection with no entry here (the flow began on another node, or
	 * before this one started): adopted, tracked from now on like a flow's first packet, so a
	 * later change of its slot does not move it. Never an RST, which ends what it touches. */
	int adopt = proto == IPPROTO_TCP && !syn && !rst;
	__u32 pflags = (proto == IPPROTO_UDP ? LB_FLOW_UDP : 0) | (rst ? LB_FLOW_RESET : 0);
	struct lb_flow *e, *pe;
	struct flow_word f;
	__u64 w;

	tag |= 1;
	e = flow_find(&flows, mask, 2, tag, &f, &w);
	if (e) {
		int ok = usable(&f, timeout, now);

		/* A pure SYN follows a live entry (a retransmitted SYN; a spoofed one, which the
		 * backend answers with a challenge ACK) unless the flow has been silent long
		 * enough to have ended: then it is a new connection on the same ports. */
		if (ok && !(syn && !(f.flags & LB_FLOW_RESET) && now - f.seen >= ct_syn_idle(timeout))) {
			if (!syn)
				refresh(e, f, w, timeout, now, rst);
			count(LB_CT_HIT, 0);
			return f.backend;
		}
		if (!ok)
			count(LB_CT_STALE, 0);
		id = pick_in(table >> 32, (__u32)table, hash);
		if (id == 0)
			return 0;
		gen = bpf_map_lookup_elem(&backend_gen, &id);
		flow_put(&flows, mask, 2, tag, e, flow_pack(id, gen ? *gen : 0, pflags, now), 0, now);
		count(LB_CT_NEW, 0);
		return id;
	}
	count(LB_CT_MISS, 0);
	if (lb_settings.ct_guard) {
		pe = flow_find(&flow_pending, pmask, 1, tag, &f, &w);
		if (pe) {
			int stale = !usable(&f, timeout, now);
			int put;

			if (stale) {
				/* Its first packet went to a backend that is gone or down (or long
				 * ago): the table decides again. */
				count(LB_CT_STALE, 0);
				id = pick_in(table >> 32, (__u32)table, hash);
				if (id == 0)
					return 0;
				gen = bpf_map_lookup_elem(&backend_gen, &id);
				f.backend = id;
				f.gen = gen ? *gen : 0;
			}
			if (syn) {
				/* A SYN sent again: where the first one went. */
				if (stale)
					flow_put(&flow_pending, pmask, 1, tag, pe, flow_pack(f.backend, f.gen, pflags, now), 0, now);
				else
					count(LB_CT_HIT, 0);
				return f.backend;
			}
			/* The flow's next packet: established, with the backend its first went to,
			 * if its buckets have room it may take. */
			if (!rst) {
				put = flow_put(&flows, mask, 2, tag, NULL, flow_pack(f.backend, f.gen, pflags, now), 1, now);
				if (put >= 0) {
					if (put > 0)
						count(LB_CT_EVICTED, 0);
					count(LB_CT_NEW, 0);
					flow_end(pe, tag);
				} else {
					/* Followed through its half-open record, which is kept
					 * fresh as a tracked flow's entry is (and cleared of a reset):
					 * else it would run out a timeout after the flow's first
					 * packet, and the flow be re-picked in mid-stream. */
					count(LB_CT_NO_ROOM, 0);
					if (stale)
						flow_put(&flow_pending, pmask, 1, tag, pe, flow_pack(f.backend, f.gen, pflags, now), 0, now);
					else if ((f.flags & LB_FLOW_RESET) || now - f.seen >= ct_refresh_every(timeout))
						__sync_val_compare_and_swap(flow_word_of(pe), w, flow_pack(f.backend, f.gen, pflags, now));
				}
			} else if (!stale && !(f.flags & LB_FLOW_RESET)) {
				/* An RST shortens a half-open record's life as it does an
				 * unconfirmed entry's (it may be spoofed): about 4 s from the
				 * flow's last packet. */
				f.flags |= LB_FLOW_RESET;
				__sync_val_compare_and_swap(flow_word_of(pe), w, flow_repack(&f));
			} else if (stale) {
				flow_put(&flow_pending, pmask, 1, tag, pe, flow_pack(f.backend, f.gen, pflags, now), 0, now);
			}
			if (!stale)
				count(LB_CT_HIT, 0);
			return f.backend;
		}
		id = pick_in(table >> 32, (__u32)table, hash);
		if (id == 0)
			return 0;
		if (adopt && (proto_flags >> 16))
			id = proto_flags >> 16;
		if (first || adopt) {
			gen = bpf_map_lookup_elem(&backend_gen, &id);
			flow_put(&flow_pending, pmask, 1, tag, NULL, flow_pack(id, gen ? *gen : 0, pflags, now), 0, now);
			count(LB_CT_PENDING, 0);
			if (adopt)
				count(LB_CT_ADOPTED, 0);
		}
		return id;
	}
	id = pick_in(table >> 32, (__u32)table, hash);
	if (id == 0)
		return 0;
	if (adopt && (proto_flags >> 16))
		id = proto_flags >> 16;
	if (adopt)
		count(LB_CT_ADOPTED, 0);
	if (first || adopt) {
		gen = bpf_map_lookup_elem(&backend_gen, &id);
		if (flow_put(&flows, mask, 2, tag, NULL, flow_pack(id, gen ? *gen : 0, pflags, now), 0, now) > 0)
			count(LB_CT_EVICTED, 0);
		count(LB_CT_NEW, 0);
	}
	return id;
}

/* ct_choose() for a packet of `svc` whose flow hash is p->hash: the backend id, or 0. */
static __always_inline __u32 tracked(struct pkt *p, const struct lb_service *svc, __u64 tag, __u8 proto, __u8 tcp_flags)
{
	__u32 hop = tcp_flags & TCP_FLAG_SYN ? 0 : adopt_hop(svc, p->hash);

	return ct_choose(tag, p->hash, (__u64)svc->base << 32 | svc->slots, proto | (__u32)tcp_flags << 8 | hop << 16);
}

/* An ICMP error about a service's flow (p->hash already the flow's hash for the table, tag its
 * keyed tag as the client's own packets have it): the backend that owns the flow, by the
 * flow's entry (looked up, never made or refreshed) or else the same slot as the client's
 * packets; 0 when dropped. */
static __always_inline __u32 route_icmp(struct pkt *p, const struct lb_service *svc, __u64 tag, __u8 proto)
{
	__u32 now = ct_now();
	struct flow_word f;
	__u32 id = 0;
	__u64 w;

	tag |= 1;
	if (svc->flags & LB_SVC_CONNTRACK) {
		if ((flow_find(&flows, lb_settings.ct_mask, 2, tag, &f, &w) ||
		     flow_find(&flow_pending, lb_settings.ct_pending_mask, 1, tag, &f, &w)) &&
		    usable(&f, ct_timeout_ticks(proto), now))
			id = f.backend;
	}
	if (id == 0)
		id = pick(svc, p->hash);
	if (id == 0)
		return 0;
	p->icmp = 1;
	count(LB_ICMP_FORWARDED, 0);
	return id;
}

#endif /* LB_FLOW_H */
