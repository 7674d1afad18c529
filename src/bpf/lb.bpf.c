// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* The XDP data plane: parse -> service -> hash -> slot -> backend -> forward.
 *
 * Forwarding is L2 direct server return: only the Ethernet addresses change and the frame goes
 * back out of the interface it came in on (XDP_TX). Backends hold the VIP on their loopback and
 * answer clients directly. Everything that is not for a service leaves unchanged (XDP_PASS);
 * everything that is for a service but cannot be forwarded is dropped for a named, counted reason.
 * There are no rings, weights or searches here: the control plane compiled them into each
 * service's destination table. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lb.h"

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8
#define IP_OFFSET 0x1FFF

/* First lookup of every TCP/UDP packet: lb_vip_index(key) -> route id (see lb.h). An array,
 * so the verifier inlines the lookup: one load decides that most non-service traffic passes. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_VIP_INDEX_SIZE);
	__type(key, __u32);
	__type(value, __u32);
} vip_index SEC(".maps");

/* Route id -> route (id 0 unused). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_ROUTES + 1);
	__type(key, __u32);
	__type(value, struct lb_service);
} routes SEC(".maps");

/* Service key -> route, for keys that share a vip_index entry. A hash map, so each update
 * replaces a value whole. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_MAX_ROUTES);
	__type(key, struct lb_service_key);
	__type(value, struct lb_service);
} services SEC(".maps");

/* Every service's destination table, side by side: a route's table is the entries
 * [base, base + slots); each entry a backend id (0 = empty). One array rather than an array of
 * per-service maps: a lookup in a static array is inlined by the verifier, while a lookup in an
 * inner map is a helper call, which measured ~14 ns per packet here. User space sizes it before
 * loading (max_entries below is a placeholder). A table that changes size is written to a fresh
 * range and switched to by its route; one that keeps its size is rewritten in place, slot by
 * slot, each slot write whole. Array elements are 8-byte aligned, so each element holds two
 * slots (2k and 2k + 1) instead of wasting half of it; the mapping is memory-mappable, and user
 * space writes slots with plain 4-byte stores instead of a syscall per slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_slot_pair);
} table_slots SEC(".maps");

/* Tracked flows -> the backend each started on. One LRU hash shared by all CPUs, not per-CPU:
 * the packets of one flow can arrive on different CPUs (RSS re-steering, a different receive
 * queue after a link change), and a per-CPU entry would be missed there and re-hashed. Several
 * load balancers behind ECMP do not share it at all; there the table, which they all compute
 * alike, keeps new flows consistent. User space sizes it (--conntrack-size). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, struct lb_flow_key);
	__type(value, struct lb_flow);
} flows SEC(".maps");

/* Advanced by every change to the flows map; see struct lb_flow_cached. */
__u64 lb_ct_epoch = 0;

/* Each CPU's direct-mapped cache of the flows map (see lb.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_FLOW_CACHE_SIZE);
	__type(key, __u32);
	__type(value, struct lb_flow_cached);
} flow_cache SEC(".maps");

/* Backend id -> its generation, bumped each time the id is given to a backend. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, __u32);
} backend_gen SEC(".maps");

/* Backend id -> where to send its frames. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_backend);
} backends SEC(".maps");

/* The attached interface's settings, written by user space through the skeleton's mapping of
 * .bss. A global rather than a map entry: the program reads it at a fixed address, with no
 * lookup on the packet path. */
struct lb_config lb_settings = {};

/* Packet counters and drop reasons, indexed by enum lb_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* Traffic forwarded per backend id. A backend id belongs to one service, so a service's traffic
 * is the sum over its backends: one counter update per packet instead of two. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_traffic);
} backend_traffic SEC(".maps");

/* Unused by the program: these make the counter and mode enums part of the object's BTF, so
 * that user space reads their values from the skeleton instead of keeping a copy. */
const volatile enum lb_stat lb_stat_btf = LB_STAT_MAX;
const volatile enum lb_hash_mode lb_hash_mode_btf = LB_HASH_CLIENT_IP;
const volatile enum lb_family lb_family_btf = LB_FAMILY_V4;
const volatile enum lb_backend_flags lb_backend_flags_btf = LB_BACKEND_MAC_KNOWN;
const volatile enum lb_vip_index_layout lb_vip_index_layout_btf = LB_VIP_INDEX_BITS;
const volatile enum lb_service_flags lb_service_flags_btf = LB_SVC_CONNTRACK;
const volatile enum lb_flow_cache_layout lb_flow_cache_layout_btf = LB_FLOW_CACHE_SIZE;

static __always_inline int count(__u32 stat, int action)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &stat);

	if (v)
		*v += 1;
	return action;
}

static __always_inline void add_traffic(__u32 id, __u64 bytes)
{
	struct lb_traffic *t = bpf_map_lookup_elem(&backend_traffic, &id);

	if (t) {
		t->packets += 1;
		t->bytes += bytes;
	}
}

/* The last 4 bytes of a service key (port, protocol, family) as one word in memory order. */
static __always_inline __u32 key_tail(__u16 port_be, __u8 proto, __u8 family)
{
	return (__u32)port_be | (__u32)proto << 16 | (__u32)family << 24;
}

/* The vip_index entry of a key, from the XOR of its five 32-bit words (in memory order).
 * Mirrored in src/dataplane/mod.rs (vip_index()); the packet fixtures fail if the two disagree,
 * since a service would then never be found. */
static __always_inline __u32 lb_vip_index(__u32 words_xor)
{
	__u32 h = words_xor;

	h ^= h >> 16;
	h *= 0x9e3779b1u;
	return h >> (32 - LB_VIP_INDEX_BITS);
}

/* The route of a key, or NULL: one array read for most packets, a hash lookup only for keys
 * that share their index entry. `a` is the destination address (a[1..3] zero for IPv4). */
static __always_inline const struct lb_service *find_route(const __u32 a[4], __u32 tail)
{
	__u32 idx = lb_vip_index(a[0] ^ a[1] ^ a[2] ^ a[3] ^ tail);
	const struct lb_service *r;
	__u32 *id;

	id = bpf_map_lookup_elem(&vip_index, &idx);
	if (!id || *id == 0)
		return NULL;
	if (*id == LB_VIP_INDEX_SHARED) {
		struct lb_service_key key;

		__builtin_memcpy(key.addr, a, 16);
		__builtin_memcpy(&key.port, &tail, 4);
		return bpf_map_lookup_elem(&services, &key);
	}
	r = bpf_map_lookup_elem(&routes, id);
	if (!r)
		return NULL;
	/* The one route with this index: is it this packet's key? */
	if (r->key.addr[0] != a[0] || r->key.addr[1] != a[1] || r->key.addr[2] != a[2] ||
	    r->key.addr[3] != a[3] || *(const __u32 *)&r->key.port != tail)
		return NULL;
	return r;
}

/* ---- hashing: the flow hash, documented in README.md ("Flow hash") and src/flowhash.rs ----
 * The input is split into 8-byte little-endian lanes (a 4-byte input is one lane, zero-extended).
 * h = LB_HASH_SEED ^ (len * K); for each lane x: h = (h ^ x) * K; then MurmurHash3's 64-bit
 * finalizer (fmix64); the hash is the low 32 bits. K is 2^64 / golden ratio. One multiply per
 * lane plus two: on the 16 bytes of an IPv4 flow, a third of XXH64's dependent multiplies,
 * measured about 8 ns per packet less here. Lanes are read in native order: little-endian only. */

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the flow hash reads its lanes in native order, which must be little-endian"
#endif

#define LB_HASH_K 0x9E3779B97F4A7C15ull

static __always_inline __u64 hash_start(__u64 len)
{
	return LB_HASH_SEED ^ (len * LB_HASH_K);
}

static __always_inline __u64 hash_lane(__u64 h, __u64 x)
{
	return (h ^ x) * LB_HASH_K;
}

static __always_inline __u32 hash_finish(__u64 h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return (__u32)h;
}

/* 4 bytes: an IPv4 client address. */
static __always_inline __u32 hash4(__u32 w)
{
	return hash_finish(hash_lane(hash_start(4), w));
}

/* 16 bytes: an IPv4 flow or an IPv6 client address. */
static __always_inline __u32 hash16(__u64 a, __u64 b)
{
	return hash_finish(hash_lane(hash_lane(hash_start(16), a), b));
}

/* 40 bytes: an IPv6 flow. */
static __always_inline __u32 hash40(const __u64 *l)
{
	__u64 h = hash_start(40);

	h = hash_lane(h, l[0]);
	h = hash_lane(h, l[1]);
	h = hash_lane(h, l[2]);
	h = hash_lane(h, l[3]);
	h = hash_lane(h, l[4]);
	return hash_finish(h);
}

/* ---- parsing: one bounds check per header ---- */

struct cursor {
	void *pos;
	void *end;
};

/* Returns a pointer to `len` bytes at the cursor and advances past them, or NULL. */
static __always_inline void *take(struct cursor *c, __u32 len)
{
	void *p = c->pos;

	if (p + len > c->end)
		return NULL;
	c->pos = p + len;
	return p;
}

/* What parse_ports() found. */
enum l4 {
	L4_PORTS,     /* TCP or UDP, ports read */
	L4_OTHER,     /* another protocol: not ours */
	L4_MALFORMED, /* a TCP or UDP header that is not all there */
};

/* The ports of a TCP or UDP header, as the packet's bytes (network order), in one word:
 * source port in the low half, destination port in the high half (memory order). */
static __always_inline enum l4 parse_ports(struct cursor *c, __u8 proto, __u32 *ports, __u8 *tcp_flags)
{
	if (proto == IPPROTO_TCP) {
		struct tcphdr *th = take(c, sizeof(*th));

		if (!th || th->doff < 5)
			return L4_MALFORMED;
		*ports = *(__u32 *)th;
		*tcp_flags = ((__u8 *)th)[13];
		return L4_PORTS;
	}
	if (proto == IPPROTO_UDP) {
		struct udphdr *uh = take(c, sizeof(*uh));

		if (!uh)
			return L4_MALFORMED;
		*ports = *(__u32 *)uh;
		return L4_PORTS;
	}
	return L4_OTHER;
}

/* ---- forwarding ---- */

#define TCP_FLAG_RST 0x04
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_ACK 0x10
/* A tracked flow's `seen` is refreshed at most this often (ms): one write per second. */
#define LB_CT_REFRESH_MS 1000

/* The backend id the route's table gives `hash`, or 0 with the drop already counted. */
static __always_inline __u32 pick(const struct lb_service *svc, __u32 hash)
{
	struct lb_slot_pair *pair;
	__u32 slot, half, id;

	if (svc->slots == 0) {
		count(LB_DROP_NO_BACKEND, XDP_DROP);
		return 0;
	}
	slot = svc->base + hash % svc->slots;
	half = slot >> 1;
	pair = bpf_map_lookup_elem(&table_slots, &half);
	if (!pair) {
		count(LB_DROP_NO_TABLE, XDP_DROP);
		return 0;
	}
	id = pair->id[slot & 1];
	if (id == 0)
		count(LB_DROP_NO_BACKEND, XDP_DROP);
	return id;
}

/* Sends the frame to backend `id`. */
static __always_inline int send(struct ethhdr *eth, __u32 id, __u64 bytes)
{
	struct lb_backend *be = bpf_map_lookup_elem(&backends, &id);

	if (!be || !(be->flags & LB_BACKEND_MAC_KNOWN))
		return count(LB_DROP_NO_MAC, XDP_DROP);
	__builtin_memcpy(eth->h_dest, be->mac, 6);
	__builtin_memcpy(eth->h_source, lb_settings.ifmac, 6);
	/* Forwarded packets are counted per backend only; their total is the sum. */
	add_traffic(id, bytes);
	return XDP_TX;
}

/* The route of a packet has been found and hashed: pick the slot, the backend, and send. */
static __always_inline int forward(struct ethhdr *eth, const struct lb_service *svc, __u32 hash, __u64 bytes)
{
	__u32 id = pick(svc, hash);

	if (id == 0)
		return XDP_DROP;
	return send(eth, id, bytes);
}

static __always_inline int flow_key_equal(const struct lb_flow_key *a, const struct lb_flow_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4];
}

/* Whether a tracked entry still leads somewhere: its backend alive, the id not given to
 * another backend since, and the flow not idle past its protocol's timeout. */
static __always_inline int usable(const struct lb_flow *e, __u8 proto, __u64 now)
{
	__u32 id = e->backend;
	struct lb_backend *be = bpf_map_lookup_elem(&backends, &id);
	__u32 *gen = bpf_map_lookup_elem(&backend_gen, &id);
	__u64 timeout = proto == IPPROTO_TCP ? lb_settings.ct_tcp_timeout_ms : lb_settings.ct_udp_timeout_ms;

	if (!be || !gen || !(be->flags & LB_BACKEND_ALIVE) || *gen != e->gen)
		return 0;
	return timeout == 0 || now - e->seen < timeout;
}

/* Connection tracking: a flow with a usable entry goes to its backend whatever the table says
 * now; otherwise the table decides, and the entry is made by the packet that starts a flow (a
 * TCP SYN without ACK, any UDP packet) or remade when the old one was stale. */
static __always_inline int tracked(struct ethhdr *eth, const struct lb_service *svc, const struct lb_flow_key *fk,
				   __u32 hash, __u8 tcp_flags, __u64 bytes)
{
	__u64 now = lb_settings.clock_ms;
	__u32 ci = (hash ^ ((__u32)fk->sport * 0x9e3779b1u) ^ fk->dport) & (LB_FLOW_CACHE_SIZE - 1);
	struct lb_flow_cached *c = bpf_map_lookup_elem(&flow_cache, &ci);
	struct lb_flow fresh = {};
	struct lb_flow *e;
	__u32 id, *gen;

	int syn = fk->proto == IPPROTO_TCP && (tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;

	/* This CPU's cache first, for everything but a connection's first packet: a SYN asks the
	 * flows map itself, so an entry ended on another CPU (a reset) is never revived by a stale
	 * copy in this CPU's cache. */
	__u64 epoch = lb_ct_epoch;

	if (!syn && c && c->epoch == epoch && flow_key_equal(&c->key, fk) && usable(&c->flow, fk->proto, now)) {
		id = c->flow.backend;
		if (now - c->flow.seen > LB_CT_REFRESH_MS) {
			/* Keep the authoritative entry from ageing out while the cache serves it. */
			c->flow.seen = now;
			e = bpf_map_lookup_elem(&flows, fk);
			if (e)
				e->seen = now;
		}
		if (tcp_flags & TCP_FLAG_RST) {
			bpf_map_delete_elem(&flows, fk);
			__sync_fetch_and_add(&lb_ct_epoch, 1);
		}
		count(LB_CT_HIT, 0);
		return send(eth, id, bytes);
	}

	e = bpf_map_lookup_elem(&flows, fk);
	if (e) {
		if (usable(e, fk->proto, now)) {
			id = e->backend;
			if (now - e->seen > LB_CT_REFRESH_MS)
				e->seen = now;
			/* The client reset the connection: it is over, and the next one with these
			 * ports is a new flow. (Only the client's direction passes here.) */
			if (tcp_flags & TCP_FLAG_RST) {
				bpf_map_delete_elem(&flows, fk);
				__sync_fetch_and_add(&lb_ct_epoch, 1);
			} else if (c) {
				c->key = *fk;
				c->flow = *e;
				c->epoch = epoch;
			}
			count(LB_CT_HIT, 0);
			return send(eth, id, bytes);
		}
		count(LB_CT_STALE, 0);
	} else {
		count(LB_CT_MISS, 0);
	}
	id = pick(svc, hash);
	if (id == 0)
		return XDP_DROP;
	if (e || fk->proto == IPPROTO_UDP || syn) {
		gen = bpf_map_lookup_elem(&backend_gen, &id);
		fresh.backend = id;
		fresh.gen = gen ? *gen : 0;
		fresh.seen = now;
		bpf_map_update_elem(&flows, fk, &fresh, BPF_ANY);
		epoch = __sync_add_and_fetch(&lb_ct_epoch, 1);
		if (c) {
			c->key = *fk;
			c->flow = fresh;
			c->epoch = epoch;
		}
		count(LB_CT_NEW, 0);
	}
	return send(eth, id, bytes);
}

/* IPv4: any header length (options skipped), the whole datagram present, TCP or UDP.
 * The flow hash input is documented in README.md ("Flow hash") and src/flowhash.rs. */
static __always_inline int handle_ipv4(struct cursor *c, struct ethhdr *eth, __u64 bytes)
{
	struct iphdr *iph = take(c, sizeof(*iph));
	const struct lb_service *svc;
	__u32 hlen, ports = 0, hash, dst[4] = {};
	__u8 tcp_flags = 0;
	int fragment;

	if (!iph)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	hlen = iph->ihl * 4;
	if (iph->version != 4 || hlen < sizeof(*iph))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	/* Options: skip them, bounded once. */
	if (hlen > sizeof(*iph) && !take(c, hlen - sizeof(*iph)))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	/* The datagram must be all here: a truncated one is never forwarded. */
	if (bpf_ntohs(iph->tot_len) < hlen || bpf_ntohs(iph->tot_len) > (__u32)(c->end - (void *)iph))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	if (iph->protocol != IPPROTO_TCP && iph->protocol != IPPROTO_UDP)
		return count(LB_STAT_PASSED, XDP_PASS);
	/* A non-first fragment carries no ports: it is looked up as port 0, its fragment route. */
	fragment = (iph->frag_off & bpf_htons(IP_OFFSET)) != 0;
	if (!fragment && parse_ports(c, iph->protocol, &ports, &tcp_flags) == L4_MALFORMED)
		return count(LB_DROP_MALFORMED, XDP_DROP);

	dst[0] = iph->daddr;
	svc = find_route(dst, key_tail(ports >> 16, iph->protocol, LB_FAMILY_V4));
	if (!svc)
		return count(LB_STAT_PASSED, XDP_PASS);
	if (svc->hash_mode == LB_HASH_CLIENT_IP) {
		hash = hash4(iph->saddr);
	} else {
		/* Without ports, a fragment can only follow its client's address. */
		if (fragment)
			return count(LB_DROP_FRAGMENT, XDP_DROP);
		hash = hash16((__u64)iph->saddr | (__u64)iph->daddr << 32, (__u64)ports | (__u64)iph->protocol << 32);
	}
	/* A fragment without ports cannot be told apart from its flow's others: the table. */
	if ((svc->flags & LB_SVC_CONNTRACK) && !fragment) {
		struct lb_flow_key fk = {};

		fk.src[0] = iph->saddr;
		fk.dst[0] = iph->daddr;
		fk.sport = ports;
		fk.dport = ports >> 16;
		fk.proto = iph->protocol;
		fk.family = LB_FAMILY_V4;
		return tracked(eth, svc, &fk, hash, tcp_flags, bytes);
	}
	return forward(eth, svc, hash, bytes);
}

/* IPv6: a fixed header followed directly by TCP or UDP. Extension headers are not parsed: such
 * packets are not matched and pass to the kernel unchanged. */
static __always_inline int handle_ipv6(struct cursor *c, struct ethhdr *eth, __u64 bytes)
{
	struct ipv6hdr *ip6 = take(c, sizeof(*ip6));
	const struct lb_service *svc;
	__u32 ports = 0, hash, dst[4];
	__u8 tcp_flags = 0;
	__u64 l[5];
	enum l4 l4;

	if (!ip6)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	if (ip6->version != 6 || bpf_ntohs(ip6->payload_len) > (__u32)(c->end - c->pos))
		return count(LB_DROP_MALFORMED, XDP_DROP);
	l4 = parse_ports(c, ip6->nexthdr, &ports, &tcp_flags);
	if (l4 == L4_MALFORMED)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	if (l4 == L4_OTHER)
		return count(LB_STAT_PASSED, XDP_PASS);

	__builtin_memcpy(dst, &ip6->daddr, 16);
	svc = find_route(dst, key_tail(ports >> 16, ip6->nexthdr, LB_FAMILY_V6));
	if (!svc)
		return count(LB_STAT_PASSED, XDP_PASS);
	__builtin_memcpy(l, &ip6->saddr, 32); /* source, then destination: lanes 0-3 */
	if (svc->hash_mode == LB_HASH_CLIENT_IP) {
		hash = hash16(l[0], l[1]);
	} else {
		l[4] = (__u64)ports | (__u64)ip6->nexthdr << 32;
		hash = hash40(l);
	}
	if (svc->flags & LB_SVC_CONNTRACK) {
		struct lb_flow_key fk = {};

		__builtin_memcpy(fk.src, &ip6->saddr, 16);
		__builtin_memcpy(fk.dst, dst, 16);
		fk.sport = ports;
		fk.dport = ports >> 16;
		fk.proto = ip6->nexthdr;
		fk.family = LB_FAMILY_V6;
		return tracked(eth, svc, &fk, hash, tcp_flags, bytes);
	}
	return forward(eth, svc, hash, bytes);
}

SEC("xdp")
int lb_xdp(struct xdp_md *ctx)
{
	struct cursor c = { .pos = (void *)(long)ctx->data, .end = (void *)(long)ctx->data_end };
	__u64 bytes = c.end - c.pos;
	struct ethhdr *eth;
	__u16 proto;

	eth = take(&c, sizeof(*eth));
	if (!eth)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	proto = eth->h_proto;
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		struct vlan_hdr *vh = take(&c, sizeof(*vh));

		if (!vh)
			return count(LB_DROP_MALFORMED, XDP_DROP);
		proto = vh->h_vlan_encapsulated_proto;
	}
	if (proto == bpf_htons(ETH_P_IP))
		return handle_ipv4(&c, eth, bytes);
	if (proto == bpf_htons(ETH_P_IPV6))
		return handle_ipv6(&c, eth, bytes);
	return count(LB_STAT_PASSED, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
