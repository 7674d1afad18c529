/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* QUIC-LB (draft-ietf-quic-load-balancers-21, docs/quic-lb.md): a QUIC packet of a service with
 * LB_SVC_QUIC_LB whose destination connection ID carries the server ID of a usable backend goes
 * to that backend, whatever its addresses and ports: a client that rebinds or migrates keeps its
 * server. Everything else falls back to what any UDP flow gets (the flow table, then the
 * destination table), counted by reason (lb.h, LB_QUIC_*).
 *
 * Reading the ID: a long header (first bit set) carries the ID's length at octet 5 and the ID
 * from octet 6; a short header carries the ID from octet 1 with no length, which the
 * configuration gives. Only the first 1 + server ID + nonce octets matter; servers may append
 * more. Decoding: in plain sight; one AES-128 decryption when server ID and nonce are 16 octets;
 * otherwise the draft's four-pass Feistel network undone in three passes (four when the server
 * ID is longer than the nonce), each pass an AES-128 encryption. The AES is the kernel's
 * (bpf_crypto_encrypt/decrypt on an "ecb(aes)" context), made from the key by the syscall
 * program quic_set_key below and kept in quic_aes: the key schedule is computed once, outside
 * the packet path, and the cipher is the kernel's own (here aes-fixed-time, constant-time).
 * An encrypted ID is decoded once: quic_cids (quic_map.h) keeps the server IDs of IDs decoded
 * before, so a connection's later packets pay a hash lookup, not the cipher; and each CPU
 * decodes at most a budget of IDs a second that are not kept (lb.h, enum lb_quic_budget), so
 * that a flood of made-up IDs falls back to the table (counted over_budget) instead of to the
 * cipher. */
#ifndef LB_QUIC_H
#define LB_QUIC_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lb.h"
#include "maps.h"
#include "parse.h"
#include "quic_map.h"

extern struct bpf_crypto_ctx *bpf_crypto_ctx_create(const struct bpf_crypto_params *params, __u32 params__sz,
						    int *err) __ksym __weak;
extern void bpf_crypto_ctx_release(struct bpf_crypto_ctx *ctx) __ksym __weak;
extern int bpf_crypto_encrypt(struct bpf_crypto_ctx *ctx, const struct bpf_dynptr *src,
			      const struct bpf_dynptr *dst, const struct bpf_dynptr *siv__nullable) __ksym __weak;
extern int bpf_crypto_decrypt(struct bpf_crypto_ctx *ctx, const struct bpf_dynptr *src,
			      const struct bpf_dynptr *dst, const struct bpf_dynptr *siv__nullable) __ksym __weak;

/* QUIC versions whose packet types lb knows: the client picks the IDs of their Initial and 0-RTT
 * packets. */
#define QUIC_V1 0x00000001
#define QUIC_V2 0x6b3343cf
/* The longest connection ID QUIC v1 and v2 allow. */
#define QUIC_MAX_CID 20
/* The byte loops below stay loops: unrolled, their copies spill registers onto a stack that
 * lb_xdp's frame already half fills (the verifier allows 512 bytes for the whole call chain). */
#define QUIC_LOOP _Pragma("clang loop unroll(disable)")

/* Makes the service's AES context from its key (or forgets it, with `remove`) and returns 0 or
 * -errno. Run by user space through BPF_PROG_TEST_RUN (a syscall program), never by packets. */
SEC("syscall")
int quic_set_key(struct lb_quic_key_arg *arg)
{
	struct bpf_crypto_params params = {
		.type = "skcipher",
		.algo = "ecb(aes)",
		.key_len = 16,
	};
	struct lb_quic_aes empty = {}, *slot;
	struct bpf_crypto_ctx *ctx;
	struct lb_service_key key;
	int err = 0;

	__builtin_memcpy(&key, &arg->service, sizeof(key));
	if (!bpf_ksym_exists(bpf_crypto_ctx_create))
		return -95; /* EOPNOTSUPP: this kernel has no BPF crypto */
	__builtin_memcpy(params.key, arg->key, 16);
	ctx = bpf_crypto_ctx_create(&params, sizeof(params), &err);
	if (!ctx)
		return err ? err : -22;
	bpf_map_update_elem(&quic_aes, &key, &empty, BPF_NOEXIST);
	slot = bpf_map_lookup_elem(&quic_aes, &key);
	if (!slot) {
		bpf_crypto_ctx_release(ctx);
		return -12; /* ENOMEM */
	}
	ctx = bpf_kptr_xchg(&slot->ctx, ctx);
	if (ctx)
		bpf_crypto_ctx_release(ctx);
	return 0;
}

/* One AES-128 block of the service's cipher: s->in to s->out (decrypt: the inverse). 0 or
 * -errno. A function of its own: its two dynptrs would otherwise take stack at each of the
 * five places it is used, on top of lb_xdp's. */
static __noinline int quic_aes_block(struct lb_quic_aes *aes, struct lb_quic_scratch *s, int decrypt)
{
	struct bpf_crypto_ctx *ctx;
	struct bpf_dynptr src, dst;
	int err = -1;

	if (!bpf_ksym_exists(bpf_crypto_encrypt) || !bpf_ksym_exists(bpf_crypto_decrypt))
		return -95;
	bpf_dynptr_from_mem(s->in, 16, 0, &src);
	bpf_dynptr_from_mem(s->out, 16, 0, &dst);
	/* An XDP program runs in an RCU read section: the context stays valid while it is used,
	 * even if quic_set_key replaces it or user space deletes it meanwhile. */
	ctx = aes->ctx;
	if (ctx)
		err = decrypt ? bpf_crypto_decrypt(ctx, &src, &dst, NULL) : bpf_crypto_encrypt(ctx, &src, &dst, NULL);
	return err;
}

/* One Feistel pass (the draft's section 5.4.2): `half` ^= the first h octets of
 * AES(expand(L, pass, other)), then the shared middle nibble cleared when L is odd (the high
 * nibble of `half` when it is the left half, the low one when it is the right). */
static __always_inline int quic_pass(struct lb_quic_aes *aes, struct lb_quic_scratch *s, __u8 *half, const __u8 *other,
				     __u32 l, __u32 h, __u8 pass, int is_left)
{
	int i;

	__builtin_memset(s->in, 0, 16);
	QUIC_LOOP
	for (i = 0; i < 10; i++)
		if (i < h)
			s->in[i] = other[i];
	s->in[14] = l;
	s->in[15] = pass;
	if (quic_aes_block(aes, s, 0))
		return -1;
	QUIC_LOOP
	for (i = 0; i < 10; i++)
		if (i < h)
			half[i] ^= s->out[i];
	if (l & 1) {
		if (is_left)
			half[(h - 1) & 31] &= 0xf0;
		else
			half[0] &= 0x0f;
	}
	return 0;
}

/* The server ID of s->cid (first octet, then the encrypted block) into s->key.sid: 0, or -1
 * when the cipher failed. A function of its own, so that its stack is not quic_route's. */
static __noinline int quic_decrypt(struct lb_quic_aes *aes, struct lb_quic_scratch *s,
					const struct lb_quic_config *cfg)
{
	__u32 sid = cfg->sid_len, l = cfg->sid_len + cfg->nonce_len, h = (l + 1) / 2, i;

	if (l == 16) {
		QUIC_LOOP
		for (i = 0; i < 16; i++)
			s->in[i] = s->cid[1 + i];
		if (quic_aes_block(aes, s, 1))
			return -1;
		QUIC_LOOP
		for (i = 0; i < 15; i++)
			if (i < sid)
				s->key.sid[i] = s->out[i];
		return 0;
	}
	/* Split: left = the first h octets, right = the h octets from floor(L/2); for an odd L the
	 * middle octet is shared, its high nibble on the left and its low one on the right. */
	QUIC_LOOP
	for (i = 0; i < 10; i++) {
		s->left[i] = i < h ? s->cid[(1 + i) & 31] : 0;
		s->right[i] = i < h ? s->cid[(1 + l / 2 + i) & 31] : 0;
	}
	if (l & 1) {
		s->left[(h - 1) & 31] &= 0xf0;
		s->right[0] &= 0x0f;
	}
	/* The encoder's passes 4, 3 and 2 undone in reverse order; pass 1 only when the server ID
	 * reaches past the left half. */
	if (quic_pass(aes, s, s->left, s->right, l, h, 4, 1) || quic_pass(aes, s, s->right, s->left, l, h, 3, 0) ||
	    quic_pass(aes, s, s->left, s->right, l, h, 2, 1))
		return -1;
	if (sid > cfg->nonce_len && quic_pass(aes, s, s->right, s->left, l, h, 1, 0))
		return -1;
	/* The plaintext: left, then right from where the halves meet (its first octet merges with
	 * the left's last when L is odd); the server ID is its first sid octets. */
	QUIC_LOOP
	for (i = 0; i < 15; i++) {
		__u8 b;

		if (i >= sid)
			break;
		if (i + 1 < h)
			b = s->left[i & 31];
		else if (i + 1 == h)
			b = (l & 1) ? (s->left[i & 31] | s->right[0]) : s->left[i & 31];
		else
			b = s->right[(i - l / 2) & 31];
		s->key.sid[i] = b;
	}
	return 0;
}

/* Whether this CPU may decode one more encrypted ID now (lb.h, enum lb_quic_budget); if so, that
 * one is taken. The budget is a virtual clock per CPU: each decoding moves it on by
 * lb_settings.quic_decode_ns, it may run ahead of the real (coarse) clock by one window at
 * most, and it is never behind it, so that a quiet moment saves a window's worth of decodings
 * and no more. */
static __always_inline int quic_budget_take(void)
{
	__u64 each = lb_settings.quic_decode_ns, now, *clock;
	__u32 zero = 0;

	if (each == 0)
		return 1;
	clock = bpf_map_lookup_elem(&quic_budget, &zero);
	if (!clock)
		return 0;
	now = bpf_ktime_get_coarse_ns();
	if (*clock < now)
		*clock = now;
	/* (A budget below ten a second, whose one decoding is worth more than the window, still
	 * decodes one whenever the clock has caught up.) */
	if (*clock > now && *clock + each > now + LB_QUIC_DECODE_WINDOW_NS)
		return 0;
	*clock += each;
	return 1;
}

/* The backend id a QUIC packet's destination connection ID names, or 0 with the fallback's
 * reason counted. `off`: where the UDP payload starts in the frame; `len`: its length by the
 * datagram's own length fields. A global function, so that the verifier walks it once rather
 * than once for every way lb_xdp reaches it (which took the program past its limit). */
__noinline __u32 quic_route(struct xdp_md *ctx, const struct lb_service_key *svc, __u32 off, __u32 len)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	const struct lb_quic_config *cfg;
	const struct lb_quic_sid *known = NULL;
	struct lb_quic_aes *aes = NULL;
	struct lb_quic_scratch *s;
	struct lb_backend *be;
	__u32 zero = 0, l, i, *id, id_len = QUIC_MAX_CID; /* a short header's: the configuration's */
	__u8 *q, *cid;

	/* An XDP frame is one page at most: a bound the verifier can carry through `q + n > end`. */
	if (!svc || off > 0x3fff)
		return count(LB_QUIC_SHORT, 0);
	q = data + (off & 0x3fff);
	cfg = bpf_map_lookup_elem(&quic_configs, svc);
	s = bpf_map_lookup_elem(&quic_scratch, &zero);
	if (!cfg || !s)
		return count(LB_QUIC_NO_KEY, 0);
	l = cfg->sid_len + cfg->nonce_len;
	if (len < 1 || (void *)(q + 1) > end)
		return count(LB_QUIC_SHORT, 0);
	if (q[0] & 0x80) {
		__u32 version, type;

		/* Long header: first octet, version (4), ID length, ID. */
		if (len < 6 + QUIC_MAX_CID || (void *)(q + 6 + QUIC_MAX_CID) > end)
			return count(LB_QUIC_SHORT, 0);
		version = (__u32)q[1] << 24 | (__u32)q[2] << 16 | (__u32)q[3] << 8 | q[4];
		type = (q[0] >> 4) & 3;
		if ((version == QUIC_V1 && type <= 1) || (version == QUIC_V2 && (type == 1 || type == 2)))
			return count(LB_QUIC_CLIENT_ID, 0);
		cid = q + 6;
		id_len = q[5];
	} else {
		/* Short header: the ID follows the first octet; its length is the configuration's. A
		 * real packet also carries a packet number and an AEAD tag (16) behind it. */
		if (len < 1 + QUIC_MAX_CID || (void *)(q + 1 + QUIC_MAX_CID) > end)
			return count(LB_QUIC_SHORT, 0);
		cid = q + 1;
	}
	/* A long header says how long its ID is: one too short for this configuration's, an empty
	 * one included, is that before anything is read of it (the octets there are another
	 * field's, and their top bits no rotation). */
	if (id_len < 1 + l)
		return count(LB_QUIC_SHORT, 0);
	__builtin_memcpy(s->cid, cid, QUIC_MAX_CID);
	if ((s->cid[0] >> 5) == 7)
		return count(LB_QUIC_UNROUTABLE, 0);
	if ((s->cid[0] >> 5) != cfg->rotation)
		return count(LB_QUIC_OTHER_CONFIG, 0);
	__builtin_memcpy(&s->key.service, svc, sizeof(s->key.service));
	if (cfg->encrypted) {
		/* An ID decoded before (under this configuration's generation) is not decoded again;
		 * one never seen is, while this CPU's budget lasts. */
		s->decoded.gen = cfg->gen;
		for (i = 0; i < 5; i++)
			((__u32 *)s->decoded.cid)[i] = ((__u32 *)s->cid)[i] & cfg->cid_mask[i];
		known = bpf_map_lookup_elem(&quic_cids, &s->decoded);
		if (known) {
			__builtin_memcpy(s->key.sid, known->sid, 16);
		} else {
			/* No key: nothing to spend the budget on. */
			aes = bpf_map_lookup_elem(&quic_aes, svc);
			if (!aes)
				return count(LB_QUIC_NO_KEY, 0);
			if (!quic_budget_take())
				return count(LB_QUIC_OVER_BUDGET, 0);
			if (quic_decrypt(aes, s, cfg))
				return count(LB_QUIC_NO_KEY, 0);
			count(LB_QUIC_DECODED, 0);
		}
	} else {
		__builtin_memcpy(s->key.sid, cid + 1, 16);
	}
	/* Only the server ID's octets count; the rest of the key is zero. */
	for (i = 0; i < 4; i++)
		((__u32 *)s->key.sid)[i] &= cfg->sid_mask[i];
	id = bpf_map_lookup_elem(&quic_servers, &s->key);
	if (!id)
		return count(LB_QUIC_UNKNOWN_SERVER, 0);
	/* A server of the pool: its ID is worth keeping decoded. */
	if (cfg->encrypted && !known)
		bpf_map_update_elem(&quic_cids, &s->decoded, s->key.sid, BPF_NOEXIST);
	be = bpf_map_lookup_elem(&backends, id);
	if (!be || !(be->flags & LB_BACKEND_ALIVE))
		return count(LB_QUIC_UNUSABLE, 0);
	count(LB_QUIC_ROUTED, 0);
	return *id;
}

#endif /* LB_QUIC_H */
