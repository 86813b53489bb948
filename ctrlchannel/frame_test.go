package ctrlchannel

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// notifyFrameBytes is NOTIFY_COMPAT session 42, epoch 7, seq 3, name "req-7", msg "done",
// written out by hand from the CtrlFrame v1 layout.
var notifyFrameBytes = []byte{
	0x4D, 0x43, 0x4B, 0x43, // magic "MCKC"
	0x01,       // version
	0x0A,       // type NOTIFY_COMPAT
	0x00, 0x00, // flags
	0x2A, 0, 0, 0, 0, 0, 0, 0, // session 42
	0x07, 0, 0, 0, 0, 0, 0, 0, // epoch 7
	0x03, 0, 0, 0, 0, 0, 0, 0, // seq 3
	0x00, 0, 0, 0, 0, 0, 0, 0, // ack_seq 0
	0x11, 0x00, 0x00, 0x00, // payload_len 17
	0x05, 0x00, 0x00, 0x00, 'r', 'e', 'q', '-', '7', // name
	0x04, 0x00, 0x00, 0x00, 'd', 'o', 'n', 'e', // msg
}

// grantFrameBytes is CREDIT_GRANT NeedsAck session 0x0102030405060708, epoch 1, seq 0,
// ack_seq 0x1122334455667788, one entry RequestSlots = 65.
var grantFrameBytes = []byte{
	0x4D, 0x43, 0x4B, 0x43, 0x01, 0x01, 0x01, 0x00,
	0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,
	0x01, 0, 0, 0, 0, 0, 0, 0,
	0x00, 0, 0, 0, 0, 0, 0, 0,
	0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
	0x0C, 0x00, 0x00, 0x00,
	0x01, 0x00, // count 1
	0x02, 0x00, 0x41, 0, 0, 0, 0, 0, 0, 0, // RequestSlots 65
}

func TestDecodeHeaderVectors(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		want    Header
		payload int
	}{
		{"notify compat", notifyFrameBytes, Header{Type: TypeNotifyCompat, Session: 42, Epoch: 7, Seq: 3, PayloadLen: 17}, 17},
		{"credit grant", grantFrameBytes, Header{Type: TypeCreditGrant, Flags: FlagNeedsAck, Session: 0x0102030405060708,
			Epoch: 1, AckSeq: 0x1122334455667788, PayloadLen: 12}, 12},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var h Header
			p, err := DecodeHeader(tc.in, &h)
			require.NoError(t, err)
			require.Equal(t, tc.want, h)
			require.Len(t, p, tc.payload)

			out := make([]byte, HeaderLen)
			require.NoError(t, EncodeHeader(out, &h))
			require.Equal(t, tc.in[:HeaderLen], out)
		})
	}
}

func TestEncodeNotifyCompatVector(t *testing.T) {
	buf := make([]byte, 128)
	h := Header{Session: 42, Epoch: 7, Seq: 3}
	n, err := EncodeNotifyCompat(buf, &h, "req-7", []byte("done"))
	require.NoError(t, err)
	require.Equal(t, notifyFrameBytes, buf[:n])

	_, err = EncodeNotifyCompat(buf[:60], &h, "req-7", []byte("done"))
	require.ErrorIs(t, err, ErrFrame)
	require.ErrorContains(t, err, "buffer")
}

func TestDecodeHeaderRejects(t *testing.T) {
	mut := func(i int, v byte) []byte {
		b := append([]byte(nil), notifyFrameBytes...)
		b[i] = v
		return b
	}
	tests := []struct {
		name  string
		in    []byte
		field string
	}{
		{"short", notifyFrameBytes[:43], "length"},
		{"magic", mut(0, 0x4E), "magic"},
		{"version 0", mut(4, 0), "version"},
		{"version 2", mut(4, 2), "version"},
		{"type 0", mut(5, 0), "type"},
		{"type 11", mut(5, 11), "type"},
		{"type 63", mut(5, 63), "type"},
		{"flags bit 1", mut(6, 0x02), "flags"},
		{"flags high", mut(7, 0x80), "flags"},
		{"payload_len short", mut(40, 0x10), "payload_len"},
		{"payload_len long", mut(40, 0x12), "payload_len"},
		{"trailing byte", append(append([]byte(nil), notifyFrameBytes...), 0), "payload_len"},
		{"truncated payload", notifyFrameBytes[:len(notifyFrameBytes)-1], "payload_len"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := Header{Seq: 99}
			p, err := DecodeHeader(tc.in, &h)
			require.ErrorIs(t, err, ErrFrame)
			require.ErrorContains(t, err, tc.field)
			require.Nil(t, p)
			require.Equal(t, Header{Seq: 99}, h, "output untouched on failure")
		})
	}
}

func TestEncodeHeaderRejects(t *testing.T) {
	buf := make([]byte, HeaderLen)
	require.ErrorContains(t, EncodeHeader(buf, &Header{Type: 0}), "type")
	require.ErrorContains(t, EncodeHeader(buf, &Header{Type: TypeFence, Flags: 4}), "flags")
	require.ErrorContains(t, EncodeHeader(buf[:43], &Header{Type: TypeFence}), "buffer")
	require.NoError(t, EncodeHeader(buf, &Header{Type: TypeNotifyFragment}))
}

func TestNotifyCompatPayloadVectors(t *testing.T) {
	tests := []struct {
		name     string
		in       []byte
		wantName string
		wantMsg  string
		errField string
	}{
		{"basic", notifyFrameBytes[HeaderLen:], "req-7", "done", ""},
		{"empty both", []byte{0, 0, 0, 0, 0, 0, 0, 0}, "", "", ""},
		{"empty name", []byte{0, 0, 0, 0, 2, 0, 0, 0, 'h', 'i'}, "", "hi", ""},
		{"empty", nil, "", "", "name_len"},
		{"short name_len", []byte{1, 0, 0}, "", "", "name_len"},
		{"name past end", []byte{9, 0, 0, 0, 'a'}, "", "", "name_len 9"},
		{"no msg_len", []byte{1, 0, 0, 0, 'a', 0, 0}, "", "", "msg_len"},
		{"msg past end", []byte{1, 0, 0, 0, 'a', 3, 0, 0, 0, 'x'}, "", "", "msg_len 3"},
		{"trailing", []byte{1, 0, 0, 0, 'a', 1, 0, 0, 0, 'x', 'y'}, "", "", "trailing"},
		{"huge name_len", []byte{0xFF, 0xFF, 0xFF, 0xFF, 0}, "", "", "name_len"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := NotifyCompat{Name: []byte("keep")}
			err := DecodeNotifyCompat(tc.in, &n)
			if tc.errField != "" {
				require.ErrorIs(t, err, ErrFrame)
				require.ErrorContains(t, err, tc.errField)
				require.Equal(t, "keep", string(n.Name))
				require.Nil(t, n.Msg)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantName, string(n.Name))
			require.Equal(t, tc.wantMsg, string(n.Msg))
		})
	}
}

func TestCreditGrantVectors(t *testing.T) {
	tests := []struct {
		name     string
		in       []byte
		want     CreditGrant
		errField string
	}{
		{"one", grantFrameBytes[HeaderLen:], CreditGrant{N: 1, Entries: [4]GrantEntry{{RequestSlots, 65}}}, ""},
		{"zero", []byte{0, 0}, CreditGrant{}, ""},
		{"four", []byte{4, 0,
			1, 0, 1, 0, 0, 0, 0, 0, 0, 0,
			2, 0, 2, 0, 0, 0, 0, 0, 0, 0,
			3, 0, 3, 0, 0, 0, 0, 0, 0, 0,
			4, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF},
			CreditGrant{N: 4, Entries: [4]GrantEntry{{DataBytes, 1}, {RequestSlots, 2}, {BounceBytes, 3}, {BounceSlots, ^uint64(0)}}}, ""},
		{"empty", nil, CreditGrant{}, "count"},
		{"count 5", []byte{5, 0}, CreditGrant{}, "count 5"},
		{"short entry", []byte{1, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0}, CreditGrant{}, "length"},
		{"trailing", []byte{1, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9}, CreditGrant{}, "length"},
		{"trailing after zero", []byte{0, 0, 0}, CreditGrant{}, "length"},
		{"resource 0", []byte{1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, CreditGrant{}, "resource 0"},
		{"resource 5", []byte{1, 0, 5, 0, 1, 0, 0, 0, 0, 0, 0, 0}, CreditGrant{}, "resource 5"},
		// Accepted, as by Mooncake's decoder; the receiver applies the largest total.
		{"repeated", []byte{2, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 2, 0, 0, 0, 0, 0, 0, 0},
			CreditGrant{N: 2, Entries: [4]GrantEntry{{RequestSlots, 1}, {RequestSlots, 2}}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := CreditGrant{N: 3}
			err := DecodeCreditGrant(tc.in, &g)
			if tc.errField != "" {
				require.ErrorIs(t, err, ErrFrame)
				require.ErrorContains(t, err, tc.errField)
				require.Equal(t, CreditGrant{N: 3}, g)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, g)
			out := make([]byte, 64)
			n, err := EncodeCreditGrant(out, &g)
			require.NoError(t, err)
			require.Equal(t, tc.in, out[:n])
		})
	}
}

func TestEncodeCreditGrantRejects(t *testing.T) {
	buf := make([]byte, 64)
	_, err := EncodeCreditGrant(buf, &CreditGrant{N: 5})
	require.ErrorContains(t, err, "count 5")
	_, err = EncodeCreditGrant(buf, &CreditGrant{N: 1, Entries: [4]GrantEntry{{Resource: 9}}})
	require.ErrorContains(t, err, "resource 9")
	_, err = EncodeCreditGrant(buf[:5], &CreditGrant{N: 1, Entries: [4]GrantEntry{{Resource: 1}}})
	require.ErrorContains(t, err, "buffer")
}

func TestFragmentVectors(t *testing.T) {
	tests := []struct {
		name     string
		in       []byte
		want     Fragment
		errField string
	}{
		{"first", []byte{17, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0}, Fragment{Total: 17, Offset: 0, Chunk: []byte{5, 0, 0}}, ""},
		{"last", []byte{17, 0, 0, 0, 16, 0, 0, 0, 'e'}, Fragment{Total: 17, Offset: 16, Chunk: []byte{'e'}}, ""},
		{"short", []byte{17, 0, 0, 0, 0, 0, 0}, Fragment{}, "fragment header"},
		{"empty chunk", []byte{17, 0, 0, 0, 0, 0, 0, 0}, Fragment{}, "chunk"},
		{"total 7", []byte{7, 0, 0, 0, 0, 0, 0, 0, 1}, Fragment{}, "total 7"},
		{"past total", []byte{17, 0, 0, 0, 16, 0, 0, 0, 'e', 'f'}, Fragment{}, "past total"},
		{"offset overflow", []byte{17, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 'e'}, Fragment{}, "past total"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := Fragment{Total: 1}
			err := DecodeFragment(tc.in, &f)
			if tc.errField != "" {
				require.ErrorIs(t, err, ErrFrame)
				require.ErrorContains(t, err, tc.errField)
				require.Equal(t, Fragment{Total: 1}, f)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, f)
		})
	}
}

func TestEncodeFragmentRanges(t *testing.T) {
	// Every cut of the payload of notifyFrameBytes, encoded piecewise, gives its bytes.
	want := notifyFrameBytes[HeaderLen:]
	for size := 1; size <= len(want); size++ {
		var got []byte
		for off := 0; off < len(want); off += size {
			n := min(size, len(want)-off)
			buf := make([]byte, FragmentHeaderLen+n)
			require.Equal(t, len(buf), encodeFragmentOf(buf, false, "", "req-7", []byte("done"), off, n))
			var f Fragment
			require.NoError(t, DecodeFragment(buf, &f))
			require.Equal(t, uint32(len(want)), f.Total)
			require.Equal(t, uint32(off), f.Offset)
			got = append(got, f.Chunk...)
		}
		require.Equal(t, want, got, "chunk size %d", size)
	}
}

func TestReassembler(t *testing.T) {
	payload := notifyFrameBytes[HeaderLen:] // 17 bytes
	h := Header{Type: TypeNotifyFragment, Session: 1, Epoch: 1, Seq: 5}
	frag := func(off, n int) *Fragment {
		return &Fragment{Total: uint32(len(payload)), Offset: uint32(off), Chunk: payload[off : off+n]}
	}
	t.Run("in order", func(t *testing.T) {
		r := Reassembler{Max: 64}
		out, err := r.Add(&h, frag(0, 8))
		require.NoError(t, err)
		require.Nil(t, out)
		require.True(t, r.Active())
		out, err = r.Add(&h, frag(8, 9))
		require.NoError(t, err)
		require.Equal(t, payload, out)
		require.False(t, r.Active())
	})
	t.Run("gap", func(t *testing.T) {
		r := Reassembler{Max: 64}
		_, err := r.Add(&h, frag(0, 8))
		require.NoError(t, err)
		_, err = r.Add(&h, frag(9, 8))
		require.ErrorContains(t, err, "offset 9")
		require.False(t, r.Active())
	})
	t.Run("not from zero", func(t *testing.T) {
		r := Reassembler{Max: 64}
		_, err := r.Add(&h, frag(8, 9))
		require.ErrorContains(t, err, "offset 8")
	})
	t.Run("other seq interleaved", func(t *testing.T) {
		r := Reassembler{Max: 64}
		_, err := r.Add(&h, frag(0, 8))
		require.NoError(t, err)
		h2 := h
		h2.Seq = 6
		_, err = r.Add(&h2, frag(8, 9))
		require.ErrorContains(t, err, "incomplete")
	})
	t.Run("too large", func(t *testing.T) {
		r := Reassembler{Max: 8}
		_, err := r.Add(&h, frag(0, 8))
		require.ErrorIs(t, err, ErrTooLarge)
		r = Reassembler{Max: 9}
		_, err = r.Add(&h, frag(0, 8))
		require.NoError(t, err)
	})
}
