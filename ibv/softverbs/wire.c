//go:build ignore

/* softverbs wire encoder and decoder (see wire.h). */
#include <string.h>
#include "wire.h"

static void put16(uint8_t *b, uint16_t v)
{
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *b, uint32_t v)
{
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
	b[2] = (uint8_t)(v >> 16);
	b[3] = (uint8_t)(v >> 24);
}

static uint16_t get16(const uint8_t *b)
{
	return (uint16_t)(b[0] | b[1] << 8);
}

static uint32_t get32(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void put64(uint8_t *b, uint64_t v)
{
	put32(b, (uint32_t)v);
	put32(b + 4, (uint32_t)(v >> 32));
}

static uint64_t get64(const uint8_t *b)
{
	return (uint64_t)get32(b) | (uint64_t)get32(b + 4) << 32;
}

size_t sv_ext_len(uint8_t op)
{
	switch (op) {
	case SV_OP_WRITE_FIRST:
	case SV_OP_WRITE_ONLY:
	case SV_OP_WRITE_ONLY_IMM:
	case SV_OP_READ_REQ:
		return SV_RETH_LEN;
	case SV_OP_CMP_SWP:
	case SV_OP_FETCH_ADD:
		return SV_ATOMETH_LEN;
	case SV_OP_ATOMIC_ACK:
		return SV_AACK_LEN;
	case SV_OP_UD_SEND:
	case SV_OP_UD_SEND_IMM:
		return SV_DETH_LEN;
	default:
		return 0;
	}
}

size_t sv_wire_hdr_len(const struct sv_hdr *h)
{
	return SV_HDR_LEN + sv_ext_len(h->op) + (h->flags & SV_FLAG_REF ? SV_REF_LEN : 0);
}

/* Layout (little-endian):
 *  0 u16 magic   2 u8 version   3 u8 opcode
 *  4 u32 dest QPN   8 u32 source QPN   12 u32 PSN   16 u32 immediate
 * 20 u16 payload length   22 u8 flags   23 u8 NAK syndrome (high 3 bits) | aux (low 5 bits)
 * then by opcode: RETH (24 u64 va, 32 u32 rkey, 36 u32 length), AtomicETH (24 u64 va,
 * 32 u32 rkey, 36 u64 swap/add, 44 u64 compare), AtomicAckETH (24 u64 original) or DETH
 * (24 u32 Q_Key, 28 source GID, 44 destination GID); then, with SV_FLAG_REF, the REF block
 * (u32 pid, u32 0, u64 payload va, u64 token va, u64 token) instead of the payload. */
size_t sv_encode(const struct sv_hdr *h, uint8_t *b)
{
	put16(b, SV_MAGIC);
	b[2] = SV_VERSION;
	b[3] = h->op;
	put32(b + 4, h->dqpn);
	put32(b + 8, h->sqpn);
	put32(b + 12, h->psn);
	put32(b + 16, h->imm);
	put16(b + 20, h->len);
	b[22] = h->flags;
	b[23] = (uint8_t)(h->synd << 5 | (h->aux & 31));
	size_t ext = sv_ext_len(h->op);
	uint8_t *e = b + SV_HDR_LEN;
	if (ext == SV_RETH_LEN) {
		put64(e, h->va);
		put32(e + 8, h->rkey);
		put32(e + 12, h->dlen);
	} else if (ext == SV_ATOMETH_LEN) {
		put64(e, h->va);
		put32(e + 8, h->rkey);
		put64(e + 12, h->data0);
		put64(e + 20, h->data1);
	} else if (ext == SV_AACK_LEN) {
		put64(e, h->data0);
	} else if (ext == SV_DETH_LEN) {
		put32(e, h->qkey);
		memcpy(e + 4, h->sgid, 16);
		memcpy(e + 20, h->dgid, 16);
	}
	if (h->flags & SV_FLAG_REF) {
		e += ext;
		put32(e, h->rpid);
		put32(e + 4, 0);
		put64(e + 8, h->rva);
		put64(e + 16, h->tokva);
		put64(e + 24, h->tok);
		return SV_HDR_LEN + ext + SV_REF_LEN;
	}
	return SV_HDR_LEN + ext;
}

int sv_decode(const uint8_t *b, size_t n, struct sv_hdr *h)
{
	struct sv_hdr x;

	if (!b || n < SV_HDR_LEN)
		return -1;
	if (get16(b) != SV_MAGIC || b[2] != SV_VERSION)
		return -1;
	memset(&x, 0, sizeof(x));
	x.op = b[3];
	x.dqpn = get32(b + 4);
	x.sqpn = get32(b + 8);
	x.psn = get32(b + 12);
	x.imm = get32(b + 16);
	x.len = get16(b + 20);
	x.flags = b[22];
	x.synd = b[23] >> 5;
	x.aux = b[23] & 31;
	if (x.dqpn > SV_PSN_MASK || x.sqpn > SV_PSN_MASK || x.psn > SV_PSN_MASK)
		return -1;
	size_t ext = sv_ext_len(x.op);
	int ref = (x.flags & SV_FLAG_REF) != 0;
	if (x.len > SV_MAX_PAYLOAD || n - SV_HDR_LEN < ext)
		return -1;
	if (ref ? n - SV_HDR_LEN - ext != SV_REF_LEN : (size_t)x.len != n - SV_HDR_LEN - ext)
		return -1;
	const uint8_t *e = b + SV_HDR_LEN;
	if (ext == SV_RETH_LEN) {
		x.va = get64(e);
		x.rkey = get32(e + 8);
		x.dlen = get32(e + 12);
	} else if (ext == SV_ATOMETH_LEN) {
		x.va = get64(e);
		x.rkey = get32(e + 8);
		x.data0 = get64(e + 12);
		x.data1 = get64(e + 20);
	} else if (ext == SV_AACK_LEN) {
		x.data0 = get64(e);
	} else if (ext == SV_DETH_LEN) {
		x.qkey = get32(e);
		memcpy(x.sgid, e + 4, 16);
		memcpy(x.dgid, e + 20, 16);
	}
	if (ref) {
		/* only on the RC SEND and WRITE packets that carry a payload */
		const uint8_t *r = e + ext;
		x.rpid = get32(r);
		x.rva = get64(r + 8);
		x.tokva = get64(r + 16);
		x.tok = get64(r + 24);
		if (!x.len || !x.rpid || get32(r + 4) || !x.rva || !x.tokva || !x.tok ||
		    x.op < SV_OP_SEND_FIRST || x.op > SV_OP_WRITE_ONLY_IMM)
			return -1;
		x.flags &= (uint8_t)~SV_FLAG_REF; /* checked by opcode below without it */
	}
	if (x.op != SV_OP_NAK && x.op != SV_OP_READ_REQ && (x.synd || x.aux))
		return -1;
	switch (x.op) {
	case SV_OP_SEND_FIRST:
	case SV_OP_SEND_MIDDLE:
		if (x.len == 0)
			return -1;
		/* fallthrough */
	case SV_OP_SEND_LAST:
	case SV_OP_SEND_ONLY:
		if (x.imm != 0)
			return -1;
		/* fallthrough */
	case SV_OP_SEND_LAST_IMM:
	case SV_OP_SEND_ONLY_IMM:
		if (x.flags & ~SV_FLAG_SOLICITED)
			return -1;
		break;
	case SV_OP_WRITE_FIRST:
	case SV_OP_WRITE_MIDDLE:
		if (x.len == 0 || x.imm || (x.flags & ~SV_FLAG_IMM))
			return -1;
		if (x.op == SV_OP_WRITE_FIRST && x.dlen <= x.len)
			return -1; /* a FIRST is followed by more */
		break;
	case SV_OP_WRITE_LAST:
	case SV_OP_WRITE_ONLY:
		if (x.imm || x.flags)
			return -1;
		/* fallthrough */
	case SV_OP_WRITE_LAST_IMM:
	case SV_OP_WRITE_ONLY_IMM:
		if (x.flags & ~SV_FLAG_SOLICITED)
			return -1;
		if (sv_ext_len(x.op) && x.dlen != x.len)
			return -1; /* an ONLY carries the whole message */
		break;
	case SV_OP_READ_REQ:
		if (x.len || x.imm || x.flags || x.synd || x.aux < 1 || x.aux > 5)
			return -1;
		break;
	case SV_OP_CMP_SWP:
	case SV_OP_FETCH_ADD:
		if (x.len || x.imm || x.flags || (x.op == SV_OP_FETCH_ADD && x.data1))
			return -1;
		break;
	case SV_OP_READ_RESP:
	case SV_OP_ATOMIC_ACK:
		if (x.imm || x.flags || (x.op == SV_OP_ATOMIC_ACK && x.len))
			return -1;
		break;
	case SV_OP_UD_SEND:
		if (x.imm)
			return -1;
		/* fallthrough */
	case SV_OP_UD_SEND_IMM:
		if (x.flags & ~(SV_FLAG_SOLICITED | SV_FLAG_GRH))
			return -1;
		break;
	case SV_OP_ACK:
		if (x.flags || x.imm || x.len)
			return -1;
		break;
	case SV_OP_NAK:
		if (x.flags || x.imm || x.len)
			return -1;
		if (x.synd < SV_NAK_RNR || x.synd > SV_NAK_NOREF)
			return -1;
		if (x.synd != SV_NAK_RNR && x.aux)
			return -1;
		break;
	default:
		return -1;
	}
	if (ref)
		x.flags |= SV_FLAG_REF;
	*h = x;
	return 0;
}

int sv_decode_next(const uint8_t *b, size_t n, struct sv_hdr *h, size_t *used)
{
	size_t l = n;
	if (b && n >= SV_HDR_LEN && (b[22] & SV_FLAG_REF)) {
		l = SV_HDR_LEN + sv_ext_len(b[3]) + SV_REF_LEN;
		if (l > n)
			return -1;
	}
	if (sv_decode(b, l, h))
		return -1;
	*used = l;
	return 0;
}
