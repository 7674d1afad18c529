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

/* The jhash initial value of every flow hash. Changing it moves every flow. */
#define LB_HASH_SEED 0x4c42u /* "LB" */

enum lb_family {
	LB_FAMILY_V4 = 4,
	LB_FAMILY_V6 = 6,
};

enum lb_hash_mode {
	LB_HASH_CLIENT_IP = 0, /* source address only */
	LB_HASH_FLOW = 1,      /* 5-tuple */
};

/* Key of the services map. IPv4 addresses use addr[0] only; the rest is zero. Port 0 is the
 * fragment route of a (vip, protocol): where non-first IPv4 fragments, which carry no ports, go. */
struct lb_service_key {
	__be32 addr[4];
	__be16 port;
	__u8 proto;  /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 family; /* enum lb_family */
};

/* Value of the services map. The map is a hash map, so an update replaces a value whole:
 * a packet sees the old service or the new one, never a mix. */
struct lb_service {
	__u32 id;        /* index into the tables outer map and the per-service counters */
	__u32 slots;     /* size of this service's table */
	__u32 hash_mode; /* enum lb_hash_mode */
	__u32 pad;
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

/* The single entry of the config array. */
struct lb_config {
	__u8 ifmac[6]; /* source MAC of forwarded frames: the attached interface's */
	__u8 pad[2];
};

/* Per-CPU counters, indexed by these. Every packet that is dropped is dropped for one reason. */
enum lb_stat {
	LB_STAT_FORWARDED = 0, /* XDP_TX to a backend */
	LB_STAT_PASSED,        /* not for a service: handed to the kernel unchanged */
	LB_DROP_MALFORMED,     /* truncated or inconsistent headers */
	LB_DROP_NO_BACKEND,    /* the slot is empty (no backend with weight) */
	LB_DROP_NO_MAC,        /* the backend's MAC is not resolved yet */
	LB_DROP_FRAGMENT,      /* a non-first fragment that cannot be routed (flow hash, or no route) */
	LB_DROP_NO_TABLE,      /* a service whose table is missing (never expected) */
	LB_STAT_MAX,
};

/* Per-service and per-backend traffic counters (per-CPU). */
struct lb_traffic {
	__u64 packets;
	__u64 bytes;
};

#endif /* LB_H */
