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

/* Service lookup: (address, port, protocol, family) -> service. A hash map, so each update
 * replaces a value whole. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2 * LB_MAX_SERVICES);
	__type(key, struct lb_service_key);
	__type(value, struct lb_service);
} services SEC(".maps");

/* One destination table per service: slot -> backend id (0 = empty). Inner maps may differ in
 * size; the control plane swaps a whole table by replacing one outer entry. */
struct lb_table {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_INNER_MAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
};

/* Service id -> its destination table. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, LB_MAX_SERVICES);
	__type(key, __u32);
	__array(values, struct lb_table);
} tables SEC(".maps");

/* Backend id -> where to send its frames. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, __u32);
	__type(value, struct lb_backend);
} backends SEC(".maps");

/* The attached interface's settings (one entry). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_config);
} settings SEC(".maps");

/* Packet counters and drop reasons, indexed by enum lb_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* Traffic forwarded per service id. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LB_MAX_SERVICES);
	__type(key, __u32);
	__type(value, struct lb_traffic);
} service_traffic SEC(".maps");

/* Traffic forwarded per backend id. */
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

static __always_inline int count(__u32 stat, int action)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &stat);

	if (v)
		*v += 1;
	return action;
}

static __always_inline void add_traffic(void *map, __u32 id, __u64 bytes)
{
	struct lb_traffic *t = bpf_map_lookup_elem(map, &id);

	if (t) {
		t->packets += 1;
		t->bytes += bytes;
	}
}

/* ---- hashing: Bob Jenkins' lookup3 over 32-bit words, as the kernel's jhash2 ---- */

static __always_inline __u32 rol32(__u32 x, int k)
{
	return (x << k) | (x >> (32 - k));
}

#define JH_MIX(a, b, c)                                 \
	do {                                                \
		a -= c; a ^= rol32(c, 4); c += b;               \
		b -= a; b ^= rol32(a, 6); a += c;               \
		c -= b; c ^= rol32(b, 8); b += a;               \
		a -= c; a ^= rol32(c, 16); c += b;              \
		b -= a; b ^= rol32(a, 19); a += c;              \
		c -= b; c ^= rol32(b, 4); b += a;               \
	} while (0)

#define JH_FINAL(a, b, c)                               \
	do {                                                \
		c ^= b; c -= rol32(b, 14);                      \
		a ^= c; a -= rol32(c, 11);                      \
		b ^= a; b -= rol32(a, 25);                      \
		c ^= b; c -= rol32(b, 16);                      \
		a ^= c; a -= rol32(c, 4);                       \
		b ^= a; b -= rol32(a, 14);                      \
		c ^= b; c -= rol32(b, 24);                      \
	} while (0)

/* jhash2(words, n, LB_HASH_SEED). n is a compile-time constant at every call site. */
static __always_inline __u32 jhash_words(const __u32 *k, __u32 n)
{
	__u32 a, b, c;

	a = b = c = 0xdeadbeef + (n << 2) + LB_HASH_SEED;
	while (n > 3) {
		a += k[0];
		b += k[1];
		c += k[2];
		JH_MIX(a, b, c);
		n -= 3;
		k += 3;
	}
	switch (n) {
	case 3:
		c += k[2];
		/* fallthrough */
	case 2:
		b += k[1];
		/* fallthrough */
	case 1:
		a += k[0];
		JH_FINAL(a, b, c);
		break;
	}
	return c;
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

/* What the parser learned about a packet for a service. */
struct flow {
	__u32 src[4]; /* addresses as host-order words of their network-order bytes */
	__u32 dst[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 family;
	__u8 nofrag_ports; /* 1 for a non-first IPv4 fragment: no ports */
};

enum verdict {
	V_SERVICE,   /* a TCP/UDP packet (or fragment) the services map may know */
	V_PASS,      /* not IP, or not TCP/UDP: not ours */
	V_MALFORMED,
};

static __always_inline enum verdict parse_l4(struct cursor *c, struct flow *f)
{
	if (f->proto == IPPROTO_TCP) {
		struct tcphdr *th = take(c, sizeof(*th));

		if (!th || th->doff < 5)
			return V_MALFORMED;
		f->sport = bpf_ntohs(th->source);
		f->dport = bpf_ntohs(th->dest);
		return V_SERVICE;
	}
	if (f->proto == IPPROTO_UDP) {
		struct udphdr *uh = take(c, sizeof(*uh));

		if (!uh)
			return V_MALFORMED;
		f->sport = bpf_ntohs(uh->source);
		f->dport = bpf_ntohs(uh->dest);
		return V_SERVICE;
	}
	return V_PASS;
}

static __always_inline enum verdict parse_ipv4(struct cursor *c, struct flow *f)
{
	struct iphdr *iph = take(c, sizeof(*iph));
	__u32 hlen, avail;

	if (!iph)
		return V_MALFORMED;
	hlen = iph->ihl * 4;
	if (iph->version != 4 || hlen < sizeof(*iph))
		return V_MALFORMED;
	/* Options: skip them, bounded once. */
	if (hlen > sizeof(*iph) && !take(c, hlen - sizeof(*iph)))
		return V_MALFORMED;
	/* The datagram must be all here: a truncated one is never forwarded. */
	avail = (void *)c->end - (void *)iph;
	if (bpf_ntohs(iph->tot_len) < hlen || bpf_ntohs(iph->tot_len) > avail)
		return V_MALFORMED;

	f->family = LB_FAMILY_V4;
	f->proto = iph->protocol;
	f->src[0] = bpf_ntohl(iph->saddr);
	f->dst[0] = bpf_ntohl(iph->daddr);
	if (f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP)
		return V_PASS;
	if (bpf_ntohs(iph->frag_off) & IP_OFFSET) {
		f->nofrag_ports = 1;
		return V_SERVICE;
	}
	return parse_l4(c, f);
}

static __always_inline enum verdict parse_ipv6(struct cursor *c, struct flow *f)
{
	struct ipv6hdr *ip6 = take(c, sizeof(*ip6));
	__u32 avail;
	int i;

	if (!ip6)
		return V_MALFORMED;
	if (ip6->version != 6)
		return V_MALFORMED;
	avail = (void *)c->end - (void *)(ip6 + 1);
	if (bpf_ntohs(ip6->payload_len) > avail)
		return V_MALFORMED;

	f->family = LB_FAMILY_V6;
	f->proto = ip6->nexthdr;
	/* Extension headers are not parsed: such packets are not matched and pass. */
	if (f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP)
		return V_PASS;
#pragma unroll
	for (i = 0; i < 4; i++) {
		f->src[i] = bpf_ntohl(ip6->saddr.in6_u.u6_addr32[i]);
		f->dst[i] = bpf_ntohl(ip6->daddr.in6_u.u6_addr32[i]);
	}
	return parse_l4(c, f);
}

/* The flow hash the destination table is indexed with. Documented in README.md ("Flow hash"). */
static __always_inline __u32 flow_hash(const struct flow *f, __u32 mode)
{
	__u32 w[10] = {};
	int i;

	if (mode == LB_HASH_CLIENT_IP) {
		if (f->family == LB_FAMILY_V4)
			return jhash_words(f->src, 1);
		return jhash_words(f->src, 4);
	}
	if (f->family == LB_FAMILY_V4) {
		w[0] = f->src[0];
		w[1] = f->dst[0];
		w[2] = ((__u32)f->sport << 16) | f->dport;
		w[3] = f->proto;
		return jhash_words(w, 4);
	}
#pragma unroll
	for (i = 0; i < 4; i++) {
		w[i] = f->src[i];
		w[4 + i] = f->dst[i];
	}
	w[8] = ((__u32)f->sport << 16) | f->dport;
	w[9] = f->proto;
	return jhash_words(w, 10);
}

SEC("xdp")
int lb_xdp(struct xdp_md *ctx)
{
	struct cursor c = { .pos = (void *)(long)ctx->data, .end = (void *)(long)ctx->data_end };
	__u64 bytes = c.end - c.pos;
	struct lb_service_key key = {};
	struct flow f = {};
	struct lb_service *svc;
	struct lb_backend *be;
	struct lb_config *cfg;
	struct ethhdr *eth;
	enum verdict v;
	__u32 zero = 0, slot, *id;
	void *table;
	__u16 proto;
	int i;

	eth = take(&c, sizeof(*eth));
	if (!eth)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	proto = bpf_ntohs(eth->h_proto);
	if (proto == ETH_P_8021Q || proto == ETH_P_8021AD) {
		struct vlan_hdr *vh = take(&c, sizeof(*vh));

		if (!vh)
			return count(LB_DROP_MALFORMED, XDP_DROP);
		proto = bpf_ntohs(vh->h_vlan_encapsulated_proto);
	}

	if (proto == ETH_P_IP)
		v = parse_ipv4(&c, &f);
	else if (proto == ETH_P_IPV6)
		v = parse_ipv6(&c, &f);
	else
		return count(LB_STAT_PASSED, XDP_PASS);
	if (v == V_MALFORMED)
		return count(LB_DROP_MALFORMED, XDP_DROP);
	if (v == V_PASS)
		return count(LB_STAT_PASSED, XDP_PASS);

#pragma unroll
	for (i = 0; i < 4; i++)
		key.addr[i] = bpf_htonl(f.dst[i]);
	key.port = f.nofrag_ports ? 0 : bpf_htons(f.dport);
	key.proto = f.proto;
	key.family = f.family;
	svc = bpf_map_lookup_elem(&services, &key);
	if (!svc)
		return count(LB_STAT_PASSED, XDP_PASS);
	/* A fragment without ports can only follow its client's address. */
	if (f.nofrag_ports && svc->hash_mode != LB_HASH_CLIENT_IP)
		return count(LB_DROP_FRAGMENT, XDP_DROP);
	if (svc->slots == 0)
		return count(LB_DROP_NO_BACKEND, XDP_DROP);

	table = bpf_map_lookup_elem(&tables, &svc->id);
	if (!table)
		return count(LB_DROP_NO_TABLE, XDP_DROP);
	slot = flow_hash(&f, svc->hash_mode) % svc->slots;
	id = bpf_map_lookup_elem(table, &slot);
	if (!id)
		return count(LB_DROP_NO_TABLE, XDP_DROP);
	if (*id == 0)
		return count(LB_DROP_NO_BACKEND, XDP_DROP);
	be = bpf_map_lookup_elem(&backends, id);
	if (!be || !(be->flags & LB_BACKEND_MAC_KNOWN))
		return count(LB_DROP_NO_MAC, XDP_DROP);
	cfg = bpf_map_lookup_elem(&settings, &zero);
	if (!cfg)
		return count(LB_DROP_NO_TABLE, XDP_DROP);

	__builtin_memcpy(eth->h_dest, be->mac, 6);
	__builtin_memcpy(eth->h_source, cfg->ifmac, 6);
	add_traffic(&service_traffic, svc->id, bytes);
	add_traffic(&backend_traffic, *id, bytes);
	return count(LB_STAT_FORWARDED, XDP_TX);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
