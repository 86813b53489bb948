package oob

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// requireCut: the server closes the connection without a reply.
func requireCut(t testing.TB, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(waitBound)))
	b, err := io.ReadAll(c)
	require.NoError(t, err, "closed by the server, not left hanging")
	require.Empty(t, b, "no reply to an incomplete frame")
}

func TestMaxPendingHandshakes(t *testing.T) {
	loop := newLoop(t)
	hb := newHandler()
	b := listen(t, loop, hb, Config{MaxPendingHandshakes: 2})
	a := listen(t, newLoop(t), newHandler(), Config{})
	ctx := bg(t)
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() {
			resp, err := a.Handshake(ctx, b.Addr(), &HandshakeDesc{LocalNICPath: "hold"})
			if err == nil && resp.LocalNICPath != "released" {
				err = fmt.Errorf("unexpected reply %+v", resp)
			}
			errs <- err
		}()
	}
	<-hb.hsHeld
	<-hb.hsHeld

	// The third is refused; the connection keeps serving.
	resp, err := a.Handshake(ctx, b.Addr(), ctrlReq(a.Addr()))
	require.ErrorIs(t, err, ErrRejected)
	require.Contains(t, err.Error(), "too many pending handshakes")
	require.Equal(t, "too many pending handshakes", resp.ReplyMsg)
	require.NoError(t, a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "same connection"}))
	require.NoError(t, a.Probe(ctx, b.Addr()))
	require.EqualValues(t, 1, b.Stats().Accepted, "the refused request did not cost the connection")

	// A Mooncake client over the limit gets a handshake reply with reply_msg.
	p := dialRaw(t, b.Addr())
	p.write(mooncakeHandshake())
	typ, _, body := p.reply()
	require.Equal(t, TypeConnection, typ)
	require.Contains(t, body, `"reply_msg":"too many pending handshakes"`)
	require.Contains(t, body, `"qp_num":[]`)
	requireEOF(t, p.c)
	require.NoError(t, p.c.Close())

	// Another peer's notify is served meanwhile.
	c := listen(t, loop, newHandler(), Config{})
	require.NoError(t, c.Notify(ctx, b.Addr(), &NotifyRequest{Name: "other peer"}))
	require.Len(t, hb.handshakes(), 2, "the Handler saw only the admitted ones")

	hb.release()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	_, err = a.Handshake(ctx, b.Addr(), ctrlReq(a.Addr()))
	require.NoError(t, err, "room again once the Handler answered")

	// A handshake whose connection went away still counts until the Handler answers it.
	for i := 0; i < 2; i++ {
		p := dialRaw(t, b.Addr())
		p.write(appendHandshake(nil, &HandshakeDesc{LocalNICPath: "hold"}, reqMeta{}))
		<-hb.hsHeld
		require.NoError(t, p.c.Close())
	}
	require.Eventually(t, func() bool { return b.Stats().ServerConns == 2 }, waitBound, time.Millisecond, "a's and c's connections only")
	_, err = a.Handshake(ctx, b.Addr(), ctrlReq(a.Addr()))
	require.ErrorIs(t, err, ErrRejected)
	require.EqualValues(t, 2, b.Stats().PendingHandshakes)
	hb.release() // the replies run on b's loop later; wait for them to count
	require.Eventually(t, func() bool { return b.Stats().PendingHandshakes == 0 }, waitBound, time.Millisecond)
	_, err = a.Handshake(ctx, b.Addr(), ctrlReq(a.Addr()))
	require.NoError(t, err)
	require.EqualValues(t, 3, b.Stats().HandshakeLimited)
}

// While one client runs over a limit, another's notify is served.
func TestLimitsIsolatePeers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		offend  func(t *testing.T, b *Node)
		counter func(Stats) uint64
	}{
		{"largest frame", Config{}, func(t *testing.T, b *Node) {
			p := dialRaw(t, b.Addr())
			p.write(appendHello(nil, nil))
			_, _, _ = p.reply()
			limit := NotifyFrameLimit(DefaultMaxFrame)
			p.write(hdr(uint64(limit)+1, byte(TypeNotify)))
			p.requireRefused(TypeNotify, fmt.Sprintf("oob: frame too large: length %d above maximum %d", limit+1, limit))
		}, func(s Stats) uint64 { return s.BadFrames }},
		{"connections", Config{MaxConns: 3}, func(t *testing.T, b *Node) {
			for i := 0; i < 2; i++ {
				dialRaw(t, b.Addr())
			}
			require.Eventually(t, func() bool { return b.Stats().ServerConns == 3 }, waitBound, time.Millisecond)
			// One over the limit is told so before the close, not reset.
			p := dialRaw(t, b.Addr())
			typ, ri, body := p.reply()
			require.Equal(t, TypeConnection, typ)
			require.Contains(t, string(ri.errMsg), "max_conns 3", body)
			require.Equal(t, RefuseLimit, string(ri.refuse))
			require.Contains(t, body, `"notify_msg":""`, "a Mooncake reader sees a failure")
			requireEOF(t, p.c)
		}, func(s Stats) uint64 { return s.RejectedConns }},
		{"pending handshakes", Config{MaxPendingHandshakes: 1}, func(t *testing.T, b *Node) {
			p := dialRaw(t, b.Addr())
			p.write(appendHello(nil, nil))
			_, _, _ = p.reply()
			m := reqMeta{id: 1, hasID: true, twosided: true}
			p.write(appendHandshake(nil, &HandshakeDesc{LocalNICPath: "hold"}, m))
			m.id = 2
			p.write(appendHandshake(nil, ctrlReq("greedy"), m))
			typ, _, body := p.reply()
			require.Equal(t, TypeConnection, typ)
			require.Contains(t, body, `"reply_msg":"too many pending handshakes"`)
			require.Contains(t, body, `"ts_id":2`)
			p.write(appendProbe(nil, reqMeta{id: 3, hasID: true}, false))
			_, ri, _ := p.reply()
			require.EqualValues(t, 3, ri.m.id, "the offender's connection keeps working")
		}, func(s Stats) uint64 { return s.HandshakeLimited }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loop := newLoop(t)
			hb := newHandler()
			b := listen(t, loop, hb, tc.cfg)
			good := listen(t, newLoop(t), newHandler(), Config{})
			ctx := bg(t)
			require.NoError(t, good.Notify(ctx, b.Addr(), &NotifyRequest{Name: "before"}))
			tc.offend(t, b)
			require.NoError(t, good.Notify(ctx, b.Addr(), &NotifyRequest{Name: "while"}))
			require.EqualValues(t, 1, tc.counter(b.Stats()))
			hb.release()
		})
	}
}

// Hostile bytes over a real socket that the codec tables and TestMalformedRequests do not
// cover: each gets a clear error reply or is cut, and a good peer is served afterwards.
func TestHostileFrames(t *testing.T) {
	loop := newLoop(t)
	h := newHandler()
	b := listen(t, loop, h, Config{IdleTimeout: 100 * time.Millisecond})
	notify := func(js string) []byte { return AppendFrame(nil, TypeNotify, []byte(js)) }
	conn := func(js string) []byte { return AppendFrame(nil, TypeConnection, []byte(js)) }
	hello := appendHello(nil, nil)
	for _, tc := range []struct {
		name     string
		in       []byte
		closeWr  bool    // half-close after writing
		wantType MsgType // when reason is set
		reason   string  // "": no reply, the connection is cut
	}{
		{"truncated header, EOF", mooncakeNotify[:5], true, 0, ""},
		{"truncated body, EOF", mooncakeNotify[:15], true, 0, ""},
		{"truncated header, stall", mooncakeNotify[:5], false, 0, ""},
		{"header only, stall", hdr(100, byte(TypeNotify)), false, 0, ""},
		{"hello, then half a header", append(append([]byte(nil), hello...), 1, 0, 0), false, 0, ""},
		{"length 2^64-1", hdr(1<<64-1, byte(TypeNotify)), false, TypeNotify, "above maximum"},
		{"huge length after hello", append(append([]byte(nil), hello...), hdr(1<<33, byte(TypeConnection))...), false, TypeConnection, "above maximum"},
		{"type 255", append(hdr(3, 255), '{', '}'), false, 255, "unknown type 255"},
		{"notify_msg number", notify(`{"name":"a","notify_msg":5}`), false, TypeNotify, `field "notify_msg": want string, got number`},
		{"ts_seq string", notify(`{"name":"a","notify_msg":"x","ts_seq":"1"}`), false, TypeNotify, `field "ts_seq": want number, got string`},
		{"ts_id negative", notify(`{"name":"a","notify_msg":"x","ts_id":-1}`), false, TypeNotify, `field "ts_id": negative`},
		{"ts_session 2^64", notify(`{"name":"a","ts_session":18446744073709551616}`), false, TypeNotify, `field "ts_session": 18446744073709551616 out of range`},
		{"ts_epoch fraction", notify(`{"name":"a","ts_epoch":1.5}`), false, TypeNotify, `field "ts_epoch": want unsigned integer, got fraction`},
		{"ts_msg_b64 not base64", notify(`{"name":"a","notify_msg":"","ts_msg_b64":"@@@"}`), false, TypeNotify, `field "ts_msg_b64": bad base64`},
		{"qp_num above u32", conn(`{"qp_num":[4294967296]}`), false, TypeConnection, `field "qp_num": 4294967296 out of range`},
		{"local_lid above u16", conn(`{"local_lid":65536}`), false, TypeConnection, `field "local_lid": 65536 out of range`},
		{"ts_mtu 1000", conn(`{"ts_mtu":1000}`), false, TypeConnection, `field "ts_mtu": 1000 is not one of`},
		{"ts_psn above 24 bits", conn(`{"ts_psn":16777216}`), false, TypeConnection, `field "ts_psn": 16777216 out of range`},
		{"ctrl_channel string", conn(`{"ctrl_channel":"yes"}`), false, TypeConnection, `field "ctrl_channel": want bool, got string`},
		{"ts_hello string", AppendFrame(nil, TypeProbe, []byte(`{"ts_hello":"1"}`)), false, TypeProbe, `field "ts_hello": want number, got string`},
		{"ts_nonce short", AppendFrame(nil, TypeProbe, []byte(`{"ts_hello":1,"ts_nonce":"00"}`)), false, TypeProbe, `field "ts_nonce": 2 characters`},
		{"ts_mac without a challenge", appendAuthProof(nil, 1, &[macSize]byte{}), false, TypeProbe, "unexpected ts_mac"},
		{"bad frame on a persistent connection", append(append([]byte(nil), hello...), notify(`{"name":[]}`)...), false, TypeNotify, `field "name": want string, got array`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := dialRaw(t, b.Addr())
			p.write(tc.in)
			if tc.closeWr {
				require.NoError(t, p.c.(*net.TCPConn).CloseWrite())
			}
			if len(tc.in) > len(hello) && bytes.HasPrefix(tc.in, hello) {
				_, ri, _ := p.reply()
				require.EqualValues(t, helloVersion, ri.hello, "the hello is answered first")
			}
			if tc.reason == "" {
				requireCut(t, p.c)
			} else {
				typ, ri, body := p.reply()
				require.Equal(t, tc.wantType, typ, body)
				require.Contains(t, string(ri.errMsg), tc.reason)
				require.Contains(t, body, `"notify_msg":""`)
				requireEOF(t, p.c)
			}
			// A fresh client each time: a persistent connection left idle for longer than
			// the short IdleTimeout would be cut, which is not what this test is about.
			good := listen(t, loop, newHandler(), Config{})
			require.NoError(t, good.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "good"}))
		})
	}
	require.Zero(t, b.Stats().AuthOK)
	for _, r := range h.notifies() {
		require.Equal(t, "good", r.Name, "no hostile frame reached the Handler")
	}
}

// A flood of half-open connections (nothing sent, half a header, a header and part of a
// body, a hello and then half a frame) is cut by IdleTimeout while good peers are served.
func TestHalfOpenFlood(t *testing.T) {
	raiseNofile(t, 4096)
	const N = 500
	loop := newLoop(t)
	h := newHandler()
	b := listen(t, loop, h, Config{IdleTimeout: 300 * time.Millisecond})
	hello := appendHello(nil, nil)
	flood := make([]net.Conn, 0, N)
	defer func() {
		for _, c := range flood {
			_ = c.Close()
		}
	}()
	for i := 0; i < N; i++ {
		c, err := net.Dial("tcp", b.Addr())
		require.NoError(t, err)
		flood = append(flood, c)
		var part []byte
		switch i % 4 {
		case 1:
			part = mooncakeNotify[:4]
		case 2:
			part = mooncakeNotify[:HeaderSize+3]
		case 3:
			part = append(append([]byte(nil), hello...), mooncakeNotify[:6]...)
		}
		if len(part) > 0 {
			_, err = c.Write(part)
			require.NoError(t, err)
		}
	}
	// Good peers, persistent and classic, are served while the flood holds its sockets.
	ctx := bg(t)
	good := listen(t, newLoop(t), newHandler(), Config{})
	require.NoError(t, good.Notify(ctx, b.Addr(), &NotifyRequest{Name: "good"}))
	require.NoError(t, good.NotifyClassic(ctx, b.Addr(), &NotifyRequest{Name: "good classic"}))
	p := dialRaw(t, b.Addr())
	p.write(mooncakeNotify)
	_, _, body := p.reply()
	require.Equal(t, `{"name":"","notify_msg":"success"}`, body)

	// Every flood socket is closed by the server.
	for i, c := range flood {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(waitBound)))
		got, err := io.ReadAll(c)
		require.NoError(t, err, "flood socket %d", i)
		if i%4 == 3 {
			require.Equal(t, appendHelloReply(nil, reqMeta{}, &authKeys{}, &connAuth{}, DefaultMaxFrame), got, "only the hello reply")
		} else {
			require.Empty(t, got)
		}
	}
	require.GreaterOrEqual(t, b.Stats().IdleCuts, uint64(N))
	require.Len(t, h.notifies(), 3)
}
