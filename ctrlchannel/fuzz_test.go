package ctrlchannel

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

func FuzzDecodeHeader(f *testing.F) {
	f.Add(notifyFrameBytes)
	f.Add(grantFrameBytes)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Header
		p, err := DecodeHeader(b, &h)
		if err != nil {
			require.Equal(t, Header{}, h)
			return
		}
		require.Len(t, p, int(h.PayloadLen))
		out := make([]byte, HeaderLen)
		require.NoError(t, EncodeHeader(out, &h))
		require.Equal(t, b[:HeaderLen], out, "decode then encode gives the bytes back")
	})
}

func FuzzHeaderRoundTrip(f *testing.F) {
	f.Add(uint8(10), uint16(0), uint64(1), uint64(2), uint64(3), uint64(4), []byte("x"))
	f.Fuzz(func(t *testing.T, typ uint8, flags uint16, session, epoch, seq, ack uint64, payload []byte) {
		h := Header{Type: FrameType(typ), Flags: Flags(flags), Session: session, Epoch: epoch, Seq: seq,
			AckSeq: ack, PayloadLen: uint32(len(payload))}
		buf := make([]byte, HeaderLen+len(payload))
		if err := EncodeHeader(buf, &h); err != nil {
			require.False(t, h.Type.Valid() && h.Flags&^knownFlags == 0, "valid header rejected: %v", err)
			return
		}
		copy(buf[HeaderLen:], payload)
		var got Header
		p, err := DecodeHeader(buf, &got)
		require.NoError(t, err)
		require.Equal(t, h, got)
		require.Equal(t, payload, append([]byte{}, p...))
	})
}

func FuzzDecodeNotifyCompat(f *testing.F) {
	f.Add("req-7", []byte("done"), []byte(nil))
	f.Add("", []byte{}, []byte{1})
	f.Fuzz(func(t *testing.T, name string, msg []byte, raw []byte) {
		// Round trip of an encoded notify.
		buf := make([]byte, HeaderLen+NotifyCompatLen(name, msg))
		h := Header{Session: 1, Epoch: 1, Seq: 1}
		n, err := EncodeNotifyCompat(buf, &h, name, msg)
		require.NoError(t, err)
		var hd Header
		p, err := DecodeHeader(buf[:n], &hd)
		require.NoError(t, err)
		var nc NotifyCompat
		require.NoError(t, DecodeNotifyCompat(p, &nc))
		require.Equal(t, name, string(nc.Name))
		require.True(t, bytes.Equal(msg, nc.Msg))

		// Arbitrary bytes never panic; a success re-encodes to the same bytes.
		var any NotifyCompat
		if err := DecodeNotifyCompat(raw, &any); err != nil {
			require.Equal(t, NotifyCompat{}, any)
			return
		}
		again := make([]byte, HeaderLen+NotifyCompatLen(string(any.Name), any.Msg))
		n, err = EncodeNotifyCompat(again, &Header{}, string(any.Name), any.Msg)
		require.NoError(t, err)
		require.Equal(t, raw, again[HeaderLen:n])
	})
}

func FuzzDecodeCreditGrant(f *testing.F) {
	f.Add(grantFrameBytes[HeaderLen:])
	f.Add([]byte{0, 0})
	f.Add([]byte{2, 0, 1, 0, 5, 0, 0, 0, 0, 0, 0, 0, 2, 0, 6, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, raw []byte) {
		var g CreditGrant
		if err := DecodeCreditGrant(raw, &g); err != nil {
			require.Equal(t, CreditGrant{}, g)
			return
		}
		out := make([]byte, g.Len())
		n, err := EncodeCreditGrant(out, &g)
		require.NoError(t, err)
		require.Equal(t, raw, out[:n])
		var back CreditGrant
		require.NoError(t, DecodeCreditGrant(out[:n], &back))
		require.Equal(t, g, back)
	})
}

// FuzzReassembly cuts a notify into fragments of a fuzzed size and reassembles it, and
// feeds arbitrary fragment payloads to a Reassembler, which must never panic.
func FuzzReassembly(f *testing.F) {
	f.Add("req-7", []byte("done"), uint16(3), []byte{17, 0, 0, 0, 0, 0, 0, 0, 5})
	f.Add("", []byte{}, uint16(1), []byte{})
	f.Fuzz(func(t *testing.T, name string, msg []byte, size uint16, raw []byte) {
		chunk := int(size%512) + 1
		total := NotifyCompatLen(name, msg)
		r := Reassembler{Max: len(name) + len(msg)}
		h := Header{Type: TypeNotifyFragment, Session: 1, Epoch: 1, Seq: 9}
		var out []byte
		buf := make([]byte, FragmentHeaderLen+chunk)
		for off := 0; off < total; off += chunk {
			n := min(chunk, total-off)
			l := encodeFragmentOf(buf, false, "", name, msg, off, n)
			var fr Fragment
			require.NoError(t, DecodeFragment(buf[:l], &fr))
			got, err := r.Add(&h, &fr)
			require.NoError(t, err)
			if off+n < total {
				require.Nil(t, got)
			}
			out = got
		}
		var nc NotifyCompat
		require.NoError(t, DecodeNotifyCompat(out, &nc))
		require.Equal(t, name, string(nc.Name))
		require.True(t, bytes.Equal(msg, nc.Msg))

		// Arbitrary fragments: split raw into length-prefixed pieces.
		r2 := Reassembler{Max: 1 << 12}
		for len(raw) >= 2 {
			l := int(binary.LittleEndian.Uint16(raw)) % 64
			raw = raw[2:]
			l = min(l, len(raw))
			var fr Fragment
			if DecodeFragment(raw[:l], &fr) == nil {
				got, err := r2.Add(&h, &fr)
				if err == nil && got != nil {
					require.Len(t, got, int(fr.Total))
				}
			}
			raw = raw[l:]
		}
	})
}

func FuzzDecodeNotifyID(f *testing.F) {
	f.Add("id-1", "req-7", []byte("done"), []byte{4, 'i', 'd', '-', '1'})
	f.Add("", "", []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, id, name string, msg []byte, raw []byte) {
		var nc NotifyCompat
		if got, err := DecodeNotifyID(raw, &nc); err == nil {
			require.Len(t, raw, 1+len(got)+NotifyCompatLen(string(nc.Name), nc.Msg), "every byte accounted for")
		} else {
			require.ErrorIs(t, err, ErrFrame)
			require.Equal(t, NotifyCompat{}, nc)
		}
		if len(id) > MaxIDLen {
			id = id[:MaxIDLen]
		}
		buf := make([]byte, NotifyIDLen(id, name, msg))
		n, err := EncodeNotifyID(buf, id, name, msg)
		require.NoError(t, err)
		gotID, err := DecodeNotifyID(buf[:n], &nc)
		require.NoError(t, err)
		require.Equal(t, id, string(gotID))
		require.Equal(t, name, string(nc.Name))
		require.Equal(t, msg, append([]byte{}, nc.Msg...))
	})
}

func FuzzDecodeFence(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		var fe Fence
		if err := DecodeFence(raw, &fe); err != nil {
			require.ErrorIs(t, err, ErrFrame)
			require.Equal(t, Fence{}, fe)
			return
		}
		require.NotZero(t, fe.First)
		require.NotZero(t, fe.Count)
		require.GreaterOrEqual(t, fe.First+fe.Count-1, fe.First)
		out := make([]byte, FenceLen)
		n, err := EncodeFence(out, &fe)
		require.NoError(t, err)
		require.Equal(t, raw, out[:n])
	})
}

func FuzzDecodeSessionOpen(f *testing.F) {
	f.Add([]byte{64, 0, 0, 0, 0, 16, 0, 0})
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, raw []byte) {
		var s SessionOpen
		if err := DecodeSessionOpen(raw, &s); err != nil {
			require.ErrorIs(t, err, ErrFrame)
			require.Equal(t, SessionOpen{}, s)
			return
		}
		out := make([]byte, SessionOpenLen)
		n, err := EncodeSessionOpen(out, &s)
		require.NoError(t, err)
		require.Equal(t, raw, out[:n])
	})
}

func FuzzDecodeDataAck(f *testing.F) {
	f.Add([]byte{1, 0, 7, 0, 0, 0, 0, 0, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, raw []byte) {
		prefix := []DataAckEntry{{1, 2}}
		acks, err := DecodeDataAck(raw, prefix)
		if err != nil {
			require.ErrorIs(t, err, ErrFrame)
			require.Equal(t, prefix, acks)
			return
		}
		out := make([]byte, len(raw))
		n, err := EncodeDataAck(out, acks[1:])
		require.NoError(t, err)
		require.Equal(t, raw, out[:n])
	})
}

// FuzzMachineRecv: no received bytes close the channel (but a SESSION_CLOSE, which closes
// it with ErrPeerClosed); every RECV goes back to the ring; a frame is delivered, dropped
// with a reason, or consumed, never lost without a count.
func FuzzMachineRecv(f *testing.F) {
	f.Add(notifyFrameBytes, false)
	f.Add(grantFrameBytes, true)
	f.Add(notifyFrameBytes[HeaderLen:], true)
	f.Add([]byte("MCKC"), false)
	f.Fuzz(func(t *testing.T, b []byte, legacy bool) {
		n := newNode(t, "A", Params{RecvCount: 4, Extensions: true, BufSize: 512})
		require.NoError(t, n.m.Connected(t0, PeerParams{LocalSession: 1, Epoch: 1, RQDepth: 8, Extensions: !legacy, Legacy: legacy}))
		n.apply()
		if len(b) > 512 {
			b = b[:512]
		}
		inject(n, b)
		if n.closed != nil {
			require.ErrorIs(t, n.closed, ErrPeerClosed)
			return
		}
		st := n.m.Stats()
		require.Len(t, n.posted, 4, "the RECV is posted again")
		used := st.Delivered + st.Dropped() + st.Ignored + st.KeepalivesReceived + st.FencesReceived
		if used == 0 {
			// Consumed without effect: a credit grant or a fragment awaiting the rest.
			var h Header
			_, err := DecodeHeader(b, &h)
			require.NoError(t, err)
			require.Contains(t, []FrameType{TypeCreditGrant, TypeNotifyFragment, TypeNotifyIDFragment}, h.Type)
		} else {
			require.Equal(t, uint64(1), used, "one frame, one outcome")
		}
		require.Len(t, n.drops, int(st.Dropped()), "every drop reported")
	})
}
