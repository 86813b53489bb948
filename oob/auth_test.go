package oob

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	keyA = []byte("0123456789abcdef-key-A")
	keyB = []byte("0123456789abcdef-key-B")
)

// rawPeer is a hand-driven client on a real socket.
type rawPeer struct {
	t testing.TB
	c net.Conn
}

func dialRaw(t testing.TB, addr string) *rawPeer {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &rawPeer{t: t, c: c}
}

func (p *rawPeer) write(b []byte) {
	p.t.Helper()
	require.NoError(p.t, p.c.SetWriteDeadline(time.Now().Add(waitBound)))
	_, err := p.c.Write(b)
	require.NoError(p.t, err)
}

// reply reads one frame and decodes it as a client would.
func (p *rawPeer) reply() (MsgType, *replyInfo, string) {
	p.t.Helper()
	typ, body := readFrame(p.t, p.c)
	ri := &replyInfo{}
	_, err := ri.decode(body, nil)
	require.NoError(p.t, err, "%s", body)
	return typ, ri, string(body)
}

// hello sends {"ts_hello":1} (with nc when not nil) and returns the server's answer.
func (p *rawPeer) hello(nc *[nonceSize]byte) *replyInfo {
	p.t.Helper()
	p.write(appendHello(nil, nc))
	typ, ri, body := p.reply()
	require.Equal(p.t, TypeProbe, typ)
	require.EqualValues(p.t, helloVersion, ri.hello, body)
	return ri
}

func keysFor(key []byte) *authKeys {
	return &authKeys{on: true, required: true, mac: hmac.New(sha256.New, key)}
}

// requireRefused reads the error reply that refuses a request and then the server's EOF.
func (p *rawPeer) requireRefused(wantType MsgType, reason string) {
	p.t.Helper()
	typ, ri, body := p.reply()
	require.Equal(p.t, wantType, typ, body)
	require.Contains(p.t, body, `"reply_msg":"`+reason)
	require.Equal(p.t, reason, string(ri.errMsg))
	require.False(p.t, ri.notifyOK)
	requireEOF(p.t, p.c)
}

func mooncakeHandshake() []byte {
	js := `{"local_nic_path":"10.0.0.2:12001@mlx5_0","peer_nic_path":"__ctrl__","qp_num":[],"reply_msg":"","ctrl_channel":true,"notify_qp_num":300,"notify_rq_depth":128}` + "\n"
	return AppendFrame(nil, TypeConnection, []byte(js))
}

func ctrlReq(from string) *HandshakeDesc {
	return &HandshakeDesc{LocalNICPath: from + "@soft0", PeerNICPath: "__ctrl__", CtrlChannel: true, NotifyQPNum: 12, NotifyRQDepth: 64}
}

func TestAuthRightKey(t *testing.T) {
	la, lb := newLoop(t), newLoop(t)
	ha, hb := newHandler(), newHandler()
	a := listen(t, la, ha, Config{AuthKey: keyA})
	b := listen(t, lb, hb, Config{AuthKey: keyA})
	ctx := bg(t)
	require.NoError(t, a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "n", Msg: []byte("m"), Seq: 1}))
	resp, err := a.Handshake(ctx, b.Addr(), ctrlReq(a.Addr()))
	require.NoError(t, err)
	require.True(t, resp.CtrlChannel)
	require.NoError(t, a.Probe(ctx, b.Addr()))
	require.NoError(t, b.Notify(ctx, a.Addr(), &NotifyRequest{Name: "back"}))
	require.Len(t, hb.notifies(), 1)
	require.Len(t, hb.handshakes(), 1)
	require.Len(t, ha.notifies(), 1)
	sb := b.Stats()
	require.EqualValues(t, 1, sb.Accepted, "one authenticated persistent connection")
	require.EqualValues(t, 1, sb.AuthOK)
	require.Zero(t, sb.AuthFailed)
	require.EqualValues(t, 1, a.Stats().AuthOK, "the other direction authenticated too")
}

func TestAuthWrongKey(t *testing.T) {
	loop := newLoop(t)
	hb := newHandler()
	a := listen(t, loop, newHandler(), Config{AuthKey: keyB})
	b := listen(t, loop, hb, Config{AuthKey: keyA})
	ctx := bg(t)
	// A twosided client checks the server's proof first: a different key fails there.
	err := a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "n"})
	require.ErrorIs(t, err, ErrAuth)
	require.Contains(t, err.Error(), "does not match AuthKey")
	_, err = a.Handshake(ctx, b.Addr(), ctrlReq(a.Addr()))
	require.ErrorIs(t, err, ErrAuth)

	// A client that ignores the server's proof and sends its own, made with the wrong key.
	p := dialRaw(t, b.Addr())
	var nc [nonceSize]byte
	newNonce(&nc)
	ri := p.hello(&nc)
	require.Equal(t, offerHMAC, ri.auth)
	require.True(t, ri.authRequired)
	require.True(t, ri.hasNonce && ri.hasMAC)
	require.False(t, keysFor(keyB).verify(dirServer, &nc, &ri.nonce, &ri.mac))
	require.True(t, keysFor(keyA).verify(dirServer, &nc, &ri.nonce, &ri.mac), "the server proves the key it has")
	p.write(appendAuthProof(nil, 5, keysFor(keyB).proof(dirClient, &nc, &ri.nonce)))
	typ, ri2, body := p.reply()
	require.Equal(t, TypeProbe, typ)
	require.Equal(t, "authentication failed", string(ri2.errMsg), body)
	require.EqualValues(t, 5, ri2.m.id)
	requireEOF(t, p.c)

	// The server's proof, reflected back as the client's, does not pass either: the
	// direction is in the MAC.
	p = dialRaw(t, b.Addr())
	ri = p.hello(&nc)
	reflected := ri.mac
	p.write(appendAuthProof(nil, 6, &reflected))
	p.requireRefused(TypeProbe, "authentication failed")

	require.Empty(t, hb.notifies())
	require.Empty(t, hb.handshakes())
	require.EqualValues(t, 2, b.Stats().AuthFailed)
	require.Zero(t, b.Stats().AuthOK)
}

// With a key required, a peer that does not authenticate cannot open a ctrl channel or
// inject a notify: each attempt gets "authentication required" and the Handler never runs.
func TestAuthUnauthenticatedRefused(t *testing.T) {
	loop := newLoop(t)
	hb := newHandler()
	b := listen(t, loop, hb, Config{AuthKey: keyA})
	notifyID := func(id uint64) []byte {
		return appendNotifyRequest(nil, &NotifyRequest{Name: "inject", Msg: []byte("x")}, reqMeta{id: id, hasID: true, twosided: true}, true)
	}
	hsID := func(id uint64) []byte {
		return appendHandshake(nil, ctrlReq("evil"), reqMeta{id: id, hasID: true, twosided: true})
	}
	for _, tc := range []struct {
		name     string
		hello    bool // send a hello first
		nonce    bool // with a client nonce
		req      []byte
		wantType MsgType
	}{
		{"mooncake notify", false, false, mooncakeNotify, TypeNotify},
		{"mooncake ctrl handshake", false, false, mooncakeHandshake(), TypeConnection},
		{"twosided notify without hello", false, false, notifyID(1), TypeNotify},
		{"notify after keyless hello", true, false, notifyID(2), TypeNotify},
		{"handshake after keyless hello", true, false, hsID(3), TypeConnection},
		{"notify after hello, proof skipped", true, true, notifyID(4), TypeNotify},
		{"handshake after hello, proof skipped", true, true, hsID(5), TypeConnection},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := dialRaw(t, b.Addr())
			if tc.hello {
				var nc *[nonceSize]byte
				if tc.nonce {
					nc = new([nonceSize]byte)
					newNonce(nc)
				}
				ri := p.hello(nc)
				require.True(t, ri.authRequired)
				require.Equal(t, tc.nonce, ri.hasMAC, "a proof only for a client nonce")
			}
			p.write(tc.req)
			p.requireRefused(tc.wantType, "authentication required")
		})
	}
	// A twosided Node without a key learns it from the hello reply.
	a := listen(t, loop, newHandler(), Config{})
	err := a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "inject"})
	require.ErrorIs(t, err, ErrAuth)
	require.Contains(t, err.Error(), "requires authentication")
	_, err = a.Handshake(bg(t), b.Addr(), ctrlReq(a.Addr()))
	require.ErrorIs(t, err, ErrAuth)
	// Its one-request fallback is refused by the server.
	err = a.NotifyClassic(bg(t), b.Addr(), &NotifyRequest{Name: "inject"})
	require.ErrorIs(t, err, ErrRejected)
	require.Contains(t, err.Error(), "authentication required")

	require.Empty(t, hb.notifies(), "the Handler never saw an unauthenticated notify")
	require.Empty(t, hb.handshakes(), "nor an unauthenticated handshake")
	require.EqualValues(t, 8, b.Stats().AuthFailed)
	require.Zero(t, b.Stats().NotifyServed+b.Stats().HandshakeServed)
}

// recorder is a TCP proxy that keeps a copy of the bytes of each direction.
type recorder struct {
	ln       net.Listener
	mu       sync.Mutex
	up, down []byte // client→server, server→client
	conns    []net.Conn
	wg       sync.WaitGroup
}

func newRecorder(t *testing.T, target string) *recorder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &recorder{ln: ln}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				return
			}
			r.mu.Lock()
			r.conns = append(r.conns, c, s)
			r.mu.Unlock()
			r.wg.Add(2)
			go r.pipe(s, c, &r.up)
			go r.pipe(c, s, &r.down)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			_ = c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *recorder) pipe(dst, src net.Conn, rec *[]byte) {
	defer r.wg.Done()
	buf := make([]byte, 4096)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			r.mu.Lock()
			*rec = append(*rec, buf[:k]...)
			r.mu.Unlock()
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

func (r *recorder) transcript() (up, down []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte(nil), r.up...), append([]byte(nil), r.down...)
}

// A recorded authenticated session, replayed byte for byte, authenticates neither way.
func TestAuthReplayedTranscript(t *testing.T) {
	loop := newLoop(t)
	hb := newHandler()
	a := listen(t, loop, newHandler(), Config{AuthKey: keyA})
	b := listen(t, loop, hb, Config{AuthKey: keyA})
	rec := newRecorder(t, b.Addr())
	require.NoError(t, a.Notify(bg(t), rec.ln.Addr().String(), &NotifyRequest{Name: "once", Msg: []byte("m")}))
	up, down := rec.transcript()
	require.Contains(t, string(up), `"ts_mac":"`, "the transcript holds the client's proof")
	require.Contains(t, string(up), `once`)
	require.Len(t, hb.notifies(), 1)

	// Client side replayed to the server: its fresh challenge makes the old proof wrong.
	p := dialRaw(t, b.Addr())
	p.write(up)
	typ, ri, _ := p.reply()
	require.Equal(t, TypeProbe, typ)
	require.True(t, ri.hasNonce)
	p.requireRefused(TypeProbe, "authentication failed")
	require.Len(t, hb.notifies(), 1, "the replayed notify never reached the Handler")
	require.EqualValues(t, 1, b.Stats().AuthFailed)

	// Server side replayed to a client: the old proof does not cover the client's new nonce.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(waitBound))
		var h [HeaderSize]byte
		if _, err := io.ReadFull(c, h[:]); err != nil { // the hello
			served <- err
			return
		}
		_, err = c.Write(down)
		_, _ = io.Copy(io.Discard, c)
		served <- err
	}()
	a2 := listen(t, loop, newHandler(), Config{AuthKey: keyA})
	err = a2.Notify(bg(t), ln.Addr().String(), &NotifyRequest{Name: "x"})
	require.ErrorIs(t, err, ErrAuth)
	require.Contains(t, err.Error(), "does not match AuthKey")
	require.NoError(t, <-served)
}

func TestAuthAllowUnauthenticated(t *testing.T) {
	loop := newLoop(t)
	hb := newHandler()
	b := listen(t, loop, hb, Config{AuthKey: keyA, AllowUnauthenticated: true})
	ctx := bg(t)

	// A Mooncake classic client gets through.
	p := dialRaw(t, b.Addr())
	p.write(mooncakeNotify)
	_, _, body := p.reply()
	require.Equal(t, `{"name":"","notify_msg":"success"}`, body)
	requireEOF(t, p.c)
	p = dialRaw(t, b.Addr())
	p.write(mooncakeHandshake())
	typ, _, body := p.reply()
	require.Equal(t, TypeConnection, typ)
	require.Contains(t, body, `"reply_msg":""`)
	require.Equal(t, NotifyRequest{Name: "a", Msg: []byte("hi")}, hb.notifies()[0])

	// So does a twosided Node without a key, on a persistent connection.
	plain := listen(t, loop, newHandler(), Config{})
	require.NoError(t, plain.Notify(ctx, b.Addr(), &NotifyRequest{Name: "plain"}))
	// A Node with the key authenticates anyway; one with a wrong key is refused.
	keyed := listen(t, loop, newHandler(), Config{AuthKey: keyA})
	require.NoError(t, keyed.Notify(ctx, b.Addr(), &NotifyRequest{Name: "keyed"}))
	wrong := listen(t, loop, newHandler(), Config{AuthKey: keyB})
	require.ErrorIs(t, wrong.Notify(ctx, b.Addr(), &NotifyRequest{Name: "wrong"}), ErrAuth)
	require.Len(t, hb.notifies(), 3)
	require.EqualValues(t, 1, b.Stats().AuthOK)

	// Client side: with AllowUnauthenticated a keyed Node talks to Mooncake and to keyless
	// twosided peers; without it, it refuses them.
	f := newFakeMooncake(t)
	lenient := listen(t, loop, newHandler(), Config{AuthKey: keyA, AllowUnauthenticated: true})
	require.NoError(t, lenient.Notify(ctx, f.ln.Addr().String(), &NotifyRequest{Name: "a", Msg: []byte("hi")}))
	require.NoError(t, lenient.Notify(ctx, plain.Addr(), &NotifyRequest{Name: "a"}))
	for _, peer := range []string{f.ln.Addr().String(), plain.Addr()} {
		err := keyed.Notify(ctx, peer, &NotifyRequest{Name: "a"})
		require.ErrorIs(t, err, ErrAuth, peer)
	}
	err := keyed.NotifyClassic(ctx, b.Addr(), &NotifyRequest{Name: "a"})
	require.ErrorIs(t, err, ErrAuth)
	require.Contains(t, err.Error(), "cannot authenticate")
}

func TestAuthHelloBytes(t *testing.T) {
	var nc [nonceSize]byte
	for i := range nc {
		nc[i] = byte(i)
	}
	require.Equal(t, `{"ts_hello":1,"ts_nonce":"000102030405060708090a0b0c0d0e0f"}`, string(appendHello(nil, &nc)[HeaderSize:]))
	require.Equal(t, `{"ts_hello":1}`, string(appendHello(nil, nil)[HeaderSize:]))
	// The MAC is HMAC-SHA256(key, label || dir || Nc || Ns), spelled out.
	ns := nc
	ns[0] = 0xff
	m := hmac.New(sha256.New, keyA)
	m.Write([]byte("twosided oob auth v1\x00C"))
	m.Write(nc[:])
	m.Write(ns[:])
	require.Equal(t, hex.EncodeToString(m.Sum(nil)), hex.EncodeToString(keysFor(keyA).proof(dirClient, &nc, &ns)[:]))
	require.NotEqual(t, keysFor(keyA).proof(dirClient, &nc, &ns)[:], keysFor(keyA).proof(dirServer, &nc, &ns)[:])
	a := keysFor(keyA)
	ca := connAuth{local: ns, peer: nc, peerNonce: true}
	got := string(appendHelloReply(nil, reqMeta{}, a, &ca, DefaultMaxFrame)[HeaderSize:])
	require.True(t, strings.HasPrefix(got, `{"ts_hello":1,"ts_auth":"hmac-sha256","ts_nonce":"ff0102030405060708090a0b0c0d0e0f","ts_auth_required":true,"ts_mac":"`), got)
}

func TestProbeDecodeTable(t *testing.T) {
	h32 := strings.Repeat("0f", nonceSize)
	h64 := strings.Repeat("a0", macSize)
	for _, tc := range []struct {
		in      string
		wantErr string
	}{
		{`{"ts_hello":1,"ts_nonce":"` + h32 + `"}`, ""},
		{`{"ts_id":1,"ts_mac":"` + h64 + `"}`, ""},
		{`{"ts_id":1,"ts_mac":"` + strings.ToUpper(h64) + `"}`, ""},
		{`{"ts_nonce":"` + h32[2:] + `"}`, `field "ts_nonce": 30 characters, want 32 hex digits`},
		{`{"ts_nonce":"` + h32 + `00"}`, `field "ts_nonce": 34 characters`},
		{`{"ts_mac":"` + h64[1:] + `z"}`, `field "ts_mac": not hex`},
		{`{"ts_mac":5}`, `field "ts_mac": want string, got number`},
		{`{"ts_hello":"1"}`, `field "ts_hello": want number, got string`},
		{`{"ts_hello":-1}`, `field "ts_hello": negative`},
		{`{"ts_id":18446744073709551616}`, `field "ts_id": 18446744073709551616 out of range`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			var d probeDecoder
			_, err := d.decode([]byte(tc.in))
			var ri replyInfo
			_, rerr := ri.decode([]byte(tc.in), nil)
			if tc.wantErr == "" {
				require.NoError(t, err)
				require.NoError(t, rerr)
				return
			}
			require.ErrorIs(t, err, ErrBadFrame)
			require.Contains(t, err.Error(), tc.wantErr)
			require.ErrorIs(t, rerr, ErrBadFrame)
		})
	}
}

// Before the proof a server connection takes only small frames: a large request is refused
// from its header, without buffering the body; after the proof the full MaxFrame applies.
func TestAuthPreAuthFrameCap(t *testing.T) {
	loop := newLoop(t)
	hb := newHandler()
	b := listen(t, loop, hb, Config{AuthKey: keyA})
	p := dialRaw(t, b.Addr())
	p.write(hdr(200<<10, byte(TypeNotify)))
	p.requireRefused(TypeNotify, "authentication required")
	p = dialRaw(t, b.Addr())
	p.write(appendHello(nil, nil))
	_, _, _ = p.reply()
	p.write(hdr(DefaultMaxFrame+1, byte(TypeConnection)))
	p.requireRefused(TypeConnection, "oob: frame too large: length 1048577 above maximum 1048576")

	a := listen(t, loop, newHandler(), Config{AuthKey: keyA})
	big := &NotifyRequest{Name: "big", Msg: []byte(strings.Repeat("x", 200<<10))}
	require.NoError(t, a.Notify(bg(t), b.Addr(), big))
	require.Equal(t, big.Msg, hb.notifies()[0].Msg)
}

// An unauthenticated client cannot hold a connection by probing: it is closed once
// IdleTimeout has passed since the accept.
func TestAuthDeadline(t *testing.T) {
	loop := newLoop(t)
	const idle = 200 * time.Millisecond
	b := listen(t, loop, newHandler(), Config{AuthKey: keyA, IdleTimeout: idle})
	p := dialRaw(t, b.Addr())
	p.hello(nil)
	require.NoError(t, p.c.SetDeadline(time.Now().Add(waitBound)))
	probe := appendProbe(nil, reqMeta{id: 1, hasID: true}, false)
	var err error
	for err == nil {
		if _, err = p.c.Write(probe); err != nil {
			break
		}
		var h [HeaderSize]byte
		if _, err = io.ReadFull(p.c, h[:]); err != nil {
			break
		}
		_, err = io.ReadFull(p.c, make([]byte, binary.LittleEndian.Uint64(h[:8])-1))
	}
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "closed by the server, not by our deadline: %v", err)
	require.EqualValues(t, 1, b.Stats().AuthFailed)
	require.Zero(t, b.Stats().IdleCuts, "it was not idle")

	// An authenticated peer with the same IdleTimeout keeps its connection (probing it,
	// so that the server sees reads).
	a := listen(t, loop, newHandler(), Config{AuthKey: keyA, IdleTimeout: idle, Keepalive: idle / 3})
	require.NoError(t, a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "x"}))
	base := b.Stats().ProbeServed
	require.Eventually(t, func() bool { return b.Stats().ProbeServed >= base+5 }, waitBound, time.Millisecond, "keepalives")
	require.NoError(t, a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "x"}))
	require.EqualValues(t, 2, b.Stats().Accepted)
}
