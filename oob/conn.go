package oob

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/panjf2000/gnet/v2/pkg/buffer/elastic"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/internal/tracepoint"
	"github.com/twosided/twosided/reactor"
)

type connKind uint8

const (
	connServer     connKind = iota // accepted
	connPersistent                 // dialed, multiplexed (twosided peer)
	connClassic                    // dialed, one request (Mooncake style)
)

type connState uint8

const (
	stateConnecting connState = iota // non-blocking connect in progress
	stateHello                       // persistent: hello probe sent, waiting for its reply
	stateAuth                        // persistent: our proof sent, waiting for the server's verdict
	stateOpen                        // serving / ready for requests
	stateDraining                    // reply (or error reply) queued; then SHUT_WR and wait for EOF
	stateClosed
)

// conn is one TCP connection on the loop. All fields are loop-only.
type conn struct {
	n     *Node
	fd    int
	kind  connKind
	state connState
	peer  *peerState // dialed conns
	// remote is an accepted connection's peer IP (per-address limits).
	remote netip.Addr

	parser  Parser
	out     elastic.RingBuffer // bytes the socket did not take yet
	writing bool               // registered for Writable
	// batch holds the frames of this reactor turn, written in one system call when the
	// turn's work is done (Node.flushBatches); only while out is empty, so order holds.
	batch   []byte
	batched bool // in n.dirty

	lastRead, lastWrite, lastUse, waitSince, drainSince, born int64
	frameStart                                                int64 // first byte of the partial frame in parser

	// The connection's one deadline timer, armed only while deadline() names one.
	tm      *reactor.Timer
	tmArmed bool
	tmWhen  int64 // when tm fires; may be earlier than the deadline (then it re-arms)

	// server side
	persistent bool
	frames     int
	reqSeq     uint64
	open       map[uint64]struct{} // requests handed to the Handler, not answered yet
	shutWr     bool

	auth connAuth // both sides

	// client side
	pending map[uint64]*call
	queue   []*call
	one     *call // classic: the only request
	kaID    uint64
	compact bool // the server's hello offered compact notifies (compact.go): they go so

	again func() // readMore's, made once
}

func (n *Node) newConn(fd int, kind connKind, ps *peerState) *conn {
	now := n.now()
	n.nextConn++
	c := &conn{n: n, fd: fd, kind: kind, peer: ps, lastRead: now, lastWrite: now, lastUse: now, born: now}
	c.parser.MaxFrame = n.cfg.MaxFrame
	if kind == connServer && n.auth.required {
		// Until the client proves the key it gets no large buffer.
		c.parser.MaxFrame = preAuthMaxFrame
	}
	if kind == connPersistent {
		c.pending = make(map[uint64]*call)
	}
	return c
}

func (c *conn) onEvent(ev reactor.Events) {
	if c.state == stateClosed {
		return
	}
	if c.state == stateConnecting {
		if ev&(reactor.Writable|reactor.Error|reactor.Hangup) != 0 {
			c.finishConnect()
			c.touch()
		}
		return
	}
	if ev&(reactor.Readable|reactor.Error|reactor.Hangup) != 0 {
		c.onReadable()
		if c.state == stateClosed {
			return
		}
	}
	if ev&reactor.Writable != 0 {
		c.flush()
	}
	c.touch()
}

func (c *conn) onReadable() {
	n := c.n
	for i := 0; i < 16; i++ {
		tracepoint.Mark(tracepoint.ReadStart, 0)
		k, err := unix.Read(c.fd, n.scratch)
		tracepoint.Mark(tracepoint.ReadEnd, k)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return
		case err != nil:
			c.ioFailed("read", err)
			return
		case k == 0:
			c.onEOF()
			return
		}
		if c.state == stateDraining {
			continue // discard until the peer closes
		}
		c.lastRead = n.now()
		n.dataReads++
		c.consume(n.scratch[:k])
		if c.state == stateClosed || k < len(n.scratch) {
			return
		}
	}
	c.readMore()
}

// readMore goes on reading in a func of its own after onReadable's 16 full reads, so that
// other connections' events of the turn come first and no readiness is left behind: the
// connection's fd is registered as draining (reactor.Loop.AddDrained), whose events may
// wake a caller waiting as the loop alone, and that caller's turn may end right after this
// one. With the queue full, registering the fd again queues its readiness again.
func (c *conn) readMore() {
	if c.again == nil {
		c.again = func() { c.onEvent(reactor.Readable) }
	}
	if c.n.loop.Submit(c.again) == nil {
		return
	}
	ev := reactor.Readable
	if c.writing {
		ev |= reactor.Writable
	}
	if err := c.n.loop.Modify(c.fd, ev); err != nil {
		c.ioFailed("epoll modify", err)
	}
}

func (c *conn) consume(b []byte) {
	// fresh: no frame in progress before these bytes, or the one in progress completed
	// here, so a partial frame left at the end started in this read.
	fresh := c.parser.Buffered() == 0
	for len(b) > 0 {
		t, body, used, ok, err := c.parser.Next(b)
		if err != nil {
			if c.kind != connServer {
				if head := c.parser.failedHead(b[used:]); isText(head) {
					// Not a daemon's reply: say what answered instead of a huge length.
					c.close(&NotOOBError{Addr: c.peer.addr, Said: head})
					return
				}
			}
			c.frameFailed(err)
			return
		}
		b = b[used:]
		if ok {
			fresh = true
			if c.kind == connServer {
				c.serveFrame(t, body)
			} else {
				c.replyFrame(t, body)
			}
			if c.state == stateClosed || c.state == stateDraining {
				return
			}
		} else if used == 0 {
			break
		}
	}
	if fresh && c.parser.Buffered() > 0 {
		c.frameStart = c.lastRead
	}
}

func (c *conn) frameFailed(err error) {
	if c.kind != connServer {
		c.close(fmt.Errorf("%w: %s: bad reply: %w", ErrPeerUnreachable, c.peer.addr, err))
		return
	}
	t := TypeConnection
	var fe *FrameError
	if errors.As(err, &fe) && fe.HasType {
		t = fe.Type
	}
	if fe != nil && errors.Is(fe.Err, ErrFrameTooLarge) && c.parser.MaxFrame < c.n.cfg.MaxFrame {
		limit := frameLimit(fe.Type, c.n.cfg.MaxFrame)
		if fe.Length <= uint64(limit) {
			// A frame only the pre-authentication cap refuses: say what is missing,
			// without having buffered its body.
			c.n.noteAuthFailed()
			c.refuse(t, reqMeta{}, errAuthRequired)
			return
		}
		err = &FrameError{Err: ErrFrameTooLarge, Length: fe.Length, Type: fe.Type, HasType: fe.HasType,
			Reason: fmt.Sprintf("length %d above maximum %d", fe.Length, limit)}
	}
	c.reject(t, reqMeta{}, err)
}

// reject answers a bad request with an error reply, then drains and closes.
func (c *conn) reject(t MsgType, m reqMeta, err error) {
	n := c.n
	n.st.badFrames.Add(1)
	n.warn(warnBadFrames, err.Error())
	n.log.Debug().Err(err).Int("fd", c.fd).Msg("oob: bad request")
	c.refuse(t, m, err)
}

// refuse answers a request with an error reply, then drains and closes.
func (c *conn) refuse(t MsgType, m reqMeta, err error) {
	n := c.n
	n.out = appendErrorReply(n.out[:0], t, m, err)
	c.send(n.out)
	c.drain()
}

// send writes b, buffering what the socket does not take. b may be reused after return.
// On an open connection with nothing queued the bytes join the turn's batch: every frame
// a reactor turn produces for the connection (the replies to all the requests one read
// brought, the requests its callbacks sent) leaves in one write at the end of the turn.
func (c *conn) send(b []byte) {
	if c.state == stateClosed {
		return
	}
	if c.state != stateConnecting && c.out.IsEmpty() {
		if len(c.batch)+len(b) <= maxBatch {
			c.batch = append(c.batch, b...)
			if !c.batched {
				c.batched = true
				c.n.markDirty(c)
			}
			return
		}
		// A full batch, or a large frame: write now, in order.
		if c.writeBatch(); c.state == stateClosed {
			return
		}
		if c.out.IsEmpty() {
			var ok bool
			if b, ok = c.writeNow(b); !ok || len(b) == 0 {
				return
			}
		}
	}
	if c.out.Buffered()+len(b) > c.n.cfg.MaxConnBuffer {
		c.n.st.overflows.Add(1)
		c.n.warn(warnOverflow, c.name())
		c.close(fmt.Errorf("%w: %s: send buffer over MaxConnBuffer %d", ErrPeerUnreachable, c.name(), c.n.cfg.MaxConnBuffer))
		return
	}
	_, _ = c.out.Write(b) // behind what waits for the socket
	if c.state != stateConnecting {
		c.setWriting(true)
	}
}

// maxBatch bounds a turn's batch: past it the batch is written at once (a socket
// buffer's worth; a frame this large gains nothing from waiting).
const maxBatch = 64 << 10

// queued is the bytes waiting to be written: the turn's batch and what the socket did not
// take.
func (c *conn) queued() int { return len(c.batch) + c.out.Buffered() }

// maxIdleBatch bounds the batch buffer a connection keeps between turns.
const maxIdleBatch = 256 << 10

// writeBatch writes the turn's batch; what the socket does not take waits in out for
// Writable.
func (c *conn) writeBatch() {
	c.batched = false
	b := c.batch
	c.batch = c.batch[:0]
	if cap(c.batch) > maxIdleBatch {
		c.batch = nil
	}
	if c.state == stateClosed || len(b) == 0 {
		return
	}
	b, ok := c.writeNow(b)
	if !ok || len(b) == 0 {
		return
	}
	_, _ = c.out.Write(b)
	c.setWriting(true)
}

// writeNow writes b until the socket takes no more (EAGAIN) and returns what is left; false
// when the write failed (the connection is closed: ioFailed).
func (c *conn) writeNow(b []byte) ([]byte, bool) {
	wrote := false
	for len(b) > 0 {
		c.n.writeCalls++
		tracepoint.Mark(tracepoint.WriteStart, len(b))
		k, err := unix.Write(c.fd, b)
		tracepoint.Mark(tracepoint.WriteEnd, k)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			break
		}
		if err != nil {
			c.ioFailed("write", err)
			return nil, false
		}
		b, wrote = b[k:], true
	}
	if wrote {
		c.lastWrite = c.n.now()
	}
	return b, true
}

// markDirty notes that c has a batch to write this turn; the first one of a turn queues
// the flush behind the work already queued on the loop (the deliveries of the replies one
// read brought, and the sends they make).
func (n *Node) markDirty(c *conn) {
	n.dirty = append(n.dirty, c)
	if n.flushQueued {
		return
	}
	n.flushQueued = true
	if n.loop.Submit(n.flushFn) != nil {
		n.flushBatches() // the loop takes no more work (stopping): write now
	}
}

// flushBatches writes every connection's batch of this turn, the requests of its dialed
// connections before the replies of its served ones: a handler that answers a notify with
// one of its own (request and response) puts its answer on the wire ahead of the ACK, so the
// peer, waiting for that ACK, finds both in one wake-up instead of waking again for the
// answer after it returned. Loop-only.
func (n *Node) flushBatches() {
	tracepoint.Mark(tracepoint.Flush, len(n.dirty))
	n.flushQueued = false
	replies := false
	for _, c := range n.dirty {
		if c.kind == connServer {
			replies = true
			continue
		}
		n.flushOne(c)
	}
	if replies {
		for _, c := range n.dirty {
			if c.kind == connServer {
				n.flushOne(c)
			}
		}
	}
	clear(n.dirty)
	n.dirty = n.dirty[:0]
}

// flushOne writes c's batch of this turn, if it still has one.
func (n *Node) flushOne(c *conn) {
	if c.batched {
		c.writeBatch()
		c.touch()
	}
}

func (c *conn) flush() {
	for !c.out.IsEmpty() {
		head, _ := c.out.Peek(-1)
		c.n.writeCalls++
		tracepoint.Mark(tracepoint.WriteStart, len(head))
		k, err := unix.Write(c.fd, head)
		tracepoint.Mark(tracepoint.WriteEnd, k)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return
		}
		if err != nil {
			c.ioFailed("write", err)
			return
		}
		c.lastWrite = c.n.now()
		_, _ = c.out.Discard(k)
		if k < len(head) {
			return
		}
	}
	c.setWriting(false)
	if c.state == stateDraining {
		c.shutdownWrite()
	}
}

func (c *conn) setWriting(on bool) {
	if c.writing == on || c.state == stateClosed {
		return
	}
	ev := reactor.Readable
	if on {
		ev |= reactor.Writable
	}
	if err := c.n.loop.Modify(c.fd, ev); err != nil {
		c.ioFailed("epoll modify", err)
		return
	}
	c.writing = on
}

// drain ends a server connection politely: the queued reply goes out, then SHUT_WR, then
// the connection closes on the peer's EOF (or after IdleTimeout).
func (c *conn) drain() {
	if c.state == stateClosed || c.state == stateDraining {
		return
	}
	if c.writeBatch(); c.state == stateClosed { // the reply goes before the shutdown
		return
	}
	c.state = stateDraining
	c.drainSince = c.n.now()
	c.parser.Reset()
	if c.out.IsEmpty() {
		c.shutdownWrite()
	}
}

func (c *conn) shutdownWrite() {
	if c.shutWr {
		return
	}
	c.shutWr = true
	_ = unix.Shutdown(c.fd, unix.SHUT_WR)
}

func (c *conn) onEOF() {
	switch {
	case c.kind == connServer:
		c.writeBatch() // replies to what it sent before its FIN (a client that half-closes)
		c.close(nil)
	case c.kind == connPersistent && c.state == stateHello:
		// Closed before answering the hello: not a twosided server. Try the classic way.
		c.helloFailed(false)
	default:
		c.close(fmt.Errorf("%w: %s: connection closed by peer", ErrPeerUnreachable, c.peer.addr))
	}
}

func (c *conn) ioFailed(op string, err error) {
	if c.kind == connServer {
		c.n.log.Debug().Err(err).Int("fd", c.fd).Str("op", op).Msg("oob: connection failed")
		c.close(nil)
		return
	}
	c.close(fmt.Errorf("%w: %s: %s: %w", ErrPeerUnreachable, c.peer.addr, op, err))
}

func (c *conn) name() string {
	if c.peer != nil {
		return c.peer.addr
	}
	return "accepted connection"
}

// close releases the connection and fails what waits on it with cause (nil: nothing waits,
// or the waiters were answered).
func (c *conn) close(cause error) {
	if c.state == stateClosed {
		return
	}
	n := c.n
	c.state = stateClosed
	if c.tmArmed {
		c.tm.Stop()
		c.tmArmed = false
	}
	if err := n.loop.Close(c.fd); errors.Is(err, reactor.ErrNotRegistered) {
		// Never registered (or already removed): the fd is still ours to close. Any other
		// error came from Remove's epoll_ctl or from close itself, after which the number
		// may already belong to someone else: closing it again could close their fd.
		_ = unix.Close(c.fd)
	}
	c.out.Done()
	c.batch, c.batched = nil, false // a dirty entry left in n.dirty is skipped
	c.parser = Parser{}
	delete(n.conns, c)
	if c.kind == connServer {
		n.nServer--
		n.st.serverConns.Add(-1)
		return
	}
	n.st.clientConns.Add(-1)
	if c.peer.conn == c {
		c.peer.conn = nil
	}
	n.forgetIdlePeer(c.peer)
	if len(c.pending) == 0 && len(c.queue) == 0 && c.one == nil {
		return
	}
	if cause == nil {
		cause = fmt.Errorf("%w: %s: connection closed", ErrPeerUnreachable, c.peer.addr)
	}
	for id, cl := range c.pending {
		delete(c.pending, id)
		cl.finish(cause, nil)
	}
	for _, cl := range c.queue {
		cl.finish(cause, nil)
	}
	c.queue = nil
	if c.one != nil {
		c.one.finish(cause, nil)
		c.one = nil
	}
}

// expiry names what a connection's deadline is for.
type expiry uint8

const (
	expNone      expiry = iota
	expConnect          // client: connect not done within ConnectTimeout
	expDrain            // server: a classic client did not close within IdleTimeout of the reply
	expFrame            // a frame begun and not completed within IdleTimeout of its first byte
	expSilent           // server: no request (or, with Keepalive, no read) within IdleTimeout
	expAuth             // server: a required key not proved within IdleTimeout of the accept
	expReply            // client: no reply within IdleTimeout while one is awaited
	expKeepalive        // client, Keepalive on: time to probe
	expUnused           // client, Keepalive on: unused for 6*IdleTimeout
)

// due is the earliest of a connection's deadlines and what it is for.
type due struct {
	when int64
	why  expiry
}

// at keeps the earlier deadline; on a tie the first one noted stays.
func (d *due) at(when int64, why expiry) {
	if d.why == expNone || when < d.when {
		d.when, d.why = when, why
	}
}

// deadline is the connection's next deadline, expNone when nothing needs one: a fully
// idle persistent connection (no partial frame, nothing in flight, authenticated where
// required) carries none unless Keepalive is on, so an idle Node arms no timer.
func (c *conn) deadline() due {
	n := c.n
	idle := int64(n.cfg.IdleTimeout)
	var d due
	switch c.state {
	case stateClosed:
		return d
	case stateConnecting:
		d.at(c.born+int64(n.cfg.ConnectTimeout), expConnect)
		return d
	case stateDraining:
		d.at(c.drainSince+idle, expDrain)
		return d
	}
	if c.parser.Buffered() > 0 {
		d.at(c.frameStart+idle, expFrame)
	}
	ka := n.cfg.Keepalive > 0
	if c.kind == connServer {
		// Waiting on our own Handler is not the client's stall.
		if len(c.open) == 0 && (!c.persistent || ka) {
			d.at(c.lastRead+idle, expSilent)
		}
		if n.auth.required && c.auth.state != authOK {
			d.at(c.born+idle, expAuth)
		}
		return d
	}
	if c.kind == connClassic || c.state != stateOpen || len(c.pending) > 0 || c.kaID != 0 {
		d.at(max(c.lastRead, c.waitSince)+idle, expReply)
	}
	if ka && c.state == stateOpen && c.kaID == 0 {
		d.at(c.lastWrite+int64(n.cfg.Keepalive), expKeepalive)
		if len(c.pending) == 0 {
			d.at(c.lastUse+6*idle, expUnused)
		}
	}
	return d
}

// touch brings the timer in line with deadline() after the connection's state changed:
// stopped when no deadline is needed, moved earlier when one is nearer. A later deadline
// leaves the timer as it is; it fires early and re-arms, so steady traffic costs no timer
// operation per message.
func (c *conn) touch() {
	d := c.deadline()
	if d.why == expNone {
		if c.tmArmed {
			c.tm.Stop()
			c.tmArmed = false
		}
		return
	}
	if c.tmArmed && c.tmWhen <= d.when {
		return
	}
	c.arm(d.when)
}

func (c *conn) arm(when int64) {
	d := time.Duration(when - c.n.now())
	if c.tm == nil {
		c.tm = c.n.loop.AfterFunc(d, c.onTimer)
	} else {
		c.tm.Reset(d)
	}
	c.tmArmed, c.tmWhen = true, when
}

func (c *conn) onTimer() {
	c.tmArmed = false
	if c.state == stateClosed || c.n.down {
		return
	}
	d := c.deadline()
	if d.why == expNone {
		return
	}
	if now := c.n.now(); now < d.when {
		c.arm(d.when)
		return
	}
	c.expire(d.why)
	c.touch()
}

// expire acts on a deadline that passed.
func (c *conn) expire(why expiry) {
	n := c.n
	idle := n.cfg.IdleTimeout
	switch why {
	case expConnect:
		n.st.dialFailed.Add(1)
		c.close(errorOf([]error{ErrPeerUnreachable, ErrTimeout, ErrNotSent}, "%s: connect not done within ConnectTimeout %v", c.peer.addr, n.cfg.ConnectTimeout))
	case expDrain, expSilent:
		n.st.idleCuts.Add(1)
		c.close(nil)
	case expFrame:
		n.st.idleCuts.Add(1)
		if c.kind == connServer {
			n.log.Debug().Int("fd", c.fd).Int("buffered", c.parser.Buffered()).Msg("oob: frame not completed within IdleTimeout")
			c.close(nil)
			return
		}
		c.close(errorOf([]error{ErrPeerUnreachable, ErrTimeout}, "%s: reply frame not completed within IdleTimeout %v", c.peer.addr, idle))
	case expAuth:
		n.noteAuthFailed()
		n.log.Debug().Int("fd", c.fd).Msg("oob: not authenticated within IdleTimeout")
		c.close(nil)
	case expReply:
		n.st.idleCuts.Add(1)
		if c.kind == connClassic || c.state != stateOpen {
			c.close(errorOf([]error{ErrPeerUnreachable, ErrTimeout}, "%s: no reply within IdleTimeout %v", c.peer.addr, idle))
			return
		}
		c.close(errorOf([]error{ErrPeerUnreachable, ErrTimeout}, "%s: no reply within IdleTimeout %v (half-open?)", c.peer.addr, idle))
	case expKeepalive:
		n.nextID++
		c.kaID = n.nextID
		if len(c.pending) == 0 {
			c.waitSince = n.now()
		}
		n.out = appendProbe(n.out[:0], reqMeta{id: c.kaID, hasID: true}, false)
		c.send(n.out)
	case expUnused:
		c.close(nil) // unused for long: let it go; the next request redials
	}
}
