/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Connection tracking's own maps, beside the flow tables (flow_map.h): the stable path's
 * sampler and the filter of young flows. Their use is conntrack.h's. */
#ifndef LB_CONNTRACK_MAP_H
#define LB_CONNTRACK_MAP_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lb.h"

/* Each CPU's state of the stable path's sampler (xorshift32): the kernel's bpf_get_prandom_u32()
 * measured about 70 ns a call here, more than the lookup it lets a packet skip. Never pinned:
 * a new program starts its own sequence. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} ct_sampler SEC(".maps");

/* Recent SYNs on the stable path, as a filter: cell `hash % LB_CT_YOUNG` holds the low 16 bits
 * of the clock (ticks, flow.h) when a SYN of a flow hashing to it last came. A flow whose cell
 * was stamped within two refresh intervals (about 2 s) is *young*: its packets take the whole
 * path, so that its next packet makes its entry and one a refresh interval later confirms it, as
 * every packet did before stable slots (a confirmed entry is what a pair flood cannot displace).
 * Only times are kept, no flow's hash: another flow's SYN on the same cell only makes it younger,
 * so no SYN, nor a flood of them, can make a young flow old; a flood makes more flows young
 * (they pay the lookup, as before stable slots), never fewer. A cell stamped 2^16 ticks (about
 * 18 min) ago, or never (0 after a load), reads as young for about 2 s in every 18 min, all
 * such cells at once: their flows pay the lookup then, which is harmless. 32 cells of 2 bytes
 * to a value (a cache line), 2 MiB in all: with 2^16 cells the 1% of SYNs in the many-flow
 * benchmark kept most cells recent (only 7% of a million flows' packets went the stable way),
 * with 2^20 79% did (docs/benchmarks.md). Shared by all CPUs, not per
 * CPU: a flow's packets may be processed on another CPU than its SYN (on a veth, the
 * sender's). Never pinned. */
#define LB_CT_YOUNG (1u << 20)
#define LB_CT_YOUNG_LINE 32
struct lb_young {
	__u16 at[LB_CT_YOUNG_LINE];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_CT_YOUNG / LB_CT_YOUNG_LINE);
	__type(key, __u32);
	__type(value, struct lb_young);
} ct_young SEC(".maps");

/* Backend id -> its signals from real traffic (lb.h, struct lb_signals), counted on the few
 * packets that begin or end a flow, never on an established one's. Read by the controller,
 * which compares each backend with its service's others; never pinned (rates are read as
 * differences). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_signals);
} backend_signals SEC(".maps");

/* Which field of struct lb_signals a packet adds to (add_signal()). */
enum lb_signal {
	LB_SIGNAL_SYN = 0,
	LB_SIGNAL_SYN_AGAIN = 1,
	LB_SIGNAL_RESET_EARLY = 2,
	LB_SIGNAL_NO_DATA = 3,
	LB_SIGNAL_HANDSHAKE = 4,
};

/* Handshakes whose end is watched for the no_data signal (struct lb_signals): when a flow is
 * promoted at its second packet (ct_guard), normally the handshake's ACK, its acknowledgment
 * number (the backend's initial sequence number + 1, as the packet's bytes) is written to cell
 * `(hash ^ ack) % LB_CT_QUIET` as one word (quiet_word()): the ack in the high half; the flow
 * hash's top 8 bits, the low 8 bits of the backend id's generation and the backend id in the low
 * half; and the backend's `handshakes` is counted. A client FIN or RST that carries the same ack
 * and hash has acknowledged nothing the backend sent since its SYN-ACK: the cell is cleared (so
 * a retransmitted FIN counts once) and, if the id still has that generation, the backend's
 * no_data counted (ct_quiet_end(), conntrack.h). Sampling, not tracking: another handshake
 * landing on the cell before the flow ends takes it, and that flow is not judged; with 2^18
 * cells, a flow lives through about 2^18 other handshakes (at 10,000 new connections a second,
 * 26 s), and a lost sample is as likely on every backend. A FIN matches a connection's cell
 * only with the backend's 32-bit random ISN (the flow hash is public: a spoofer who knows the
 * connection's tuple can find another tuple with the same cell and hash bits), so nobody can
 * count or clear a connection's cell without seeing its packets but by a 1-in-2^32 guess; what
 * anybody can do is make handshakes of their own (docs/security.md). 2 MiB, shared by all CPUs
 * (a flow's FIN may come on another CPU than its ACK), never pinned. */
#define LB_CT_QUIET (1u << 18)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_CT_QUIET);
	__type(key, __u32);
	__type(value, __u64);
} ct_quiet SEC(".maps");

/* The cell of ct_quiet of a flow of hash `hash` whose client acknowledges `ack`, or NULL. */
static __always_inline __u64 *quiet_cell(__u32 hash, __u32 ack)
{
	__u32 k = (hash ^ ack) % LB_CT_QUIET;

	return bpf_map_lookup_elem(&ct_quiet, &k);
}

static __always_inline __u64 quiet_word(__u32 hash, __u32 ack, __u32 backend, __u32 gen)
{
	return (__u64)ack << 32 | (hash & 0xff000000) | (gen & 0xff) << 16 | (backend & 0xffff);
}

/* Whether cell word `w` is the one a flow of hash `hash` acknowledging `ack` noted. */
static __always_inline int quiet_match(__u64 w, __u32 hash, __u32 ack)
{
	return (__u32)(w >> 32) == ack && ((__u32)w & 0xff000000) == (hash & 0xff000000);
}

/* Adds one to backend `id`'s signal `which`. */
static __always_inline void add_signal(__u32 id, __u32 which)
{
	struct lb_signals *s = bpf_map_lookup_elem(&backend_signals, &id);

	if (!s)
		return;
	if (which == LB_SIGNAL_SYN)
		s->syns += 1;
	else if (which == LB_SIGNAL_SYN_AGAIN)
		s->syn_again += 1;
	else if (which == LB_SIGNAL_RESET_EARLY)
		s->reset_early += 1;
	else if (which == LB_SIGNAL_NO_DATA)
		s->no_data += 1;
	else
		s->handshakes += 1;
}

/* Watches the end of the flow of hash `hash`, sent to `backend` of generation `gen`, whose
 * handshake's ACK acknowledges `ack` (0: nothing to watch), and counts the handshake. */
static __always_inline void quiet_note(__u32 hash, __u32 ack, __u32 backend, __u32 gen)
{
	__u64 *cell;

	if (ack == 0)
		return;
	cell = quiet_cell(hash, ack);
	if (!cell)
		return;
	*(volatile __u64 *)cell = quiet_word(hash, ack, backend, gen);
	add_signal(backend, LB_SIGNAL_HANDSHAKE);
}

#endif /* LB_CONNTRACK_MAP_H */
