package oob

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// A client over the server's MaxConns gets an error wrapping ErrLimit that names the
// limit, on a persistent and on a one-request connection, not "connection reset".
func TestMaxConnsClientSeesLimit(t *testing.T) {
	b := listen(t, newLoop(t), newHandler(), Config{MaxConns: 1})
	hold := dialRaw(t, b.Addr())
	hold.write(mooncakeNotify)
	_, _, _ = hold.reply()
	require.Eventually(t, func() bool { return b.Stats().ServerConns == 1 }, waitBound, time.Millisecond)
	a := listen(t, newLoop(t), newHandler(), Config{})
	ctx := bg(t)
	for _, send := range []func() error{
		func() error { return a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "n"}) },
		func() error { return a.NotifyClassic(ctx, b.Addr(), &NotifyRequest{Name: "n"}) },
		func() error { _, err := a.Handshake(ctx, b.Addr(), ctrlReq(a.Addr())); return err },
	} {
		err := send()
		require.ErrorIs(t, err, ErrLimit)
		require.ErrorContains(t, err, "max_conns 1")
		require.NotContains(t, err.Error(), "reset")
	}
	require.EqualValues(t, 3, b.Stats().RejectedConns)
}

// A notify whose encoded frame would exceed the peer's frame limit is refused before it is
// sent, with ErrTooLarge naming the sizes; the requests in flight on the same connection
// are not touched. On a one-request connection (JSON) each payload is over the limit once
// encoded; on the multiplexed one (compact frames, msg as is) only those over it raw are.
func TestTooLargeOnTheWire(t *testing.T) {
	hb := newHandler()
	b := listen(t, newLoop(t), hb, Config{})
	a := listen(t, newLoop(t), newHandler(), Config{})
	ctx := bg(t)
	require.NoError(t, a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "warm"}))
	const small = 8
	errs := make(chan error, small)
	for i := 0; i < small; i++ {
		go func() { errs <- a.Notify(ctx, b.Addr(), &NotifyRequest{Name: fmt.Sprint("hold", i)}) }()
	}
	for i := 0; i < small; i++ {
		<-hb.ch
	}
	<-hb.ch // warm
	// A Notify may take NotifyFrameLimit of the peer's 1 MiB: 1 MiB + a third + 64 KiB.
	bin := bytes.Repeat([]byte{0xff, 0x00, 0xc3}, 1_100_000/3)
	for name, msg := range map[string][]byte{
		"text 1.5 MiB":         bytes.Repeat([]byte("a"), 3<<19),
		"binary 1.5 MiB":       bytes.Repeat([]byte{0xff, 0x00, 0xc3}, 1<<19),
		"binary 1.1 MB":        bin,
		"control bytes 1.1 MB": bytes.Repeat([]byte{0x01}, 1_100_000), // as base64, as binary: 300 KB of them fit
	} {
		err := a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "big", Msg: msg})
		if len(msg) < NotifyFrameLimit(1<<20)-compactReqFixed {
			require.NoError(t, err, "%s: a compact frame carries the msg as is", name)
		} else {
			require.ErrorIs(t, err, ErrTooLarge, name)
			require.ErrorContains(t, err, fmt.Sprintf("the peer's OOB frame limit for a notify is %d", NotifyFrameLimit(1<<20)), name)
			require.ErrorContains(t, err, fmt.Sprintf("name+msg %d before encoding", len("big")+len(msg)), name)
		}
		// A one-request connection speaks JSON.
		require.ErrorIs(t, a.NotifyClassic(ctx, b.Addr(), &NotifyRequest{Name: "big", Msg: msg}), ErrTooLarge, name)
	}
	hb.release()
	for i := 0; i < small; i++ {
		require.NoError(t, <-errs, "a notify in flight on the same connection is unaffected")
	}
	require.NoError(t, a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "after"}))
	require.EqualValues(t, 6, a.Stats().TooLarge)
	require.Zero(t, b.Stats().BadFrames, "nothing too large reached the peer")
	require.Len(t, hb.notifies(), small+4, "warm, the held ones, the two compact binaries, after")

	// A peer that announces a larger limit takes a larger frame.
	c := listen(t, newLoop(t), newHandler(), Config{MaxFrame: 4 << 20})
	require.NoError(t, a.Notify(ctx, c.Addr(), &NotifyRequest{Name: "big", Msg: bytes.Repeat([]byte("a"), 3<<19)}))
}

// A notify without "name" or "notify_msg" is refused naming the missing member; empty
// values are fine (Mooncake sends an empty name); ts_from is bounded.
func TestNotifyRequiredMembersOnTheWire(t *testing.T) {
	h := newHandler()
	b := listen(t, newLoop(t), h, Config{})
	for _, tc := range []struct{ body, reason string }{
		{`{}`, `field "name": missing`},
		{`{"name":"x"}`, `field "notify_msg": missing`},
		{`{"name":"x","notify_msg":"m","ts_from":"` + strings.Repeat("h", 500_000) + `"}`, `field "ts_from": 500000 bytes, at most 255`},
	} {
		p := dialRaw(t, b.Addr())
		p.write(AppendFrame(nil, TypeNotify, []byte(tc.body)))
		typ, ri, body := p.reply()
		require.Equal(t, TypeNotify, typ)
		require.Contains(t, string(ri.errMsg), tc.reason, body)
		require.Contains(t, body, `"notify_msg":""`)
		requireEOF(t, p.c)
	}
	p := dialRaw(t, b.Addr())
	p.write(AppendFrame(nil, TypeNotify, []byte(`{"name":"","notify_msg":""}`)))
	_, _, body := p.reply()
	require.Equal(t, `{"name":"","notify_msg":"success"}`, body)
	require.Len(t, h.notifies(), 1)
}

// readUntyped reads a frame of Mooncake's older protocol: the length counts the body only.
func readUntyped(t *testing.T, c net.Conn) []byte {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(waitBound)))
	var l [8]byte
	_, err := io.ReadFull(c, l[:])
	require.NoError(t, err)
	body := make([]byte, binary.LittleEndian.Uint64(l[:]))
	_, err = io.ReadFull(c, body)
	require.NoError(t, err)
	return body
}

// A frame with no type byte (Mooncake's older daemon protocol) is served as a Connection
// request and answered without a type byte, as Mooncake's daemon does; it used to get
// "unknown type 123".
func TestOldProtocolHandshake(t *testing.T) {
	h := newHandler()
	b := listen(t, newLoop(t), h, Config{})
	js := `{"local_nic_path":"10.0.0.2:12001@mlx5_0","peer_nic_path":"10.0.0.1:12001@mlx5_0","qp_num":[7,8],"local_lid":1,"local_gid":"fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01","reply_msg":""}`
	in := binary.LittleEndian.AppendUint64(nil, uint64(len(js))) // no type byte: the length is the JSON's
	in = append(in, js...)
	require.Equal(t, byte('{'), in[8])
	p := dialRaw(t, b.Addr())
	p.write(in)
	body := readUntyped(t, p.c)
	require.Equal(t, byte('{'), body[0], "no type byte in the reply either")
	d, err := DecodeHandshake(body)
	require.NoError(t, err, "%s", body)
	require.Equal(t, "10.0.0.2:12001@mlx5_0", d.PeerNICPath, "the Handler's answer")
	require.Empty(t, d.ReplyMsg)
	require.NotContains(t, string(body), "ts_", "a Mooncake peer sees no extension")
	requireEOF(t, p.c)
	require.Len(t, h.handshakes(), 1)
	require.Equal(t, []uint32{7, 8}, h.handshakes()[0].QPNum)
	require.EqualValues(t, 1, b.Stats().OldProtocol)

	// Leading whitespace starts an old-protocol frame too; bad JSON gets an untyped error reply.
	p = dialRaw(t, b.Addr())
	bad := " {\"x\""
	p.write(append(binary.LittleEndian.AppendUint64(nil, uint64(len(bad))), bad...))
	body = readUntyped(t, p.c)
	require.Contains(t, string(body), `"reply_msg":"oob: bad frame`)
	requireEOF(t, p.c)
}

// Close tells twosided peers on persistent connections, both directions, so they free the
// connection and learn the peer is gone at once.
func TestCloseSendsBye(t *testing.T) {
	ha, hb := newHandler(), newHandler()
	la := newLoop(t)
	a, err := Listen(la, Config{ListenAddr: "127.0.0.1:0", Name: "config-name"}, ha)
	require.NoError(t, err)
	a.SetName("127.0.0.1:1") // a name on the bye's own host: trusted without a key
	a.SetSession(77)
	b := listen(t, newLoop(t), hb, Config{})
	ctx := bg(t)
	require.NoError(t, a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "a to b"}))
	require.NoError(t, b.Notify(ctx, a.Addr(), &NotifyRequest{Name: "b to a"}))
	aAddr := a.Addr()
	require.NoError(t, a.Close(ctx))
	got := map[string]bool{}
	for i := 0; i < 2; i++ {
		select {
		case addr := <-hb.gone:
			got[addr] = true
		case <-ctx.Done():
			t.Fatal("b was not told that a closed")
		}
	}
	require.Equal(t, map[string]bool{"127.0.0.1:1 77": true, aAddr + " 77": true}, got,
		"by the name in the bye, and by the address b dialed; with the session the bye carried")
	require.EqualValues(t, 2, a.Stats().ByesSent)
	require.EqualValues(t, 2, b.Stats().ByesReceived)
	require.Eventually(t, func() bool { s := b.Stats(); return s.ServerConns == 0 && s.ClientConns == 0 }, waitBound, time.Millisecond)
	err = b.Notify(ctx, aAddr, &NotifyRequest{Name: "after"})
	require.ErrorIs(t, err, ErrPeerUnreachable)
	// A Mooncake one-request connection gets no bye.
	require.Empty(t, ha.gone)
}

// Peer entries are bounded by MaxPeers: an idle entry is evicted for a new address, and
// an unreachable address leaves nothing behind.
func TestPeersBounded(t *testing.T) {
	a := listen(t, newLoop(t), newHandler(), Config{MaxPeers: 2})
	ctx := bg(t)
	var peers []*Node
	for i := 0; i < 4; i++ {
		peers = append(peers, listen(t, newLoop(t), newHandler(), Config{}))
	}
	for _, p := range peers {
		require.NoError(t, a.Notify(ctx, p.Addr(), &NotifyRequest{Name: "n"}))
		require.LessOrEqual(t, a.Stats().Peers, int64(2))
	}
	require.EqualValues(t, 2, a.Stats().PeersEvicted)
	require.EqualValues(t, 2, a.Stats().ClientConns, "an evicted entry's idle connection is closed")

	// A refused port: the entry is gone once the connect failed.
	dead := listen(t, newLoop(t), newHandler(), Config{})
	deadAddr := dead.Addr()
	require.NoError(t, dead.Close(ctx))
	before := a.Stats().Peers
	require.ErrorIs(t, a.Notify(ctx, deadAddr, &NotifyRequest{Name: "n"}), ErrPeerUnreachable)
	require.LessOrEqual(t, a.Stats().Peers, before)
	require.Eventually(t, func() bool { return a.Stats().Peers <= 1 }, waitBound, time.Millisecond)
}

// Pending handshakes per remote IP are capped: a peer that holds its quota is refused
// with ErrLimit and its connection keeps serving.
func TestPendingHandshakesPerAddr(t *testing.T) {
	hb := newHandler()
	b := listen(t, newLoop(t), hb, Config{MaxPendingHandshakesPerAddr: 2, MaxPendingHandshakes: 10})
	a := listen(t, newLoop(t), newHandler(), Config{})
	ctx := bg(t)
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() { _, err := a.Handshake(ctx, b.Addr(), &HandshakeDesc{LocalNICPath: "hold"}); errs <- err }()
	}
	<-hb.hsHeld
	<-hb.hsHeld
	_, err := a.Handshake(ctx, b.Addr(), ctrlReq(a.Addr()))
	require.ErrorIs(t, err, ErrLimit)
	require.ErrorContains(t, err, "max_pending_handshakes_per_addr 2")
	require.NoError(t, a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "same connection"}))
	require.EqualValues(t, 1, b.Stats().HandshakeLimitedByAddr)
	require.EqualValues(t, 1, b.Stats().ShakingAddrs)
	hb.release()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	require.Zero(t, b.Stats().ShakingAddrs, "the per-address entry leaves with its last handshake")
}

// A flood of refusals is logged at warn once per reason per second, with a count.
func TestWarnRateLimited(t *testing.T) {
	var buf syncBuffer
	b := listen(t, newLoop(t), newHandler(), Config{MaxConns: 1, Logger: zerolog.New(&buf)})
	hold := dialRaw(t, b.Addr())
	hold.write(mooncakeNotify)
	_, _, _ = hold.reply()
	for i := 0; i < 50; i++ {
		p := dialRaw(t, b.Addr())
		_, _, _ = p.reply()
		require.NoError(t, p.c.Close())
	}
	require.EqualValues(t, 50, b.Stats().RejectedConns)
	lines := strings.Count(buf.String(), "MaxConns reached")
	require.GreaterOrEqual(t, lines, 1)
	require.Less(t, lines, 50, "not one line per refused connection")
	require.Contains(t, buf.String(), `"level":"warn"`)
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// The requests of one connection awaiting the Handler are capped: one more notify is
// answered busy at once (ErrBusy at the client), and served again once room is back.
func TestMaxOpenRequestsBusy(t *testing.T) {
	hb := newHandler()
	b := listen(t, newLoop(t), hb, Config{MaxOpenRequests: 4})
	a := listen(t, newLoop(t), newHandler(), Config{})
	ctx := bg(t)
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		go func() { errs <- a.Notify(ctx, b.Addr(), &NotifyRequest{Name: fmt.Sprint("hold", i)}) }()
	}
	for i := 0; i < 4; i++ {
		<-hb.ch
	}
	err := a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "one more"})
	require.ErrorIs(t, err, ErrBusy)
	require.ErrorContains(t, err, "max_open_requests 4")
	require.EqualValues(t, 1, b.Stats().BusyRefused)
	require.EqualValues(t, 4, b.Stats().NotifyServed, "the refused one never reached the Handler")
	hb.release()
	for i := 0; i < 4; i++ {
		require.NoError(t, <-errs)
	}
	require.NoError(t, a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "one more"}))
}

func TestHelloAnnouncesMaxFrame(t *testing.T) {
	var ri replyInfo
	body := appendHelloReply(nil, reqMeta{}, &authKeys{}, &connAuth{}, 4<<20)[HeaderSize:]
	_, err := ri.decode(body, nil)
	require.NoError(t, err)
	require.EqualValues(t, 4<<20, ri.maxFrame)
	for _, bad := range []string{`{"ts_hello":1,"ts_max_frame":1}`, `{"ts_hello":1,"ts_max_frame":134217729}`, `{"ts_max_frame":"1"}`} {
		_, err := ri.decode([]byte(bad), nil)
		require.ErrorIs(t, err, ErrBadFrame)
		require.ErrorContains(t, err, `field "ts_max_frame"`)
	}
	var pd probeDecoder
	p, err := pd.decode(appendBye(nil, "node-a", 0)[HeaderSize:])
	require.NoError(t, err)
	require.EqualValues(t, 1, p.bye)
	require.Equal(t, "node-a", p.from)
	require.Zero(t, p.session, "no session: none on the wire")
	require.NotContains(t, string(appendBye(nil, "node-a", 0)), "ts_session")
	p, err = pd.decode(appendBye(nil, "node-a", 1<<64-1)[HeaderSize:])
	require.NoError(t, err)
	require.Equal(t, uint64(1<<64-1), p.session)
	_, err = ri.decode(appendBye(nil, "node-a", 1<<63)[HeaderSize:], nil)
	require.NoError(t, err)
	require.Equal(t, uint64(1<<63), ri.session, "a server's bye, read as a reply")
	_, err = pd.decode([]byte(`{"ts_bye":1,"ts_session":-1}`))
	require.ErrorContains(t, err, `field "ts_session"`)
	_, err = pd.decode([]byte(`{"ts_bye":1,"ts_from":"` + strings.Repeat("x", 256) + `"}`))
	require.ErrorContains(t, err, `field "ts_from": 256 bytes, at most 255`)
}

// 5 000 notifies pipelined on one connection to a Handler that answers none: it holds
// MaxOpenRequests of them, every other one is answered busy at once, so what the server
// keeps for a flooding connection is bounded whatever the flood.
func TestPipelinedFloodBounded(t *testing.T) {
	const flood, open = 5000, 64
	hb := newHandler()
	b := listen(t, newLoop(t), hb, Config{MaxOpenRequests: open})
	p := dialRaw(t, b.Addr())
	_ = p.hello(nil)
	var burst []byte
	for i := 0; i < flood; i++ {
		burst = appendNotifyRequest(burst, &NotifyRequest{Name: "hold", Msg: []byte("m")}, reqMeta{id: uint64(i + 1), hasID: true}, true)
	}
	go func() { _, _ = p.c.Write(burst) }()
	for i := 0; i < flood-open; i++ {
		_, ri, body := p.reply()
		require.Equal(t, RefuseBusy, string(ri.refuse), body)
	}
	s := b.Stats()
	require.EqualValues(t, open, s.NotifyServed)
	require.EqualValues(t, flood-open, s.BusyRefused)
	require.Len(t, hb.notifies(), open)
	hb.release()
	for i := 0; i < open; i++ {
		_, ri, body := p.reply()
		require.True(t, ri.notifyOK, body)
	}
}

// An error reply without ts_id on a multiplexed connection (the peer refused a frame it
// could not parse, and closes) fails what was in flight with the peer's reason.
func TestConnectionErrorReplyNamesReason(t *testing.T) {
	addr := helloServer(t, `{"ts_hello":1,"ts_max_frame":1048576}`, func(c net.Conn) {
		_, _ = readFrameRaw(c) // the notify
		_, _ = c.Write(appendErrorReply(nil, TypeNotify, reqMeta{}, errors.New("oob: frame too large: length 2000000 above maximum 1048576")))
	})
	a := listen(t, newLoop(t), newHandler(), Config{})
	err := a.Notify(bg(t), addr, &NotifyRequest{Name: "n"})
	require.ErrorIs(t, err, ErrPeerUnreachable)
	require.ErrorContains(t, err, "the peer closed the connection: oob: frame too large")
}

func readFrameRaw(c net.Conn) ([]byte, error) {
	_, body, err := readTyped(c)
	return body, err
}

// readTyped reads one frame: its type byte and body.
func readTyped(c net.Conn) (MsgType, []byte, error) {
	if err := c.SetReadDeadline(time.Now().Add(waitBound)); err != nil {
		return 0, nil, err
	}
	var h [HeaderSize]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, nil, err
	}
	body := make([]byte, binary.LittleEndian.Uint64(h[:8])-1)
	_, err := io.ReadFull(c, body)
	return MsgType(h[8]), body, err
}

// helloServer accepts one connection, reads its hello, answers it with hello (a Probe
// body) and hands the connection to serve; it returns the listen address.
func helloServer(t *testing.T, hello string, serve func(c net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, _, err := readTyped(c); err != nil {
			return
		}
		if _, err := c.Write(AppendFrame(nil, TypeProbe, []byte(hello))); err != nil {
			return
		}
		serve(c)
	}()
	return ln.Addr().String()
}

func TestByeNameMustBeOnItsHost(t *testing.T) {
	require.True(t, sameHost("127.0.0.1:9", netip.MustParseAddr("127.0.0.1")))
	require.True(t, sameHost("127.0.0.1:9", netip.MustParseAddr("::ffff:127.0.0.1")))
	require.False(t, sameHost("10.0.0.9:9", netip.MustParseAddr("127.0.0.1")), "a third party naming another engine")
	require.False(t, sameHost("node-a:9", netip.MustParseAddr("127.0.0.1")), "a host name is not checked, so not trusted")
	require.False(t, sameHost("no-port", netip.MustParseAddr("127.0.0.1")))
}
