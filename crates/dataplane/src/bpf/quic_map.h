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
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_quic_scratch);
} quic_scratch SEC(".maps");

#endif /* LB_QUIC_MAP_H */
