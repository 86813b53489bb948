package oob

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/internal/tracepoint"
	"github.com/twosided/twosided/reactor"
)

// Handler serves the requests a Node receives.
type Handler interface {
	// Both are called on the loop goroutine and must not block it; reply exactly once (possibly later, from the
	// loop or any goroutine); a second reply is ignored. The *req struct is reused once the
	// call returns (copy the struct to keep it); NotifyRequest.Msg and the strings are the
	// Handler's to keep.
	//
	// A reply error that is or wraps a *RefusedError sends its Code as ts_refuse to a
	// twosided peer (its client then returns ErrRejected and the code's sentinel, e.g.
	// ErrBusy); any error reaches a Mooncake peer as rejected, with the text in reply_msg.
	// A Handler that also implements PeerGoneHandler learns of peers that closed.
	HandleNotify(req *NotifyRequest, reply NotifyReply)                             // reply.Send: nil → "success", error → rejected (empty notify_msg)
	HandleHandshake(req *HandshakeDesc, reply func(resp *HandshakeDesc, err error)) // err → reply_msg = err.Error()
}

// NotifyReply answers one notify request handed to a Handler: Send once, from the loop or
// any goroutine (a later Send is ignored). A small value, copied freely: answering costs
// no allocation on the loop. The zero NotifyReply is not usable.
type NotifyReply struct {
	c   *conn
	seq uint64
	m   reqMeta
}

// Send writes the reply: nil is "success"; an error is a refusal (see Handler).
func (r NotifyReply) Send(err error) {
	tracepoint.Mark(tracepoint.AckSend, 0)
	n := r.c.n
	if n.loop.InLoop() {
		r.c.replyNotify(r.seq, r.m, err)
		return
	}
	n.submitReply(func() { r.c.replyNotify(r.seq, r.m, err) })
}

// Stats are a Node's counters; safe to read from any goroutine.
type Stats struct {
	Accepted          uint64 // server connections accepted
	RejectedConns     uint64 // accepted connections closed at once: MaxConns reached
	Dialed            uint64 // client connections that connected
	DialFailed        uint64 // connects that failed or timed out
	ServerConns       int64  // server connections open now
	ClientConns       int64  // client connections open now
	NotifyServed      uint64 // notifies handed to the Handler
	HandshakeServed   uint64 // handshakes handed to the Handler
	ProbeServed       uint64 // probes answered
	NotifySent        uint64 // notifies that got a reply (success or rejected)
	ClassicSent       uint64 // requests sent on a one-shot connection
	PersistentSent    uint64 // requests sent on a multiplexed connection
	BadFrames         uint64 // requests answered with an error reply and the connection closed
	IdleCuts          uint64 // connections closed by IdleTimeout: no request, a frame not completed, no reply, no close
	Overflows         uint64 // connections closed for exceeding MaxConnBuffer
	AuthOK            uint64 // server connections whose client proved the key
	AuthFailed        uint64 // server connections refused: a wrong proof, or a request before authenticating
	HandshakeLimited  uint64 // handshakes refused: MaxPendingHandshakes reached
	PendingHandshakes int64  // handshakes handed to the Handler and not answered yet, now

	HandshakeLimitedByAddr uint64 // handshakes refused: MaxPendingHandshakesPerAddr reached for their IP
	ShakingAddrs           int64  // remote IPs with a handshake in the Handler, now (≤ MaxPendingHandshakes)
	Peers                  int64  // peer addresses with client state (connection, classic mark), now (≤ MaxPeers)
	PeersEvicted           uint64 // peer entries dropped to make room: MaxPeers reached
	PeersLimited           uint64 // requests refused with ErrLimit: MaxPeers reached and nothing evictable
	TooLarge               uint64 // requests refused before sending: encoded frame over the peer's frame limit
	SendBufferFull         uint64 // requests refused before sending: the connection's MaxConnBuffer would overflow
	OldProtocol            uint64 // requests without a type byte (Mooncake's older protocol) served
	ByesSent               uint64 // byes written by Close to twosided persistent connections
	ByesReceived           uint64 // byes received: a twosided peer closed gracefully
	BusyRefused            uint64 // notifies answered busy: MaxOpenRequests of their connection await the Handler
}

type counters struct {
	accepted, rejected, dialed, dialFailed     atomic.Uint64
	serverConns, clientConns, pendingHS        atomic.Int64
	notifyServed, handshakeServed, probeServed atomic.Uint64
	notifySent, classicSent, persistentSent    atomic.Uint64
	badFrames, idleCuts, overflows             atomic.Uint64
	authOK, authFailed, handshakeLimited       atomic.Uint64
	handshakeLimitedByAddr, peersEvicted       atomic.Uint64
	peersLimited, tooLarge, sendBufferFull     atomic.Uint64
	oldProtocol, byesSent, byesReceived        atomic.Uint64
	busyRefused                                atomic.Uint64
	shakingAddrs, peers                        atomic.Int64
}

// Node is one OOB endpoint: a listener that serves Mooncake and twosided peers, and a
// client that reaches them. Its sockets live on the reactor loop.
type Node struct {
	loop *reactor.Loop
	cfg  Config
	h    Handler
	log  zerolog.Logger
	addr string
	lfd  int
	t0   time.Time

	// The last peer NotifyOnLoop parsed, and its address (loop-only).
	lastPeer string
	lastAP   netip.AddrPort

	closed  atomic.Bool
	byeName atomic.Pointer[string]
	// byeSession: the session a bye carries (SetSession); 0: none.
	byeSession atomic.Uint64
	closeErr   chan struct{} // closed when the loop-side close is done

	st counters

	// Loop-only state.
	conns   map[*conn]struct{}
	nServer int
	peers   map[string]*peerState
	scratch []byte // socket read buffer, shared by all connections of the loop
	out     []byte // frame encode buffer
	nd      notifyDecoder
	pd      probeDecoder
	auth    authKeys
	shaking int // handshakes handed to the Handler, not answered yet
	// shakingBy counts them per remote IP; an entry leaves at 0, so it holds at most
	// MaxPendingHandshakes entries.
	shakingBy map[netip.Addr]int
	warns     warnLimiter
	key       []byte
	ri        replyInfo
	nextID    uint64
	nextConn  uint64
	down      bool                   // loop-side close ran
	freeCalls reactor.FreeList[call] // NotifyOnLoop calls to reuse (getLoopCall)
	slab      reactor.Slab           // copies of received notify messages
	// Connections with a batch to write this turn, and the flush queued for it.
	dirty       []*conn
	flushQueued bool
	flushFn     func()
	// reads that brought bytes and write system calls, all connections (tests).
	dataReads, writeCalls uint64
}

const readChunk = 64 << 10

// Listen binds cfg.ListenAddr and serves on loop. Any goroutine.
func Listen(loop *reactor.Loop, cfg Config, h Handler) (*Node, error) {
	if loop == nil {
		return nil, fmt.Errorf("%w: loop: must not be nil", ErrBadConfig)
	}
	if h == nil {
		return nil, fmt.Errorf("%w: handler: must not be nil", ErrBadConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	sa, err := listenSockaddr(cfg.ListenAddr)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(sockFamily(sa), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("oob: listen %s: socket: %w", cfg.ListenAddr, err)
	}
	fail := func(op string, err error) (*Node, error) {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("oob: listen %s: %s: %w", cfg.ListenAddr, op, err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return fail("SO_REUSEADDR", err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	if err := unix.Listen(fd, 1024); err != nil {
		return fail("listen", err)
	}
	bound, err := unix.Getsockname(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	n := &Node{
		loop: loop, cfg: cfg, h: h, log: cfg.Logger, addr: sockaddrString(bound), lfd: fd,
		t0: loop.Now(), closeErr: make(chan struct{}),
		conns: make(map[*conn]struct{}), peers: make(map[string]*peerState), shakingBy: make(map[netip.Addr]int),
		scratch: make([]byte, readChunk), out: make([]byte, 0, 4096),
		auth: newAuthKeys(&cfg), freeCalls: reactor.FreeList[call]{Max: maxFreeLoopCalls},
	}
	n.nd.key = make([]byte, 0, 32)
	n.flushFn = n.flushBatches
	errc := make(chan error, 1)
	start := func() {
		if err := loop.Add(fd, reactor.Readable, n.onAccept); err != nil {
			errc <- err
			return
		}
		errc <- nil
	}
	if loop.InLoop() {
		start()
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.RequestTimeout)
		err := loop.SubmitWait(ctx, start)
		cancel()
		if err != nil {
			return fail("register on loop", err)
		}
	}
	if err := <-errc; err != nil {
		return fail("register on loop", err)
	}
	return n, nil
}

// Addr is the host:port actually bound.
func (n *Node) Addr() string { return n.addr }

// Stats returns the Node's counters. Any goroutine.
func (n *Node) Stats() Stats {
	s := &n.st
	return Stats{
		Accepted: s.accepted.Load(), RejectedConns: s.rejected.Load(),
		Dialed: s.dialed.Load(), DialFailed: s.dialFailed.Load(),
		ServerConns: s.serverConns.Load(), ClientConns: s.clientConns.Load(),
		NotifyServed: s.notifyServed.Load(), HandshakeServed: s.handshakeServed.Load(),
		ProbeServed: s.probeServed.Load(), NotifySent: s.notifySent.Load(),
		ClassicSent: s.classicSent.Load(), PersistentSent: s.persistentSent.Load(),
		BadFrames: s.badFrames.Load(), IdleCuts: s.idleCuts.Load(), Overflows: s.overflows.Load(),
		AuthOK: s.authOK.Load(), AuthFailed: s.authFailed.Load(), HandshakeLimited: s.handshakeLimited.Load(),
		PendingHandshakes: s.pendingHS.Load(),

		HandshakeLimitedByAddr: s.handshakeLimitedByAddr.Load(), ShakingAddrs: s.shakingAddrs.Load(),
		Peers: s.peers.Load(), PeersEvicted: s.peersEvicted.Load(), PeersLimited: s.peersLimited.Load(),
		TooLarge: s.tooLarge.Load(), SendBufferFull: s.sendBufferFull.Load(), OldProtocol: s.oldProtocol.Load(),
		ByesSent: s.byesSent.Load(), ByesReceived: s.byesReceived.Load(), BusyRefused: s.busyRefused.Load(),
	}
}

// Close closes the listener and every connection; pending requests fail with ErrClosed.
// It waits for the loop to do so, bounded by ctx. Calling it again is harmless.
func (n *Node) Close(ctx context.Context) error {
	if n.closed.CompareAndSwap(false, true) {
		f := func() { n.shutdown(); close(n.closeErr) }
		if n.loop.InLoop() {
			f()
			return nil
		}
		if err := n.loop.SubmitWait(ctx, f); err != nil {
			if errors.Is(err, reactor.ErrStopped) {
				// The loop closed every fd it owned when it stopped.
				close(n.closeErr)
				return nil
			}
			return fmt.Errorf("oob: close: %w", err)
		}
	}
	if n.loop.InLoop() {
		return nil
	}
	select {
	case <-n.closeErr:
		return nil
	case <-n.loop.Done():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("oob: close: %w", ctx.Err())
	}
}

// shutdown runs on the loop.
func (n *Node) shutdown() {
	if n.down {
		return
	}
	n.down = true
	_ = n.loop.Close(n.lfd)
	for c := range n.conns {
		c.bye()
		c.close(ErrClosed)
	}
}

// SetName sets what this Node calls itself in the bye it sends when it closes (as
// Config.Name; for a name known only once the listener is bound). At most MaxFromLen
// bytes; a longer name is not sent. Any goroutine.
func (n *Node) SetName(name string) { n.byeName.Store(&name) }

// SetSession sets the session the bye this Node sends when it closes carries (ts_session),
// so that a peer that reads the bye late, after another engine took the address, can tell
// it from that engine's; 0 (the default): none.
func (n *Node) SetSession(s uint64) { n.byeSession.Store(s) }

// name is what this Node calls itself in a bye: SetName's, else Config.Name, else the
// bound address.
func (n *Node) name() string {
	if p := n.byeName.Load(); p != nil {
		return *p
	}
	if n.cfg.Name != "" {
		return n.cfg.Name
	}
	return n.addr
}

// bye tells the twosided peer of a persistent connection that this Node is closing, so it
// frees the connection and what it keeps for this peer at once. Best effort: what the
// socket does not take at once is not waited for. Unread input is discarded first so the
// close ends with a FIN, not a reset that could overtake the bye.
func (c *conn) bye() {
	n := c.n
	switch {
	case c.state != stateOpen:
		return
	case c.kind == connPersistent:
	case c.kind == connServer && c.persistent && (!n.auth.required || c.auth.state == authOK):
	default:
		return
	}
	c.writeBatch()
	if c.state != stateOpen || !c.out.IsEmpty() {
		return // a reply is still queued: a bye after it would not go out at once either
	}
	n.out = appendBye(n.out[:0], n.name(), n.byeSession.Load())
	if k, err := unix.Write(c.fd, n.out); err != nil || k != len(n.out) {
		return
	}
	n.st.byesSent.Add(1)
	for i := 0; i < 16; i++ {
		if k, err := unix.Read(c.fd, n.scratch); err != nil || k <= 0 {
			break
		}
	}
	_ = unix.Shutdown(c.fd, unix.SHUT_WR)
}

// now is the loop clock in ns since the Node started.
// now is nanoseconds since the Node started, on the loop's clock. t0 is read from that
// clock too: a wall-clock t0 can be ahead of the loop's last reading, making now negative
// (and every zero deadline look pending).
func (n *Node) now() int64 { return int64(n.loop.Now().Sub(n.t0)) }

// onAccept accepts until EAGAIN (bounded per event for fairness).
func (n *Node) onAccept(ev reactor.Events) {
	for i := 0; i < 256; i++ {
		fd, sa, err := unix.Accept4(n.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			if err != unix.EAGAIN && err != unix.EINTR && err != unix.ECONNABORTED {
				n.log.Warn().Err(err).Msg("oob: accept")
			}
			if err == unix.EINTR || err == unix.ECONNABORTED {
				continue
			}
			return
		}
		if n.nServer >= n.cfg.MaxConns {
			n.refuseConn(fd, sa)
			continue
		}
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		c := n.newConn(fd, connServer, nil)
		c.remote = sockaddrAddr(sa)
		c.state = stateOpen
		if err := n.loop.AddDrained(fd, reactor.Readable, c.onEvent); err != nil {
			_ = unix.Close(fd)
			n.log.Warn().Err(err).Msg("oob: register accepted connection")
			continue
		}
		n.conns[c] = struct{}{}
		n.nServer++
		n.st.accepted.Add(1)
		n.st.serverConns.Add(1)
		c.touch() // it must send a request within IdleTimeout
	}
}

// refuseConn answers a connection over MaxConns with an error reply that names the limit
// (ts_refuse "limit" for a twosided client, reply_msg text for Mooncake) and closes it: the
// client sees the limit, not a reset. The reply is written before the request is read, so
// it carries the Connection type (the request's type is not known yet); a twosided client
// reads ts_refuse whatever the type.
func (n *Node) refuseConn(fd int, sa unix.Sockaddr) {
	n.st.rejected.Add(1)
	msg := fmt.Sprintf("too many connections: max_conns %d reached", n.cfg.MaxConns)
	n.warn(warnMaxConns, sockaddrString(sa))
	n.out = appendErrorReply(n.out[:0], TypeConnection, reqMeta{}, &RefusedError{Code: RefuseLimit, Msg: msg})
	_, _ = unix.Write(fd, n.out) // a fresh socket's buffer takes it whole
	_ = unix.Shutdown(fd, unix.SHUT_WR)
	_ = unix.Close(fd)
}

func sockaddrAddr(sa unix.Sockaddr) netip.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(a.Addr)
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(a.Addr).Unmap()
	}
	return netip.Addr{}
}

func listenSockaddr(addr string) (unix.Sockaddr, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: ListenAddr %q: %v", ErrBadConfig, addr, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("%w: ListenAddr %q: port: %v", ErrBadConfig, addr, err)
	}
	if host == "" {
		return &unix.SockaddrInet4{Port: int(p)}, nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		ips, lerr := net.DefaultResolver.LookupNetIP(context.Background(), "ip", host)
		if lerr != nil || len(ips) == 0 {
			return nil, fmt.Errorf("%w: ListenAddr %q: host: not an IP and not resolvable", ErrBadConfig, addr)
		}
		ip = ips[0]
	}
	return sockaddrOf(netip.AddrPortFrom(ip, uint16(p))), nil
}

func sockaddrOf(ap netip.AddrPort) unix.Sockaddr {
	ip := ap.Addr().Unmap()
	if ip.Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ip.As4()}
	}
	sa := &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ip.As16()}
	if z := ip.Zone(); z != "" {
		if ifi, err := net.InterfaceByName(z); err == nil {
			sa.ZoneId = uint32(ifi.Index)
		}
	}
	return sa
}

func sockFamily(sa unix.Sockaddr) int {
	if _, ok := sa.(*unix.SockaddrInet6); ok {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	}
	return ""
}
