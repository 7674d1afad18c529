/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The one header shared by the XDP program and user space: every map key and value layout,
 * the limits, and the counter indices. Rust reads these through the skeleton's generated types,
 * never through a second hand-written copy. Fixed-width fields, network byte order where the
 * packet's bytes are copied, explicit padding, no functions. */
#ifndef LB_H
#define LB_H

#include "vmlinux.h"

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
	__u32 flags;     /* enum lb_service_flags */
	__u32 forward;   /* enum lb_forward */
	__be16 gue_port; /* LB_FWD_GUE: the outer UDP destination port */
	__u8 pad[2];
	__u32 table_len; /* the table range's length in table_slots (= slots unless the route is
			  * empty): what a controller that adopts a pinned data plane reads back */
};

/* How a service's packets reach the backend. */
enum lb_forward {
	LB_FWD_L2 = 0,   /* rewrite the Ethernet addresses only: the backend is on the link */
	LB_FWD_IPIP = 1, /* IP in IP (protocol 4 or 41), outer family = the backend's */
	LB_FWD_GUE = 2,  /* GUE version 1 ("direct IP"): outer IP, UDP, then the inner packet */
};

/* An address of either family: a backend's (the outer destination of an encapsulated packet,
 * value of backend_addrs) or one of the host's (key of the decap program's local_addrs).
 * IPv4 uses addr[0] only; the rest is zero. */
struct lb_addr {
	__be32 addr[4];
	__u8 family; /* enum lb_family; 0: none */
	__u8 pad[3];
};

enum lb_service_flags {
	LB_SVC_CONNTRACK = 1,     /* established flows keep their backend through the flows map */
	LB_SVC_SECOND_CHANCE = 2, /* GUE only: each packet carries the other backends that may hold
				   * its connection (a hop list, struct lb_gue_hops), from table_hops */
	LB_SVC_QUIC_LB = 4,       /* UDP only: QUIC packets whose destination connection ID names a
				   * server go to it (quic.h; quic_configs holds the parameters) */
};

/* QUIC-LB (draft-ietf-quic-load-balancers-21; docs/quic-lb.md): a service's connection-ID
 * configuration, value of quic_configs keyed by the service key. Written before the service's
 * route carries LB_SVC_QUIC_LB (and removed after it no longer does), and replaced whole. */
struct lb_quic_config {
	__u8 rotation;  /* the config rotation bits (0..6) its IDs carry in their first octet's top 3 */
	__u8 sid_len;   /* server ID octets (1..15) */
	__u8 nonce_len; /* nonce octets (4..18); sid_len + nonce_len <= 19 */
	__u8 encrypted; /* 1: the IDs are encrypted with the service's key (its AES context in
			 * quic_aes); 0: the server ID is in plain sight */
	__u32 sid_mask[4]; /* the first sid_len octets all ones, the rest zero: what of 16 octets
			    * read from an ID is the server ID, without a loop over its length */
	__u32 gen;         /* which parameters and key decoded an ID (encrypted only): quic_cids
			    * keeps decoded IDs under it, and user space gives a configuration a
			    * new one, unique among all services', whenever its key or its lengths
			    * change, so that nothing decoded before is used after */
	__u32 cid_mask[5]; /* the first 1 + sid_len + nonce_len octets of an ID all ones: the
			    * octets its server ID is decoded from, and all that quic_cids keys */
};

/* Key of quic_cids: an encrypted connection ID as received (only the octets that are decoded,
 * the rest zero), under the generation of the configuration that decodes it. */
struct lb_quic_cid {
	__u32 gen;
	__u8 cid[20];
};

/* The budget of decodings (quic.h, quic_budget_take): each CPU decodes at most a set number of
 * encrypted IDs a second that are not in quic_cids (lb_config.quic_decode_ns apart on average;
 * `lb attach --quic-decode-budget`, LB_QUIC_DECODES_PER_SEC by default), and at most a window's
 * worth of them at once after a quiet moment; past that, such a packet falls back to the table
 * (counted over_budget), so that a flood of made-up IDs cannot take the CPUs. A decoding costs
 * 0.8 to 1.7 us here (one to four AES blocks): the default bounds it to 4 to 9% of each CPU. */
enum lb_quic_budget {
	LB_QUIC_DECODES_PER_SEC = 50000,
	LB_QUIC_DECODE_WINDOW_NS = 100000000,
};

/* Key of quic_servers: a server ID of a service (padded with zeros to 16 octets), whose value is
 * the backend id (__u32) that issued it. */
struct lb_quic_server {
	struct lb_service_key service;
	__u8 sid[16];
};

/* The context of the syscall program quic_set_key (quic.h), which makes the kernel's AES-128
 * context for a service's key and keeps it in quic_aes; its return value is 0 or -errno. */
struct lb_quic_key_arg {
	struct lb_service_key service;
	__u8 key[16];
};

/* The flow table: which backend each tracked flow started on. A set-associative array rather
 * than a hash map, so that a lookup touches one cache line: the flow's 64-bit tag picks a bucket
 * of LB_FLOW_WAYS slots (64 bytes, aligned), and a slot holds the tag instead of the flow's
 * 37-byte 5-tuple. In `flows`, a flow may also live in a second bucket, read only when the first
 * does not hold it (two choices: a full bucket spills instead of forgetting flows);
 * `flow_pending` uses the first bucket only. Shared by all CPUs (a flow's packets may arrive on
 * any of them), so there are no per-CPU copies to fall out of date. Two of them, of the same
 * slots: `flows`, the established flows, and `flow_pending`, flows seen once (a SYN; a first UDP
 * datagram), which become established at their next packet. A flood of spoofed first packets
 * fills only flow_pending; a flood of spoofed pairs (SYN then ACK) reaches `flows` but may only
 * take slots of flows that are unconfirmed, expired or stale, never those of confirmed ones (see
 * docs/data-plane.md, "Connection tracking", and docs/security.md). User space sizes both and
 * sets the masks in struct lb_config. LB_FLOW_BUSY is the tag of a slot a CPU has claimed and is
 * writing: never a flow's (tags are odd), so lookups skip it and no other writer takes it. */
enum lb_flow_table_layout {
	LB_FLOW_WAYS = 4,
	LB_FLOW_BUSY = 2,
};

/* The bits of struct lb_flow's `gen_flags`: the id's generation (low bits) and the entry's state. */
enum lb_flow_gen_bits {
	LB_FLOW_GEN_MASK = 0x1fff,  /* the low 13 bits of the id's generation when the flow started */
	LB_FLOW_UDP = 0x2000,       /* a UDP flow (its timeout is ct_udp_timeout_ms) */
	LB_FLOW_RESET = 0x4000,     /* the client sent an RST: the entry lives LB_CT_RESET_TICKS (flow.h) at most
				     * unless a later packet of the flow without RST clears this */
	LB_FLOW_CONFIRMED = 0x8000, /* a packet refreshed the entry at least a refresh interval
				     * after it was made: promotions never take its slot */
};

/* A slot of the flow tables. `tag` is the flow's keyed tag (hash.h, flow_tag16/flow_tag40:
 * SipHash-1-3 of the 5-tuple under the data plane's secret flow_key, not the documented flow
 * hash, so that nobody outside can make two flows share a tag or pick their bucket) with bit 0
 * set; 0 is a free slot, LB_FLOW_BUSY one being written. The first bucket is picked by the tag's
 * bits 32 and up, the second by bits 8 to 31, so a tag alone says where its slot belongs in a
 * table of any size. backend, gen_flags and seen are written and read as one 8-byte word; a writer
 * first claims the slot by swapping its tag for LB_FLOW_BUSY (compare-and-swap from the value it
 * saw), and a reader checks the tag again after reading the word. */
struct lb_flow {
	__u64 tag;
	__u16 backend; /* backend id (ids are below LB_MAX_BACKENDS = 65536) */
	__u16 gen_flags; /* LB_FLOW_GEN_MASK: the low bits of the id's generation when the flow
			  * started (the entry counts only while backend_gen still says so: ids are
			  * reused); the other bits: enum lb_flow_gen_bits. (Named apart from the
			  * `gen` of earlier versions, which held 16 bits of generation and no
			  * flags, so that an upgrade never reads one as the other: the tables'
			  * layouts differ, and their entries are carried, see docs/restarts.md.) */
	__u32 seen;    /* CLOCK_MONOTONIC in ticks of 2^24 ns (about 16.8 ms) when last refreshed
			* (bpf_ktime_get_coarse_ns() >> 24; wraps after two years) */
#ifdef LB_LAYOUT_TEST
	__u64 layout_test; /* only in the build the upgrade test makes (cargo feature layout-test) */
#endif
};

/* Value of the flow_key array's one entry: the 128-bit SipHash key of the flow tags. Random,
 * made by the first controller that loads the data plane (getrandom), pinned, and read back
 * (never remade) by every controller that adopts or upgrades it, so tags stay valid. Its layout
 * never changes. */
struct lb_flow_key {
	__u64 k[2];
};

/* Value of the table_slots array: the words of two consecutive slots, each a backend id (0 =
 * empty) and the slot's state bits below. */
struct lb_slot_pair {
	__u32 id[2];
};

/* The bits of a table_slots word. A slot is UNSTABLE from the moment the control plane gives it
 * a new owner (or places it in a new range) until its sweep has found that no flow tracked to
 * another backend can still hash to it (crates/core/src/stable.rs; docs/data-plane.md, "Stable slots"):
 * only then may a tracked packet of an established TCP flow on it go by the table without its
 * flow-table lookup, since the lookup could only say what the table says. The bit is written
 * with the owner, in one store: no packet sees a new owner marked stable. */
enum lb_slot_bits {
	LB_SLOT_ID_MASK = 0xffff,         /* the backend id (ids are below LB_MAX_BACKENDS) */
	LB_SLOT_UNSTABLE = 0x80000000,    /* flows tracked elsewhere may hash here: look them up */
	/* On a stable slot, one packet in 2^LB_SLOT_SAMPLE_SHIFT (at random) still takes the whole
	 * tracked path, so that entries are made (a flow's second packet, adoption), kept fresh and
	 * confirmed without a lookup on every packet. */
	LB_SLOT_SAMPLE_SHIFT = 4,
};

/* Where each flow-table entry's flow hashes in the destination tables, for the sweep of
 * unstable slots: at the same index as its entry in `flows` (flow_records) or `flow_pending`
 * (pending_records). Written with the entry, and again whenever the entry's `seen` is
 * rewritten, as one 8-byte store; `tag` (the low half of the entry's tag) says whose it is, so
 * a record left by another flow of the slot is seen for what it is: unknown. */
struct lb_flow_record {
	__u32 tag;  /* the low 32 bits of the flow's tag when this was written */
	__u32 slot; /* its destination-table entry (index into table_slots) + 1; 0: unknown */
};

/* Second chance: for each slot of a destination table, up to two backends besides the slot's
 * owner that may hold a connection hashed to it (0 = none): the slot's owner in the previous
 * pool's table, then its owner in the table built without its current owner (docs/fleet.md,
 * "Second chance"). The control plane computes them with the table; the program only copies
 * the live ones into the packet. */
struct lb_hops {
	__u16 id[2];
};

/* Value of the table_hops array: the hops of two consecutive slots, as in table_slots. */
struct lb_hop_pair {
	struct lb_hops slot[2];
};

/* The GUE private data of a second-chance packet: GUE version 0, no flags, the header length
 * covering this block and its hops, which follow it (4 bytes each for IPv4, 16 for IPv6, in the
 * outer header's family). The layout follows GLB's published hop list (type 0: IPv4 hops); the
 * IPv6 type is lb's own. The outer destination is the first hop and is not listed; `next` is the
 * index of the hop to try after this one (0 from lb), `count` the number listed. */
enum lb_gue_hops_layout {
	LB_GUE_HOPS_V4 = 0,
	LB_GUE_HOPS_V6 = 0x4c36, /* "L6" */
	LB_GUE_MAX_HOPS = 3,
};
struct lb_gue_hops {
	__be16 type; /* enum lb_gue_hops_layout, network order */
	__u8 next;
	__u8 count;
};

/* Value of the backends array, indexed by backend id. Id 0 is never used: an empty slot holds 0.
 * 8 bytes, so the kernel copies it with one store and a MAC change cannot be seen half-done. */
/* The socket mark of lb's health probes through the data path (probe.h): LB_PROBE_MARK in the
 * upper half, the backend id in the lower. */
enum lb_probe_mark {
	LB_PROBE_MARK = 0x4c420000,
	LB_PROBE_MARK_MASK = 0xffff0000,
};

struct lb_backend {
	__u8 mac[6];
	__u8 flags; /* LB_BACKEND_* */
	__u8 pad;
};

enum lb_backend_flags {
	LB_BACKEND_MAC_KNOWN = 1, /* mac holds the backend's resolved address */
	LB_BACKEND_ALIVE = 2,     /* in the pool and healthy (draining included): tracked flows may use it */
	LB_BACKEND_IN_POOL = 4,   /* the id belongs to a backend of the pool (alive or down); clear once retired */
};

/* Value of backend_meta, indexed by backend id: whose id it is, for a controller that adopts a
 * pinned data plane (the program never reads it). Written before the backend's record, so a
 * record marked LB_BACKEND_IN_POOL always has its meta. Its layout never changes: a later
 * version reads it to carry ids, counters and tracked flows over. */
struct lb_backend_meta {
	struct lb_service_key service; /* the service the id belongs to */
	__u64 identity;                /* xxh64(identity_utf8, seed 0) */
	__u32 weight;                  /* as configured */
	__u8 state;                    /* 0 active, 1 drain, 2 down */
	__u8 pad[3];
	char name[64];                 /* the identity, cut at 63 bytes (for lb status) */
};

/* Value of service_names: a service's name, for lb status. */
struct lb_name {
	char name[64];
};

/* The one value of lb_meta: which build made the pinned data plane, and who controls it. Its
 * layout never changes (a magic number names it), so every version can read it. */
#define LB_META_MAGIC 0x31304154454d424cull /* "LBMETA01" */
struct lb_meta {
	__u64 magic;
	__u64 layout;           /* hash of lb.h as compiled: maps with another layout are not reused */
	__u64 program;          /* hash of the BPF object */
	__u64 attached_ms;      /* wall clock (Unix ms) when the program was first attached */
	__u64 controller_since; /* wall clock (Unix ms) when the current controller started; 0: none */
	__u32 controller_pid;   /* its process id (0: none) */
	__u32 ifindex;          /* the interface it is attached to */
	__u32 table_capacity;   /* slots of table_slots */
	__u32 conntrack_size;   /* entries of flows */
	__u64 reserved[2];      /* [0]: the ifindex of the --announce device holding the VIPs (0: none);
				 * [1]: the data plane's tick (flow.h) when a table range was last
				 * placed or rehashed, + 1 (0: not recorded; all ones: a change
				 * placing ranges is under way; crates/core/src/stable.rs) */
};

/* The program's settings (a global in .bss). */
struct lb_config {
	__u8 ifmac[6]; /* source MAC of forwarded frames: the attached interface's */
	__u8 pad[2];
	__u64 ct_tcp_timeout_ms; /* a tracked TCP flow idle this long is forgotten (0: never) */
	__u64 ct_udp_timeout_ms; /* the same for UDP */
	__u64 clock_ms;          /* CLOCK_MONOTONIC in ms as the controller last wrote it (several
				  * times a second); informational only: the flow tables age by
				  * bpf_ktime_get_coarse_ns(), which runs with no controller */
	/* Outer source of encapsulated packets. The bits set in *_vary (network order; for IPv6
	 * they apply to the last 32-bit word) are taken from the flow hash, so that a backend's
	 * receive-side scaling sees one source per flow; the rest from the base address. */
	__be32 encap_src4;
	__be32 encap_src4_vary;
	__be32 encap_src6[4];
	__be32 encap_src6_vary;
	__u32 mtu; /* the interface's MTU: an encapsulated packet longer than this is not sent */
	__u32 ct_mask;         /* buckets of `flows` - 1 (a power of two) */
	__u32 ct_pending_mask; /* buckets of `flow_pending` - 1 */
	__u32 ct_guard;        /* 1: a flow is tracked from its second packet, through flow_pending;
				* 0: from its first (a SYN flood can then wash out established flows) */
	__u32 stable_off;      /* 1: every slot counts as unstable (lb_slot_bits), whatever its word
				* says: while the table words of a plane from before stable slots,
				* shared with its still attached program, cannot carry the marks yet */
	__u32 quic_decode_ns;  /* the budget of decodings (enum lb_quic_budget): a second / the
				* decodings each CPU may make a second; 0: no bound */
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
	LB_CT_HIT,             /* a tracked flow went to its own backend */
	LB_CT_MISS,            /* no entry: the table decided */
	LB_CT_NEW,             /* an established entry was made (or remade, for a stale one) */
	LB_CT_STALE,           /* an entry whose backend is gone, unhealthy or expired: re-hashed */
	LB_STAT_TOO_BIG,       /* too long once encapsulated: answered with ICMP frag-needed / packet too big */
	LB_DROP_OVERSIZE,      /* too long once encapsulated, and fragmentation allowed: dropped */
	LB_DROP_ENCAP,         /* the frame could not be grown for the outer headers, or no outer address */
	LB_ICMP_FORWARDED,     /* an ICMP error about a service's flow, sent to that flow's backend
				* (also counted as forwarded traffic of the backend) */
	LB_CT_PENDING,         /* a flow's first packet was recorded in flow_pending */
	LB_CT_EVICTED,         /* an established flow was forgotten to make room for another */
	LB_DROP_TOO_BIG_LIMITED,   /* too long once encapsulated, past the rate limit of too-big
				    * answers (icmp.h): dropped, not answered */
	LB_DROP_TOO_BIG_BELOW_MIN, /* too long once encapsulated, and the MTU to advertise is below
				    * the protocol's minimum (68 IPv4, 1280 IPv6): dropped */
	LB_STAT_OTHER_HOST,    /* a frame addressed to another host's MAC (promiscuous mode, a bridge
				* member): handed to the kernel unchanged, never balanced */
	LB_DROP_NOT_UNICAST,   /* a broadcast or multicast frame carrying a packet for a service:
				* never balanced (every host on the segment received it) */
	LB_DROP_VLAN,          /* a packet for a service in a frame tagged with a VLAN id other than 0:
				* not from the segment lb serves */
	LB_DROP_EXT_HEADER,    /* IPv6 to an address with services behind extension headers lb does
				* not follow (a routing header of type 0 or with segments left, AH,
				* a chain longer than lb parses): its port is unknown, never passed */
	LB_FRAG_RECORDED,      /* a first fragment's backend recorded for its later fragments */
	LB_FRAG_FOLLOWED,      /* a later fragment sent to the backend its first fragment went to */
	LB_FRAG_UNMATCHED,     /* a later fragment without a record: the fragment route decided */
	LB_CT_NO_ROOM,         /* a flow's next packet found its buckets in `flows` full of confirmed,
				* live flows: it stays half-open (followed through flow_pending) */
	LB_FRAG_CONFLICT,      /* a first fragment disagreed with its datagram's fresh record (another
				* port or backend: a spoof or a reused identification): the record
				* was deleted, not re-pointed */
	LB_CT_ADOPTED,         /* a TCP packet in mid-connection of a flow with no entry here (moved to
				* this node, or from before it started): recorded like a first packet
				* (also counted as pending) */
	LB_CT_STABLE,          /* a tracked packet of an established TCP flow on a stable slot: sent by
				* the table without a flow-table lookup (the lookup would have said
				* the same; lb_slot_bits) */
	/* QUIC-LB services (LB_SVC_QUIC_LB): each UDP packet of one is counted once below, as
	 * routed by its connection ID or as fallen back (to the flow table and the destination
	 * table, as for any UDP flow) for one reason. */
	LB_QUIC_ROUTED,         /* sent to the backend whose server ID its destination connection ID carries */
	LB_QUIC_CLIENT_ID,      /* an Initial or 0-RTT packet (QUIC v1 or v2): its ID was chosen by the client */
	LB_QUIC_UNROUTABLE,     /* config rotation bits 0b111: a server without a configuration chose it */
	LB_QUIC_OTHER_CONFIG,   /* rotation bits of no configuration of this service */
	LB_QUIC_SHORT,          /* too short for a QUIC packet carrying this configuration's IDs */
	LB_QUIC_UNKNOWN_SERVER, /* a server ID no backend of the pool has */
	LB_QUIC_UNUSABLE,       /* the server ID of a backend that is down (unhealthy or removed) */
	LB_QUIC_NO_KEY,         /* encrypted, and the kernel's AES context is missing or failed (or,
				 * never expected, the service's parameters are missing) */
	LB_QUIC_OVER_BUDGET,    /* encrypted, not kept decoded (quic_cids), and this CPU has decoded
				 * all its budget allows (lb_config.quic_decode_ns) */
	LB_QUIC_DECODED,        /* not an outcome (each of these is also counted above): an
				 * encrypted ID decoded by the cipher, not found in quic_cids */
	LB_STAT_MAX,
};

/* Counters of the backend-side decapsulation program (crates/dataplane/src/bpf/decap.bpf.c). */
enum lb_decap_stat {
	LB_DECAP_DONE = 0,   /* an IPIP or GUE packet for this host: outer headers stripped, passed */
	LB_DECAP_PASSED,     /* anything else: passed unchanged */
	LB_DECAP_MALFORMED,  /* encapsulated for this host but cut short or inconsistent: dropped */
	LB_DECAP_NOT_ALLOWED, /* encapsulated for this host, from an outer source outside the
			       * allow-list (`lb decap --allow-from`): dropped */
	LB_DECAP_NOT_LOCAL,  /* encapsulated, from an allowed source, but the inner packet is for an
			      * address this host does not have: dropped, never routed on */
	LB_DECAP_CE_NOT_ECT, /* the outer header marked CE (congestion) and the inner packet's
			      * sender does not do ECN (Not-ECT): dropped, as RFC 6040 says */
	LB_DECAP_ECN_ANOMALY, /* decapsulated (and counted so too), but with an ECN combination that
			       * RFC 6040 says no compliant path produces, and asks to be logged: an
			       * ECT outer over a Not-ECT inner, or ECT(1) outer over a CE inner */
	LB_DECAP_HOP_LOCAL,    /* second chance (`--second-chance`): a packet with a hop list kept
				* here: a SYN, not TCP, a connection or SYN cookie of this host, an
				* ICMP error about a connection of this host */
	LB_DECAP_HOP_SENT_ON,  /* second chance: a TCP packet for no connection of this host, sent on to
				* the next hop of its list (not decapsulated here) */
	LB_DECAP_HOP_EXHAUSTED, /* second chance: no connection here and no hop left (or the next hop
				 * is this host): delivered here all the same */
	LB_DECAP_HOP_NO_ROUTE, /* second chance: the next hop has no route or no resolved neighbour,
				* or its route leaves by another interface: delivered here */
	LB_DECAP_HOP_REFUSED,  /* second chance: the next hop is outside the allow-list (lb decap
				* sends only to the hosts it trusts): delivered here */
	LB_DECAP_HOP_UNRESOLVED, /* second chance: the next hop is on the link but its MAC is not
				  * known yet: dropped (the sender retransmits) while lb decap has
				  * the kernel resolve it, for at most LB_DECAP_RESOLVE_NS; after
				  * that, counted no_route and delivered here */
	LB_DECAP_STAT_MAX,
};

/* Key of the decap program's allow_from map (an LPM trie): a prefix of encapsulating sources.
 * The trie matches the first `prefixlen` bits of what follows it, so the family and its padding
 * (32 bits) come first and are always part of the prefix: one trie holds both families, and an
 * IPv4 prefix never matches an IPv6 source. prefixlen = 32 + the address prefix length; an
 * IPv4 address uses addr[0] only, the rest zero. */
struct lb_decap_src {
	__u32 prefixlen;
	__u8 family; /* enum lb_family */
	__u8 pad[3];
	__be32 addr[4];
};

/* Per-service and per-backend traffic counters (per-CPU). */
struct lb_traffic {
	__u64 packets;
	__u64 bytes;
};

/* What a tracked TCP service's clients betray of a backend that does not answer, per backend id
 * (conntrack_map.h, backend_signals; docs/operating.md, "Signals from real traffic"). */
struct lb_signals {
	__u64 syns;        /* connections begun: a flow's first SYN sent to this backend */
	__u64 syn_again;   /* a SYN sent again on a flow not yet confirmed: its SYN-ACK never came */
	__u64 reset_early; /* a client RST as a flow's second packet (with ct_guard, on its
			    * half-open record): the client aborted the handshake, as it does when
			    * the SYN-ACK it got does not fit (a backend behind NAT, say) */
	__u64 no_data;     /* a client FIN or RST that acknowledges nothing past the SYN-ACK: the
			    * connection ended with no data from the backend (with ct_guard: the
			    * handshake's ACK is known at the flow's second packet; conntrack_map.h,
			    * ct_quiet) */
	__u64 handshakes;  /* handshakes whose end is watched for no_data (its denominator) */
};

#endif /* LB_H */
