package oob

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/twosided/twosided/reactor"
)

const childEnv = "OOB_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m)
}

// waitBound bounds every wait of these tests; a hang detector, not a timing assertion.
const waitBound = 60 * time.Second

func bg(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	t.Cleanup(cancel)
	return ctx
}

func newLoop(t testing.TB) *reactor.Loop {
	t.Helper()
	l, err := reactor.New(reactor.WithLogger(zerolog.Nop()))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		require.NoError(t, l.Stop(ctx))
	})
	return l
}

// testHandler records what it serves. Names starting "reject" are rejected; "hold" are
// never answered until release; async answers from another goroutine.
type testHandler struct {
	mu    sync.Mutex
	got   []NotifyRequest
	ch    chan NotifyRequest
	held  []func(error)
	async bool
	hs    []HandshakeDesc
	// Handshakes from LocalNICPath "hold" wait for release; each is signalled on hsHeld.
	heldHS []func(*HandshakeDesc, error)
	hsHeld chan struct{}
	gone   chan string // HandlePeerGone: "addr" or, with a session, "addr session"
}

func newHandler() *testHandler {
	return &testHandler{ch: make(chan NotifyRequest, 4096), hsHeld: make(chan struct{}, 4096), gone: make(chan string, 64)}
}

// HandlePeerGone runs on the loop: it must not block, so names past the buffer are dropped.
func (h *testHandler) HandlePeerGone(addr string, session uint64) {
	if session != 0 {
		addr = fmt.Sprintf("%s %d", addr, session)
	}
	select {
	case h.gone <- addr:
	default:
	}
}

func (h *testHandler) HandleNotify(req *NotifyRequest, r NotifyReply) {
	reply := r.Send
	cp := *req
	cp.Msg = append([]byte(nil), req.Msg...)
	h.mu.Lock()
	h.got = append(h.got, cp)
	if strings.HasPrefix(req.Name, "hold") {
		h.held = append(h.held, reply)
		h.mu.Unlock()
		h.ch <- cp
		return
	}
	h.mu.Unlock()
	var err error
	if strings.HasPrefix(req.Name, "reject") {
		err = errors.New("no such receiver " + req.Name)
	}
	if code, ok := strings.CutPrefix(req.Name, "refuse:"); ok {
		err = fmt.Errorf("handler: %w", &RefusedError{Code: code, Msg: "refused by test"})
	}
	h.ch <- cp
	if h.async {
		go reply(err)
		return
	}
	reply(err)
	reply(errors.New("second reply must be ignored"))
}

func (h *testHandler) HandleHandshake(req *HandshakeDesc, reply func(resp *HandshakeDesc, err error)) {
	h.mu.Lock()
	h.hs = append(h.hs, *req)
	if req.LocalNICPath == "hold" {
		h.heldHS = append(h.heldHS, reply)
		h.mu.Unlock()
		h.hsHeld <- struct{}{}
		return
	}
	h.mu.Unlock()
	if req.LocalNICPath == "refuse" {
		reply(nil, errors.New("no ctrl channel for you"))
		return
	}
	if code, ok := strings.CutPrefix(req.LocalNICPath, "refuse:"); ok {
		reply(nil, &RefusedError{Code: code, Msg: "refused by test"})
		return
	}
	reply(&HandshakeDesc{
		LocalNICPath: req.PeerNICPath, PeerNICPath: req.LocalNICPath, QPNum: []uint32{},
		LocalGID: "fe:80::1", CtrlChannel: req.CtrlChannel, NotifyQPNum: 77, NotifyRQDepth: req.NotifyRQDepth,
		MTU: min(req.MTU, 1024), Session: req.Session + 1, Epoch: 1, PeerName: "server",
	}, nil)
}

func (h *testHandler) notifies() []NotifyRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]NotifyRequest(nil), h.got...)
}

func (h *testHandler) handshakes() []HandshakeDesc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]HandshakeDesc(nil), h.hs...)
}

func (h *testHandler) release() {
	h.mu.Lock()
	held, heldHS := h.held, h.heldHS
	h.held, h.heldHS = nil, nil
	h.mu.Unlock()
	for _, r := range held {
		r(nil)
	}
	for _, r := range heldHS {
		r(&HandshakeDesc{LocalNICPath: "released"}, nil)
	}
}

func listen(t testing.TB, loop *reactor.Loop, h Handler, cfg Config) *Node {
	t.Helper()
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	n, err := Listen(loop, cfg, h)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, n.Close(bg(t))) })
	return n
}

func TestNotifyPersistentAndClassic(t *testing.T) {
	la, lb := newLoop(t), newLoop(t)
	ha, hb := newHandler(), newHandler()
	a := listen(t, la, ha, Config{})
	b := listen(t, lb, hb, Config{})
	ctx := bg(t)

	for i := 0; i < 5; i++ {
		req := &NotifyRequest{Name: "n", Msg: []byte(fmt.Sprint("m", i)), From: a.Addr(), Session: 1, Epoch: 2, Seq: uint64(i + 1)}
		require.NoError(t, a.Notify(ctx, b.Addr(), req))
	}
	require.Len(t, hb.notifies(), 5)
	require.Equal(t, NotifyRequest{Name: "n", Msg: []byte("m4"), From: a.Addr(), Session: 1, Epoch: 2, Seq: 5}, hb.notifies()[4])
	sb := b.Stats()
	require.EqualValues(t, 1, sb.Accepted, "one persistent connection for all notifies")
	require.EqualValues(t, 5, sb.NotifyServed)
	require.EqualValues(t, 1, sb.ProbeServed, "the hello")
	sa := a.Stats()
	require.EqualValues(t, 5, sa.PersistentSent)
	require.EqualValues(t, 0, sa.ClassicSent)

	require.NoError(t, a.NotifyClassic(ctx, b.Addr(), &NotifyRequest{Name: "c", Msg: []byte{0xff, 0}}))
	require.NoError(t, a.NotifyClassic(ctx, b.Addr(), &NotifyRequest{Name: "c", Msg: []byte("x")}))
	require.EqualValues(t, 3, b.Stats().Accepted, "one connection per classic notify")
	require.Equal(t, []byte{0xff, 0}, hb.notifies()[5].Msg, "binary message to a known twosided peer")
	require.EqualValues(t, 2, a.Stats().ClassicSent)

	// The other direction works too, on the same loops.
	require.NoError(t, b.Notify(ctx, a.Addr(), &NotifyRequest{Name: "back", Msg: []byte("y")}))
	require.Equal(t, "back", ha.notifies()[0].Name)
}

func TestNotifyOneLoopManyInFlight(t *testing.T) {
	loop := newLoop(t)
	h := newHandler()
	h.async = true
	a := listen(t, loop, newHandler(), Config{})
	b := listen(t, loop, h, Config{})
	ctx := bg(t)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "x", Msg: []byte(fmt.Sprint(i)), Seq: uint64(i + 1)})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 200, b.Stats().NotifyServed)
	require.EqualValues(t, 1, b.Stats().Accepted, "multiplexed on one connection")
}

func TestNotifyRejected(t *testing.T) {
	loop := newLoop(t)
	a := listen(t, loop, newHandler(), Config{})
	b := listen(t, loop, newHandler(), Config{})
	for _, classic := range []bool{false, true} {
		var err error
		if classic {
			err = a.NotifyClassic(bg(t), b.Addr(), &NotifyRequest{Name: "reject-me"})
		} else {
			err = a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "reject-me"})
		}
		require.ErrorIs(t, err, ErrRejected)
		require.Contains(t, err.Error(), "no such receiver reject-me")
	}
	// The connection survives a rejection.
	require.NoError(t, a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "ok"}))
}

func TestHandshakeAndProbe(t *testing.T) {
	loop := newLoop(t)
	hb := newHandler()
	a := listen(t, loop, newHandler(), Config{})
	b := listen(t, loop, hb, Config{})
	ctx := bg(t)
	req := &HandshakeDesc{LocalNICPath: a.Addr() + "@soft0", PeerNICPath: "__ctrl__", CtrlChannel: true,
		NotifyQPNum: 12, NotifyRQDepth: 64, MTU: 4096, Session: 9, PeerName: a.Addr()}
	resp, err := a.Handshake(ctx, b.Addr(), req)
	require.NoError(t, err)
	require.Equal(t, &HandshakeDesc{LocalNICPath: "__ctrl__", PeerNICPath: a.Addr() + "@soft0", LocalGID: "fe:80::1",
		CtrlChannel: true, NotifyQPNum: 77, NotifyRQDepth: 64, MTU: 1024, Session: 10, Epoch: 1, PeerName: "server"}, resp)
	got := hb.handshakes()[0]
	require.Equal(t, "127.0.0.1", got.Remote.Unmap().String(), "the Handler learns where the request came from")
	got.Remote = netip.Addr{}
	require.Equal(t, *req, got)

	resp, err = a.Handshake(ctx, b.Addr(), &HandshakeDesc{LocalNICPath: "refuse"})
	require.ErrorIs(t, err, ErrRejected)
	require.Contains(t, err.Error(), "no ctrl channel for you")
	require.Equal(t, "no ctrl channel for you", resp.ReplyMsg)

	_, err = a.Handshake(ctx, b.Addr(), &HandshakeDesc{MTU: 1000})
	require.ErrorIs(t, err, ErrBadRequest)
	require.Contains(t, err.Error(), "MTU")

	require.NoError(t, a.Probe(ctx, b.Addr()))
	require.EqualValues(t, 2, b.Stats().HandshakeServed)
}

// readFrame reads one frame from a raw connection.
func readFrame(t testing.TB, c net.Conn) (MsgType, []byte) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(waitBound)))
	var h [HeaderSize]byte
	_, err := io.ReadFull(c, h[:])
	require.NoError(t, err)
	body := make([]byte, binary.LittleEndian.Uint64(h[:8])-1)
	_, err = io.ReadFull(c, body)
	require.NoError(t, err)
	return MsgType(h[8]), body
}

func requireEOF(t testing.TB, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(waitBound)))
	_, err := io.ReadAll(c)
	require.NoError(t, err, "the server closes its side (EOF), it does not hang")
}

// A Mooncake client: connect, write the literal bytes, read the reply, see the server's
// SHUT_WR, close.
func TestMooncakeClientBytes(t *testing.T) {
	loop := newLoop(t)
	h := newHandler()
	b := listen(t, loop, h, Config{})
	c, err := net.Dial("tcp", b.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(mooncakeNotify)
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(waitBound)))
	all, err := io.ReadAll(c) // the reply, then EOF: the server shut its write side
	require.NoError(t, err)
	want := append([]byte{35, 0, 0, 0, 0, 0, 0, 0, 2}, `{"name":"","notify_msg":"success"}`...)
	require.Equal(t, want, all)
	require.Equal(t, NotifyRequest{Name: "a", Msg: []byte("hi")}, h.notifies()[0])

	// A Mooncake handshake (JsonCpp FastWriter: trailing newline, extra members).
	c2, err := net.Dial("tcp", b.Addr())
	require.NoError(t, err)
	defer c2.Close()
	js := `{"local_nic_path":"10.0.0.2:12001@mlx5_0","peer_nic_path":"__ctrl__","qp_num":[],"reply_msg":"","ctrl_channel":true,"notify_qp_num":300,"notify_rq_depth":128,"barex_port":0}` + "\n"
	_, err = c2.Write(AppendFrame(nil, TypeConnection, []byte(js)))
	require.NoError(t, err)
	typ, body := readFrame(t, c2)
	require.Equal(t, TypeConnection, typ)
	require.JSONEq(t, `{"local_nic_path":"__ctrl__","peer_nic_path":"10.0.0.2:12001@mlx5_0","qp_num":[],"local_lid":0,"local_gid":"fe:80::1","reply_msg":"","ctrl_channel":true,"notify_qp_num":77,"notify_rq_depth":128}`, string(body),
		"a Mooncake peer gets no ts_ members")
	requireEOF(t, c2)
}

// fakeMooncake serves like Mooncake's daemon: one request per connection, replies with the
// request's type (probe: JsonCpp's "null"), SHUT_WR, waits for the client to close.
type fakeMooncake struct {
	ln     net.Listener
	mu     sync.Mutex
	frames [][]byte
	wg     sync.WaitGroup
}

func newFakeMooncake(t *testing.T) *fakeMooncake {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeMooncake{ln: ln}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(waitBound))
				var h [HeaderSize]byte
				if _, err := io.ReadFull(c, h[:]); err != nil {
					return
				}
				body := make([]byte, binary.LittleEndian.Uint64(h[:8])-1)
				if _, err := io.ReadFull(c, body); err != nil {
					return
				}
				f.mu.Lock()
				f.frames = append(f.frames, append(h[:], body...))
				f.mu.Unlock()
				var reply string
				switch MsgType(h[8]) {
				case TypeNotify:
					reply = `{"name":"","notify_msg":"success"}` + "\n"
				case TypeProbe:
					reply = "null\n"
				default:
					reply = `{"local_nic_path":"x","peer_nic_path":"y","qp_num":[5],"reply_msg":""}` + "\n"
				}
				_, _ = c.Write(AppendFrame(nil, MsgType(h[8]), []byte(reply)))
				_ = c.(*net.TCPConn).CloseWrite()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); f.wg.Wait() })
	return f
}

func TestNotifyToMooncakePeer(t *testing.T) {
	loop := newLoop(t)
	a := listen(t, loop, newHandler(), Config{})
	f := newFakeMooncake(t)
	ctx := bg(t)
	require.NoError(t, a.Notify(ctx, f.ln.Addr().String(), &NotifyRequest{Name: "a", Msg: []byte("hi"), From: a.Addr(), Seq: 1}))
	require.NoError(t, a.Notify(ctx, f.ln.Addr().String(), &NotifyRequest{Name: "a", Msg: []byte("hi"), Seq: 2}))
	resp, err := a.Handshake(ctx, f.ln.Addr().String(), &HandshakeDesc{LocalNICPath: "me@d", PeerNICPath: "__ctrl__", MTU: 1024, PeerName: "me"})
	require.NoError(t, err)
	require.Equal(t, []uint32{5}, resp.QPNum)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Len(t, f.frames, 4, "hello probe once, then one connection per request")
	require.Equal(t, AppendFrame(nil, TypeProbe, []byte(`{"ts_hello":1}`)), f.frames[0])
	require.Equal(t, mooncakeNotify, f.frames[1], "a Mooncake peer sees exactly Mooncake's notify bytes")
	require.Equal(t, mooncakeNotify, f.frames[2])
	require.NotContains(t, string(f.frames[3]), "ts_", "no twosided members to a Mooncake peer")
	require.EqualValues(t, 3, a.Stats().ClassicSent)
}

// Malformed requests each get a clear error reply with the request's type and the
// connection is closed; the server keeps answering good requests.
func TestMalformedRequests(t *testing.T) {
	loop := newLoop(t)
	h := newHandler()
	b := listen(t, loop, h, Config{})
	notify := func(js string) []byte { return AppendFrame(nil, TypeNotify, []byte(js)) }
	for _, tc := range []struct {
		name     string
		in       []byte
		wantType MsgType
		reason   string
	}{
		{"zero length", hdr(0, 2), TypeConnection, "length 0"},
		{"huge length", hdr(1<<40, 2), TypeNotify, "above maximum"},
		{"just above max", hdr(DefaultMaxFrame+1, 0), TypeConnection, "above maximum"},
		{"bad type", append(hdr(3, 0x80), '{', '}'), 0x80, "unknown type 128"},
		{"bad json", notify(`{"name":`), TypeNotify, `field "name": want string, got end of input`},
		{"bad json syntax", notify(`{"name" "x"}`), TypeNotify, "json"},
		{"not json", notify(`hello`), TypeNotify, "json"},
		{"wrong-typed name", notify(`{"name":1,"notify_msg":"x"}`), TypeNotify, `field "name": want string, got number`},
		{"wrong-typed qp_num", AppendFrame(nil, TypeConnection, []byte(`{"qp_num":{}}`)), TypeConnection, `field "qp_num": want array, got object`},
		{"notify_rq_depth 0", AppendFrame(nil, TypeConnection, []byte(`{"notify_rq_depth":0}`)), TypeConnection, `field "notify_rq_depth": 0 out of range 1..65535`},
		{"notify_rq_depth 65536", AppendFrame(nil, TypeConnection, []byte(`{"notify_rq_depth":65536}`)), TypeConnection, `field "notify_rq_depth": 65536 out of range`},
		{"metadata", AppendFrame(nil, TypeMetadata, []byte(`{}`)), TypeMetadata, "metadata exchange"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", b.Addr())
			require.NoError(t, err)
			defer c.Close()
			_, err = c.Write(tc.in)
			require.NoError(t, err)
			typ, body := readFrame(t, c)
			require.Equal(t, tc.wantType, typ, "the reply carries the request's type")
			require.Contains(t, string(body), `"notify_msg":""`)
			ri := replyInfo{}
			_, err = ri.decode(body, nil)
			require.NoError(t, err)
			require.Contains(t, string(ri.errMsg), tc.reason)
			requireEOF(t, c)

			// The server still answers a good request afterwards.
			c2, err := net.Dial("tcp", b.Addr())
			require.NoError(t, err)
			defer c2.Close()
			_, err = c2.Write(mooncakeNotify)
			require.NoError(t, err)
			_, body = readFrame(t, c2)
			require.Equal(t, `{"name":"","notify_msg":"success"}`, string(body))
		})
	}
	require.EqualValues(t, 12, b.Stats().BadFrames)
}

func TestHalfFrameStallIsCut(t *testing.T) {
	loop := newLoop(t)
	b := listen(t, loop, newHandler(), Config{IdleTimeout: 100 * time.Millisecond})
	c, err := net.Dial("tcp", b.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(mooncakeNotify[:15])
	require.NoError(t, err)
	requireEOF(t, c)
	require.EqualValues(t, 1, b.Stats().IdleCuts)
}

func TestKeepaliveHoldsPersistentConnection(t *testing.T) {
	loop := newLoop(t)
	cfg := Config{IdleTimeout: 60 * time.Millisecond, Keepalive: 20 * time.Millisecond}
	a := listen(t, loop, newHandler(), cfg)
	b := listen(t, loop, newHandler(), cfg)
	require.NoError(t, a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "x"}))
	// Several idle periods pass; keepalive probes keep the server from cutting it.
	require.Eventually(t, func() bool { return b.Stats().ProbeServed >= 5 }, waitBound, 5*time.Millisecond)
	require.NoError(t, a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "x"}))
	require.EqualValues(t, 1, b.Stats().Accepted)
	require.Zero(t, b.Stats().IdleCuts)
}

func TestRequestTimeoutAndClose(t *testing.T) {
	loop := newLoop(t)
	hb := newHandler()
	a, err := Listen(loop, Config{ListenAddr: "127.0.0.1:0", RequestTimeout: 50 * time.Millisecond}, newHandler())
	require.NoError(t, err)
	b := listen(t, loop, hb, Config{})
	err = a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "hold-1"})
	require.ErrorIs(t, err, ErrTimeout)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err = a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "hold-2"})
	cancel()
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// Close fails a pending request with ErrClosed.
	a2 := listen(t, loop, newHandler(), Config{})
	done := make(chan error, 1)
	go func() { done <- a2.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "hold-3"}) }()
	<-hb.ch
	<-hb.ch
	<-hb.ch
	require.NoError(t, a2.Close(bg(t)))
	require.ErrorIs(t, <-done, ErrClosed)
	require.ErrorIs(t, a2.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "x"}), ErrClosed)
	require.NoError(t, a.Close(bg(t)))
	hb.release() // late replies to closed connections are dropped
	require.NoError(t, b.Close(bg(t)))
}

func TestPeerUnreachable(t *testing.T) {
	loop := newLoop(t)
	a := listen(t, loop, newHandler(), Config{ConnectTimeout: 200 * time.Millisecond})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	for _, classic := range []bool{false, true} {
		var err error
		if classic {
			err = a.NotifyClassic(bg(t), dead, &NotifyRequest{Name: "x"})
		} else {
			err = a.Notify(bg(t), dead, &NotifyRequest{Name: "x"})
		}
		require.ErrorIs(t, err, ErrPeerUnreachable)
		require.Contains(t, err.Error(), "connection refused")
	}
	require.ErrorIs(t, a.Probe(bg(t), "no-port"), ErrBadRequest)
	require.EqualValues(t, 2, a.Stats().DialFailed)
}

func TestMaxConns(t *testing.T) {
	loop := newLoop(t)
	b := listen(t, loop, newHandler(), Config{MaxConns: 2})
	var cs []net.Conn
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", b.Addr())
		require.NoError(t, err)
		defer c.Close()
		cs = append(cs, c)
	}
	require.Eventually(t, func() bool { return b.Stats().ServerConns == 2 }, waitBound, time.Millisecond)
	c3, err := net.Dial("tcp", b.Addr())
	require.NoError(t, err)
	defer c3.Close()
	requireEOF(t, c3)
	require.EqualValues(t, 1, b.Stats().RejectedConns)
	// The admitted ones still work.
	_, err = cs[0].Write(mooncakeNotify)
	require.NoError(t, err)
	_, body := readFrame(t, cs[0])
	require.Equal(t, `{"name":"","notify_msg":"success"}`, string(body))
}

func raiseNofile(t testing.TB, want uint64) {
	var rl syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl))
	if rl.Cur >= want {
		return
	}
	old := rl
	rl.Cur = min(want, rl.Max)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl))
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
	if rl.Cur < want {
		t.Skipf("RLIMIT_NOFILE hard limit %d below %d", rl.Max, want)
	}
}

func Test1000ConcurrentConnections(t *testing.T) {
	raiseNofile(t, 4096)
	la, lb := newLoop(t), newLoop(t)
	a := listen(t, la, newHandler(), Config{})
	b := listen(t, lb, newHandler(), Config{})
	ctx := bg(t)
	const N = 1000
	var wg sync.WaitGroup
	errs := make(chan error, N)
	start := make(chan struct{})
	for i := 0; i < N; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs <- a.NotifyClassic(ctx, b.Addr(), &NotifyRequest{Name: "c", Msg: []byte(fmt.Sprint(i))})
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, N, b.Stats().NotifyServed)
	require.EqualValues(t, N, b.Stats().Accepted)
	require.Eventually(t, func() bool { return b.Stats().ServerConns == 0 && a.Stats().ClientConns == 0 }, waitBound, time.Millisecond)
}

// Two processes: the child serves a Node and notifies the parent back.
func TestTwoProcesses(t *testing.T) {
	loop := newLoop(t)
	h := newHandler()
	a := listen(t, loop, h, Config{})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+a.Addr())
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	child := strings.TrimSpace(line)

	ctx := bg(t)
	require.NoError(t, a.Notify(ctx, child, &NotifyRequest{Name: "hello", Msg: []byte("from parent"), From: a.Addr(), Seq: 1}))
	require.ErrorIs(t, a.Notify(ctx, child, &NotifyRequest{Name: "reject-x"}), ErrRejected)
	require.NoError(t, a.NotifyClassic(ctx, child, &NotifyRequest{Name: "hello", Msg: []byte{0, 1, 0xfe}}))
	resp, err := a.Handshake(ctx, child, &HandshakeDesc{LocalNICPath: "p@d", PeerNICPath: "__ctrl__", NotifyRQDepth: 8})
	require.NoError(t, err)
	require.EqualValues(t, 8, resp.NotifyRQDepth)
	require.NoError(t, a.Probe(ctx, child))
	// The child echoes every accepted notify back to us.
	var back []NotifyRequest
	for len(back) < 2 {
		select {
		case r := <-h.ch:
			back = append(back, r)
		case <-ctx.Done():
			t.Fatal("no echo from the child")
		}
	}
	require.Equal(t, "echo:hello", back[0].Name)
	require.ElementsMatch(t, [][]byte{[]byte("from parent"), {0, 1, 0xfe}}, [][]byte{back[0].Msg, back[1].Msg})
}

type echoHandler struct {
	testHandler
	n    atomic.Pointer[Node]
	back string
}

func (e *echoHandler) HandleNotify(req *NotifyRequest, r NotifyReply) {
	reply := r.Send
	if strings.HasPrefix(req.Name, "reject") {
		reply(errors.New("rejected by child"))
		return
	}
	cp := NotifyRequest{Name: "echo:" + req.Name, Msg: append([]byte(nil), req.Msg...)}
	reply(nil)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		if err := e.n.Load().Notify(ctx, e.back, &cp); err != nil {
			fmt.Fprintln(os.Stderr, "child echo:", err)
		}
	}()
}

func childMain() int {
	loop, err := reactor.New(reactor.WithLogger(zerolog.Nop()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	h := &echoHandler{back: os.Getenv(childEnv)}
	n, err := Listen(loop, Config{ListenAddr: "127.0.0.1:0"}, h)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	h.n.Store(n)
	fmt.Println(n.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes our stdin
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	_ = n.Close(ctx)
	_ = loop.Stop(ctx)
	return 0
}

// A listener whose accept queue is full drops SYNs, so a connect stays in progress until
// ConnectTimeout cuts it.
func TestConnectTimeout(t *testing.T) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	defer syscall.Close(fd)
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	// Fill the accept queue.
	var fill []net.Conn
	defer func() {
		for _, c := range fill {
			c.Close()
		}
	}()
	for i := 0; i < 4; i++ {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			break
		}
		fill = append(fill, c)
	}
	loop := newLoop(t)
	a := listen(t, loop, newHandler(), Config{ConnectTimeout: 50 * time.Millisecond, IdleTimeout: 50 * time.Millisecond})
	err = a.Notify(bg(t), addr, &NotifyRequest{Name: "x"})
	require.ErrorIs(t, err, ErrPeerUnreachable)
	require.ErrorIs(t, err, ErrTimeout, "%v", err)
	require.Contains(t, err.Error(), "ConnectTimeout")
	require.EqualValues(t, 1, a.Stats().DialFailed)
}

func TestIPv6(t *testing.T) {
	loop := newLoop(t)
	h := newHandler()
	a, err := Listen(loop, Config{ListenAddr: "[::1]:0"}, h)
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer func() { require.NoError(t, a.Close(bg(t))) }()
	require.True(t, strings.HasPrefix(a.Addr(), "[::1]:"), a.Addr())
	require.NoError(t, a.Notify(bg(t), a.Addr(), &NotifyRequest{Name: "self"}))
	require.Equal(t, "self", h.notifies()[0].Name)
}

// A classic request whose Handler answers after IdleTimeout is still answered: only the
// client's stall is cut, not the wait for our own Handler.
func TestSlowHandlerNotCut(t *testing.T) {
	loop := newLoop(t)
	h := newHandler()
	b := listen(t, loop, h, Config{IdleTimeout: 100 * time.Millisecond})
	// The request must be read before IdleTimeout: a loaded machine can delay the accept
	// past it, and the server then rightly cuts the connection as idle. Such a try is
	// counted as a cut and made again on a new connection.
	var c net.Conn
	for held := false; !held; {
		cuts := b.Stats().IdleCuts
		var err error
		c, err = net.Dial("tcp", b.Addr())
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Write(AppendFrame(nil, TypeNotify, []byte(`{"name":"hold-slow","notify_msg":"x"}`)))
		require.NoError(t, err)
		end := time.Now().Add(waitBound)
		for !held && b.Stats().IdleCuts == cuts {
			require.True(t, time.Now().Before(end), "the held request neither reached the Handler nor was cut")
			select {
			case <-h.ch:
				held = true
			case <-time.After(time.Millisecond):
			}
		}
	}
	base := b.Stats().IdleCuts
	// A witness accepted later that sends nothing is cut by IdleTimeout: a deadline the
	// held connection had would have passed before the witness's.
	w, err := net.Dial("tcp", b.Addr())
	require.NoError(t, err)
	defer w.Close()
	requireEOF(t, w)
	require.EqualValues(t, base+1, b.Stats().IdleCuts)
	h.release()
	_, body := readFrame(t, c)
	require.Equal(t, `{"name":"","notify_msg":"success"}`, string(body))
	requireEOF(t, c)
	require.EqualValues(t, base+1, b.Stats().IdleCuts, "only the witness")
}

func TestClientCallOnLoopRefused(t *testing.T) {
	loop := newLoop(t)
	a := listen(t, loop, newHandler(), Config{})
	errc := make(chan error, 1)
	require.NoError(t, loop.Submit(func() { errc <- a.Notify(context.Background(), a.Addr(), &NotifyRequest{Name: "x"}) }))
	var err error
	select {
	case err = <-errc:
	case <-time.After(waitBound):
		t.Fatal("no answer from the loop")
	}
	require.ErrorIs(t, err, ErrBadRequest)
	require.Contains(t, err.Error(), "loop goroutine")
}

// A client that sends requests and never reads the replies runs the server's send buffer
// over MaxConnBuffer; the server cuts that connection and keeps serving others.
func TestSendBufferCap(t *testing.T) {
	loop := newLoop(t)
	b := listen(t, loop, nopHandler{}, Config{MaxConnBuffer: DefaultMaxFrame + HeaderSize})
	c, err := net.Dial("tcp", b.Addr())
	require.NoError(t, err)
	defer c.Close()
	// The client never reads. Its receive buffer keeps the default size: with a 4 KiB one
	// the loopback connection stalled in both directions after ~3 855 requests (the server
	// then neither read nor overflowed), so the test failed without any fault in the server.
	var burst []byte
	burst = appendProbe(burst, reqMeta{}, true)
	for i := 0; i < 20000; i++ {
		burst = appendNotifyRequest(burst, &NotifyRequest{Name: "n", Msg: []byte("m")}, reqMeta{id: uint64(i + 1), hasID: true, twosided: true}, true)
	}
	for i := 0; i < 100 && b.Stats().Overflows == 0; i++ {
		// A deadline per burst: a slow (loaded, -race) server still gets all the bursts
		// it needs to run over the cap.
		require.NoError(t, c.SetWriteDeadline(time.Now().Add(waitBound)))
		if _, err := c.Write(burst); err != nil {
			break // the server closed the connection
		}
	}
	require.Eventually(t, func() bool { return b.Stats().Overflows == 1 }, waitBound, time.Millisecond, "%+v", b.Stats())
	c2, err := net.Dial("tcp", b.Addr())
	require.NoError(t, err)
	defer c2.Close()
	_, err = c2.Write(mooncakeNotify)
	require.NoError(t, err)
	_, body := readFrame(t, c2)
	require.Equal(t, `{"name":"","notify_msg":"success"}`, string(body))
}
