/* softverbs wire format: one UDP datagram per RC packet (see README.md). */
#ifndef SOFTVERBS_WIRE_H
#define SOFTVERBS_WIRE_H

#include <stddef.h>
#include <stdint.h>

enum {
	SV_HDR_LEN = 24,
	SV_MAGIC = 0x5653, /* "SV" little-endian */
	SV_VERSION = 1,
	SV_MAX_PAYLOAD = 4096, /* the largest path MTU */
	SV_PSN_MASK = 0xffffff,
};

enum sv_op {
	SV_OP_SEND_FIRST = 1,
	SV_OP_SEND_MIDDLE = 2,
	SV_OP_SEND_LAST = 3,
	SV_OP_SEND_LAST_IMM = 4,
	SV_OP_SEND_ONLY = 5,
	SV_OP_SEND_ONLY_IMM = 6,
	SV_OP_ACK = 0x11,
	SV_OP_NAK = 0x12,
};

enum sv_nak {
	SV_NAK_RNR = 1,     /* no RECV posted; aux carries the responder's min_rnr_timer */
	SV_NAK_SEQ = 2,     /* PSN sequence error; psn is the expected PSN */
	SV_NAK_INV_REQ = 3, /* invalid request (e.g. message longer than the RECV) */
	SV_NAK_REM_OP = 4,  /* remote operational error (RECV SGE failed its MR check) */
};

enum { SV_FLAG_SOLICITED = 1 };

struct sv_hdr {
	uint8_t op;
	uint8_t flags;
	uint8_t synd;    /* NAK only */
	uint8_t aux;     /* NAK RNR: rnr timer (0..31) */
	uint32_t dqpn;   /* 24 bits */
	uint32_t sqpn;   /* 24 bits */
	uint32_t psn;    /* 24 bits */
	uint32_t imm;    /* SEND_*_IMM: immediate, network order as posted */
	uint16_t len;    /* payload bytes that follow the header */
};

/* sv_encode writes h into b[0..SV_HDR_LEN). */
void sv_encode(const struct sv_hdr *h, uint8_t *b);

/* sv_decode parses the datagram b[0..n) into h. It returns 0, or -1 for anything a softverbs
 * device never sends (bad magic or version, unknown opcode, reserved bits, fields wider than
 * 24 bits, a length that disagrees with n or exceeds SV_MAX_PAYLOAD); h is untouched then. */
int sv_decode(const uint8_t *b, size_t n, struct sv_hdr *h);

static inline int sv_op_is_send(uint8_t op)
{
	return op >= SV_OP_SEND_FIRST && op <= SV_OP_SEND_ONLY_IMM;
}

static inline int32_t sv_psn_diff(uint32_t a, uint32_t b)
{
	return (int32_t)(((a - b) & SV_PSN_MASK) << 8) >> 8;
}

#endif
