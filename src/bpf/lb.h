/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The one header shared by the XDP program and user space: every map key and value layout,
 * the limits, and the counter indices. Rust reads these through the skeleton's generated types,
 * never through a second hand-written copy. Fixed-width fields, network byte order where the
 * packet's bytes are copied, explicit padding, no functions. */
#ifndef LB_H
#define LB_H

#ifndef LB_MAX_SERVICES
#define LB_MAX_SERVICES 1024
#endif
#ifndef LB_MAX_BACKENDS
#define LB_MAX_BACKENDS 65536
#endif

/* The seed of every flow hash. Changing it moves every flow. */
#define LB_HASH_SEED 0x4c42ull /* "LB" */

enum lb_family {
	LB_FAMILY_V4 = 4,
	LB_FAMILY_V6 = 6,
};

enum lb_hash_mode {
	LB_HASH_CLIENT_IP = 0, /* source address only */
	LB_HASH_FLOW = 1,      /* 5-tuple */
};

/* Where a packet's (destination, port, protocol) is looked up first: a direct-mapped array of
 * LB_VIP_INDEX_SIZE route ids, indexed by lb_vip_index() of the packet's key. 0: no service
 * has this index, so the packet is not for a service (the common case for the host's own
 * traffic, decided with one array read). LB_VIP_INDEX_SHARED: several service keys share the
 * index; look the key up in the services hash map. Anything else: the one route whose key has
 * this index (the packet's key must still equal the route's key). */
enum lb_vip_index_layout {
	LB_VIP_INDEX_BITS = 16,
	LB_VIP_INDEX_SIZE = 1 << LB_VIP_INDEX_BITS,
	LB_VIP_INDEX_SHARED = 0x7fffffff, /* never a route id: those are at most LB_MAX_ROUTES */
};

/* Routes: one per service, plus one fragment route per (vip, protocol). */
#define LB_MAX_ROUTES (2 * LB_MAX_SERVICES)

/* A service's lookup key. IPv4 addresses use addr[0] only; the rest is zero. Port 0 is the
 * fragment route of a (vip, protocol): where non-first IPv4 fragments, which carry no ports, go.
 * Addresses and port in network byte order, as in the packet. */
struct lb_service_key {
	__be32 addr[4];
	__be16 port;
	__u8 proto;  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 family; /* enum lb_family */
};

/* A route: a service key and how its packets are spread. Value of the routes array (by route id,
 * from 1) and of the services hash map. A route id's entry is written before anything points at
 * it and never rewritten while anything does: a changed service gets a new route id, and the
 * one 4-byte index entry (or one hash-map value) that leads to it is switched last. */
struct lb_service {
	struct lb_service_key key;
	__u32 base;      /* where this service's destination table starts in table_slots */
	__u32 slots;     /* size of that table; 0: no backend, drop */
	__u32 hash_mode; /* enum lb_hash_mode */
};

/* Value of the table_slots array: the backend ids of two consecutive slots (0 = empty). */
struct lb_slot_pair {
	__u32 id[2];
};

/* Value of the backends array, indexed by backend id. Id 0 is never used: an empty slot holds 0.
 * 8 bytes, so the kernel copies it with one store and a MAC change cannot be seen half-done. */
struct lb_backend {
	__u8 mac[6];
	__u8 flags; /* LB_BACKEND_* */
	__u8 pad;
};

enum lb_backend_flags {
	LB_BACKEND_MAC_KNOWN = 1, /* mac holds the backend's resolved address */
};

/* The program's settings (a global in .bss). */
struct lb_config {
	__u8 ifmac[6]; /* source MAC of forwarded frames: the attached interface's */
	__u8 pad[2];
};

/* Per-CPU counters, indexed by these. Every packet that is dropped is dropped for one reason.
 * Forwarded packets are counted per backend (backend_traffic) and nowhere else: one counter
 * update per forwarded packet; the total is their sum. */
enum lb_stat {
	LB_STAT_PASSED = 0,    /* not for a service: handed to the kernel unchanged */
	LB_DROP_MALFORMED,     /* truncated or inconsistent headers */
	LB_DROP_NO_BACKEND,    /* the slot is empty (no backend with weight) */
	LB_DROP_NO_MAC,        /* the backend's MAC is not resolved yet */
	LB_DROP_FRAGMENT,      /* a non-first fragment that cannot be routed (flow hash, or no route) */
	LB_DROP_NO_TABLE,      /* a route whose table lies outside table_slots (never expected) */
	LB_STAT_MAX,
};

/* Per-service and per-backend traffic counters (per-CPU). */
struct lb_traffic {
	__u64 packets;
	__u64 bytes;
};

#endif /* LB_H */
