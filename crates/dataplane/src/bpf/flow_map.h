/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The flow tables' maps: the flow table (`flows`), the half-open table (`flow_pending`), where
 * each entry hashes in the destination tables (`flow_records`, `pending_records`), and the secret
 * key of their tags (`flow_key`). Their entries are lb.h's structs; what is done with them is
 * flow.h's (mechanism) and conntrack.h's (policy). */
#ifndef LB_FLOW_MAP_H
#define LB_FLOW_MAP_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lb.h"

/* Established flows -> the backend each started on (lb.h, struct lb_flow): buckets of
 * LB_FLOW_WAYS consecutive slots. Memory-mappable, so its values start on a page and every
 * bucket is one aligned cache line. One table shared by all CPUs: the packets of one flow can
 * arrive on different CPUs (RSS re-steering, a different receive queue after a link change).
 * Several load balancers behind ECMP do not share it at all; there the table, which they all
 * compute alike, keeps new flows consistent. User space sizes it (--conntrack-size). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, LB_FLOW_WAYS);
	__type(key, __u32);
	__type(value, struct lb_flow);
} flows SEC(".maps");

/* Flows seen once (half-open), the same way; user space sizes it too. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, LB_FLOW_WAYS);
	__type(key, __u32);
	__type(value, struct lb_flow);
} flow_pending SEC(".maps");

/* Where each entry of `flows` and of `flow_pending` hashes in the destination tables (lb.h,
 * struct lb_flow_record), at its entry's index: written by the program, read only by the
 * control plane's sweep of unstable slots, never on a packet's way. Sized like their tables. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, LB_FLOW_WAYS);
	__type(key, __u32);
	__type(value, struct lb_flow_record);
} flow_records SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, LB_FLOW_WAYS);
	__type(key, __u32);
	__type(value, struct lb_flow_record);
} pending_records SEC(".maps");

/* The secret key of the flow tags (lb.h, struct lb_flow_key): written by user space before the
 * program is attached, pinned, and never changed while the data plane lives. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lb_flow_key);
} flow_key SEC(".maps");

/* Makes lb.h's bit names part of the object's BTF, for user space (see maps.h). */
const volatile enum lb_flow_gen_bits lb_flow_gen_bits_btf = LB_FLOW_GEN_MASK;

#endif /* LB_FLOW_MAP_H */
