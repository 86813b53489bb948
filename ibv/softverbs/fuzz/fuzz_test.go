//go:build rdma

package fuzz

import (
	"bytes"
	"testing"
)

func valid() []Header {
	return []Header{
		{Op: 5, DQPN: 0xb385, SQPN: 0xe9a5, PSN: 0x47e4e4, Len: 3},
		{Op: 6, Flags: 1, DQPN: 1, SQPN: 2, PSN: 0xffffff, Imm: 0xabc00001, Len: 0},
		{Op: 1, DQPN: 1, SQPN: 2, PSN: 7, Len: 4},
		{Op: 2, DQPN: 1, SQPN: 2, PSN: 8, Len: 4},
		{Op: 3, DQPN: 1, SQPN: 2, PSN: 9, Len: 1},
		{Op: 4, DQPN: 1, SQPN: 2, PSN: 9, Imm: 5, Len: 1},
		{Op: 0x11, DQPN: 9, SQPN: 8, PSN: 100},
		{Op: 0x12, Synd: 1, Aux: 12, DQPN: 9, SQPN: 8, PSN: 100},
		{Op: 0x12, Synd: 2, DQPN: 9, SQPN: 8, PSN: 100},
		{Op: 0x12, Synd: 4, DQPN: 9, SQPN: 8, PSN: 100},
		{Op: 0x12, Synd: 5, DQPN: 9, SQPN: 8, PSN: 100},
		{Op: 7, Flags: 2, DQPN: 1, SQPN: 2, PSN: 3, Len: 4, VA: 0x7f0012345678, RKey: 0x1234, DLen: 9},
		{Op: 8, DQPN: 1, SQPN: 2, PSN: 4, Len: 4},
		{Op: 9, DQPN: 1, SQPN: 2, PSN: 5, Len: 1},
		{Op: 10, Flags: 1, DQPN: 1, SQPN: 2, PSN: 5, Imm: 7, Len: 1},
		{Op: 11, DQPN: 1, SQPN: 2, PSN: 6, Len: 3, VA: 1, RKey: 2, DLen: 3},
		{Op: 12, DQPN: 1, SQPN: 2, PSN: 6, Imm: 9, VA: 1, RKey: 2},
		{Op: 13, Aux: 3, DQPN: 1, SQPN: 2, PSN: 7, VA: 0x1000, RKey: 5, DLen: 70000},
		{Op: 14, DQPN: 1, SQPN: 2, PSN: 8, VA: 0x1008, RKey: 5, Data0: 100, Data1: 8},
		{Op: 15, DQPN: 1, SQPN: 2, PSN: 9, VA: 0x1008, RKey: 5, Data0: 3},
		{Op: 0x13, DQPN: 2, SQPN: 1, PSN: 7, Len: 5},
		{Op: 0x14, DQPN: 2, SQPN: 1, PSN: 8, Data0: 0xffffffffffffffff},
		{Op: 0x15, Flags: 5, DQPN: 2, SQPN: 1, PSN: 9, Len: 7, QKey: 0x11111111,
			SGID: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1}, DGID: [16]byte{0: 0xfe, 1: 0x80, 15: 2}},
		{Op: 0x16, DQPN: 2, SQPN: 1, PSN: 9, Imm: 4, QKey: 7},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, h := range valid() {
		b := Encode(h, bytes.Repeat([]byte{0x5a}, int(h.Len)))
		got, ok := Decode(b)
		if !ok || got != h {
			t.Fatalf("%+v: decoded %+v ok=%v", h, got, ok)
		}
		if _, ok := Decode(b[:len(b)-1]); ok && h.Len > 0 {
			t.Fatalf("%+v: a truncated payload decoded", h)
		}
		if _, ok := Decode(append(b, 0)); ok {
			t.Fatalf("%+v: a trailing byte decoded", h)
		}
	}
}

func TestRejects(t *testing.T) {
	bad := []Header{
		{Op: 0, Len: 0},                     // unknown opcode
		{Op: 0x20},                          // unknown opcode
		{Op: 7, Len: 4, DLen: 4},            // WRITE FIRST that is the whole message
		{Op: 11, Len: 3, DLen: 4},           // WRITE ONLY shorter than its length
		{Op: 9, Flags: 2, Len: 1},           // the immediate flag on a WRITE LAST
		{Op: 13, DLen: 8},                   // READ request without its MTU
		{Op: 13, Aux: 6, DLen: 8},           // READ request with an MTU above 4096
		{Op: 13, Aux: 3, Len: 1},            // payload on a READ request
		{Op: 15, Data1: 1},                  // a compare value on a FETCH_ADD
		{Op: 0x14, Len: 1},                  // payload on an ATOMIC ACK
		{Op: 0x13, Imm: 1},                  // immediate on a READ response
		{Op: 0x15, Imm: 1},                  // immediate on a UD SEND without one
		{Op: 0x15, Flags: 2},                // the WRITE immediate flag on a UD SEND
		{Op: 5, PSN: 1 << 24},               // PSN wider than 24 bits
		{Op: 5, DQPN: 1 << 24},              // QPN wider than 24 bits
		{Op: 5, Flags: 2},                   // reserved flag
		{Op: 5, Imm: 1},                     // immediate on a SEND without one
		{Op: 1, Len: 0},                     // empty FIRST
		{Op: 0x11, Flags: 1},                // flags on an ACK
		{Op: 0x11, Synd: 1},                 // syndrome on an ACK
		{Op: 0x12, Synd: 0},                 // NAK without syndrome
		{Op: 0x12, Synd: 6},                 // unknown syndrome
		{Op: 0x12, Synd: 2, Aux: 3},         // RNR timer on a sequence NAK
		{Op: 0x12, Synd: 1, Aux: 1, Imm: 1}, // immediate on a NAK
		{Op: 0x11, Len: 1},                  // payload on an ACK
		{Op: 5, Len: 4097},                  // above the largest MTU
	}
	for _, h := range bad {
		if _, ok := Decode(Encode(h, make([]byte, h.Len))); ok {
			t.Errorf("%+v decoded", h)
		}
	}
	if _, ok := Decode(nil); ok {
		t.Error("nil decoded")
	}
	b := Encode(valid()[0], []byte{1, 2, 3})
	b[0] ^= 1
	if _, ok := Decode(b); ok {
		t.Error("bad magic decoded")
	}
	b[0] ^= 1
	b[2] = 1
	if _, ok := Decode(b); ok {
		t.Error("bad version decoded")
	}
}

// FuzzDecode: the decoder never reads past the datagram, and whatever it accepts re-encodes
// to the same bytes (so it accepts only what a softverbs device sends).
func FuzzDecode(f *testing.F) {
	for _, h := range valid() {
		f.Add(Encode(h, make([]byte, h.Len)))
	}
	f.Add([]byte{})
	f.Add(make([]byte, HdrLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := Decode(b)
		if !ok {
			return
		}
		hl := HdrLen + ExtLen(h.Op)
		if int(h.Len) != len(b)-hl {
			t.Fatalf("length %d for a %d-byte datagram", h.Len, len(b))
		}
		if re := Encode(h, b[hl:]); !bytes.Equal(re, b) {
			t.Fatalf("re-encoded %x, got %x", re, b)
		}
	})
}
