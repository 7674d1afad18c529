/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The "too big" answers' rate-limit buckets, global and per source prefix. The limits and how
 * they are taken are icmp.h's. */
#ifndef LB_ICMP_MAP_H
#define LB_ICMP_MAP_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* Source prefixes remembered; the least recently answered is forgotten first (it then starts
 * with a full bucket, still under the global limit). */
#define LB_TOO_BIG_SOURCES 16384

/* A bucket's state: when it would next be full, in bpf_ktime_get_ns() time (a "theoretical
 * arrival time": one answer moves it a gap later; an answer is allowed while it lies less than
 * the burst's worth of gaps ahead of now). Not pinned: a new program starts with full buckets. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} too_big_bucket SEC(".maps");

/* The source prefix's key: the family, then the /24's 3 bytes or the /48's 6. */
struct too_big_source {
	__u8 family;
	__u8 pad;
	__u8 prefix[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, LB_TOO_BIG_SOURCES);
	__type(key, struct too_big_source);
	__type(value, __u64);
} too_big_sources SEC(".maps");

#endif /* LB_ICMP_MAP_H */
