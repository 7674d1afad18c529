/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Fragments, as the packet handlers meet them (frag_map.h says how a first fragment's backend is
 * recorded): a datagram's fragment key, and what a later fragment, which carries no ports, does:
 * follow its first fragment's backend when that is recorded, or take the fragment route of its
 * address (route.h; docs/data-plane.md, "Fragments"). */
#ifndef LB_FRAG_H
#define LB_FRAG_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lb.h"
#include "maps.h"
#include "parse.h"
#include "frag_map.h"
#include "route.h"

/* A datagram's fragment key: what every one of its fragments carries, in this CPU's scratch
 * room (frag_map.h, frag_scratch); NULL if there is none (never expected). */
static __always_inline struct lb_frag_key *frag_key(const void *src, const __u32 dst[4], __be32 id, __u8 proto, __u8 family)
{
	__u32 zero = 0;
	struct lb_frag_key *k = bpf_map_lookup_elem(&frag_scratch, &zero);

	if (!k)
		return NULL;
	__builtin_memset(k, 0, sizeof(*k));
	if (family == LB_FAMILY_V4)
		k->src[0] = *(const __be32 *)src;
	else
		__builtin_memcpy(k->src, src, 16);
	__builtin_memcpy(k->dst, dst, 16);
	k->id = id;
	k->proto = proto;
	k->family = family;
	return k;
}

/* A later fragment (no ports): where its datagram's first fragment went, if that is recorded;
 * otherwise the fragment route of its (address, protocol) decides, as for any fragment: by the
 * client's address (`client_hash`) when that route hashes by it, else dropped. An IPv6 later
 * fragment whose fragment header names an extension header (the fragmentable part starts with
 * destination options, say) has no protocol lb could route by: without a record it is dropped
 * when its address has services, and passed otherwise. */
static __always_inline int later_fragment(struct pkt *p, const struct lb_frag_key *k, __u32 client_hash)
{
	const struct lb_service *svc = NULL;
	const struct lb_frag *f;

	if (k->proto == IPPROTO_TCP || k->proto == IPPROTO_UDP) {
		svc = find_route(k->dst, key_tail(0, k->proto, k->family));
		if (!svc)
			return count(LB_STAT_PASSED, XDP_PASS);
	} else if (!has_services(k->dst, k->family)) {
		return count(LB_STAT_PASSED, XDP_PASS);
	}
	if (p->refuse)
		return count(p->refuse, XDP_DROP);
	f = frag_find(k);
	if (f) {
		/* The first fragment's own service (its port and protocol), as it is now. */
		const struct lb_service *own = find_route(k->dst, key_tail(f->port, f->proto, k->family));
		__u32 id = f->backend;

		if (own) {
			p->hash = f->hash;
			count(LB_FRAG_FOLLOWED, 0);
			return to_backend(p, own, id);
		}
	}
	count(LB_FRAG_UNMATCHED, 0);
	if (!svc || svc->hash_mode != LB_HASH_CLIENT_IP)
		return count(LB_DROP_FRAGMENT, XDP_DROP);
	p->hash = client_hash;
	return forward(p, svc);
}

#endif /* LB_FRAG_H */
