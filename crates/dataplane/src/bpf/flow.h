/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The flow tables of connection tracking: the flow table (`flows`) and the half-open table
 * (`flow_pending`), both laid out as lb.h's struct lb_flow describes, and the secret key of their
 * tags (`flow_key`). Here: a flow's keyed tag, time in ticks of the kernel's clock, a slot's
 * packed word and state bits, the two buckets a flow's tag may live in, lookup, claim-and-insert
 * and end, whether an entry still leads to a live backend and whether a promotion may take its
 * slot. The policy on top, which packets make, keep or change an entry, is conntrack.h's. The maps
 * themselves, and what their entries are, are flow_map.h's. docs/data-plane.md ("Connection tracking against crafted packets") and
 * docs/security.md say what each rule defends against. */
#ifndef LB_FLOW_H
#define LB_FLOW_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lb.h"
#include "maps.h"
#include "hash.h"
#include "flow_map.h"

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

/* How far ahead of a CPU's `now` another CPU's time stamp in a flow word may be and still be
 * taken for a moment later, not 2^32 ticks earlier: a packet that read the clock, then met an
 * entry another CPU wrote since. As far as the sweep of stable slots allows (crates/core/src/stable.rs,
 * AHEAD: about 69 s), not a few ticks: a CPU can be held up for longer than that between reading
 * the clock and judging a bucket (a virtual CPU its host preempts, an interrupt storm), and with
 * 4 ticks (67 ms) such a CPU judged a confirmed entry refreshed meanwhile expired, and a promotion
 * took it (issue 38, item 13). What it costs: an entry last written 2^32 - 2^12 ticks (about 2.3
 * years) ago looks fresh for a minute. */
#define LB_CT_AHEAD_TICKS (1u << 12)
/* The same for the recent SYNs' 16-bit stamps (conntrack.h, young()), which wrap every 18
 * minutes: there a wide allowance would make old cells young, and a CPU held up only makes a
 * flow's packets take the whole path or skip it once. */
#define LB_CT_YOUNG_AHEAD_TICKS 4

static __always_inline __u32 ct_refresh_every(__u32 timeout)
{
	__u32 every = timeout / 4;

	/* One comparison for both ends (0 wraps round to the top): fewer paths for the verifier,
	 * which meets this in every slot that a promotion judges. */
	return every - 1 < LB_CT_REFRESH_TICKS ? every : LB_CT_REFRESH_TICKS;
}

static __always_inline __u32 ct_now(void)
{
	return bpf_ktime_get_coarse_ns() >> LB_CT_TICK_SHIFT;
}

/* How many ticks before `now` an entry was last written at `seen`: 0 when `seen` is ahead, up to
 * LB_CT_AHEAD_TICKS (another CPU wrote the entry after this one read the clock), which is fresh,
 * not 2^32 ticks old. Every judgement of an entry's age goes through it. */
static __always_inline __u32 ct_age(__u32 seen, __u32 now)
{
	return seen - now <= LB_CT_AHEAD_TICKS ? 0 : now - seen;
}

static __always_inline __u32 ct_ticks(__u64 ms)
{
	return (ms * 1000000 + (1 << LB_CT_TICK_SHIFT) - 1) >> LB_CT_TICK_SHIFT;
}

static __always_inline __u32 ct_timeout_ticks(__u8 proto)
{
	return ct_ticks(proto == IPPROTO_TCP ? lb_settings.ct_tcp_timeout_ms : lb_settings.ct_udp_timeout_ms);
}

/* How many ticks after its `seen` an entry with state bits `flags` ends (0: never), for a flow
 * timeout of `timeout` ticks: the timeout and one refresh interval, since `seen` is rewritten at
 * most once a refresh interval and so may lag the flow's last packet by almost that much. A flow
 * therefore keeps its entry until it has been idle for its whole timeout, and loses it within a
 * refresh interval more (before, a flow idle for the timeout less that lag could lose it: issue
 * 38, item 13). Once reset: LB_CT_RESET_TICKS (or the timeout, if shorter), counted from the
 * `seen` that reset_seen() (conntrack.h) wrote for the purpose, so without that margin. Mirrored
 * by the sweep of stable slots (crates/core/src/stable.rs, life()). */
static __always_inline __u32 ct_life(__u32 flags, __u32 timeout)
{
	if (flags & LB_FLOW_RESET)
		return timeout - 1 < LB_CT_RESET_TICKS ? timeout : LB_CT_RESET_TICKS;
	return timeout ? timeout + ct_refresh_every(timeout) : 0;
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

/* The slot of `map` holding `tag`, with its word read consistently (`word`) and its index
 * (`at`), or NULL. `choices`: 2 for
 * the flow table (the second bucket's cache line is read only when the first does not hold the
 * flow), 1 for the half-open table, which a flood churns anyway. A slot being written holds
 * LB_FLOW_BUSY, which is no flow's tag. */
static __always_inline struct lb_flow *flow_find(void *map, __u32 mask, __u32 choices, __u64 tag, __u64 *word, __u32 *at)
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
		*word = w;
		*at = k;
		return e;
	}
	return NULL;
}

/* Records where the flow of entry `k` hashes (`rec`: lb.h, struct lb_flow_record, as one word),
 * in `recs`, the records of the entry's table. Called once the entry's word is written. */
static __always_inline void flow_note(void *recs, __u32 k, __u64 rec)
{
	__u64 *r = bpf_map_lookup_elem(recs, &k);

	if (r)
		*(volatile __u64 *)r = rec;
}

/* A flow's record (lb.h, struct lb_flow_record) from its tag and its destination-table entry. */
static __always_inline __u64 flow_record(__u64 tag, __u32 slot)
{
	return (__u64)(slot + 1) << 32 | (__u32)tag;
}

/* Whether an entry has ended: its flow idle past the entry's life (ct_life()) for a flow
 * timeout of `timeout` ticks. */
static __always_inline int ct_expired(const struct flow_word *f, __u32 timeout, __u32 now)
{
	__u32 life = ct_life(f->flags, timeout);

	return life != 0 && ct_age(f->seen, now) >= life;
}

/* The record of an entry's backend while its id still names the backend the entry was made for
 * (the id's generation unchanged), else NULL. */
static __always_inline struct lb_backend *ct_backend(const struct flow_word *f)
{
	__u32 id = f->backend;
	struct lb_backend *be = bpf_map_lookup_elem(&backends, &id);
	__u32 *gen = bpf_map_lookup_elem(&backend_gen, &id);

	return be && gen && (*gen & LB_FLOW_GEN_MASK) == f->gen ? be : NULL;
}

/* Whether a tracked entry leads somewhere now: its backend alive, the id not given to another
 * backend since, and the entry not ended (ct_expired()). */
static __always_inline int usable(const struct flow_word *f, __u32 timeout, __u32 now)
{
	struct lb_backend *be = ct_backend(f);

	return be && (be->flags & LB_BACKEND_ALIVE) && !ct_expired(f, timeout, now);
}

/* Whether a confirmed entry's flow may still come back to it, so that no other flow may take its
 * slot: not ended, and its id still its backend's and in the pool, alive or down for now (a failed
 * health check, its agent's `down`). A backend that comes back serves its quiet flows again, as
 * the sweep of stable slots assumes (src/balancer/sweep.rs); before, a promotion took such
 * entries first, so a pair flood while a backend was down for a moment cost its quiet flows their
 * backend (issue 38, item 13). Only the timeout, or an id retired from the pool or given to
 * another backend, gives the slot away. */
static __always_inline int ct_held(const struct flow_word *f, __u32 timeout, __u32 now)
{
	struct lb_backend *be = ct_backend(f);

	return be && (be->flags & (LB_BACKEND_ALIVE | LB_BACKEND_IN_POOL)) && !ct_expired(f, timeout, now);
}

/* Which slot a promotion (`guarded`) or a first packet (not) takes, as a rank: the smallest
 * wins; ~0: none. Free first; then an entry that has ended for good (expired, reset past its
 * life, its backend retired from the pool or its id reused; an unconfirmed one by its age
 * alone), the one seen longest ago; then an unconfirmed one, the one seen LAST (a flood's own
 * young entries go before a real flow that showed its handshake and has been quiet since);
 * never a confirmed one whose flow may still come back to it (ct_held()). Without the guard
 * (`guarded` 0: a flow's first packet in `flows`, or a record in `flow_pending`), any, the one
 * seen longest ago. A slot being written is another CPU's. */
static __always_inline __u64 evict_rank(__u64 tag, __u64 w, int guarded, __u32 now)
{
	struct flow_word f = flow_unpack(w);
	__u64 age = ct_age(f.seen, now);
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
	if (!(f.flags & LB_FLOW_CONFIRMED))
		return ct_expired(&f, timeout, now) ? (1ull << 33) | (0xffffffffull - age) : (2ull << 33) | age;
	return ct_held(&f, timeout, now) ? ~0ull : (1ull << 33) | (0xffffffffull - age);
}

/* Writes a flow into `map` (and its record `rec` into `recs`): into `have` (the slot that
 * already has its tag, at index `at`), else the slot of its buckets evict_rank() ranks first. Every claim is a compare-and-swap of the tag from the
 * value judged to LB_FLOW_BUSY, so two CPUs never write one slot at once: the one that loses
 * leaves the flow unrecorded. After the claim the word is written by a compare-and-swap from
 * the word judged (a packet may have confirmed the flow between the judgement and the claim);
 * if that fails, the slot gets its tag back untouched. Returns 1 when
 * that forgot another flow, 0 when written, -1 when not. */
static __always_inline int flow_put(void *map, void *recs, __u32 mask, __u32 choices, __u64 tag, struct lb_flow *have, __u32 at, __u64 word, int guarded, __u32 now, __u64 rec)
{
	struct lb_flow *victim = have;
	__u64 old = tag, best = ~0ull, w = 0;
	__u32 slot = at;

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
	flow_note(recs, slot, rec);
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

#endif /* LB_FLOW_H */
