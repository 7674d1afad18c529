/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* QUIC-LB's maps: each service's parameters, its servers, the kernel's AES context for its key,
 * and each CPU's room for the cipher's blocks. What is done with them is quic.h's. */
#ifndef LB_QUIC_MAP_H
#define LB_QUIC_MAP_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lb.h"

/* Service key -> the service's QUIC-LB parameters (lb.h, struct lb_quic_config). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, LB_MAX_SERVICES);
	__type(key, struct lb_service_key);
	__type(value, struct lb_quic_config);
} quic_configs SEC(".maps");

/* (service, server ID) -> the backend id that has that server ID. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, LB_MAX_BACKENDS);
	__type(key, struct lb_quic_server);
	__type(value, __u32);
} quic_servers SEC(".maps");

/* Service key -> the kernel's AES-128 context for the service's key. Made and replaced only by
 * quic_set_key, deleted by user space; never read back (the key stays in the kernel). */
struct lb_quic_aes {
	struct bpf_crypto_ctx __kptr *ctx;
};
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* a deleted entry is never reused under a reader */
	__uint(max_entries, LB_MAX_SERVICES);
	__type(key, struct lb_service_key);
	__type(value, struct lb_quic_aes);
} quic_aes SEC(".maps");

/* This CPU's room for a connection ID and the blocks the cipher reads and writes (32 octets
 * each, so that an index masked with 31 is always inside). */
struct lb_quic_scratch {
	__u8 cid[32];   /* the destination connection ID as received (its first 20 octets) */
	__u8 left[32];  /* the Feistel halves */
	__u8 right[32];
	__u8 in[16];    /* the cipher's input block */
	__u8 out[16];   /* and its output */
	struct lb_quic_server key;
	struct lb_quic_cid decoded; /* the ID's key in quic_cids */
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_quic_scratch);
} quic_scratch SEC(".maps");

/* Encrypted IDs already decoded -> their server IDs (struct lb_quic_cid -> 16 octets, the
 * server ID padded with zeros), so that only the first packet of a connection, or of each of its
 * IDs, pays the cipher. Only IDs that named a server of the pool at the time are kept. An ID
 * looked up again after it was kept (its connection's next packet) moves to the active list of
 * the kernel's LRU, and IDs seen once, made-up ones among them, are pushed out first
 * (docs/security.md). The server ID, not the backend, is kept:
 * quic_servers still decides which backend that is, at every packet, and a configuration's new
 * key or lengths give it a new generation, under which nothing is found. Least recently used
 * entries go first, from one list for all CPUs: lookups take no lock, inserts (first packets
 * only, within the budget) take the list's; lists per CPU would each hold a CPU's share, and
 * lose IDs another CPU has room for. About 6.5 MiB. Not pinned: derived, a new program starts
 * without it. */
#ifndef LB_QUIC_CIDS
#define LB_QUIC_CIDS 65536
#endif
struct lb_quic_sid {
	__u8 sid[16];
};
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_QUIC_CIDS);
	__type(key, struct lb_quic_cid);
	__type(value, struct lb_quic_sid);
} quic_cids SEC(".maps");

/* Each CPU's budget of decodings (lb.h, enum lb_quic_budget), as a virtual clock: the time the
 * decodings spent so far would end at, each worth lb_config.quic_decode_ns. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} quic_budget SEC(".maps");

#endif /* LB_QUIC_MAP_H */
