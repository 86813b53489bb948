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

/* Layout (little-endian):
 *  0 u16 magic   2 u8 version   3 u8 opcode
 *  4 u32 dest QPN   8 u32 source QPN   12 u32 PSN   16 u32 immediate
 * 20 u16 payload length   22 u8 flags   23 u8 NAK syndrome (high 3 bits) | aux (low 5 bits) */
void sv_encode(const struct sv_hdr *h, uint8_t *b)
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
	if (x.len > SV_MAX_PAYLOAD || (size_t)x.len != n - SV_HDR_LEN)
		return -1;
	switch (x.op) {
	case SV_OP_SEND_FIRST:
	case SV_OP_SEND_MIDDLE:
		if (x.len == 0 || x.imm != 0)
			return -1;
		/* fallthrough */
	case SV_OP_SEND_LAST:
	case SV_OP_SEND_ONLY:
		if (x.imm != 0)
			return -1;
		/* fallthrough */
	case SV_OP_SEND_LAST_IMM:
	case SV_OP_SEND_ONLY_IMM:
		if (x.flags & ~SV_FLAG_SOLICITED || x.synd || x.aux)
			return -1;
		break;
	case SV_OP_ACK:
		if (x.flags || x.synd || x.aux || x.imm || x.len)
			return -1;
		break;
	case SV_OP_NAK:
		if (x.flags || x.imm || x.len)
			return -1;
		if (x.synd < SV_NAK_RNR || x.synd > SV_NAK_REM_OP)
			return -1;
		if (x.synd != SV_NAK_RNR && x.aux)
			return -1;
		break;
	default:
		return -1;
	}
	*h = x;
	return 0;
}
