/* softverbs wire format: one UDP datagram per RC packet (see README.md). */
#ifndef SOFTVERBS_WIRE_H
#define SOFTVERBS_WIRE_H

#include <stddef.h>
#include <stdint.h>

enum {
	SV_HDR_LEN = 24,
	SV_MAGIC = 0x5653, /* "SV" little-endian */
	SV_VERSION = 2,
	SV_RETH_LEN = 16,   /* WRITE FIRST/ONLY, READ request: va u64, rkey u32, length u32 */
	SV_ATOMETH_LEN = 28, /* CMP_SWP, FETCH_ADD: va u64, rkey u32, swap/add u64, compare u64 */
	SV_AACK_LEN = 8,    /* ATOMIC ACK: the original value u64 */
	SV_DETH_LEN = 36,   /* UD SEND: Q_Key u32, source GID, destination GID (the GRH's) */
	SV_REF_LEN = 32,    /* SV_FLAG_REF: pid u32, 0 u32, payload va u64, token va u64, token u64 */
	SV_MAX_HDR = SV_HDR_LEN + SV_DETH_LEN + SV_REF_LEN,
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
	SV_OP_WRITE_FIRST = 7,
	SV_OP_WRITE_MIDDLE = 8,
	SV_OP_WRITE_LAST = 9,
	SV_OP_WRITE_LAST_IMM = 10,
	SV_OP_WRITE_ONLY = 11,
	SV_OP_WRITE_ONLY_IMM = 12,
	SV_OP_READ_REQ = 13,  /* aux: the requester's path MTU (enum ibv_mtu) the responses use */
	SV_OP_CMP_SWP = 14,
	SV_OP_FETCH_ADD = 15,
	SV_OP_ACK = 0x11,
	SV_OP_NAK = 0x12,
	SV_OP_READ_RESP = 0x13, /* one per PSN of the request, in order */
	SV_OP_ATOMIC_ACK = 0x14,
	SV_OP_UD_SEND = 0x15, /* a UD message: one packet */
	SV_OP_UD_SEND_IMM = 0x16,
};

enum sv_nak {
	SV_NAK_RNR = 1,     /* no RECV posted; aux carries the responder's min_rnr_timer */
	SV_NAK_SEQ = 2,     /* PSN sequence error; psn is the expected PSN */
	SV_NAK_INV_REQ = 3, /* invalid request (e.g. message longer than the RECV) */
	SV_NAK_REM_OP = 4,  /* remote operational error (RECV SGE failed its MR check) */
	SV_NAK_REM_ACCESS = 5, /* remote access error (rkey, access rights, bounds) */
	SV_NAK_NOREF = 6,   /* an SV_FLAG_REF payload could not be read: send the bytes instead */
};

/* SV_FLAG_IMM marks the FIRST and MIDDLE packets of an RDMA WRITE with immediate, so that the
 * responder claims its RECV (or answers RNR) at the first packet, as for a SEND. */
enum { SV_FLAG_SOLICITED = 1, SV_FLAG_IMM = 2, SV_FLAG_GRH = 4 /* UD: the sender's AH had a GRH */ };

/* SV_FLAG_REF (RC SEND and WRITE packets between processes of one host): the datagram carries,
 * instead of its len payload bytes, where they lie in the sending process: the receiver reads
 * them with process_vm_readv. The token is a random value the sender keeps just before the
 * WQE's data while it may be sent and clears before freeing it: the receiver reads it after
 * the payload and takes the payload only if it still matches (so a process of another PID
 * namespace under the same PID, or data already freed, is never taken for the payload). */
enum { SV_FLAG_REF = 8 };

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
	/* extended headers, by opcode (zero where the opcode has none) */
	uint64_t va;     /* RETH, AtomicETH: remote virtual address */
	uint32_t rkey;   /* RETH, AtomicETH */
	uint32_t dlen;   /* RETH: DMA length of the whole WRITE or of the READ request */
	uint64_t data0;  /* AtomicETH: swap or add value; ATOMIC ACK: the original value */
	uint64_t data1;  /* AtomicETH: compare value */
	uint32_t qkey;   /* DETH: the Q_Key */
	uint8_t sgid[16], dgid[16]; /* DETH: the GIDs the receiver's GRH shows */
	uint32_t rpid;   /* SV_FLAG_REF: the sending process, its payload's address, */
	uint64_t rva;    /* the address of its token, and the token */
	uint64_t tokva;
	uint64_t tok;
};

/* sv_ext_len is the extended header length of op (after the SV_HDR_LEN fixed header). */
size_t sv_ext_len(uint8_t op);

/* sv_wire_hdr_len is the length of h's headers on the wire: the fixed and extended headers,
 * and the REF block where SV_FLAG_REF is set (then no payload follows). */
size_t sv_wire_hdr_len(const struct sv_hdr *h);

/* sv_encode writes h's headers into b[0..SV_MAX_HDR) and returns their length; the payload
 * follows unless h carries SV_FLAG_REF. */
size_t sv_encode(const struct sv_hdr *h, uint8_t *b);

/* sv_decode parses the datagram b[0..n) into h. It returns 0, or -1 for anything a softverbs
 * device never sends (bad magic or version, unknown opcode, reserved bits, fields wider than
 * 24 bits, fields the opcode does not carry, a length that disagrees with n or exceeds
 * SV_MAX_PAYLOAD); h is untouched then. The payload starts at SV_HDR_LEN + sv_ext_len(op). */
int sv_decode(const uint8_t *b, size_t n, struct sv_hdr *h);

/* sv_decode_next decodes the packet at the start of b[0..n): a datagram holds one packet,
 * or a train of SV_FLAG_REF packets (each of its own length, no payload). *used is the
 * packet's length on the wire; 0, or -1 as sv_decode (a train's packets are each checked as
 * alone, and a packet without SV_FLAG_REF must fill what is left of the datagram). */
int sv_decode_next(const uint8_t *b, size_t n, struct sv_hdr *h, size_t *used);

static inline int sv_op_is_send(uint8_t op)
{
	return op >= SV_OP_SEND_FIRST && op <= SV_OP_SEND_ONLY_IMM;
}

/* sv_op_is_request: a packet a requester sends (SEND, WRITE, READ request, atomic). */
static inline int sv_op_is_request(uint8_t op)
{
	return op >= SV_OP_SEND_FIRST && op <= SV_OP_FETCH_ADD;
}

static inline int32_t sv_psn_diff(uint32_t a, uint32_t b)
{
	return (int32_t)(((a - b) & SV_PSN_MASK) << 8) >> 8;
}

#endif
