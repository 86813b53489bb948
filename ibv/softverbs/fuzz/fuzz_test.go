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
		{Op: 7},                             // unknown opcode
		{Op: 5, PSN: 1 << 24},               // PSN wider than 24 bits
		{Op: 5, DQPN: 1 << 24},              // QPN wider than 24 bits
		{Op: 5, Flags: 2},                   // reserved flag
		{Op: 5, Imm: 1},                     // immediate on a SEND without one
		{Op: 1, Len: 0},                     // empty FIRST
		{Op: 0x11, Flags: 1},                // flags on an ACK
		{Op: 0x11, Synd: 1},                 // syndrome on an ACK
		{Op: 0x12, Synd: 0},                 // NAK without syndrome
		{Op: 0x12, Synd: 5},                 // unknown syndrome
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
	b[2] = 2
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
		if int(h.Len) != len(b)-HdrLen {
			t.Fatalf("length %d for a %d-byte datagram", h.Len, len(b))
		}
		if re := Encode(h, b[HdrLen:]); !bytes.Equal(re, b) {
			t.Fatalf("re-encoded %x, got %x", re, b)
		}
	})
}
