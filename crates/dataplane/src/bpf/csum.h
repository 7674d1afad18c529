/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Internet checksums (RFC 1071). Words are added as they lie in memory: the one's complement sum
 * is the same in either byte order, so no swapping is needed as long as every word is added the
 * same way and the result is stored back as it came out. */
#ifndef LB_CSUM_H
#define LB_CSUM_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

static __always_inline __u16 csum_fold(__u64 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* The header checksum of a 20-byte IPv4 header whose check field is zero (see ipv4_csum_ok). */
static __always_inline __u16 ipv4_csum(const void *iph)
{
	const __u16 *w = iph;
	__u64 sum = 0;

#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += w[i];
	return csum_fold(sum);
}

/* Whether a 20-byte IPv4 header's checksum is right: summed with its check field, a right
 * header folds to zero. */
static __always_inline int ipv4_csum_ok(const void *iph)
{
	return ipv4_csum(iph) == 0;
}

/* Adds the `len` bytes at `p` (len even, at most 2 * max_words) to `sum`, reading no byte past
 * `end`. For the rare packets lb builds itself (ICMP errors), so a loop is fine. */
#define LB_CSUM_MAX_WORDS 128
static __always_inline __u64 csum_add_region(__u64 sum, const void *p, const void *end, __u32 len)
{
	const __u16 *w = p;

	for (int i = 0; i < LB_CSUM_MAX_WORDS; i++) {
		if ((__u32)i * 2 >= len)
			break;
		if ((const void *)(w + i + 1) > end)
			break;
		sum += w[i];
	}
	return sum;
}

#endif /* LB_CSUM_H */
