// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* The veth benchmark's traffic generator (examples/e2e/main.rs trafgen, scripts/bench-veth.sh), run
 * with BPF_PROG_TEST_RUN's live-frame mode: it writes the frame afresh into every buffer before
 * sending it. The kernel recycles live-frame buffers without restoring their bytes, and a
 * receiver that wrote outer headers in front of a frame (encapsulation) leaves part of the old
 * bytes overwritten: without this, the generator would send that wreckage from then on.
 *
 * With `flows` set, every packet is another flow of a working set (the frame must be IPv4 TCP):
 * flow i comes from 172.16.0.0/12 (address 172.16.0.0 + i / 1024, port 1024 + i % 1024), and
 * each CPU walks the set round-robin from its own offset, sending ACKs. Every `new_every`-th
 * packet is instead a SYN of a flow never sent before, from 11.0.0.0/8: 4,194,304 addresses per
 * CPU (the CPU picks the top bits), then the next source port. With `warmup`, the first 2 x
 * flows packets a CPU sends are each flow's SYN followed by its ACK: its handshake, as a
 * connection tracker sees it. With `pairs` (and new_every 1, no working set), every flow never
 * sent before gets two packets back to back: a SYN and then its bare ACK, or, when the frame is
 * UDP, two datagrams: the second packet of a flow is what a connection tracker takes for a
 * completed handshake. Never loaded by lb itself. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define TRAFGEN_WORDS 15 /* 60 bytes */
#define TCP_SYN 0x02
#define TCP_ACK 0x10

/* The frame, set by user space before loading. Read word by word through volatile loads: a
 * plain copy of a const global lets the compiler copy its initial value (zeros) instead. */
const volatile __u32 frame[TRAFGEN_WORDS] = {};
const volatile __u32 flows = 0;     /* 0: send the frame as it is */
const volatile __u32 new_every = 0; /* 0: no new flows */
const volatile __u32 warmup = 0;
const volatile __u32 pairs = 0; /* two packets per new flow (see above) */

struct gen_state {
	__u64 sent;
	__u64 fresh;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gen_state);
} trafgen_state SEC(".maps");

SEC("xdp")
int trafgen_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 zero = 0, cpu, src, i;
	struct gen_state *st;
	__u16 sport;
	__u8 flags = TCP_ACK;
	int udp = *(__u8 *)(data + 23) == IPPROTO_UDP;
	__u64 n;

	if (data + TRAFGEN_WORDS * 4 > end)
		return XDP_ABORTED;
#pragma unroll
	for (int w = 0; w < TRAFGEN_WORDS; w++)
		((__u32 *)data)[w] = frame[w];
	if (flows == 0 && new_every == 0)
		return XDP_TX;
	st = bpf_map_lookup_elem(&trafgen_state, &zero);
	if (!st)
		return XDP_ABORTED;
	n = st->sent++;
	cpu = bpf_get_smp_processor_id();
	if (warmup && flows && n < 2 * (__u64)flows) {
		i = (__u32)(n >> 1);
		flags = n & 1 ? TCP_ACK : TCP_SYN;
		src = 0xac100000 + (i >> 10);
		sport = 1024 + (i & 1023);
	} else if (new_every && (flows == 0 || n % new_every == new_every - 1)) {
		/* A pair's second packet reuses the flow its first one started. */
		__u64 f = pairs ? (n >> 1) : st->fresh++;

		flags = pairs && (n & 1) ? TCP_ACK : TCP_SYN;
		src = 0x0b000000 + ((cpu & 3) << 22) + ((__u32)f & 0x3fffff);
		sport = 1024 + ((f >> 22) & 0x7fff);
	} else {
		i = (__u32)((n + (__u64)cpu * (flows / 2 + 1)) % flows);
		src = 0xac100000 + (i >> 10);
		sport = 1024 + (i & 1023);
	}
	*(__be32 *)(data + 26) = bpf_htonl(src);
	*(__be16 *)(data + 34) = bpf_htons(sport);
	if (!udp)
		*(__u8 *)(data + 47) = flags;
	/* The IPv4 header checksum, recomputed: a bridge or router on the way would otherwise
	 * drop the frames. (The TCP or UDP checksum is left wrong: receivers of a flood drop it
	 * early, before any socket.) */
	{
		__u16 *h = data + 14;
		__u32 sum = 0;

		h[5] = 0;
#pragma unroll
		for (int w = 0; w < 10; w++)
			sum += h[w];
		sum = (sum & 0xffff) + (sum >> 16);
		sum = (sum & 0xffff) + (sum >> 16);
		h[5] = ~sum;
	}
	return XDP_TX;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
