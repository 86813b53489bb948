package oob

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/internal/tracepoint"
	"github.com/twosided/twosided/reactor"
)

// classicRecheck is how long a peer that answered the hello like Mooncake stays on
// one-connection-per-request before it is probed again.
const classicRecheck = time.Minute

// oobError is an error whose message says "oob: " once however many of this package's
// sentinels it wraps: the first sentinel's text, the others' in parentheses, then the
// detail, e.g. "oob: peer unreachable (nothing sent): 10.0.0.2:12001: connect: connection
// refused". errors.Is finds every sentinel and what the detail wraps.
type oobError struct {
	msg  string
	errs []error
}

func (e *oobError) Error() string   { return e.msg }
func (e *oobError) Unwrap() []error { return e.errs }

// errorOf builds an oobError of sentinels (at least one) and the detail of format and
// args, which may wrap a cause with %w. A detail names the peer as "addr: " followed by
// the rest, so that a caller that names the peer itself can drop it (notify does).
func errorOf(sentinels []error, format string, args ...any) error {
	detail := fmt.Errorf(format, args...)
	var b strings.Builder
	b.WriteString(sentinels[0].Error())
	for i, s := range sentinels[1:] {
		if i == 0 {
			b.WriteString(" (")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(strings.TrimPrefix(s.Error(), "oob: "))
	}
	if len(sentinels) > 1 {
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(detail.Error())
	return &oobError{msg: b.String(), errs: append(sentinels[:len(sentinels):len(sentinels)], detail)}
}

// requestName names a request of type t in errors: the Connection RPC is the handshake.
func requestName(t MsgType) string {
	if t == TypeConnection || t == TypeOldProtocol {
		return "handshake"
	}
	return t.String()
}

// peerState is what the loop knows of one peer address.
type peerState struct {
	addr         string
	sa           unix.Sockaddr
	conn         *conn // persistent connection, nil when none
	classicUntil int64
	twosided     bool // answered a hello once
	maxFrame     int  // the peer's frame limit from its hello reply; 0 = not said
}

// frameLimit is the largest frame length the peer takes: what its hello reply said, else
// DefaultMaxFrame (Mooncake's default and minimum of MC_HANDSHAKE_MAX_LENGTH).
func (ps *peerState) frameLimit() int {
	if ps.maxFrame > 0 {
		return ps.maxFrame
	}
	return DefaultMaxFrame
}

// checkFrame refuses, before it is sent, a request whose encoded frame is over the peer's
// frame limit: the peer would refuse it and close the connection, failing every other
// request on it.
//
// A Notify to a twosided peer that announced its limit may take NotifyFrameLimit of it:
// such a peer absorbs the encoding of a notify as large as its frame limit. A Mooncake
// peer (or one that said nothing) takes DefaultMaxFrame, all of the frame counted.
func (n *Node) checkFrame(c *call, ps *peerState, frame []byte) error {
	limit := ps.frameLimit()
	if c.typ == TypeNotify && ps.maxFrame > 0 {
		limit = NotifyFrameLimit(limit)
	}
	if l := len(frame) - 8; l > limit {
		n.st.tooLarge.Add(1)
		n.warn(warnTooLarge, ps.addr)
		if c.typ == TypeNotify && ps.maxFrame == 0 {
			return fmt.Errorf("%w: %s: %s: encoded frame is %d bytes (name+msg %d before encoding), above %d, the frame limit of a peer that does not announce one "+
				"(a Mooncake peer takes the whole frame, JSON included, within its MC_HANDSHAKE_MAX_LENGTH)",
				ErrTooLarge, ps.addr, requestName(c.typ), l, len(c.nreq.Name)+len(c.nreq.Msg), limit)
		}
		if c.typ == TypeNotify {
			return fmt.Errorf("%w: %s: %s: encoded frame is %d bytes (name+msg %d before encoding), the peer's OOB frame limit for a notify is %d "+
				"(name+msg of up to %d bytes fit: text that JSON escaping would lengthen by more than a third goes as base64, as binary does)",
				ErrTooLarge, ps.addr, requestName(c.typ), l, len(c.nreq.Name)+len(c.nreq.Msg), limit, ps.frameLimit())
		}
		return fmt.Errorf("%w: %s: %s: encoded frame is %d bytes, the peer's frame limit is %d",
			ErrTooLarge, ps.addr, requestName(c.typ), l, limit)
	}
	return nil
}

// call is one client request, from submission to reply. Pooled.
type call struct {
	n       *Node
	typ     MsgType
	peer    string
	ap      netip.AddrPort
	classic bool

	nreq NotifyRequest
	msg  []byte
	hs   HandshakeDesc

	// Result, written on the loop before done is signalled.
	err  error
	resp *HandshakeDesc
	done chan struct{}

	// Loop-only.
	id       uint64
	conn     *conn
	finished bool

	abandoned atomic.Bool
	startFn   func()
	cancelFn  func()
	timer     *time.Timer

	// NotifyOnLoop: the result goes to cb on the loop instead of done; lt bounds the wait.
	// Such a call comes from the Node's own free list (loop-only), with its timer and its
	// two callbacks made once. It goes back only where nothing refers to it any more: in
	// deliver (submitted by finish, so it runs after the connection code that finished it
	// returned, and after pending, queue and one let go of it), in loopTimeout (after
	// cancel took it out of its connection), or in NotifyOnLoop for a result at once.
	cb        func(error)
	lt        *reactor.Timer
	ltD       time.Duration
	deliverFn func()
	sync      bool // start runs inside NotifyOnLoop: a result now is returned, not called back
	local     bool // lt is the caller's deadline (not RequestTimeout)
}

// maxFreeLoopCalls bounds the Node's free list of NotifyOnLoop calls.
const maxFreeLoopCalls = 1024

// getLoopCall takes a NotifyOnLoop call from the free list, or makes one. Loop-only.
func (n *Node) getLoopCall() *call {
	if c := n.freeCalls.Get(); c != nil {
		return c
	}
	c := &call{n: n}
	c.deliverFn = c.deliver
	c.lt = n.loop.AfterFunc(time.Hour, c.loopTimeout)
	c.lt.Stop()
	return c
}

// putLoopCall returns c to the free list once nothing refers to it. Loop-only.
func (n *Node) putLoopCall(c *call) {
	c.typ, c.peer, c.ap, c.classic = 0, "", netip.AddrPort{}, false
	c.nreq = NotifyRequest{}
	c.err, c.resp, c.id, c.conn, c.finished = nil, nil, 0, nil, false
	c.cb, c.sync, c.local, c.ltD = nil, false, false, 0
	c.abandoned.Store(false)
	n.freeCalls.Put(c)
}

// deliver hands a NotifyOnLoop call's result to its callback. Loop-only.
func (c *call) deliver() {
	cb, err := c.cb, c.err
	c.n.putLoopCall(c)
	cb(err)
}

// loopTimeout ends a NotifyOnLoop call its reply did not reach in time. Loop-only.
func (c *call) loopTimeout() {
	if c.finished {
		return
	}
	c.cancel() // out of the connection's queue or pending set; finished
	err := errorOf([]error{ErrTimeout}, "%s: %s: no reply within RequestTimeout %v", c.peer, requestName(c.typ), c.ltD)
	if c.local {
		err = errorOf([]error{ErrTimeout}, "%s: %s: %w", c.peer, requestName(c.typ), context.DeadlineExceeded)
	}
	cb := c.cb
	c.n.putLoopCall(c)
	cb(err)
}

var callPool = sync.Pool{New: func() any {
	c := &call{done: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
	c.timer.Stop()
	c.startFn = c.start
	c.cancelFn = c.cancel
	return c
}}

func (n *Node) getCall(typ MsgType, peer string) *call {
	c := callPool.Get().(*call)
	c.n, c.typ, c.peer, c.classic = n, typ, peer, false
	c.err, c.resp, c.id, c.conn, c.finished = nil, nil, 0, nil, false
	c.hs = HandshakeDesc{}
	c.nreq = NotifyRequest{}
	return c
}

func putCall(c *call) {
	c.n, c.conn, c.resp, c.err = nil, nil, nil, nil
	c.nreq, c.hs = NotifyRequest{}, HandshakeDesc{}
	if cap(c.msg) > 64<<10 {
		c.msg = nil
	}
	callPool.Put(c)
}

// Notify sends req to peer (host:port) and waits for the reply, bounded by ctx and
// RequestTimeout. Between twosided nodes it uses a persistent multiplexed connection;
// a Mooncake peer gets one connection per notify. nil means the peer replied success.
func (n *Node) Notify(ctx context.Context, peer string, req *NotifyRequest) error {
	return n.notify(ctx, peer, req, false)
}

// NotifyOnLoop sends req to peer as Notify does, from the loop goroutine and without
// waiting: done is called on the loop exactly once with the result, unless NotifyOnLoop
// returns an error itself (then done is never called). It saves the submission and the
// hand-offs of a waiting goroutine. peer must be a literal ip:port (resolving a host name
// would block the loop: such a peer gets ErrBadRequest, and Notify serves it). The reply
// is awaited at most timeout, and never past RequestTimeout; a timeout error wraps
// context.DeadlineExceeded when timeout was the shorter (the caller's deadline). req (and
// its Msg) must stay unchanged until done is called.
func (n *Node) NotifyOnLoop(peer string, req *NotifyRequest, timeout time.Duration, done func(error)) error {
	switch {
	case !n.loop.InLoop():
		return fmt.Errorf("%w: %s: notify: NotifyOnLoop off the loop goroutine", ErrBadRequest, peer)
	case req == nil || done == nil:
		return fmt.Errorf("%w: %s: notify: req and done must not be nil", ErrBadRequest, peer)
	case n.closed.Load():
		return errorOf([]error{ErrClosed}, "%s: notify not sent", peer)
	}
	if err := checkNotify(req); err != nil {
		return err
	}
	ap, err := n.literalPeer(peer)
	if err != nil {
		return fmt.Errorf("%w: %s: notify: not a literal ip:port (NotifyOnLoop resolves no names)", ErrBadRequest, peer)
	}
	if timeout <= 0 {
		return errorOf([]error{ErrTimeout}, "%s: notify: %w", peer, context.DeadlineExceeded)
	}
	c := n.getLoopCall()
	c.typ, c.peer, c.ap, c.nreq, c.cb = TypeNotify, peer, ap, *req, done
	d := n.cfg.RequestTimeout
	if timeout < d {
		d, c.local = timeout, true
	}
	c.ltD = d
	c.sync = true
	tracepoint.Mark(tracepoint.CallStart, 0)
	c.start()
	tracepoint.Mark(tracepoint.CallQueued, 0)
	c.sync = false
	if c.finished {
		err := c.err
		n.putLoopCall(c)
		return err
	}
	c.lt.Reset(d)
	return nil
}

// literalPeer parses a literal ip:port and remembers the last one, so a stream of notifies
// to one peer parses its address once. Loop-only.
func (n *Node) literalPeer(peer string) (netip.AddrPort, error) {
	if peer == n.lastPeer && peer != "" {
		return n.lastAP, nil
	}
	ap, err := netip.ParseAddrPort(peer)
	if err == nil {
		n.lastPeer, n.lastAP = peer, ap
	}
	return ap, err
}

// NotifyClassic sends req on a connection of its own, as Mooncake does.
func (n *Node) NotifyClassic(ctx context.Context, peer string, req *NotifyRequest) error {
	return n.notify(ctx, peer, req, true)
}

func (n *Node) notify(ctx context.Context, peer string, req *NotifyRequest, classic bool) error {
	if req == nil {
		return fmt.Errorf("%w: notify: req: must not be nil", ErrBadRequest)
	}
	if err := checkNotify(req); err != nil {
		return err
	}
	c := n.getCall(TypeNotify, peer)
	c.classic = classic
	c.msg = append(c.msg[:0], req.Msg...)
	c.nreq = *req
	c.nreq.Msg = c.msg
	_, err := n.do(ctx, c)
	return err
}

// Handshake sends the handshake RPC (type Connection) and returns the peer's descriptor.
// A non-empty reply_msg is returned with the descriptor and an ErrRejected error.
func (n *Node) Handshake(ctx context.Context, peer string, req *HandshakeDesc) (*HandshakeDesc, error) {
	if req == nil {
		return nil, fmt.Errorf("%w: handshake: req: must not be nil", ErrBadRequest)
	}
	if err := checkHandshake(req); err != nil {
		return nil, err
	}
	c := n.getCall(TypeConnection, peer)
	c.hs = *req
	c.hs.QPNum = append([]uint32(nil), req.QPNum...)
	return n.do(ctx, c)
}

// Probe checks that peer answers (type Probe).
func (n *Node) Probe(ctx context.Context, peer string) error {
	_, err := n.do(ctx, n.getCall(TypeProbe, peer))
	return err
}

// do submits c to the loop and waits for its reply. It recycles c unless the wait was
// abandoned (then the loop may still hold it).
func (n *Node) do(ctx context.Context, c *call) (*HandshakeDesc, error) {
	if n.closed.Load() {
		return nil, errorOf([]error{ErrClosed}, "%s: %s not sent", c.peer, requestName(c.typ))
	}
	if n.loop.InLoop() {
		// Waiting here would stop the loop that must deliver the reply.
		return nil, fmt.Errorf("%w: %s: %s: called on the loop goroutine; call from another goroutine", ErrBadRequest, c.peer, requestName(c.typ))
	}
	ap, err := parsePeer(ctx, c.peer)
	if err != nil {
		return nil, err
	}
	c.ap = ap
	if err := n.loop.Submit(c.startFn); err != nil {
		if errors.Is(err, reactor.ErrQueueFull) {
			err = n.loop.SubmitWait(ctx, c.startFn)
		}
		if err != nil {
			if errors.Is(err, reactor.ErrStopped) {
				err = ErrClosed
			}
			if err == ErrClosed {
				return nil, errorOf([]error{ErrClosed}, "%s: %s not sent", c.peer, requestName(c.typ))
			}
			return nil, fmt.Errorf("oob: %s: %s: submit: %w", c.peer, requestName(c.typ), err)
		}
	}
	d := n.cfg.RequestTimeout
	c.timer.Reset(d)
	select {
	case <-c.done:
		c.timer.Stop()
		err, resp := c.err, c.resp
		putCall(c)
		return resp, err
	case <-ctx.Done():
		c.timer.Stop()
		c.abandon()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, errorOf([]error{ErrTimeout}, "%s: %s: %w", c.peer, requestName(c.typ), ctx.Err())
		}
		return nil, fmt.Errorf("oob: %s: %s: %w", c.peer, requestName(c.typ), ctx.Err())
	case <-c.timer.C:
		c.abandon()
		return nil, errorOf([]error{ErrTimeout}, "%s: %s: no reply within RequestTimeout %v", c.peer, requestName(c.typ), d)
	}
}

func (c *call) abandon() {
	c.abandoned.Store(true)
	_ = c.n.loop.Submit(c.cancelFn)
}

// parsePeer takes "ip:port" without allocating; a host name is resolved here, on the
// caller's goroutine, bounded by ctx (never on the loop).
func parsePeer(ctx context.Context, peer string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(peer); err == nil {
		return ap, nil
	}
	host, port, err := net.SplitHostPort(peer)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: peer %q: want host:port: %v", ErrBadRequest, peer, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: peer %q: port: %v", ErrBadRequest, peer, err)
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(ips) == 0 {
		return netip.AddrPort{}, errorOf([]error{ErrPeerUnreachable, ErrNotSent}, "peer %q: resolve: %v", peer, err)
	}
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			return netip.AddrPortFrom(ip.Unmap(), uint16(p)), nil
		}
	}
	return netip.AddrPortFrom(ips[0], uint16(p)), nil
}

// finish completes c once (loop-only).
func (c *call) finish(err error, resp *HandshakeDesc) {
	if c.finished {
		return
	}
	c.finished = true
	c.conn = nil
	c.err, c.resp = err, resp
	if c.cb != nil {
		if c.sync {
			return // NotifyOnLoop returns it
		}
		c.lt.Stop()
		// Not from inside the connection code that finished it (a callback may send again,
		// or close): later in this loop turn, with no wake-up. When the loop takes no more
		// work, at once (and c is not reused: the code that finished it may still hold it).
		if c.n.loop.Submit(c.deliverFn) != nil {
			c.cb(err)
		}
		return
	}
	c.done <- struct{}{}
}

// start runs on the loop.
func (c *call) start() {
	n := c.n
	if n.down {
		c.finish(errorOf([]error{ErrClosed}, "%s: %s not sent", c.peer, requestName(c.typ)), nil)
		return
	}
	if c.abandoned.Load() {
		c.finished = true
		return
	}
	ps := n.peers[c.peer]
	if ps == nil {
		if !n.roomForPeer() {
			n.st.peersLimited.Add(1)
			n.warn(warnPeers, c.peer)
			c.finish(fmt.Errorf("%w: %s: %s: MaxPeers %d peer addresses have requests in flight", ErrLimit, c.peer, requestName(c.typ), n.cfg.MaxPeers), nil)
			return
		}
		ps = &peerState{addr: c.peer, sa: sockaddrOf(c.ap)}
		n.peers[c.peer] = ps
		n.st.peers.Add(1)
	}
	if c.classic || ps.classicUntil > n.now() {
		n.startClassic(c, ps)
		return
	}
	pc := ps.conn
	if pc == nil {
		var err error
		pc, err = n.dial(ps, connPersistent)
		if err != nil {
			n.forgetIdlePeer(ps)
			c.finish(err, nil)
			return
		}
		ps.conn = pc
		var nc *[nonceSize]byte
		if n.auth.on {
			newNonce(&pc.auth.local)
			nc = &pc.auth.local
		}
		n.out = appendHello(n.out[:0], nc)
		pc.send(n.out)
	}
	pc.lastUse = n.now()
	c.conn = pc
	if pc.state == stateOpen {
		pc.sendCall(c)
	} else {
		pc.queue = append(pc.queue, c)
	}
	pc.touch()
}

// cancel runs on the loop after the waiter gave up.
func (c *call) cancel() {
	if c.finished {
		return
	}
	pc := c.conn
	c.finished = true
	c.conn = nil
	if pc == nil || pc.state == stateClosed {
		return
	}
	switch pc.kind {
	case connClassic:
		pc.one = nil
		pc.close(nil)
	case connPersistent:
		delete(pc.pending, c.id)
		for i, q := range pc.queue {
			if q == c {
				pc.queue = append(pc.queue[:i], pc.queue[i+1:]...)
				break
			}
		}
		pc.touch()
	}
}

func (n *Node) startClassic(c *call, ps *peerState) {
	if n.auth.required {
		// A one-request connection carries no hello, so nothing can be proved either way.
		c.finish(fmt.Errorf("%w: %s: %s: a one-request (Mooncake-style) connection cannot authenticate; AuthKey is set and AllowUnauthenticated is false", ErrAuth, ps.addr, requestName(c.typ)), nil)
		return
	}
	twosided := ps.twosided || (c.pairRequest() && ps.classicUntil <= n.now())
	n.out = n.encodeCall(n.out[:0], c, reqMeta{hasID: twosided, twosided: twosided}, twosided)
	if err := n.checkFrame(c, ps, n.out); err != nil {
		c.finish(err, nil)
		return
	}
	cc, err := n.dial(ps, connClassic)
	if err != nil {
		n.forgetIdlePeer(ps)
		c.finish(err, nil)
		return
	}
	cc.one = c
	c.conn = cc
	n.st.classicSent.Add(1)
	cc.send(n.out) // a new connection's buffer is empty: MaxConnBuffer > MaxMaxFrame+9 is not needed
	cc.touch()
}

// pairRequest reports whether c is a twosided pair's request: a notify, probe or fence
// with a session (ts_session, which only a peer's twosided handshake gives), or a
// handshake with one. Unless the peer answered the hello as Mooncake does (classicUntil),
// such a request keeps its ts_* members on a one-request connection: a persistent
// connection cut before its hello's answer (EOF, as a reset path cuts it) says nothing of
// what the peer is, and a peer state dropped with its last connection forgot that it was
// twosided. Stripped, a notify would reach the twosided receiver as a Mooncake notify,
// without seq, id or sender (delivered out of order, undeduplicated, a probe or a fence
// as an empty notify), and a handshake would be answered as to a Mooncake engine (the
// pair served seq-less).
func (c *call) pairRequest() bool {
	switch c.typ {
	case TypeNotify:
		return c.nreq.Session != 0
	case TypeConnection:
		return c.hs.Session != 0
	}
	return false
}

// sendCall writes c on a ready persistent connection. A request that cannot go (over the
// peer's frame limit, or over what the connection may queue) fails alone; the connection
// and the other requests on it go on.
func (pc *conn) sendCall(c *call) {
	n := pc.n
	n.nextID++
	c.id = n.nextID
	if c.typ == TypeNotify && pc.compact {
		n.out = appendNotifyCompact(n.out[:0], &c.nreq, reqMeta{id: c.id, hasID: true, twosided: true, compact: true})
	} else {
		n.out = n.encodeCall(n.out[:0], c, reqMeta{id: c.id, hasID: true, twosided: true}, true)
	}
	if err := n.checkFrame(c, pc.peer, n.out); err != nil {
		c.conn = nil
		c.finish(err, nil)
		return
	}
	if pc.queued()+len(n.out) > n.cfg.MaxConnBuffer && len(pc.batch) > 0 {
		pc.writeBatch() // what the socket takes of it leaves room
	}
	if pc.state == stateClosed {
		c.conn = nil
		c.finish(errorOf([]error{ErrPeerUnreachable, ErrNotSent}, "%s: %s: connection closed", pc.peer.addr, requestName(c.typ)), nil)
		return
	}
	if pc.queued()+len(n.out) > n.cfg.MaxConnBuffer {
		n.st.sendBufferFull.Add(1)
		c.conn = nil
		c.finish(fmt.Errorf("%w: %s: %s: %d bytes queued for the peer and this request is %d, over MaxConnBuffer %d (the peer does not read)",
			ErrLimit, pc.peer.addr, requestName(c.typ), pc.queued(), len(n.out), n.cfg.MaxConnBuffer), nil)
		return
	}
	if len(pc.pending) == 0 && pc.kaID == 0 {
		pc.waitSince = n.now()
	}
	pc.pending[c.id] = c
	n.st.persistentSent.Add(1)
	pc.send(n.out)
}

func (n *Node) encodeCall(dst []byte, c *call, m reqMeta, twosided bool) []byte {
	switch c.typ {
	case TypeNotify:
		return appendNotifyRequest(dst, &c.nreq, m, twosided)
	case TypeConnection:
		hs := c.hs
		if !twosided {
			hs.stripExtensions()
		}
		return appendHandshake(dst, &hs, m)
	default:
		return appendProbe(dst, m, false)
	}
}

// dial starts a non-blocking connect on the loop.
func (n *Node) dial(ps *peerState, kind connKind) (*conn, error) {
	if n.down {
		return nil, errorOf([]error{ErrClosed}, "%s: not dialed", ps.addr)
	}
	fd, err := unix.Socket(sockFamily(ps.sa), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		n.st.dialFailed.Add(1)
		return nil, errorOf([]error{ErrPeerUnreachable, ErrNotSent}, "%s: socket: %w", ps.addr, err)
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	err = unix.Connect(fd, ps.sa)
	for err == unix.EINTR {
		err = unix.Connect(fd, ps.sa)
	}
	if err != nil && err != unix.EINPROGRESS {
		_ = unix.Close(fd)
		n.st.dialFailed.Add(1)
		return nil, errorOf([]error{ErrPeerUnreachable, ErrNotSent}, "%s: connect: %w", ps.addr, err)
	}
	c := n.newConn(fd, kind, ps)
	c.state = stateConnecting
	if err := n.loop.AddDrained(fd, reactor.Writable, c.onEvent); err != nil {
		_ = unix.Close(fd)
		n.st.dialFailed.Add(1)
		return nil, errorOf([]error{ErrPeerUnreachable, ErrNotSent}, "%s: register: %w", ps.addr, err)
	}
	n.conns[c] = struct{}{}
	n.st.clientConns.Add(1)
	c.touch() // ConnectTimeout
	return c, nil
}

func (c *conn) finishConnect() {
	n := c.n
	soerr, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err == nil && soerr != 0 {
		err = unix.Errno(soerr)
	}
	if err != nil {
		n.st.dialFailed.Add(1)
		c.close(errorOf([]error{ErrPeerUnreachable, ErrNotSent}, "%s: connect: %w", c.peer.addr, err))
		return
	}
	n.st.dialed.Add(1)
	now := n.now()
	c.lastRead, c.lastWrite, c.waitSince = now, now, now
	if c.kind == connPersistent {
		c.state = stateHello
	} else {
		c.state = stateOpen
	}
	c.writing = true // registered for Writable only; flush sets Readable (and Writable if needed)
	c.flush()
	if c.state != stateClosed && c.writing {
		// flush left data: keep Writable, add Readable.
		if err := n.loop.Modify(c.fd, reactor.Readable|reactor.Writable); err != nil {
			c.ioFailed("epoll modify", err)
		}
	}
}

// helloFailed: the peer is not a twosided server (or closed before answering). The
// queued calls go the classic way; mark makes it stick for classicRecheck.
func (c *conn) helloFailed(mark bool) {
	n := c.n
	ps := c.peer
	if mark {
		ps.classicUntil = n.now() + int64(classicRecheck)
		ps.twosided = false
	}
	queue := c.queue
	c.queue = nil
	c.close(nil)
	for _, cl := range queue {
		cl.conn = nil
		if cl.abandoned.Load() {
			cl.finished = true
			continue
		}
		n.startClassic(cl, ps)
	}
}

// replyFrame handles one reply on a dialed connection.
func (c *conn) replyFrame(t MsgType, body []byte) {
	n := c.n
	var (
		m    reqMeta
		resp *HandshakeDesc
		err  error
	)
	switch t {
	case TypeConnection:
		resp, m, err = decodeHandshake(body)
	case TypeNotifyCompact:
		if !c.compact {
			err = compactErr(fCompact, "a compact reply on a connection that sent none")
		} else {
			err = n.ri.decodeCompact(body)
		}
		m, t = n.ri.m, TypeNotify // the same reply as the JSON one from here on
	default:
		n.key, err = n.ri.decode(body, n.key)
		m = n.ri.m
	}
	if c.state == stateHello {
		if err == nil {
			if rerr := c.refusal(t, resp); rerr != nil {
				// A twosided server refusing the connection (MaxConns): not a Mooncake peer.
				c.close(fmt.Errorf("oob: %s: hello: %w", c.peer.addr, rerr))
				return
			}
		}
		if err != nil || t != TypeProbe || n.ri.hello < helloVersion || len(n.ri.errMsg) > 0 {
			c.helloFailed(true)
			return
		}
		c.peer.twosided = true
		c.peer.classicUntil = 0
		c.peer.maxFrame = int(n.ri.maxFrame)
		c.compact = n.ri.compact
		c.helloDone()
		return
	}
	if c.state == stateAuth {
		c.authReply(t, err)
		return
	}
	if err != nil {
		c.close(fmt.Errorf("%w: %s: bad reply: %w", ErrPeerUnreachable, c.peer.addr, err))
		return
	}
	if t == TypeProbe && n.ri.bye != 0 && c.kind == connPersistent {
		// The server closes gracefully: what is in flight will get no reply.
		n.st.byesReceived.Add(1)
		addr := c.peer.addr
		c.close(errorOf([]error{ErrPeerUnreachable, ErrPeerClosed}, "%s: the peer closed", addr))
		n.peerGone(addr, n.ri.session)
		return
	}
	var cl *call
	if c.kind == connClassic {
		cl = c.one
		c.one = nil
	} else {
		if !m.hasID {
			// An error reply without an id answers the connection, not one request: the
			// peer refused a frame it could not parse and closes. Say why.
			if rerr := c.refusal(t, resp); rerr != nil {
				c.close(fmt.Errorf("%w: %s: the peer closed the connection: %w", ErrPeerUnreachable, c.peer.addr, rerr))
				return
			}
			if reason := c.replyError(t, resp); reason != "" {
				c.close(fmt.Errorf("%w: %s: the peer closed the connection: %s", ErrPeerUnreachable, c.peer.addr, reason))
				return
			}
			c.close(fmt.Errorf("%w: %s: reply without ts_id on a multiplexed connection", ErrPeerUnreachable, c.peer.addr))
			return
		}
		if m.id == c.kaID && t == TypeProbe {
			c.kaID = 0
			return
		}
		cl = c.pending[m.id]
		if cl == nil {
			return // its waiter gave up
		}
		delete(c.pending, m.id)
		if len(c.pending) == 0 {
			c.waitSince = n.now()
		}
	}
	if cl != nil {
		cl.finish(c.result(cl, t, resp), resp)
	}
	if c.kind == connClassic {
		c.close(nil)
	}
}

// refusal is the typed refusal a reply carries (ts_refuse), whatever its type, or nil.
func (c *conn) refusal(t MsgType, resp *HandshakeDesc) error {
	if t == TypeConnection || t == TypeOldProtocol {
		if resp != nil && resp.Refuse != "" {
			return newRefused(resp.Refuse, resp.ReplyMsg)
		}
		return nil
	}
	if ri := &c.n.ri; len(ri.refuse) > 0 {
		return newRefused(string(ri.refuse), string(ri.errMsg))
	}
	return nil
}

// replyError is the error text a reply carries (reply_msg or ts_error), "" when none.
func (c *conn) replyError(t MsgType, resp *HandshakeDesc) string {
	if t == TypeConnection || t == TypeOldProtocol {
		if resp != nil {
			return resp.ReplyMsg
		}
		return ""
	}
	return string(c.n.ri.errMsg)
}

// result turns a reply into the call's error.
func (c *conn) result(cl *call, t MsgType, resp *HandshakeDesc) error {
	ri := &c.n.ri
	if err := c.refusal(t, resp); err != nil {
		if t == TypeNotify {
			c.n.st.notifySent.Add(1)
		}
		return fmt.Errorf("oob: %s: %s: %w", c.peer.addr, requestName(cl.typ), err)
	}
	if t != cl.typ {
		return fmt.Errorf("%w: %s: %s reply to a %s request", ErrBadFrame, c.peer.addr, t, cl.typ)
	}
	switch t {
	case TypeNotify:
		c.n.st.notifySent.Add(1)
		if len(ri.errMsg) > 0 || !ri.notifyOK {
			reason := string(ri.errMsg)
			if reason == "" {
				reason = "empty notify_msg"
			}
			return errorOf([]error{ErrRejected}, "%s: notify: %s", c.peer.addr, reason)
		}
	case TypeConnection:
		if resp.ReplyMsg != "" {
			return errorOf([]error{ErrRejected}, "%s: handshake: %s", c.peer.addr, resp.ReplyMsg)
		}
	default:
		if len(ri.errMsg) > 0 {
			return errorOf([]error{ErrRejected}, "%s: probe: %s", c.peer.addr, ri.errMsg)
		}
	}
	return nil
}

// helloDone runs on a twosided server's hello reply (in n.ri): authenticate if a key is
// offered or required, else open the connection.
func (c *conn) helloDone() {
	n := c.n
	ri := &n.ri
	addr := c.peer.addr
	switch {
	case ri.auth == offerNone:
		if n.auth.required {
			c.close(fmt.Errorf("%w: %s: the peer does not authenticate (no AuthKey there?) and AllowUnauthenticated is false", ErrAuth, addr))
			return
		}
	case !n.auth.on:
		if ri.authRequired {
			c.close(fmt.Errorf("%w: %s: the peer requires authentication and this Node has no AuthKey", ErrAuth, addr))
			return
		}
		// The peer offers authentication but serves unauthenticated peers too.
	case ri.auth != offerHMAC:
		if !n.auth.required && !ri.authRequired {
			break // neither side insists
		}
		c.close(fmt.Errorf("%w: %s: the peer offers an authentication scheme other than %s", ErrAuth, addr, authScheme))
		return
	case !ri.hasNonce || !ri.hasMAC:
		c.close(fmt.Errorf("%w: %s: the peer's hello reply lacks ts_nonce or ts_mac", ErrAuth, addr))
		return
	default:
		c.auth.peer, c.auth.peerNonce = ri.nonce, true
		if !n.auth.verify(dirServer, &c.auth.local, &c.auth.peer, &ri.mac) {
			c.close(fmt.Errorf("%w: %s: the peer's proof does not match AuthKey (a different key?)", ErrAuth, addr))
			return
		}
		n.nextID++
		c.auth.probeID = n.nextID
		c.auth.state = authPending
		c.state = stateAuth
		c.waitSince = n.now()
		n.out = appendAuthProof(n.out[:0], c.auth.probeID, n.auth.proof(dirClient, &c.auth.local, &c.auth.peer))
		c.send(n.out)
		return
	}
	c.ready()
}

// authReply handles the server's verdict on our proof.
func (c *conn) authReply(t MsgType, err error) {
	ri := &c.n.ri
	addr := c.peer.addr
	switch {
	case err != nil:
		c.close(fmt.Errorf("%w: %s: bad reply to the authentication probe: %w", ErrPeerUnreachable, addr, err))
	case t != TypeProbe || !ri.m.hasID || ri.m.id != c.auth.probeID:
		c.close(fmt.Errorf("%w: %s: %s reply while authenticating", ErrPeerUnreachable, addr, t))
	case len(ri.errMsg) > 0:
		c.close(fmt.Errorf("%w: %s: the peer refused our proof: %s", ErrAuth, addr, ri.errMsg))
	default:
		c.auth.state = authOK
		c.ready()
	}
}

// ready opens a persistent connection for requests and sends those queued meanwhile.
func (c *conn) ready() {
	c.state = stateOpen
	queue := c.queue
	c.queue = nil
	for i, cl := range queue {
		c.sendCall(cl)
		if c.state == stateClosed {
			// The write failed and closed the connection: the requests not sent yet are
			// out of its queue, so its close did not fail them. They fail now, not at
			// their timeouts.
			for _, rest := range queue[i+1:] {
				rest.conn = nil
				rest.finish(fmt.Errorf("%w: %s: connection closed", ErrPeerUnreachable, c.peer.addr), nil)
			}
			return
		}
	}
}
