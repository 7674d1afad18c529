// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* The benchmark floor: the least an XDP forwarder can do. Swap the Ethernet addresses and send
 * the frame back out. benches/xdp.rs measures lb_xdp against this in the same run; it is never
 * loaded by lb itself. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

SEC("xdp")
int floor_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u8 tmp[6];

	if ((void *)(eth + 1) > end)
		return XDP_DROP;
	__builtin_memcpy(tmp, eth->h_dest, 6);
	__builtin_memcpy(eth->h_dest, eth->h_source, 6);
	__builtin_memcpy(eth->h_source, tmp, 6);
	return XDP_TX;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
