package soft

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []header{
		{op: opSend, dstQPN: 0x11, srcQPN: 0x22, psn: 5, length: 64},
		{op: opSendImm, flags: flagSolicited, dstQPN: 1, srcQPN: 2, psn: psnMask, imm: 0xdeadbeef, length: maxMsgLen},
		{op: opAck, dstQPN: 3, srcQPN: 4, psn: 0},
		{op: opNak, synd: nakRNR, rnrTime: 31, dstQPN: 3, srcQPN: 4, psn: 9},
		{op: opNak, synd: nakSeq, psn: 1},
		{op: opNak, synd: nakInvReq},
		{op: opNak, synd: nakRemOp},
		{op: opHello, dstQPN: helloMagic, srcQPN: helloVersion, length: 16},
	} {
		var b [hdrLen]byte
		h.put(b[:])
		var got header
		require.NoError(t, decodeHeader(b[:], &got))
		require.Equal(t, h, got)
	}
}

func TestHeaderRejects(t *testing.T) {
	good := header{op: opSend, dstQPN: 1, srcQPN: 2, psn: 3, length: 4}
	for _, c := range []struct {
		name string
		mut  func(h *header)
		raw  func(b []byte) []byte
	}{
		{name: "short", raw: func(b []byte) []byte { return b[:hdrLen-1] }},
		{name: "opcode 0", mut: func(h *header) { h.op = 0 }},
		{name: "opcode 6", mut: func(h *header) { h.op = 6 }},
		{name: "send syndrome", mut: func(h *header) { h.synd = 1 }},
		{name: "send flags", mut: func(h *header) { h.flags = 2 }},
		{name: "send too long", mut: func(h *header) { h.length = maxMsgLen + 1 }},
		{name: "psn 25 bits", mut: func(h *header) { h.psn = psnMask + 1 }},
		{name: "ack payload", mut: func(h *header) { h.op, h.length = opAck, 1 }},
		{name: "ack syndrome", mut: func(h *header) { h.op, h.synd, h.length = opAck, 1, 0 }},
		{name: "nak syndrome 0", mut: func(h *header) { h.op, h.length = opNak, 0 }},
		{name: "nak syndrome 5", mut: func(h *header) { h.op, h.synd, h.length = opNak, 5, 0 }},
		{name: "nak rnr timer 32", mut: func(h *header) { h.op, h.synd, h.rnrTime, h.length = opNak, nakRNR, 32, 0 }},
		{name: "seq nak with timer", mut: func(h *header) { h.op, h.synd, h.rnrTime, h.length = opNak, nakSeq, 1, 0 }},
		{name: "hello magic", mut: func(h *header) { h.op, h.dstQPN, h.srcQPN, h.length, h.psn = opHello, 1, helloVersion, 16, 0 }},
		{name: "hello version", mut: func(h *header) { h.op, h.dstQPN, h.srcQPN, h.length, h.psn = opHello, helloMagic, 2, 16, 0 }},
		{name: "hello length", mut: func(h *header) { h.op, h.dstQPN, h.srcQPN, h.length, h.psn = opHello, helloMagic, helloVersion, 15, 0 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := good
			if c.mut != nil {
				c.mut(&h)
			}
			b := make([]byte, hdrLen)
			h.put(b)
			if c.raw != nil {
				b = c.raw(b)
			}
			out := header{op: 99}
			require.ErrorIs(t, decodeHeader(b, &out), errBadPacket)
			require.Equal(t, header{op: 99}, out, "output touched on failure")
		})
	}
}

func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []header{{op: opSend, length: 3}, {op: opNak, synd: nakRNR, rnrTime: 12}, {op: opHello, dstQPN: helloMagic, srcQPN: helloVersion, length: 16}} {
		b := make([]byte, hdrLen)
		h.put(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h header
		if decodeHeader(b, &h) != nil {
			require.Equal(t, header{}, h)
			return
		}
		var again [hdrLen]byte
		h.put(again[:])
		require.Equal(t, b[:hdrLen], again[:], "decode(encode) is not the identity")
	})
}

func TestGIDEncoding(t *testing.T) {
	for _, c := range []struct {
		addr string
		gid  string
	}{
		{"127.0.0.1:12345", "3039:0000:0000:0000:0000:ffff:7f00:0001"},
		{"10.1.2.3:1", "0001:0000:0000:0000:0000:ffff:0a01:0203"},
		{"0.0.0.0:80", "0050:0000:0000:0000:0000:ffff:7f00:0001"},
	} {
		g, err := gidFromAddr(netip.MustParseAddrPort(c.addr))
		require.NoError(t, err)
		want, err := ibv.ParseGID(c.gid)
		require.NoError(t, err)
		require.Equal(t, want, g)
		back, err := addrFromGID(g)
		require.NoError(t, err)
		if c.addr != "0.0.0.0:80" {
			require.Equal(t, c.addr, back.String())
		}
	}
	_, err := gidFromAddr(netip.MustParseAddrPort("[::1]:5"))
	require.Error(t, err)
	for _, bad := range []string{"0000:0000:0000:0000:0000:ffff:7f00:0001", "3039:0001:0000:0000:0000:ffff:7f00:0001",
		"3039:0000:0000:0000:0000:fffe:7f00:0001"} {
		g, err := ibv.ParseGID(bad)
		require.NoError(t, err)
		_, err = addrFromGID(g)
		require.Error(t, err, bad)
	}
}

func FuzzAddrFromGID(f *testing.F) {
	f.Add([]byte{0x30, 0x39, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var g ibv.GID
		copy(g[:], b)
		ap, err := addrFromGID(g)
		if err != nil {
			return
		}
		back, err := gidFromAddr(ap)
		require.NoError(t, err)
		if !ap.Addr().IsUnspecified() {
			require.Equal(t, g, back)
		}
	})
}

func TestPSNDiff(t *testing.T) {
	for _, c := range []struct {
		a, b uint32
		want int32
	}{{5, 3, 2}, {3, 5, -2}, {0, psnMask, 1}, {psnMask, 0, -1}, {0, 0, 0}, {1 << 22, 0, 1 << 22}} {
		require.Equal(t, c.want, psnDiff(c.a, c.b), "%d-%d", c.a, c.b)
	}
}

func TestTimerTables(t *testing.T) {
	require.Equal(t, int64(655_360_000), rnrTimerNanos[0])
	require.Equal(t, int64(10_000), rnrTimerNanos[1])
	require.Equal(t, int64(640_000), rnrTimerNanos[12])
	require.Equal(t, int64(491_520_000), rnrTimerNanos[31])
	require.Equal(t, int64(0), ackTimeoutNanos(0))
	require.Equal(t, int64(minAckTimeout), ackTimeoutNanos(1))
	require.Equal(t, int64(4096)<<14, ackTimeoutNanos(14))
}
