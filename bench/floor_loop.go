package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/twosided/twosided/reactor"
	"golang.org/x/sys/unix"
)

// floor-loop: floor-epoll's exchange (a length-prefixed message, a one-byte ack) run on
// the engines' reactor and nothing else of them: the receiver's connections are fds of a
// reactor loop whose handler reads, delivers and acks in the loop's turn; the client's
// connection is an fd of its own loop, and a send is one ExecWait (the write in a borrowed
// turn, then the wait for the ack as the loop), as SendNotify's is. Against floor-epoll it
// shows what the reactor's own bookkeeping costs (dispatch, the turn, timers, the outer
// set's disarm); against oob, what the OOB node and the notify engine above it cost.
// Latency only.

// loopNode is a floor-loop receiver: a listener whose accept thread hands each connection
// to one reactor loop.
type loopNode struct {
	lfd      int
	address  string
	sink     *sink
	loop     *reactor.Loop
	acceptWG sync.WaitGroup
}

func newLoopFloorNode(host string, s *sink) (*loopNode, error) {
	loop, err := reactor.New(reactor.WithLogger(zerolog.Nop()))
	if err != nil {
		return nil, err
	}
	lfd, addr, err := tcpListen(host)
	if err != nil {
		_ = loop.Stop(context.Background())
		return nil, err
	}
	n := &loopNode{lfd: lfd, address: addr, sink: s, loop: loop}
	n.acceptWG.Add(1)
	go n.acceptLoop()
	return n, nil
}

func (n *loopNode) addr() string { return n.address }

func (n *loopNode) wakeups() uint64 { return n.loop.Stats().Wakeups }

func (n *loopNode) acceptLoop() {
	defer n.acceptWG.Done()
	for {
		fd, err := tcpAccept(n.lfd)
		if err != nil {
			return // the listener was shut down
		}
		c := &loopConn{loop: n.loop, fd: fd, sink: n.sink, buf: make([]byte, 2*(floorHdr+maxSize))}
		if err := unix.SetNonblock(fd, true); err != nil {
			_ = unix.Close(fd)
			continue
		}
		if err := n.loop.SubmitWait(context.Background(), func() {
			if err := n.loop.AddDrained(fd, reactor.Readable, c.onReadable); err != nil {
				_ = unix.Close(fd)
			}
		}); err != nil {
			_ = unix.Close(fd)
			return // the loop stopped
		}
	}
}

func (n *loopNode) close(ctx context.Context) error {
	_ = unix.Shutdown(n.lfd, unix.SHUT_RDWR)
	n.acceptWG.Wait()
	err := n.loop.Stop(ctx) // closes the connections it holds
	if cerr := unix.Close(n.lfd); err == nil {
		err = cerr
	}
	return err
}

func (n *loopNode) newClient(peers []string) (client, error) {
	if len(peers) != 1 {
		return nil, fmt.Errorf("%w: %s: one peer (latency), not %d", ErrConfig, FloorLoop, len(peers))
	}
	sa, err := sockaddr(peers[0])
	if err != nil {
		return nil, err
	}
	return &loopClient{peer: sa}, nil
}

// loopConn is one connection of a floor-loop receiver; its handler runs on the loop.
type loopConn struct {
	loop *reactor.Loop
	fd   int
	sink *sink
	buf  []byte
	have int
}

// onReadable reads until a short read (the handler drains: AddDrained).
func (c *loopConn) onReadable(reactor.Events) {
	for {
		space := len(c.buf) - c.have
		m, err := unix.Read(c.fd, c.buf[c.have:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return
		}
		if err != nil || m == 0 {
			c.drop() // closed by the peer
			return
		}
		if !c.consume(m) || m < space {
			return
		}
	}
}

// consume takes m more bytes read into buf: every whole message is delivered and acked;
// false when the connection was dropped.
func (c *loopConn) consume(m int) bool {
	c.have += m
	off := 0
	ack := [1]byte{1}
	for c.have-off >= floorHdr {
		size := int(binary.LittleEndian.Uint32(c.buf[off:]))
		if floorHdr+size > len(c.buf) {
			c.drop() // no bench message is this large: not a floor-loop client
			return false
		}
		if c.have-off < floorHdr+size {
			break
		}
		c.sink.deliver(c.buf[off+floorHdr : off+floorHdr+size])
		if writeAll(c.fd, ack[:], false) != nil {
			c.drop()
			return false
		}
		off += floorHdr + size
	}
	c.have = copy(c.buf, c.buf[off:c.have])
	return true
}

// drop closes the connection (on the loop).
func (c *loopConn) drop() { _ = c.loop.Close(c.fd) }

// loopClient is floor-loop's client: one connection, an fd of its own loop.
type loopClient struct {
	peer *unix.SockaddrInet4
	loop *reactor.Loop
	fd   int
	buf  []byte
	acks atomic.Uint64 // acks read by the loop's handler (either thread)
	sent uint64        // messages written
	// acked is signalled by the handler after each ack, for a send that ExecWait queued
	// (the loop was awake): it then waits for the loop thread to read the ack.
	acked chan struct{}
	err   atomic.Pointer[error] // the connection failed (handler)
}

func (c *loopClient) lockThread() bool { return false } // as engine callers: ExecWait locks the turn

func (c *loopClient) open() error {
	loop, err := reactor.New(reactor.WithLogger(zerolog.Nop()))
	if err != nil {
		return err
	}
	fd, err := tcpConnect(c.peer)
	if err != nil {
		_ = loop.Stop(context.Background())
		return err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		_ = loop.Stop(context.Background())
		return err
	}
	c.loop, c.fd, c.acked = loop, fd, make(chan struct{}, 1)
	added := make(chan error, 1)
	if err := loop.SubmitWait(context.Background(), func() { added <- loop.AddDrained(fd, reactor.Readable, c.onReadable) }); err != nil {
		_ = unix.Close(fd)
		return err
	}
	if err := <-added; err != nil {
		_ = unix.Close(fd)
		return err
	}
	return nil
}

// onReadable reads acks until a short read (the handler drains: AddDrained).
func (c *loopClient) onReadable(reactor.Events) {
	for {
		var b [64]byte
		m, err := unix.Read(c.fd, b[:])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return
		case err != nil:
			c.fail(err)
			return
		case m == 0:
			c.fail(errEOF)
			return
		}
		c.acks.Add(uint64(m))
		select {
		case c.acked <- struct{}{}:
		default:
		}
		if m < len(b) {
			return
		}
	}
}

func (c *loopClient) fail(err error) {
	c.err.CompareAndSwap(nil, &err)
	_ = c.loop.Close(c.fd) // on the loop: the handler, or the write in the turn
	select {
	case c.acked <- struct{}{}:
	default:
	}
}

func (c *loopClient) send(ctx context.Context, _ int, msg []byte) error {
	if c.loop == nil {
		if err := c.open(); err != nil {
			c.close()
			return err
		}
	}
	c.buf = binary.LittleEndian.AppendUint32(c.buf[:0], uint32(len(msg)))
	c.buf = append(c.buf, msg...)
	c.sent++
	want := c.sent
	done := func() bool { return c.acks.Load() >= want || c.err.Load() != nil }
	// c.buf is not touched again before the ack.
	if err := execAndWait(ctx, c.loop, func() {
		if err := writeAll(c.fd, c.buf, false); err != nil {
			c.fail(err)
		}
	}, done, c.acked); err != nil {
		return err
	}
	if p := c.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *loopClient) close() {
	if c.loop != nil {
		_ = c.loop.Stop(context.Background()) // closes the connection it holds
		c.loop = nil
	}
}

// execAndWait sends as SendNotify does: f in one ExecWait (on this goroutine in a borrowed
// turn, or queued on the loop thread when the loop is awake), then the wait for done as the
// loop. When the turn's wait did not see the answer (f was queued, or the wait ended
// first), the loop thread reads it and signals ch; that wait is bounded by epollWait and
// ctx. No timer is made when the answer came in the turn.
func execAndWait(ctx context.Context, loop *reactor.Loop, f func(), done func() bool, ch <-chan struct{}) error {
	if _, err := loop.ExecWait(f, epollWait, done); err != nil {
		return err
	}
	if done() {
		return nil
	}
	timer := time.NewTimer(epollWait)
	defer timer.Stop()
	for !done() {
		select {
		case <-ch:
		case <-timer.C:
			return errDeadline
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
