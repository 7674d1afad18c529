/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Fragments: where a datagram's first fragment went, so that its later fragments, which carry no
 * ports, go to the same backend. A first fragment (IPv4: more-fragments set, offset 0; IPv6: a
 * fragment header with offset 0 and M set) is balanced like any packet, by the flow table or the
 * destination table; send() then records the backend here, keyed by what every fragment of the
 * datagram carries: source, destination, identification, protocol and family. A later fragment
 * looks its datagram up here first; without a fresh record (it overtook its first fragment, the
 * record was evicted, or another node of a fleet saw the first) the fragment route decides as
 * it always did (route.h; docs/data-plane.md, "Fragments"), counted as unmatched.
 * Kernel-side only: user space never reads these maps or structs, so they are not in lb.h.
 * This file holds the maps and their records (route.h's send() records a first fragment's
 * backend); frag.h what a later fragment does with them. */
#ifndef LB_FRAG_MAP_H
#define LB_FRAG_MAP_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lb.h"
#include "maps.h"
#include "parse.h"

/* Records kept at once: datagrams in flight in fragments, across all clients. An LRU map, so a
 * flood of spoofed first fragments only makes records older than itself fall out (their later
 * fragments then take the fragment route, counted). */
#ifndef LB_FRAG_ENTRIES
#define LB_FRAG_ENTRIES 8192
#endif
/* A record older than this is ignored: Linux gives up reassembling an IPv4 datagram after 30 s
 * (net.ipv4.ipfrag_time) and an IPv6 one after 60 s (net.ipv6.ip6frag_time), and an
 * identification may be reused after that. Per family, so that a backend still reassembling
 * gets every fragment its own stack waits for. */
#define LB_FRAG_TTL4_NS (30ull * 1000 * 1000 * 1000)
#define LB_FRAG_TTL6_NS (60ull * 1000 * 1000 * 1000)

/* The key, struct lb_frag_key, is in parse.h: the parsed packet points to one. */

/* Each CPU's room for the fragment key of the packet it parses: a fragment's key is built here
 * rather than on lb_xdp()'s stack, which shares the verifier's 512 bytes with ct_choose()'s.
 * Never pinned: it holds nothing between packets. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_frag_key);
} frag_scratch SEC(".maps");

/* Where the first fragment went. */
struct lb_frag {
	__u64 born_ns;   /* bpf_ktime_get_coarse_ns() when the first fragment was sent */
	__u32 backend;   /* backend id */
	__u32 gen;       /* backend_gen of the id then: a record of a reissued id is ignored */
	__u32 hash;      /* the first fragment's flow hash: outer headers (GUE port, source) alike */
	__be16 port;     /* the first fragment's destination port: its service, looked up again */
	__u8 proto;      /* and its upper-layer protocol (TCP or UDP): the key's may name an
			  * extension header (IPv6) */
	__u8 pad;
};

/* First fragments -> where they went (struct lb_frag). Shared by all CPUs: fragments of one
 * datagram may be received on different queues. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_FRAG_ENTRIES);
	__type(key, struct lb_frag_key);
	__type(value, struct lb_frag);
} frag_routes SEC(".maps");

/* Whether record `f` of key `k` still counts: younger than its family's reassembly time, and
 * its backend id not reissued since. */
static __always_inline int frag_fresh(const struct lb_frag_key *k, const struct lb_frag *f)
{
	__u64 ttl = k->family == LB_FAMILY_V6 ? LB_FRAG_TTL6_NS : LB_FRAG_TTL4_NS;
	__u32 id = f->backend, *gen;

	if (bpf_ktime_get_coarse_ns() - f->born_ns > ttl)
		return 0;
	gen = bpf_map_lookup_elem(&backend_gen, &id);
	return gen && *gen == f->gen;
}

/* Records that a first fragment (`k`, destination port `port`, protocol `proto`) was sent to
 * backend `id`. Only a first fragment that agrees with a fresh record of its key refreshes
 * it: one for another port (another service of the VIP) or another backend is either a
 * spoof (anyone may send a first fragment with a victim's source and identification) or a
 * collision of identifications, and nobody can tell which, so the record is deleted rather
 * than re-pointed; the datagram's later fragments then take the fragment route, counted as
 * unmatched, and never follow a stranger to another service's backend. */
static __always_inline void frag_record(const struct lb_frag_key *k, __be16 port, __u8 proto, __u32 id, __u32 hash)
{
	struct lb_frag *old = bpf_map_lookup_elem(&frag_routes, k);
	__u32 *gen = bpf_map_lookup_elem(&backend_gen, &id);
	struct lb_frag f = {
		.born_ns = bpf_ktime_get_coarse_ns(),
		.backend = id,
		.gen = gen ? *gen : 0,
		.hash = hash,
		.port = port,
		.proto = proto,
	};

	if (old && frag_fresh(k, old) && (old->port != port || old->proto != proto || old->backend != id)) {
		if (bpf_map_delete_elem(&frag_routes, k) == 0)
			count(LB_FRAG_CONFLICT, 0);
		return;
	}
	if (bpf_map_update_elem(&frag_routes, k, &f, BPF_ANY) == 0)
		count(LB_FRAG_RECORDED, 0);
}

/* The fresh record of a later fragment's datagram, whose backend id still belongs to the
 * backend the first fragment went to; or NULL. */
static __always_inline const struct lb_frag *frag_find(const struct lb_frag_key *k)
{
	struct lb_frag *f = bpf_map_lookup_elem(&frag_routes, k);

	if (!f || !frag_fresh(k, f))
		return NULL;
	return f;
}

#endif /* LB_FRAG_MAP_H */
