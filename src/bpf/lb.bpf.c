// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* The XDP data plane. Until the packet path lands (issue 3) it passes every
 * packet, so attaching it is harmless. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

SEC("xdp")
int lb_xdp(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
