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

/* An ID kept decoded in quic_cids (below). */
struct lb_quic_kept {
	struct lb_quic_cid id; /* generation 0 (no configuration's): empty */
	__u8 sid[16];          /* its server ID, padded with zeros */
	__u32 check;           /* quic.h, quic_check(): of the ten words above */
	__u32 pad;
};

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
	struct lb_quic_kept kept;   /* an ID being kept, made whole before it is written */
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_quic_scratch);
} quic_scratch SEC(".maps");

/* Encrypted IDs already decoded, with their server IDs, so that only the first packet of a
 * connection, or of each of its IDs, pays the cipher. Only IDs that named a server of the pool
 * at the time are kept, so that a flood of made-up IDs does not wash out real ones. The server
 * ID, not the backend, is kept: quic_servers still decides which backend that is, at every
 * packet; and a configuration's new key or lengths give it a new generation, under which
 * nothing kept is found. A set-associative array shared by all CPUs: an ID's set (a hash of it,
 * quic.h) holds two IDs, the one used last first; a new one pushes the older out. Looking an
 * ID up reads its set (96 octets), with no hash table's bucket and element to chase, which cost
 * more than the rest of the packet's path. CPUs write sets without a lock, so a reader may meet
 * one half written: each kept ID carries a check of all its words, and one whose check fails is
 * taken for not kept (decoded again). 65,536 sets: 131,072 IDs in 6 MiB. Not pinned: derived, a
 * new program starts without it. */
#ifndef LB_QUIC_SETS
#define LB_QUIC_SETS 65536
#endif
struct lb_quic_set {
	struct lb_quic_kept way[2];
};
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LB_QUIC_SETS);
	__type(key, __u32);
	__type(value, struct lb_quic_set);
} quic_cids SEC(".maps");

/* Each CPU's budget of decodings (lb.h, LB_QUIC_DECODES_PER_SEC), as a virtual clock: the time
 * the decodings spent so far would end at, each worth a second / LB_QUIC_DECODES_PER_SEC. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} quic_budget SEC(".maps");

#endif /* LB_QUIC_MAP_H */
