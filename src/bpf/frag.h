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
 * Included by lb.bpf.c after maps.h (backend_gen, count()) and before route.h (send()). */
#ifndef LB_FRAG_H
#define LB_FRAG_H

/* Records kept at once: datagrams in flight in fragments, across all clients. An LRU map, so a
 * flood of spoofed first fragments only makes records older than itself fall out (their later
 * fragments then take the fragment route, counted). */
#ifndef LB_FRAG_ENTRIES
#define LB_FRAG_ENTRIES 8192
#endif
/* A record older than this is ignored: Linux gives up reassembling a datagram after 30 s
 * (net.ipv4.ipfrag_time), and an identification may be reused after that. */
#define LB_FRAG_TTL_NS (30ull * 1000 * 1000 * 1000)

/* The key, struct lb_frag_key, is in parse.h: the parsed packet carries one. */

/* Where the first fragment went. */
struct lb_frag {
	__u64 born_ns;   /* bpf_ktime_get_coarse_ns() when the first fragment was sent */
	__u32 backend;   /* backend id */
	__u32 gen;       /* backend_gen of the id then: a record of a reissued id is ignored */
	__u32 hash;      /* the first fragment's flow hash: outer headers (GUE port, source) alike */
	__be16 port;     /* the first fragment's destination port: its service, looked up again */
	__u8 pad[2];
};

/* First fragments -> where they went (struct lb_frag). Shared by all CPUs: fragments of one
 * datagram may be received on different queues. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_FRAG_ENTRIES);
	__type(key, struct lb_frag_key);
	__type(value, struct lb_frag);
} frag_routes SEC(".maps");

/* Records that a first fragment (`k`, destination port `port`) is sent to backend `id`. */
static __always_inline void frag_record(const struct lb_frag_key *k, __be16 port, __u32 id, __u32 hash)
{
	__u32 *gen = bpf_map_lookup_elem(&backend_gen, &id);
	struct lb_frag f = {
		.born_ns = bpf_ktime_get_coarse_ns(),
		.backend = id,
		.gen = gen ? *gen : 0,
		.hash = hash,
		.port = port,
	};

	if (bpf_map_update_elem(&frag_routes, k, &f, BPF_ANY) == 0)
		count(LB_FRAG_RECORDED, 0);
}

/* The fresh record of a later fragment's datagram, whose backend id still belongs to the
 * backend the first fragment went to; or NULL. */
static __always_inline const struct lb_frag *frag_find(const struct lb_frag_key *k)
{
	struct lb_frag *f = bpf_map_lookup_elem(&frag_routes, k);
	__u32 id, *gen;

	if (!f || bpf_ktime_get_coarse_ns() - f->born_ns > LB_FRAG_TTL_NS)
		return NULL;
	id = f->backend;
	gen = bpf_map_lookup_elem(&backend_gen, &id);
	if (!gen || *gen != f->gen)
		return NULL;
	return f;
}

#endif /* LB_FRAG_H */
