// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* The veth benchmark's traffic generator (examples/e2e.rs trafgen, scripts/bench-veth.sh), run
 * with BPF_PROG_TEST_RUN's live-frame mode: it writes the frame afresh into every buffer before
 * sending it. The kernel recycles live-frame buffers without restoring their bytes, and a
 * receiver that wrote outer headers in front of a frame (encapsulation) leaves part of the old
 * bytes overwritten: without this, the generator would send that wreckage from then on. Never
 * loaded by lb itself. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#define TRAFGEN_WORDS 15 /* 60 bytes */

/* The frame, set by user space before loading. Read word by word through volatile loads: a
 * plain copy of a const global lets the compiler copy its initial value (zeros) instead. */
const volatile __u32 frame[TRAFGEN_WORDS] = {};

SEC("xdp")
int trafgen_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;

	if (data + TRAFGEN_WORDS * 4 > end)
		return XDP_ABORTED;
#pragma unroll
	for (int i = 0; i < TRAFGEN_WORDS; i++)
		((__u32 *)data)[i] = frame[i];
	return XDP_TX;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
