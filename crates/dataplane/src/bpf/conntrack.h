/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Connection tracking's policy, on the flow tables of flow.h: ct_choose() decides which packets
 * make, keep, confirm, promote, reset, adopt or remake an entry, with or without the ct_guard;
 * tracked() calls it for a packet; route_icmp() sends an ICMP error to its flow's backend. Its own
 * header, as conntrack is its own concern beside routing: route.h decides for a flow that has no
 * usable entry, this file decides whether it has one. It returns backend ids, and lb.bpf.c sends.
 * Its own maps (the young filter, the sampler) are conntrack_map.h's. docs/data-plane.md
 * ("Connection tracking against crafted packets") and docs/security.md say what each rule
 * defends against. */
#ifndef LB_CONNTRACK_H
#define LB_CONNTRACK_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lb.h"
#include "maps.h"
#include "parse.h"
#include "route.h"
#include "flow.h"
#include "conntrack_map.h"

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

/* An RST's effect on `seen`: the entry then lives LB_CT_RESET_TICKS from `seen` (ct_life()),
 * so this makes it end about 4 s from now, or by the time its timeout from `seen` is over if that
 * is sooner (an RST never extends an entry, though it may take away the refresh interval that
 * ct_life() allows past the timeout). An unconfirmed entry keeps its `seen`: its flow's first packets
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
 * written word rewrites the flow's record too (flow.h, flow_note()). A packet sooner than that after an RST clears the reset (the flow goes on: RSTs can be spoofed)
 * and changes nothing else, so RSTs neither confirm an entry nor keep one from being
 * confirmed. */
static __always_inline void refresh(struct lb_flow *e, __u32 at, struct flow_word f, __u64 w, __u32 timeout, __u32 now, int rst, __u64 rec)
{
	__u32 every = ct_refresh_every(timeout);

	if (rst) {
		if (f.flags & LB_FLOW_RESET)
			return;
		f.seen = reset_seen(&f, timeout, now);
		f.flags |= LB_FLOW_RESET;
	} else if (ct_age(f.seen, now) >= every) {
		f.flags = (f.flags & ~LB_FLOW_RESET) | LB_FLOW_CONFIRMED;
		f.seen = now;
	} else if (f.flags & LB_FLOW_RESET) {
		f.flags &= ~LB_FLOW_RESET;
	} else {
		return;
	}
	/* The record first: a sweep that reads the new `seen` must find the record written with
	 * it (if the swap is lost to another flow's writer, that flow's tag differs from the
	 * record's, which the sweep takes for unknown). */
	flow_note(&flow_records, at, rec);
	__sync_val_compare_and_swap(flow_word_of(e), w, flow_repack(&f));
}

/* The record (flow.h, flow_record()) of a flow with tag `tag` whose entry of the destination
 * tables is `slot`, in a table of `slots` entries (0: none, and no record). Computed where it
 * is written rather than kept: ct_choose() has no stack to spare. */
static __always_inline __u64 ct_rec(__u64 tag, __u32 slot, __u32 slots)
{
	return slots ? flow_record(tag, slot) : 0;
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

/* Set in what ct_choose() returns (above any backend id) when the packet adopted its flow into
 * the half-open table: tracked() then makes the flow young, so that its next packets take the
 * whole path and promote and confirm it even on a stable slot. */
#define LB_CT_ADOPTING 0x80000000u
/* Set in what ct_choose() returns when the packet promoted its flow from the half-open table
 * (its second packet, with ct_guard): tracked() then has the no_data signal watch the flow's end
 * (ct_quiet_note()). */
#define LB_CT_PROMOTED 0x40000000u

/* A flow with no established entry but a half-open record `pe` (word `w`, at `at`): a SYN sent
 * again goes where the first went; the flow's next packet makes it established, if its buckets
 * have room it may take, or is followed through the record; an RST shortens the record's life.
 * A record whose backend is gone or down is re-picked first. A promotion returns the backend
 * with LB_CT_PROMOTED. Part of ct_choose(). */
static __always_inline __u32 ct_half_open(struct lb_flow *pe, __u64 w, __u32 at, __u64 tag, __u32 slot, __u32 slots,
					   __u32 now, __u32 timeout, __u32 pflags, int syn, int rst)
{
	__u32 mask = lb_settings.ct_mask, pmask = lb_settings.ct_pending_mask, id, *gen, promoted = 0;
	struct flow_word f;

	f = flow_unpack(w);
	int stale = !usable(&f, timeout, now);
	int put;

	if (stale) {
		/* Its first packet went to a backend that is gone or down (or long
		 * ago): the table decides again. */
		count(LB_CT_STALE, 0);
		id = pick_slot(slots, slot);
		if (id == 0)
			return 0;
		gen = bpf_map_lookup_elem(&backend_gen, &id);
		f.backend = id;
		f.gen = gen ? *gen : 0;
	}
	if (syn) {
		/* A SYN sent again: where the first one went. */
		if (!stale)
			add_signal(f.backend, LB_SIGNAL_SYN_AGAIN);
		if (stale)
			flow_put(&flow_pending, &pending_records, pmask, 1, tag, pe, at, flow_pack(f.backend, f.gen, pflags, now), 0, now, ct_rec(tag, slot, slots));
		else
			count(LB_CT_HIT, 0);
		return f.backend;
	}
	/* The flow's next packet: established, with the backend its first went to,
	 * if its buckets have room it may take. */
	if (!rst) {
		put = flow_put(&flows, &flow_records, mask, 2, tag, NULL, 0, flow_pack(f.backend, f.gen, pflags, now), 1, now, ct_rec(tag, slot, slots));
		if (put >= 0) {
			if (put > 0)
				count(LB_CT_EVICTED, 0);
			count(LB_CT_NEW, 0);
			flow_end(pe, tag);
			/* Normally the handshake's ACK: tracked() has the no_data signal watch how
			 * the flow ends. */
			promoted = LB_CT_PROMOTED;
		} else {
			/* Followed through its half-open record, which is kept
			 * fresh as a tracked flow's entry is (and cleared of a reset):
			 * else it would run out a timeout after the flow's first
			 * packet, and the flow be re-picked in mid-stream. */
			count(LB_CT_NO_ROOM, 0);
			if (stale)
				flow_put(&flow_pending, &pending_records, pmask, 1, tag, pe, at, flow_pack(f.backend, f.gen, pflags, now), 0, now, ct_rec(tag, slot, slots));
			else if ((f.flags & LB_FLOW_RESET) || ct_age(f.seen, now) >= ct_refresh_every(timeout)) {
				flow_note(&pending_records, at, ct_rec(tag, slot, slots));
				__sync_val_compare_and_swap(flow_word_of(pe), w, flow_pack(f.backend, f.gen, pflags, now));
			}
		}
	} else if (!stale && !(f.flags & LB_FLOW_RESET)) {
		/* An RST shortens a half-open record's life as it does an
		 * unconfirmed entry's (it may be spoofed): about 4 s from the
		 * flow's last packet. */
		add_signal(f.backend, LB_SIGNAL_RESET_EARLY);
		f.flags |= LB_FLOW_RESET;
		__sync_val_compare_and_swap(flow_word_of(pe), w, flow_repack(&f));
	} else if (stale) {
		flow_put(&flow_pending, &pending_records, pmask, 1, tag, pe, at, flow_pack(f.backend, f.gen, pflags, now), 0, now, ct_rec(tag, slot, slots));
	}
	if (!stale)
		count(LB_CT_HIT, 0);
	return f.backend | promoted;
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
 * is the flow's keyed tag (flow_tag16/flow_tag40). With LB_CT_PROMOTED set in what it returns
 * (above any backend id), the packet moved its flow from the half-open table to the flow table:
 * normally the handshake's ACK. */
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
	/* The flow's entry of the destination tables, for picking and for its record. */
	__u32 slots = (__u32)table, slot = slots ? (table >> 32) + hash % slots : 0, at = 0;
	struct lb_flow *e, *pe;
	struct flow_word f;
	__u64 w;

	tag |= 1;
	e = flow_find(&flows, mask, 2, tag, &w, &at);
	if (e) {
		f = flow_unpack(w);
		int ok = usable(&f, timeout, now);

		/* A pure SYN follows a live entry (a retransmitted SYN; a spoofed one, which the
		 * backend answers with a challenge ACK) unless the flow has been silent long
		 * enough to have ended: then it is a new connection on the same ports. */
		if (ok && !(syn && !(f.flags & LB_FLOW_RESET) && ct_age(f.seen, now) >= ct_syn_idle(timeout))) {
			/* On a flow not yet confirmed, a SYN again betrays a backend that did not
			 * answer (without ct_guard, a flow's first SYN makes this entry). */
			if (syn && !(f.flags & LB_FLOW_CONFIRMED))
				add_signal(f.backend, LB_SIGNAL_SYN_AGAIN);
			if (!syn)
				refresh(e, at, f, w, timeout, now, rst, ct_rec(tag, slot, slots));
			count(LB_CT_HIT, 0);
			return f.backend;
		}
		if (!ok)
			count(LB_CT_STALE, 0);
		id = pick_slot(slots, slot);
		if (id == 0)
			return 0;
		gen = bpf_map_lookup_elem(&backend_gen, &id);
		flow_put(&flows, &flow_records, mask, 2, tag, e, at, flow_pack(id, gen ? *gen : 0, pflags, now), 0, now, ct_rec(tag, slot, slots));
		count(LB_CT_NEW, 0);
		if (syn)
			add_signal(id, LB_SIGNAL_SYN);
		return id;
	}
	count(LB_CT_MISS, 0);
	if (lb_settings.ct_guard) {
		pe = flow_find(&flow_pending, pmask, 1, tag, &w, &at);
		if (pe)
			return ct_half_open(pe, w, at, tag, slot, slots, now, timeout, pflags, syn, rst);
		id = pick_slot(slots, slot);
		if (id == 0)
			return 0;
		if (adopt && (proto_flags >> 16))
			id = proto_flags >> 16;
		if (first || adopt) {
			gen = bpf_map_lookup_elem(&backend_gen, &id);
			flow_put(&flow_pending, &pending_records, pmask, 1, tag, NULL, 0, flow_pack(id, gen ? *gen : 0, pflags, now), 0, now, ct_rec(tag, slot, slots));
			count(LB_CT_PENDING, 0);
			if (syn)
				add_signal(id, LB_SIGNAL_SYN);
			if (adopt) {
				count(LB_CT_ADOPTED, 0);
				return id | LB_CT_ADOPTING;
			}
		}
		return id;
	}
	id = pick_slot(slots, slot);
	if (id == 0)
		return 0;
	if (adopt && (proto_flags >> 16))
		id = proto_flags >> 16;
	if (adopt)
		count(LB_CT_ADOPTED, 0);
	if (first || adopt) {
		gen = bpf_map_lookup_elem(&backend_gen, &id);
		if (flow_put(&flows, &flow_records, mask, 2, tag, NULL, 0, flow_pack(id, gen ? *gen : 0, pflags, now), 0, now, ct_rec(tag, slot, slots)) > 0)
			count(LB_CT_EVICTED, 0);
		count(LB_CT_NEW, 0);
		if (syn)
			add_signal(id, LB_SIGNAL_SYN);
	}
	return id;
}

/* The cell of ct_young for flow hash `hash`, or NULL. */
static __always_inline __u16 *young_cell(__u32 hash)
{
	__u32 line = (hash / LB_CT_YOUNG_LINE) % (LB_CT_YOUNG / LB_CT_YOUNG_LINE);
	struct lb_young *y = bpf_map_lookup_elem(&ct_young, &line);

	return y ? &y->at[hash % LB_CT_YOUNG_LINE] : NULL;
}

/* Makes the flow of hash `hash` young from now (ct_young). */
static __always_inline void young_from_now(__u32 hash)
{
	__u16 *at = young_cell(hash);

	if (at)
		*at = ct_now();
}

/* Whether the flow of hash `hash` is young: a SYN of its cell came within two refresh
 * intervals. No map (never so): young, the safe answer. */
static __always_inline int young(__u32 hash)
{
	__u16 *at = young_cell(hash);
	__u16 age;

	if (!at)
		return 1;
	age = (__u16)ct_now() - *at;
	/* A stamp a few ticks ahead: another CPU's SYN since this packet read the clock. */
	return age <= 2 * LB_CT_REFRESH_TICKS || (__u16)-age <= LB_CT_YOUNG_AHEAD_TICKS;
}

/* Whether this packet is one of the 1 in 2^LB_SLOT_SAMPLE_SHIFT (at random) that takes the whole
 * tracked path on a stable slot. */
static __always_inline int ct_sampled(void)
{
	__u32 zero = 0, x, *state = bpf_map_lookup_elem(&ct_sampler, &zero);

	if (!state)
		return 1;
	x = *state ? *state : 0x9e3779b9;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	*state = x;
	return (x >> 7 & ((1u << LB_SLOT_SAMPLE_SHIFT) - 1)) == 0;
}

/* Slot `slot`'s word in table_slots (a backend id and lb.h's enum lb_slot_bits), or 0 when there
 * is none. */
static __always_inline __u32 slot_word(__u32 slot)
{
	__u32 half = slot >> 1;
	struct lb_slot_pair *pair = bpf_map_lookup_elem(&table_slots, &half);

	return pair ? pair->id[slot & 1] : 0;
}

/* A tracked service's packet that needs no flow-table lookup: a TCP packet other than a pure SYN
 * whose slot is stable (lb.h, enum lb_slot_bits) goes by the table, since the sweep marks a
 * slot stable only once no entry naming another backend can hash to it: an entry of its flow,
 * if any, names the slot's owner. That skips the lookup (a cache miss in a table of many flows)
 * and the flow's keyed tag. A young flow's packets (its first two refresh intervals after its
 * SYN), and one other packet in 2^LB_SLOT_SAMPLE_SHIFT, take the whole path anyway, which
 * makes, confirms and refreshes the flow's entry for the day its slot changes. Returns the backend id, or 0: take the whole
 * path (tracked()). */
static __always_inline __u32 by_stable_slot(struct pkt *p, const struct lb_service *svc, __u8 proto, __u8 tcp_flags)
{
	__u32 word;

	if (proto != IPPROTO_TCP || svc->slots == 0 || lb_settings.stable_off)
		return 0;
	/* A pure SYN takes the whole path, and stamps its flow's cell so that the flow's packets
	 * do too while it is young: they make and confirm its entry, as before stable slots. */
	if ((tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
		young_from_now(p->hash);
		return 0;
	}
	/* An RST follows the flow's entry, read but not written (tracked()). */
	if ((tcp_flags & TCP_FLAG_RST) || young(p->hash))
		return 0;
	word = slot_word(svc->base + p->hash % svc->slots);
	if ((word & LB_SLOT_UNSTABLE) || !(word & LB_SLOT_ID_MASK))
		return 0;
	if (ct_sampled())
		return 0;
	count(LB_CT_STABLE, 0);
	return word & LB_SLOT_ID_MASK;
}

/* The backend a packet of `svc`'s flow (flow hash p->hash, keyed tag `tag`) goes to by its
 * entry, looked up and never written (in the flow table, else the half-open one), or else by the
 * table: 0 when dropped (counted). For the packets that must reach the flow's backend without
 * changing what lb knows of the flow: ICMP errors, and RSTs on stable slots (`counted`: as a
 * lookup's hit or miss). */
static __always_inline __u32 ct_peek(struct pkt *p, const struct lb_service *svc, __u64 tag, __u8 proto, int counted)
{
	__u32 now = ct_now(), at;
	struct flow_word f;
	__u64 w;

	tag |= 1;
	if (svc->flags & LB_SVC_CONNTRACK) {
		if (flow_find(&flows, lb_settings.ct_mask, 2, tag, &w, &at) ||
		    flow_find(&flow_pending, lb_settings.ct_pending_mask, 1, tag, &w, &at)) {
			f = flow_unpack(w);
			if (usable(&f, ct_timeout_ticks(proto), now)) {
				if (counted)
					count(LB_CT_HIT, 0);
				return f.backend;
			}
		}
	}
	if (counted)
		count(LB_CT_MISS, 0);
	return pick(svc, p->hash);
}

/* Has the no_data signal watch the end of the flow of hash `hash`, promoted to `id`, whose
 * handshake's ACK acknowledges `ack` (as the packet's bytes; 0: nothing to watch), with the
 * id's generation now. A global function, verified once for both families. Returns 0. */
__noinline int ct_quiet_note(__u32 hash, __u32 ack, __u32 id)
{
	__u32 *gen = bpf_map_lookup_elem(&backend_gen, &id);

	if (gen)
		quiet_note(hash, ack, id, *gen);
	return 0;
}

/* A tracked service's client FIN or RST with ACK, of flow hash `hash`, acknowledging `ack` (as
 * the packet's bytes): when the flow's handshake is watched (conntrack_map.h, ct_quiet) and the
 * client acknowledges the same as in it, the backend sent it nothing since the SYN-ACK (or it
 * never arrived): counted once, as no_data for the backend the flow was promoted to, whatever
 * path the packet then takes (a stable slot's, the flow's entry). A global function, verified
 * once for both families. Returns 0. */
__noinline int ct_quiet_end(__u32 hash, __u32 ack)
{
	__u32 id, *gen;
	__u64 *cell, w;

	/* Without the guard no cell is ever written. */
	if (ack == 0 || !lb_settings.ct_guard)
		return 0;
	cell = quiet_cell(hash, ack);
	if (!cell)
		return 0;
	w = *(volatile __u64 *)cell;
	if (!quiet_match(w, hash, ack) || __sync_val_compare_and_swap(cell, w, 0) != w)
		return 0;
	/* Counted for the backend only while its id has the generation the flow was sent to. */
	id = w & 0xffff;
	gen = bpf_map_lookup_elem(&backend_gen, &id);
	if (gen && (*gen & 0xff) == ((w >> 16) & 0xff))
		add_signal(id, LB_SIGNAL_NO_DATA);
	return 0;
}

/* ct_choose() for a packet of `svc` whose flow hash is p->hash and keyed tag `tag`: the
 * backend id, or 0. A packet in mid-connection may be adopted to the slot's first hop only
 * where the slot is unstable: a stable slot's flows all go where the table says. A flow the
 * packet adopted is made young (ct_young): a sampled packet that found no entry (its half-open
 * record pushed out by a SYN flood, say) is followed at once by one that promotes it. */
static __always_inline __u32 tracked(struct pkt *p, const struct lb_service *svc, __u64 tag, __u8 proto, __u8 tcp_flags, __u32 ack)
{
	__u32 hop = 0, id, word = svc->slots ? slot_word(svc->base + p->hash % svc->slots) : 0;

	/* An RST on a stable slot goes where the flow's earlier packets went, by its entry if it
	 * has one (a young flow's packets, and a sample, take the whole path there and may follow
	 * an entry), and leaves the entry alone: a spoofed RST must not shorten the life of an
	 * entry whose flow's later packets go by the table and would never clear the reset. */
	if (proto == IPPROTO_TCP && (tcp_flags & TCP_FLAG_RST) && !lb_settings.stable_off && !(word & LB_SLOT_UNSTABLE) && (word & LB_SLOT_ID_MASK))
		return ct_peek(p, svc, tag, proto, 1);
	if (!(tcp_flags & TCP_FLAG_SYN) && (word & LB_SLOT_UNSTABLE))
		hop = adopt_hop(svc, p->hash);
	id = ct_choose(tag, p->hash, (__u64)svc->base << 32 | svc->slots, proto | (__u32)tcp_flags << 8 | hop << 16);
	if (id & LB_CT_ADOPTING)
		young_from_now(p->hash);
	/* A TCP handshake's ACK (not a FIN or an RST: no handshake to watch) made the flow's entry. */
	if ((id & LB_CT_PROMOTED) && (tcp_flags & (TCP_FLAG_ACK | TCP_FLAG_FIN | TCP_FLAG_RST)) == TCP_FLAG_ACK)
		ct_quiet_note(p->hash, ack, id & LB_SLOT_ID_MASK);
	return id & ~(LB_CT_ADOPTING | LB_CT_PROMOTED);
}

/* An ICMP error about a service's flow (p->hash already the flow's hash for the table, tag its
 * keyed tag as the client's own packets have it): the backend that owns the flow, by the
 * flow's entry (looked up, never made or refreshed) or else the same slot as the client's
 * packets; 0 when dropped. */
static __always_inline __u32 route_icmp(struct pkt *p, const struct lb_service *svc, __u64 tag, __u8 proto)
{
	__u32 id = ct_peek(p, svc, tag, proto, 0);

	if (id == 0)
		return 0;
	p->icmp = 1;
	count(LB_ICMP_FORWARDED, 0);
	return id;
}

#endif /* LB_CONNTRACK_H */
