//go:build rdma

// Package fuzz fuzzes the C wire decoder of softverbs (ibv/softverbs/wire.c), the only code
// in softverbs that parses bytes from the network. It is a test-only package; build tag rdma,
// like the cgo verbs provider, keeps it out of builds without a C toolchain.
package fuzz

/*
#include <stdint.h>
#include <stdlib.h>
#include "../wire.h"
*/
import "C"

import "unsafe"

// Header is struct sv_hdr.
type Header struct {
	Op, Flags, Synd, Aux uint8
	DQPN, SQPN, PSN, Imm uint32
	Len                  uint16
	VA                   uint64 // RETH, AtomicETH
	RKey, DLen           uint32 // RETH (RKey: AtomicETH too)
	Data0, Data1         uint64 // AtomicETH swap/add and compare; AtomicAckETH original
	QKey                 uint32 // DETH
	SGID, DGID           [16]byte
	RPID                 uint32 // SV_FLAG_REF: the sender's PID, payload address, token address, token
	RVA, TokVA, Tok      uint64
}

// SVRefLen is the REF block's length.
const SVRefLen = C.SV_REF_LEN

// FlagRef is SV_FLAG_REF: the datagram carries where the payload lies, not the payload.
const FlagRef = C.SV_FLAG_REF

// WireHdrLen is the length of h's headers on the wire (with the REF block, if any).
func WireHdrLen(h Header) int {
	ch := C.struct_sv_hdr{op: C.uint8_t(h.Op), flags: C.uint8_t(h.Flags)}
	return int(C.sv_wire_hdr_len(&ch))
}

// HdrLen is the size of the fixed header.
const HdrLen = C.SV_HDR_LEN

// ExtLen is the length of op's extended header, after the fixed one.
func ExtLen(op uint8) int { return int(C.sv_ext_len(C.uint8_t(op))) }

// Decode runs sv_decode on b; ok is false when the decoder rejects it.
func Decode(b []byte) (h Header, ok bool) {
	var ch C.struct_sv_hdr
	// C memory, so that the decoder reads exactly len(b) bytes it owns.
	p := C.malloc(C.size_t(len(b) + 1))
	defer C.free(p)
	if len(b) > 0 {
		copy(unsafe.Slice((*byte)(p), len(b)), b)
	}
	if C.sv_decode((*C.uint8_t)(p), C.size_t(len(b)), &ch) != 0 {
		return Header{}, false
	}
	h = Header{uint8(ch.op), uint8(ch.flags), uint8(ch.synd), uint8(ch.aux),
		uint32(ch.dqpn), uint32(ch.sqpn), uint32(ch.psn), uint32(ch.imm), uint16(ch.len),
		uint64(ch.va), uint32(ch.rkey), uint32(ch.dlen), uint64(ch.data0), uint64(ch.data1), uint32(ch.qkey),
		[16]byte{}, [16]byte{}, uint32(ch.rpid), uint64(ch.rva), uint64(ch.tokva), uint64(ch.tok)}
	for i := range h.SGID {
		h.SGID[i] = byte(ch.sgid[i])
		h.DGID[i] = byte(ch.dgid[i])
	}
	return h, true
}

// DecodeNext runs sv_decode_next on b: the first packet of a datagram that may hold a train
// of REF packets, and its length on the wire.
func DecodeNext(b []byte) (h Header, used int, ok bool) {
	p := C.malloc(C.size_t(len(b) + 1))
	defer C.free(p)
	if len(b) > 0 {
		copy(unsafe.Slice((*byte)(p), len(b)), b)
	}
	var ch C.struct_sv_hdr
	var u C.size_t
	if C.sv_decode_next((*C.uint8_t)(p), C.size_t(len(b)), &ch, &u) != 0 {
		return Header{}, 0, false
	}
	h, ok = Decode(b[:int(u)])
	return h, int(u), ok
}

// Encode runs sv_encode on h and appends payload (none for a REF packet: pass nil).
func Encode(h Header, payload []byte) []byte {
	ch := C.struct_sv_hdr{op: C.uint8_t(h.Op), flags: C.uint8_t(h.Flags), synd: C.uint8_t(h.Synd),
		aux: C.uint8_t(h.Aux), dqpn: C.uint32_t(h.DQPN), sqpn: C.uint32_t(h.SQPN), psn: C.uint32_t(h.PSN),
		imm: C.uint32_t(h.Imm), len: C.uint16_t(h.Len), va: C.uint64_t(h.VA), rkey: C.uint32_t(h.RKey),
		dlen: C.uint32_t(h.DLen), data0: C.uint64_t(h.Data0), data1: C.uint64_t(h.Data1), qkey: C.uint32_t(h.QKey),
		rpid: C.uint32_t(h.RPID), rva: C.uint64_t(h.RVA), tokva: C.uint64_t(h.TokVA), tok: C.uint64_t(h.Tok)}
	for i := range h.SGID {
		ch.sgid[i] = C.uint8_t(h.SGID[i])
		ch.dgid[i] = C.uint8_t(h.DGID[i])
	}
	p := C.malloc(C.SV_MAX_HDR)
	defer C.free(p)
	n := C.sv_encode(&ch, (*C.uint8_t)(p))
	return append(C.GoBytes(p, C.int(n)), payload...)
}
