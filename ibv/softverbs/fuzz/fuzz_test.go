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
		// same-host references: SEND and WRITE packets carrying where their payload lies
		{Op: 5, Flags: FlagRef | 1, DQPN: 3, SQPN: 4, PSN: 10, Len: 4096, RPID: 4242, RVA: 0x7f0000001010,
			TokVA: 0x7f0000001000, Tok: 0xdeadbeefcafef00d},
		{Op: 2, Flags: FlagRef, DQPN: 3, SQPN: 4, PSN: 11, Len: 1024, RPID: 1, RVA: 8, TokVA: 16, Tok: 1},
		{Op: 7, Flags: FlagRef | 2, DQPN: 3, SQPN: 4, PSN: 12, Len: 2048, VA: 0x1000, RKey: 9, DLen: 9000,
			RPID: 77, RVA: 0x5000, TokVA: 0x4ff0, Tok: 5},
		{Op: 12, Flags: FlagRef, DQPN: 3, SQPN: 4, PSN: 13, Imm: 3, Len: 100, VA: 1, RKey: 2, DLen: 100,
			RPID: 77, RVA: 0x5000, TokVA: 0x4ff0, Tok: 5},
		{Op: 0x12, Synd: 6, DQPN: 9, SQPN: 8, PSN: 100}, // NAK: cannot read the references
	}
}

// payloadOf is what follows h's headers on the wire: n bytes, none for a REF packet.
func payloadOf(h Header, fill byte) []byte {
	if h.Flags&FlagRef != 0 {
		return nil
	}
	return bytes.Repeat([]byte{fill}, int(h.Len))
}

func TestRoundTrip(t *testing.T) {
	for _, h := range valid() {
		b := Encode(h, payloadOf(h, 0x5a))
		got, ok := Decode(b)
		if !ok || got != h {
			t.Fatalf("%+v: decoded %+v ok=%v", h, got, ok)
		}
		if _, ok := Decode(b[:len(b)-1]); ok && len(b) > WireHdrLen(h) {
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
		{Op: 0x12, Synd: 2, Aux: 3},         // RNR timer on a sequence NAK
		{Op: 0x12, Synd: 1, Aux: 1, Imm: 1}, // immediate on a NAK
		{Op: 0x11, Len: 1},                  // payload on an ACK
		{Op: 5, Len: 4097},                  // above the largest MTU
		{Op: 0x12, Synd: 7},                 // unknown syndrome
		// references: only on a SEND or WRITE with a payload, every field set, the pad zero
		{Op: 0x11, Flags: FlagRef, RPID: 1, RVA: 1, TokVA: 1, Tok: 1},
		{Op: 0x13, Flags: FlagRef, Len: 8, RPID: 1, RVA: 1, TokVA: 1, Tok: 1},
		{Op: 0x15, Flags: FlagRef, Len: 8, RPID: 1, RVA: 1, TokVA: 1, Tok: 1},
		{Op: 13, Flags: FlagRef, Aux: 3, RPID: 1, RVA: 1, TokVA: 1, Tok: 1},
		{Op: 5, Flags: FlagRef, Len: 0, RPID: 1, RVA: 1, TokVA: 1, Tok: 1},
		{Op: 5, Flags: FlagRef, Len: 8, RPID: 0, RVA: 1, TokVA: 1, Tok: 1},
		{Op: 5, Flags: FlagRef, Len: 8, RPID: 1, RVA: 0, TokVA: 1, Tok: 1},
		{Op: 5, Flags: FlagRef, Len: 8, RPID: 1, RVA: 1, TokVA: 0, Tok: 1},
		{Op: 5, Flags: FlagRef, Len: 8, RPID: 1, RVA: 1, TokVA: 1, Tok: 0},
		{Op: 5, Flags: FlagRef | 2, Len: 8, RPID: 1, RVA: 1, TokVA: 1, Tok: 1}, // reserved flag beside it
		{Op: 5, Flags: FlagRef, Len: 4097, RPID: 1, RVA: 1, TokVA: 1, Tok: 1},  // above the largest MTU
	}
	for _, h := range bad {
		if _, ok := Decode(Encode(h, payloadOf(h, 0))); ok {
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
	// a REF packet that also carries its payload, and one whose pad is not zero
	r := valid()[len(valid())-5]
	if _, ok := Decode(Encode(r, make([]byte, r.Len))); ok {
		t.Error("a REF packet with its payload decoded")
	}
	rb := Encode(r, nil)
	rb[WireHdrLen(r)-SVRefLen+4] = 1
	if _, ok := Decode(rb); ok {
		t.Error("a REF block with a non-zero pad decoded")
	}
}

// FuzzDecode: the decoder never reads past the datagram, and whatever it accepts re-encodes
// to the same bytes (so it accepts only what a softverbs device sends).
func FuzzDecode(f *testing.F) {
	for _, h := range valid() {
		f.Add(Encode(h, payloadOf(h, 0)))
	}
	f.Add([]byte{})
	f.Add(make([]byte, HdrLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := Decode(b)
		if !ok {
			return
		}
		hl := WireHdrLen(h)
		if h.Flags&FlagRef != 0 {
			if len(b) != hl {
				t.Fatalf("a REF packet of %d bytes, its headers %d", len(b), hl)
			}
		} else if int(h.Len) != len(b)-hl {
			t.Fatalf("length %d for a %d-byte datagram", h.Len, len(b))
		}
		if re := Encode(h, b[hl:]); !bytes.Equal(re, b) {
			t.Fatalf("re-encoded %x, got %x", re, b)
		}
	})
}

// A train: REF packets back to back in one datagram come apart one by one; a packet with
// its payload ends it (it must fill the rest), and a short tail is refused.
func TestTrain(t *testing.T) {
	v := valid()
	var refs []Header
	for _, h := range v {
		if h.Flags&FlagRef != 0 {
			refs = append(refs, h)
		}
	}
	var b []byte
	for _, h := range refs {
		b = append(b, Encode(h, nil)...)
	}
	last := v[0]
	b = append(b, Encode(last, payloadOf(last, 1))...)
	var got []Header
	for len(b) > 0 {
		h, used, ok := DecodeNext(b)
		if !ok {
			t.Fatalf("packet %d of the train refused", len(got))
		}
		got = append(got, h)
		b = b[used:]
	}
	want := append(append([]Header{}, refs...), last)
	if len(got) != len(want) {
		t.Fatalf("%d packets, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("packet %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	short := Encode(refs[0], nil)
	if _, _, ok := DecodeNext(append(short, short[:len(short)-1]...)[len(short):]); ok {
		t.Fatal("a truncated REF packet decoded")
	}
	if _, _, ok := DecodeNext(append(Encode(v[0], payloadOf(v[0], 1)), short...)); ok {
		t.Fatal("a packet with a payload followed by more decoded")
	}
}

// FuzzDecodeTrain: a datagram taken apart packet by packet never reads past its end, each
// packet it accepts re-encodes to its own bytes, and only REF packets are followed by more.
func FuzzDecodeTrain(f *testing.F) {
	var train []byte
	for _, h := range valid() {
		if h.Flags&FlagRef != 0 {
			train = append(train, Encode(h, nil)...)
		}
		f.Add(Encode(h, payloadOf(h, 0)))
	}
	f.Add(train)
	f.Fuzz(func(t *testing.T, b []byte) {
		for len(b) > 0 {
			h, used, ok := DecodeNext(b)
			if !ok {
				return
			}
			if used <= 0 || used > len(b) {
				t.Fatalf("used %d of %d bytes", used, len(b))
			}
			if re := Encode(h, b[WireHdrLen(h):used]); !bytes.Equal(re, b[:used]) {
				t.Fatalf("re-encoded %x, got %x", re, b[:used])
			}
			if h.Flags&FlagRef == 0 && used != len(b) {
				t.Fatalf("a packet with its payload followed by %d bytes", len(b)-used)
			}
			b = b[used:]
		}
	})
}
